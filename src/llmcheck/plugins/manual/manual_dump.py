"""A manual dump read as records: one record per ``(data_id, token_id)`` of a ``metadata.json``.

The path may be the ``metadata.json``, its ``*_tensor`` folder, or a folder a few levels
above holding exactly one (``ait_dump/{pid}_{device}/``, ``{pid}_cmp_dump_data/``). Each
record is keyed ``name = data_id``, ``step = token_id``; its data is the tensor file the
entry names, read through the *load tensors* hook like any other tensor file (an ATB
``.bin`` by the ATB reader, a ``.safetensors`` or ``.npy`` by the file reader). For the
first seed form the golden records carry, in ``attrs["my_path"]``, the file they pair
with; the *map pairs* rule of this plugin pairs them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path, PurePath
from typing import Any

from llmcheck.plugin_api import (
    Dump,
    DumpFormatError,
    DumpNotFoundError,
    LlmcheckError,
    PathOutsideDumpError,
    RecordKey,
    TensorRecord,
    inside_dump,
    load_dump,
)
from llmcheck.plugins.manual.metadata_file import METADATA_NAME, looks_like_metadata, read_metadata

SOURCE_NAME = "manual"
SIDE_FOLDERS = ("golden_tensor", "acl_tensor")
#: How many folder levels below the given path a ``*_tensor/metadata.json`` is looked for.
SEARCH_DEPTH = 3
#: Where an ATB dump keeps its per-run tensor folders, in every era of the tool.
ATB_ROOT_PATTERNS = ("msit_dump*", "ait_dump*", "atb_temp", "atb_dump_data")
FORM_MAPPED = "mapped"  # golden_tensor/metadata.json with [golden, my] pairs
FORM_SIDED = "sided"  # {golden,acl}_tensor/metadata.json, one side each
#: How many entries with missing files one error lists.
MISSING_LISTED = 5


def find_metadata(path: Path) -> Path | None:
    """Return the ``metadata.json`` a path names, or ``None`` when it is not a manual dump.

    A folder holding several (both sides, several processes) is an error that lists them.
    """
    path = Path(path)
    if path.is_file():
        if path.name == METADATA_NAME and (path.parent.name in SIDE_FOLDERS or looks_like_metadata(path)):
            return path
        return None
    if not path.is_dir():
        return None
    found: list[Path] = []
    level = [path]
    for _ in range(SEARCH_DEPTH + 1):
        found = [
            folder / METADATA_NAME
            for folder in level
            if folder.name in SIDE_FOLDERS and (folder / METADATA_NAME).is_file()
        ]
        if found:
            break
        level = sorted(child for folder in level for child in _subfolders(folder))
    if len(found) > 1:
        listing = ", ".join(str(candidate.relative_to(path)) for candidate in found)
        raise DumpNotFoundError(
            f"holds {len(found)} manual dumps: {listing}",
            where=path,
            hint="pass one metadata.json (golden and acl sides are given separately)",
        )
    return found[0] if found else None


def _subfolders(folder: Path) -> list[Path]:
    try:
        return [child for child in folder.iterdir() if child.is_dir() and not child.is_symlink()]
    except OSError:
        return []


def manual_dump_root(metadata: Path) -> Path:
    """Return the root of the manual dump a ``metadata.json`` belongs to (``{pid}_cmp_dump_data``, ``{pid}_{device}``)."""
    return metadata.parent.parent


def resolve_tensor_file(entry_path: str, metadata: Path) -> Path:
    """Return the file inside the dump that an entry's path names.

    Paths are resolved against the metadata's folder, then the dump root above it. The
    original tool wrote paths relative to the working directory of the dumping process
    (``./output/{pid}_cmp_dump_data/golden_tensor/3/2_tensor.pth``) or absolute ones; ours
    are relative to the metadata's folder. So the path's leading folders are dropped one
    by one until the rest names a file there: a manual dump can be moved, and a path can
    never reach out of it (``..`` is refused, links are judged by ``inside_dump``).
    """
    path = PurePath(entry_path)
    root = manual_dump_root(metadata)
    if ".." in path.parts:  # dump_data never writes one: such an entry would read a file outside the dump
        raise PathOutsideDumpError(
            f"names {entry_path!r}, a path that climbs out of the dump",
            where=metadata,
            hint="entries are paths dump_data wrote, relative to metadata.json's folder",
        )
    parts = [part for part in path.parts if part not in (path.anchor, ".")]
    candidates = [folder.joinpath(*parts[start:]) for folder in (metadata.parent, root) for start in range(len(parts))]
    # anything there but a folder (a link, a FIFO) is found, then judged by inside_dump
    found = next((found for found in candidates if os.path.lexists(found) and not found.is_dir()), None)
    if found is not None:
        return inside_dump(found, root)
    if path.is_absolute() and Path(path).exists():
        raise PathOutsideDumpError(
            f"names {entry_path!r}, outside the dump {root}",
            where=metadata,
            hint="keep the tensor files inside the dump folder dump_data wrote",
        )
    raise DumpNotFoundError(
        f"names {entry_path!r}, which is not in the dump {root}",
        where=metadata,
        hint="the tensor files must stay where dump_data wrote them, beside metadata.json",
    )


def resolve_atb_tensor(entry: Mapping[str, Any], token_id: str, metadata: Path) -> Path:
    """Return the ATB ``.bin`` a low-level entry names, found in the ATB dump of the process that recorded it.

    The tensor lives at ``tensors/{device}_{pid}/{token_id}/{atb_tensor_path}`` (``thread_{pid}``
    in the oldest layout) of an ATB dump under ``$ATB_OUTPUT_DIR`` as it was when
    ``dump_data`` ran, or under the folder ``{pid}_cmp_dump_data`` was written in.
    """
    relative, pid = str(entry["atb_tensor_path"]), entry.get("pid", "*")
    roots = [Path(entry["atb_output_dir"])] if entry.get("atb_output_dir") else []
    roots.append(metadata.parent.parent.parent)
    matches: list[Path] = []
    for root in dict.fromkeys(root.absolute() for root in roots):
        dump_roots = [root] + [found for pattern in ATB_ROOT_PATTERNS for found in sorted(root.glob(pattern))]
        for dump_root in dump_roots:
            for tensors in ("tensors", "data"):
                for run in (f"*_{pid}", f"thread_{pid}"):
                    matches.extend(sorted((dump_root / tensors).glob(f"{run}/{token_id}/{relative}")))
    matches = list(dict.fromkeys(matches))
    if len(matches) > 1:
        raise DumpNotFoundError(
            f"ATB tensor {relative} of token {token_id} is in {len(matches)} dumps: "
            + ", ".join(str(match) for match in matches),
            where=metadata,
            hint="keep one ATB dump of that process beside the manual dump",
        )
    if not matches:
        searched = ", ".join(str(root) for root in dict.fromkeys(roots))
        raise DumpNotFoundError(
            f"ATB tensor {relative} of token {token_id} (pid {pid}) is in no ATB dump under {searched}",
            where=metadata,
            hint="run the acl side under 'llmcheck dump --backend atb' so ATB saves that tensor",
        )
    return matches[0]


def load_tensor_record(path: Path, metadata: Path) -> TensorRecord:
    """Return the one tensor of a file, read by whichever plugin reads that kind of file."""
    try:
        dump = load_dump(path)
    except DumpNotFoundError as exc:
        raise DumpNotFoundError(
            f"names {path}, which no plugin reads as a tensor file ({exc.what})", where=metadata
        ) from exc
    with_data = [record for record in dump.records if record.data is not None]
    if len(with_data) != 1:
        raise DumpFormatError(
            f"names {path}, which holds {len(with_data)} tensors with data; a manual mapping "
            "entry names a file of exactly one tensor",
            where=metadata,
        )
    return with_data[0]


def load_manual_dump(path: Path) -> Dump | None:
    """Return the records of the manual dump at ``path``, or ``None`` when it is not one."""
    metadata = find_metadata(path)
    if metadata is None:
        return None
    mapping = read_metadata(metadata)
    forms = {isinstance(entry, list) for tokens in mapping.values() for entry in tokens.values()}
    if len(forms) > 1:
        raise DumpFormatError(
            "mixes [golden, my] pairs with single-side entries",
            where=metadata,
            hint="each dump_data signature writes its own metadata.json",
        )
    form = FORM_MAPPED if forms == {True} else FORM_SIDED
    records: list[TensorRecord] = []
    missing: list[str] = []  # every entry whose file is not found, named together
    for data_id, tokens in mapping.items():
        for token_id, entry in sorted(tokens.items(), key=lambda item: int(item[0])):
            try:
                records.append(_record(metadata, data_id, token_id, entry, len(records)))
            except DumpNotFoundError as exc:
                if exc.where != str(metadata):
                    raise
                missing.append(f"data_id {data_id} token {token_id} {exc.what}")
    if missing:
        shown = "; ".join(missing[:MISSING_LISTED]) + ("; ..." if len(missing) > MISSING_LISTED else "")
        raise DumpNotFoundError(
            f"{len(missing)} of {len(missing) + len(records)} entries name tensor files that are not found: {shown}",
            where=metadata,
            hint=f"paths are looked for below {metadata.parent} and {manual_dump_root(metadata)}",
        )
    records.sort(key=lambda record: (record.key.step, record.order))
    records = [record.with_changes(order=order) for order, record in enumerate(records)]
    side = metadata.parent.name.removesuffix("_tensor") if metadata.parent.name in SIDE_FOLDERS else "golden"
    return Dump(
        source=SOURCE_NAME,
        root=metadata.parent,
        records=records,
        manifest={"format": SOURCE_NAME, "metadata": str(metadata), "form": form, "side": side},
    )


def _record(metadata: Path, data_id: str, token_id: str, entry: Any, order: int) -> TensorRecord:
    attrs: dict[str, Any] = {"data_id": data_id, "token_id": int(token_id)}
    if isinstance(entry, list):
        tensor_file = resolve_tensor_file(entry[0], metadata)
        attrs["my_path"] = entry[1]
    elif isinstance(entry, str):
        tensor_file = resolve_tensor_file(entry, metadata)
    else:
        tensor_file = resolve_atb_tensor(entry, token_id, metadata)
        attrs["atb_tensor_path"] = entry["atb_tensor_path"]
    try:
        found = load_tensor_record(tensor_file, metadata)
    except LlmcheckError as exc:
        raise type(exc)(f"data_id {data_id} token {token_id}: {exc.what}", where=exc.where, hint=exc.hint) from exc
    return found.with_changes(
        key=RecordKey(name=data_id, step=int(token_id)),
        order=order,
        op_type=None,
        parent=None,
        source_path=os.path.relpath(tensor_file, metadata.parent),
        attrs=attrs,
    )
