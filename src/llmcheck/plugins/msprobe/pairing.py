"""Pairing an msprobe dump with a dump of another source by module path.

An msprobe ``L0`` entry ``Module.model.layers.2.mlp.LlamaMLP.forward.0`` is read as module
``model.layers.2.mlp``, call 0 (:mod:`.entry_names`), the name llmcheck's torch capture
gives the same module. Its records pair with the other dump's records of the same module
path, io, position, step and call index (rule ``msprobe_module_path``). The moment a tensor
was saved is matched when both sides have it and ignored otherwise: msprobe saves inputs
before the call, an llmcheck dump may have saved them after (``save_time``). API entries
(``Functional.linear``) have no counterpart in a module dump and stay unmatched.

Two msprobe dumps pair by the built-in exact-key rule: their names are the same.
"""

from __future__ import annotations

from collections import defaultdict

from llmcheck.plugin_api import Dump, Pair, PairPriority, TensorRecord
from llmcheck.plugins.msprobe import SOURCE_NAME

RULE_MODULE_PATH = "msprobe_module_path"


def _slot(record: TensorRecord) -> tuple[str, str, str, int, int]:
    key = record.key
    return key.name, key.io, key.position, key.step, key.call_index


def module_path_pairs(golden: Dump, my: Dump) -> list[Pair] | None:
    """Return the module-path pairs of an msprobe dump and a dump of another source, or None."""
    if (golden.source == SOURCE_NAME) == (my.source == SOURCE_NAME):
        return None
    my_by_slot: dict[tuple[str, str, str, int, int], list[TensorRecord]] = defaultdict(list)
    for record in my.records:
        my_by_slot[_slot(record)].append(record)
    pairs = []
    for record in golden.records:
        candidates = my_by_slot.get(_slot(record))
        if not candidates:
            continue
        same_moment = [candidate for candidate in candidates if candidate.key.moment == record.key.moment]
        pairs.append(Pair(record, (same_moment or candidates)[0], RULE_MODULE_PATH, PairPriority.SOURCE_RULE))
    return pairs
