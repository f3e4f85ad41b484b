"""One rule for every file a dump holds or names: a regular file inside the dump, symbolic links resolved.

The rule is **refuse**: a file reached through the dump -- a shard, an index, an ATB ``.bin``
or ``op_param.json``, an op CSV, a topology JSON, an FX ``.npy``, a GE dump file, a tensor
file a ``metadata.json`` names, msprobe's ``stack.json``, a ``data=`` reference -- whose real
location (every symbolic link followed) is outside the dump's root is a
:class:`~llmcheck.core.errors.PathOutsideDumpError` naming the link and where it leads.
A link that stays inside the dump is read. Why refuse rather than warn: a compare's
verdict must rest on the files the user handed over; a link out of the dump (to another
run's tensors, to ``/etc/passwd``) silently changes what is compared.

The same check refuses, as one :class:`~llmcheck.core.errors.DumpFormatError` naming the
file, what is no regular file (a FIFO, whose opening would wait forever for a writer; a
device such as ``/dev/zero``, endless; a socket; a folder), a link that loops or dangles,
a name the system finds too long, and a metadata file (JSON, CSV, text, read whole) larger
than :data:`METADATA_LIMIT_BYTES`. Every reader opens a dump's file through
:func:`inside_dump` (a path handed on to a loader that maps or seeks) or
:func:`read_dump_file` (the bytes, read whole) or :func:`dump_file_lines` (a line at a
time); :func:`parse_dump_json` turns those bytes into JSON with the same one-line errors.

Folders are walked without following folder links (:func:`walk_files`), so a link cycle
can never make a walk endless. Every source plugin calls these functions; none has its own
variant. What a walk passes over -- a folder link it does not enter
(:func:`folder_link_reason`), a file whose name the reader cannot parse -- is never
dropped without a word: :func:`warn_passed_over` names each.
:func:`plain_file_names` spares a reader of many files of one folder most of the resolving.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import stat
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, BinaryIO

from llmcheck.core.errors import DumpFormatError, DumpNotFoundError, PathOutsideDumpError

#: The largest metadata file of a dump (a JSON, CSV or text file that is read whole) a reader loads.
#: ATB's op_param.json and topology JSON, a manual metadata.json are kilobytes; msprobe's
#: stack.json and a GE graph text of a large model run to tens of megabytes. Beyond this a
#: file is a mistake, and reading it whole would cost gigabytes of memory. Files that grow
#: with the records (index.jsonl, msprobe's dump.json) have no such limit.
METADATA_LIMIT_BYTES = 256 * 1024 * 1024

#: How much of a path too long for the system an error shows.
_PATH_SHOWN_CHARS = 200

#: What a file that is no regular file is, by the type bits of its mode (for the error's words).
_NOT_REGULAR = (
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISDIR, "a folder"),
)


def _not_regular(mode: int, path: Path) -> DumpFormatError | None:
    """Return the error for a file of ``mode`` that is no regular file (``None`` for a regular file)."""
    if stat.S_ISREG(mode):
        return None
    kind = next((words for test, words in _NOT_REGULAR if test(mode)), "not a regular file")
    return DumpFormatError(
        f"is {kind}, not a regular file; llmcheck reads only regular files in a dump",
        where=path,
        hint="replace it with the file it stands for",
    )


def _too_large(size_bytes: int, limit_bytes: int | None, path: Path) -> DumpFormatError | None:
    if limit_bytes is None or size_bytes <= limit_bytes:
        return None
    return DumpFormatError(
        f"is {size_bytes} bytes, more than the {limit_bytes} a metadata file may have",
        where=path,
        hint="this file is read whole; check that it is the file the tool wrote",
    )


def unresolvable_path(exc: OSError, path: Path) -> DumpFormatError:
    """Return the error for a path the system cannot resolve (a loop, a name too long, no permission)."""
    if exc.errno == errno.ELOOP:
        return DumpFormatError(
            "is a symbolic link that loops", where=path, hint="remove the link or replace it with the file"
        )
    if exc.errno == errno.ENAMETOOLONG:
        longest = max(Path(path).parts, key=len)
        return DumpFormatError(
            f"a name in the path is {len(longest)} characters, more than the system allows",
            where=f"{str(path)[:_PATH_SHOWN_CHARS]}...",
            hint="the file that names it is damaged; write it again",
        )
    return DumpFormatError(f"cannot be read: {exc.strerror}", where=path)


def inside_dump(path: Path, root: Path | None, *, limit_bytes: int | None = None) -> Path:
    """Return ``path`` when it is a regular file lying inside ``root``, links resolved; raise naming what is wrong otherwise.

    ``root`` ``None`` is a file the user named (no dump around it): only the type and size
    rules apply. ``limit_bytes`` bounds a file read whole (:data:`METADATA_LIMIT_BYTES`).
    A path that does not exist, and is no link, is returned as is (the caller reports it
    missing); a link to nothing is an error naming the link and its target.
    """
    try:
        real = Path(os.path.realpath(path, strict=True))
        status = os.stat(real)
    except FileNotFoundError:
        if os.path.islink(path):
            raise DumpFormatError(
                f"is a link to {os.readlink(path)}, which does not exist",
                where=path,
                hint="copy the file in, or remove the link",
            ) from None
        return path
    except OSError as exc:
        raise unresolvable_path(exc, path) from None
    if root is not None:
        real_root = Path(os.path.realpath(root))
        if real != real_root and real_root not in real.parents:
            raise PathOutsideDumpError(
                f"leads outside the dump {root} to {real}",
                where=path,
                hint="llmcheck reads only files inside the dump; copy the file in instead of linking to it",
            )
    refused = _not_regular(status.st_mode, path) or _too_large(status.st_size, limit_bytes, path)
    if refused is not None:
        raise refused
    return path


def read_dump_file(path: Path, root: Path | None, *, limit_bytes: int | None = METADATA_LIMIT_BYTES) -> bytes:
    """Return the bytes of a dump's file, checked by :func:`inside_dump`; a missing one raises ``FileNotFoundError``.

    The file is opened without waiting (``O_NONBLOCK``) and checked again once open, so a
    file swapped for a FIFO after the check still cannot block the read.
    """
    path, handle, size = _open_checked(path, root, limit_bytes)
    with handle:
        try:
            if limit_bytes is None:
                content = handle.read()
            else:  # the size it has, not the limit: a read of limit + 1 bytes allocates that much first
                content = handle.read(min(size, limit_bytes) + 1)
                if len(content) > size:  # grown since the check: read on, up to the limit
                    content += handle.read(limit_bytes + 1 - len(content))
        except OSError as exc:
            raise DumpFormatError(f"cannot be read: {exc.strerror}", where=path) from None
    refused = _too_large(len(content), limit_bytes, path)  # grown since the check
    if refused is not None:
        raise refused
    return content


def dump_file_lines(path: Path, root: Path | None) -> Iterator[bytes]:
    """Return the lines of a dump's file (each ending in LF, but a last partial one), checked as :func:`read_dump_file` checks it.

    For a file that grows with the dump, read a line at a time rather than whole: the index
    of a ten-million-record dump is gigabytes, which loading it must not hold besides its
    records. The file is opened now (a missing one raises ``FileNotFoundError``) and read as
    the lines are asked for; a read that fails is a :class:`DumpFormatError` naming the file.
    """
    path, handle, _ = _open_checked(path, root, None)
    return _lines_of(handle, path)


def _lines_of(handle: BinaryIO, path: Path) -> Iterator[bytes]:
    with handle:
        try:
            yield from handle
        except OSError as exc:
            raise DumpFormatError(f"cannot be read: {exc.strerror}", where=path) from None


def _open_checked(path: Path, root: Path | None, limit_bytes: int | None) -> tuple[Path, BinaryIO, int]:
    """Return a dump's file checked by :func:`inside_dump`, opened without waiting and checked again, with its size then."""
    path = inside_dump(path, root, limit_bytes=limit_bytes)
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise unresolvable_path(exc, path) from None
    handle = os.fdopen(descriptor, "rb")
    status = os.fstat(descriptor)
    refused = _not_regular(status.st_mode, path) or _too_large(status.st_size, limit_bytes, path)
    if refused is not None:
        handle.close()
        raise refused
    return path, handle, status.st_size


def parse_dump_json(content: bytes | str, where: Path | str, what: str = "") -> Any:
    """Return ``content`` parsed as JSON; what is not JSON, or nests too deep to parse, is an error naming ``where``.

    ``what`` names the part of the file parsed (``"OpParam"``) when it is not the whole
    file; for the whole file the error gives the byte offset where parsing failed.
    """
    subject = f"{what} is " if what else ""
    try:
        return json.loads(content)
    except RecursionError:
        raise DumpFormatError(
            f"{subject}JSON nested too deep to read", where=where, hint="the file is damaged; write it again"
        ) from None
    except json.JSONDecodeError as exc:
        raise DumpFormatError(
            f"{subject}not valid JSON: {exc.msg}", where=where, offset=None if what else exc.pos
        ) from None
    except UnicodeDecodeError as exc:
        raise DumpFormatError(f"{subject}not UTF-8 text", where=where, offset=None if what else exc.start) from None


def plain_file_names(root: Path) -> frozenset[str]:
    """Return the names of the regular files directly in ``root`` that are not symbolic links.

    Such a file lies inside ``root`` without resolving anything: a reader opening hundreds
    of files of one folder (a decode dump's shards) looks each up here and calls
    :func:`inside_dump` only for the others, instead of resolving every path. An unreadable
    folder gives no names (every file is then checked by :func:`inside_dump`).
    """
    try:
        with os.scandir(root) as entries:
            return frozenset(entry.name for entry in entries if entry.is_file(follow_symlinks=False))
    except OSError:
        return frozenset()


def walk_files(
    root: Path, passed_over: list[tuple[Path, str]] | None = None, max_depth: int | None = None
) -> Iterator[tuple[Path, list[str]]]:
    """Yield ``(folder, file names)`` of every folder below ``root``, never entering a folder link.

    ``passed_over``, when given, receives each folder link met, with :func:`folder_link_reason`
    (the one rule of every source: a folder link in a dump, a run folder included, is never
    entered, and named). ``max_depth`` stops the walk that many folders below ``root``.
    """
    base_depth = len(Path(root).parts)
    for directory, folder_names, file_names in os.walk(root, followlinks=False):
        folder = Path(directory)
        if passed_over is not None:
            links = sorted(folder / name for name in folder_names if os.path.islink(folder / name))
            passed_over.extend((link, folder_link_reason(link, root)) for link in links)
        if max_depth is not None and len(folder.parts) - base_depth >= max_depth:
            folder_names[:] = []
        yield folder, file_names


def is_real_folder(path: Path) -> bool:
    """Return whether ``path`` is a folder and not a link to one (a walk enters only these)."""
    return path.is_dir() and not path.is_symlink()


#: How many folder links an error about a dump found only behind them names.
FOLDER_LINKS_NAMED = 5


def only_behind_folder_links(where: Path, links: Sequence[Path]) -> DumpNotFoundError:
    """Return the error for a dump whose runs are all behind folder links: the rule is never to enter one."""
    named = [f"{link.relative_to(where)} (to {os.path.realpath(link)})" for link in links[:FOLDER_LINKS_NAMED]]
    more = f" and {len(links) - FOLDER_LINKS_NAMED} more" if len(links) > FOLDER_LINKS_NAMED else ""
    return DumpNotFoundError(
        f"no dump here but behind folder links, which llmcheck never enters: {', '.join(named)}{more}",
        where=where,
        hint="pass the folder a link leads to, or copy it in",
    )


#: How many passed-over files and folders of one dump are named, a warning each, before the rest are counted.
PASSED_OVER_NAMED = 20


def folder_link_reason(link: Path, root: Path) -> str:
    """Return why a folder link in the dump ``root`` was not read: it is never entered, and where it leads."""
    target = Path(os.path.realpath(link))
    real_root = Path(os.path.realpath(root))
    if target != real_root and real_root not in target.parents:
        return f"not entered: a folder link leading outside the dump to {target}"
    return f"not entered: a folder link (to {target}); llmcheck never follows folder links in a dump"


def warn_passed_over(log: logging.Logger, root: Path, passed_over: Sequence[tuple[Path, str]]) -> None:
    """Warn about each (path, why) a reader of the dump ``root`` did not read: the first ones by name, then a count."""
    for path, why in passed_over[:PASSED_OVER_NAMED]:
        log.warning("%s: %s", path, why)
    if len(passed_over) > PASSED_OVER_NAMED:
        log.warning(
            "%s: %d more files or folders of the dump were not read (the first %d are named above)",
            root,
            len(passed_over) - PASSED_OVER_NAMED,
            PASSED_OVER_NAMED,
        )
