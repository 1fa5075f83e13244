"""One typed registry for every extension point: the one way a name becomes an object.

Importers, domains, capability task builders, environments, environment generators,
embedding encoders, chat templates, base-model sources, policy-server kinds, labelers,
LLM providers, job backends, job kinds and target task sets are each a `Registry` (`ENTRY_POINT_GROUPS`
lists the ones that take plugins).

    LABELERS: Registry[LabelerFactory] = Registry(
        "labeler", group="trace_workbench.labelers",
        builtins={"heuristic": "trace_lib.diagnose.labelers.heuristic:HeuristicLabeler"})
    LABELERS.get("heuristic")          # imports the module on first use
    LABELERS.names()                   # built-ins, then registered, then entry points
    LABELERS.register("mine", MyLabeler)

Design decisions
- A value is either the object itself or a "module:attribute" string imported on first
  `get`, so listing names never imports an SDK or a third party's package (the CLI's
  choices and the app's pickers list names only). Built-ins defined in another module
  are such strings, so no module registers anything by being imported (and the module
  that owns a registry never imports the modules it lists: no import circles). A string
  value is always a target, never the object itself: a registry of strings (chat
  templates) names them ("module:CONSTANT"); what an entry point loads is taken as is.
- Third parties plug in the way the Python ecosystem does: an entry point in their
  distribution's metadata, e.g. in their pyproject.toml
  `[project.entry-points."trace_workbench.labelers"] mine = "my_pkg.labeler:MyLabeler"`.
  `importlib.metadata.entry_points(group=...)` is read once, when a name is first looked
  up, and the entry point itself is loaded only when its name is asked for.
- Precedence is explicit. Names list built-ins, then in-process registrations, then entry
  points. `register` of a taken name needs `replace=True` (then it wins, in this process
  only); an entry point never replaces a built-in or another entry point (it is skipped
  and reported by `conflicts()`), so installing a package cannot silently change what
  a name means.
- An unknown name is a clear error listing the known ones ("unknown labeler 'x';
  expected one of: anthropic, heuristic, openai"), raised as the caller's error type
  (the LLM layer raises `LLMError`, everything else `UserInputError`). A lookup function
  whose message users already know (`get_domain`, `chat_template_for`, `get_importer`,
  `make_policy_server`, ...) checks `name in REGISTRY` first and keeps its words.
- A broken entry point (its module does not import, the attribute is missing) is an error
  that names the distribution's entry point, raised when that name is used, never when
  another name is listed or used.
"""

from __future__ import annotations

import importlib
import importlib.metadata as metadata
import threading
from collections.abc import Iterator
from typing import Any, Generic, TypeVar

from trace_lib.errors import UserInputError

T = TypeVar("T")

# What a plugin's entry point in each group names (docs/CONTRIBUTING.md, "Extension points").
ENTRY_POINT_GROUPS = {
    "labelers": "trace_workbench.labelers",  # a factory taking keyword config -> Labeler
    "environments": "trace_workbench.environments",  # a zero-argument Environment factory
    "importers": "trace_workbench.importers",  # an Importer object
    "llm_providers": "trace_workbench.llm_providers",  # a factory -> LLMProvider
    "job_backends": "trace_workbench.job_backends",  # a zero-argument Backend factory
    "domains": "trace_workbench.domains",  # a Domain object
    "capabilities": "trace_workbench.capabilities",  # a CapabilitySpec (its task builders)
    "env_generators": "trace_workbench.env_generators",  # GenerationConfig -> EnvGenerator
    "encoders": "trace_workbench.encoders",  # a zero-argument Encoder factory
    "chat_templates": "trace_workbench.chat_templates",  # a Jinja chat template (str)
    "model_sources": "trace_workbench.model_sources",  # a ModelSource object
    "policy_servers": "trace_workbench.policy_servers",  # ServerRequest -> ServerHandle
    # (seed, total) -> (database, the first `total` tasks, scorer, total)
    "task_sets": "trace_workbench.task_sets",
}


def import_object(target: str, where: str = "") -> Any:
    """The attribute a "package.module:attr" string names (dots allowed in attr)."""
    module_name, sep, attr = target.partition(":")
    label = f"{where}: " if where else ""
    if not sep or not module_name or not attr:
        raise UserInputError(f"{label}{target!r} is not of the form 'package.module:attribute'")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise UserInputError(f"{label}cannot import module {module_name!r}: {exc}") from exc
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise UserInputError(f"{label}module {module_name!r} has no {attr!r}")
        obj = getattr(obj, part)
    return obj


class Registry(Generic[T]):
    """Names -> objects of one kind, with lazy imports and entry-point plugins."""

    def __init__(
        self,
        kind: str,
        *,
        group: str | None = None,
        builtins: dict[str, T | str] | None = None,
        error: type[Exception] = UserInputError,
    ) -> None:
        self.kind = kind
        self.group = group
        self.error = error
        self._builtin: dict[str, T | str] = dict(builtins or {})
        self._registered: dict[str, T | str] = {}
        self._entry_points: dict[str, metadata.EntryPoint] | None = None
        self._conflicts: list[str] = []
        self._loaded: dict[str, T] = {}
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ registering
    def register(self, name: str, obj: T | str, *, replace: bool = False) -> T | str:
        """Add `obj` (or a "module:attr" string) under `name`; returns `obj`."""
        if not name or not isinstance(name, str):
            raise self.error(f"{self.kind}: a name must be a non-empty string, got {name!r}")
        with self._lock:
            if not replace and (name in self._builtin or name in self._registered):
                raise self.error(
                    f"{self.kind} {name!r} is already registered; pass replace=True to replace it"
                )
            self._registered[name] = obj
            self._loaded.pop(name, None)
        return obj

    def unregister(self, name: str) -> None:
        """Remove an in-process registration (built-ins and entry points stay)."""
        with self._lock:
            self._registered.pop(name, None)
            self._loaded.pop(name, None)

    # --------------------------------------------------------------------- lookups
    def _plugins(self) -> dict[str, metadata.EntryPoint]:
        if self._entry_points is None:
            found: dict[str, metadata.EntryPoint] = {}
            conflicts: list[str] = []
            if self.group:
                for ep in metadata.entry_points(group=self.group):
                    if ep.name in self._builtin or ep.name in found:
                        conflicts.append(f"{ep.name} = {ep.value}")
                        continue
                    found[ep.name] = ep
            self._entry_points, self._conflicts = found, conflicts
        return self._entry_points

    def reload_entry_points(self) -> None:
        """Read the entry-point group again (after installing a plugin in this process)."""
        with self._lock:
            self._entry_points = None
            self._loaded = {k: v for k, v in self._loaded.items()
                            if k in self._builtin or k in self._registered}

    def conflicts(self) -> list[str]:
        """Entry points skipped because their name was taken ("name = module:attr")."""
        self._plugins()
        return list(self._conflicts)

    def names(self) -> list[str]:
        """Every known name: built-ins and registered ones in order, then entry points."""
        out = list(self._builtin)
        out += [n for n in self._registered if n not in self._builtin]
        out += [n for n in self._plugins() if n not in out]
        return out

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self.names()

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self.names())

    def source(self, name: str) -> str:
        """Where `name` comes from: "builtin", "registered" or "entry point DIST"."""
        if name in self._registered:
            return "registered"
        if name in self._builtin:
            return "builtin"
        ep = self._plugins().get(name)
        if ep is None:
            raise self.unknown(name)
        dist = getattr(ep, "dist", None)
        return f"entry point {dist.name if dist else ep.value}"

    def target(self, name: str) -> str | None:
        """The "module:attr" string behind `name`, when it has one (lazy entries, entry
        points): what a job spec can carry instead of the object."""
        for table in (self._registered, self._builtin):
            if name in table:
                value = table[name]
                return value if isinstance(value, str) else None
        ep = self._plugins().get(name)
        if ep is None:
            raise self.unknown(name)
        return ep.value

    def unknown(self, name: str) -> Exception:
        known = ", ".join(sorted(self.names())) or "(none)"
        return self.error(f"unknown {self.kind} {name!r}; expected one of: {known}")

    def get(self, name: str) -> T:
        """The object registered as `name`, importing it on first use."""
        if name in self._loaded:
            return self._loaded[name]
        if name in self._registered or name in self._builtin:
            value: Any = self._registered.get(name, self._builtin.get(name))
            if isinstance(value, str):
                try:
                    value = import_object(value, f"{self.kind} {name!r}")
                except UserInputError as exc:
                    raise self.error(str(exc)) from exc
        else:
            ep = self._plugins().get(name)
            if ep is None:
                raise self.unknown(name)
            where = f"{self.kind} {name!r} (entry point {ep.value!r} in group {self.group!r})"
            try:
                value = ep.load()  # the object the entry point names, a string included
            except Exception as exc:  # noqa: BLE001 - a third party's import error, named
                raise self.error(f"{where}: cannot load it: {type(exc).__name__}: {exc}") \
                    from exc
        with self._lock:
            self._loaded[name] = value
        return value

    def __getitem__(self, name: str) -> T:
        return self.get(name)

    def items(self) -> list[tuple[str, T]]:
        """(name, object) for every name, loading each (for "try each in turn" uses)."""
        return [(name, self.get(name)) for name in self.names()]

    def values(self) -> list[T]:
        return [self.get(name) for name in self.names()]

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, group={self.group!r}, names={self.names()!r})"
