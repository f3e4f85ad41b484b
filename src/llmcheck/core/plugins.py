"""The plugin manager and the one typed facade through which the core calls hooks.

Plugins are found through the ``llmcheck`` entry-point group -- the built-in ones too, so a
third-party package joins exactly the way they do. Loading is lazy (on the first call to
:func:`get_plugins`) and checked (``check_pending`` catches a misspelt hook name).

Environment variables:

* ``LLMCHECK_LOAD_PLUGINS`` -- comma-separated allow-list of plugin names; only these load
  (an empty value loads none).
* ``LLMCHECK_DISABLE_PLUGINS`` -- comma-separated block-list.
* ``LLMCHECK_TRACE_PLUGINS`` -- set to ``1`` to log every hook call and result to stderr.

A name in either list that no installed plugin has is a warning naming the variable, the
name, the closest installed name and every installed one (a typo would otherwise load the
wrong set of plugins without a word). A plugin from another distribution is held to its
contract by name: a hook it implements that does not exist, or an exception one of its hooks
raises, is one error line naming the plugin, the hook, and ``LLMCHECK_DISABLE_PLUGINS=name``.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from types import ModuleType
from typing import Any

import pluggy

from llmcheck.core import hookspecs
from llmcheck.core.capture.backend_options import BackendOption, option_problem
from llmcheck.core.dumps.dump_paths import (
    inside_dump,
    only_behind_folder_links,
    read_dump_file,
    unresolvable_path,
    walk_files,
)
from llmcheck.core.errors import (
    DumpFormatError,
    DumpNotFoundError,
    LlmcheckError,
    PluginError,
    UsageError,
    closest_name,
)
from llmcheck.core.records import (
    CaptureBackend,
    Dump,
    MetricSpec,
    OpReference,
    Pair,
    RecordKey,
    SourceInfo,
    TensorRecord,
    UserMapping,
)
from llmcheck.core.reporting.reporters import Reporter

ENTRY_POINT_GROUP = "llmcheck"
#: The distribution of the built-in plugins: an exception out of one of their hooks is a bug in llmcheck.
BUILTIN_DISTRIBUTION = "llmcheck"
#: The source name of a folder no plugin claims, read as the tensor files directly in it.
TENSOR_FOLDER_SOURCE = "tensor-folder"


@dataclass(frozen=True)
class PluginInfo:
    """What ``llmcheck plugins`` shows of one plugin."""

    name: str
    distribution: str | None
    version: str | None
    hooks: tuple[str, ...]

    def as_json(self) -> dict[str, Any]:
        """Return the plugin as the JSON object ``llmcheck plugins --json`` prints."""
        return {
            "name": self.name,
            "distribution": self.distribution,
            "version": self.version,
            "hooks": list(self.hooks),
        }


log = logging.getLogger("llmcheck.plugins")
#: The warnings this process has given, so a facade built again (tests rebuild it) does not repeat them.
_warned: set[str] = set()


def _names_from_env(variable: str) -> set[str] | None:
    value = os.environ.get(variable)
    if value is None:
        return None
    return {name.strip() for name in value.split(",") if name.strip()}


def _warn(message: str) -> None:
    """Log ``message`` once per process; printed as the CLI's log lines are, even before logging is set up."""
    if message in _warned:
        return
    _warned.add(message)
    if log.hasHandlers():
        log.warning(message)
    else:  # plugins load while the CLI parses its arguments, before a command configures logging
        print(f"llmcheck: WARNING: {message}", file=sys.stderr)


def _did_you_mean(name: str, known: Sequence[str]) -> str:
    """Return ``"did you mean 'x'? "`` for the closest of ``known`` to ``name``, or ``""`` when none is close."""
    close = closest_name(name, known)
    return f"did you mean {close!r}? " if close else ""


def _warn_unknown_names(variable: str, names: set[str] | None, installed: Sequence[str]) -> None:
    """Warn about each name in ``variable`` that no installed plugin has (so it selects nothing)."""
    unknown = sorted((names or set()) - set(installed))
    consequence = "ignored"
    if variable == "LLMCHECK_LOAD_PLUGINS" and names and len(unknown) == len(names):
        consequence = f"ignored; no name in {variable} is installed, so no plugin is loaded"
    for name in unknown:
        _warn(
            f"{variable}: unknown plugin {name!r}, {consequence} "
            f"({_did_you_mean(name, installed)}installed plugins: {', '.join(installed) or 'none'})"
        )


def _plugin_label(name: str, info: PluginInfo | None) -> str:
    """Return how an error names a plugin: ``'maxulp' (llmcheck-maxulp 1.2.3)``."""
    if info is None or info.distribution is None:
        return repr(name)
    return f"{name!r} ({info.distribution} {info.version})"


def _disable_hint(name: str, info: PluginInfo | None, before: str) -> str:
    """Return ``before`` and how to run without an entry-point plugin (one registered in code has no switch)."""
    return f"{before}, or set LLMCHECK_DISABLE_PLUGINS={name} to run without it" if info is not None else before


def _check_hook_names(manager: pluggy.PluginManager, infos: Mapping[str, PluginInfo]) -> None:
    """Raise a plugin error for the first hook implementation whose name is no llmcheck hook, with the closest one."""
    hook_names = sorted(name for name in dir(hookspecs) if manager.parse_hookspec_opts(hookspecs, name) is not None)
    for name, plugin in manager.list_name_plugin():
        for caller in manager.get_hookcallers(plugin) or []:
            if caller.has_spec() or all(impl.optionalhook for impl in caller.get_hookimpls() if impl.plugin is plugin):
                continue
            info = infos.get(name)
            raise PluginError(
                f"plugin {_plugin_label(name, info)} implements {caller.name}, a hook that does not exist",
                hint=_did_you_mean(caller.name, hook_names) + _disable_hint(name, info, "rename it in the plugin"),
            )
    try:  # pluggy's own check, for anything the loop above does not see
        manager.check_pending()
    except pluggy.PluginValidationError as exc:
        raise PluginError(f"a plugin implements a hook that does not exist: {exc}") from exc


def _blame_plugin_for_its_exceptions(manager: pluggy.PluginManager, name: str, info: PluginInfo | None) -> None:
    """Make an exception out of the plugin's hooks a plugin error naming it, the hook and how to turn it off.

    An :class:`LlmcheckError` a hook raises (a ``UsageError`` about a value) passes unchanged:
    it is the plugin's own message to the user. Anything else is a bug in the plugin, which
    the CLI would otherwise report as an internal error of llmcheck.
    """
    plugin = manager.get_plugin(name)
    for caller in manager.get_hookcallers(plugin) or []:
        for impl in caller.get_hookimpls():
            if impl.plugin is not plugin or impl.hookwrapper or impl.wrapper:
                continue  # a wrapper re-raises what the implementations it wraps raised
            # pluggy calls ``impl.function``; replacing it keeps the arguments pluggy read from the original
            impl.function = _blaming(impl.function, name, caller.name, info)  # type: ignore[misc]  # Final in pluggy's stubs


def _blaming(function: Callable[..., Any], name: str, hook_name: str, info: PluginInfo | None) -> Callable[..., Any]:
    @functools.wraps(function)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return function(*args, **kwargs)
        except LlmcheckError:
            raise
        except Exception as exc:
            raise PluginError(
                f"plugin {_plugin_label(name, info)} failed in its {hook_name} hook: {type(exc).__name__}: {exc}",
                hint=_disable_hint(name, info, "a bug in that plugin, not in llmcheck: fix it")
                + "; rerun with -l debug for the traceback to report to its authors",
            ) from exc

    return call


class Plugins:
    """The typed facade over the pluggy manager: call sites read as plain method calls."""

    def __init__(self, manager: pluggy.PluginManager, infos: dict[str, PluginInfo]) -> None:
        self.manager = manager
        self._infos = infos
        self._backends: dict[str, CaptureBackend] | None = None
        self._sources: dict[str, SourceInfo] | None = None
        self._metrics: dict[str, MetricSpec] | None = None
        self._op_references: dict[str, OpReference] | None = None
        self._reporters: dict[str, Reporter] | None = None
        self._backend_options: list[BackendOption] | None = None
        self._mapping_rules: dict[str, str] | None = None

    # --- listing ---

    def infos(self) -> list[PluginInfo]:
        """Return every loaded plugin with its distribution, version and implemented hooks."""
        result = []
        for name, plugin in self.manager.list_name_plugin():
            if plugin is None or name == "hookspecs":
                continue
            hooks = tuple(
                sorted(
                    impl_name
                    for impl_name in dir(plugin)
                    if impl_name.startswith("llmcheck_")
                    and self.manager.parse_hookimpl_opts(plugin, impl_name) is not None
                )
            )
            base = self._infos.get(name, PluginInfo(name, None, None, ()))
            result.append(PluginInfo(base.name, base.distribution, base.version, hooks))
        return sorted(result, key=lambda info: info.name)

    # --- registries ---

    def capture_backends(self) -> dict[str, CaptureBackend]:
        """Return every registered dump backend by name."""
        if self._backends is None:
            self._backends = self._collect(self.manager.hook.llmcheck_register_capture_backends, "capture backend")
        return self._backends

    def capture_backend(self, name: str | None) -> CaptureBackend:
        """Return the backend named ``name``, or for ``None`` the one backend that declares itself the default.

        A backend declares itself the default with a true ``is_default`` attribute (the
        built-in ``torch`` backend does); the core names no backend itself.
        """
        backends = self.capture_backends()
        known = ", ".join(sorted(backends)) or "none"
        if name is None:
            defaults = [backend for backend in backends.values() if getattr(backend, "is_default", False)]
            if len(defaults) != 1:
                raise UsageError(
                    "no default dump backend"
                    if not defaults
                    else f"several backends claim to be the default ({', '.join(b.name for b in defaults)})",
                    where="--backend",
                    hint=f"name one with --backend NAME; available: {known}",
                )
            return defaults[0]
        if name not in backends:
            raise UsageError(f"unknown backend {name!r}", where="--backend", hint=f"available: {known}")
        return backends[name]

    def sources(self) -> dict[str, SourceInfo]:
        """Return every dump kind a loader answers to, by name."""
        if self._sources is None:
            self._sources = self._collect(self.manager.hook.llmcheck_register_sources, "dump source")
        return self._sources

    def metrics(self) -> dict[str, MetricSpec]:
        """Return every registered metric by name, in registration order."""
        if self._metrics is None:
            self._metrics = self._collect(self.manager.hook.llmcheck_register_metrics, "metric")
        return self._metrics

    def op_references(self) -> dict[str, OpReference]:
        """Return every registered operator reference by op type."""
        if self._op_references is None:
            self._op_references = self._collect(self.manager.hook.llmcheck_register_op_references, "operator reference")
        return self._op_references

    def op_reference(self, op_type: str) -> OpReference | None:
        """Return the reference that computes ``op_type``: the registered one, else a resolver's, else ``None``."""
        registered = self.op_references().get(op_type)
        if registered is not None:
            return registered
        resolved = self.manager.hook.llmcheck_resolve_op_reference(op_type=op_type)
        return resolved if isinstance(resolved, OpReference) else None

    def reporters(self) -> dict[str, Reporter]:
        """Return every registered compare output format by name, in registration order."""
        if self._reporters is None:
            self._reporters = self._collect(self.manager.hook.llmcheck_register_reporters, "reporter")
        return self._reporters

    def mapping_rules(self) -> dict[str, str]:
        """Return every rule name a ``--mapping`` file's rule entries may use, in registration order."""
        if self._mapping_rules is None:
            self._mapping_rules = self._collect(
                self.manager.hook.llmcheck_register_mapping_rules, "mapping rule", lambda name: [name]
            )
        return self._mapping_rules

    def backend_options(self, backend: str | None = None) -> list[BackendOption]:
        """Return the ``dump`` options declared for ``backend`` (every backend's when ``None``), in registration order."""
        if self._backend_options is None:

            def spellings(option: BackendOption) -> list[str]:
                problem = option_problem(option)
                if problem is not None:
                    raise PluginError(
                        f"backend option {option.flag!r} of backend {option.backend!r} cannot be a flag: {problem}",
                        hint="fix the plugin's llmcheck_register_backend_options",
                    )
                return [f"{option.backend} {spelling}" for spelling in (*option.flags, option.name)]

            self._backend_options = list(
                self._collect(self.manager.hook.llmcheck_register_backend_options, "backend option", spellings).values()
            )
        return [option for option in self._backend_options if backend is None or option.backend == backend]

    def _collect(
        self, hook: Any, what: str, keys: Callable[[Any], Sequence[str]] = lambda item: [item.name]
    ) -> dict[str, Any]:
        """Call a registry hook plugin by plugin, so a clash (any of an item's ``keys`` taken) names both plugins."""
        found: dict[str, Any] = {}
        owners: dict[str, str] = {}
        for impl in reversed(hook.get_hookimpls()):  # pluggy's call order: last registered first (LIFO)

            def register(item: Any, _owner: str = impl.plugin_name) -> None:
                item_keys = keys(item)
                for key in item_keys:
                    if key in owners:
                        raise PluginError(
                            f"{what} {key!r} is registered by both {owners[key]!r} and {_owner!r}",
                            hint="disable one with LLMCHECK_DISABLE_PLUGINS",
                        )
                owners.update(dict.fromkeys(item_keys, _owner))
                found[item_keys[0]] = item

            # One plugin at a time, through pluggy (so LLMCHECK_TRACE_PLUGINS still sees the call),
            # lets ``register`` know whose item it is receiving.
            hook_caller = self.manager.subset_hook_caller(
                hook.name, remove_plugins=[other.plugin for other in hook.get_hookimpls() if other is not impl]
            )
            hook_caller(register=register)
        return found

    # --- resolvers ---

    def load_tensors(
        self,
        path: Path,
        source: str | None = None,
        source_flag: str = "--golden-source/--my-source",
        *,
        tensor_folder: bool = True,
    ) -> Dump:
        """Return the dump at ``path`` as read by the first plugin that claims it.

        ``source`` forces one source plugin; ``source_flag`` is the flag that forced it, named
        in the error when the path is not that kind of dump (which then says what it is).
        A folder no plugin claims is read, when ``tensor_folder``, as a *folder of tensor
        files*: each file directly in it that a plugin reads as one tensor is a record
        named by its file name (a manual mapping's ``-mp`` folder of ``.bin``/``.npy`` files).
        """
        path = Path(path)
        if source is not None and source not in self.sources():
            known = ", ".join(sorted(self.sources())) or "none"
            raise UsageError(f"unknown dump source {source!r}", where=path, hint=f"known sources: {known}")
        try:
            path.stat()
        except (FileNotFoundError, NotADirectoryError):
            raise DumpNotFoundError(
                "no such file or directory",
                where=path,
                hint="check the path: give a dump folder, a folder holding one dump, or a tensor file",
            ) from None
        except OSError as exc:  # a loop, a name too long for the system, no permission
            raise unresolvable_path(exc, path) from None
        dump: Dump | None = self.manager.hook.llmcheck_load_tensors(path=path, source=source)
        if dump is None and source is None and tensor_folder and path.is_dir():
            dump = self._tensor_folder(path)
        if dump is not None:
            return dump
        known = ", ".join(sorted(self.sources())) or "none"
        links = _folder_links_in(path)
        if links:  # the one rule of every source: a folder link in a dump is never entered
            raise only_behind_folder_links(path, links)
        if source is None:
            raise DumpNotFoundError(
                "no plugin recognises this as a dump",
                where=path,
                hint=f"known sources: {known}; 'llmcheck plugins' lists what each reads",
            )
        actual = self._what_it_is(path)
        if actual is None:
            raise DumpNotFoundError(
                f"not a {source} dump, nor any other kind llmcheck reads",
                where=path,
                hint=f"check the path; known sources: {known}",
            )
        name, what = actual
        raise DumpNotFoundError(
            f"not a {source} dump: it is {what}",
            where=path,
            hint=f"drop {source_flag} to read it as {name}, or give the path of the {source} dump",
        )

    def load_runs(
        self, golden_path: Path, golden_source: str | None, my_path: Path, my_source: str | None
    ) -> tuple[Dump, Dump]:
        """Return the golden and my dumps; when both paths are wrong, one error names both problems."""
        loaded: list[Dump] = []
        problems: list[LlmcheckError] = []
        from llmcheck.core.dumps.store import sharing_record_keys

        sides = ((golden_path, golden_source, "--golden-source"), (my_path, my_source, "--my-source"))
        with sharing_record_keys():  # the runs name the same tensors: one key object for both
            for path, source, flag in sides:
                try:
                    loaded.append(self.load_tensors(path, source, flag))
                except LlmcheckError as exc:
                    problems.append(exc)
        # the same path given twice fails twice alike: said once
        lines = list(dict.fromkeys(problem.one_line() for problem in problems))
        if len(lines) == 1:
            raise problems[0]
        if problems:
            both = LlmcheckError("; ".join(lines))
            both.exit_code = max(problem.exit_code for problem in problems)
            raise both
        return loaded[0], loaded[1]

    def _what_it_is(self, path: Path) -> tuple[str, str] | None:
        """Return the source name that reads ``path`` and words for what it holds (``an llmcheck torch dump``)."""
        try:
            dump = self.manager.hook.llmcheck_load_tensors(path=path, source=None)
        except LlmcheckError:
            return None
        if dump is None:
            return None
        backend = dump.manifest.get("backend")
        if isinstance(backend, str) and backend:
            article = "an" if dump.source[:1].lower() in "aefilmnorsx" else "a"  # as spoken: "an llmcheck", "an fx"
            return dump.source, f"{article} {dump.source} {backend} dump"
        return dump.source, f"what source {dump.source!r} reads ({self.sources()[dump.source].description})"

    def _tensor_folder(self, folder: Path) -> Dump | None:
        """Return the tensor files directly in ``folder`` as one dump, or ``None`` when it holds none."""
        records: list[TensorRecord] = []
        for file in sorted(entry for entry in folder.iterdir() if entry.is_file()):
            single = self.manager.hook.llmcheck_load_tensors(path=file, source=None)
            with_data = [record for record in single.records if record.data is not None] if single else []
            if len(with_data) == 1:
                records.append(
                    with_data[0].with_changes(key=RecordKey(name=file.name), order=len(records), source_path=file.name)
                )
        if not records:
            return None
        return Dump(
            source=TENSOR_FOLDER_SOURCE,
            root=folder,
            records=records,
            manifest={"format": TENSOR_FOLDER_SOURCE, "files": [record.source_path for record in records]},
        )

    def map_pairs(self, golden: Dump, my: Dump, user_mapping: UserMapping | None) -> Sequence[Pair]:
        """Return every pair proposed by every plugin (the core resolves competing proposals).

        One plugin's proposals alone are returned as the sequence it gave (a table of pairs in
        order stays one, not a list of pair objects made from it).
        """
        given: list[Sequence[Pair]] = [
            pairs
            for pairs in self.manager.hook.llmcheck_map_pairs(golden=golden, my=my, user_mapping=user_mapping)
            if pairs
        ]
        if len(given) == 1:
            return given[0]
        return [pair for pairs in given for pair in pairs]

    def claimed_dump(self, folder: Path) -> Dump:
        """Return the dump a plugin reads ``folder`` as, raising :class:`DumpNotFoundError` when none claims it.

        A folder of loose tensor files is not claimed: reports may go there (what ``-o`` is checked with).
        """
        return self.load_tensors(folder, tensor_folder=False)

    def noise_twin_command(self, golden: Dump, precision: str, output_dir: Path) -> str | None:
        """Return the command that records ``golden``'s noise twin at ``precision``, from the plugin of its capture, or None."""
        command: str | None = self.manager.hook.llmcheck_noise_twin_command(
            golden=golden, precision=precision, output_dir=output_dir
        )
        return command

    def export_onnx(self, topology_path: Path, level: int, output_path: Path | None) -> Path:
        """Return the ONNX file written from a topology file by the first plugin that claims it."""
        topology_path = Path(topology_path)
        if topology_path.is_dir():
            # the documented layout of a dump's topologies (docs/commands/export.md): name them, do not guess one
            found = sorted([*topology_path.glob("layer/*/*.json"), *topology_path.glob("model/*/*.json")])
            if len(found) == 1:
                hint = f"give its topology file {found[0]}"
            elif found:
                hint = f"give one of its {len(found)} topology files, e.g. {found[0]}"
            else:
                hint = "give a topology file, such as a dump's layer/{pid}/NAME.json or model/{pid}/NAME.json"
            raise DumpNotFoundError("is a folder, not a topology file", where=topology_path, hint=hint)
        inside_dump(topology_path, None)  # a FIFO, a device, a loop: one error naming it, never a hang
        if not topology_path.is_file():
            raise DumpNotFoundError(
                "no such topology file",
                where=topology_path,
                hint="check the path; a dump's topology is its layer/model JSON file",
            )
        if output_path is not None:
            _check_onnx_output(Path(output_path), topology_path)
        written = self.manager.hook.llmcheck_export_onnx(
            topology_path=topology_path, level=level, output_path=output_path
        )
        if written is None:
            _raise_if_broken_json(topology_path)
            raise DumpNotFoundError(
                "no plugin recognises this topology file",
                where=topology_path,
                hint="llmcheck export onnx reads ATB layer/model topology JSON",
            )
        return Path(written)


def _check_onnx_output(output_path: Path, topology_path: Path) -> None:
    """Refuse an ONNX output that would overwrite the topology, a non-ONNX file, or write into a dump."""
    from llmcheck.core.dumps.store import refuse_output_inside_dump

    if output_path.resolve() == topology_path.resolve():
        raise UsageError(
            "is the topology file itself; it would be overwritten",
            where=output_path,
            hint="pass another -o, or omit it to write beside the topology",
        )
    if output_path.exists() and (output_path.is_dir() or output_path.suffix.lower() != ".onnx"):
        raise UsageError(
            "exists and is not an .onnx file; it would be overwritten",
            where=output_path,
            hint="pass a new .onnx path with -o",
        )
    refuse_output_inside_dump(output_path, "ONNX exports")


def _raise_if_broken_json(path: Path) -> None:
    """Raise a format error naming the byte where a ``.json`` file stops being JSON (why nobody claimed it)."""
    if path.suffix.lower() != ".json":
        return
    try:
        json.loads(read_dump_file(path, None))
    except json.JSONDecodeError as exc:
        raise DumpFormatError(
            f"not valid JSON: {exc.msg}", where=path, offset=exc.pos, hint="the file is truncated or corrupt"
        ) from None
    except RecursionError:
        raise DumpFormatError(
            "JSON nested too deep to read", where=path, hint="the file is truncated or corrupt"
        ) from None
    except (UnicodeDecodeError, OSError):
        return


def _trace_to_stderr(manager: pluggy.PluginManager) -> None:
    def before(hook_name: str, hook_impls: Sequence[pluggy.HookImpl], kwargs: Mapping[str, Any]) -> None:
        names = [impl.plugin_name for impl in hook_impls]
        print(f"llmcheck: trace: {hook_name}({', '.join(kwargs)}) -> {names}", file=sys.stderr)

    def after(
        outcome: pluggy.Result[Any], hook_name: str, hook_impls: Sequence[pluggy.HookImpl], kwargs: Mapping[str, Any]
    ) -> None:
        exception = outcome.exception
        shown = f"raised {exception!r}" if exception else f"returned {type(outcome.get_result()).__name__}"
        print(f"llmcheck: trace: {hook_name} {shown}", file=sys.stderr)

    manager.add_hookcall_monitoring(before, after)


def build_plugins(extra_plugins: list[ModuleType | object] | None = None) -> Plugins:
    """Return a fresh facade with every allowed entry-point plugin (and ``extra_plugins``) loaded."""
    manager = pluggy.PluginManager(hookspecs.PROJECT_NAME)
    manager.add_hookspecs(hookspecs)
    allow = _names_from_env("LLMCHECK_LOAD_PLUGINS")
    block = _names_from_env("LLMCHECK_DISABLE_PLUGINS") or set()
    entry_points = list(metadata.entry_points(group=ENTRY_POINT_GROUP))
    installed = sorted({entry_point.name for entry_point in entry_points})
    _warn_unknown_names("LLMCHECK_LOAD_PLUGINS", allow, installed)
    _warn_unknown_names("LLMCHECK_DISABLE_PLUGINS", block, installed)
    infos: dict[str, PluginInfo] = {}
    for entry_point in entry_points:
        name = entry_point.name
        if (allow is not None and name not in allow) or name in block or manager.has_plugin(name):
            continue
        try:
            plugin = entry_point.load()
        except Exception as exc:  # a broken third-party plugin must not take the tool down silently
            raise PluginError(
                f"plugin {name!r} failed to import: {exc}",
                where=entry_point.value,
                hint=f"uninstall it or set LLMCHECK_DISABLE_PLUGINS={name}",
            ) from exc
        manager.register(plugin, name=name)
        dist = entry_point.dist
        infos[name] = PluginInfo(name, dist.name if dist else None, dist.version if dist else None, ())
        if infos[name].distribution != BUILTIN_DISTRIBUTION:
            _blame_plugin_for_its_exceptions(manager, name, infos[name])
    for plugin in extra_plugins or []:
        extra_name = manager.register(plugin)
        if extra_name is not None:
            _blame_plugin_for_its_exceptions(manager, extra_name, None)
    _check_hook_names(manager, infos)
    if os.environ.get("LLMCHECK_TRACE_PLUGINS", "") not in ("", "0"):
        _trace_to_stderr(manager)
    return Plugins(manager, infos)


_plugins: Plugins | None = None


def get_plugins() -> Plugins:
    """Return the process-wide facade, loading plugins on first use."""
    global _plugins
    if _plugins is None:
        _plugins = build_plugins()
    return _plugins


def load_dump(path: Path, source: str | None = None) -> Dump:
    """Return the dump at ``path`` as the installed plugins read it (for a plugin whose files name other dumps).

    Raises :class:`~llmcheck.core.errors.DumpNotFoundError` when no plugin reads it.
    """
    return get_plugins().load_tensors(Path(path), source)


def set_plugins(plugins: Plugins) -> None:
    """Make ``plugins`` the process-wide facade (the test kit uses this to add temporary plugins)."""
    global _plugins
    _plugins = plugins


def reset_plugins() -> None:
    """Forget the loaded plugins so the next :func:`get_plugins` loads them anew (tests, env changes)."""
    global _plugins
    _plugins = None


#: How deep below a path that no plugin reads folder links are looked for (every source's run folders lie within).
FOLDER_LINK_SEARCH_DEPTH = 3


def _folder_links_in(path: Path) -> list[Path]:
    """Return the folder links a few levels below ``path`` (a walk never enters them)."""
    if not path.is_dir():
        return []
    links: list[tuple[Path, str]] = []
    for _ in walk_files(path, links, max_depth=FOLDER_LINK_SEARCH_DEPTH):
        pass  # the walk collects the links
    return [link for link, _ in links]
