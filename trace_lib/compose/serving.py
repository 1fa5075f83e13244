"""Serving a composed model through the project's policy server, with routing traces.

Design decisions
- The composed model is the base HF model with hooks, so the training stage's
  `PolicyEngine` (its batched decode loop with a KV cache) runs it unchanged; only the
  loading differs. `MoEChatService` is `ChatService` with the model coming from a composed
  folder instead of the model registry, and `MoEPolicyServer` is `PolicyServer` starting
  that service: same routes, same wire format (vLLM's), so environments, evaluation, the
  rollout client and the app talk to it as to any policy. Adapter hot-loading stays
  available on top (a served LoRA then adds to the mixture's output).
- Every completion is traced: after the engine answers, the prompt ids plus each
  choice's sampled ids go through one teacher-forced forward with recording (routing is
  causal, so this is the routing the generation used). Each choice carries a `routing`
  summary (an extension field; OpenAI clients ignore unknown fields): the slot names, the
  request-level choice per layer (what a per-request router would pick), the share of the
  completion's token-layer choices per slot, and, with `record_dir`, the id of the full
  trace saved as `<id>.npz` + `<id>.json` (ids also in `routing_trace_ids`). The extra
  forward costs about one prefill per choice; `trace=False` turns it off. Routing state is
  per thread in `GatedMoE`, so tracing on the request thread never disturbs the engine's
  worker.
- Roles of a served request come from the ChatML markers in the token text
  (`<|im_start|>role`, `<tool_response>` inside a user turn = tool), since the server sees
  token ids, not message objects.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trace_lib.compose.gated import GatedMoE, load_moe
from trace_lib.compose.traces import trace_ids
from trace_lib.runtime.policy_server import ChatService, PolicyServer, ServerConfig


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


def routing_summary(trace: Any, request: list[bool] | None = None) -> dict[str, Any]:
    """What a completion's `routing` field says: slots, the request-level choice per layer
    (majority over the request tokens, or the prompt when there is none), and the share
    of the completion's token-layer choices per slot."""
    import numpy as np

    k1 = len(trace.slots)
    n = trace.prompt_len
    rows = np.asarray(request[:n], dtype=bool) if request is not None and any(request[:n]) \
        else np.ones(n, dtype=bool)
    prompt = trace.chosen[:n][rows]
    per_layer = [int(np.bincount(prompt[:, layer], minlength=k1).argmax())
                 for layer in range(trace.n_layers)] if len(prompt) else []
    gen = trace.chosen[n:]
    counts = np.bincount(gen.reshape(-1), minlength=k1) if gen.size else np.zeros(k1)
    total = max(int(counts.sum()), 1)
    return {"slots": list(trace.slots), "mode": trace.meta.get("mode"),
            "request_choice": per_layer,
            "request_slot": int(np.bincount(per_layer, minlength=k1).argmax())
            if per_layer else 0,
            "completion_share": [round(float(c) / total, 4) for c in counts]}


class MoEChatService(ChatService):
    """`ChatService` over a composed model folder; every choice carries its routing."""

    def __init__(self, config: ServerConfig, moe: GatedMoE, record_dir: str | Path | None = None,
                 trace: bool = True):
        super().__init__(config, model=moe.model, tokenizer=moe.tokenizer)
        self.moe = moe
        self.record_dir = Path(record_dir) if record_dir else None
        self.trace = trace or self.record_dir is not None
        self.model_path = str(moe.folder or config.model)  # the composed folder, not the base

    def response(self, prompt_ids: list[int], samples: list[Any],
                 opts: dict[str, Any]) -> dict[str, Any]:
        out = super().response(prompt_ids, samples, opts)
        if not self.trace:
            return out
        request = self.moe.request_tokens(list(prompt_ids)).tolist()
        ids_out = []
        for choice, s in zip(out["choices"], samples, strict=True):
            ids = list(prompt_ids) + list(s.token_ids)
            tokens = [self.tokenizer.decode([i]) for i in ids]
            roles, turns = chatml_roles(tokens)
            roles[len(prompt_ids):] = ["assistant"] * len(s.token_ids)
            trace = trace_ids(self.moe, ids, roles, turns, len(prompt_ids),
                              meta={"source": "server", "model": opts.get("model")})
            summary = routing_summary(trace, request)
            if self.record_dir is not None:
                trace.save(self.record_dir)
                ids_out.append(trace.id)
                summary["trace_id"] = trace.id
            choice["routing"] = summary
        if self.record_dir is not None:
            out["routing_trace_ids"] = ids_out
        return out


class MoEPolicyServer(PolicyServer):
    """The policy server (background thread) serving a composed model folder."""

    thread_name = "moe-policy-server"

    def __init__(self, moe_dir: str | Path, record_dir: str | Path | None = None,
                 mode: str | None = None, config: ServerConfig | None = None,
                 trace: bool = True, **overrides: Any):
        cfg = config or ServerConfig(**{"model": str(moe_dir), **overrides})
        super().__init__(cfg)
        self.moe_dir = Path(moe_dir)
        self.record_dir = record_dir
        self.mode = mode
        self.trace = trace

    def make_service(self) -> MoEChatService:
        return MoEChatService(self.config, load_moe(self.moe_dir, mode=self.mode),
                              self.record_dir, trace=self.trace)
