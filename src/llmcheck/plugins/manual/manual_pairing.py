"""The manual mapping's pairing rule: pairs are what the user's ``dump_data`` calls said, by data id and token.

* First seed form: each golden record names its counterpart file (``attrs["my_path"]``),
  which must lie inside the *my* dump (``--my-path``, links resolved: the one containment
  rule of every reader). The counterpart is the record of the *my* dump holding that file
  when there is one, else the file read on its own -- so ``--my-path`` may be that file or
  a folder holding it. Records of the *my* dump no entry names stay unmatched, with
  a note saying so.
* Second seed form: a golden and an acl ``metadata.json``; records pair when their
  ``data_id`` and ``token_id`` agree. A data id/token on one side only stays unmatched,
  with a note.
"""

from __future__ import annotations

from pathlib import Path

from llmcheck.plugin_api import Dump, Pair, PairPriority, PathOutsideDumpError, TensorRecord, inside_dump
from llmcheck.plugins.manual.manual_dump import FORM_MAPPED, SOURCE_NAME, load_tensor_record

RULE = "manual_mapping"
NOT_NAMED = "no dump_data entry names this tensor"


def _file_of(record: TensorRecord) -> Path | None:
    if record.data is None or record.data.path is None:
        return None
    return Path(record.data.path).resolve()


def _named_file(record: TensorRecord, metadata: Path, my_root: Path) -> Path:
    """Return the file a first-form entry names, which must lie inside the ``--my-path`` dump (the one containment rule)."""
    my_file = Path(str(record.attrs["my_path"]))
    try:
        return inside_dump(my_file, my_root)
    except PathOutsideDumpError:
        raise PathOutsideDumpError(
            f"data_id {record.attrs['data_id']} token {record.attrs['token_id']} names {my_file}, "
            f"which leads outside the --my-path dump {my_root}",
            where=metadata,
            hint="pass the folder that holds every file the entries name as --my-path",
        ) from None


def mapped_pairs(golden: Dump, my: Dump) -> list[Pair]:
    """Return the pairs of a first-form golden dump: each golden tensor with the file it names inside the my dump."""
    metadata = Path(str(golden.manifest["metadata"]))
    mine_by_file = {_file_of(record): record for record in my.records if _file_of(record) is not None}
    used: set[int] = set()
    pairs = []
    for record in golden.records:
        my_file = _named_file(record, metadata, Path(my.root))
        counterpart = mine_by_file.get(my_file.resolve())
        if counterpart is not None:
            used.add(id(counterpart))  # the my dump's own record: kept as it is, so the core sees it paired
        else:
            counterpart = load_tensor_record(my_file, metadata).with_changes(
                key=record.key,
                order=record.order,
                source_path=str(my_file),
                attrs={"data_id": record.attrs["data_id"], "token_id": record.attrs["token_id"]},
            )
        pairs.append(Pair(record, counterpart, RULE, PairPriority.USER_MAPPING))
    pairs.extend(
        Pair(None, record, RULE, PairPriority.USER_MAPPING, note=NOT_NAMED)
        for record in my.records
        if id(record) not in used
    )
    return pairs


def sided_pairs(golden: Dump, my: Dump) -> list[Pair]:
    """Return the pairs of a golden and an acl dump: same data id, same token."""
    mine = {(record.key.name, record.key.step): record for record in my.records}
    goldens = {(record.key.name, record.key.step) for record in golden.records}
    pairs = []
    for record in golden.records:
        counterpart = mine.get((record.key.name, record.key.step))
        note = (
            ""
            if counterpart
            else (f"data_id {record.key.name} token {record.key.step} has no {my.manifest['side']} entry")
        )
        pairs.append(Pair(record, counterpart, RULE, PairPriority.USER_MAPPING, note=note))
    pairs.extend(
        Pair(
            None,
            record,
            RULE,
            PairPriority.USER_MAPPING,
            note=f"data_id {record.key.name} token {record.key.step} has no {golden.manifest['side']} entry",
        )
        for record in my.records
        if (record.key.name, record.key.step) not in goldens
    )
    return pairs


def manual_pairs(golden: Dump, my: Dump) -> list[Pair] | None:
    """Return the manual mapping's pairs, or ``None`` when the golden side is not a manual dump."""
    if golden.source != SOURCE_NAME:
        return None
    if golden.manifest.get("form") == FORM_MAPPED:
        return mapped_pairs(golden, my)
    if my.source == SOURCE_NAME:
        return sided_pairs(golden, my)
    return None
