"""Every input kind, mutated: each outcome is a clean error naming a file or a correct load, never a crash.

The hostile kinds too: a FIFO, a device link or a link loop in place of any file of a
dump, JSON nested deep, a name too long for the system -- never a hang, never a file
dropped without a word. A few seeded mutations per kind keep this fast;
``benchmarks/fuzz_inputs.py`` runs hundreds per kind and prints the table of outcomes (see
``tests/fuzz_inputs.py`` for the mutations).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fuzz_inputs import ALL_KINDS, CLEAN_ERROR, LOADED, InputKind, prepare, run_case

CASES_PER_KIND = 12


@pytest.fixture(scope="module")
def seed_folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return prepare(ALL_KINDS, tmp_path_factory.mktemp("fuzz_seeds"))


@pytest.mark.parametrize("kind", ALL_KINDS, ids=[kind.name for kind in ALL_KINDS])
def test_mutated_inputs_give_a_clean_error_naming_the_file_or_load(
    kind: InputKind, seed_folders: dict[str, Path], tmp_path: Path
) -> None:
    results = [run_case(kind, seed_folders[kind.name], tmp_path / "work", case) for case in range(CASES_PER_KIND)]
    bad = [
        f"case {result.case}: {result.outcome}: {result.message}"
        for result in results
        if result.outcome not in (CLEAN_ERROR, LOADED)
    ]
    assert bad == []
    assert any(result.outcome == CLEAN_ERROR for result in results)  # the mutations did break the input
