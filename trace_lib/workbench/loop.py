"""The self-trace loop as one use case: improve a model on its own target tasks.

    state = run_loop(db, LoopConfig(model="tiny", capabilities=["tool_calling_precision"],
                                    approve_all=True))

evaluate the model on `dev` -> label those trajectories -> rank -> the kept capabilities'
environments (validated; approved by the person) -> one SFT + GRPO adapter per capability
-> compose (token gates) -> evaluate base and composed on `test` -> compare.

Design decisions
- The loop adds no stage logic: every stage is a call of the use case a page or a verb
  already makes (`evaluation.evaluate`, `diagnose.label`, `diagnose.rankings`,
  `environments.validate/approve`, `training.train_foreground`, `composition.compose`,
  `composition.train_gates`, `evaluation.compare`). It owns only the order, the budget and
  the provenance that links each stage's artefact to the one before.
- State is one file, `loop.json` in the loop's folder (`<runs>/loops/<id>/`), rewritten
  atomically after every stage and every adapter: a rerun (`loop --resume ID`) skips what
  finished. A stage killed halfway starts again, and the work it calls resumes on its own
  (an evaluation's finished shards, a training run's checkpoints, both in the loop's
  folder); an evaluation already imported is found by its episodes file, never imported
  twice.
- The loop is a front end's process, not a job: it labels, ranks and records, and a job
  never opens the store. `--background` starts the same driver detached, logging to the
  loop's folder; `loop_status` says "interrupted" when the pid the state names is gone.
  A resume while another driver of the loop is alive is refused (two drivers once ran one
  loop's training at once after a stop signal was slow to land).
- Approval stays a person's step: without `approve_all` the loop stops at `environments`
  as "awaiting approval", naming what to approve (Environments page or `env approve`);
  with it, what the loop approved is recorded in the stage's artefact and printed.
- Splits: everything the loop chooses (diagnosis, capabilities, the adapters' settings)
  comes from `dev`; `test` is run once, at the end, for base and the final model.
- `reuse_from`: a second loop on the same model, domain, splits and evaluation settings
  (another GRPO seed, the SFT-only baseline) shares the first loop's dev evaluation, label
  run and base test evaluation instead of running them again: their artefacts are copied
  into the new state, marked `reused_from`, and their CPU is not counted again (a
  different store, model or setting is refused: the shared runs would not be this loop's).
- Budget: CPU seconds of this process and its finished children (`resource.getrusage`),
  summed over stages across resumes. The preflight, before anything is written, times one
  forward pass of the model over the first environment's prompt: a budget below one GRPO
  step's floor (a prefill per rollout) is refused. Between stages a spent budget stops the
  loop as "over budget"; `--resume` with a larger budget goes on.
"""

from __future__ import annotations

import contextvars
import dataclasses
import json
import os
import resource
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trace_lib.errors import UserInputError, config_from_dict
from trace_lib.workbench import composition, diagnose, environments, evaluation, training
from trace_lib.workbench.loop_serving import ENGINES, LoopServing

Db = str | Path | None
STAGES = ("evaluate_dev", "label", "rank", "environments", "train", "compose",
          "evaluate_test", "compare")
Say = Callable[[str], None]
# The running loop's evaluation engine, set for the length of `run_loop`: the evaluation
# stages share one server, and the stage table keeps one signature.
_SERVING: contextvars.ContextVar[LoopServing] = contextvars.ContextVar("loop_serving")


def _engine() -> LoopServing:
    return _SERVING.get()


@dataclass
class LoopConfig:
    model: str = "tiny"
    domain: str = "airline"
    # Names, or None: the ranking's kept set (with an environment in `domain`); `top_k`
    # instead takes the K best-ranked capabilities that have one, kept or not.
    capabilities: list[str] | None = None
    top_k: int | None = None
    budget_cpu_hours: float | None = None  # None: no limit
    approve_all: bool = False
    dev_tasks: int | None = None  # None: the whole split
    test_tasks: int | None = None
    labeler: str = "heuristic"
    validate_seeds: int = 20
    # Evaluation settings (`EvalConfig` fields) for both splits and every policy.
    eval: dict[str, Any] = field(default_factory=lambda: {
        "tools": "capability", "max_turns": 10, "max_tokens": 192})
    # Adapter training (`training.build_config` flat fields): SFT warm start, then GRPO.
    train: dict[str, Any] = field(default_factory=lambda: {"sft_steps": 20, "steps": 6})
    gates: dict[str, Any] = field(default_factory=dict)  # `composition.gate_config` fields
    # Where evaluations run (`loop_serving`): "local", the workbench's server per evaluation
    # and the token-gated final model; "vllm", one vLLM server for the loop and the final
    # model as its per-request export (what vLLM can serve).
    engine: str = "local"
    # A loop whose diagnosis this one shares: its dev evaluation and label run (the rank
    # and environments stages run again, on this loop's capability choice) and its base
    # test evaluation. Only training, composition and the final evaluation are new: the
    # way to compare training recipes (seeds, SFT-only at equal compute) on one diagnosis.
    reuse_from: str | None = None

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "loop") -> LoopConfig:
        return config_from_dict(cls, data, where)


# ------------------------------------------------------------------------------- state


def loops_dir() -> Path:
    from trace_lib import jobs

    return jobs.runs_dir() / "loops"


def _state_path(loop_id: str) -> Path:
    return loops_dir() / loop_id / "loop.json"


def read_state(loop_id: str) -> dict[str, Any]:
    path = _state_path(loop_id)
    if not path.is_file():
        known = ", ".join(list_loop_ids()) or "none yet"
        raise UserInputError(f"loop {loop_id!r}: no such loop under {loops_dir()} "
                             f"(loops: {known})")
    return json.loads(path.read_text(encoding="utf-8"))


def _write_state(state: dict[str, Any]) -> None:
    path = _state_path(state["id"])
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=2, default=str) + "\n", encoding="utf-8")
    os.replace(tmp, path)  # a kill mid-write leaves the previous state, never half of one


def list_loop_ids() -> list[str]:
    root = loops_dir()
    return sorted((p.parent.name for p in root.glob("*/loop.json")), reverse=True)


def _driver_alive(state: dict[str, Any]) -> bool:
    """Whether the driver the state names is alive. A pid counts only while its command
    line is a `trace_lib` process: after a reboot or a long stop the pid may belong to
    anything, and a reused pid is neither a driver to wait for nor a running loop."""
    import psutil

    pid = state.get("pid")
    if not pid:
        return False
    if int(pid) == os.getpid():
        return True
    try:
        cmdline = " ".join(psutil.Process(int(pid)).cmdline())
    except (psutil.Error, ValueError):
        return False
    return "trace_lib" in cmdline


def _running_driver(state: dict[str, Any]) -> int | None:
    """The pid of another live driver of this loop, or None."""
    pid = state.get("pid")
    if state.get("state") not in ("running", "starting") or not pid or pid == os.getpid():
        return None
    return int(pid) if _driver_alive(state) else None


def _refuse_a_second_driver(state: dict[str, Any]) -> None:
    pid = _running_driver(state)
    if pid is not None:
        raise UserInputError(f"loop {state['id']} is already running (pid {pid}); two "
                             "drivers would train and write its state at once. Wait for it, "
                             f"or stop it (kill {pid}) and resume")


def loop_status(loop_id: str) -> dict[str, Any]:
    """The state as stored, with "interrupted" where the driver died mid-stage."""
    state = read_state(loop_id)
    if state["state"] == "running" and not _driver_alive(state):
        state["state"] = "interrupted"
        state["message"] = (f"the loop's process ({state.get('pid')}) is gone; "
                            f"`loop --resume {loop_id}` goes on from the last finished stage")
    return state


def list_loops() -> list[dict[str, Any]]:
    out = []
    for loop_id in list_loop_ids():
        st = loop_status(loop_id)
        done = [s for s in STAGES if st["stages"][s]["state"] == "done"]
        out.append({"id": loop_id, "model": st["config"]["model"],
                    "domain": st["config"]["domain"], "state": st["state"],
                    "stage": st.get("stage"), "stages_done": len(done),
                    "cpu_s": round(st.get("cpu_s", 0.0), 1), "created_at": st["created_at"]})
    return out


def _cpu_s() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def provenance(state: dict[str, Any]) -> list[dict[str, Any]]:
    """The chain dataset -> label run -> ranking -> environment -> adapter -> composed model
    -> evaluation, one link per artefact the finished stages left."""
    st = {s: state["stages"][s].get("artefact") or {} for s in STAGES}
    links: list[dict[str, Any]] = []
    if st["evaluate_dev"]:
        links.append({"stage": "evaluate_dev", "dataset": st["evaluate_dev"]["dataset"]})
    for run in st["label"].get("runs", []):
        links.append({"stage": "label", "label_run": run,
                      "from": st["evaluate_dev"].get("dataset")})
    if st["rank"]:
        links.append({"stage": "rank", "document": st["rank"]["document"],
                      "capabilities": st["rank"]["capabilities"],
                      "from": st["label"].get("runs")})
    for env in st["environments"].get("environments", []):
        links.append({"stage": "environments", "environment": env["name"],
                      "status": env["status"], "capability": env["capability"]})
    for cap, a in st["train"].get("adapters", {}).items():
        links.append({"stage": "train", "adapter": a["id"], "path": a["path"],
                      "capability": cap, "from": a["environment"]})
    if st["compose"]:
        links.append({"stage": "compose", "moe": st["compose"]["id"],
                      "path": st["compose"]["path"],
                      "from": [a["id"] for a in st["train"].get("adapters", {}).values()]})
    for who, ev in st["evaluate_test"].items():
        links.append({"stage": "evaluate_test", "policy": who, "dataset": ev["dataset"],
                      "from": st["compose"].get("id") if who == "final" else
                      state["config"]["model"]})
    return links


# --------------------------------------------------------------------------- preflight


def preflight(db: Db, cfg: LoopConfig) -> dict[str, Any]:
    """Every check that needs no store write: model, domain, split sizes, environments,
    budget. Returns the environment names the capabilities will use (or None: decided by
    the ranking) and the measured one-step floor."""
    from trace_lib.workbench import models

    if cfg.model not in models.model_names() and not Path(cfg.model).expanduser().is_dir():
        raise UserInputError(f"loop: unknown model {cfg.model!r}; expected one of "
                             f"{', '.join(models.model_names())} or a model folder")
    domains = evaluation.task_set_domains()
    if cfg.domain not in domains:
        raise UserInputError(f"loop: domain {cfg.domain!r} has no target tasks; domains "
                             f"with target tasks: {', '.join(domains)}")
    sizes = {s["name"]: s["size"] for s in evaluation.task_splits()}
    for split, n in (("dev", cfg.dev_tasks), ("test", cfg.test_tasks)):
        if n is not None and not 1 <= n <= sizes[split]:
            raise UserInputError(f"loop: the {cfg.domain} {split} split has {sizes[split]} "
                                 f"tasks; cannot evaluate {n} of them")
    if cfg.engine not in ENGINES:
        raise UserInputError(f"loop: --engine {cfg.engine!r}: expected one of "
                             f"{', '.join(ENGINES)}")
    if cfg.engine == "vllm":
        from trace_lib.runtime.vllm_server import vllm_python

        vllm_python()  # no vLLM interpreter: refused now, not after an hour of stages
    if cfg.top_k is not None and cfg.top_k < 1:
        raise UserInputError(f"loop: --top-k {cfg.top_k}: expected at least 1")
    names = environments.environment_names()
    envs = None
    if cfg.capabilities:
        envs = []
        for cap in cfg.capabilities:
            name = f"{cfg.domain}/{cap}"
            if name not in names:
                have = sorted(n.split("/", 1)[1] for n in names if n.startswith(cfg.domain + "/"))
                raise UserInputError(
                    f"loop: capability {cap!r} has no environment in {cfg.domain} (with one: "
                    f"{', '.join(have)}); generate one on the Environments page first")
            envs.append(name)
    train_cfg = training.build_config(envs[0] if envs else f"{cfg.domain}/"
                                      "tool_calling_precision", cfg.model, **cfg.train)
    floor = None
    if cfg.budget_cpu_hours is not None:
        budget = cfg.budget_cpu_hours * 3600
        if budget <= 0:
            raise UserInputError(f"loop: --budget-cpu-hours {cfg.budget_cpu_hours}: expected "
                                 "a positive number")
        floor = one_step_floor_s(db, train_cfg)
        if budget < floor:
            raise UserInputError(
                f"loop: a budget of {budget:.3g} CPU-s is too small for one training step: "
                f"{train_cfg['group'] * train_cfg['groups_per_step']} rollouts need at least "
                f"their prompt's prefill, measured at {floor:.1f} CPU-s for {cfg.model}")
    return {"environments": envs, "one_step_floor_s": floor}


def one_step_floor_s(db: Db, train_cfg: dict[str, Any]) -> float:
    """A lower bound of one GRPO step's CPU: one prefill of the environment's prompt per
    rollout (the generations and the update come on top), timed here, best of two."""
    import torch

    from trace_lib.runtime.base_models import load_model, resolve_model

    path = resolve_model(train_cfg["model"])
    sample = environments.sample(train_cfg["env"], seed=0, db=db, model=str(path))
    n = int(sample["prompt_tokens"]["total"])
    model, _ = load_model(path)
    ids = torch.randint(0, int(model.config.vocab_size), (1, n))
    best = float("inf")
    with torch.no_grad():
        for _ in range(2):
            t0 = time.process_time()
            model(input_ids=ids)
            best = min(best, time.process_time() - t0)
    return best * train_cfg["group"] * train_cfg["groups_per_step"]


# ----------------------------------------------------------------------------- stages


def _eval_config(cfg: LoopConfig, split: str, n: int | None, run_id: str,
                 **policy: Any) -> dict[str, Any]:
    return {**cfg.eval, "model": cfg.model, "domain": cfg.domain, "split": split,
            "tasks": n, "run_id": run_id, **policy}


def _evaluate(db: Db, state: dict[str, Any], cfg: dict[str, Any], folder: str,
              say: Say, policy: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """An evaluation in the loop's folder; resumes its shards, never imports twice.
    `policy()` gives the engine's fields (called only when the evaluation runs, so a
    resume past it starts no server)."""

    out = _loop_dir(state) / folder
    for episodes in out.glob("*.jsonl"):  # killed after the import, before the state
        ds = evaluation.imported_dataset(db, episodes)
        if ds:
            return {"dataset": ds["name"], "dataset_id": ds["id"],
                    "episodes_path": str(episodes), **_verdict_counts(episodes)}
    doc = evaluation.evaluate(db, {**cfg, **policy()}, out_dir=out,
                              on_progress=lambda d, n: say(f"[loop] {folder}: {d}/{n} episodes"))
    return {**{k: doc.get(k) for k in ("dataset", "dataset_id", "trajectories", "successes",
                                       "pass_rate", "ci95", "floor", "split", "tasks",
                                       "episodes_path", "run_id")},
            "engine": _engine().engine}


def _verdict_counts(episodes: Path) -> dict[str, Any]:
    recs = [json.loads(x) for x in episodes.read_text(encoding="utf-8").splitlines()
            if x.strip()]
    k = sum(1 for r in recs if r.get("success"))
    return {"trajectories": len(recs), "successes": k,
            "pass_rate": k / len(recs) if recs else None}


def _loop_dir(state: dict[str, Any]) -> Path:
    return loops_dir() / state["id"]


def stage_evaluate_dev(db: Db, cfg: LoopConfig, state: dict[str, Any], say: Say) -> dict:
    ecfg = _eval_config(cfg, "dev", cfg.dev_tasks, f"{state['id']}-dev", label=cfg.model)
    return _evaluate(db, state, ecfg, "evaluate-dev", say, _engine().base_policy)


def stage_label(db: Db, cfg: LoopConfig, state: dict[str, Any], say: Say) -> dict:
    from trace_lib.scope import Scope

    dev = state["stages"]["evaluate_dev"]["artefact"]
    dataset = dev.get("dataset_id") or dev["dataset"]
    run_id = f"{state['id']}-{cfg.labeler}"
    status = {r["id"]: r["status"] for r in diagnose.label_runs(db).to_dict("records")}
    if run_id in status and status[run_id] in (None, "finished"):
        return {"runs": [run_id], "labeler": cfg.labeler}  # labelled before a restart
    if run_id in status:  # killed mid-run: complete it with its own settings
        runs = diagnose.label(db, None, resume=run_id)
    else:
        runs = diagnose.label(db, cfg.labeler, scope=Scope(datasets=(dataset,)),
                              run_prefix=run_id)
    return {"runs": [r.run_id for r in runs], "labeler": cfg.labeler,
            "labels": sum(r.n_labels for r in runs)}


def stage_rank(db: Db, cfg: LoopConfig, state: dict[str, Any], say: Say) -> dict:
    from trace_lib.diagnose.ranking import RankConfig
    from trace_lib.scope import Scope

    dev = state["stages"]["evaluate_dev"]["artefact"]
    dataset = dev.get("dataset_id") or dev["dataset"]
    runs = state["stages"]["label"]["artefact"]["runs"]
    view = diagnose.rankings(db, RankConfig(runs=runs), details=False,
                             scope=Scope(datasets=(dataset,)))
    document = diagnose.write_selected(_loop_dir(state) / "selected_capabilities.json",
                                       view.document)
    with_env = {n.split("/", 1)[1] for n in environments.environment_names()
                if n.startswith(cfg.domain + "/")}
    ranked = [r.capability for r in view.ranking.rows if r.status != "rejected"]
    if cfg.capabilities:
        chosen, why = list(cfg.capabilities), "named by the person"
    elif cfg.top_k:
        chosen = [c for c in ranked if c in with_env][:cfg.top_k]
        why = f"the {cfg.top_k} best-ranked with an environment"
    else:
        chosen, why = [c for c in view.kept if c in with_env], "the ranking's kept set"
    without = [c for c in view.kept if c not in with_env]
    return {"document": str(document), "kept": view.kept, "ranked": ranked,
            "capabilities": chosen, "chosen_by": why, "kept_without_environment": without}


def stage_environments(db: Db, cfg: LoopConfig, state: dict[str, Any], say: Say) -> dict:
    caps = state["stages"]["rank"]["artefact"]["capabilities"]
    out, waiting, rejected = [], [], []
    for cap in caps:
        name = f"{cfg.domain}/{cap}"
        status = environments.status_of(name, db=db)
        failed: list[str] = []
        if status not in ("approved", "validated"):
            say(f"[loop] validating {name} on {cfg.validate_seeds} seeds")
            report = environments.validate(name, n_seeds=cfg.validate_seeds, db=db)
            failed = [k for k, c in report.get("checks", {}).items()
                      if isinstance(c, dict) and not c.get("passed", True)]
            status = environments.status_of(name, db=db)
        approved_here = False
        if status == "validated" and cfg.approve_all:
            status = environments.approve(name, note=f"loop {state['id']} --approve-all",
                                          db=db)["status"]
            approved_here = True
            say(f"[loop] approved {name} (--approve-all)")
        if status == "rejected":
            rejected.append(f"{name} ({', '.join(failed) or 'rejected by a person'})")
        elif status != "approved":
            waiting.append(name)
        out.append({"name": name, "capability": cap, "status": status,
                    "approved_by_loop": approved_here, "failed_checks": failed})
    return {"environments": out, "awaiting_approval": waiting, "rejected": rejected}


def stage_train(db: Db, cfg: LoopConfig, state: dict[str, Any], say: Say) -> dict:
    art = state["stages"]["train"].get("artefact") or {"adapters": {}}
    for env in state["stages"]["environments"]["artefact"]["environments"]:
        cap = env["capability"]
        if cap in art["adapters"]:
            continue  # finished before a restart
        tcfg = training.build_config(env["name"], cfg.model, **cfg.train)
        say(f"[loop] training {cap}: SFT {tcfg['sft_steps']} + GRPO {tcfg['steps']} steps")
        # The folder's name is the adapter's job id (`a_<job id>`): unique per loop.
        run_dir = _loop_dir(state) / f"{state['id']}-train-{cap}"
        result = training.train_foreground(db, tcfg, run_dir=run_dir, progress=False)
        art["adapters"][cap] = {"id": result["adapter_id"], "path": result["adapter_path"],
                                "environment": env["name"],
                                "final_reward": result["final_reward"],
                                "steps": result["steps"]}
        state["stages"]["train"]["artefact"] = art
        _write_state(state)  # one adapter's work is never redone after a kill
    return art


def stage_compose(db: Db, cfg: LoopConfig, state: dict[str, Any], say: Say) -> dict:
    adapters = state["stages"]["train"]["artefact"]["adapters"]
    spec = ",".join(f"{cap}={a['path']}" for cap, a in adapters.items())
    out = _loop_dir(state) / "composed"
    composed = composition.compose(db, cfg.model, spec, out)
    envs = [a["environment"] for a in adapters.values()]
    gates = composition.train_gates(db, composition.gate_config(out, envs, **cfg.gates),
                                    progress=False)
    # Gate training writes the trained model into its own run folder; the zero-gate one
    # stays registered as what it was composed from.
    return {"id": gates["id"], "path": gates["moe_path"], "experts": composed["experts"],
            "gate_job": gates["job_id"], "final_reward": gates["final_reward"],
            "zero_gates": {"id": composed["id"], "path": composed["path"]}}


def stage_evaluate_test(db: Db, cfg: LoopConfig, state: dict[str, Any], say: Say) -> dict:
    art = state["stages"]["evaluate_test"].get("artefact") or {}
    moe = state["stages"]["compose"]["artefact"]["path"]
    envs = {cap: a["environment"] for cap, a in
            state["stages"]["train"]["artefact"]["adapters"].items()}
    serving = _engine()
    plan = (("base", {"label": cfg.model}, serving.base_policy),
            ("final", {"label": f"{cfg.model}+{state['id']}"}, lambda: serving.final_policy(
                db, moe, _loop_dir(state) / "per-request", envs)))
    for who, label, policy in plan:
        if who in art:
            continue
        ecfg = _eval_config(cfg, "test", cfg.test_tasks, f"{state['id']}-test-{who}", **label)
        art[who] = _evaluate(db, state, ecfg, f"evaluate-test-{who}", say, policy)
        state["stages"]["evaluate_test"]["artefact"] = art
        _write_state(state)
    return art


def stage_compare(db: Db, cfg: LoopConfig, state: dict[str, Any], say: Say) -> dict:
    ev = state["stages"]["evaluate_test"]["artefact"]
    doc = evaluation.compare(db, ev["base"]["dataset"], ev["final"]["dataset"])
    path = _loop_dir(state) / "comparison.json"
    path.write_text(json.dumps(doc, indent=2, default=str) + "\n", encoding="utf-8")
    paired = doc["paired"]
    return {"path": str(path), "base": doc["a"]["pass_rate"], "final": doc["b"]["pass_rate"],
            "base_ci95": doc["a"]["ci95"], "final_ci95": doc["b"]["ci95"],
            "tasks": paired["tasks"], "base_only": paired["a_only"],
            "final_only": paired["b_only"], "p_value": paired["p_value"],
            "floor": ev["base"].get("floor")}


STAGE_FUNCTIONS: dict[str, Callable[[Db, LoopConfig, dict[str, Any], Say], dict]] = {
    "evaluate_dev": stage_evaluate_dev, "label": stage_label, "rank": stage_rank,
    "environments": stage_environments, "train": stage_train, "compose": stage_compose,
    "evaluate_test": stage_evaluate_test, "compare": stage_compare}


# ----------------------------------------------------------------------------- driver


def new_loop(db: Db, cfg: LoopConfig) -> dict[str, Any]:
    """Check everything (nothing written on a refusal), then the loop's first state."""
    from trace_lib import jobs
    from trace_lib.jobs.spec import now_iso

    checks = preflight(db, cfg)
    source = _reusable(db, cfg) if cfg.reuse_from else None
    loop_id = jobs.new_job_id("loop")
    state = {"id": loop_id, "config": dataclasses.asdict(cfg), "db": str(db) if db else None,
             "state": "created", "stage": None, "cpu_s": 0.0, "created_at": now_iso(),
             "preflight": checks, "pid": None, "message": None,
             "stages": {s: {"state": "pending", "artefact": None, "cpu_s": 0.0}
                        for s in STAGES}}
    if source is not None:
        for name in REUSED_STAGES:
            state["stages"][name] = {"state": "done", "cpu_s": 0.0,
                                     "artefact": source["stages"][name]["artefact"],
                                     "reused_from": source["id"]}
        base = (source["stages"]["evaluate_test"].get("artefact") or {}).get("base")
        if base:  # stage_evaluate_test runs only what its artefact lacks
            state["stages"]["evaluate_test"]["artefact"] = {
                "base": {**base, "reused_from": source["id"]}}
    _write_state(state)
    return state


REUSED_STAGES = ("evaluate_dev", "label")
# What must agree for another loop's evaluations to be this loop's.
_SHARED_SETTINGS = ("model", "domain", "dev_tasks", "test_tasks", "labeler", "eval", "engine")


def _reusable(db: Db, cfg: LoopConfig) -> dict[str, Any]:
    """The loop `cfg.reuse_from` names, checked: same store and settings, diagnosis done."""
    source = read_state(str(cfg.reuse_from))
    ours = dataclasses.asdict(cfg)
    differ = [k for k in _SHARED_SETTINGS if source["config"].get(k) != ours[k]]
    if differ:
        raise UserInputError(
            f"loop: --reuse-from {source['id']}: its " + ", ".join(
                f"{k} ({source['config'].get(k)!r}, here {ours[k]!r})" for k in differ)
            + " differ; its evaluations would not be this loop's")
    here = str(Path(db).resolve()) if db else None
    there = str(Path(source["db"]).resolve()) if source.get("db") else None
    if here != there:
        raise UserInputError(f"loop: --reuse-from {source['id']}: it ran on the store "
                             f"{there or 'the default'}, this loop on {here or 'the default'}; "
                             "its datasets and label runs are in that store")
    missing = [n for n in REUSED_STAGES if source["stages"][n]["state"] != "done"]
    if missing:
        raise UserInputError(f"loop: --reuse-from {source['id']}: its {', '.join(missing)} "
                             "stage has not finished; resume that loop first")
    return source


def run_loop(db: Db, cfg: LoopConfig | None = None, *, resume: str | None = None,
             say: Say | None = None, budget_cpu_hours: float | None = None
             ) -> dict[str, Any]:
    """Run (or `resume`) the loop in this process until it finishes, waits for approval or
    spends its budget; returns the state. `budget_cpu_hours` on a resume raises the limit."""
    say = say or (lambda line: print(line, file=sys.stderr, flush=True))
    if resume:
        state = read_state(resume)
        _refuse_a_second_driver(state)
        cfg = LoopConfig.from_dict(state["config"])
        if budget_cpu_hours is not None:
            cfg.budget_cpu_hours = budget_cpu_hours
            state["config"]["budget_cpu_hours"] = budget_cpu_hours
    else:
        state = new_loop(db, cfg or LoopConfig())
        cfg = LoopConfig.from_dict(state["config"])
    db = db if db is not None else state.get("db")
    state.update(state="running", pid=os.getpid(), message=None)
    _write_state(state)
    serving = LoopServing(cfg.engine, cfg.model, _loop_dir(state))
    token = _SERVING.set(serving)
    try:
        return _run_stages(db, cfg, state, say)
    finally:
        _SERVING.reset(token)
        server_cpu = serving.close()
        if server_cpu:  # the vLLM tree's CPU, which getrusage never sees
            state["cpu_s"] += server_cpu
            state["server_cpu_s"] = state.get("server_cpu_s", 0.0) + server_cpu
            _write_state(state)


def _run_stages(db: Db, cfg: LoopConfig, state: dict[str, Any], say: Say) -> dict[str, Any]:
    budget = cfg.budget_cpu_hours * 3600 if cfg.budget_cpu_hours is not None else None
    for name in STAGES:
        stage = state["stages"][name]
        if stage["state"] == "done":
            continue
        if budget is not None and state["cpu_s"] >= budget:
            return _stop(state, "over budget", f"spent {state['cpu_s']:.0f} of {budget:.0f} "
                         f"CPU-s before {name}; `loop --resume {state['id']} "
                         "--budget-cpu-hours H` with a larger H goes on")
        say(f"[loop] {state['id']}: {name}")
        state["stage"] = name
        stage.update(state="running", started_at=time.time())
        _write_state(state)
        c0 = _cpu_s()
        try:
            artefact = STAGE_FUNCTIONS[name](db, cfg, state, say)
        except BaseException as exc:
            spent = _cpu_s() - c0 + _engine().take_cpu_s()
            stage["state"] = "failed"
            stage["cpu_s"] += spent
            state["cpu_s"] += spent
            _stop(state, "failed", f"{name}: {exc}")
            raise
        server = _engine().take_cpu_s()  # the vLLM tree's CPU, which getrusage never sees
        spent = _cpu_s() - c0 + server
        stage.update(state="done", artefact=artefact, finished_at=time.time())
        stage["cpu_s"] += spent
        state["cpu_s"] += spent
        if server:
            state["server_cpu_s"] = state.get("server_cpu_s", 0.0) + server
        _write_state(state)
        if name == "rank" and not artefact["capabilities"]:
            return _stop(state, "nothing to train", _nothing_to_train(artefact))
        if name == "environments" and artefact["rejected"]:
            stage["state"] = "pending"
            return _stop(state, "environment rejected", (
                "not trainable: " + "; ".join(artefact["rejected"]) + ". See the "
                "Environments page; drop the capability with --capabilities"))
        if name == "environments" and artefact["awaiting_approval"]:
            stage["state"] = "pending"  # checked again on the resume, after the approval
            return _stop(state, "awaiting approval", (
                "approve " + ", ".join(artefact["awaiting_approval"]) + " (Environments page "
                "or `python -m trace_lib env approve NAME`), then `loop --resume "
                f"{state['id']}`"))
    return _stop(state, "succeeded", None)


def _nothing_to_train(rank: dict[str, Any]) -> str:
    if rank["kept_without_environment"]:
        return ("the ranking kept " + ", ".join(rank["kept_without_environment"]) +
                ", which have no environment yet: generate them on the Environments page, or "
                "name capabilities with --capabilities")
    return ("the ranking kept no capability on these trajectories (see "
            f"{rank['document']}); name capabilities with --capabilities or --top-k")


def _stop(state: dict[str, Any], status: str, message: str | None) -> dict[str, Any]:
    state.update(state=status, message=message, pid=None)
    _write_state(state)
    return state


def start_background(db: Db, cfg: LoopConfig | None = None, *, resume: str | None = None,
                     budget_cpu_hours: float | None = None) -> dict[str, Any]:
    """The loop as a detached process (`loop --background`): checks and the first state
    here (a refusal is an error now, not in a log), the stages there."""
    if resume:
        state = read_state(resume)
        _refuse_a_second_driver(state)
    else:
        state = new_loop(db, cfg or LoopConfig())
    cmd = [sys.executable, "-m", "trace_lib", "loop", "--resume", state["id"]]
    if db is not None:
        cmd += ["--db", str(db)]
    if budget_cpu_hours is not None:
        cmd += ["--budget-cpu-hours", str(budget_cpu_hours)]
    log = _loop_dir(state) / "loop.log"
    state.update(state="starting", message=None)
    _write_state(state)  # before the driver exists: nothing of its can be overwritten
    with open(log, "ab") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    # The driver writes its own pid and every state after; writing here could overwrite a
    # stage it already recorded.
    return {**state, "state": "starting", "pid": proc.pid, "log": str(log)}
