"""The seed's ``-ids`` and ``-opname`` filters on the op calls opcheck checks."""

from __future__ import annotations

import re
from collections.abc import Sequence

from llmcheck.core.op_calls import OpCall

#: How deep below an id given to ``-ids`` a child op may be and still be selected (the seed's limit).
MAX_ID_DEPTH = 20


def select_op_calls(
    calls: Sequence[OpCall], operation_ids: Sequence[str], operation_names: Sequence[str]
) -> list[OpCall]:
    """Return the calls the seed's ``-ids`` and ``-opname`` filters keep (both must match; empty keeps all).

    An id keeps that op and the ops below it (``24_1`` keeps ``24_1`` and ``24_1_3``); a
    name keeps ops whose type contains it, ignoring case and ATB's ``Operation`` suffix
    (``self`` keeps ``SelfAttentionOperation``; ``rope`` keeps ``RopeOperation`` but not
    ``LinearOperation``, whose full name happens to contain it).
    """
    id_patterns = [re.compile(rf"^{re.escape(op_id)}(_[0-9]+){{0,{MAX_ID_DEPTH}}}$") for op_id in operation_ids]
    names = [name.lower() for name in operation_names]
    return [
        call
        for call in calls
        if (not id_patterns or any(pattern.match(call.name) for pattern in id_patterns))
        and (not names or any(name in _type_words(call.op_type) for name in names))
    ]


def _type_words(op_type: str) -> str:
    lowered = op_type.lower()
    return lowered.removesuffix("operation") or lowered
