"""Built-in plugin: opcheck's reference for every ATen operator, by replaying the recorded call in float64.

A torch dump captured at op level records each ATen call's overload as the record's
``op_type`` (``aten.mm.default``) and its non-tensor arguments exactly in ``attrs``. This
plugin answers the reference resolver for any such op type: the reference runs the same
overload again on the CPU from the dumped inputs widened to float64, so a low-precision
kernel's output is held against a high-precision recomputation of the same call, within
the rounding the same call makes when replayed in its recorded dtypes.
"""

from __future__ import annotations

from llmcheck.plugin_api import OpReference, hookimpl

NAMESPACE_PREFIXES = ("aten.", "prims.")


@hookimpl
def llmcheck_resolve_op_reference(op_type: str) -> OpReference | None:
    if not op_type.startswith(NAMESPACE_PREFIXES):
        return None
    from llmcheck.plugins.aten_ops.replay import AtenReplay, operator_named

    operator = operator_named(op_type)
    if operator is None:
        return None
    import torch

    return OpReference(
        op_type,
        AtenReplay(op_type),
        f"replay of {op_type} in float64 from its recorded arguments",
        compute_as_recorded=AtenReplay(op_type, widen=False),
        pointwise=torch.Tag.pointwise in operator.tags,
    )
