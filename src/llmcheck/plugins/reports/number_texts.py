"""Python's ``repr`` of ~10**6 numbers at once, several times faster than ``repr``: the CSV's number cells.

``cmp_report.csv`` holds each float as ``repr`` writes it (what ``csv.writer`` writes).
CPython's ``repr`` of a float (David Gay's shortest round-trip digits) costs ~0.5 us,
and a 10**5-pair report holds ~3 * 10**6 numbers: most of its cost. msgspec writes
the same shortest round-trip digits with Ryu (both give the shortest digit string that
reads back as the same double, and of several the nearest, ties to even) ten times
faster, only laid out differently; :func:`repr_texts` lays them out as ``repr`` does:

* an exponent has a sign and at least two digits (msgspec ``1e16``, ``2.5e-7``;
  ``repr`` ``1e+16``, ``2.5e-07``);
* numbers in [1e-5, 1e-4) take an exponent (msgspec ``0.000012``; ``repr`` ``1.2e-05``):
  ``repr`` writes positionally from 1e-4 to 1e16, msgspec from 1e-5.

msgspec writes NaN and infinities as ``null``, like ``None``: in a column holding one of
them, each ``null`` is written by itself. ``tests/test_report_formats.py`` checks the texts against ``repr`` on
millions of doubles of every exponent, float32 values and the edge cases.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from typing import Any

import msgspec

_encode = msgspec.json.encode
_NONE = type(None)
_NOTHING, _NUMBERS = frozenset({_NONE}), frozenset({float, int, _NONE})
#: The types whose ``repr`` is their csv text (``None`` aside, which is an empty cell), NaN and infinities included.
_REPR_TYPES = frozenset({float, int, bool, _NONE})
#: ``repr`` writes numbers below 1e-4 with an exponent; msgspec writes those from 1e-5 as ``0.0000ddd``.
_FIVE_ZEROS = (",0.0000", ",-0.0000")


def repr_texts(columns: Sequence[list[Any]], other: Callable[[Any], str]) -> list[list[str]]:
    """Return ``repr`` of each value of each column, ``""`` for ``None``; ``other(value)`` where a column holds more.

    Columns of exact floats, ints and ``None`` are encoded by msgspec all at once; a column
    holding bools too by one ``repr`` of the list; any other column value by value by ``other``.
    """
    texts: list[list[str]] = [[] for _ in columns]
    encoded: list[tuple[int, bool]] = []  # the columns msgspec writes, and whether they hold a null
    for index, column in enumerate(columns):
        kinds = set(map(type, column))
        if kinds <= _NUMBERS:
            if kinds <= _NOTHING:
                texts[index] = [""] * len(column)
            else:
                encoded.append((index, _NONE in kinds or (float in kinds and not _finite(column))))
        elif kinds <= _REPR_TYPES:
            texts[index] = repr(column)[1:-1].replace("None", "").split(", ")  # no number's repr holds ", " or None
        else:
            texts[index] = list(map(other, column))
    all_texts = _msgspec_texts(list(itertools.chain.from_iterable(columns[index] for index, _ in encoded)))
    start = 0
    for index, holds_null in encoded:
        column = columns[index]
        end = start + len(column)
        texts[index] = all_texts[start:end]
        if holds_null:  # msgspec writes None, NaN and infinities as null
            texts[index] = [text if text != "null" else _null_text(value) for text, value in zip(texts[index], column)]
        start = end
    return texts


def _finite(column: list[Any]) -> bool:
    """Return whether a column of floats, ints and ``None`` holds no NaN nor infinity (one C-level sum).

    A sum overflowing to infinity only has its column's nulls looked at one by one.
    """
    try:
        return math.isfinite(sum(filter(None, column)))
    except OverflowError:  # an int beyond a float's range
        return False


def _null_text(value: float | None) -> str:
    """Return the text of a value msgspec writes as ``null``: ``""`` for ``None``, ``nan``, ``inf`` or ``-inf``."""
    return "" if value is None else repr(value)


def _msgspec_texts(values: list[Any]) -> list[str]:
    """Return ``repr`` of each float and int, from msgspec's text laid out as ``repr`` (``null`` for the others)."""
    if not values:
        return []
    text = "," + _encode(values)[1:-1].decode() + ","
    if "e" in text:
        parts = text.split("e-")  # each part but the first starts with a negative exponent's digits
        if text.count("e") != len(parts) - 1:  # a positive exponent (>= 1e16): repr writes e+
            parts = [part.replace("e", "e+") for part in parts]
        # msgspec writes an exponent from 1e-5 down, so e-6 to e-9 are its only one-digit ones
        text = "e-".join([parts[0], *("0" + part if part[1] == "," else part for part in parts[1:])])
    for prefix in _FIVE_ZEROS:
        if prefix in text:
            text = _five_zeros_as_exponent(text, prefix)
    return text[1:-1].split(",")


def _five_zeros_as_exponent(text: str, prefix: str) -> str:
    """Return ``text`` with each number written ``0.0000ddd`` (``prefix`` and digits) as ``repr`` writes it: ``d.dde-05``."""
    sign = prefix[1:-6]
    parts = text.split(prefix)
    for index in range(1, len(parts)):
        part = parts[index]
        end = part.find(",")  # -1: the next number starts like this one, its comma taken by split
        digits, rest = (part, "") if end < 0 else (part[:end], part[end:])
        point = "." if len(digits) > 1 else ""
        parts[index] = f"{sign}{digits[0]}{point}{digits[1:]}e-05{rest}"
    return ",".join(parts)
