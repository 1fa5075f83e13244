"""Composition use cases: compose, train the gates, route, evaluate; the rows they leave.

Design decisions
- Routing has one source dispatch, `route(db, moe, RouteSource, ...)`: a live prompt, an
  environment rollout, or an ingested trajectory (read through the one trajectory
  loader); the page's Route and "Re-run forced" buttons and the `route` verb all call it.
- Gate training goes through the same approval rule as adapter training
  (`environments.require_trainable`, checked for every environment before it starts).
  `train_gates` runs in this process; in the background it is a job like every other
  kind (`workbench.jobs.submit_gates`), and the one job sync registers the composed model
  it wrote (`register_moe`) once it succeeded.
- Composing warns, never refuses, when an adapter's training run reported no learning
  signal (`adapter_warnings`, from `job_progress.adapter_signal`: the run of its
  recorded job, else the run directory above its folder): such an adapter is the base
  model in a slot, and a person may still want it as a control. `compose` returns the
  warnings, the verb prints them, the Routing page shows them as soon as the adapter is
  picked.
- Code that runs inside a job (gate training) writes files into its run directory, never
  the store (one writer). A composed model's id is a hash of its folder's resolved path
  (`store.jobs.moe_id_for`), so registering the same folder again (after gate training
  rewrote its gates) updates the row instead of adding a twin. Trace rows point at the
  `.npz` file; the arrays never go into the database. The rows' SQL is
  `trace_lib.store.jobs`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trace_lib import store
from trace_lib.errors import UserInputError
from trace_lib.store import jobs as job_rows
from trace_lib.store import trajectories as store_trajectories
from trace_lib.store.jobs import moe_id_for
from trace_lib.workbench import environments

Db = str | Path | None
ROUTE_KINDS = ("prompt", "env", "trajectory")


def __getattr__(name: str) -> Any:
    # `views` (pure routing views for the page) imports torch: loaded on first use, so the
    # store-only use cases here (listing models and traces) stay light.
    if name == "views":
        from trace_lib.compose import views

        return views
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ----------------------------------------------------------------- compose and load


def default_compose_dir() -> Path:
    """A fresh folder for a composed model under the runs directory (`TRACE_RUNS_DIR`),
    never a folder relative to wherever the app was started: `composed/moe-N`."""
    from trace_lib import jobs

    root = jobs.runs_dir() / "composed"
    n = 1
    while (root / f"moe-{n}").exists():
        n += 1
    return root / f"moe-{n}"


def compose(db: Db, base: str, adapters: str, out: str | Path, mode: str = "top1",
            register: bool = True) -> dict[str, Any]:
    """Build the gated model with zero gates into `out` and record it (`compose`)."""
    from trace_lib.compose.adapters import parse_adapter_arg
    from trace_lib.compose.gated import MoEConfig
    from trace_lib.compose.gated import compose as _compose

    specs = parse_adapter_arg(adapters)
    moe = _compose(base, specs, out=out, config=MoEConfig(mode=mode))
    moe_id = register_moe(db, out) if register else None
    return {"path": str(Path(out).resolve()), "layers": moe.layers, "hidden": moe.hidden,
            "experts": moe.slots[1:], "gate_params": moe.gate_param_count(), "id": moe_id,
            "mode": moe.config.mode, "warnings": adapter_warnings(db, specs)}


def adapter_warnings(db: Db, adapters: str | list[tuple[str | None, Path]]) -> list[str]:
    """One sentence per adapter (`A1,A2` / `cap=A1,...` or parsed pairs) whose training run
    reported no learning signal; [] when every known run learned."""
    from trace_lib.compose.adapters import parse_adapter_arg
    from trace_lib.workbench import job_progress

    specs = parse_adapter_arg(adapters) if isinstance(adapters, str) else adapters
    run_dirs: dict[Path, str | None] = {}
    if store.resolve_db_path(db).exists():
        with store.connect(db, read_only=True) as con:
            for _, path in specs:
                row = job_rows.adapter_at(con, str(Path(path).expanduser().resolve()))
                run_dirs[path] = job_rows.job_run_dir(con, row["job_id"]) if row else None
    out = []
    for name, path in specs:
        signal = job_progress.adapter_signal(path, run_dirs.get(path))
        if signal and signal["warning"]:
            out.append(f"Adapter {name or Path(path).name} ({path}): {signal['warning']}")
    return out


def load_moe(path: str | Path, mode: str | None = None):
    from trace_lib.compose.gated import load_moe as _load

    return _load(path, mode=mode)


def merge(adapters: str, out: str | Path, weights: list[float] | None = None
          ) -> dict[str, Any]:
    """Exact linear merge of LoRA adapters (`moe-merge`)."""
    from trace_lib.compose.adapters import linear_merge, parse_adapter_arg, read_adapters

    read = read_adapters(parse_adapter_arg(adapters))
    path = linear_merge(read, out, weights)
    return {"path": str(path.resolve()), "adapters": [a.name for a in read],
            "weights": weights or [1.0 / len(read)] * len(read)}


def merge_per_request(db: Db, moe_path: str | Path, out: str | Path,
                      envs: dict[str, str] | None = None, seeds: int = 8,
                      seed_start: int = 0) -> dict[str, Any]:
    """`moe-merge --per-request`: one merged adapter per capability (the layers the gates
    choose for that capability's requests, measured on `envs` = {capability: env}) plus
    the router (the gates' request-level choice) for vLLM's one-adapter-per-request."""
    from trace_lib.compose.export import env_requests, export_per_request

    moe = load_moe(moe_path)
    requests = env_requests(envs, list(range(seed_start, seed_start + seeds)),
                            env_specs=environments.env_specs(envs.values(), db)) \
        if envs else None
    return export_per_request(moe, out, requests)


def load_router(export_dir: str | Path):
    """The router `merge_per_request` wrote: `.route(messages, tools)` -> capability."""
    from trace_lib.compose.export import Router

    return Router.load(export_dir)


def environment_names() -> list[str]:
    return environments.environment_names()


# ------------------------------------------------------------------------------ route


@dataclass
class RouteSource:
    kind: str  # prompt | env | trajectory
    prompt: str = ""
    system: str | None = None
    env: str = ""
    seed: int = 0
    trajectory: str = ""
    max_new_tokens: int = 32
    max_turns: int = 4

    def __post_init__(self) -> None:
        if self.kind not in ROUTE_KINDS:
            raise UserInputError(f"route source {self.kind!r}: expected one of "
                                 f"{', '.join(ROUTE_KINDS)}")


def trajectory_messages(db: Db, trajectory_id: str
                        ) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None,
                                   dict[str, Any]]:
    """An ingested trajectory as OpenAI chat messages + its domain's tool schemas + meta."""
    from trace_lib.trajectories import chat_messages, load_trajectory

    try:
        with store.connect(db, read_only=True) as con:
            st = load_trajectory(con, trajectory_id)
            tools = store_trajectories.domain_tool_schemas(con, st.trajectory.domain) or None
    except UserInputError as exc:
        raise UserInputError(f"--trajectory {trajectory_id!r}: no such trajectory in "
                             f"{store.resolve_db_path(db)}") from exc
    t = st.trajectory
    meta = {"trajectory_id": st.id, "domain": t.domain, "reward": t.reward,
            "task_id": t.task_id, "outcome": st.outcome}
    return chat_messages(t), tools, meta


def trace_source(db: Db, moe: Any, source: RouteSource, force: int | None = None):
    """Generate (or replay) and trace: the one dispatch over routing sources."""
    from trace_lib.compose import traces

    if source.kind == "prompt":
        return traces.route_prompt(moe, source.prompt, system=source.system or None,
                                   max_new_tokens=source.max_new_tokens, force=force)
    if source.kind == "env":
        from trace_lib.compose.local_client import route_env

        return route_env(moe, source.env, source.seed, force=force,
                         max_tokens=source.max_new_tokens, max_turns=source.max_turns,
                         env_spec=environments.env_specs([source.env], db)[source.env])
    messages, tools, meta = trajectory_messages(db, source.trajectory)
    return traces.replay_trajectory(moe, messages, tools, force=force, meta=meta)


def route(db: Db, moe_path: str | Path, source: RouteSource, *, force: int | None = None,
          mode: str | None = None, moe: Any = None, save: bool = True
          ) -> tuple[Any, Path | None]:
    """Route a source through a composed model; save and index the trace unless `save` is
    False (then nothing touches the database). Returns (trace, saved path or None).

    `moe` lets a caller pass the model it already holds loaded (the page's cache)."""
    model = moe if moe is not None else load_moe(moe_path, mode=mode)
    trace = trace_source(db, model, source, force=force)
    path = save_and_index(db, moe_path, trace, source.kind) if save else None
    return trace, path


def load_trace(path: str | Path):
    from trace_lib.compose.traces import RoutingTrace

    return RoutingTrace.load(path)


def share(trace: Any, by: str = "role", layer: int | None = None) -> list[dict[str, Any]]:
    """Expert share of a trace's tokens by role or turn (at one layer, or the majority)."""
    from trace_lib.compose import traces

    return traces.share(trace, by, layer)


def outcome_shares(db: Db, moe_path: str | Path, limit: int = 50) -> list[dict[str, Any]]:
    """Expert share by success vs failure over the saved traces that have an outcome."""
    from trace_lib.compose import traces

    saved = list_traces(db, moe_id_for(moe_path))
    with_outcome = [t for t in saved if t["meta"].get("outcome") in ("success", "failure")]
    if not with_outcome:
        return []
    return traces.share_many([load_trace(t["path"]) for t in with_outcome[:limit]],
                             by="outcome")


# -------------------------------------------------------------------------- gates


def gate_config(moe: str | Path, envs: list[str] | str, **fields: Any):
    """The GateTrainConfig of `gates` flags / the page's widgets (validated)."""
    from trace_lib.compose.gate_training import GateTrainConfig

    return GateTrainConfig.from_dict({"moe": str(Path(moe).resolve()), "envs": envs,
                                      **{k: v for k, v in fields.items() if v is not None}},
                                     where="gates")


def train_gates(db: Db, cfg: Any, progress: bool = True) -> dict[str, Any]:
    """Train a composed model's gates in this process (`gates`; in the background:
    `workbench.jobs.submit_gates`): every environment must be approved, and the composed
    model's row gets the new metrics."""
    from trace_lib import jobs
    from trace_lib.compose import gate_training

    for name in cfg.envs:
        spec = environments.require_trainable(name, db=db)
        # the same config a gate job gets: the stage builds environments from their specs
        cfg.env_specs.setdefault(name, spec.to_json())
    job_id = jobs.new_job_id(jobs.TRAIN_GATES)
    result = gate_training.train_gates(cfg, jobs.runs_dir() / job_id, progress=progress)
    result["job_id"] = job_id
    result["id"] = register_moe(db, result["moe_path"], job_id=job_id,
                                metrics={"final_reward": result["final_reward"],
                                         "warm_rewards": result["warm_rewards"]})
    return result


# ----------------------------------------------------------------------- evaluation


def moe_eval(db: Db, moe_path: str | Path, envs: list[str], *, seeds: int = 8,
             seed_start: int = 10_000, max_tokens: int | None = None, max_turns: int = 4,
             include_merge: bool = True, moe: Any = None,
             on_row: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Base vs each adapter vs linear merge vs composed on held-out seeds (`moe-eval`, the
    Evaluate tab); writes `<moe>/eval.json` and records it on the model's row. No
    `max_tokens`: the environments' longest reference turn + 25% (`with_turn_budget`),
    recorded in `eval.json`'s config and returned as `max_tokens` / `turn_budget`."""
    from trace_lib.compose.evaluate import (
        EvalConfig,
        env_makers,
        evaluate_composition,
        summary_rows,
        with_turn_budget,
        write_eval,
    )

    model = moe if moe is not None else load_moe(moe_path)
    cfg = EvalConfig(envs=list(envs), seeds=seeds, seed_start=seed_start,
                     max_tokens=max_tokens, max_turns=max_turns, include_merge=include_merge)
    specs = environments.env_specs(cfg.envs, db)
    cfg = with_turn_budget(model, cfg, env_makers(cfg, specs))
    rows = evaluate_composition(model, cfg, on_row=on_row, env_specs=specs)
    path = write_eval(moe_path, rows, cfg)
    summary = summary_rows(rows)
    settings = {"max_tokens": cfg.max_tokens, "max_turns": cfg.max_turns, "seeds": cfg.seeds,
                "seed_start": cfg.seed_start, "turn_budget": cfg.turn_budget}
    register_moe(db, moe_path, metrics={"eval": rows, "eval_summary": summary,
                                        "eval_settings": settings})
    return {"path": str(path), "rows": rows, "summary": summary, **settings}


def eval_max_tokens_default(moe: Any, envs: list[str], db: Db = None,
                            max_turns: int = 4) -> dict[str, Any] | None:
    """What an evaluation (or gate training) of `moe` on `envs` with no `max_tokens` uses:
    `TurnBudget.record()` from the one home (`reference_turn_budget`); the pages show it
    before the click. None when the environments cannot be resolved here."""
    from trace_lib.compose.evaluate import EvalConfig, env_makers
    from trace_lib.train.local_rollouts import reference_turn_budget

    try:
        cfg = EvalConfig(envs=list(envs), max_turns=max_turns)
        makers = env_makers(cfg, environments.env_specs(cfg.envs, db))
    except Exception:  # noqa: BLE001 - a hint for the form: the run measures it again
        return None
    return reference_turn_budget(makers, moe.tokenizer, max_turns).record()


def eval_policy_count(moe: Any, include_merge: bool = True) -> int:
    from trace_lib.compose.evaluate import policies

    return len(policies(moe, include_merge))


def saved_eval(moe_path: str | Path) -> dict[str, Any] | None:
    path = Path(moe_path) / "eval.json"
    return json.loads(path.read_text()) if path.exists() else None


# ------------------------------------------------------------------ store recording


def register_moe(db: Db, folder: str | Path, job_id: str | None = None,
                 metrics: dict[str, Any] | None = None) -> str:
    """Insert or update the `moe_models` row for a composed model folder; returns its id."""
    from trace_lib.compose.gated import read_moe_meta

    root = Path(folder).resolve()
    with store.connect(db) as con, store.transaction(con):
        return job_rows.record_moe_model(con, root, read_moe_meta(root), job_id=job_id,
                                         metrics=metrics)


def list_moe_models(db: Db = None) -> list[dict[str, Any]]:
    """Recorded composed models, newest first ([] without a database)."""
    if not store.resolve_db_path(db).exists():
        return []
    with store.connect(db) as con:
        return job_rows.moe_models(con)


def index_trace(db: Db, moe_id: str, trace: Any, path: str | Path, source: str) -> str:
    with store.connect(db) as con, store.transaction(con):
        return job_rows.insert_routing_trace(
            con, trace_id=trace.id, moe_id=moe_id, path=str(Path(path).resolve()),
            source=source, n_tokens=trace.n_tokens, n_layers=trace.n_layers,
            meta=trace.meta)


def list_traces(db: Db = None, moe_id: str | None = None) -> list[dict[str, Any]]:
    """Saved routing traces (of one composed model, or all), newest first."""
    if not store.resolve_db_path(db).exists():
        return []
    with store.connect(db) as con:
        return job_rows.routing_traces(con, moe_id)


def save_and_index(db: Db, folder: str | Path, trace: Any, source: str) -> Path:
    """Save a trace under `<moe folder>/traces/` and index it (registering the model)."""
    moe_id = register_moe(db, folder)
    path = trace.save(Path(folder) / "traces")
    index_trace(db, moe_id, trace, path, source)
    return path


def list_trajectories(db: Db = None, limit: int = 200) -> list[dict[str, Any]]:
    """Recent ingested trajectories for a picker (id, domain, task, outcome, length)."""
    if not store.resolve_db_path(db).exists():
        return []
    with store.connect(db, read_only=True) as con:
        return store_trajectories.trajectories_by_id(con, limit)


def start_composed_server(moe: str | Path, **options: Any) -> Any:
    """Serve a composed model on an OpenAI-compatible endpoint (`moe serve`), started:
    `options` are `MoEPolicyServer`'s (record_dir, mode, trace, host, port,
    served_model_name). The caller stops it."""
    from trace_lib.compose.serving import MoEPolicyServer

    server = MoEPolicyServer(moe, **options)
    server.start()
    return server
