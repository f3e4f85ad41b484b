"""msprobe's entry names, read as llmcheck record names.

msprobe names each dumped call in ``dump.json``:

* a module (level ``L0``): ``Module.{module path}.{class}.{forward|backward}.{call}``, e.g.
  ``Module.model.layers.2.mlp.LlamaMLP.forward.0`` -- the module path is the one
  ``named_modules()`` gives, the call counts that module's calls in the step;
* an API (level ``L1``): ``{api type}.{api}.{call}.{forward|backward}``, e.g.
  ``Functional.linear.20.forward`` -- the call counts that API's calls in the step.

llmcheck keys a module entry by its module path (the name llmcheck's own torch capture
gives it) and an API entry by ``{api type}.{api}``, so the same entry in two msprobe dumps,
and a module in an msprobe and an llmcheck dump, carry the same key. A backward entry gets
``/backward`` after the name.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Entry-name prefixes of modules (``Cell`` is msprobe's MindSpore spelling).
MODULE_PREFIXES = ("Module", "Cell")
DIRECTIONS = ("forward", "backward")
#: The name llmcheck's torch capture gives the model it was handed (a module path of "").
ROOT_MODULE = "root"
BACKWARD_SUFFIX = "/backward"


@dataclass(frozen=True, slots=True)
class EntryName:
    """One ``dump.json`` entry name taken apart: the record name, its type, its call index and direction."""

    name: str
    op_type: str
    call_index: int
    direction: str
    is_module: bool

    @property
    def record_name(self) -> str:
        """Return the name records of this entry carry (``/backward`` appended for the backward pass)."""
        return self.name + (BACKWARD_SUFFIX if self.direction == "backward" else "")


def parse_entry_name(entry: str) -> EntryName:
    """Return the parts of an msprobe entry name; a name outside both grammars is kept whole, call 0."""
    parts = entry.split(".")
    if parts[0] in MODULE_PREFIXES and len(parts) >= 4 and parts[-2] in DIRECTIONS and parts[-1].isdigit():
        path = ".".join(parts[1:-3])
        return EntryName(path or ROOT_MODULE, parts[-3], int(parts[-1]), parts[-2], True)
    if len(parts) >= 4 and parts[-1] in DIRECTIONS and parts[-2].isdigit():
        api = ".".join(parts[:-2])
        return EntryName(api, api, int(parts[-2]), parts[-1], False)
    return EntryName(entry, entry, 0, "forward", parts[0] in MODULE_PREFIXES)


def parent_name(construct_parent: str | None) -> str | None:
    """Return the record name of a ``construct.json`` parent entry (a module's path), or None for the root."""
    if not construct_parent:
        return None
    return parse_entry_name(construct_parent).record_name
