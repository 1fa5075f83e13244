"""The environments table: status, reports, approval, and the generation attempts.

Design decisions
- A built-in environment has no row until something is recorded about it (a validation, a
  calibration, an approval); until then it lists as "draft". Generated environments get a
  row, with their code, when the generation agent accepts them.
- Status moves draft -> validated | rejected (by validation) -> approved | rejected (by a
  person). Only an approved environment can be trained on (`is_approved`), and approving
  needs a passing validation first; a new validation of an approved environment that
  fails takes the approval away.
- The report column is one JSON object with a key per producer ("validation",
  "calibration", "review"), so validating does not erase a calibration and vice versa.
  Its SQL is `store.environments`; the rules above are here.
- `resolve` is the store-backed half of the one name -> environment path: what
  `registry.resolve_static` knows (no database), else a stored generated row. It runs on
  the app side only (the workbench, and compose's app-side functions, which sit below the
  workbench); a job never imports this module (an import contract holds it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trace_lib.envs.registry import EnvSpec, builtin_specs, resolve_static, unknown_name_error
from trace_lib.errors import UserInputError
from trace_lib.store import connect, transaction
from trace_lib.store import environments as store_environments

STATUSES = ("draft", "validated", "approved", "rejected")


def get_row(name: str, db: str | Path | None = None) -> dict[str, Any] | None:
    with connect(db) as con:
        return store_environments.row_named(con, name)


def resolve(name_or_path: str, db: str | Path | None = None) -> EnvSpec:
    """The spec of any environment name; stored generated ones are read from the store."""
    spec = resolve_static(name_or_path)
    if spec is not None:
        return spec
    row = get_row(name_or_path, db=db)
    if row is None or not row.get("code"):
        raise unknown_name_error(name_or_path)
    return EnvSpec(name=row["name"], capability=row["capability"], domain=row["domain"],
                   version=int(row["version"]), source=row["source"], code=row["code"])


def _upsert(con: Any, spec: EnvSpec, status: str, report: dict[str, Any]) -> None:
    store_environments.replace_row(con, {
        "id": spec.name, "name": spec.name, "capability": spec.capability,
        "domain": spec.domain, "version": spec.version, "source": spec.source,
        "code": spec.code, "code_sha256": spec.code_sha256, "status": status,
        "report": report})


def save_environment(spec: EnvSpec, status: str, report: dict[str, Any] | None = None,
                     db: str | Path | None = None) -> None:
    """Insert or replace the row of `spec` (a generated environment's code goes with it)."""
    with connect(db) as con, transaction(con):
        _upsert(con, spec, status, report or {})


def record_report(spec: EnvSpec, key: str, report: dict[str, Any],
                  status: str | None = None, db: str | Path | None = None) -> dict[str, Any]:
    """Store `report` under `key` in the row's report (creating the row), maybe set status."""
    with connect(db) as con, transaction(con):
        row = store_environments.row_named(con, spec.name)
        merged = dict(row["report"]) if row else {}
        merged[key] = report
        new_status = status or (row["status"] if row else "draft")
        if spec.code is None and row and row.get("code"):
            spec = EnvSpec(**{**spec.__dict__, "code": row["code"]})
        _upsert(con, spec, new_status, merged)
    return merged


def set_status(spec: EnvSpec, status: str, note: str = "", force: bool = False,
               db: str | Path | None = None) -> dict[str, Any]:
    """Approve or reject (a person's decision), recorded under report["review"]."""
    if status not in ("approved", "rejected"):
        raise UserInputError(f"status {status!r}: a review sets 'approved' or 'rejected'")
    row = get_row(spec.name, db=db)
    current = row["status"] if row else "draft"
    if status == "approved" and current not in ("validated", "approved") and not force:
        raise UserInputError(
            f"environment {spec.name!r} is {current}: only a validated environment can be "
            f"approved (run `python -m trace_lib env validate {spec.name}` first)"
        )
    record_report(spec, "review", {"decision": status, "note": note, "from": current},
                  status=status, db=db)
    return get_row(spec.name, db=db) or {}


def list_environments(db: str | Path | None = None) -> list[dict[str, Any]]:
    """Every known environment: built-ins (with their row, if any) and stored ones."""
    with connect(db) as con:
        rows = {r["name"]: r for r in store_environments.rows(con)}
    out = []
    for spec in builtin_specs():
        row = rows.pop(spec.name, None)
        out.append(_listing(spec.to_dict(), row))
    for row in rows.values():
        base = {k: row[k] for k in ("name", "capability", "domain", "version", "source",
                                    "code_sha256")}
        out.append(_listing(base, row))
    return out


def _listing(base: dict[str, Any], row: dict[str, Any] | None) -> dict[str, Any]:
    report = row["report"] if row else {}
    validation = report.get("validation") or {}
    calibration = report.get("calibration") or {}
    return {
        **base,
        "status": row["status"] if row else "draft",
        "validated_figures": validation.get("figures"),
        "calibration_mean_reward": calibration.get("mean_reward"),
        "calibration_in_band": calibration.get("in_band"),
    }


def is_approved(name: str, db: str | Path | None = None) -> bool:
    """True only for an environment a person approved (what training requires)."""
    row = get_row(name, db=db)
    return bool(row and row["status"] == "approved")


# ------------------------------------------------------------------ generation attempts


def save_attempt(generation_id: str, attempt: int, spec: EnvSpec, generator: str,
                 model: str | None, status: str, report: dict[str, Any],
                 db: str | Path | None = None) -> None:
    with connect(db) as con, transaction(con):
        store_environments.insert_attempt(
            con, generation_id=generation_id, attempt=attempt, env_name=spec.name,
            capability=spec.capability, domain=spec.domain, generator=generator, model=model,
            code=spec.code, code_sha256=spec.code_sha256, status=status, report=report)


def list_attempts(env_name: str | None = None, generation_id: str | None = None,
                  db: str | Path | None = None) -> list[dict[str, Any]]:
    with connect(db) as con:
        return store_environments.attempts(con, env_name, generation_id)


def next_generated_name(domain: str, capability: str, db: str | Path | None = None) -> tuple[
        str, int]:
    """The next free "DOMAIN/CAPABILITY/genN" name and its version N."""
    prefix = f"{domain}/{capability}/gen"
    with connect(db) as con:
        names = store_environments.names_with_prefix(con, prefix)
    used = [int(n[len(prefix):]) for n in names if n[len(prefix):].isdigit()]
    version = max(used, default=0) + 1
    return f"{prefix}{version}", version

