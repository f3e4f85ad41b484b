"""Compare throughput: ``llmcheck compare`` on many small records (pairs/s) and on large tensors (GB/s).

Four modes, all building their dumps once and then timing ``llmcheck compare`` in child
processes -- the code under test and, with ``--baseline-src DIR`` (a checkout of an earlier
commit, e.g. ``git worktree add /tmp/base main``), the earlier code on the same dumps in
the same run, printed side by side:

* ``--mode small`` (default): 50 000 records per side of 4-64 KB each (float32 and bfloat16,
  a 32-layer decode of ``--records / 128`` one-token steps), the shape of a ``generate()``
  dump where the cost per pair, not bytes, dominates. Prints pairs/s for the whole command
  and for the compare phase (summary.json's ``elapsed_s``: pairing, measuring, judging).
* ``--mode large``: the large-tensor dumps described next, printing GB/s.
* ``--mode stats``: two statistics-only dumps (``dump -sd``: llmcheck's own JSONL index, no
  tensor files) of ``--records`` records each, a long decode of a 50-layer stack
  (:data:`STATS_PARTS` per layer, inputs and outputs, one step per 1 000 records), written by
  streaming through :class:`~llmcheck.core.dumps.store.DumpWriter` so a 10**7-record dump costs
  the writer no memory. The my-run's statistics carry 1e-7 relative noise, and a defect in
  layer 30's ``mlp.down_proj`` on every 50th step that the later layers inherit, so the compare
  judges, attributes and reports failures. Prints pairs/s and the peak memory per pair (peak
  PSS of the compare's process tree, over the pairs): the figure issue #31 bounds (<= 400 bytes).
  ``--records 10000000 --memory-cap-gb 8`` is the issue's ten-million-pair target: a compare
  whose processes pass the cap is stopped there (SIGTERM, as a user would) and the line says
  how long it ran and the last progress line it logged, rather than the machine swapping.
* ``--mode real-stats``: what the stats mode's made-up dumps lack, from a real model: two
  op-level statistics-only dumps of the bundled SmolLM2-135M (``DumpConfig(statistics_only=True,
  mode=("module", "op"))``, a ``generate`` of ``--steps`` decode steps, 24 by default: about
  150 000 records), golden in float32 and my in bfloat16. Its statistics are a real model's (a
  bfloat16 tensor's min and max are float32 values), its op records carry their call's
  ``attrs``, the bfloat16 run has casts the golden lacks, and judging has a real precision
  difference to explain. Prints what the stats mode prints; the fixed memory is a 1-step compare.

Large mode writes two dumps of a seeded random Llama (hidden 1024, intermediate 2816, 8 layers, full module-level
capture of inputs and outputs, about 2.1 GB each at the default 3072 tokens) with llmcheck's own torch
capture -- golden, and "my" with every weight perturbed by 1e-6 relative noise -- warms the
page cache by reading both once, then runs ``llmcheck compare`` in a child process (so torch,
used only to write the dumps, is not counted) while sampling the resident memory of the child
and its worker processes every 20 ms. Prints:

* tensor GB/s: tensor bytes read from both sides / time the compare took (summary.json: pairing,
  measuring and judging, after both dumps are loaded);
* end-to-end GB/s: the same bytes / wall time of the whole command (load, pair, measure,
  write the four reports);
* CPU seconds of the compare and its workers, and the GB/s that makes on idle cores (the
  machine this was written on is shared, so wall-clock figures vary with its load);
* peak PSS: the largest sum of the proportional set size of the compare process and its
  workers (a page they share counts once), against the target
  ``2 x largest tensor + 300 MB``; the summed RSS, which counts shared pages once per process, beside it.

Where a statistics-only pair's memory goes (issue #31), traced with ``tracemalloc`` on the stats
mode's 100 000-record dumps, at the compare's peak (judging's second pass), in bytes per pair
over the command's fixed ~77 MB; before is 3c8cbe2, after is the ``memory`` branch:

=============================================  ======  =====
structure                                      before  after
=============================================  ======  =====
records as loaded (two per pair)                 1450    875
  the record, key and statistics objects          610    610
  decoded values: 8 floats, order, shape, attrs   570    250
  source path strings                             255      0
pairs                                             110    110
rows as measured, before judging                 2300    530
  the row objects                                 220    220
  a statistics row's 9 results (dict of results)  1690    200
  reason and problem strings                      275     50
judging's own structures                         2900    530
  sibling groups' sorted slopes                  2000     ~0
  feeder lookups by call, name and tensor         400      0
judged rows (fed_by labels, growths)             1100    610
  (the first pass's rows and the second's)
total at the peak                                9600   2900
=============================================  ======  =====

Report writing adds at most ~270 bytes a pair (``pairs.json``), never the peak. (The figures
above are from before the rows went into columns; the table below follows them.)

The same trace on the 200 000-record dumps, by phase (bytes a pair held when the phase ends,
and the most held while it ran, over the command's fixed ~22 MB): ed00b9e; the evening of
2026-11-28, when judging went a step at a time, statistics rows a block at a time, the index a
line at a time and ``pairs.json``'s derived sides one dump at a time; and the night, when the
rows went into columns (``core/judging/row_table.py``: the rows as measured, let go a block at
a time as they are judged, and the rows as judged, which the reports read a field at a time)
and the two dumps came to share their record keys:

=====================================  ===========  ===========  ===========
phase: held after (peak during)        ed00b9e      evening      night
=====================================  ===========  ===========  ===========
loading both dumps                      875 (1330)   875 (935)    790 (905)
pairing                                 980 (1190)   975 (1190)   890 (1105)
measuring: the rows as measured        1520 (2195)  1430 (1545)  1010 (1170)
judging: the rows as judged            1765 (2540)  1705 (1750)  1160 (1220)
writing the reports                    1765 (2040)  1705 (1800)  1160 (1255)
=====================================  ===========  ===========  ===========

In the evening the peak was writing ``pairs.json``, 1 800 bytes a pair: the records, the pairs
and the judged rows as objects (730 bytes a pair). At night the judged rows hold 270 bytes a
pair as columns and the rows as measured 120; the peak is still writing ``pairs.json``, 1 255
bytes a pair, of which the records are 790: a record is still three Python objects (the
record, its key and its statistics, 430 bytes), the next step of issue #31.

On 2026-12-06 the records went into columns too (``core/dumps/record_rows.py``: a record read
from the index is a 72-byte row with its key, dtype and shape in slots and its other fields in
its block's columns, its statistics a 48-byte row over C doubles), the kept pairs into a
``PairTable`` (20 bytes a pair instead of 88), the reasons of unmeasured pairs into a code a
pair, and the sets of every record's id went. The same trace, by this session's script, on
ff16fba and after:

=====================================  ===========  ===========
phase: held after (peak during)        ff16fba      2026-12-06
=====================================  ===========  ===========
loading both dumps                      803 (919)    514 (630)
pairing                                 905 (1117)   626 (892)
measuring: the rows as measured        1146 (1183)   710 (759)
judging: the rows as judged            1175 (1240)   815 (881)
writing the reports                    1175 (1271)   815 (896)
=====================================  ===========  ===========

The peak is now pairing's (the pairing rules' proposals as ``Pair`` objects, and the
exact-key rule's look-up of every my record by its key's fields) and writing ``report.html``,
about 900 bytes a pair; held, the records are 496 bytes a pair (two rows and their
statistics, and the key both runs share), the judged rows 270. Measured as peak PSS over the
fixed memory: 1 462 bytes a pair on ff16fba, 1 045 now, both in one run -- ten million pairs
would still take about 10.5 GB.

On 2026-12-07 the merge held the paired ids as C integers and the judged rows their feeders'
labels as one UTF-8 buffer a step: pairing 626 (820), judging 774 (840), writing the reports
774 (855); peak PSS over the fixed memory 1 049 bytes a pair before, 1 030 after, in one run.
Later, a record's statistics as columns of its own block (a ``StatsRow`` made when asked for)
and judged rows that ask their records again for them: loading 402 (518), pairing 519 (708),
measuring 588 (641), judging 646 (712), writing the reports 646 (726); peak PSS over the fixed
memory 1 029 bytes a pair before, 895 after, in one run.
Later still, pairs in order (two runs captured alike: the record lists side by side), and rows
that ask their records again for a statistics row's metric values and their feeders' labels:
loading 386 (502), pairing 392 (400), measuring 444 (503), judging 501 (559), writing the
reports 501 (546). Ten million pairs, run rather than projected: peak PSS 7 396 MB (734 bytes
a pair over the fixed memory) on b45490d, 6 254 MB (620) with the metric values made again
(5319c4b), 5 696 MB (565) with the rest (0182789).
That evening, a block's few op types and parents as a byte a row, a statistics-only record's
path made from its key, a row's dtype its class's (64-byte rows) and the weights check a batch
of rows at a time: loading 329 (445), pairing 335 (343), measuring 387 (446), judging 444
(478), writing the reports 444 (488); peak PSS over the fixed memory 613 -> 488 bytes a pair
at a million pairs, in one run; ten million pairs 4 835 MB (479 bytes a pair).
Later that night, loading without a set of the keys or a sort's key list, rows that read their
records from their pairs and make their growth from their two errors, and judging and the
reports without whole columns at once: loading 329 (391), pairing 335 (343), measuring 363
(423), judging 405 (439), writing the reports 405 (432); peak PSS over the fixed memory 487 ->
437 bytes a pair at a million pairs, in one run; ten million pairs 4 274 MB (423 bytes a pair).
At the end of that night, a statistics row's error made from its records, a row table's index
of 2 bytes a row, and positions in golden order as a range: loading 329 (391), pairing 335
(343), measuring 348 (408), judging 391 (410), writing the reports 391 (411); peak PSS over the
fixed memory 435 -> 407 bytes a pair at a million pairs, in one run; ten million pairs 3 957 MB
(391 bytes a pair). These dumps' statistics are random doubles; a real model's are not (a
bfloat16 tensor's min and max are float32 values, held in 4 bytes), and its op-level records
repeat their call's attrs, now decoded once per text: ``--mode real-stats``, side by side in one
run, peak PSS 561 -> 332 MB, 2 183 -> 707 bytes a pair over the fixed memory.

Targets on a 2-core machine (issue #17): >= 20 000 pairs/s in the small mode, >= 2.5 GB/s in
the large mode's compare phase, peak PSS <= 2 x largest tensor + 300 MB. The
best-known peer compared the same kind of dumps at about 0.12 GB/s.

    python benchmarks/compare_throughput.py [--mode small|large|stats|real-stats] [--records 50000] [--tokens 3072]
        [--steps 24] [--baseline-src /tmp/base/src] [--repeat 2] [--dir /tmp] [--jobs N] [--keep | --reuse DIR]
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

GB = 1e9
MB = 1e6


def write_dumps(root: Path, tokens: int) -> tuple[Path, Path]:
    """Write the golden and my dumps with the torch capture and return their folders."""
    import torch

    from llmcheck import DumpConfig, register_hook
    from llmcheck.bundled_model import random_llama

    torch.set_num_threads(max(1, os.cpu_count() or 1))
    model = random_llama(seed=0, hidden_size=1024, num_layers=8, vocab_size=512, num_heads=8, intermediate_size=2816)
    input_ids = torch.randint(0, 512, (1, tokens), generator=torch.Generator().manual_seed(1))
    folders = []
    for side in ("golden", "my"):
        if side == "my":
            generator = torch.Generator().manual_seed(2)
            with torch.no_grad():
                for parameter in model.parameters():
                    parameter.mul_(1 + 1e-6 * torch.randn(parameter.shape, generator=generator))
        handle = register_hook(model, DumpConfig(dump_path=str(root / side), token_range=[0], tensor_part=2))
        with torch.no_grad():
            model(input_ids)
        handle.close()
        folders.append(Path(handle.path))
    return folders[0], folders[1]


#: Record sizes of the small-records mode cycle through these (KB); the mean is about 23 KB.
SMALL_RECORD_KB = (4, 8, 16, 16, 32, 64)
#: Parts recorded per layer and decode step in the small-records mode.
SMALL_PARTS = ("input_layernorm", "self_attn", "post_attention_layernorm", "mlp")
SMALL_LAYERS = 32


def write_small_dumps(root: Path, records: int) -> tuple[Path, Path]:
    """Write two dumps of ``records`` small records each (my = golden + 1e-6 relative noise)."""
    import torch

    from llmcheck.core.dumps.store import DumpWriter
    from llmcheck.core.records import RecordKey, TensorRecord

    generator = torch.Generator().manual_seed(0)
    per_step = SMALL_LAYERS * len(SMALL_PARTS)
    folders = []
    writers = [DumpWriter(root / side, "benchmark", command_line=["compare_throughput"]) for side in ("golden", "my")]
    for order in range(records):
        step, slot = divmod(order, per_step)
        layer, part = divmod(slot, len(SMALL_PARTS))
        kb = SMALL_RECORD_KB[order % len(SMALL_RECORD_KB)]
        bf16 = order % 4 == 3
        values = torch.randn(kb * 1024 // (2 if bf16 else 4), generator=generator)
        noisy = values * (1 + 1e-6 * torch.randn(values.shape, generator=generator))
        for writer, tensor in zip(writers, (values, noisy)):
            tensor = tensor.to(torch.bfloat16) if bf16 else tensor
            record = TensorRecord(
                key=RecordKey(name=f"model.layers.{layer}.{SMALL_PARTS[part]}", step=step),
                dtype="bfloat16" if bf16 else "float32",
                shape=(1, 1, tensor.numel()),
                order=order,
                op_type="Module",
                parent=f"model.layers.{layer}",
            )
            writer.add(record, tensor.reshape(1, 1, -1))
            if slot == per_step - 1:
                writer.flush()  # one shard per decode step, as a capture writes
    for writer in writers:
        writer.close()
        folders.append(writer.path)
    return folders[0], folders[1]


#: The records of one layer in one step of the statistics mode: a module or op (its name after the
#: layer's, an op after ``/``), its type and which of its tensors.
STATS_PARTS = (
    (".input_layernorm", "LlamaRMSNorm", "input"),
    (".input_layernorm", "LlamaRMSNorm", "output"),
    (".self_attn.q_proj", "Linear", "output"),
    (".self_attn.k_proj", "Linear", "output"),
    (".self_attn.v_proj", "Linear", "output"),
    (".self_attn/aten.scaled_dot_product_attention.default", "aten.scaled_dot_product_attention.default", "output"),
    (".self_attn.o_proj", "Linear", "input"),
    (".self_attn.o_proj", "Linear", "output"),
    (".self_attn", "LlamaAttention", "output"),
    (".post_attention_layernorm", "LlamaRMSNorm", "input"),
    (".post_attention_layernorm", "LlamaRMSNorm", "output"),
    (".mlp.gate_proj", "Linear", "output"),
    (".mlp.up_proj", "Linear", "output"),
    (".mlp.act_fn", "SiLU", "output"),
    (".mlp/aten.mul.Tensor", "aten.mul.Tensor", "output"),
    (".mlp.down_proj", "Linear", "input"),
    (".mlp.down_proj", "Linear", "output"),
    (".mlp", "LlamaMLP", "output"),
    ("", "LlamaDecoderLayer", "input"),
    ("", "LlamaDecoderLayer", "output"),
)
STATS_LAYERS = 50
#: The statistics mode's defect: the output of this layer's part, 20 % off on every STATS_DEFECT_EVERY-th
#: step, and every record of the later layers of that step with it.
STATS_DEFECT = (30, ".mlp.down_proj")
STATS_DEFECT_EVERY = 50


def write_stats_dumps(root: Path, records: int) -> tuple[Path, Path]:
    """Write two statistics-only dumps of ``records`` records each, streamed through the store's writer."""
    import numpy as np

    from llmcheck.core.dumps.store import DumpWriter
    from llmcheck.core.records import (
        IO_OUTPUT,
        RecordKey,
        TensorRecord,
        TensorStats,
        module_parent,
        op_record_module,
    )

    random = np.random.default_rng(0)
    per_step = STATS_LAYERS * len(STATS_PARTS)
    writers = [DumpWriter(root / side, "benchmark", command_line=["compare_throughput"]) for side in ("golden", "my")]
    chunk = 65_536  # statistics drawn a chunk of records at a time, the records written one at a time
    for start in range(0, records, chunk):
        count = min(chunk, records - start)
        scale = random.uniform(0.5, 4.0, count).tolist()
        mean = random.normal(0.0, 0.05, count).tolist()
        noise = (1 + 1e-7 * random.standard_normal((count, 4))).tolist()
        for offset in range(count):
            order = start + offset
            step, slot = divmod(order, per_step)
            layer, part_index = divmod(slot, len(STATS_PARTS))
            suffix, op_type, io = STATS_PARTS[part_index]
            name = f"model.layers.{layer}{suffix}"
            parent = op_record_module(name) or module_parent(name)
            golden = (-4 * scale[offset], 4 * scale[offset], mean[offset], 64 * scale[offset])
            defect = step % STATS_DEFECT_EVERY == 0 and (
                layer > STATS_DEFECT[0] or (layer, suffix, io) == (*STATS_DEFECT, IO_OUTPUT)
            )
            factor = 1.2 if defect else 1.0
            my = tuple(value * wobble * factor for value, wobble in zip(golden, noise[offset]))
            key = RecordKey(name=name, io=io, step=step)
            for writer, values in zip(writers, (golden, my)):
                record = TensorRecord(
                    key=key,
                    dtype="bfloat16",
                    shape=(1, 1, 4096),
                    order=order,
                    op_type=op_type,
                    parent=parent,
                    stats=TensorStats(values[0], values[1], values[2], values[3], 0, 0),
                )
                writer.add(record)  # flushed every MAX_RECORDS_PER_BATCH records: nothing more is held
    folders = []
    for writer in writers:
        writer.close()
        folders.append(writer.path)
    return folders[0], folders[1]


def tree_bytes(folder: Path) -> int:
    """Return the size of every file under ``folder``."""
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())


def warm_page_cache(folder: Path) -> None:
    """Read every file once so the timed run reads from memory, not disk."""
    buffer = bytearray(16 << 20)
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            with open(path, "rb", buffering=0) as handle:
                while handle.readinto(buffer):
                    pass


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as handle:
            return [int(child) for child in handle.read().split()]
    except OSError:
        return []


def _memory_bytes(pid: int) -> tuple[int, int]:
    """Return a process's resident and proportional set sizes (RSS, PSS) in bytes, zeros once it has ended.

    PSS counts a page shared by n processes as 1/n in each: the workers share the libraries
    and the page cache's mapped dump files with the compare, which a sum of RSS would count twice.
    """
    sizes = {"Rss:": 0, "Pss:": 0}
    try:
        with open(f"/proc/{pid}/smaps_rollup") as handle:
            for line in handle:
                field = line.split(maxsplit=1)[0]
                if field in sizes:
                    sizes[field] = int(line.split()[1]) * 1024
    except OSError:
        pass
    return sizes["Rss:"], sizes["Pss:"]


class TreeMemorySampler(threading.Thread):
    """Samples the memory of a process and all its descendants; keeps the peaks of the summed RSS and PSS.

    ``peak_bytes`` is the peak summed PSS -- the memory the tree really holds -- and
    ``peak_rss`` the peak summed RSS, which counts a page shared by several processes once in each.
    """

    def __init__(self, pid: int, interval_s: float = 0.02, cap_bytes: int | None = None) -> None:
        super().__init__(daemon=True)
        self.pid, self.interval_s, self.cap_bytes = pid, interval_s, cap_bytes
        self.peak_bytes = self.peak_rss = 0
        self.peak_processes = 0
        self.capped_after_s: float | None = None  # when the tree passed cap_bytes and was stopped
        self._began = time.perf_counter()
        self._stopped = threading.Event()

    def run(self) -> None:
        while not self._stopped.is_set():
            pids, frontier = [], [self.pid]
            while frontier:
                pid = frontier.pop()
                pids.append(pid)
                frontier.extend(_children(pid))
            sizes = [_memory_bytes(pid) for pid in pids]
            rss, pss = sum(size[0] for size in sizes), sum(size[1] for size in sizes)
            self.peak_rss = max(self.peak_rss, rss)
            if pss > self.peak_bytes:
                self.peak_bytes, self.peak_processes = pss, len(pids)
            if self.cap_bytes is not None and pss > self.cap_bytes and self.capped_after_s is None:
                # stopped as a user would stop it: the compare shuts its workers down on SIGTERM
                self.capped_after_s = time.perf_counter() - self._began
                os.kill(self.pid, signal.SIGTERM)
            self._stopped.wait(self.interval_s)

    def stop(self) -> None:
        self._stopped.set()
        self.join()


def largest_tensor_bytes(dump: Path) -> int:
    """Return the size of the largest tensor in a dump (from its index)."""
    from llmcheck.core.dumps.store import read_dump

    return max(record.nbytes for record in read_dump(dump).records)


def plugins_missing_from(src: Path) -> list[str]:
    """Return the llmcheck plugins this environment registers whose package the checkout under ``src`` lacks."""
    from importlib.metadata import entry_points

    missing = []
    for entry in entry_points(group="llmcheck"):
        module = Path(src, *entry.value.split(":")[0].split("."))
        if not module.is_dir() and not module.with_suffix(".py").is_file():
            missing.append(entry.name)
    return missing


def run_compare(
    golden: Path, my: Path, output: Path, jobs: int | None, src: Path, cap_bytes: int | None = None
) -> Timing:
    """Run ``llmcheck compare`` of the code under ``src`` in a child process and return how it went.

    A compare whose processes pass ``cap_bytes`` (summed PSS) is stopped there: its timing has
    no summary, and says when it was stopped and the last progress line it had logged.
    """
    shutil.rmtree(output, ignore_errors=True)
    environment = {**os.environ, "PYTHONPATH": str(src)}
    missing = plugins_missing_from(src)
    if missing:  # an earlier checkout predates a plugin this environment registers
        environment["LLMCHECK_DISABLE_PLUGINS"] = ",".join(missing)
    command = [
        sys.executable,
        "-m",
        "llmcheck.core.cli",
        "compare",
        "-gp",
        str(golden),
        "-mp",
        str(my),
        "-o",
        str(output),
    ]
    if jobs:
        command += ["-j", str(jobs)]
    cpu_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=environment)
    sampler = TreeMemorySampler(child.pid, cap_bytes=cap_bytes)
    sampler.start()
    out, _ = child.communicate()
    wall_s = time.perf_counter() - started
    sampler.stop()
    cpu_after = resource.getrusage(resource.RUSAGE_CHILDREN)  # the compare and the workers it joined
    cpu_s = (cpu_after.ru_utime + cpu_after.ru_stime) - (cpu_before.ru_utime + cpu_before.ru_stime)
    capped = sampler.capped_after_s is not None
    if not capped and child.returncode not in (0, 3):  # 3: the compare finished and found failing pairs
        raise SystemExit(f"compare failed ({child.returncode}):\n{out}")
    said = [line for line in out.splitlines() if line.startswith("llmcheck: INFO")]
    summary = None if capped else json.loads((output / "summary.json").read_text())
    shutil.rmtree(output, ignore_errors=True)  # ten million pairs' reports are 23 GB: gone before the next run
    return Timing(
        wall_s,
        cpu_s,
        sampler.peak_bytes,
        sampler.peak_rss,
        sampler.peak_processes,
        os.getloadavg()[0],
        summary,
        sampler.capped_after_s,
        (said[-1] if said else "(no progress line yet)") if capped else "",
    )


@dataclass
class Timing:
    """One timed compare: wall and CPU seconds of the whole command, its summary.json and peak memory."""

    wall_s: float
    cpu_s: float
    peak_pss: int
    peak_rss: int
    processes: int
    load: float
    summary: dict | None  # None: stopped at the memory cap
    capped_after_s: float | None = None
    last_said: str = ""


def time_compares(
    golden: Path,
    my: Path,
    root: Path,
    jobs: int | None,
    versions: dict[str, Path],
    repeat: int,
    cap_bytes: int | None = None,
) -> dict[str, Timing]:
    """Return the fastest of ``repeat`` runs of each version's compare, the versions taking turns.

    Taking turns spreads the load of a shared machine evenly over the versions.
    """
    best: dict[str, Timing] = {}
    for _ in range(repeat):
        for label, src in versions.items():
            timing = run_compare(golden, my, root / f"report_{label}", jobs, src, cap_bytes)
            if label not in best or timing.wall_s < best[label].wall_s:
                best[label] = timing
    return best


def report_small(label: str, timing: Timing) -> None:
    """Print pairs/s of a small-records compare."""
    pairs = timing.summary["counts"]["pairs"]
    compare_s = timing.summary["elapsed_s"]
    print(
        f"{label:9s} whole command {pairs / timing.wall_s:8.0f} pairs/s ({timing.wall_s:6.2f} s wall, "
        f"{timing.cpu_s:6.2f} s CPU, {pairs / timing.cpu_s:7.0f} pairs per CPU-second) | compare phase "
        f"{pairs / compare_s:8.0f} pairs/s ({compare_s:.2f} s) | peak PSS {timing.peak_pss / MB:5.0f} MB "
        f"(RSS {timing.peak_rss / MB:5.0f} MB) "
        f"| load {timing.load:.1f}"
    )


def report_large(label: str, timing: Timing, largest: int) -> None:
    """Print GB/s of a large-tensor compare."""
    summary = timing.summary
    tensor_gb = summary["tensor_bytes_read"] / GB
    cores = len(os.sched_getaffinity(0))
    print(
        f"{label:9s} compare phase {summary['throughput_gb_per_s']:5.2f} GB/s ({summary['elapsed_s']:.2f} s) | "
        f"whole command {tensor_gb / timing.wall_s:5.2f} GB/s ({timing.wall_s:.2f} s wall, {timing.cpu_s:.2f} s CPU "
        f"= {cores * tensor_gb / timing.cpu_s:.2f} GB/s on {cores} idle cores) | peak PSS "
        f"{timing.peak_pss / MB:.0f} MB over {timing.processes} processes (RSS {timing.peak_rss / MB:.0f} MB) "
        f"(target <= {(2 * largest + 300 * MB) / MB:.0f} MB) | load {timing.load:.1f}"
    )


#: What the four reports of a statistics-only pair take on disk, measured at ten million pairs (23.7 GB).
REPORT_BYTES_PER_PAIR = 2400
#: Records per side of the statistics mode's tiny compare, whose peak is the command's fixed memory
#: (interpreter, imports, plugins), told apart from what each pair costs.
STATS_TINY_RECORDS = 1_000


def report_stopped(label: str, timing: Timing) -> None:
    """Print where a compare stopped at the memory cap was: how long it ran, and the last progress line it logged."""
    print(
        f"{label:9s} stopped at the memory cap (peak PSS {timing.peak_pss / MB:.0f} MB) after "
        f"{timing.capped_after_s:.0f} s ({timing.cpu_s:.0f} s CPU); the last it said: {timing.last_said!r}"
    )


def report_stats(label: str, timing: Timing, fixed: Timing | None) -> None:
    """Print pairs/s and the peak memory per pair of a statistics-only compare."""
    pairs = timing.summary["counts"]["pairs"]
    compare_s = timing.summary["elapsed_s"]
    marginal = ""
    if fixed is not None:
        per_pair = (timing.peak_pss - fixed.peak_pss) / pairs
        marginal = f" = {fixed.peak_pss / MB:.0f} MB fixed + {per_pair:6.0f} bytes/pair"
    print(
        f"{label:9s} whole command {pairs / timing.wall_s:7.0f} pairs/s ({timing.wall_s:6.1f} s wall, "
        f"{timing.cpu_s:6.1f} s CPU) | compare phase {pairs / compare_s:7.0f} pairs/s ({compare_s:.1f} s) | "
        f"peak PSS {timing.peak_pss / MB:6.0f} MB (RSS {timing.peak_rss / MB:6.0f} MB) = "
        f"{timing.peak_pss / pairs:6.0f} bytes/pair{marginal} | load {timing.load:.1f}"
    )


def write_real_stats_dumps(root: Path, steps: int) -> tuple[Path, Path]:
    """Write op-level statistics-only dumps of SmolLM2-135M over ``steps`` decode steps: golden float32, my bfloat16."""
    import torch

    from llmcheck import DumpConfig, register_hook
    from llmcheck.bundled_model import load_smollm2

    torch.set_num_threads(max(1, os.cpu_count() or 1))
    folders = []
    for side, dtype in (("golden", torch.float32), ("my", torch.bfloat16)):
        model, tokenizer = load_smollm2(dtype=dtype)
        input_ids = tokenizer("The quick brown fox jumps over the lazy dog because", return_tensors="pt").input_ids
        config = DumpConfig(
            dump_path=str(root / side), token_range=range(steps), statistics_only=True, mode=("module", "op")
        )
        with register_hook(model, config) as handle, torch.no_grad():  # closed, its index written, even on an error
            model.generate(input_ids, max_new_tokens=steps, do_sample=False)
        folders.append(Path(handle.path))
    return folders[0], folders[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--mode",
        choices=("small", "large", "stats", "real-stats"),
        default="small",
        help="small: many 4-64 KB records (pairs/s); large: module-level Llama dumps (GB/s); "
        "stats: statistics-only dumps (pairs/s, memory per pair); real-stats: the same of SmolLM2's op-level dumps",
    )
    parser.add_argument(
        "--steps", type=int, default=24, help="real-stats mode: decode steps dumped (24: ~150 000 pairs)"
    )
    parser.add_argument(
        "--records", type=int, default=None, help="records per dump in the small (default 50 000) and stats modes"
    )
    parser.add_argument("--tokens", type=int, default=3072, help="large mode: sequence length (3072: ~2.1 GB/dump)")
    parser.add_argument(
        "--baseline-src",
        type=Path,
        default=None,
        help="the src folder of an earlier checkout, timed on the same dumps for comparison",
    )
    parser.add_argument("--repeat", type=int, default=2, help="runs per code version; the fastest is reported")
    parser.add_argument("--dir", default=None, help="where the dumps are written (default: a temporary folder)")
    parser.add_argument("--jobs", type=int, default=None, help="worker processes (default: CPU count)")
    parser.add_argument(
        "--memory-cap-gb",
        type=float,
        default=None,
        help="stop a compare whose processes hold more than this (summed PSS) and say where it was: "
        "--mode stats --records 10000000 --memory-cap-gb 8 is issue #31's ten-million-pair target",
    )
    parser.add_argument("--keep", action="store_true", help="keep the dumps afterwards (rerun with --reuse)")
    parser.add_argument("--reuse", default=None, help="a folder kept by --keep: compare its dumps again")
    args = parser.parse_args()
    current_src = Path(__file__).resolve().parent.parent / "src"
    if args.reuse and not Path(args.reuse).is_dir():
        parser.error(f"--reuse {args.reuse}: no such folder (one kept by --keep)")
    if args.dir:
        Path(args.dir).mkdir(parents=True, exist_ok=True)  # a folder not there yet: made, as --keep's output
    root = Path(args.reuse) if args.reuse else Path(tempfile.mkdtemp(prefix="llmcheck_compare_bench_", dir=args.dir))
    try:
        started = time.perf_counter()
        if args.reuse:
            golden, my = (next((root / side).glob("llmcheck_dump_*")) for side in ("golden", "my"))
        elif args.mode == "small":
            golden, my = write_small_dumps(root, args.records or 50_000)
        elif args.mode == "stats":
            golden, my = write_stats_dumps(root, args.records or 1_020_000)
        elif args.mode == "real-stats":
            golden, my = write_real_stats_dumps(root, args.steps)
        else:
            golden, my = write_dumps(root, args.tokens)
        print(
            f"{'reused' if args.reuse else 'wrote'} two dumps in {time.perf_counter() - started:.1f} s: "
            f"golden {tree_bytes(golden) / GB:.2f} GB, "
            f"my {tree_bytes(my) / GB:.2f} GB ({golden.parent.parent})"
        )
        warm_page_cache(golden)
        warm_page_cache(my)
        # a statistics dump has no tensor to measure, and reading a 10**7-record one here would cost gigabytes
        statistics_only = args.mode in ("stats", "real-stats")
        largest = 0 if statistics_only else max(largest_tensor_bytes(golden), largest_tensor_bytes(my))
        versions = {"current": current_src, **({"baseline": args.baseline_src} if args.baseline_src else {})}
        for src in versions.values():  # as an installed package has: no version compiles its modules while timed
            compileall.compile_dir(src, quiet=1)
        fixed: dict[str, Timing] = {}
        if statistics_only:
            tiny = root / "tiny"
            if not tiny.exists() and args.mode == "stats":
                write_stats_dumps(tiny, STATS_TINY_RECORDS)
            elif not tiny.exists():
                write_real_stats_dumps(tiny, 1)
            tiny_golden, tiny_my = (next((tiny / side).glob("llmcheck_dump_*")) for side in ("golden", "my"))
            fixed = time_compares(tiny_golden, tiny_my, tiny, args.jobs, versions, 1)
        cap = int(args.memory_cap_gb * GB) if args.memory_cap_gb else None
        if statistics_only:
            records = json.loads((golden / "manifest.json").read_text())["records"]
            needed = records * REPORT_BYTES_PER_PAIR
            free = shutil.disk_usage(root).free
            if free < needed:
                raise SystemExit(
                    f"{root}: {free / GB:.1f} GB free, and the reports of {records} pairs take about "
                    f"{needed / GB:.1f} GB (cmp_report.csv, report.html, pairs.json): free some space first"
                )
        timings = time_compares(golden, my, root, args.jobs, versions, args.repeat, cap)
        summary = next((timing.summary for timing in timings.values() if timing.summary is not None), None)
        if summary is not None:
            print(
                f"pairs: {summary['counts']['pairs']}, tensor bytes read (both sides): "
                f"{summary['tensor_bytes_read'] / GB:.2f} GB, largest tensor {largest / MB:.2f} MB, "
                f"CPUs {len(os.sched_getaffinity(0))}, best of {args.repeat} runs each"
            )
        for label, timing in reversed(list(timings.items())):
            if timing.summary is None:
                report_stopped(label, timing)
            elif args.mode == "small":
                report_small(label, timing)
            elif statistics_only:
                report_stats(label, timing, fixed.get(label))
            else:
                report_large(label, timing, largest)
    finally:
        for label in ("current", "baseline"):
            shutil.rmtree(root / f"report_{label}", ignore_errors=True)
        if args.keep or args.reuse:
            print(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
