"""Which modules and operators a capture records: names, ids, globs, types, decided once per model.

Module names are the paths ``model.named_modules()`` gives, with ``"root"`` for the model
itself. Module ids follow the seed's op-id scheme on the module tree in definition order:
the root's children are ``0``, ``1``, ...; ``0_1_3`` is the fourth child of the second
child of the first (they are listed in ``topology.json``).

Rules (documented in ``docs/sources/torch.md``):

* ``include`` / ``exclude`` globs select a module's whole subtree (a pattern matching
  ``model.layers.3`` also selects ``model.layers.3.mlp.down_proj``); exclude wins;
* ``module_list`` keeps modules of those classes (module level), or operators run inside
  such a module (op level);
* ``max_depth`` keeps modules at most that many levels below the model (``model.layers.3`` is
  3 levels down; the model itself 0; ``"blocks"``: the depth of the model's repeated blocks), at
  both levels; ``step_depths`` deepens (or narrows) it at some steps, module level: the modules
  down to the deepest depth any step wants are hooked, and each step records down to its own;
* ``module_ids`` (``-ids``) and ``type_prefixes`` (``-opname``) are OR-ed, as in the seed:
  an id selects that module (and, with ``include_children``, its subtree); a prefix
  selects module classes (module level) or ATen operators (op level) whose lower-cased
  name starts with it.
"""

from __future__ import annotations

from collections.abc import Iterable
from fnmatch import fnmatchcase
from typing import Any

import torch

from llmcheck.plugin_api import ROOT_MODULE, block_depth, module_ancestors, module_depth, module_parent
from llmcheck.plugins.torch_hooks.config import DEPTH_BLOCKS, DumpConfig

#: The capture's names for the record-naming convention the plugin API declares.
ROOT_NAME = ROOT_MODULE
parent_name = module_parent


def module_ids(model: torch.nn.Module) -> dict[str, str]:
    """Return ``path -> id`` (``"0_1_3"``) for every submodule, numbering children in definition order."""
    ids: dict[str, str] = {ROOT_NAME: ""}

    def visit(module: torch.nn.Module, prefix: str, id_prefix: str) -> None:
        for index, (child_name, child) in enumerate(module.named_children()):
            path = f"{prefix}.{child_name}" if prefix else child_name
            child_id = f"{id_prefix}_{index}" if id_prefix else str(index)
            if path not in ids:
                ids[path] = child_id
                visit(child, path, child_id)

    visit(model, "", "")
    return ids


def _lineage(name: str) -> list[str]:
    """Return the module and its ancestors' paths, ``"root"`` last."""
    return [name, *module_ancestors(name)]


def _matches_type(module: torch.nn.Module, module_list: Iterable[Any]) -> bool:
    for entry in module_list:
        if isinstance(entry, str):
            if type(module).__name__ == entry:
                return True
        elif isinstance(entry, type) and isinstance(module, entry):
            return True
    return False


class ModuleSelection:
    """The capture filters of a config, resolved against one model's module tree."""

    def __init__(self, model: torch.nn.Module, config: DumpConfig) -> None:
        self.ids = module_ids(model)
        modules = {(name or ROOT_NAME): module for name, module in model.named_modules()}
        blocks = block_depth(modules)

        def levels(depth: int | str | None) -> int | None:
            return blocks if depth == DEPTH_BLOCKS else (None if depth is None else int(depth))

        #: how deep each step records (module level): ``None`` is every depth
        self.base_depth = levels(config.max_depth)
        self.step_depths = {step: levels(depth) for step, depth in config.step_depths.items()}
        limits = [self.base_depth, *self.step_depths.values()]
        deepest = max((limit for limit in limits if limit is not None), default=None)
        if None in limits:
            deepest = None
        prefixes = tuple(config.type_prefixes)
        wanted_ids = set(config.module_ids)
        self._by_id_or_prefix = bool(wanted_ids or prefixes)
        self._prefixes = prefixes
        self._module_selected: dict[str, bool] = {}
        self._op_scope: dict[str, bool] = {}  # module path -> may its operators be recorded
        self._op_id_match: dict[str, bool] = {}
        self._op_selected: dict[tuple[str, str], bool] = {}
        for name, module in modules.items():
            lineage = _lineage(name)
            path_ok = (
                not config.include or any(fnmatchcase(n, p) for n in lineage for p in config.include)
            ) and not any(fnmatchcase(n, p) for n in lineage for p in config.exclude)
            path_ok = path_ok and (deepest is None or module_depth(name) <= deepest)
            id_match = self.ids.get(name) in wanted_ids or (
                config.include_children and any(self.ids.get(n) in wanted_ids for n in lineage[1:])
            )
            class_match = type(module).__name__.lower().startswith(prefixes) if prefixes else False
            type_exact = not config.module_list or _matches_type(module, config.module_list)
            type_within = not config.module_list or any(
                _matches_type(modules[n], config.module_list) for n in lineage if n in modules
            )
            self._module_selected[name] = (
                path_ok and type_exact and (not self._by_id_or_prefix or id_match or class_match)
            )
            self._op_scope[name] = path_ok and type_within
            self._op_id_match[name] = id_match

    def depth_at(self, step: int) -> int | None:
        """Return how many levels below the model step ``step`` records modules (``None``: all)."""
        return self.step_depths.get(step, self.base_depth)

    def module_selected(self, name: str) -> bool:
        """Return whether the inputs and outputs of module ``name`` are recorded."""
        return self._module_selected.get(name, False)

    def op_selected(self, module_name: str, op_type: str) -> bool:
        """Return whether ATen operator ``op_type`` (``aten.mm.default``) run inside ``module_name`` is recorded."""
        key = (module_name, op_type)
        selected = self._op_selected.get(key)
        if selected is None:
            selected = self._op_scope.get(module_name, False)
            if selected and self._by_id_or_prefix:
                lowered = op_type.lower()
                short = lowered.partition(".")[2]  # without the namespace: "mm.default"
                selected = (
                    self._op_id_match[module_name]
                    or lowered.startswith(self._prefixes)
                    or short.startswith(self._prefixes)
                )
            self._op_selected[key] = selected
        return selected
