"""The leave-one-out sibling baselines of a group are exactly those computed sibling by sibling."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from llmcheck.core.judging.repeats import SiblingGroup, SiblingLines, sibling_baseline
from llmcheck.core.judging.sibling_lines import _leave_one_out_order_statistics

#: Few distinct values, so ties, equal feeder errors (no slope) and zero feeders are common.
_ERRORS = st.sampled_from([0.0, 1e-7, 3e-7, 1e-6, 2.5e-6, 1e-5, 4e-3, 0.1, 1.0, 7.5])
_POINT = st.one_of(st.none(), st.tuples(_ERRORS, _ERRORS), st.tuples(st.floats(0, 10), st.floats(0, 10)))


def _same(first: object, second: object) -> bool:
    """Equal baselines, NaN equal to NaN (a baseline's growth range is NaN when no sibling has a growth)."""
    if first is None or second is None:
        return first is second
    return all(
        (isinstance(a, float) and math.isnan(a) and math.isnan(b)) or a == b
        for a, b in zip(vars_of(first), vars_of(second))
    )


def vars_of(baseline: object) -> list[object]:
    """Return every field of a baseline, and the siblings' scatter computed from them."""
    return [*baseline, baseline.log_spread]  # type: ignore[attr-defined]


@settings(max_examples=300, deadline=None)
@given(points=st.lists(_POINT, min_size=2, max_size=14), floor=st.sampled_from([0.0, 1e-6, 3.9e-3]))
def test_every_member_gets_the_baseline_of_the_other_members(points, floor) -> None:
    group = SiblingGroup(list(range(len(points))), points)
    for member in range(len(points)):
        others = [point for other, point in enumerate(points) if point is not None and other != member]
        assert _same(group.baseline(member, floor), sibling_baseline(others, floor))


def test_a_32_layer_place_with_one_defective_layer() -> None:
    """The shape judging meets most: 32 repeats, one of them adding 30x the error of the others."""
    points = [(1e-6 * (1 + layer / 10), 1.1e-6 * (1 + layer / 10)) for layer in range(32)]
    points[17] = (points[17][0], 30 * points[17][1])
    group = SiblingGroup(list(range(32)), points)
    for member in range(32):
        others = points[:member] + points[member + 1 :]
        assert group.baseline(member, 1e-6) == sibling_baseline(others, 1e-6)
    expected = group.baseline(17, 1e-6)
    assert expected is not None and points[17][1] > 10 * expected.expected(points[17][0])


def test_groups_with_a_non_finite_point_or_a_repeated_index_are_computed_directly() -> None:
    infinite = [(1e-6, 2e-6), (2e-6, math.inf), (3e-6, 5e-6), (4e-6, 9e-6)]
    group = SiblingGroup([0, 1, 2, 3], infinite)
    assert group.baseline(0) == sibling_baseline(infinite[1:])
    repeated = [(1e-6, 2e-6), (2e-6, 3e-6), (3e-6, 5e-6), (4e-6, 9e-6)]
    group = SiblingGroup([0, 1, 1, 2], repeated)  # two members share layer 1: both leave each other out
    assert group.baseline(1) == sibling_baseline([repeated[0], repeated[3]])


@settings(max_examples=200, deadline=None)
@given(size=st.integers(3, 9), count=st.integers(1, 6), floor=st.sampled_from([0.0, 1e-6]), data=st.data())
def test_groups_whose_lines_are_made_together_give_each_member_the_direct_baseline(size, count, floor, data) -> None:
    """Groups of one size have their lines made in one pass, whichever member of whichever group asks first."""
    groups = [data.draw(st.lists(_POINT, min_size=size, max_size=size)) for _ in range(count)]
    lines = SiblingLines()
    made = [SiblingGroup(list(range(size)), points, lines) for points in groups]
    asks = data.draw(st.permutations([(group, member) for group in range(count) for member in range(size)]))
    for group, member in [*asks, *asks[:3]]:  # a member asking again has the lines made again
        others = [point for other, point in enumerate(groups[group]) if point is not None and other != member]
        found, direct = made[group].baseline(member, floor), sibling_baseline(others, floor)
        # repr: the same floats, the sign of a zero and NaN included
        assert repr(found) == repr(direct)
        assert found is None or repr(found.log_spread) == repr(direct.log_spread)  # type: ignore[union-attr]


@settings(max_examples=150, deadline=None)
@given(size=st.integers(3, 24), count=st.integers(1, 4), data=st.data())
def test_each_members_middle_slopes_are_those_of_its_others_sorted(size, count, data) -> None:
    """The others' middle slopes, found by skipping a member's own in the slopes sorted once, are the ones sorting the others picks."""
    points = [data.draw(st.lists(st.tuples(_ERRORS, _ERRORS), min_size=size, max_size=size)) for _ in range(count)]
    values = np.array(points, dtype=np.float64)
    x, y = values[:, :, 0] ** 2, values[:, :, 1] ** 2
    first, second = np.triu_indices(size, 1)
    with np.errstate(all="ignore"):
        distinct = x[:, first] != x[:, second]
        slopes = (y[:, second] - y[:, first]) / (x[:, second] - x[:, first])
    upper, lower, remaining = _leave_one_out_order_statistics(slopes, distinct, size)
    for group in range(count):
        for member in range(size):
            others = sorted(
                float(slopes[group, pair])
                for pair in range(len(first))
                if distinct[group, pair] and member not in (first[pair], second[pair])
            )
            assert remaining[group, member] == len(others)
            if others:  # repr: the same float, the sign of a zero included
                middle = len(others) // 2
                assert repr(float(upper[group, member])) == repr(others[middle])
                if middle:
                    assert repr(float(lower[group, member])) == repr(others[middle - 1])


@settings(max_examples=60, deadline=None)
@given(size=st.integers(10, 40), floor=st.sampled_from([0.0, 1e-6, 3.9e-3]), data=st.data())
def test_large_groups_full_of_ties_give_each_member_the_direct_baseline(size, floor, data) -> None:
    """Groups of a decode dump's size, few distinct values: every member's line is the one computed sibling by sibling."""
    points = data.draw(st.lists(st.tuples(_ERRORS, _ERRORS), min_size=size, max_size=size))
    group = SiblingGroup(list(range(size)), points)
    for member in range(size):
        others = points[:member] + points[member + 1 :]
        found, direct = group.baseline(member, floor), sibling_baseline(others, floor)
        assert repr(found) == repr(direct)
