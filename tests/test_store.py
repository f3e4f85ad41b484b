"""llmcheck's own dump format: exact round trips, crash consistency, never overwriting."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from llmcheck.core.capture.statistics import tensor_stats
from llmcheck.core.dumps.store import NO_ATTRS, DumpWriter, find_dumps, read_dump
from llmcheck.core.dumps.tensor_io import all_torch_dtype_names, dtype_name
from llmcheck.core.errors import DumpFormatError, PathOutsideDumpError
from llmcheck.core.records import RecordKey, TensorRecord, TensorStats, TopologyNode


def _random_tensor(dtype: torch.dtype, shape: tuple[int, ...], seed: int) -> torch.Tensor:
    """Random bits of any dtype: fills the raw bytes so every bit pattern (NaN payloads too) is exercised."""
    generator = torch.Generator().manual_seed(seed)
    itemsize = torch.empty((), dtype=dtype).element_size()
    numel = 1
    for size in shape:
        numel *= size
    raw = torch.randint(0, 256, (numel * itemsize,), dtype=torch.uint8, generator=generator)
    if dtype == torch.bool:
        return (raw % 2).bool().reshape(shape)
    return raw.view(dtype).reshape(shape)


def _record(name: str, tensor: torch.Tensor, order: int, **key: object) -> TensorRecord:
    return TensorRecord(
        key=RecordKey(name=name, **key),
        dtype=dtype_name(tensor.dtype),
        shape=tuple(tensor.shape),
        order=order,
        op_type="Test",
        stats=None,
    )


@pytest.mark.parametrize("dtype_text", all_torch_dtype_names())
def test_store_round_trips_every_dtype_bit_exactly(tmp_path: Path, dtype_text: str) -> None:
    dtype = getattr(torch, dtype_text)
    tensors = [_random_tensor(dtype, shape, seed) for seed, shape in enumerate([(3, 5), (7,), (2, 0, 4), ()])]
    with DumpWriter(tmp_path, "test") as writer:
        for order, tensor in enumerate(tensors):
            writer.add(_record(f"layer{order}", tensor, order), tensor.clone())
    dump = read_dump(writer.path)
    assert dump.cut is None
    assert [r.key.name for r in dump.records] == ["layer0", "layer1", "layer2", "layer3"]
    for record, original in zip(dump.records, tensors):
        loaded = record.data.load()
        assert loaded.dtype == dtype and tuple(loaded.shape) == tuple(original.shape)
        assert torch.equal(loaded.reshape(-1).view(torch.uint8), original.reshape(-1).view(torch.uint8))


def test_shards_are_plain_safetensors_readable_without_llmcheck(tmp_path: Path) -> None:
    from safetensors.torch import load_file

    tensor = torch.arange(12, dtype=torch.bfloat16).reshape(3, 4)
    with DumpWriter(tmp_path, "test") as writer:
        writer.add(_record("x", tensor, 0), tensor.clone())
    lines = [json.loads(line) for line in (writer.path / "index.jsonl").read_text().splitlines()]
    shard = load_file(writer.path / lines[0]["shard"])
    assert torch.equal(shard[lines[0]["tensor"]], tensor)
    manifest = json.loads((writer.path / "manifest.json").read_text())
    assert manifest["format"] == "llmcheck-dump" and manifest["backend"] == "test"
    assert manifest["records"] == 1 and "end_time" in manifest and manifest["torch_version"] == torch.__version__


def test_shards_close_at_the_size_bound_so_a_dump_has_few_files(tmp_path: Path) -> None:
    with DumpWriter(tmp_path, "test", shard_bytes=1000) as writer:
        for order in range(10):
            tensor = torch.full((100,), float(order))  # 400 bytes each: a shard closes every 3 tensors
            writer.add(_record(f"t{order}", tensor, order), tensor)
    shards = sorted(writer.path.glob("shard_*.safetensors"))
    assert len(shards) == 4
    dump = read_dump(writer.path)
    assert [float(r.data.load()[0]) for r in dump.records] == [float(i) for i in range(10)]


def test_statistics_only_dump_has_an_index_and_no_shards(tmp_path: Path) -> None:
    tensor = torch.tensor([1.0, -2.0, float("nan"), float("inf")])
    stats = tensor_stats(tensor)
    with DumpWriter(tmp_path, "test") as writer:
        writer.add(TensorRecord(key=RecordKey("m"), dtype="float32", shape=(4,), order=0, stats=stats))
    assert not list(writer.path.glob("shard_*"))
    (record,) = read_dump(writer.path).records
    assert record.data is None
    assert record.stats == TensorStats(
        min=-2.0, max=1.0, mean=-0.5, l2norm=pytest.approx(5**0.5), nan_count=1, inf_count=1
    )


def test_a_new_run_never_overwrites_an_existing_dump(tmp_path: Path) -> None:
    first = DumpWriter(tmp_path, "test", background=False)
    second = DumpWriter(tmp_path, "test", background=False)
    first.close()
    second.close()
    assert first.path != second.path
    assert first.path.name.startswith("llmcheck_dump_") and str(os.getpid()) in first.path.name
    assert sorted(find_dumps(tmp_path)) == sorted([first.path, second.path])


_KILLED_WRITER = textwrap.dedent(
    """
    import sys, torch
    from llmcheck.core.records import RecordKey, TensorRecord
    from llmcheck.core.dumps.store import DumpWriter
    writer = DumpWriter(sys.argv[1], "test", shard_bytes=64 * 1024)
    print(writer.path, flush=True)
    order = 0
    while True:  # runs until SIGKILL
        tensor = torch.full((4096,), float(order))
        writer.add(TensorRecord(key=RecordKey(f"layer{order}"), dtype="float32", shape=(4096,), order=order), tensor)
        order += 1
    """
)


def test_dump_killed_with_sigkill_reads_back_every_flushed_record(tmp_path: Path) -> None:
    process = subprocess.Popen([sys.executable, "-c", _KILLED_WRITER, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    dump_dir = Path(process.stdout.readline().strip())
    deadline = time.time() + 60
    while len(list(dump_dir.glob("shard_*.safetensors"))) < 5 and time.time() < deadline:
        time.sleep(0.05)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    dump = read_dump(dump_dir)
    assert dump.cut is not None and "did not close" in dump.cut
    assert len(dump.records) >= 5 * 4  # four 16 KiB tensors per 64 KiB shard, five shards at least
    for record in dump.records:  # every record the index names is complete and right
        assert record.key.name == f"layer{record.order}"
        assert float(record.data.load()[0]) == float(record.order)
    assert [r.order for r in dump.records] == list(range(len(dump.records)))


def test_partial_last_index_line_is_reported_as_the_cut(tmp_path: Path) -> None:
    with DumpWriter(tmp_path, "test") as writer:
        writer.add(_record("a", torch.ones(2), 0), torch.ones(2))
    with open(writer.path / "index.jsonl", "a") as index:
        index.write('{"name": "b", "dtype": "flo')
    dump = read_dump(writer.path)
    assert len(dump.records) == 1 and "partial line" in dump.cut


def test_corrupt_index_line_is_one_clear_error_naming_file_and_offset(tmp_path: Path) -> None:
    with DumpWriter(tmp_path, "test") as writer:
        writer.add(_record("a", torch.ones(2), 0), torch.ones(2))
    good = (writer.path / "index.jsonl").read_bytes()
    (writer.path / "index.jsonl").write_bytes(good + b"not json\n")
    with pytest.raises(DumpFormatError) as error:
        read_dump(writer.path)
    assert "index.jsonl" in str(error.value) and f"at byte {len(good)}" in str(error.value)


def test_shard_name_pointing_outside_the_dump_is_refused(tmp_path: Path) -> None:
    with DumpWriter(tmp_path, "test") as writer:
        writer.add(_record("a", torch.ones(2), 0), torch.ones(2))
    index = writer.path / "index.jsonl"
    line = json.loads(index.read_text())
    line["shard"] = "../../etc/passwd"
    index.write_text(json.dumps(line) + "\n")
    with pytest.raises(DumpFormatError, match="outside the dump"):
        read_dump(writer.path)


def test_truncated_shard_is_one_clear_error(tmp_path: Path) -> None:
    tensor = torch.ones(1000)
    with DumpWriter(tmp_path, "test") as writer:
        writer.add(_record("a", tensor, 0), tensor)
    shard = next(writer.path.glob("shard_*.safetensors"))
    shard.write_bytes(shard.read_bytes()[:500])
    (record,) = read_dump(writer.path).records
    with pytest.raises(DumpFormatError, match="past the end of the file"):
        record.data.load()


def test_statistics_ignore_non_finite_values_and_count_them() -> None:
    stats = tensor_stats(torch.tensor([[1.0, 3.0], [float("-inf"), float("nan")]], dtype=torch.bfloat16))
    assert (stats.min, stats.max, stats.mean, stats.nan_count, stats.inf_count) == (1.0, 3.0, 2.0, 1, 1)
    empty = tensor_stats(torch.empty(0))
    assert empty.min is None and empty.nan_count == 0


def test_index_lines_lost_after_the_dump_was_closed_are_reported_as_a_cut(tmp_path: Path) -> None:
    with DumpWriter(tmp_path, "test") as writer:
        for order in range(3):
            writer.add(_record(f"t{order}", torch.ones(2), order), torch.ones(2))
    index = writer.path / "index.jsonl"
    index.write_text("".join(index.read_text().splitlines(keepends=True)[:2]))
    dump = read_dump(writer.path)
    assert len(dump.records) == 2 and "holds 2 of the 3 records" in dump.cut


def test_unknown_dtype_in_the_index_is_named(tmp_path: Path) -> None:
    with DumpWriter(tmp_path, "test") as writer:
        writer.add(_record("a", torch.ones(2), 0), torch.ones(2))
    index = writer.path / "index.jsonl"
    index.write_text(index.read_text().replace('"float32"', '"float99"'))
    with pytest.raises(DumpFormatError, match="unknown dtype 'float99'"):
        read_dump(writer.path)


def test_a_corrupt_manifest_is_reported_as_a_damaged_dump_not_as_no_dump(tmp_path: Path) -> None:
    from llmcheck.core.plugins import get_plugins

    with DumpWriter(tmp_path, "test") as writer:
        writer.add(_record("a", torch.ones(2), 0), torch.ones(2))
    (writer.path / "manifest.json").write_text("{")
    with pytest.raises(DumpFormatError, match=r"manifest\.json: not valid JSON"):
        get_plugins().load_tensors(writer.path)


@pytest.mark.parametrize(
    ("edit", "field"),
    [
        (lambda line: {**line, "rank": None}, "$.rank"),
        (lambda line: {**line, "shape": [-1]}, "$.shape[0]"),
        (lambda line: {**line, "stats": {"max": "many"}}, "$.stats.max"),
        (lambda line: {**line, "attrs": [1]}, "$.attrs"),
        (lambda line: {**line, "attrs": None}, "$.attrs"),
    ],
)
def test_an_index_field_of_the_wrong_kind_names_file_line_and_field(tmp_path: Path, edit, field: str) -> None:
    with DumpWriter(tmp_path, "test") as writer:
        writer.add(_record("a", torch.ones(2), 0), torch.ones(2))
        writer.add(_record("b", torch.ones(2), 1), torch.ones(2))
    index = writer.path / "index.jsonl"
    first, second = index.read_text().splitlines()
    index.write_text(first + "\n" + json.dumps(edit(json.loads(second))) + "\n")
    with pytest.raises(DumpFormatError) as error:
        read_dump(writer.path)
    assert error.value.one_line().startswith(f"{index}:2: field {field}: ")


def test_records_whose_lines_give_the_same_attrs_share_one_mapping(tmp_path: Path) -> None:
    """An op's call arguments repeat on each of its tensors and in every step: one mapping a distinct text, not one a record."""
    call = {"args": [{"tensor": "0"}, {"tensor": "1"}, 2], "kwargs": {"alpha": 0.5}, "parameter": "w"}
    other = {"args": [{"tensor": "0"}, 3], "kwargs": {}}
    given = [call, call, other, {}, call, other]
    with DumpWriter(tmp_path, "test") as writer:
        for order, attrs in enumerate(given):
            record = TensorRecord(key=RecordKey(f"op{order}"), dtype="float32", shape=(2,), order=order, attrs=attrs)
            writer.add(record, torch.ones(2))
    read = read_dump(writer.path).records
    assert [record.attrs for record in read] == given
    assert read[0].attrs is read[1].attrs is read[4].attrs and read[2].attrs is read[5].attrs
    assert read[0].attrs is not read[2].attrs and read[3].attrs is NO_ATTRS


def test_shard_offsets_and_topology_children_of_the_wrong_kind_are_format_errors(tmp_path: Path) -> None:
    with DumpWriter(tmp_path, "test") as writer:
        writer.add(_record("a", torch.ones(2), 0), torch.ones(2))
        writer.write_topology(TopologyNode(name="root", op_type="M", children=(TopologyNode("a", "L"),)))
    (writer.path / "topology.json").write_text(json.dumps({"name": "root", "type": "M", "children": ["a"]}))
    with pytest.raises(DumpFormatError, match=r"topology.json: field \$.children\[0\]: expected `object`"):
        read_dump(writer.path)
    (writer.path / "topology.json").unlink()
    shard = next(writer.path.glob("shard_*.safetensors"))
    content = shard.read_bytes()
    size = int.from_bytes(content[:8], "little")
    header = json.loads(content[8 : 8 + size])
    header["t0"]["data_offsets"] = [0]
    encoded = json.dumps(header, separators=(",", ":")).encode().ljust(size)
    shard.write_bytes(content[:8] + encoded + content[8 + size :])
    with pytest.raises(DumpFormatError, match=r"tensor 't0': field \$.data_offsets: expected `array` of length 2"):
        read_dump(writer.path)


def test_records_read_back_equal_the_records_built_by_their_constructors_field_for_field(tmp_path: Path) -> None:
    """The reader builds records through their slots: every field must come back as the constructor would set it."""
    stats = TensorStats(min=float("-inf"), max=2.5, mean=float("nan"), l2norm=3.0, nan_count=1, inf_count=2)
    written = [
        TensorRecord(
            key=RecordKey("model.layers.0.mlp", io="input", position="1.0", step=3, call_index=1, moment="before"),
            dtype="bfloat16",
            shape=(2, 3),
            order=1,
            device="npu:0",
            rank=2,
            op_type="Linear",
            parent="model.layers.0",
            stats=stats,
            attrs={"args": [1, {"a": "b"}]},
        ),
        TensorRecord(key=RecordKey("model.norm"), dtype="float32", shape=(4,), order=0),  # written out of order
        TensorRecord(key=RecordKey("model.lm_head"), dtype="int8", shape=(0,), order=2, stats=stats),  # no data
    ]
    tensors = [torch.ones(2, 3, dtype=torch.bfloat16), torch.arange(4, dtype=torch.float32), None]
    with DumpWriter(tmp_path, "test") as writer:
        for record, tensor in zip(written, tensors):
            writer.add(record, tensor)
    read = read_dump(writer.path).records
    assert [record.order for record in read] == [0, 1, 2]
    by_order = {record.order: record for record in written}
    (shard,) = writer.path.glob("shard_*.safetensors")
    for record in read:
        expected = by_order[record.order]
        data = record.data
        if data is not None:  # where the writer put the bytes; checked by the reader against the header
            assert (data.path, data.dtype, data.shape, data.loader) == (shard, expected.dtype, expected.shape, None)
            assert torch.equal(data.load(), tensors[written.index(expected)])
        tensor_name = (
            f"{shard.name}:t{written.index(expected)}" if data is not None else f"index.jsonl:{record.key.name}"
        )
        rebuilt = TensorRecord(
            key=RecordKey(**{field: getattr(expected.key, field) for field in RecordKey.__slots__}),
            dtype=expected.dtype,
            shape=expected.shape,
            order=expected.order,
            device=expected.device,
            rank=expected.rank,
            op_type=expected.op_type,
            parent=expected.parent,
            stats=expected.stats,
            data=data,
            source_path=f"{writer.path.name}/{tensor_name}",
            attrs=expected.attrs,
        )
        assert repr(record) == repr(rebuilt)  # NaN statistics compare unequal; their text does not
        assert hash(record.key) == hash(rebuilt.key) and record.key == rebuilt.key
        assert record.shape is (data.shape if data is not None else record.shape)  # one tuple for both
        for text in (
            record.key.name,
            record.key.io,
            record.key.position,
            record.key.moment,
            record.dtype,
            record.device,
        ):
            assert text is sys.intern(text)  # 10**5 records hold one copy of each repeated text


def test_a_truncated_or_cr_ended_index_line_is_the_cut_and_the_lines_before_it_are_read(tmp_path: Path) -> None:
    with DumpWriter(tmp_path, "test") as writer:
        for order in range(3):
            writer.add(_record(f"t{order}", torch.ones(2), order), torch.ones(2))
    index = writer.path / "index.jsonl"
    first, second, third = index.read_bytes().splitlines(keepends=True)
    index.write_bytes(first + second[:-1] + b"\r" + third)  # a lone CR ends a line too
    dump = read_dump(writer.path)
    assert [record.key.name for record in dump.records] == ["t0"]
    assert f"index.jsonl ends in a partial line at byte {len(first)}" in dump.cut


def test_index_lines_in_any_order_across_many_shards_give_the_same_records(tmp_path: Path) -> None:
    with DumpWriter(tmp_path, "test", shard_bytes=8) as writer:  # a shard for every tensor or two
        for order in range(24):
            writer.add(_record(f"t{order}", torch.full((3,), float(order)), order), torch.full((3,), float(order)))
    assert len(list(writer.path.glob("shard_*.safetensors"))) >= 12
    in_order = read_dump(writer.path).records
    index = writer.path / "index.jsonl"
    lines = index.read_text().splitlines(keepends=True)
    index.write_text("".join(lines[0::3] + lines[1::3] + lines[2::3]))  # lines go back to shards read before
    shuffled = read_dump(writer.path).records
    assert shuffled == in_order
    assert [float(record.data.load()[0]) for record in shuffled] == [float(order) for order in range(24)]


@pytest.mark.parametrize("last_order", [5, 2**64 - 1])  # the second beyond a C long: sorted as Python ints
def test_records_of_one_order_keep_their_index_line_order_when_lines_come_out_of_order(
    tmp_path: Path, last_order: int
) -> None:
    with DumpWriter(tmp_path, "test") as writer:
        for order in range(4):
            writer.add(_record(f"t{order}", torch.ones(2), order), torch.ones(2))
    index = writer.path / "index.jsonl"
    lines = [json.loads(line) for line in index.read_text().splitlines()]
    for line, order in zip(lines, [last_order, 1, 0, 1]):  # t1 and t3 share an order; t0 comes last
        line["order"] = order
    index.write_text("".join(json.dumps(line) + "\n" for line in lines))
    records = read_dump(writer.path).records
    assert [(record.key.name, record.order) for record in records] == [
        ("t2", 0),
        ("t1", 1),
        ("t3", 1),
        ("t0", last_order),
    ]


def test_a_topology_link_to_nothing_is_an_error_naming_it(tmp_path: Path) -> None:
    with DumpWriter(tmp_path / "out", "test") as writer:
        writer.add(_record("a", torch.ones(2), 0), torch.ones(2))
    link = writer.path / "topology.json"
    link.symlink_to(writer.path / "gone.json")  # the topology is optional; a dangling link to one is not silence
    with pytest.raises(DumpFormatError) as error:
        read_dump(writer.path)
    assert error.value.one_line() == (
        f"{link}: is a link to {writer.path / 'gone.json'}, which does not exist (copy the file in, or remove the link)"
    )


@pytest.mark.parametrize("file_name", ["index.jsonl", "manifest.json", "topology.json"])
def test_a_dump_file_linked_from_outside_the_dump_is_refused_and_one_linked_inside_is_read(
    tmp_path: Path, file_name: str
) -> None:
    from llmcheck.core.plugins import get_plugins

    with DumpWriter(tmp_path / "out", "test") as writer:
        writer.add(_record("a", torch.ones(2), 0), torch.ones(2))
        writer.write_topology(TopologyNode(name="root", op_type="M", children=(TopologyNode("a", "L"),)))
    link = writer.path / file_name
    inside = writer.path / f"kept_{file_name}"
    link.rename(inside)
    link.symlink_to(inside)  # a link that stays inside the dump is read
    assert [record.key.name for record in get_plugins().load_tensors(writer.path).records] == ["a"]
    outside = tmp_path / f"elsewhere_{file_name}"
    inside.rename(outside)
    link.unlink()
    link.symlink_to(outside)
    with pytest.raises(PathOutsideDumpError) as error:
        get_plugins().load_tensors(writer.path)
    assert error.value.one_line() == (
        f"{link}: leads outside the dump {writer.path} to {os.path.realpath(outside)} "
        "(llmcheck reads only files inside the dump; copy the file in instead of linking to it)"
    )


def test_blank_index_lines_hold_no_record_and_hide_none(tmp_path: Path) -> None:
    with DumpWriter(tmp_path, "test") as writer:
        for order in range(3):
            writer.add(_record(f"t{order}", torch.ones(2), order), torch.ones(2))
    index = writer.path / "index.jsonl"
    first, second, third = index.read_bytes().splitlines(keepends=True)
    index.write_bytes(first + b"\n" + second + b" \t\r\n" + b"\r" + third + b"\n\n  ")  # hand edits: blank lines
    dump = read_dump(writer.path)
    assert [record.key.name for record in dump.records] == ["t0", "t1", "t2"] and dump.cut is None
    index.write_bytes(first + b"\n" + third)  # a record's line emptied: the closed manifest's count tells
    dump = read_dump(writer.path)
    assert [record.key.name for record in dump.records] == ["t0", "t2"]
    assert dump.cut == (
        "index.jsonl holds 2 of the 3 records the closed manifest counts (lines were lost after the dump "
        "was written); 2 records were flushed before the cut"
    )


def test_a_record_key_given_by_two_index_lines_is_one_error_naming_both_lines(tmp_path: Path) -> None:
    with DumpWriter(tmp_path, "test") as writer:
        for order in range(3):
            writer.add(_record(f"t{order}", torch.ones(2), order, step=1), torch.ones(2))
    index = writer.path / "index.jsonl"
    lines = index.read_text().splitlines(keepends=True)
    again = json.dumps({**json.loads(lines[1]), "order": 3, "tensor": "t0"}) + "\n"  # t1's key, other data
    index.write_text(lines[0] + "\n" + lines[1] + lines[2] + again)  # a blank line 2 counts in the numbering
    with pytest.raises(DumpFormatError) as error:
        read_dump(writer.path)
    assert error.value.one_line() == (
        f"{index}:5: record t1 step 1 output.0 repeats line 3 "
        "(each record appears once in the index; remove one of the two lines)"
    )


def test_a_closed_manifest_counting_fewer_records_than_the_index_holds_is_reported_with_both_counts(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with DumpWriter(tmp_path, "test") as writer:
        for order in range(3):
            writer.add(_record(f"t{order}", torch.ones(2), order), torch.ones(2))
    manifest_path = writer.path / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest_path.write_text(json.dumps({**manifest, "records": 1}))
    dump = read_dump(writer.path)
    assert [record.key.name for record in dump.records] == ["t0", "t1", "t2"]  # every record is still read
    assert dump.cut is None  # nothing is cut: the index holds more than the manifest says
    assert (
        f"{writer.path}: index.jsonl holds 3 records, 2 more than the 1 the closed manifest counts "
        "(lines were added after the dump was written)"
    ) in caplog.text


def test_the_runs_of_a_compare_share_their_record_keys(tmp_path: Path) -> None:
    """Loaded for one compare, two dumps naming the same tensors hold one key object for both; read alone, each its own."""
    from llmcheck.core.plugins import get_plugins

    paths = []
    for run, scale in (("golden", 1.0), ("my", 1.001)):
        with DumpWriter(tmp_path / run, "test") as writer:
            for order, name in enumerate(("model.embed", "model.layers.0", "model.norm")):
                tensor = torch.arange(8, dtype=torch.float32) * scale
                writer.add(_record(name, tensor, order), tensor)
            if run == "my":  # a record only the my-run has keeps a key of its own
                writer.add(_record("model.extra", torch.ones(2), 3), torch.ones(2))
        paths.append(writer.path)
    golden, my = get_plugins().load_runs(paths[0], None, paths[1], None)
    assert [record.key for record in golden.records] == [record.key for record in my.records[:3]]
    assert all(mine.key is theirs.key for mine, theirs in zip(my.records, golden.records))
    assert my.records[3].key.name == "model.extra"
    alone = [read_dump(path) for path in paths]
    assert alone[0].records[0].key == alone[1].records[0].key
    assert alone[0].records[0].key is not alone[1].records[0].key
