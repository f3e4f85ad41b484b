"""The hook specifications: the whole contract between llmcheck's core and its plugins.

This file is the reference manual for plugin authors (``docs/plugins.md`` mirrors it and a
test keeps the two in step). Four families make the product:

* **capture** -- a dump backend (``llmcheck dump --backend NAME``);
* **load tensors** -- recognise a path as a kind of dump and give its records;
* **map pairs** -- propose golden <-> my pairs, each with the rule that made it;
* **metric** -- named measures of a pair, with direction and thresholds per dtype.

one export resolver, :func:`llmcheck_export_onnx`, that turns a source's topology file
into a viewable ONNX graph, the operator references ``llmcheck opcheck`` recomputes
single ops with (:func:`llmcheck_register_op_references`, :func:`llmcheck_resolve_op_reference`),
a capture backend's own ``dump`` flags (:func:`llmcheck_register_backend_options`), and the
files a compare writes (:func:`llmcheck_register_reporters`).

Registries take a ``register`` callback, so the core can de-duplicate and name both plugins
in a clash; resolvers (which loader claims this path) are ``firstresult``. A plugin
implements a hook by defining a function of the same name decorated with
``llmcheck.hookimpl``; it may accept any subset of the arguments.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import pluggy

from llmcheck.core.backend_options import BackendOption
from llmcheck.core.records import (
    CaptureBackend,
    Dump,
    MetricSpec,
    OpReference,
    Pair,
    SourceInfo,
    UserMapping,
)
from llmcheck.core.reporters import Reporter

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
    """


# --- map pairs -------------------------------------------------------------------------


@hookspec
def llmcheck_map_pairs(golden: Dump, my: Dump, user_mapping: UserMapping | None) -> list[Pair] | None:
    """Propose pairs of golden and my records.

    Called once per compare with both loaded dumps and the user's ``--mapping`` file (or
    ``None``). Return a list of :class:`~llmcheck.core.records.Pair`, each naming the rule
    that made it and a priority, or ``None`` when this plugin has nothing to say about
    these two sources. The core merges every plugin's proposals: each record keeps the
    highest-priority pair it appears in; records left in no pair are reported unmatched.
    A pair with one side ``None`` and a ``note`` explains why a record has no counterpart.
    """


# --- metric ----------------------------------------------------------------------------


@hookspec
def llmcheck_register_metrics(register: Callable[[MetricSpec], None]) -> None:
    """Register named metrics, each with its direction and default thresholds per dtype class.

    Called once, the first time a compare needs the metric table. Call
    ``register(MetricSpec(...))`` per metric. Two plugins registering the same name is a
    :class:`~llmcheck.core.errors.PluginError` naming both.
    """


# --- report ---------------------------------------------------------------------------


@hookspec
def llmcheck_register_reporters(register: Callable[[Reporter], None]) -> None:
    """Register output formats of ``llmcheck compare``.

    Called once per compare, before anything is measured (an unknown ``--report`` name
    fails early). Call ``register(Reporter(name, description, file_name, write, default))``
    per format: ``write(result, path)`` gets the finished
    :class:`~llmcheck.core.compare.CompareResult` and the path of ``file_name`` in the
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


# --- opcheck ---------------------------------------------------------------------------


@hookspec
def llmcheck_register_op_references(register: Callable[[OpReference], None]) -> None:
    """Register reference implementations of operator types, for ``llmcheck opcheck``.

    Called once, the first time opcheck needs the reference table. Call
    ``register(OpReference(op_type, compute, description))`` per op type; ``op_type`` is
    the record's ``op_type`` it answers to (``"LinearOperation"``, ``"aten.mm.default"``).
    ``compute(inputs, params)`` recomputes the op on the CPU in higher precision from its
    dumped inputs (see :class:`~llmcheck.core.records.OpReference`). Two plugins
    registering the same op type is a :class:`~llmcheck.core.errors.PluginError` naming both.
    """


@hookspec(firstresult=True)
def llmcheck_resolve_op_reference(op_type: str) -> OpReference | None:
    """Return a reference for an op type no registry names, or ``None``.

    Called by opcheck for each op type missing from the :func:`llmcheck_register_op_references`
    table: a plugin that can compute a whole family of ops generically (every ATen
    overload, replayed from its recorded arguments) answers here instead of registering
    each one. Return ``None`` when the op type is not of this plugin's family; the op is
    then reported unsupported. ``firstresult``: the first non-``None`` answer wins.
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
    """
