"""One rule for every file a dump holds or names: it must lie inside the dump, symbolic links resolved.

The rule is **refuse**: a file reached through the dump -- a shard, an ATB ``.bin``, an FX
``.npy``, a GE dump file, a tensor file a ``metadata.json`` names, a ``data=`` reference --
whose real location (every symbolic link followed) is outside the dump's root is a
:class:`~llmcheck.core.errors.PathOutsideDumpError` naming the link and where it leads.
A link that stays inside the dump is read. Why refuse rather than warn: a compare's
verdict must rest on the files the user handed over; a link out of the dump (to another
run's tensors, to ``/etc/passwd``) silently changes what is compared.

Folders are walked without following folder links (:func:`walk_files`), so a link cycle
can never make a walk endless; a file link that loops is a
:class:`~llmcheck.core.errors.DumpFormatError`. Every source plugin calls these two
functions; none has its own variant. What a walk passes over -- a folder link it does not
enter (:func:`folder_link_reason`), a file whose name the reader cannot parse -- is never
dropped without a word: :func:`warn_passed_over` names each.
:func:`plain_file_names` spares a reader of many files of one folder most of the resolving.
"""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Iterator, Sequence
from pathlib import Path

from llmcheck.core.errors import DumpFormatError, PathOutsideDumpError


def inside_dump(path: Path, root: Path) -> Path:
    """Return ``path`` when its real location lies inside ``root``; raise naming where it leads otherwise.

    A path that does not exist is returned as is (the caller reports it missing).
    """
    try:
        real = Path(os.path.realpath(path, strict=True))
    except FileNotFoundError:
        return path
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise DumpFormatError(
                "is a symbolic link that loops", where=path, hint="remove the link or replace it with the file"
            ) from None
        raise DumpFormatError(f"cannot be read: {exc.strerror}", where=path) from None
    real_root = Path(os.path.realpath(root))
    if real != real_root and real_root not in real.parents:
        raise PathOutsideDumpError(
            f"leads outside the dump {root} to {real}",
            where=path,
            hint="llmcheck reads only files inside the dump; copy the file in instead of linking to it",
        )
    return path


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


def walk_files(root: Path) -> Iterator[tuple[Path, list[str]]]:
    """Yield ``(folder, file names)`` of every folder below ``root``, never entering a folder link."""
    for directory, _, file_names in os.walk(root, followlinks=False):
        yield Path(directory), file_names


def is_real_folder(path: Path) -> bool:
    """Return whether ``path`` is a folder and not a link to one (a walk enters only these)."""
    return path.is_dir() and not path.is_symlink()


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
