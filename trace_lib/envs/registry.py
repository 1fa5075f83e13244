"""Where environments come from, and the one way a name becomes an environment.

    spec = catalog.resolve("airline/precondition_verification")  # app/CLI: may read the store
    job_config["env_spec"] = spec.to_json()                   # what a job receives
    spec = EnvSpec.from_json(job_config["env_spec"])          # inside the job: no store
    env = build_env(spec)                                     # in-process or sandboxed
    with open_environment(spec) as env:                       # same, closed on exit
        env.reset(0)

Design decisions
- One name space, four sources. Built-ins are "DOMAIN/CAPABILITY" (the capability task
  builders); generated ones are "DOMAIN/CAPABILITY/genN" rows of the `environments` table
  with their code; a path ending in .py is a module on disk (what `env validate PATH`
  checks before anything is stored); "package.module:Attr" (or a name another
  distribution registers under the `trace_workbench.environments` entry-point group) is
  your own trusted Environment class or factory, imported in-process (`python` source).
- One resolution path. `resolve_static` knows every name that needs no database; the app
  side's `envs.catalog.resolve` (behind `workbench.environments.resolve`; the only
  resolution that may open the store, and only for names `resolve_static` does not know)
  adds the stored generated ones. This module never imports the catalog or the store: it
  is what a job runs. `EnvSpec.to_json()` carries a spec, code included, into a job's
  spec; `build_env(spec)` is the single constructor every stage uses (training, gate
  training, composition, the pages). A job calls `spec_for_job`, which never opens the
  database: a name it cannot resolve without it is an error telling how to launch it.
- Built-ins and python factories are trusted code and run in-process. Generated and file
  environments run only in the sandbox; `build_env` is the single place that decides, so
  no caller can import generated code by accident.
- A serialised spec carries `code_sha256`; `from_json` recomputes it, so a spec whose code
  was edited by hand (or truncated) is refused instead of training on something else.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trace_lib.envs.protocol import Environment
from trace_lib.errors import UserInputError, check_fields
from trace_lib.registry import ENTRY_POINT_GROUPS, Registry, import_object

BUILTIN_VERSION = 1
SOURCES = ("builtin", "generated", "file", "python")
SANDBOXED = ("generated", "file")

# Third-party environments: name -> Environment class or zero-argument factory. Entry
# points of the group `trace_workbench.environments` appear here without any import.
ENVIRONMENTS: Registry[Callable[[], Environment]] = Registry(
    "environment", group=ENTRY_POINT_GROUPS["environments"]
)


@dataclass
class EnvSpec:
    name: str
    capability: str
    domain: str
    version: int
    source: str  # builtin | generated | file | python
    code: str | None = None  # for generated and file environments
    path: str | None = None
    description: str = ""
    factory: str | None = None  # "package.module:Attr" for python environments

    @property
    def code_sha256(self) -> str | None:
        return hashlib.sha256(self.code.encode("utf-8")).hexdigest() if self.code else None

    def to_dict(self) -> dict[str, Any]:
        """A summary for listings (no code)."""
        return {"name": self.name, "capability": self.capability, "domain": self.domain,
                "version": self.version, "source": self.source,
                "code_sha256": self.code_sha256, "path": self.path}

    def to_json(self) -> dict[str, Any]:
        """Everything a job needs to build this environment without the store."""
        out: dict[str, Any] = {"name": self.name, "capability": self.capability,
                               "domain": self.domain, "version": self.version,
                               "source": self.source}
        if self.code is not None:
            out["code"] = self.code
            out["code_sha256"] = self.code_sha256
        if self.factory:
            out["factory"] = self.factory
        if self.path:
            out["path"] = self.path
        if self.description:
            out["description"] = self.description
        return out

    @classmethod
    def from_json(cls, data: Any, where: str = "env_spec") -> EnvSpec:
        """The inverse of `to_json`, with a clear error naming the field at fault."""
        if not isinstance(data, dict):
            raise UserInputError(f"{where}: expected an object (a serialised environment "
                                 f"spec), got {type(data).__name__}")
        allowed = {"name", "capability", "domain", "version", "source", "code", "code_sha256",
                   "factory", "path", "description"}
        check_fields(data, allowed, where)
        for key in ("name", "source"):
            if not isinstance(data.get(key), str) or not data[key]:
                raise UserInputError(f"{where}: field `{key}` is required (a non-empty string)")
        source = data["source"]
        if source not in SOURCES:
            raise UserInputError(f"{where}: field `source` is {source!r}; expected one of "
                                 f"{', '.join(SOURCES)}")
        for key in ("capability", "domain", "description"):
            if not isinstance(data.get(key, ""), str):
                raise UserInputError(f"{where}: field `{key}` must be a string")
        version = data.get("version", BUILTIN_VERSION)
        if not isinstance(version, int) or isinstance(version, bool):
            raise UserInputError(f"{where}: field `version` is {version!r}; expected an integer")
        spec = cls(name=data["name"], capability=data.get("capability", ""),
                   domain=data.get("domain", ""), version=version, source=source,
                   code=data.get("code"), path=data.get("path"),
                   description=data.get("description", ""), factory=data.get("factory"))
        if source in SANDBOXED:
            if not isinstance(spec.code, str) or not spec.code.strip():
                raise UserInputError(f"{where}: a {source} environment ({spec.name!r}) needs "
                                     "its module's source in field `code`")
            sha = data.get("code_sha256")
            if sha is not None and sha != spec.code_sha256:
                raise UserInputError(f"{where}: field `code` does not match `code_sha256` "
                                     f"({spec.name!r}: the code was changed after it was "
                                     "serialised)")
        if source == "python" and not (isinstance(spec.factory, str) and ":" in spec.factory):
            raise UserInputError(f"{where}: a python environment ({spec.name!r}) needs field "
                                 "`factory` as 'package.module:Attr'")
        if source == "builtin" and (spec.domain, spec.capability) not in _builtin_pairs():
            raise UserInputError(f"{where}: built-in environment {spec.name!r} "
                                 f"({spec.domain}/{spec.capability}) does not exist here; "
                                 f"built-ins: {', '.join(builtin_names())}")
        return spec


def _builtin_pairs() -> list[tuple[str, str]]:
    from trace_lib.envs.capabilities import builtin_pairs

    return builtin_pairs()


def builtin_specs() -> list[EnvSpec]:
    from trace_lib.envs.capabilities import CAPABILITIES

    return [
        EnvSpec(name=f"{domain}/{cap}", capability=cap, domain=domain, version=BUILTIN_VERSION,
                source="builtin", description=CAPABILITIES[cap].description)
        for domain, cap in _builtin_pairs()
    ]


def builtin_names() -> list[str]:
    return [s.name for s in builtin_specs()]


# ------------------------------------------------------------------------ resolution
def resolve_static(name_or_path: str) -> EnvSpec | None:
    """The spec of a name that needs no database: a built-in, a .py file, a registered or
    entry-point environment, or "package.module:Attr". None for anything else."""
    for spec in builtin_specs():
        if spec.name == name_or_path:
            return spec
    if name_or_path.endswith(".py"):
        path = Path(name_or_path).expanduser()
        if not path.is_file():
            raise UserInputError(f"{path}: no such environment module file")
        return EnvSpec(name=path.stem, capability="", domain="", version=1, source="file",
                       code=path.read_text(encoding="utf-8"), path=str(path))
    if name_or_path in ENVIRONMENTS:
        factory = ENVIRONMENTS.target(name_or_path)
        if factory is None:  # registered as an object in this process
            obj = ENVIRONMENTS.get(name_or_path)
            factory = f"{obj.__module__}:{obj.__qualname__}"
        return EnvSpec(name=name_or_path, capability="", domain="", version=1,
                       source="python", factory=factory)
    if ":" in name_or_path:
        import_object(name_or_path, f"env {name_or_path!r}")  # fail here, not in the job
        return EnvSpec(name=name_or_path, capability="", domain="", version=1,
                       source="python", factory=name_or_path)
    return None


def unknown_name_error(name_or_path: str) -> UserInputError:
    """The error for a name no source knows (shared by the app side's store-backed
    `envs.catalog.resolve` and `require_static`)."""
    return UserInputError(
        f"environment {name_or_path!r}: not a built-in ({', '.join(builtin_names())}), not a "
        "stored generated environment, not a path to a .py module and not "
        "package.module:Attr")


def require_static(name_or_path: str) -> EnvSpec:
    """`resolve_static`, or an error naming the sources a name can come from."""
    spec = resolve_static(name_or_path)
    if spec is None:
        raise unknown_name_error(name_or_path)
    return spec


def spec_for_job(name: str, serialised: dict[str, Any] | None = None,
                 where: str = "config") -> EnvSpec:
    """The environment of a job: its serialised spec, else a name resolvable without the
    store. Never opens the database."""
    if serialised is not None:
        spec = EnvSpec.from_json(serialised, where=f"{where}.env_spec")
        if name and name != spec.name:
            raise UserInputError(f"{where}: field `env` is {name!r} but `env_spec` describes "
                                 f"{spec.name!r}")
        return spec
    spec = resolve_static(name)
    if spec is None:
        raise UserInputError(
            f"{where}: env {name!r}: not a built-in environment ({', '.join(builtin_names())}),"
            " not package.module:Attr, not a .py file, and the config carries no `env_spec` "
            "(a job never reads the store: launch generated environments from the app or the "
            "CLI, which put their serialised spec, code included, into the job spec)"
        )
    return spec


# ---------------------------------------------------------------------- construction
# The choices of each option; `distractors` is any integer >= 0 (checked on its own).
# Difficulty 4 and 5 are the target-shaped levels (airline only; `envs.curriculum`).
BUILD_OPTIONS = {"tools": ("capability", "all"), "policy": ("excerpt", "full"),
                 "difficulty": (1, 2, 3, 4, 5), "distractors": None}


def check_build_options(options: dict[str, Any] | None, where: str = "env") -> dict[str, Any]:
    """`tools`, `policy`, `difficulty`, `distractors` for a built-in (None values dropped);
    clear errors."""
    out = {k: v for k, v in (options or {}).items() if v is not None}
    for key, value in out.items():
        if key not in BUILD_OPTIONS:
            raise UserInputError(f"{where}: unknown build option {key!r}; expected one of "
                                 f"{', '.join(BUILD_OPTIONS)}")
        if key == "distractors":
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise UserInputError(f"{where}: distractors is {value!r}; expected an "
                                     "integer >= 0 (other domain tools shown with "
                                     "tools=capability)")
            continue
        if key == "difficulty":
            try:
                value = out[key] = int(value)
            except (TypeError, ValueError):
                value = None
        if value not in BUILD_OPTIONS[key]:
            raise UserInputError(f"{where}: {key} is {out[key]!r}; expected one of "
                                 f"{', '.join(map(str, BUILD_OPTIONS[key]))}")
    return out


def check_builtin_options(spec: EnvSpec, options: dict[str, Any] | None) -> dict[str, Any]:
    """`check_build_options`, and a target-shaped difficulty only on a domain that has it."""
    from trace_lib.envs.curriculum import TARGET_SHAPED_DOMAINS

    out = check_build_options(options, f"env {spec.name!r}")
    if out.get("difficulty", 0) >= 4 and spec.domain not in TARGET_SHAPED_DOMAINS:
        raise UserInputError(f"env {spec.name!r}: difficulty {out['difficulty']} "
                             "(target-shaped) exists for "
                             f"{', '.join(TARGET_SHAPED_DOMAINS)} only; use 1, 2 or 3")
    return out


def make_builtin(spec: EnvSpec, options: dict[str, Any] | None = None) -> Environment:
    """A built-in; `options`: tools=capability|all, policy=excerpt|full,
    difficulty=1..5 (4, 5: target-shaped, airline), distractors=N (defaults: all tools,
    full policy, difficulty 2, 2 distractors, as the environment was validated)."""
    from trace_lib.envs.capabilities import make_capability_env

    return make_capability_env(spec.domain, spec.capability,
                               **check_builtin_options(spec, options))


def environment_from_code(code: str, limits: Any = None) -> Any:
    """A sandboxed environment running `code` (a module defining make_env())."""
    from trace_lib.envs.sandbox import SandboxedEnvironment

    return SandboxedEnvironment.from_code(code, limits)


def build_env(spec: EnvSpec, limits: Any = None,
              options: dict[str, Any] | None = None) -> Environment:
    """A new environment for `spec`: built-ins and python factories in-process, generated
    and file modules in the sandbox (`limits`: its SandboxLimits). Seed-independent: the
    caller resets it with a seed."""
    if spec.source == "builtin":
        return make_builtin(spec, options)
    if spec.source == "python":
        if not spec.factory:
            raise UserInputError(f"env {spec.name!r}: a python environment needs `factory`")
        return import_object(spec.factory, f"env {spec.name!r}")()
    if spec.source in SANDBOXED:
        if not spec.code:
            raise UserInputError(f"env {spec.name!r}: a {spec.source} environment without code")
        return environment_from_code(spec.code, limits)
    raise UserInputError(f"env {spec.name!r}: unknown source {spec.source!r}; expected one "
                         f"of {', '.join(SOURCES)}")


def env_factory(spec: EnvSpec, limits: Any = None,
                options: dict[str, Any] | None = None) -> Callable[[], Environment]:
    """A zero-argument constructor of `spec` (rollout loops build one env per rollout).
    Checks now what can be checked without starting anything."""
    if spec.source == "python" and spec.factory:
        import_object(spec.factory, f"env {spec.name!r}")
    elif spec.source == "builtin" and (spec.domain, spec.capability) not in _builtin_pairs():
        raise UserInputError(f"env {spec.name!r}: no built-in {spec.domain}/{spec.capability}")
    elif spec.source in SANDBOXED and not spec.code:
        raise UserInputError(f"env {spec.name!r}: a {spec.source} environment without code")
    if spec.source == "builtin":
        check_builtin_options(spec, options)
    return lambda: build_env(spec, limits, options)


@contextlib.contextmanager
def open_environment(
    spec: EnvSpec | str, limits: Any = None, options: dict[str, Any] | None = None,
) -> Iterator[Environment]:
    """An environment for `spec` (or a name that needs no store, resolved); closed on exit
    when it can be. `options` (tools, policy, difficulty) apply to built-ins only. A stored
    generated name goes through `envs.catalog.resolve` first (the app side)."""
    if isinstance(spec, str):
        spec = require_static(spec)
    env = build_env(spec, limits, options if spec.source == "builtin" else None)
    try:
        yield env
    finally:
        close = getattr(env, "close", None)
        if callable(close):
            close()


def source_code(spec: EnvSpec) -> str:
    """The code behind an environment: a generated module, or a built-in's task builder."""
    if spec.code is not None:
        return spec.code
    import importlib
    import inspect

    if spec.source == "python" and spec.factory:
        return inspect.getsource(importlib.import_module(spec.factory.split(":", 1)[0]))
    from trace_lib.envs.capabilities import CAPABILITIES

    builder = CAPABILITIES[spec.capability].builders[spec.domain]
    return inspect.getsource(inspect.getmodule(builder))  # the capability's whole module
