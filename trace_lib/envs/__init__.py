"""Capability environments: protocol, registry, built-ins, generation, sandbox, validation.

The public surface other stages use:

    from trace_lib.envs import open_environment, is_approved, list_environments
    if is_approved("airline/precondition_verification"):
        with open_environment("airline/precondition_verification") as env: ...

Store-backed functions (`is_approved`, `list_environments`) take `db` (a path, else
TRACE_DB); jobs must not call them (they never open the database): a job gets its
environment's serialised spec (`EnvSpec.to_json()`, code included) and builds it with
`spec_for_job` + `build_env`, the same constructor the app uses.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trace_lib.envs.protocol import Environment, parse_action
from trace_lib.envs.registry import (
    EnvSpec,
    build_env,
    builtin_names,
    environment_from_code,
    spec_for_job,
)


def resolve(name: str, db: str | Path | None = None) -> EnvSpec:
    """The spec of any environment name, stored generated ones included (app side)."""
    from trace_lib.envs.catalog import resolve as _resolve

    return _resolve(name, db=db)


def open_environment(spec_or_name: EnvSpec | str, db: str | Path | None = None,
                     limits: Any = None, options: dict[str, Any] | None = None) -> Any:
    """A context manager yielding the environment of a spec or any name (a stored
    generated one read from `db`); sandboxed unless built-in or your own code."""
    from trace_lib.envs.registry import open_environment as _open

    spec = resolve(spec_or_name, db=db) if isinstance(spec_or_name, str) else spec_or_name
    return _open(spec, limits=limits, options=options)


def is_approved(name: str, db: str | Path | None = None) -> bool:
    """True only if a person approved environment `name` (training requires it)."""
    from trace_lib.envs.catalog import is_approved as _is_approved

    return _is_approved(name, db=db)


def list_environments(db: str | Path | None = None) -> list[dict[str, Any]]:
    """Every environment with capability, domain, version, source and status."""
    from trace_lib.envs.catalog import list_environments as _list

    return _list(db=db)


__all__ = [
    "EnvSpec",
    "Environment",
    "build_env",
    "builtin_names",
    "environment_from_code",
    "is_approved",
    "list_environments",
    "open_environment",
    "parse_action",
    "resolve",
    "spec_for_job",
]
