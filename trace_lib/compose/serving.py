"""Serving a composed model through the project's policy server, with routing traces.

Design decisions
- The composed model is the base HF model with hooks, so the training stage's
  `PolicyEngine` (its batched decode loop with a KV cache) runs it unchanged; only the
  loading differs. `MoEChatService` is `ChatService` with the model coming from a composed
  folder instead of the model registry, and `MoEPolicyServer` is `PolicyServer` starting
  that service: same routes, same wire format (vLLM's), so environments, evaluation, the
  rollout client and the app talk to it as to any policy. Adapter hot-loading stays
  available on top (a served LoRA then adds to the mixture's output).
- With `record_dir`, every completion is traced: after the engine answers, the prompt ids
  plus each choice's sampled ids go through one teacher-forced forward with recording
  (routing is causal, so this is the routing the generation used) and are saved as
  `<id>.npz` + `<id>.json`; the response carries the trace ids in `routing_trace_ids`
  (an extension field; OpenAI clients ignore unknown fields). Routing state is per thread
  in `GatedMoE`, so tracing on the request thread never disturbs the engine's worker.
- Roles of a served request come from the ChatML markers in the token text
  (`<|im_start|>role`, `<tool_response>` inside a user turn = tool), since the server sees
  token ids, not message objects.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from trace_lib.compose.gated import GatedMoE, load_moe
from trace_lib.compose.traces import trace_ids
from trace_lib.train.policy_engine import PolicyEngine
from trace_lib.train.policy_server import ChatService, PolicyServer, ServerConfig, build_app


def chatml_roles(tokens: list[str]) -> tuple[list[str], list[int]]:
    """Role and turn of each decoded token of a ChatML sequence, as `token_roles` assigns
    them from messages: a block is everything from its `<|im_start|>` to the next one; a user
    block carrying `<tool_response>` is the tool's; turn = assistant blocks before it."""
    roles: list[str] = []
    turns: list[int] = []
    starts = [i for i, t in enumerate(tokens) if "<|im_start|>" in t]
    if not starts or starts[0] != 0:
        starts = [0] + starts
    bounds = starts + [len(tokens)]
    turn = 0
    for b in range(len(starts)):
        lo, hi = bounds[b], bounds[b + 1]
        text = "".join(tokens[lo:hi])
        header = text.split("<|im_start|>", 1)[-1].split("\n", 1)[0].strip()
        role = header if header in ("system", "user", "assistant") else "user"
        if role == "user" and "<tool_response>" in text:
            role = "tool"
        roles += [role] * (hi - lo)
        turns += [turn] * (hi - lo)
        if role == "assistant":
            turn += 1
    return roles, turns


class MoEChatService(ChatService):
    """`ChatService` over a composed model folder, optionally recording routing traces."""

    def __init__(self, config: ServerConfig, moe: GatedMoE, record_dir: str | Path | None = None):
        import torch

        if config.torch_threads:
            torch.set_num_threads(config.torch_threads)
        self.moe = moe
        self.record_dir = Path(record_dir) if record_dir else None
        model, tok = moe.model, moe.tokenizer
        self.tokenizer = tok
        self.served_name = config.served_model_name or config.model
        self.model_path = str(moe.folder or config.model)
        self.max_model_len = config.max_model_len or int(
            getattr(model.config, "max_position_embeddings", 2048))
        eos = model.generation_config.eos_token_id
        eos_ids = [eos] if isinstance(eos, int) else list(eos or [])
        eos_ids = eos_ids or [tok.eos_token_id]
        self.engine = PolicyEngine(model, tok, eos_ids, self.max_model_len)
        self.default_max_tokens = config.default_max_tokens
        self.created = int(time.time())

    def response(self, prompt_ids: list[int], samples: list[Any],
                 opts: dict[str, Any]) -> dict[str, Any]:
        out = super().response(prompt_ids, samples, opts)
        if self.record_dir is not None:
            ids_out = []
            for s in samples:
                ids = list(prompt_ids) + list(s.token_ids)
                tokens = [self.tokenizer.decode([i]) for i in ids]
                roles, turns = chatml_roles(tokens)
                roles[len(prompt_ids):] = ["assistant"] * len(s.token_ids)
                trace = trace_ids(self.moe, ids, roles, turns, len(prompt_ids),
                                  meta={"source": "server", "model": opts.get("model")})
                trace.save(self.record_dir)
                ids_out.append(trace.id)
            out["routing_trace_ids"] = ids_out
        return out


class MoEPolicyServer(PolicyServer):
    """The policy server (background thread) serving a composed model folder."""

    def __init__(self, moe_dir: str | Path, record_dir: str | Path | None = None,
                 mode: str | None = None, config: ServerConfig | None = None,
                 **overrides: Any):
        cfg = config or ServerConfig(**{"model": str(moe_dir), **overrides})
        super().__init__(cfg)
        self.moe_dir = Path(moe_dir)
        self.record_dir = record_dir
        self.mode = mode

    def start(self, timeout: float = 120.0) -> MoEPolicyServer:
        import threading

        import uvicorn

        from trace_lib.train.policy_server import free_port

        if self.config.port == 0:
            self.config.port = free_port(self.config.host)
        moe = load_moe(self.moe_dir, mode=self.mode)
        self.service = MoEChatService(self.config, moe, self.record_dir)
        cfg = uvicorn.Config(build_app(self.service), host=self.config.host,
                             port=self.config.port, log_level="warning", access_log=False,
                             lifespan="off")
        self._server = uvicorn.Server(cfg)
        self._thread = threading.Thread(target=self._server.run, name="moe-policy-server",
                                        daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"policy server did not start on {self.url}")
            time.sleep(0.02)
        return self
