"""Options a capture backend declares for ``llmcheck dump`` (pytest's ``pytest_addoption``, tox's ``tox_add_option``).

Why: a backend's flags are its own business. The core builds ``dump``'s command line from
what the chosen backend declares through
:func:`~llmcheck.core.hookspecs.llmcheck_register_backend_options`, shows them under
``llmcheck dump --backend NAME --help``, checks each value with the option's own
``parse`` (one usage error naming the flag), and hands the values to the backend as
``CaptureRequest.options[option.name]``. A new flag is a plugin edit, never a core one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

#: ``dump``'s own parameters (every backend has them): no backend option may take these names.
RESERVED_NAMES = frozenset({"backend", "exec_text", "output", "log_level", "command", "help"})
#: The value types an option may take; ``bool`` is a flag without a value.
OPTION_TYPES = (str, int, float, bool)


@dataclass(frozen=True, slots=True)
class BackendOption:
    """One flag of ``llmcheck dump --backend BACKEND``.

    ``name`` is the key of the value in ``CaptureRequest.options`` and, with ``_`` as ``-``,
    the long flag (``save_time`` -> ``--save-time``); ``aliases`` are other spellings (the
    seed tool's ``-time``). ``type`` is ``str``, ``int``, ``float`` or ``bool`` (a flag that
    takes no value). ``choices`` limits the values; ``multiple`` makes the flag repeatable,
    and also accepts the seed's space-separated lists (``--type model tensor``), giving a
    list. ``parse(value, flag)`` checks and converts the value the user gave (or the
    default) and raises a :class:`~llmcheck.core.errors.UsageError` naming ``flag`` when
    it is wrong; without it the value arrives as typed.
    """

    backend: str
    name: str
    help: str
    type: type = str
    default: Any = None
    choices: tuple[str, ...] | None = None
    multiple: bool = False
    aliases: tuple[str, ...] = ()
    parse: Callable[[Any, str], Any] | None = None

    @property
    def flag(self) -> str:
        """Return the long flag: ``--save-time``."""
        return "--" + self.name.replace("_", "-")

    @property
    def flags(self) -> tuple[str, ...]:
        """Return every spelling, aliases first: ``("-time", "--save-time")``."""
        return (*self.aliases, self.flag)

    @property
    def flag_text(self) -> str:
        """Return the spellings as errors name them: ``-time/--save-time``."""
        return "/".join(self.flags)

    def value(self, given: Any) -> Any:
        """Return the value the backend receives for what the user gave (a list when ``multiple``)."""
        if self.multiple:
            given = list(given or ())
        return self.parse(given, self.flag_text) if self.parse is not None else given


def option_problem(option: BackendOption) -> str | None:
    """Return what is wrong with a declared option (a plugin bug), or ``None`` when it can become a flag."""
    if not option.name.isidentifier() or option.name in RESERVED_NAMES:
        return f"its name {option.name!r} is not an identifier or is one of dump's own ({', '.join(sorted(RESERVED_NAMES))})"
    if option.type not in OPTION_TYPES:
        return f"its type {option.type!r} is not one of str, int, float, bool"
    if any(not alias.startswith("-") for alias in option.aliases):
        return "an alias does not start with '-'"
    return None


def option_values(declared: Sequence[BackendOption], given: Mapping[str, Any]) -> dict[str, Any]:
    """Return every declared option's value, parsed, by name; an option the user left out gets its default."""
    return {option.name: option.value(given.get(option.name, option.default)) for option in declared}
