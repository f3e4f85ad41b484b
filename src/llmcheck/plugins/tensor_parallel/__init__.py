"""Built-in plugin 'tensor_parallel': a multi-rank tensor-parallel run compared against a single-process golden.

Pairing only: the ranks' dumps are read as one run by their source (each record keyed by
its rank), and this plugin gathers each tensor's shards -- joined along the split
dimension, summed from partial sums, or taken rank by rank where every rank holds it --
and pairs them with the golden's whole tensor (rules ``tp_unshard(...)``, ``tp_shard(...)``,
``tp_replicated(...)``; see ``docs/commands/compare.md``, "Tensor-parallel runs").
It names no backend: any source whose records carry ranks is gathered the same way.
"""

from __future__ import annotations

from collections.abc import Callable

from llmcheck.plugin_api import Dump, Pair, UserMapping, hookimpl

#: The rules a ``--mapping`` file may state for this plugin (``tp_shard`` is only what pairs.json shows).
MAPPING_RULES = ("tp_unshard", "tp_replicated")


@hookimpl
def llmcheck_register_mapping_rules(register: Callable[[str], None]) -> None:
    """Declare the ``tp_*`` rules this plugin reads from ``--mapping`` rule entries."""
    for name in MAPPING_RULES:
        register(name)


@hookimpl
def llmcheck_map_pairs(golden: Dump, my: Dump, user_mapping: UserMapping | None) -> list[Pair] | None:
    """Return the tensor-parallel pairs when the golden is one process and the run under suspicion several ranks."""
    from llmcheck.plugins.tensor_parallel.pairing import tensor_parallel_pairs

    return tensor_parallel_pairs(golden, my, user_mapping)
