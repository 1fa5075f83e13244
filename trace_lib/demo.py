"""The demo data set: scripted airline agents with planted deficits, imported into the store.

    python -m trace_lib demo build [--out data/demo] [--n 300] [--seed 0] [--if-absent]

Design decisions
- Everything is derived from the seed: the airline database, the tasks drawn from it, the
  deficit knobs each (task, agent, trial) arms. Records are written in a fixed order with
  fixed key order, so the same seed gives a byte-identical JSONL file (a test checks it).
- A realistic mix, not a toy: three scripted "agent models" with different deficit rates
  (`scripted-careful`, `scripted-hasty`, `scripted-sloppy`), several trials per task,
  single and multi-operation requests, roughly half of the runs successful. Rewards come
  from code (final database hash and required writes), as on tau2-bench.
- Ground truth for later stages travels in each record's `meta`: `planted_deficits` are
  the knobs that fired and changed what the agent did (recorded even when the run still
  succeeded), `armed_deficits` every knob drawn, `opportunities` the capabilities the
  task could exercise. Diagnose results can be scored against them.
- The file is the generic OpenAI-messages JSONL the ingest stage reads, so the demo goes
  through the same import path as a user's data. The domain's tool schemas are given once,
  on the first record (`tools` is optional per record; ingest keeps schemas per domain),
  which keeps the committed file near 3 MB; `--if-absent` makes `make demo` and the
  app's first start idempotent (it checks for the dataset by name).
"""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trace_lib.errors import UserInputError
from trace_lib.store import REPO_ROOT

DEMO_DIR = REPO_ROOT / "data" / "demo"
DEMO_FILE = "airline_demo.jsonl"
DEMO_AGENTS: tuple[str, ...] = ("scripted-careful", "scripted-hasty", "scripted-sloppy")


@dataclass
class DemoConfig:
    n: int = 300  # trajectories
    seed: int = 0
    trials: int = 2  # runs of each (task, agent)
    agents: tuple[str, ...] = DEMO_AGENTS


def build_records(cfg: DemoConfig, *, progress: bool = False) -> list[dict[str, Any]]:
    """The demo trajectories, in file order (task, agent, trial)."""
    from tqdm import tqdm

    from trace_lib.envs.domains import get_domain
    from trace_lib.envs.domains.airline.scripted_agent import play
    from trace_lib.envs.domains.airline.tasks import generate_tasks

    if cfg.n < 1:
        raise UserInputError(f"demo build --n: expected at least 1 trajectory, got {cfg.n}")
    domain = get_domain("airline")
    db = domain.make_db(cfg.seed)
    n_tasks = math.ceil(cfg.n / (len(cfg.agents) * cfg.trials))
    tasks = generate_tasks(db, n_tasks, seed=cfg.seed)
    tools = domain.tool_schemas()
    records: list[dict[str, Any]] = []
    bar = tqdm(total=cfg.n, desc="demo trajectories", unit="traj", disable=not progress)
    try:
        for task in tasks:
            for agent in cfg.agents:
                for trial in range(cfg.trials):
                    if len(records) == cfg.n:
                        break
                    rec = play(task, db, domain.policy, agent=agent, trial=trial, seed=cfg.seed)
                    # The schemas (12 kB) ride on the first record only: ingest stores them
                    # per domain, and repeating them would double the committed file.
                    records.append(_ordered(rec, None if records else tools))
                    bar.update(1)
    finally:
        bar.close()
    return records


def _ordered(rec: dict[str, Any], tools: list[dict[str, Any]] | None) -> dict[str, Any]:
    keys = ("id", "task_id", "trial", "agent_model", "domain", "reward", "success",
            "termination", "messages", "tools", "expected_actions", "meta")
    out = {k: (tools if k == "tools" else rec.get(k)) for k in keys}
    if tools is None:
        del out["tools"]
    return out


def write_jsonl(records: list[dict[str, Any]], path: Path) -> Path:
    """One compact JSON object per line, keys in a fixed order, '\\n' line ends."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    with tmp.open("w", encoding="utf-8", newline="\n") as fh:
        for rec in records:
            fh.write(json.dumps(rec, ensure_ascii=False, separators=(",", ":")) + "\n")
    tmp.replace(path)  # never leave a half-written file where the import looks
    return path


def summarize(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Counts a user (and the tests) check the mix with."""
    by_agent: dict[str, list[bool]] = {}
    planted: Counter[str] = Counter()
    planted_failed: Counter[str] = Counter()
    for rec in records:
        by_agent.setdefault(rec["agent_model"], []).append(rec["success"])
        for d in rec["meta"]["planted_deficits"]:
            planted[d] += 1
            planted_failed[d] += 0 if rec["success"] else 1
    n = len(records)
    return {
        "trajectories": n,
        "tasks": len({r["task_id"] for r in records}),
        "success_rate": round(sum(r["success"] for r in records) / n, 4) if n else None,
        "success_rate_by_agent": {a: round(sum(v) / len(v), 4) for a, v in by_agent.items()},
        "planted_deficits": dict(sorted(planted.items())),
        "planted_deficits_in_failures": dict(sorted(planted_failed.items())),
    }


def demo_present(db: str | Path | None = None) -> bool:
    """True if the store already holds the demo dataset."""
    from trace_lib.store import connect, resolve_db_path

    if not resolve_db_path(db).exists():
        return False
    with connect(db) as con:
        row = con.execute("SELECT count(*) FROM datasets WHERE name = ?", [DEMO_FILE]).fetchone()
    return bool(row and row[0])


def build_demo(
    out: str | Path = DEMO_DIR,
    *,
    n: int = 300,
    seed: int = 0,
    db: str | Path | None = None,
    if_absent: bool = False,
    import_into_store: bool = True,
    progress: bool = False,
) -> dict[str, Any]:
    """Generate the demo JSONL under `out` and import it into the store `db`.

    Returns a report: the file, the mix (`summarize`) and the ingest report, or
    `{"skipped": True}` when `if_absent` and the demo is already in the store.
    """
    if if_absent and demo_present(db):
        return {"skipped": True, "reason": f"{DEMO_FILE} is already in the store"}
    records = build_records(DemoConfig(n=n, seed=seed), progress=progress)
    path = write_jsonl(records, Path(out) / DEMO_FILE)
    report: dict[str, Any] = {"skipped": False, "file": str(path), **summarize(records)}
    if import_into_store:
        from trace_lib.ingest import ingest_paths

        report["ingest"] = ingest_paths([path], db=db, progress=progress).to_json()
        from trace_lib import store
        from trace_lib.explore import overview_stored

        with store.connect(db) as con:  # the Trajectories page's unfiltered view (issue 35)
            overview_stored.store_default(con)
    return report
