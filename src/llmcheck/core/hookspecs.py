"""The hook specifications: the whole contract between llmcheck's core and its plugins.

This file is the reference manual for plugin authors: ``docs/hooks.md`` is generated from
it (``python docs/gen_hook_reference.py``; a test fails when the page is stale). Four
families make the product:

* **capture** -- a dump backend (``llmcheck dump --backend NAME``);
* **load tensors** -- recognise a path as a kind of dump and give its records;
* **map pairs** -- propose golden <-> my pairs, each with the rule that made it;
* **metric** -- named measures of a pair, with direction and thresholds per dtype.

one export resolver, :func:`llmcheck_export_onnx`, that turns a source's topology file
into a viewable ONNX graph, the operator references ``llmcheck opcheck`` recomputes
single ops with, and a compare replays an op with before naming it
(:func:`llmcheck_register_op_references`, :func:`llmcheck_resolve_op_reference`),
a capture backend's own ``dump`` flags (:func:`llmcheck_register_backend_options`), the
files a compare writes (:func:`llmcheck_register_reporters`), and the command a compare
suggests to record a golden run's noise twin (:func:`llmcheck_noise_twin_command`).

A plugin implements a hook by defining a function of the same name decorated with
``hookimpl`` (from ``llmcheck.plugin_api``); it may accept any subset of the arguments.
Registries take a ``register`` callback, so the core can de-duplicate and name both
plugins in a clash.

**Which implementation answers first.** pluggy calls the implementations of a hook last
registered first (LIFO). Installed plugins are registered in the order their entry points
are found, which no plugin can rely on; plugins added by the test kit come last, so they
are called first. For a ``firstresult`` hook (the resolvers: which loader claims a path,
which plugin computes an op type, which exporter converts a file) the first non-``None``
answer wins and the others are not called: a plugin that must answer before the built-ins
marks its implementation ``@hookimpl(tryfirst=True)``, one that should only answer when
nothing else does ``@hookimpl(trylast=True)``. Every other hook calls every implementation.

**Pairs hold the loaded records.** The core matches pair proposals to records by identity
(``id()``), so a pair must hold the very record objects of the dumps
:func:`llmcheck_map_pairs` was given. A plugin that returns an equal copy would leave the
record both paired and unmatched; the core refuses it with a ``PluginError`` naming the
rule. A record the plugin built itself (shards gathered into one tensor) is allowed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import pluggy

from llmcheck.core.capture.backend_options import BackendOption
from llmcheck.core.records import (
    CaptureBackend,
    Dump,
    MetricSpec,
    OpReference,
    Pair,
    SourceInfo,
    UserMapping,
)
from llmcheck.core.reporting.reporters import Reporter

PROJECT_NAME = "llmcheck"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


# --- capture ---------------------------------------------------------------------------


@hookspec
def llmcheck_register_capture_backends(register: Callable[[CaptureBackend], None]) -> None:
    """Register the dump backends this plugin provides.

    Called once, the first time a command needs the list of backends (``llmcheck dump``,
    ``llmcheck plugins``). Call ``register(backend)`` for each backend; ``backend.name``
    is what the user passes to ``--backend``. Two plugins registering the same name is a
    :class:`~llmcheck.core.errors.PluginError` naming both.

    A backend is any object with ``name``, ``description`` and ``run(request) -> int``
    (:class:`~llmcheck.core.records.CaptureBackend`): ``llmcheck dump --backend NAME`` builds
    a :class:`~llmcheck.core.records.CaptureRequest` (the command as an argv list, the output
    folder, the seed flags parsed into ``options``) and returns ``run``'s exit code. Run the
    user's program with ``plugin_api.run_program``: a program that cannot start is then the
    same usage error for every backend, and a Ctrl-C is the program's to handle (its
    :class:`~llmcheck.core.capture.dump_command.ProgramRun` says whether the run was interrupted).

    Example::

        import os

        from llmcheck.plugin_api import CaptureRequest, hookimpl, run_program


        class PlainRunBackend:
            name = "plain"
            description = "run the command with no capture (a skeleton to start from)"

            def run(self, request: CaptureRequest) -> int:
                return run_program(request.command, os.environ).exit_code


        @hookimpl
        def llmcheck_register_capture_backends(register):
            register(PlainRunBackend())
    """


@hookspec
def llmcheck_register_backend_options(register: Callable[[BackendOption], None]) -> None:
    """Declare the ``llmcheck dump`` flags of a capture backend.

    Called once, when ``llmcheck dump`` builds its command line (``--help`` included). Call
    ``register(BackendOption(backend, name, help, ...))`` per flag: ``backend`` is the
    ``--backend`` name it belongs to (usually one this plugin registers), ``name`` the key
    the parsed value arrives under in ``CaptureRequest.options``. Only the chosen backend's
    options are flags of a run; ``llmcheck dump --backend NAME --help`` lists them. Two
    plugins declaring the same spelling for one backend is a
    :class:`~llmcheck.core.errors.PluginError` naming both.

    Example::

        from llmcheck import BackendOption, hookimpl


        @hookimpl
        def llmcheck_register_backend_options(register):
            register(BackendOption(backend="plain", name="repeat", help="Run the program this many times.",
                                   type=int, default=1, aliases=("-r",)))
    """


# --- load tensors ----------------------------------------------------------------------


@hookspec
def llmcheck_register_sources(register: Callable[[SourceInfo], None]) -> None:
    """Register the names of the dump kinds this plugin can read.

    Called when the core validates ``--golden-source`` / ``--my-source`` or lists plugins.
    Call ``register(SourceInfo(name, description))`` per kind; the name is the one the
    plugin's :func:`llmcheck_load_tensors` answers to.

    Example::

        from llmcheck.plugin_api import SourceInfo, hookimpl


        @hookimpl
        def llmcheck_register_sources(register):
            register(SourceInfo("npyfolder", "a folder of .npy files, one tensor each"))
    """


@hookspec(firstresult=True)
def llmcheck_load_tensors(path: Path, source: str | None) -> Dump | None:
    """Recognise ``path`` as a dump of this plugin's kind and return its records.

    Called for each side of a compare (and by opcheck). ``path`` is what the user gave:
    a dump root, a folder above it, or one file inside. ``source`` is the name the user
    forced with ``--golden-source`` / ``--my-source``, or ``None`` for auto-detection.

    Return ``None`` when the path is not of this kind (or ``source`` names another kind):
    the next plugin is asked. Return a :class:`~llmcheck.core.records.Dump` whose records
    are in execution order and whose data handles are lazy. Raise a
    :class:`~llmcheck.core.errors.LlmcheckError` when the path *is* of this kind but
    broken or ambiguous (several runs inside): that message reaches the user.
    ``firstresult``: the first non-``None`` answer wins.

    Example::

        import math

        from llmcheck.plugin_api import Dump, RecordKey, TensorData, TensorRecord, hookimpl, inside_dump, read_npy_header


        @hookimpl
        def llmcheck_load_tensors(path, source):
            if source not in (None, "npyfolder") or not path.is_dir() or not any(path.glob("*.npy")):
                return None  # not this plugin's kind: the next plugin is asked
            records = []
            for order, file in enumerate(sorted(path.glob("*.npy"))):
                header = read_npy_header(inside_dump(file, path))  # a broken header is a DumpFormatError
                dtype, shape = header.dtype.name, tuple(header.shape)
                data = TensorData(dtype, shape, path=file, offset=header.data_offset,
                                  nbytes=header.dtype.itemsize * math.prod(shape))
                records.append(TensorRecord(key=RecordKey(name=file.stem), dtype=dtype, shape=shape, order=order,
                                            data=data, source_path=str(file)))
            return Dump(source="npyfolder", root=path, records=records)
    """


# --- map pairs -------------------------------------------------------------------------


@hookspec
def llmcheck_map_pairs(golden: Dump, my: Dump, user_mapping: UserMapping | None) -> Sequence[Pair] | None:
    """Propose pairs of golden and my records.

    Called once per compare with both loaded dumps and the user's ``--mapping`` file (or
    ``None``). Return a list of :class:`~llmcheck.core.records.Pair`, each naming the rule
    that made it and a priority, or ``None`` when this plugin has nothing to say about
    these two sources. Pairs that are two record lists side by side (``golden.records[i]``
    with ``my.records[i]``) may be returned as ``pairs_in_order(golden.records,
    my.records, rule, priority)``: a sequence of pairs holding the lists themselves, which
    costs a compare 1 byte a pair instead of a ``Pair`` object each. The core merges every plugin's proposals: each record keeps the
    highest-priority pair it appears in; records left in no pair are reported unmatched.
    A pair with one side ``None`` and a ``note`` explains why a record has no counterpart.

    Priorities are the levels of :class:`~llmcheck.core.records.PairPriority` (user mapping
    100, source-specific rules 50, exact key 20, sequence 0). ``user_mapping.entries``
    holds the ``--mapping`` file's (golden pattern, my pattern) entries,
    ``user_mapping.key_pairs`` the exact key pairs of an edited ``pairs.json`` fed back with
    ``--mapping`` (the built-in ``native`` plugin turns both into ``user_mapping`` pairs),
    and ``user_mapping.rules`` the file's ``{"golden": pattern, "rule": text}`` entries as
    (pattern, rule) tuples: a plugin reads the rules it owns (``tensor_parallel`` reads
    ``tp_*``), declares their names with :func:`llmcheck_register_mapping_rules`, and
    ignores the others.

    Records of a multi-rank run read as one run carry their rank in ``key.rank``; a record
    a plugin gathers from every rank's shard has ``key.rank == ALL_RANKS`` (-1). A record
    whose source kept a checksum instead of the data sets ``digest``; the core judges a
    pair of such records exact or not. Each pair must hold the loaded record objects, not
    copies (see "Pairs hold the loaded records" above).

    Example::

        from llmcheck.plugin_api import Pair, PairPriority, hookimpl


        @hookimpl
        def llmcheck_map_pairs(golden, my, user_mapping):
            if golden.source != "npyfolder" or my.source != "npyfolder":
                return None
            mine = {record.key.name.lower(): record for record in my.records}
            # the loaded records themselves, never copies: the core matches pairs to records by identity
            return [Pair(record, mine[record.key.name.lower()], "npyfolder: same name, any case", PairPriority.SOURCE_RULE)
                    for record in golden.records if record.key.name.lower() in mine]
    """


@hookspec
def llmcheck_register_mapping_rules(register: Callable[[str], None]) -> None:
    """Declare the rules this plugin reads from a ``--mapping`` file's rule entries.

    Called when a ``--mapping`` file holding ``{"golden": pattern, "rule": text}`` entries is
    read, before anything is loaded. Call ``register(name)`` once per rule name: the text of
    an entry's rule before its first ``(`` (``tp_unshard`` for ``tp_unshard(dim=-1, ranks=0..3)``).
    A rule entry whose name no plugin registers is a usage error naming the entry and the
    known rules: a typo would otherwise pair nothing without a word. Two plugins registering
    one name is an error naming both. The entries themselves reach the plugin in
    :func:`llmcheck_map_pairs` (``user_mapping.rules``).

    Example::

        from llmcheck.plugin_api import hookimpl


        @hookimpl
        def llmcheck_register_mapping_rules(register):
            register("npy_transposed")  # {"golden": "*.attn.qk", "rule": "npy_transposed(1, 0)"}
    """


# --- metric ----------------------------------------------------------------------------


@hookspec
def llmcheck_register_metrics(register: Callable[[MetricSpec], None]) -> None:
    """Register named metrics, each with its direction and default thresholds per dtype class.

    Called once, the first time a compare needs the metric table. Call
    ``register(MetricSpec(...))`` per metric. Two plugins registering the same name is a
    :class:`~llmcheck.core.errors.PluginError` naming both.

    ``make_accumulator()`` returns a :class:`~llmcheck.core.records.MetricAccumulator`
    that streams float64 chunks of both tensors; one that also defines
    ``update_chunk(chunk)`` reads the values several metrics share from a ``PairChunk``
    (difference, absolute difference, dot products) instead. Thresholds are ``(warn, fail)``
    per dtype class (the table of dtype classes is below) with ``"default"`` as fallback.

    Example::

        import numpy as np

        from llmcheck.plugin_api import MetricSpec, hookimpl


        class MaxAbsDiff:
            def __init__(self):
                self.worst = 0.0

            def update(self, golden, my):
                self.worst = max(self.worst, float(np.max(np.abs(my - golden), initial=0.0)))

            def result(self):
                return self.worst


        @hookimpl
        def llmcheck_register_metrics(register):
            register(MetricSpec("max_abs_diff", "largest absolute difference", higher_is_better=False,
                                make_accumulator=MaxAbsDiff,
                                thresholds={"fp32": (1e-5, 1e-3), "bf16": (1e-2, 1e-1), "default": (1e-3, 1e-2)}))
    """


# --- report ---------------------------------------------------------------------------


@hookspec
def llmcheck_register_reporters(register: Callable[[Reporter], None]) -> None:
    """Register output formats of ``llmcheck compare``.

    Called once per compare, before anything is measured (an unknown ``--report`` name
    fails early). Call ``register(Reporter(name, description, file_name, write, default))``
    per format: ``write(result, path)`` gets the finished
    :class:`~llmcheck.core.judging.result.CompareResult` and the path of ``file_name`` in the
    output folder. A ``default`` reporter runs on every compare; the others run when the
    user passes ``--report NAME``. Two plugins registering the same name is a
    :class:`~llmcheck.core.errors.PluginError` naming both.

    Example::

        from llmcheck import Reporter, hookimpl


        def write_verdicts(result, path):
            with path.open("w") as out:
                for row in result.rows:
                    print(row.golden.key.label(), row.verdict, sep=", ", file=out)


        @hookimpl
        def llmcheck_register_reporters(register):
            register(Reporter(name="verdicts", description="one line per pair: its label and verdict",
                              file_name="verdicts.csv", write=write_verdicts))
    """


@hookspec(firstresult=True)
def llmcheck_noise_twin_command(golden: Dump, precision: str, output_dir: Path) -> str | None:
    """Return the command line that records the noise twin of a golden run, or ``None``.

    Called by ``llmcheck compare`` when the two runs differ in precision and no
    ``--noise-path`` was given: the hint it prints then shows this command. ``golden`` is
    the loaded golden run (its ``manifest`` says which capture wrote it and how);
    ``precision`` is the my-run's float class (``"bf16"``, ``"fp16"``, ``"fp32"``, ...);
    ``output_dir`` is the folder the core suggests for the twin (``golden_twin`` beside the
    golden). Return one shell command line -- runnable as it is when the dump recorded its
    program, else with a placeholder such as ``<your golden program>`` -- that runs the
    golden program again at ``precision``, captured as the golden was. Return ``None`` when
    the dump is not of this plugin's capture, or it cannot record that precision; the hint
    then says in words what to record. ``firstresult``: the first non-``None`` answer wins.

    Example::

        import shlex

        from llmcheck.plugin_api import hookimpl


        @hookimpl
        def llmcheck_noise_twin_command(golden, precision, output_dir):
            if golden.manifest.get("backend") != "plain":
                return None  # another capture's dump: its plugin answers
            program = golden.manifest.get("command_line") or ["<your golden program>"]
            return shlex.join(["env", f"DTYPE={precision}", "llmcheck", "dump", "--backend", "plain",
                               "-o", str(output_dir), "--", *program])
    """


# --- opcheck ---------------------------------------------------------------------------


@hookspec
def llmcheck_register_op_references(register: Callable[[OpReference], None]) -> None:
    """Register reference implementations of operator types, for ``llmcheck opcheck`` and compare's replay.

    Called once, the first time opcheck or a compare needs the reference table (a compare
    replays an op output before it names it: ``docs/metrics.md``, rule 9). Call
    ``register(OpReference(op_type, compute, description))`` per op type; ``op_type`` is
    the record's ``op_type`` it answers to (``"LinearOperation"``, ``"aten.mm.default"``).
    ``compute(inputs, params)`` recomputes the op on the CPU in higher precision from its
    dumped inputs (see :class:`~llmcheck.core.records.OpReference`). Two plugins
    registering the same op type is a :class:`~llmcheck.core.errors.PluginError` naming both.
    ``pointwise=True`` says the op maps each element on its own: a compare of
    statistics-only dumps then replays its calls on their recorded min and max (rule 9).

    Example::

        import torch

        from llmcheck.plugin_api import OpReference, hookimpl


        def _gelu(inputs, params):
            return [torch.nn.functional.gelu(inputs["0"].double())]


        @hookimpl
        def llmcheck_register_op_references(register):
            register(OpReference("MyGeluOperation", _gelu, "GELU, erf form, in float64", pointwise=True))
    """


@hookspec(firstresult=True)
def llmcheck_resolve_op_reference(op_type: str) -> OpReference | None:
    """Return a reference for an op type no registry names, or ``None``.

    Called by opcheck, and by a compare's replay, for each op type missing from the
    :func:`llmcheck_register_op_references` table: a plugin that can compute a whole family of ops generically (every ATen
    overload, replayed from its recorded arguments) answers here instead of registering
    each one. Return ``None`` when the op type is not of this plugin's family; the op is
    then reported unsupported. ``firstresult``: the first non-``None`` answer wins.

    Example::

        import torch

        from llmcheck.plugin_api import OpReference, UnsupportedOpError, hookimpl

        _UNARY = {"exp": torch.exp, "log": torch.log, "sqrt": torch.sqrt}


        @hookimpl
        def llmcheck_resolve_op_reference(op_type):
            if not (op_type.startswith("MyUnary") and op_type.endswith("Operation")):
                return None  # not this plugin's family: the op is reported unsupported

            def compute(inputs, params):
                function = _UNARY.get(params.get("kind", ""))
                if function is None:
                    raise UnsupportedOpError(f"unary kind {params.get('kind')!r}")
                return [function(inputs["0"].double())]

            return OpReference(op_type, compute, "MyUnary* ops by their 'kind' parameter, in float64")
    """


# --- export ----------------------------------------------------------------------------


@hookspec(firstresult=True)
def llmcheck_export_onnx(topology_path: Path, level: int, output_path: Path | None) -> Path | None:
    """Convert a topology file of this plugin's kind into an ONNX model and return where it was written.

    Called by ``llmcheck export onnx TOPOLOGY --level N [-o OUT]``. ``level`` is the depth
    to flatten the tree to (``-1``: every leaf; ``0``: the root as one node).
    ``output_path`` is where to write, or ``None`` for the topology's path with ``.onnx``.
    Return ``None`` when the file is not of this plugin's kind; raise a
    :class:`~llmcheck.core.errors.LlmcheckError` when it is but cannot be converted.
    ``firstresult``.

    Example::

        import json

        from llmcheck.plugin_api import hookimpl


        @hookimpl
        def llmcheck_export_onnx(topology_path, level, output_path):
            if not topology_path.name.endswith(".mytopo.json"):
                return None
            from onnx import helper, save

            tree = json.loads(topology_path.read_text())
            nodes = [helper.make_node(op["type"], op["inputs"], op["outputs"], name=op["name"]) for op in tree["ops"]]
            output_path = output_path or topology_path.with_suffix(".onnx")
            save(helper.make_model(helper.make_graph(nodes, tree["name"], [], [])), str(output_path))
            return output_path
    """
