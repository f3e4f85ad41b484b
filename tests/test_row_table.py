"""A compare's judged rows held as columns give back, when read, exactly the rows judging made.

Exactly: each field's type, each float's bits (``-0.0``, NaN, infinities), the objects rows
share; and the readers that take a column (``row_field``, ``rows_where``, ``in_golden_order``,
``first_in_golden_order``) answer as they do over a list of the same rows.
"""

from __future__ import annotations

import gc
import math
import struct
from array import array
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from compare_runs import capture_generate
from llmcheck.core.compare import compare_dumps
from llmcheck.core.dumps.record_rows import StatsRow, is_stats_of
from llmcheck.core.dumps.store import DumpWriter, read_dump
from llmcheck.core.judging.row_table import (
    ROWS_PER_BATCH,
    RowTable,
    c_integers,
    field_blocks,
    first_in_golden_order,
    golden_order,
    in_golden_order,
    iter_field,
    metric_names,
    row_field,
    rows_at,
    rows_where,
)
from llmcheck.core.plugins import get_plugins
from llmcheck.core.records import (
    VERDICT_FAIL,
    VERDICT_PASS,
    ComparisonRow,
    JudgedMetrics,
    MetricLayout,
    MetricResult,
    RecordKey,
    TensorRecord,
    TensorStats,
    error_growth,
)


def _bits(value: Any) -> Any:
    """Return what tells a value apart from every other: a float's bits, a container's items' bits, and the type."""
    if isinstance(value, float):
        return type(value), struct.pack("<d", value)
    if isinstance(value, (tuple, list, array)):
        return type(value), tuple(_bits(item) for item in value)
    if isinstance(value, JudgedMetrics):
        return type(value), value._layout, _bits(value._values), value._verdicts
    return type(value), value


def assert_same_rows(read: list[ComparisonRow], made: list[ComparisonRow]) -> None:
    """Assert ``read`` holds ``made``'s rows field for field: equal bits and types, and the very records."""
    assert len(read) == len(made)
    for read_row, made_row in zip(read, made):
        for row_field_ in fields(ComparisonRow):
            got, want = getattr(read_row, row_field_.name), getattr(made_row, row_field_.name)
            assert _bits(got) == _bits(want), (row_field_.name, got, want)
        assert read_row.golden is made_row.golden and read_row.my is made_row.my


def _record(name: str, order: int, step: int = 0) -> TensorRecord:
    return TensorRecord(key=RecordKey(name=name, step=step), dtype="float32", shape=(4,), order=order)


_LAYOUT = MetricLayout(["cosine_similarity", "max_absolute_error"], [0.99, None], [0.9, None], [True, False])


def _rows(count: int) -> list[ComparisonRow]:
    """Return rows whose fields take every kind of value a column must give back exactly."""
    growth = (1.0, 2.5)
    shared_stats = TensorStats(min=-1.0, max=1.0)
    rows = []
    for index in range(count):
        golden, my = _record(f"model.layers.{index % 7}", order=count - index, step=index % 3), _record("x", index)
        rows.append(
            ComparisonRow(
                index=index,
                golden=golden,
                my=my,
                rule="exact_key",
                metrics=JudgedMetrics(_LAYOUT, array("d", [1.0 - index * 1e-3, -0.0]), (VERDICT_PASS, VERDICT_PASS)),
                verdict=VERDICT_FAIL if index % 5 == 0 else VERDICT_PASS,
                deciding_metric="cosine_similarity" if index % 2 else None,
                reason="" if index % 3 else "dtype differs",
                golden_stats=shared_stats if index % 2 else TensorStats(mean=float(index)),
                nonfinite_mismatch=index % 2,
                attribution="introduced" if index == 7 else "",
                fed_by=tuple(f"feeder {index - back} step 0 output.0" for back in range(1, index % 3 + 1)),
                error=[math.nan, -0.0, math.inf, None, 1e-300, 5e-324][index % 6],
                feeder_error=None,
                growth=float(index) if index % 4 else None,
                structure="model.layers.{i}",
                layer_index=index % 7 if index % 2 else None,
                sibling_growth=growth if index % 3 else None,
                sibling_count=index,
                expected_error=2.0**-index,
                evidence="because" if index == 7 else "",
            )
        )
    return rows


def test_rows_read_back_bit_for_bit_with_the_objects_they_share() -> None:
    made = _rows(40)
    table = RowTable.of(made)
    assert_same_rows(list(table), made)
    read = table[3]
    assert read.sibling_growth is made[3].sibling_growth  # a shared object stays the same object
    assert read.golden_stats is made[3].golden_stats
    assert read.metrics == made[3].metrics and read.metrics["cosine_similarity"] == made[3].metrics["cosine_similarity"]


def test_statistics_a_row_shares_with_its_record_are_asked_of_the_record_again_not_held(tmp_path: Path) -> None:
    """A record read from a dump makes its statistics when asked (48 bytes each): the table keeps none of them."""
    with DumpWriter(tmp_path, "test") as writer:
        for order in range(600):
            stats = TensorStats(min=-1.0, max=float(order), mean=math.nan, l2norm=2.0, nan_count=1, inf_count=0)
            writer.add(
                TensorRecord(key=RecordKey(f"layer{order}"), dtype="float32", shape=(4,), order=order, stats=stats)
            )
    records = read_dump(writer.path).records
    measured = TensorStats(min=0.0, max=1.0)  # a side's statistics as measured: an object of the row's own
    made = [
        ComparisonRow(
            index=index,
            golden=record,
            my=record,
            rule="exact_key",
            metrics={},
            verdict=VERDICT_PASS,
            golden_stats=record.stats,
            my_stats=measured if index % 7 == 0 else record.stats,
        )
        for index, record in enumerate(records)
    ]
    table = RowTable.of(made)
    assert_same_rows(list(table), made)  # equal, a NaN mean included
    assert table[1].golden_stats is not made[1].golden_stats and is_stats_of(table[1].golden_stats, records[1])
    assert table[7].my_stats is measured and is_stats_of(table[8].my_stats, records[8])
    del made
    gc.collect()
    assert not any(type(held) is StatsRow for held in gc.get_objects())


@pytest.mark.parametrize(
    ("name", "values"),
    [
        ("error", [1.0, 2, None, 3.0]),  # an int among floats stays an int
        ("error", [np.float64(1.5), 2.0, np.float32(0.25), None]),  # numpy scalars stay numpy scalars
        ("sibling_count", [2**70, 1, -(2**65), 0]),  # ints beyond 64 bits
        ("layer_index", [True, False, None, 1]),  # bools are not ints
        ("fed_by", [("a",), (), ("a", 1), ("b", "a")]),  # a label that is not a text
        # labels are held as UTF-8 bytes: other scripts, a lone surrogate (a name read with
        # surrogateescape), an empty label come back code point for code point
        ("fed_by", [("módulo.ä step 0 output.0",), ("bad \udcff name",), ("",), ("módulo.ä step 0 output.0", "")]),
        ("sibling_growth", [(1, 2), (1.0, 2.0), (-0.0, 2.0), (0.0, 2.0)]),  # equal tuples that print apart
        ("reason", ["", "x", "x", None]),
    ],
)
def test_a_field_of_any_type_reads_back_as_it_was(name: str, values: list[Any]) -> None:
    made = [replace(row, **{name: value}) for row, value in zip(_rows(len(values)), values)]
    assert_same_rows(list(RowTable.of(made)), made)


def test_metrics_of_other_kinds_are_held_as_they_are() -> None:
    plain = {"cosine_similarity": MetricResult("cosine_similarity", 0.5, VERDICT_FAIL, 0.99, 0.9, True)}
    integral = JudgedMetrics(_LAYOUT, (1, 2.0), (VERDICT_PASS, VERDICT_PASS))  # an int statistic: a tuple
    made = [replace(row, metrics=metrics) for row, metrics in zip(_rows(3), [plain, integral, plain])]
    read = list(RowTable.of(made))
    assert read[0].metrics is plain and read[1].metrics is integral


def test_steps_put_out_of_order_read_back_in_row_order() -> None:
    made = _rows(3 * ROWS_PER_BATCH // 2)
    table = RowTable(len(made))
    odd, even = list(range(1, len(made), 2)), list(range(0, len(made), 2))
    table.put(odd, [made[position] for position in odd])
    table.put(even[::-1], [made[position] for position in even[::-1]])
    assert_same_rows(list(table), made)
    assert_same_rows(table[5:17:3], made[5:17:3])
    assert_same_rows([table[-1], table[0]], [made[-1], made[0]])
    with pytest.raises(IndexError):
        table[len(made)]
    assert table.column("verdict") == [row.verdict for row in made]  # read a batch of positions at a time
    assert table.column("index") == [row.index for row in made]
    with pytest.raises(KeyError, match="no field 'verdicts'"):
        table.column("verdicts")


def test_rows_put_at_consecutive_scattered_and_put_again_positions_read_back_where_they_were_put() -> None:
    """A block of consecutive positions holds its first alone; others each row's offset; a later put wins."""
    made = _rows(40)
    table = RowTable(len(made))
    table.put(range(0, 10), made[0:10])  # consecutive: no offsets held
    table.put(range(10, 20), made[10:20])
    assert table._offset is None and table._block_of.itemsize == 2
    scattered = [25, 21, 39, 30]
    table.put(scattered, [made[position] for position in scattered])  # the first block whose offsets are held
    assert table._offset is not None
    table.put(range(3, 8), made[3:8])  # put again, consecutive, over a consecutive block
    table.put([9, 5], [made[9], made[5]])  # put again, scattered, over two consecutive blocks
    table.put(range(21, 26), made[21:26])  # put again, consecutive, over a scattered block
    rest = table.unfilled().tolist()
    table.put(rest, [made[position] for position in rest])
    assert table.unfilled().tolist() == []
    assert_same_rows(list(table), made)
    order = [39, 0, 5, 22, 9, 30, 13]
    reordered = table.reordered(order)
    assert_same_rows(list(reordered), [made[position] for position in order])


def test_a_table_of_more_blocks_than_int16_counts_reads_back_every_row() -> None:
    made = _rows(3)
    blocks = 2**15 + 2
    table = RowTable(blocks)
    for position in range(blocks):
        table.put([position], [made[position % 3]])
    assert table._block_of.itemsize == 4  # widened at block 32 768
    assert table.column("index") == [position % 3 for position in range(blocks)]
    read = [0, 2**15 - 1, 2**15, blocks - 1]
    assert_same_rows(rows_at(table, read), [made[position % 3] for position in read])


def test_row_positions_are_held_as_a_range_where_consecutive_else_as_the_narrowest_c_integers() -> None:
    assert c_integers(np.arange(5, 9)) == range(5, 9)
    assert c_integers(np.array([], dtype=np.int64)) == array("i")
    scattered = c_integers(np.array([3, 1, 2**31 - 1]))
    assert isinstance(scattered, array) and scattered.typecode == "i" and list(scattered) == [3, 1, 2**31 - 1]
    wide = c_integers(np.array([0, 2**31]))
    assert isinstance(wide, array) and wide.typecode == "q" and list(wide) == [0, 2**31]
    # rows in golden order: their order is a range, and the rows in golden order the table itself
    made = _rows(30)
    in_order = [replace(row, golden=_record(row.golden.key.name, order=row.index // 2)) for row in made]
    table = RowTable.of(in_order)
    assert golden_order(table) == range(30) and in_golden_order(table) is table
    shuffled = RowTable.of(made)  # golden orders count down
    assert list(golden_order(shuffled)) == list(range(29, -1, -1)) and not isinstance(golden_order(shuffled), range)
    for rows, order in ((table, range(30)), (shuffled, golden_order(shuffled))):
        read = [position for block in field_blocks(rows, 7, order) for position in block.index]
        assert read == [rows[position].index for position in order]


def test_a_block_is_let_go_once_all_its_rows_are_released() -> None:
    made = _rows(12)
    table = RowTable(len(made))
    table.put(range(6), made[:6])
    table.put(range(6, 12), made[6:])
    table.release([0, 1, 2, 6, 7])
    assert_same_rows(list(table), made)  # no block has all its rows released yet
    table.release([3, 4, 5])
    assert_same_rows(table[6:], made[6:])
    with pytest.raises(LookupError, match="released"):
        table[0]


def test_the_column_readers_answer_as_they_do_over_a_list() -> None:
    made = _rows(50)
    table = RowTable.of(made)
    for rows in (made, table):
        assert row_field(rows, "index") == list(range(50))
        assert list(iter_field(rows, "metrics")) == [row.metrics for row in made]
        assert_same_rows(rows_at(rows, [4, 2]), [made[4], made[2]])
        assert_same_rows(
            rows_where(rows, "verdict", VERDICT_FAIL.__eq__), [r for r in made if r.verdict == VERDICT_FAIL]
        )
        assert_same_rows(list(in_golden_order(rows)), sorted(made, key=lambda row: row.golden.order))
        first = first_in_golden_order(rows, "verdict", VERDICT_FAIL)
        assert first is not None and first.index == 45  # the failing row with the lowest golden order
        assert first_in_golden_order(rows, "verdict", "no such verdict") is None


def test_field_blocks_read_the_fields_of_a_table_as_of_a_list() -> None:
    made = _rows(70)
    order = sorted(range(70), key=lambda position: made[position].golden.order)
    for order_given in (None, order):
        expected = made if order_given is None else [made[position] for position in order]
        for rows in (made, RowTable.of(made)):
            blocks = list(field_blocks(rows, 32, order_given))
            assert [len(block) for block in blocks] == [32, 32, 6]
            assert [value for block in blocks for value in block.fed_by] == [row.fed_by for row in expected]
            assert [_bits(value) for block in blocks for value in block.error] == [_bits(row.error) for row in expected]
            assert_same_rows([row for block in blocks for row in block.rows()], expected)
            with pytest.raises(AttributeError):
                blocks[0].verdicts  # noqa: B018 -- a field the rows do not have


def test_a_real_compare_reads_back_as_judged(tmp_path: Path) -> None:
    """A real decode of a Llama, judged: the table's rows are the rows, and held again they read the same."""
    from llmcheck.bundled_model import random_llama

    defective = random_llama(seed=0, num_layers=4)
    with torch.no_grad():
        defective.model.layers[2].mlp.down_proj.weight.mul_(1.05)
    golden, my = (
        get_plugins().load_tensors(capture_generate(model, tmp_path / name, new_tokens=3))
        for model, name in ((random_llama(seed=0, num_layers=4), "golden"), (defective, "my"))
    )
    result = compare_dumps(golden, my, workers=1)
    assert isinstance(result.rows, RowTable) and len(result.rows) > 100
    rows = list(result.rows)
    assert_same_rows(list(RowTable.of(rows)), rows)
    assert [row.index for row in rows] == list(range(len(rows)))
    introduced = result.first_introduced
    assert introduced is not None and introduced.golden.key.name == "model.layers.2.mlp.down_proj"


def _statistics_dump(folder: Path, count: int, scale: float) -> Path:
    """A statistics-only dump whose statistics take odd values too: -0.0, a subnormal, a huge one, an infinity."""
    with DumpWriter(folder, "test") as writer:
        for order in range(count):
            low, high = -1.0 - order * scale, [2.5, -0.0, 5e-324, 1e300][order % 4] * scale
            if order % 100 == 1:
                high = math.inf
            stats = TensorStats(min=low, max=high, mean=0.125 * order, l2norm=3.0 + scale, nan_count=0, inf_count=0)
            writer.add(
                TensorRecord(key=RecordKey(f"layer{order}"), dtype="float32", shape=(4,), order=order, stats=stats)
            )
    return writer.path


def _metric_values(table: RowTable) -> Any:
    """Return the metric values' column of a table's first block."""
    block = table._blocks[0]
    assert block is not None
    return block.columns[[row_field.name for row_field in fields(ComparisonRow)].index("metrics")].metric_values  # type: ignore[attr-defined]


@pytest.mark.filterwarnings("error::RuntimeWarning")  # an infinity's errors are NaN: made quietly
def test_a_statistics_rows_metric_values_are_made_again_from_its_records_not_held(tmp_path: Path) -> None:
    """A statistics row's values are its two records' statistics errors: the table holds none, and reads them back bit for bit.

    They were 64 bytes a row in a statistics-only compare's table, a tenth of its memory. A row
    whose values are anything else (measured, or judged another way) keeps them.
    """
    golden, my = get_plugins().load_runs(
        _statistics_dump(tmp_path / "golden", 700, 1.0), None, _statistics_dump(tmp_path / "my", 700, 1.0 + 1e-3), None
    )
    rows = list(compare_dumps(golden, my, workers=1).rows)
    assert len(rows) == 700 and {row.verdict for row in rows} == {VERDICT_PASS, VERDICT_FAIL}
    table = RowTable.of(rows)
    assert_same_rows(list(table), rows)
    # every row but those whose max (1e300, an infinity) is beyond float32's range: not judged on plain statistics
    plain = [row.golden.order % 4 != 3 and row.golden.order % 100 != 1 for row in rows]
    assert _metric_values(table).derived.tolist() == plain
    others = sum(len(row.metrics._values) for row, made in zip(rows, plain) if not made)  # type: ignore[attr-defined]
    assert len(_metric_values(table).held.flat) == others
    changed = list(rows)
    metrics = rows[10].metrics
    assert isinstance(metrics, JudgedMetrics)
    values = array("d", metrics._values)
    values[1] = math.nextafter(values[1], math.inf)  # one bit off the records' errors: held as given
    changed[10] = replace(rows[10], metrics=JudgedMetrics(metrics._layout, values, metrics._verdicts))
    # eight values beside a record with an infinity: its errors are made (NaN, quietly), never match, and it keeps them
    infinite = next(at for at, row in enumerate(rows) if row.golden.order % 100 == 1)
    held_before = len(rows[infinite].metrics._values)  # type: ignore[attr-defined]
    changed[infinite] = replace(rows[infinite], metrics=metrics)
    table = RowTable.of(changed)
    assert_same_rows(list(table), changed)
    assert _bits(table[10].metrics) == _bits(changed[10].metrics) != _bits(metrics)
    assert _bits(table[infinite].metrics) == _bits(metrics)
    assert _metric_values(table).derived.sum() == sum(plain) - 1
    assert len(_metric_values(table).held.flat) == others + len(values) - held_before + len(values)


def test_a_feeders_label_that_labels_a_row_record_is_held_as_its_place_and_read_back_as_the_text() -> None:
    """Nearly every row names its feeders by their records' labels (50 bytes of text each): a label of a row's
    golden record is held as that row's place and made again from its key; any other label stays text."""
    records = [_record(f"model.layers.{number}.mlp", order=number, step=2) for number in range(50)]
    made = [
        replace(
            row,
            golden=records[index],
            fed_by=(
                tuple([records[index - 1].key.label()] if index else [])
                + (("model.layers.9.mlp step 2 output.0 (my-run only)",) if index % 10 == 3 else ())
            ),
        )
        for index, row in enumerate(_rows(50))
    ]
    table = RowTable.of(made)
    assert_same_rows(list(table), made)
    block = table._blocks[0]
    assert block is not None
    labels = block.columns[[row_field.name for row_field in fields(ComparisonRow)].index("fed_by")].distinct  # type: ignore[attr-defined]
    assert sorted(labels.places.tolist()) == [-1, *range(49)]  # 49 records' labels by place, one text
    assert labels.texts.buffer == b"model.layers.9.mlp step 2 output.0 (my-run only)"


def _column_of(table: RowTable, name: str, block: int = 0) -> Any:
    held = table._blocks[block]
    assert held is not None
    return held.columns[[row_field.name for row_field in fields(ComparisonRow)].index(name)]


def test_a_rows_records_are_read_from_its_pair_and_its_growth_made_again_from_its_two_errors() -> None:
    """A compare's rows measure its pairs, position by position: a row's two records are its pair's, and judging
    sets its growth from its error and its feeders'. Neither is held again (16 and 9 bytes a row); a row where
    either is not so keeps what it was given, bit for bit."""
    errors = [(1.0, 0.5), (0.0, 0.0), (2.0, 0.0), (None, 1.0), (1.0, None), (math.nan, 1.0), (-0.0, 2.0)]
    errors += [(math.inf, math.inf), (5e-324, 1e300), (3.0, -0.0), (7, 2.0)]
    made = [
        replace(row, error=error, feeder_error=feeder, growth=error_growth(error, feeder))
        for row, (error, feeder) in zip(_rows(len(errors) * 20), errors * 20)
    ]
    pairs = ([row.golden for row in made], [row.my for row in made])
    table = RowTable(len(made), pairs)
    table.put(range(100), made[:100])  # a run of consecutive pairs: where it starts is all a side holds
    scattered = list(range(len(made) - 1, 99, -3))  # pairs in another order: their places, 4 bytes a row
    table.put(scattered, [made[position] for position in scattered])
    rest = [position for position in range(100, len(made)) if position not in scattered]
    strays = [replace(made[position], golden=_record("elsewhere", 0)) for position in rest]
    strays[0] = replace(strays[0], growth=0.25)  # not its errors' growth
    table.put(rest, strays)
    expected = list(made)
    for position, row in zip(rest, strays):
        expected[position] = row
    assert_same_rows(list(table), expected)
    assert [type(_column_of(table, side, 0)).__name__ for side in ("golden", "my", "growth")] == ["_PairSide"] * 2 + [
        "_Growths"
    ]
    assert _column_of(table, "golden", 0).places is None and _column_of(table, "golden", 1).places is not None
    assert [type(_column_of(table, name, 2)).__name__ for name in ("golden", "my", "growth")] == [
        "_Objects",
        "_PairSide",
        "_Numbers",
    ]
    others = RowTable(len(made), (pairs[0][:10], pairs[1][:10]))  # told other (fewer) pairs
    others.put(range(len(made)), made)
    for judged in (RowTable.of(made), others):  # RowTable.of is told no pairs: either holds the records
        assert_same_rows(list(judged), made)
        assert type(_column_of(judged, "golden")).__name__ == "_Objects"


def test_a_statistics_rows_error_is_made_again_from_its_records_where_every_rows_is(tmp_path: Path) -> None:
    """A statistics row's error, its L2 norms' relative error, is made again from its records: held, 9 bytes a row.

    Only where each row's error is, bit for bit, the one its records give; one bit off, the
    block holds its errors as they are.
    """
    paths = []
    for side, moved in (("golden", 0.0), ("my", 0.02)):
        with DumpWriter(tmp_path / side, "test") as writer:
            for order in range(300):
                l2norm = ([0.0, 5e-324, 3.0, -0.0][order % 4] + order) * (1 + moved * (order % 7))
                stats = TensorStats(min=-1.0, max=2.0, mean=0.125 * order, l2norm=l2norm, nan_count=0, inf_count=0)
                key = RecordKey(f"layer{order}")
                writer.add(TensorRecord(key=key, dtype="bfloat16", shape=(4,), order=order, stats=stats))
        paths.append(writer.path)
    golden, my = get_plugins().load_runs(paths[0], None, paths[1], None)
    rows = list(compare_dumps(golden, my, workers=1).rows)
    assert {row.verdict for row in rows} >= {VERDICT_PASS, VERDICT_FAIL}
    assert len({row.error for row in rows}) > 100 and None not in {row.error for row in rows}
    table = RowTable.of(rows)
    assert type(_column_of(table, "error")).__name__ == "_StatisticsBounds"
    assert type(_column_of(table, "growth")).__name__ == "_Growths"  # made from the errors made again
    assert_same_rows(list(table), rows)
    error = rows[42].error
    assert error is not None
    changed = list(rows)
    changed[42] = replace(rows[42], error=math.nextafter(error, math.inf))
    table = RowTable.of(changed)
    assert type(_column_of(table, "error")).__name__ != "_StatisticsBounds"
    assert_same_rows(list(table), changed)
    assert _bits(table[42].error) != _bits(error)


def test_a_few_rows_whose_metrics_are_a_dict_keep_it_and_the_others_are_held_as_columns() -> None:
    """Judging gives a row carrying its feeders' error a dict of metrics: its block's other rows are held as columns still."""
    made = _rows(60)
    changed = list(made)
    for at in (3, 41):
        carried = MetricResult("carried_error", 2.5, VERDICT_FAIL, None, 0.5)
        changed[at] = replace(made[at], metrics={**made[at].metrics, "carried_error": carried})
    table = RowTable.of(changed)
    column = _column_of(table, "metrics")
    assert type(column).__name__ == "_Excepted" and type(column.column).__name__ == "_Metrics"
    assert column.rows.tolist() == [3, 41]
    assert_same_rows(list(table), changed)
    assert type(table[3].metrics) is dict and table[3].metrics["carried_error"].value == 2.5
    assert_same_rows(rows_at(table, [41, 40, 3]), [changed[41], changed[40], changed[3]])
    mostly = [replace(row, metrics=dict(row.metrics)) if row.index % 3 else row for row in made]
    assert type(_column_of(RowTable.of(mostly), "metrics")).__name__ == "_Objects"  # most rows a dict: kept as objects


def test_a_batch_read_field_by_field_makes_its_records_statistics_errors_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A statistics row's metric values, error and growth are all made from its records' errors: made once a batch."""
    import llmcheck.core.judging.row_table as row_table

    golden, my = get_plugins().load_runs(
        _statistics_dump(tmp_path / "golden", 300, 1.0), None, _statistics_dump(tmp_path / "my", 300, 1.0), None
    )
    rows = list(compare_dumps(golden, my, workers=1).rows)
    plain = [row for row in rows if row.golden.order % 4 != 3 and row.golden.order % 100 != 1]  # errors made again
    table = RowTable.of(plain)
    assert type(_column_of(table, "error")).__name__ == "_StatisticsBounds"
    made = []
    making = row_table._statistics_errors
    monkeypatch.setattr(row_table, "_statistics_errors", lambda *sides: made.append(1) or making(*sides))
    (block,) = field_blocks(table, len(table))
    read = (block.metrics, block.error, block.growth)
    assert len(made) == 1 and all(len(values) == len(table) for values in read)
    assert_same_rows(table[10:20], plain[10:20])
    assert len(made) == 2  # another batch of rows: made again, once


def test_the_metric_names_of_a_tables_rows_are_read_from_its_blocks_without_making_a_rows_metrics(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A block names its rows' metrics by the few layouts (or mappings) it holds; a table whose blocks may hold rows
    it no longer has (a position put again, a part of another table) asks its rows instead."""
    other = MetricLayout(["cosine_similarity", "kl_divergence"], [0.99, None], [0.9, None], [True, False])
    made = _rows(60)
    for at in range(0, 60, 7):  # a second layout in the same blocks
        made[at] = replace(made[at], metrics=JudgedMetrics(other, array("d", [0.5, 0.1]), (VERDICT_PASS,) * 2))
    carried = MetricResult("carried_error", 2.5, VERDICT_FAIL, None, 0.5)
    made[3] = replace(made[3], metrics={**made[3].metrics, "carried_error": carried})  # held apart, as a dict
    table = RowTable(len(made))
    table.put(range(30), made[:30])
    table.put(range(30, 60), made[30:])
    plain = {"sqnr": MetricResult("sqnr", 30.0, VERDICT_PASS)}
    every = {"cosine_similarity", "max_absolute_error", "kl_divergence", "carried_error"}
    assert metric_names(made) == every

    def made_rows_metrics(*args: Any) -> None:
        raise AssertionError("a row's metrics were made")

    with monkeypatch.context() as patched:  # read from the blocks: no row's metrics made
        patched.setattr(JudgedMetrics, "__iter__", made_rows_metrics)
        assert metric_names(table) == every
        assert metric_names(in_golden_order(table)) == every  # every row, reordered
    assert metric_names(table.reordered([1, 2])) == {"cosine_similarity", "max_absolute_error"}  # a part: its rows'
    table.put([3], [replace(made[3], metrics=plain)])  # put again: block 0 holds a row the table no longer has
    assert metric_names(table) == every - {"carried_error"} | {"sqnr"}
    assert metric_names(RowTable.of([replace(row, metrics=plain) for row in made])) == {"sqnr"}  # one mapping
