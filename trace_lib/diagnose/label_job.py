"""The `label` job kind, job side: label exported transcripts into result files.

    run dir: transcripts/shard-0000.jsonl.gz   written by the app (`background_labeling`)
             labels/shard-0000.jsonl           one line per trajectory, written here
             metrics.jsonl                     progress: step = trajectories labeled
             result.json                       the run's totals (by the runner)

Design decisions
- The job never opens the store: the app exports the scoped transcripts and the labeler
  config into the run directory, and records the result files into the store once the
  job succeeded (`background_labeling.record_label_job`). The database keeps one writer,
  and a job on another machine needs only the (shared) run directory.
- The work is split into shards when it is exported. A shard is the unit of both
  parallelism and resume: its labels file appears (temp file, then `os.replace`) only
  once every trajectory of the shard is labeled, so a killed job leaves either a whole
  shard or none, and running the same spec.json again labels only the shards missing.
- On the ray backend each missing shard is one Ray task (the job's entry point is the
  driver and only waits); on the local backend the shards run one after the other in
  the job process. Both call the same `label_shard`, so the labels are the same.
- Fail loud: the labeler's `preflight()` runs before any shard; `LabelerUnavailable`
  ends the job failed; a run whose every pair failed ends failed too (the app marks the
  label run failed with the job's error).
- A result line carries what its labels rest on (the prompt's cut, each pair's evidence
  check) and the totals count them as an in-process run does (`label_grounds`); the
  labeler's notes (its context, what counted tokens) go into result.json for the app to
  record on the run.
"""

from __future__ import annotations

import gzip
import json
import os
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trace_lib.data_model import Capability
from trace_lib.diagnose.label_grounds import Grounds
from trace_lib.diagnose.labelers import Labeler, PairLabel, TrajectoryLabels, get_labeler
from trace_lib.errors import UserInputError
from trace_lib.llm import Usage
from trace_lib.transcript_model import Call, Transcript

if TYPE_CHECKING:
    from trace_lib.jobs.spec import JobSpec

TRANSCRIPTS = "transcripts"
LABELS = "labels"
METRICS = "metrics.jsonl"
REQUIRED = ("run_id", "labeler", "capabilities", "shards")


# ------------------------------------------------------------------ the file formats

def transcript_to_json(t: Transcript) -> dict[str, Any]:
    return {"trajectory": t.trajectory, "messages": t.messages,
            "calls": [asdict(c) for c in t.calls], "expected": [asdict(c) for c in t.expected]}


def transcript_from_json(d: dict[str, Any]) -> Transcript:
    return Transcript(trajectory=d["trajectory"], messages=d["messages"],
                      calls=[Call(**c) for c in d.get("calls", [])],
                      expected=[Call(**c) for c in d.get("expected", [])])


def shard_name(i: int) -> str:
    return f"shard-{i:04d}"


def write_shard(run_dir: Path, name: str, transcripts: list[Transcript]) -> Path:
    """Export one shard of transcripts (gzip JSONL) into the run directory."""
    path = run_dir / TRANSCRIPTS / f"{name}.jsonl.gz"
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt", encoding="utf-8") as f:
        for t in transcripts:
            f.write(json.dumps(transcript_to_json(t), default=str) + "\n")
    return path


def read_shard(run_dir: Path, name: str) -> list[Transcript]:
    path = run_dir / TRANSCRIPTS / f"{name}.jsonl.gz"
    out = []
    try:
        with gzip.open(path, "rt", encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                try:
                    out.append(transcript_from_json(json.loads(line)))
                except (ValueError, KeyError, TypeError) as exc:
                    raise UserInputError(f"{path}: record {n}: not an exported transcript "
                                         f"({type(exc).__name__}: {exc})") from exc
    except FileNotFoundError as exc:
        raise UserInputError(f"{path}: the exported shard is missing") from exc
    return out


def labels_path(run_dir: Path, name: str) -> Path:
    return run_dir / LABELS / f"{name}.jsonl"


def result_to_json(r: TrajectoryLabels) -> dict[str, Any]:
    return {"trajectory_id": r.trajectory_id, "labels": [asdict(p) for p in r.labels],
            "usage": asdict(r.usage), "cut_messages": r.cut_messages,
            "cut_tokens": r.cut_tokens}


def result_from_json(row: dict[str, Any]) -> TrajectoryLabels:
    """A result line back as labels (lines from before issue 31 carry no cut: None)."""
    return TrajectoryLabels(row["trajectory_id"], [PairLabel(**p) for p in row["labels"]],
                            Usage(**row.get("usage", {})), row.get("cut_messages"),
                            row.get("cut_tokens"))


def read_labels(run_dir: Path, name: str) -> list[dict[str, Any]]:
    """The labels of one finished shard (the file exists only once the shard is whole)."""
    path = labels_path(run_dir, name)
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# ------------------------------------------------------------------------ labeling

def _config(spec_config: dict[str, Any], where: str) -> dict[str, Any]:
    missing = [k for k in REQUIRED if k not in spec_config]
    if missing:
        raise UserInputError(f"{where}: config lacks {missing}; expected {list(REQUIRED)}")
    if not isinstance(spec_config["shards"], list) or not spec_config["shards"]:
        raise UserInputError(f"{where}: config field `shards` must be a non-empty list")
    return spec_config


# One labeler per config and process: the shards a process labels share it, so an LLM
# labeler asks its server for the context and loads its tokenizer once, not per shard.
_LABELERS: dict[str, Labeler] = {}
_LABELERS_LOCK = threading.Lock()


def _labeler(cfg: dict[str, Any]) -> tuple[Labeler, list[Capability]]:
    key = json.dumps([cfg["labeler"], cfg.get("labeler_cfg") or {}], sort_keys=True,
                     default=str)
    with _LABELERS_LOCK:
        if key not in _LABELERS:
            _LABELERS[key] = get_labeler(cfg["labeler"], **(cfg.get("labeler_cfg") or {}))
        lab = _LABELERS[key]
    caps = [Capability(**c) for c in cfg["capabilities"]]
    return lab, caps


def _results(lab: Labeler, caps: list[Capability], transcripts: list[Transcript], seed: int,
             n_runs: int) -> Iterator[TrajectoryLabels]:
    def one(t: Transcript) -> TrajectoryLabels:
        return lab.label(t, caps, seed=seed, n_runs=n_runs)

    if lab.concurrency <= 1:
        yield from map(one, transcripts)
        return
    step = 2 * lab.concurrency  # few calls in flight to waste when the job is stopped
    with ThreadPoolExecutor(max_workers=lab.concurrency) as pool:
        for i in range(0, len(transcripts), step):
            yield from pool.map(one, transcripts[i:i + step])


def label_shard(run_dir: str, cfg: dict[str, Any], name: str,
                should_stop: Callable[[], bool] = lambda: False) -> dict[str, Any] | None:
    """Label one shard into its labels file; returns its totals, or None when stopped
    first (then no file is written: a partial shard never counts)."""
    from trace_lib.jobs.kinds import Cancelled

    rd = Path(run_dir)
    lab, caps = _labeler(cfg)
    transcripts = read_shard(rd, name)
    out = labels_path(rd, name)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    usage, n_labels, n_failed, first_error = Usage(), 0, 0, None
    grounds = Grounds()
    with tmp.open("w") as f:
        for res in _results(lab, caps, transcripts, int(cfg.get("seed", 0)),
                            int(cfg.get("n_runs", 1))):
            f.write(json.dumps(result_to_json(res)) + "\n")
            usage.add(res.usage)
            grounds.add(res)
            n_labels += len(res.labels)
            failed = [p for p in res.labels if p.value is None]
            n_failed += len(failed)
            first_error = first_error or (failed[0].error if failed else None)
            if should_stop():
                tmp.unlink(missing_ok=True)
                raise Cancelled()
    os.replace(tmp, out)
    return {"shard": name, "n_trajectories": len(transcripts), "n_labels": n_labels,
            "n_failed": n_failed, "first_error": first_error, "usage": asdict(usage),
            "grounds": grounds.to_json(),
            "pid": os.getpid()}  # which process labeled it (a Ray worker on ray)


def _shard_totals(rd: Path, name: str) -> dict[str, Any]:
    """The totals of a shard labeled by an earlier attempt (a resumed job)."""
    results = [result_from_json(r) for r in read_labels(rd, name)]
    usage, grounds = Usage(), Grounds()
    for r in results:
        usage.add(r.usage)
        grounds.add(r)
    pairs = [p for r in results for p in r.labels]
    failed = [p for p in pairs if p.value is None]
    return {"shard": name, "n_trajectories": len(results), "n_labels": len(pairs),
            "n_failed": len(failed), "first_error": failed[0].error if failed else None,
            "usage": asdict(usage), "grounds": grounds.to_json(), "pid": None}


def _progress(rd: Path, done: list[dict[str, Any]], total: int) -> None:
    line = {"step": sum(d["n_trajectories"] for d in done), "total": total,
            "shards_done": len(done)}
    with (rd / METRICS).open("a") as f:
        f.write(json.dumps(line) + "\n")


def _run_local(rd: Path, cfg: dict[str, Any], todo: list[str], done: list[dict[str, Any]],
               total: int, should_stop: Callable[[], bool]) -> None:
    for name in todo:
        done.append(label_shard(str(rd), cfg, name, should_stop))
        _progress(rd, done, total)


def _run_ray(rd: Path, cfg: dict[str, Any], todo: list[str], done: list[dict[str, Any]],
             total: int, should_stop: Callable[[], bool]) -> None:
    from trace_lib.jobs.ray import run_tasks

    def finished(totals: dict[str, Any]) -> None:
        done.append(totals)
        _progress(rd, done, total)

    run_tasks(label_shard, [(str(rd), cfg, name) for name in todo],
              float(cfg.get("shard_cpus", 1)), should_stop, finished)


def run_job(spec: JobSpec, run_dir: Path, should_stop: Callable[[], bool]) -> dict[str, Any]:
    """The `label` job: label every shard not labeled yet, then total the run."""
    cfg = _config(spec.config, f"{run_dir / 'spec.json'}: config")
    lab, _ = _labeler(cfg)
    preflight = getattr(lab, "preflight", None)
    if callable(preflight):
        preflight()
    shards = [str(s) for s in cfg["shards"]]
    total = int(cfg.get("n_trajectories", 0))
    done = [_shard_totals(run_dir, s) for s in shards if labels_path(run_dir, s).exists()]
    todo = [s for s in shards if not labels_path(run_dir, s).exists()]
    print(f"[label] run {cfg['run_id']}: {len(todo)} of {len(shards)} shards to label "
          f"({spec.backend})", flush=True)
    (_run_ray if spec.backend == "ray" else _run_local)(run_dir, cfg, todo, done, total,
                                                       should_stop)
    usage, grounds = Usage(), Grounds()
    for d in done:
        usage.add(Usage(**d["usage"]))
        grounds.merge(d.get("grounds") or {})
    n_labels = sum(d["n_labels"] for d in done)
    n_failed = sum(d["n_failed"] for d in done)
    if n_labels and n_failed == n_labels:
        first = next((d["first_error"] for d in done if d["first_error"]), None)
        raise RuntimeError(f"all {n_failed} pairs failed; first error: {first}")
    cost = usage.to_dict(lab.model) if lab.model else usage.to_dict()
    cost["n_failed_pairs"] = n_failed
    return {"run_id": cfg["run_id"], "labeler": lab.name, "shards": sorted(shards),
            "n_trajectories": sum(d["n_trajectories"] for d in done), "n_labels": n_labels,
            "n_failed": n_failed, "cost": cost, "n_cut": grounds.n_cut,
            "n_unsupported": grounds.n_unsupported, "unsupported_rate": grounds.rates(),
            "notes": list(getattr(lab, "notes", None) or []),
            "shard_pids": {d["shard"]: d["pid"] for d in done}}
