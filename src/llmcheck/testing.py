"""A pytest plugin for llmcheck plugin authors (and llmcheck's own tests): register plugins for one test.

Installed as a ``pytest11`` entry point, so any project with llmcheck installed gets the
fixtures:

* ``llmcheck_plugins`` -- a function ``register(*plugins) -> Plugins`` that rebuilds the
  plugin manager with the installed plugins plus the given modules/objects, for this test only;
* ``make_llmcheck_dump`` -- a function ``make(tmp_folder, {name: tensor}) -> Path`` writing a
  small llmcheck-format dump (one output record per tensor, in the given order).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from llmcheck.core.plugins import Plugins, build_plugins, reset_plugins, set_plugins


@pytest.fixture
def llmcheck_plugins() -> Iterator[Callable[..., Plugins]]:
    """Return ``register(*plugins)``: the installed plugins plus these, active until the test ends."""

    def register(*plugins: Any) -> Plugins:
        facade = build_plugins(extra_plugins=list(plugins))
        set_plugins(facade)
        return facade

    yield register
    reset_plugins()


def write_llmcheck_dump(folder: Path, tensors: Mapping[str, Any], statistics_only: Collection[str] = ()) -> Path:
    """Write a small llmcheck dump of ``{name: tensor}`` in that order and return its folder.

    Records named in ``statistics_only`` keep their statistics and no data, as a
    statistics-only capture writes them.
    """
    from llmcheck.core.capture.statistics import tensor_stats
    from llmcheck.core.dumps.store import DumpWriter
    from llmcheck.core.dumps.tensor_io import dtype_name
    from llmcheck.core.records import RecordKey, TensorRecord

    with DumpWriter(Path(folder), "test") as writer:
        for order, (name, tensor) in enumerate(tensors.items()):
            record = TensorRecord(
                key=RecordKey(name=name),
                dtype=dtype_name(tensor.dtype),
                shape=tuple(tensor.shape),
                order=order,
                stats=tensor_stats(tensor),
            )
            writer.add(record, None if name in statistics_only else tensor.detach().cpu().clone())
    return writer.path


@pytest.fixture
def make_llmcheck_dump() -> Callable[[Path, Mapping[str, Any]], Path]:
    """Return ``make(folder, {name: tensor})`` writing a small llmcheck dump and returning its folder."""
    return write_llmcheck_dump
