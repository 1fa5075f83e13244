"""Where environments come from: built-ins, generated modules in the store, files on disk.

    spec = resolve("airline/precondition_verification")      # or "gen name", or "x.py"
    with open_environment(spec) as env:                      # in-process or sandboxed
        env.reset(0)

Design decisions
- One name space. Built-ins are "DOMAIN/CAPABILITY" (from the capability task builders);
  generated ones are "DOMAIN/CAPABILITY/genN" rows of the `environments` table with their
  code; a path ending in .py is a module on disk (what `env validate PATH` checks before
  anything is stored).
- Built-ins are trusted library code and run in-process. Everything else runs only in the
  sandbox; `open_environment` is the single place that decides, so no caller can import
  generated code by accident.
- The registry itself never opens the store for built-ins, so training jobs (which must
  not touch the database) can resolve built-ins; generated code reaches a job through its
  spec, and `environment_from_code` sandboxes it there too.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trace_lib.envs.protocol import Environment
from trace_lib.errors import UserInputError

BUILTIN_VERSION = 1


@dataclass
class EnvSpec:
    name: str
    capability: str
    domain: str
    version: int
    source: str  # builtin | generated | file
    code: str | None = None  # for generated and file environments
    path: str | None = None
    description: str = ""

    @property
    def code_sha256(self) -> str | None:
        return hashlib.sha256(self.code.encode("utf-8")).hexdigest() if self.code else None

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "capability": self.capability, "domain": self.domain,
                "version": self.version, "source": self.source,
                "code_sha256": self.code_sha256, "path": self.path}


def builtin_specs() -> list[EnvSpec]:
    from trace_lib.envs.capabilities import CAPABILITIES, builtin_pairs

    return [
        EnvSpec(name=f"{domain}/{cap}", capability=cap, domain=domain, version=BUILTIN_VERSION,
                source="builtin", description=CAPABILITIES[cap].description)
        for domain, cap in builtin_pairs()
    ]


def builtin_names() -> list[str]:
    return [s.name for s in builtin_specs()]


def resolve(name_or_path: str, db: str | Path | None = None) -> EnvSpec:
    """The spec of a built-in name, a stored generated name, or a .py file."""
    for spec in builtin_specs():
        if spec.name == name_or_path:
            return spec
    if name_or_path.endswith(".py"):
        path = Path(name_or_path).expanduser()
        if not path.is_file():
            raise UserInputError(f"{path}: no such environment module file")
        return EnvSpec(name=path.stem, capability="", domain="", version=1, source="file",
                       code=path.read_text(encoding="utf-8"), path=str(path))
    from trace_lib.envs import catalog

    row = catalog.get_row(name_or_path, db=db)
    if row is None or not row.get("code"):
        known = ", ".join(builtin_names())
        raise UserInputError(
            f"environment {name_or_path!r}: not a built-in ({known}), not a stored generated "
            "environment, and not a path to a .py module"
        )
    return EnvSpec(name=row["name"], capability=row["capability"], domain=row["domain"],
                   version=int(row["version"]), source=row["source"], code=row["code"])


def make_builtin(spec: EnvSpec) -> Environment:
    from trace_lib.envs.capabilities import make_capability_env

    return make_capability_env(spec.domain, spec.capability)


def environment_from_code(code: str, limits: Any = None) -> Any:
    """A sandboxed environment running `code` (a module defining make_env())."""
    from trace_lib.envs.sandbox import SandboxedEnvironment

    return SandboxedEnvironment.from_code(code, limits)


@contextlib.contextmanager
def open_environment(
    spec: EnvSpec | str, db: str | Path | None = None, limits: Any = None
) -> Iterator[Environment]:
    """An environment for `spec`; sandboxed unless it is a built-in. Closed on exit."""
    if isinstance(spec, str):
        spec = resolve(spec, db=db)
    if spec.source == "builtin":
        yield make_builtin(spec)
        return
    env = environment_from_code(spec.code or "", limits)
    try:
        yield env
    finally:
        env.close()


def source_code(spec: EnvSpec) -> str:
    """The code behind an environment: a generated module, or a built-in's task builder."""
    if spec.code is not None:
        return spec.code
    import importlib
    import inspect

    module = importlib.import_module(f"trace_lib.envs.capabilities.{spec.capability}")
    return inspect.getsource(module)
