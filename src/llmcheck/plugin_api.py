"""Everything a plugin may use from llmcheck, and nothing else (as ``pytest`` is to ``_pytest``).

A plugin -- built-in or third-party -- imports from here only; ``llmcheck.core`` is private
and may change in any release. A test fails when a built-in plugin imports a core module.
What is here, by the question a plugin author asks:

* **How do I implement a hook?** :data:`hookimpl` (the hooks: ``docs/hooks.md``).
* **What do hooks exchange?** The record nouns: :class:`RecordKey`, :class:`TensorRecord`,
  :class:`TensorStats`, :class:`TensorData`, :class:`TopologyNode`, :class:`Dump` (a serving
  engine's per-step rows: :class:`BatchLayout`),
  :class:`Pair` and :class:`PairPriority`, :class:`UserMapping`, :class:`SourceInfo`,
  :class:`CaptureBackend` / :class:`CaptureRequest`, :class:`MetricSpec` /
  :class:`MetricAccumulator` / :class:`MetricResult` (a row's metrics: :class:`JudgedMetrics`,
  read without making results by :func:`metric_value`, :func:`metric_values` and
  :func:`metric_columns`), :class:`OpReference`; the constants
  of a record key (``IO_*``, ``MOMENT_*``, :data:`ALL_RANKS`), dtype names and classes, the
  attrs compare reads of parameters (:data:`PARAMETER_ATTR`, :data:`PARAMETER_DIGESTS_ATTR`),
  and the module-tree naming convention (:data:`ROOT_MODULE`, :func:`module_parent`, ...).
* **How do I fail?** The typed errors; the CLI prints them as one line.
* **How do I read a dump's files safely?** :func:`inside_dump`, :func:`read_dump_file`,
  :func:`dump_file_lines`, :func:`parse_dump_json`, :func:`walk_files`, :func:`is_real_folder` (one rule: regular
  files inside the dump, metadata files bounded), :func:`read_npy_header`, and the tensor
  I/O helpers (:func:`tensor_from_byte_range`, ...; they import torch on first use).
* **Which records make one op call?** :class:`OpCall`, :func:`group_op_calls`.
* **How do I propose the pairs of two record lists side by side?** :func:`pairs_in_order`: a
  sequence of pairs holding the two lists, 1 byte a pair, where a list of ``Pair`` objects is 88.
* **How do I write files?** :func:`atomic_write_text`, :func:`atomic_write_with`,
  :func:`check_replaceable` (never destroy a file of the user's that carries an output's name), and the
  llmcheck dump format (:class:`DumpWriter`, :func:`read_dump`, :func:`find_dumps`).
* **How does a capture write tensors without slowing the run?** :class:`TensorSink` copies
  each tensor on the forward and measures and writes it on the :class:`DumpWriter`'s thread
  (:class:`NullSink` keeps nothing; :func:`version_counter` tells an in-place change).
* **How does a metric share work between metrics?** :class:`PairChunk` (``update_chunk``), and
  for many small pairs at once :class:`PairBlock` (``results_of_block``) with :func:`row_dots`.
* **How does a backend declare its ``dump`` flags?** :class:`BackendOption`, and
  :func:`seed_dump_options` for the original tool's flag set.
* **How does a reporter render a compare?** :class:`Reporter` gets a :class:`CompareResult`,
  whose rows are a :class:`RowTable` (columns; a row is made when read): :func:`row_field`,
  :func:`iter_field`, :func:`metric_names`, :func:`rows_where`, :func:`rows_at` and :func:`in_golden_order` read
  it without making every row at once. The file names, :func:`describe`, :func:`json_safe`, :func:`write_pairs_json`, the depth
  profile helpers and :func:`atomic_output` are what the built-in reports share.

Names that need torch are imported on first access, so importing this module stays cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from llmcheck import lazy_attributes
from llmcheck.core.capture.backend_options import BackendOption
from llmcheck.core.capture.dump_command import ProgramRun, run_program
from llmcheck.core.capture.seed_flags import seed_dump_options
from llmcheck.core.dtypes import DTYPE_ITEMSIZE, FLOAT_DTYPES, dtype_class, is_float_dtype
from llmcheck.core.dumps.atomic_files import atomic_output, atomic_write_text, atomic_write_with, write_failed
from llmcheck.core.dumps.dump_paths import (
    METADATA_LIMIT_BYTES,
    dump_file_lines,
    folder_link_reason,
    inside_dump,
    is_real_folder,
    only_behind_folder_links,
    parse_dump_json,
    read_dump_file,
    walk_files,
    warn_passed_over,
)
from llmcheck.core.dumps.dump_schema import convert as convert_json
from llmcheck.core.dumps.dump_schema import decode as decode_json
from llmcheck.core.dumps.kept_files import EMPTY_FILE, ONNX_MODEL, check_replaceable
from llmcheck.core.dumps.npy_format import NpyHeader, read_npy_header
from llmcheck.core.dumps.store import (
    AS_DTYPE_FIELD,
    BATCHES_NAME,
    MODEL_DTYPES_FIELD,
    NATIVE_SOURCE,
    TOPOLOGY_NAME,
    UNFINISHED_SHARDS,
    DumpWriter,
    KeyFields,
    close_from_outside,
    closing_state,
    find_dumps,
    index_line,
    mark_cut,
    read_dump,
)
from llmcheck.core.errors import (
    BackendUnavailableError,
    DumpFormatError,
    DumpNotFoundError,
    LlmcheckError,
    PathOutsideDumpError,
    PluginError,
    UnsupportedOpError,
    UsageError,
)
from llmcheck.core.hookspecs import hookimpl
from llmcheck.core.judging.carried_errors import carried_origins
from llmcheck.core.judging.divergence import given_other_inputs
from llmcheck.core.judging.row_table import (
    RowFields,
    RowTable,
    field_blocks,
    golden_order,
    in_golden_order,
    iter_field,
    metric_names,
    row_field,
    rows_at,
    rows_where,
)
from llmcheck.core.judging.weights import PARAMETER_ATTR, PARAMETER_DIGESTS_ATTR
from llmcheck.core.op_calls import CallId, OpCall, group_op_calls, position_order
from llmcheck.core.pairing.merge import write_pairs_json
from llmcheck.core.pairing.pair_table import pairs_in_order
from llmcheck.core.plugins import load_dump
from llmcheck.core.records import (
    ALL_RANKS,
    DEPTH_BLOCKS,
    IO_INPUT,
    IO_OUTPUT,
    LAYOUT_TENSOR_FILES,
    MODULE_SEPARATOR,
    MOMENT_AFTER,
    MOMENT_BEFORE,
    OP_SEPARATOR,
    ROOT_MODULE,
    VERDICT_ERROR,
    VERDICT_FAIL,
    VERDICT_PASS,
    VERDICT_WARN,
    BatchLayout,
    CaptureBackend,
    CaptureRequest,
    ChunkMetricAccumulator,
    ComparisonRow,
    Dump,
    JudgedMetrics,
    MetricAccumulator,
    MetricResult,
    MetricSpec,
    OpReference,
    Pair,
    PairPriority,
    RecordKey,
    SourceInfo,
    TensorData,
    TensorRecord,
    TensorStats,
    TopologyNode,
    UserMapping,
    block_depth,
    error_measure,
    is_op_record_name,
    lies_inside,
    merge_rank_dumps,
    metric_columns,
    metric_value,
    metric_values,
    module_ancestors,
    module_depth,
    module_parent,
    op_record_module,
    op_record_name,
)
from llmcheck.core.reporting.depth_profile import (
    depth_points,
    drawn_step,
    heatmap,
    introduced_point,
    placement,
    row_error,
)
from llmcheck.core.reporting.graph_overlay import RECORD_NAME_KEY
from llmcheck.core.reporting.report import (
    CSV_NAME,
    HTML_NAME,
    PAIRS_NAME,
    SUMMARY_NAME,
    describe,
    divergence_line,
    json_safe,
    measure_text,
)
from llmcheck.core.reporting.reporters import Reporter

if TYPE_CHECKING:  # pragma: no cover
    from llmcheck.core.capture.call_arguments import decode_call, encode_call
    from llmcheck.core.capture.statistics import (
        segmented_stats_vectors,
        stats_from_vectors,
        stats_json_from_rows,
        stats_vector,
    )
    from llmcheck.core.capture.tensor_sink import NullSink, TensorSink, version_counter
    from llmcheck.core.dumps.tensor_chunks import ChunkReader
    from llmcheck.core.dumps.tensor_io import (
        dtype_name,
        load_weights_only,
        tensor_bytes,
        tensor_from_byte_range,
        torch_dtype,
    )
    from llmcheck.core.judging.result import CompareResult
    from llmcheck.core.judging.stats_compare import DECIDING_STAT, statistics_columns
    from llmcheck.core.measuring.pair_block import PairBlock, row_dots
    from llmcheck.core.measuring.pair_chunk import PairChunk, Workspace, dot

#: public name -> module defining it, for names whose module imports torch, numpy or the compare engine
#: (loaded on first access, so importing this module stays cheap)
_LOADED_ON_FIRST_USE: dict[str, str] = {
    "dtype_name": "llmcheck.core.dumps.tensor_io",
    "torch_dtype": "llmcheck.core.dumps.tensor_io",
    "tensor_bytes": "llmcheck.core.dumps.tensor_io",
    "tensor_from_byte_range": "llmcheck.core.dumps.tensor_io",
    "load_weights_only": "llmcheck.core.dumps.tensor_io",
    "stats_vector": "llmcheck.core.capture.statistics",
    "stats_from_vectors": "llmcheck.core.capture.statistics",
    "stats_json_from_rows": "llmcheck.core.capture.statistics",
    "segmented_stats_vectors": "llmcheck.core.capture.statistics",
    "encode_call": "llmcheck.core.capture.call_arguments",
    "decode_call": "llmcheck.core.capture.call_arguments",
    "ChunkReader": "llmcheck.core.dumps.tensor_chunks",  # numpy
    "PairBlock": "llmcheck.core.measuring.pair_block",  # numpy
    "row_dots": "llmcheck.core.measuring.pair_block",
    "PairChunk": "llmcheck.core.measuring.pair_chunk",  # numpy
    "Workspace": "llmcheck.core.measuring.pair_chunk",
    "dot": "llmcheck.core.measuring.pair_chunk",
    "CompareResult": "llmcheck.core.compare",  # the whole compare engine, numpy with it
    "statistics_columns": "llmcheck.core.judging.stats_compare",
    "DECIDING_STAT": "llmcheck.core.judging.stats_compare",
    "TensorSink": "llmcheck.core.capture.tensor_sink",  # torch
    "NullSink": "llmcheck.core.capture.tensor_sink",
    "version_counter": "llmcheck.core.capture.tensor_sink",
}

__all__ = [  # noqa: RUF022 -- grouped by the question a plugin author asks, not sorted
    # hooks
    "hookimpl",
    # record nouns and their constants
    "ALL_RANKS",
    "DTYPE_ITEMSIZE",
    "FLOAT_DTYPES",
    "IO_INPUT",
    "IO_OUTPUT",
    "MOMENT_AFTER",
    "MOMENT_BEFORE",
    "LAYOUT_TENSOR_FILES",
    "CaptureBackend",
    "CaptureRequest",
    "ChunkMetricAccumulator",
    "BatchLayout",
    "Dump",
    "MetricAccumulator",
    "JudgedMetrics",
    "MetricResult",
    "MetricSpec",
    "OpReference",
    "Pair",
    "PairPriority",
    "RecordKey",
    "SourceInfo",
    "TensorData",
    "TensorRecord",
    "TensorStats",
    "TopologyNode",
    "UserMapping",
    "dtype_class",
    "is_float_dtype",
    "merge_rank_dumps",
    "metric_value",
    "metric_columns",
    "metric_values",
    # module-tree record names
    "ROOT_MODULE",
    "MODULE_SEPARATOR",
    "OP_SEPARATOR",
    "module_parent",
    "module_ancestors",
    "module_depth",
    "block_depth",
    "DEPTH_BLOCKS",
    "op_record_name",
    "op_record_module",
    "is_op_record_name",
    "lies_inside",
    # record attrs that compare reads: parameters and their digests (weights checked against rounding)
    "PARAMETER_ATTR",
    "PARAMETER_DIGESTS_ATTR",
    # errors
    "LlmcheckError",
    "UsageError",
    "DumpFormatError",
    "DumpNotFoundError",
    "PathOutsideDumpError",
    "PluginError",
    "BackendUnavailableError",
    "UnsupportedOpError",
    # reading a dump's files
    "inside_dump",
    "read_dump_file",
    "dump_file_lines",
    "parse_dump_json",
    "METADATA_LIMIT_BYTES",
    "walk_files",
    "folder_link_reason",
    "only_behind_folder_links",
    "run_program",
    "ProgramRun",
    "warn_passed_over",
    "is_real_folder",
    "NpyHeader",
    "read_npy_header",
    "decode_json",
    "convert_json",
    "load_dump",
    # op calls
    "CallId",
    "OpCall",
    "group_op_calls",
    "position_order",
    # writing files and llmcheck dumps
    "atomic_write_text",
    "atomic_write_with",
    "write_failed",
    "DumpWriter",
    "read_dump",
    "find_dumps",
    "NATIVE_SOURCE",
    "AS_DTYPE_FIELD",
    "MODEL_DTYPES_FIELD",
    "BATCHES_NAME",
    "TOPOLOGY_NAME",
    "UNFINISHED_SHARDS",
    "close_from_outside",
    "closing_state",
    "mark_cut",
    "RECORD_NAME_KEY",
    "index_line",
    "KeyFields",
    # metrics sharing per-chunk work
    "PairChunk",
    "Workspace",
    "dot",
    "PairBlock",
    "row_dots",
    # capture backends: their declared dump options
    "BackendOption",
    "seed_dump_options",
    # reporters: a compare's result and what its reports share
    "Reporter",
    "ComparisonRow",
    "RowTable",
    "RowFields",
    "field_blocks",
    "row_field",
    "iter_field",
    "metric_names",
    "rows_at",
    "rows_where",
    "golden_order",
    "in_golden_order",
    "VERDICT_PASS",
    "VERDICT_WARN",
    "VERDICT_FAIL",
    "VERDICT_ERROR",
    "CSV_NAME",
    "SUMMARY_NAME",
    "PAIRS_NAME",
    "HTML_NAME",
    "describe",
    "divergence_line",
    "given_other_inputs",
    "measure_text",
    "json_safe",
    "write_pairs_json",
    "pairs_in_order",
    "atomic_output",
    "check_replaceable",
    "ONNX_MODEL",
    "EMPTY_FILE",
    "carried_origins",
    "depth_points",
    "drawn_step",
    "error_measure",
    "heatmap",
    "introduced_point",
    "placement",
    "row_error",
    # heavier helpers (imported on first access): torch-backed, numpy-backed, CompareResult, statistics_columns
    "dtype_name",
    "torch_dtype",
    "tensor_bytes",
    "tensor_from_byte_range",
    "load_weights_only",
    "stats_vector",
    "stats_from_vectors",
    "stats_json_from_rows",
    "segmented_stats_vectors",
    "encode_call",
    "decode_call",
    "ChunkReader",
    "CompareResult",
    "statistics_columns",
    "DECIDING_STAT",
    # capturing into an llmcheck dump: copies on the forward, statistics and writing on the writer's thread
    "TensorSink",
    "NullSink",
    "version_counter",
]


__getattr__ = lazy_attributes(__name__, _LOADED_ON_FIRST_USE, globals())
