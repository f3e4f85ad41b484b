"""Finding the ATB probe library to preload, built for the C++ ABI that ``libatb.so`` uses.

ATB calls stub functions of ``atb::Probe`` at every operation; a probe library that
defines the same symbols, put first in ``LD_PRELOAD``, receives those calls and writes
the dump. CANN ships it twice, ``libatb_probe_abi0.so`` and ``libatb_probe_abi1.so``, for
the two values of ``_GLIBCXX_USE_CXX11_ABI``; the right one is the one whose mangled
names match ``libatb.so``'s. We read ``libatb.so``'s dynamic symbol table (ELF
``.dynsym``) directly -- what ``nm -D | grep Probe | grep cxx11`` does, without needing
binutils -- and take ABI 1 when its ``Probe`` symbols carry ``__cxx11``.
"""

from __future__ import annotations

import mmap
import os
import stat
import struct
from dataclasses import dataclass
from pathlib import Path

from llmcheck.plugin_api import BackendUnavailableError, LlmcheckError

DEFAULT_TOOLKIT_HOME = "/usr/local/Ascend/ascend-toolkit/latest"
PROBE_DIR = Path("tools") / "ait_backend" / "dump"
PROBE_NAMES = {0: "libatb_probe_abi0.so", 1: "libatb_probe_abi1.so"}
#: The user's own probe library (a self-built or msprobe probe), skipping the search.
PROBE_ENV = "LLMCHECK_ATB_PROBE"
_SHT_DYNSYM = 11
_ELF_MAGIC = b"\x7fELF"


@dataclass(frozen=True, slots=True)
class ProbeChoice:
    """The probe library to preload and why it was chosen."""

    path: Path
    abi: int | None
    reason: str


def dynamic_symbols(library: Path) -> list[str]:
    """Return the names in an ELF shared object's dynamic symbol table (``.dynsym``)."""
    library = Path(library)
    try:
        handle = open(library, "rb")  # noqa: SIM115 - closed by the with below; only open() errors caught here
    except OSError as exc:
        raise BackendUnavailableError(f"cannot read: {exc.strerror}", where=library) from exc
    with handle:
        size = os.fstat(handle.fileno()).st_size
        if size < 64:
            raise LlmcheckError("not an ELF shared object (too short)", where=library)
        with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as image:
            return _read_dynsym(image, library)


def _read_dynsym(image: mmap.mmap, library: Path) -> list[str]:
    if image[:4] != _ELF_MAGIC:
        raise LlmcheckError("not an ELF shared object", where=library)
    is_64 = image[4] == 2
    order = "<" if image[5] == 1 else ">"
    try:
        if is_64:
            (section_offset,) = struct.unpack_from(order + "Q", image, 0x28)
            entry_size, count = struct.unpack_from(order + "HH", image, 0x3A)
            header_format, symbol_size = order + "IIQQQQIIQQ", 24
        else:
            (section_offset,) = struct.unpack_from(order + "I", image, 0x20)
            entry_size, count = struct.unpack_from(order + "HH", image, 0x2E)
            header_format, symbol_size = order + "IIIIIIIIII", 16
        sections = [struct.unpack_from(header_format, image, section_offset + i * entry_size) for i in range(count)]
        names: list[str] = []
        for section in sections:
            if section[1] != _SHT_DYNSYM:
                continue
            table_offset, table_size, link = section[4], section[5], section[6]
            strings_offset, strings_size = sections[link][4], sections[link][5]
            for position in range(table_offset, table_offset + table_size, symbol_size):
                (name_offset,) = struct.unpack_from(order + "I", image, position)
                if name_offset == 0 or name_offset >= strings_size:
                    continue
                start = strings_offset + name_offset
                end = image.find(b"\0", start, strings_offset + strings_size)
                names.append(
                    image[start : end if end >= 0 else strings_offset + strings_size].decode("ascii", "replace")
                )
        return names
    except (struct.error, IndexError, ValueError) as exc:
        raise LlmcheckError(f"malformed ELF section table: {exc}", where=library) from exc


def uses_cxx11_abi(libatb: Path) -> bool:
    """Return whether ``libatb.so`` was built with ``_GLIBCXX_USE_CXX11_ABI=1`` (its Probe symbols say ``__cxx11``).

    A library without any ``Probe`` symbol predates ATB's dump hooks: nothing could be dumped.
    """
    probe_symbols = [name for name in dynamic_symbols(libatb) if "Probe" in name]
    if not probe_symbols:
        raise BackendUnavailableError(
            "libatb.so exports no atb::Probe symbols, so it has no dump hooks",
            where=libatb,
            hint="use an ATB release from 2023-12 or later",
        )
    return any("cxx11" in name for name in probe_symbols)


def _check_not_writable_by_others(library: Path) -> None:
    mode = library.stat().st_mode
    if mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise LlmcheckError(
            "probe library is writable by group or others; refusing to preload it",
            where=library,
            hint=f"chmod go-w {library}",
        )


def choose_probe(environ: dict[str, str] | os._Environ[str]) -> ProbeChoice:
    """Return the probe library to preload, or raise :class:`BackendUnavailableError` saying what is missing."""
    explicit = environ.get(PROBE_ENV)
    if explicit:
        path = Path(explicit)
        if not path.is_file():
            raise BackendUnavailableError(f"{PROBE_ENV} names no file", where=path)
        _check_not_writable_by_others(path)
        return ProbeChoice(path.absolute(), None, f"given by {PROBE_ENV}")
    toolkit = Path(environ.get("ASCEND_TOOLKIT_HOME") or DEFAULT_TOOLKIT_HOME)
    if not toolkit.is_dir():
        raise BackendUnavailableError(
            "no Ascend toolkit here: ASCEND_TOOLKIT_HOME is unset and /usr/local/Ascend/ascend-toolkit/latest "
            "does not exist"
            if "ASCEND_TOOLKIT_HOME" not in environ
            else "ASCEND_TOOLKIT_HOME is not a folder",
            where=toolkit,
            hint=f"source the CANN set_env.sh, or give the probe library with {PROBE_ENV}=PATH",
        )
    atb_home = environ.get("ATB_HOME_PATH")
    if not atb_home:
        raise BackendUnavailableError(
            "ATB_HOME_PATH is not set, so libatb.so's ABI cannot be checked",
            where=toolkit,
            hint="source ATB's set_env.sh (nnal/atb/set_env.sh)",
        )
    libatb = Path(atb_home) / "lib" / "libatb.so"
    if not libatb.is_file():
        raise BackendUnavailableError(
            "no libatb.so under ATB_HOME_PATH", where=libatb, hint="check ATB_HOME_PATH points at an ATB install"
        )
    abi = 1 if uses_cxx11_abi(libatb) else 0
    path = toolkit / PROBE_DIR / PROBE_NAMES[abi]
    if not path.is_file():
        raise BackendUnavailableError(
            f"the ABI-{abi} probe library is missing",
            where=path,
            hint=f"install a CANN toolkit that ships it, or set {PROBE_ENV}=PATH",
        )
    _check_not_writable_by_others(path)
    return ProbeChoice(path.absolute(), abi, f"libatb.so {'uses' if abi else 'does not use'} the C++11 ABI")
