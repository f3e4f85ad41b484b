"""The module tree of a captured model in first-execution order, as the dump's ``topology.json``.

Kept apart from the hooks because it changes rarely: modules are noted the first time they
run, and the tree is rebuilt and written only when a step ran modules not seen before.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from llmcheck.plugin_api import TopologyNode
from llmcheck.plugins.torch_hooks.module_selection import ROOT_NAME


class ModuleTopology:
    """Which modules of one model ran, in the order they first ran."""

    def __init__(self, model: torch.nn.Module, ids: dict[str, str]) -> None:
        self.ids = ids
        #: module path -> its rank in first-execution order
        self.first_run: dict[str, int] = {}
        self._size_written = -1
        # the static part of the tree, walked once here: (path, class name, child paths) per module
        self._modules: dict[str, tuple[str, list[str]]] = {}
        self._walk(ROOT_NAME, model)

    def _walk(self, name: str, module: torch.nn.Module) -> None:
        children = []
        for child_name, child in module.named_children():
            path = child_name if name == ROOT_NAME else f"{name}.{child_name}"
            if path in self.ids and path not in self._modules:
                children.append(path)
                self._walk(path, child)
        self._modules[name] = (type(module).__name__, children)

    def tree(self, first_run: dict[str, int] | None = None) -> TopologyNode:
        """Return the module tree: class names, module ids, children in first-execution order.

        A container that never runs itself (``ModuleList``) takes the place of its first
        child to run; modules that never ran keep their definition order, after the others.
        ``first_run`` is a snapshot of :attr:`first_run` (default: as it is now).
        """
        ids = self.ids
        first_run = self.first_run if first_run is None else first_run
        never_run = len(first_run)
        modules = self._modules

        def node(name: str) -> tuple[TopologyNode, int]:
            op_type, child_names = modules[name]
            children = sorted((node(path) for path in child_names), key=lambda item: item[1])  # stable
            first = min([first_run.get(name, never_run), *(rank for _, rank in children)])
            attrs = {"id": ids[name]} if ids.get(name) else {}
            return TopologyNode(
                name=name, op_type=op_type, children=tuple(child for child, _ in children), attrs=attrs
            ), first

        return node(ROOT_NAME)[0]

    def changed_tree(self) -> Callable[[], TopologyNode] | None:
        """Return what builds the tree when modules ran for the first time since it was last asked, else ``None``.

        The builder holds a snapshot of the execution order, so another thread may call it.
        """
        if len(self.first_run) == self._size_written:
            return None
        self._size_written = len(self.first_run)
        return functools.partial(self.tree, dict(self.first_run))
