"""Judging pairs whose sources kept a checksum of the bytes instead of the data: exact or not.

Some captures record a digest of each tensor (msprobe's md5 mode writes a CRC-32 per
tensor) so that two runs can be checked for bit-identity at almost no cost. Such a pair is
judged on the digests alone, with the statistics the sources kept shown beside them:

* equal digests: the tensors are bit-identical -- ``pass``, ``digest_mismatch = 0``;
* different digests: they are not -- ``fail``, ``digest_mismatch = 1`` (threshold 0), with
  both digests in the reason. A digest says nothing about *how far* apart the tensors are,
  so the row also carries the statistics comparison when both sides kept statistics; its
  L2-norm bound is what attribution weighs.

A pair where either side has its data is measured element by element as usual: digests only
decide when the data is missing.
"""

from __future__ import annotations

from llmcheck.core.records import VERDICT_FAIL, VERDICT_PASS, ComparisonRow, MetricResult, Pair

DIGEST_METRIC = "digest_mismatch"


def judged_on_digests(pair: Pair) -> bool:
    """Return whether a pair is judged on digests: both sides recorded one and one side kept no data."""
    golden, my = pair.golden, pair.my
    if golden is None or my is None or golden.digest is None or my.digest is None:
        return False
    return golden.data is None or my.data is None


def digest_row(index: int, pair: Pair, statistics_row: ComparisonRow | None) -> ComparisonRow:
    """Return the row of a pair judged on its digests, keeping the statistics row's figures when there is one."""
    golden, my = pair.golden, pair.my
    assert golden is not None and my is not None and golden.digest is not None and my.digest is not None
    equal = golden.digest == my.digest
    result = MetricResult(DIGEST_METRIC, 0.0 if equal else 1.0, VERDICT_PASS if equal else VERDICT_FAIL, 0.0, 0.0)
    reason = (
        "digests equal: bit-identical"
        if equal
        else f"digests differ (golden {golden.digest}, my {my.digest}): not bit-identical"
    )
    if statistics_row is None:
        return ComparisonRow(
            index=index,
            golden=golden,
            my=my,
            rule=pair.rule,
            metrics={DIGEST_METRIC: result},
            verdict=result.verdict,
            deciding_metric=DIGEST_METRIC,
            reason=reason,
            golden_stats=golden.stats,
            my_stats=my.stats,
        )
    metrics = {**statistics_row.metrics, DIGEST_METRIC: result}
    if statistics_row.reason:
        reason = f"{reason}; {statistics_row.reason}"
    return statistics_row.with_changes(
        metrics=metrics, verdict=result.verdict, deciding_metric=DIGEST_METRIC, reason=reason
    )
