"""A job's spec: what to run (kind + config), where (backend), and its run directory.

Design decisions
- The spec is the whole input of a job: `spec.json` in its run directory is what every
  backend's entry point reads, so a job can be re-run or resumed from that file alone
  (`python -m trace_lib.jobs.runner RUN_DIR/spec.json`).
- `config` is the kind's own configuration, validated by the kind's code when the job
  starts (and by the use case before it is submitted); the spec checks only what every
  job shares: a known kind, a known backend, no unknown top-level fields. The names are
  checked against the tables in `registries.py`, which sit below this module (the kinds
  and backends modules import the spec, never the reverse).
- Anything a job needs from the database (a generated environment's code, say) is put into
  `config` by whoever submits it; nothing in a spec is a name to look up in the store.
- Job ids sort by time (`<kind>-<UTC stamp>-<6 hex>`), so a directory listing is a history.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from trace_lib.errors import UserInputError, config_from_dict
from trace_lib.jobs.registries import BACKENDS, JOB_KINDS

REPO_ROOT = Path(__file__).resolve().parents[2]
RUNS_ENV = "TRACE_RUNS_DIR"


def runs_dir() -> Path:
    """`$TRACE_RUNS_DIR`, default `data/runs/` in the checkout."""
    env = os.environ.get(RUNS_ENV)
    return Path(env).expanduser() if env else REPO_ROOT / "data" / "runs"


def now_iso() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


def new_job_id(kind: str) -> str:
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%d-%H%M%S")
    return f"{kind}-{stamp}-{uuid.uuid4().hex[:6]}"


@dataclass
class JobSpec:
    kind: str
    config: dict[str, Any]
    backend: str = "local"
    id: str = ""
    run_dir: str = ""
    backend_options: dict[str, Any] = field(default_factory=dict)
    created_at: str = ""

    def __post_init__(self) -> None:
        self.id = self.id or new_job_id(self.kind)
        self.run_dir = self.run_dir or str(runs_dir() / self.id)
        self.created_at = self.created_at or now_iso()

    @property
    def path(self) -> Path:
        return Path(self.run_dir)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Any, where: str) -> JobSpec:
        if not isinstance(data, dict):
            raise UserInputError(f"{where}: expected a JSON object with `kind` and `config`")
        if data.get("kind") not in JOB_KINDS:
            raise UserInputError(
                f"{where}: field `kind` is {data.get('kind')!r}; expected one of "
                f"{sorted(JOB_KINDS)}"
            )
        if not isinstance(data.get("config"), dict):
            raise UserInputError(f"{where}: field `config` must be an object")
        backend = data.get("backend", "local")
        if backend not in BACKENDS:
            raise UserInputError(
                f"{where}: field `backend` is {backend!r}; expected one of "
                f"{sorted(BACKENDS.names())}"
            )
        if not isinstance(data.get("backend_options", {}), dict):
            raise UserInputError(f"{where}: field `backend_options` must be an object")
        return config_from_dict(cls, data, where)

    @classmethod
    def load(cls, path: str | Path) -> JobSpec:
        p = Path(path)
        try:
            data = json.loads(p.read_text())
        except FileNotFoundError as exc:
            raise UserInputError(f"{p}: no job spec file here") from exc
        except json.JSONDecodeError as exc:
            raise UserInputError(f"{p}: not valid JSON ({exc})") from exc
        return cls.from_dict(data, str(p))
