"""Built-in plugin 'sglang': tensor dumps written by SGLang's debug utilities, and by the same dumper inside Megatron.

* load tensors, source ``sglang``: a run of SGLang's dumper
  (``sglang.srt.debug_utils.dumper``): one folder of ``.pt`` files named by keyword fields
  joined by ``___`` (``step=0___rank=0___dump_index=1___name=...___layer_id=0.pt``; older
  dumpers write ``forward_pass_id=`` or ``curr_step=``), see :mod:`.dumper_run`;
* load tensors, source ``megatron``: the same dumper run inside Megatron (Miles imports
  SGLang's dumper there): its files carry Megatron's parallel info and its batch fields
  (``position_ids``, ``cu_seqlens_q``);
* load tensors, source ``sglang_tensor_dump``: the forward-hook dumps of
  ``--debug-tensor-dump-output-folder`` (``TP{t}_PP{p}_Rank{r}_pid{pid}/Pass{id}.pt``, one dict
  of module outputs per forward pass), see :mod:`.forward_hook_dump`.

Where the engine dumped its batch bookkeeping (positions, sequence lengths, query start
offsets), each step's rows are in ``Dump.batches`` (:mod:`.batch_rows`). See
``docs/sources/sglang.md`` and ``docs/sources/megatron.md``. Importing this package stays
light (no torch).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from llmcheck.plugin_api import Dump, SourceInfo, hookimpl

SGLANG_SOURCE = "sglang"
MEGATRON_SOURCE = "megatron"
FORWARD_HOOK_SOURCE = "sglang_tensor_dump"
#: The sources a dumper run is read as: it is one format whichever framework ran the dumper.
DUMPER_SOURCES = (SGLANG_SOURCE, MEGATRON_SOURCE)


@hookimpl
def llmcheck_register_sources(register: Callable[[SourceInfo], None]) -> None:
    """Register the "sglang", "megatron" and "sglang_tensor_dump" sources."""
    register(SourceInfo(SGLANG_SOURCE, "SGLang dumper run: step=N___rank=R___...___name=X.pt files"))
    register(
        SourceInfo(MEGATRON_SOURCE, "SGLang's dumper run inside Megatron (Miles): step=N___rank=R___name=X.pt files")
    )
    register(
        SourceInfo(
            FORWARD_HOOK_SOURCE,
            "SGLang --debug-tensor-dump-output-folder: TP*_PP*_Rank*_pid*/Pass*.pt, one dict per forward pass",
        )
    )


@hookimpl
def llmcheck_load_tensors(path: Path, source: str | None) -> Dump | None:
    """Return the SGLang or Megatron dump at ``path``, or None when it holds none of their files."""
    if source in (None, *DUMPER_SOURCES):
        from llmcheck.plugins.sglang.dumper_run import load_dumper_run

        dump = load_dumper_run(Path(path), source)
        if dump is not None:
            return dump
    if source in (None, FORWARD_HOOK_SOURCE):
        from llmcheck.plugins.sglang.forward_hook_dump import load_forward_hook_dump

        return load_forward_hook_dump(Path(path))
    return None
