"""Routing traces: which expert handled each token at each layer, with the token's role.

Design decisions
- A trace is arrays plus a small JSON: `chosen` [T, L] (slot per token and layer, 0 =
  base), `probs` [T, L, K+1] (gate probabilities, float16 on disk), token ids, and per
  token its text, role (system/user/assistant/tool) and turn. Saved as `<id>.npz` +
  `<id>.json` in the run directory; the app/CLI index them in DuckDB
  (`trace_lib/workbench/composition.py`), never code that may run inside a job.
- Roles come from the chat template itself: the conversation is rendered prefix by prefix
  (`chat_format.render_prompt`), which gives each message's character span, and the full
  text is tokenised once with offsets, so a token's role is the role of the span its first
  character falls in. No second tokenisation of pieces, so boundaries cannot drift.
- A trace is taken by a teacher-forced forward over the finished token sequence (prompt
  plus what was generated, the sampled ids themselves). Routing is causal, so this gives
  the routing the model used while generating, and it covers the last sampled token too
  (which generation never feeds back). In `trajectory` mode the pooled choice is taken
  over the request (the user's turn) inside the prompt (`prompt_mask` bounds it), as at
  prefill.
- Turn = the number of assistant messages before the token's message, so an assistant
  reply and the tool results that answer it share nothing: "turn 2" is the second reply
  and everything that led up to it.
- Traces of several conversations that open alike (one environment's requests share the
  system prompt and tool block, ~1,000 tokens of ~1,500) can share that opening's forward
  (`TracePrefix`): in `top1` and `soft` mode a token's routing depends on the tokens
  before it only, so the opening's KV cache and routing, computed once, are exactly what
  each full forward would compute there. Not in `trajectory` mode, whose choice pools
  over the whole request (the opening's states depend on what follows it).
- Summaries (share by role / turn / outcome, entropy along the tokens, majority over
  layers) are functions of the arrays here, so the page, the notebook and the CLI show
  the same numbers.
"""

from __future__ import annotations

import copy
import json
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from trace_lib.compose.gated import GatedMoE
from trace_lib.errors import UserInputError

ROLES: tuple[str, ...] = ("system", "user", "assistant", "tool")


@dataclass
class RoutingTrace:
    token_ids: list[int]
    tokens: list[str]
    roles: list[str]
    turns: list[int]
    chosen: np.ndarray  # [T, L] int
    probs: np.ndarray  # [T, L, K+1] float
    slots: list[str]  # slot index -> "base" or the adapter's capability
    prompt_len: int
    meta: dict[str, Any] = field(default_factory=dict)
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])

    @property
    def n_tokens(self) -> int:
        return int(self.chosen.shape[0])

    @property
    def n_layers(self) -> int:
        return int(self.chosen.shape[1])

    def to_json(self, with_probs: bool = True) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": self.id,
            "slots": self.slots,
            "prompt_len": self.prompt_len,
            "layers": self.n_layers,
            "tokens": self.tokens,
            "token_ids": self.token_ids,
            "roles": self.roles,
            "turns": self.turns,
            "chosen": self.chosen.astype(int).tolist(),
            "meta": self.meta,
        }
        if with_probs:
            out["probs"] = np.round(self.probs.astype(np.float64), 4).tolist()
        return out

    def save(self, folder: str | Path) -> Path:
        """Write `<id>.npz` (arrays) and `<id>.json` (text, roles, slots, meta)."""
        root = Path(folder)
        root.mkdir(parents=True, exist_ok=True)
        path = root / f"{self.id}.npz"
        np.savez_compressed(path, chosen=self.chosen.astype(np.int16),
                            probs=self.probs.astype(np.float16),
                            token_ids=np.asarray(self.token_ids, dtype=np.int64))
        side = {k: v for k, v in self.to_json(with_probs=False).items()
                if k not in ("chosen", "token_ids")}
        (root / f"{self.id}.json").write_text(json.dumps(side, ensure_ascii=False))
        return path

    @classmethod
    def load(cls, path: str | Path) -> RoutingTrace:
        npz_path = Path(path).with_suffix(".npz")
        side_path = npz_path.with_suffix(".json")
        if not npz_path.is_file() or not side_path.is_file():
            raise UserInputError(f"{npz_path}: routing trace missing (.npz and .json expected)")
        arrays = np.load(npz_path)
        side = json.loads(side_path.read_text())
        return cls(token_ids=arrays["token_ids"].tolist(), tokens=side["tokens"],
                   roles=side["roles"], turns=side["turns"], chosen=arrays["chosen"].astype(int),
                   probs=arrays["probs"].astype(np.float32), slots=side["slots"],
                   prompt_len=side["prompt_len"], meta=side.get("meta", {}), id=side["id"])


# ------------------------------------------------------------------------ summaries
def majority(trace: RoutingTrace) -> np.ndarray:
    """[T]: the slot most layers chose for each token (ties to the lower slot)."""
    k1 = len(trace.slots)
    counts = np.stack([(trace.chosen == s).sum(1) for s in range(k1)], axis=1)
    return counts.argmax(1)


def entropy(trace: RoutingTrace) -> np.ndarray:
    """[T, L]: gate entropy in nats (0 = certain; log(K+1) = uniform)."""
    p = np.clip(trace.probs.astype(np.float64), 1e-12, 1.0)
    return -(p * np.log(p)).sum(-1)


def share(trace: RoutingTrace, by: str = "role", layer: int | None = None,
          outcome: str | None = None) -> list[dict[str, Any]]:
    """Expert share (fraction of token-layer choices) grouped by role, turn or outcome.

    `layer` restricts to one layer; `outcome` labels the whole trace (success/failure) for
    pooling several traces with `share_many`.
    """
    if by not in ("role", "turn", "outcome"):
        raise UserInputError(f"share: by must be role, turn or outcome, got {by!r}")
    chosen = trace.chosen if layer is None else trace.chosen[:, [layer]]
    keys: list[Any]
    if by == "role":
        keys = trace.roles
    elif by == "turn":
        keys = trace.turns
    else:
        keys = [outcome or trace.meta.get("outcome", "unknown")] * trace.n_tokens
    rows = []
    for key in sorted(set(keys), key=lambda x: (str(type(x)), x)):
        idx = [i for i, k in enumerate(keys) if k == key]
        sub = chosen[idx]
        total = sub.size
        for slot, name in enumerate(trace.slots):
            rows.append({by: key, "slot": slot, "expert": name,
                         "share": float((sub == slot).sum() / total) if total else 0.0,
                         "tokens": len(idx)})
    return rows


def share_many(traces: list[RoutingTrace], by: str = "outcome") -> list[dict[str, Any]]:
    """Pool several traces (e.g. successes vs failures) into one share table."""
    pooled: dict[tuple[Any, int], list[float]] = {}
    names: dict[int, str] = {}
    for trace in traces:
        for row in share(trace, by=by):
            key = (row[by], row["slot"])
            n = row["tokens"] * trace.n_layers
            acc = pooled.setdefault(key, [0.0, 0.0])
            acc[0] += row["share"] * n
            acc[1] += n
            names[row["slot"]] = row["expert"]
    return [{by: k, "slot": s, "expert": names[s], "share": v[0] / v[1] if v[1] else 0.0}
            for (k, s), v in sorted(pooled.items(), key=lambda kv: (str(kv[0][0]), kv[0][1]))]


# -------------------------------------------------------------------------- roles
def token_roles(
    tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
    add_generation_prompt: bool = True,
) -> tuple[list[int], list[str], list[int]]:
    """Token ids of the rendered conversation, each token's role and turn."""
    from trace_lib.runtime.chat_format import render_prompt

    spans: list[tuple[int, str, int]] = []  # (end char, role, turn)
    turn = 0
    for i, msg in enumerate(messages):
        text = render_prompt(messages[: i + 1], tools, add_generation_prompt=False)
        spans.append((len(text), msg["role"], turn))
        if msg["role"] == "assistant":
            turn += 1
    full = render_prompt(messages, tools, add_generation_prompt=add_generation_prompt)
    enc = tokenizer(full, add_special_tokens=False, return_offsets_mapping=True)
    ids = list(enc["input_ids"])
    roles, turns = [], []
    for start, _end in enc["offset_mapping"]:
        role, t = "assistant", turn  # past the last message: the generation header
        for end, r, tr in spans:
            if start < end:
                role, t = r, tr
                break
        roles.append(role if role in ROLES else "user")
        turns.append(t)
    return ids, roles, turns


def _decode_tokens(tokenizer: Any, ids: list[int]) -> list[str]:
    return [tokenizer.decode([i], skip_special_tokens=False) for i in ids]


@dataclass
class TracePrefix:
    """The routing and KV cache of an opening several traces share (`trace_prefix`)."""

    ids: list[int]
    mode: str
    cache: Any
    chosen: torch.Tensor  # [1, P, L]
    probs: torch.Tensor  # [1, P, L, K+1]


def trace_prefix(moe: GatedMoE, ids: list[int]) -> TracePrefix | None:
    """One forward of the shared opening `ids`, kept for `trace_ids(prefix=...)`; None in
    `trajectory` mode (pooled over the request: no opening stands alone) or when empty."""
    if not ids or moe.config.mode == "trajectory":
        return None
    device = next(moe.model.parameters()).device
    with torch.no_grad(), moe.recording() as rec:
        out = moe.model(input_ids=torch.tensor([ids], device=device), use_cache=True,
                        logits_to_keep=1)
    assert rec.chosen is not None and rec.probs is not None
    return TracePrefix(list(ids), moe.config.mode, out.past_key_values, rec.chosen, rec.probs)


def trace_ids(
    moe: GatedMoE, ids: list[int], roles: list[str], turns: list[int], prompt_len: int,
    meta: dict[str, Any] | None = None, force: int | None = None,
    prefix: TracePrefix | None = None,
) -> RoutingTrace:
    """Teacher-forced forward over `ids` with recording: the routing the model used.
    `prefix`: an opening `ids` starts with, already run (`trace_prefix`): only the rest
    is fed (ignored when `ids` does not start with it, when forced or in another mode)."""
    if not ids:
        raise UserInputError("routing trace: no tokens to route")
    device = next(moe.model.parameters()).device
    P = len(prefix.ids) if prefix is not None else 0
    if (prefix is None or force is not None or prefix.mode != moe.config.mode
            or P >= len(ids) or ids[:P] != prefix.ids):
        P = 0
    input_ids = torch.tensor([ids[P:]], device=device)
    moe.prompt_mask = torch.zeros(1, len(ids) - P, device=device)
    moe.prompt_mask[:, :max(prompt_len - P, 1)] = 1.0
    try:
        with torch.no_grad(), moe.force(force), moe.recording() as rec:
            # The routing is read, never the logits: only the last position's are made.
            if P:  # a copy: the next trace starts from the same opening
                moe.model(input_ids=input_ids, past_key_values=copy.deepcopy(prefix.cache),
                          use_cache=True, logits_to_keep=1)
            else:
                moe.model(input_ids=input_ids, use_cache=False, logits_to_keep=1)
    finally:
        moe.prompt_mask = None
    assert rec.chosen is not None and rec.probs is not None
    chosen, probs = rec.chosen, rec.probs
    if P:
        assert prefix is not None
        chosen = torch.cat([prefix.chosen, chosen], dim=1)
        probs = torch.cat([prefix.probs, probs], dim=1)
    return RoutingTrace(
        token_ids=list(ids),
        tokens=_decode_tokens(moe.tokenizer, ids) if moe.tokenizer is not None
        else [str(i) for i in ids],
        roles=list(roles), turns=list(turns),
        chosen=chosen[0].numpy().astype(int), probs=probs[0].numpy(),
        slots=list(moe.slots), prompt_len=prompt_len,
        meta={"mode": moe.config.mode, "force": force, **(meta or {})},
    )


def generate_ids(moe: GatedMoE, prompt_ids: list[int], max_new_tokens: int = 32,
                 temperature: float = 0.0, seed: int = 0) -> list[int]:
    """Sampled ids after the prompt (greedy at temperature 0), stopping at the EOS ids."""
    device = next(moe.model.parameters()).device
    input_ids = torch.tensor([prompt_ids], device=device)
    kwargs: dict[str, Any] = {"max_new_tokens": max_new_tokens, "do_sample": temperature > 0}
    if temperature > 0:
        kwargs["temperature"] = temperature
        torch.manual_seed(seed)
    tok = moe.tokenizer
    if tok is not None and tok.pad_token_id is not None:
        kwargs["pad_token_id"] = tok.pad_token_id
    with torch.no_grad():
        out = moe.generate(input_ids=input_ids, attention_mask=torch.ones_like(input_ids),
                           **kwargs)
    return out[0, len(prompt_ids):].tolist()


def route_messages(
    moe: GatedMoE, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
    max_new_tokens: int = 32, force: int | None = None, generate: bool = True,
    temperature: float = 0.0, meta: dict[str, Any] | None = None,
) -> RoutingTrace:
    """Render `messages`, optionally generate a reply, and trace every token's routing."""
    if moe.tokenizer is None:
        raise UserInputError("routing a chat needs a tokenizer; this base model has none")
    ids, roles, turns = token_roles(moe.tokenizer, messages, tools,
                                    add_generation_prompt=generate)
    prompt_len = len(ids)
    if generate and max_new_tokens > 0:
        with moe.force(force):
            new = generate_ids(moe, ids, max_new_tokens, temperature)
        ids = ids + new
        last_turn = turns[-1] if turns else 0
        roles = roles + ["assistant"] * len(new)
        turns = turns + [last_turn] * len(new)
    return trace_ids(moe, ids, roles, turns, prompt_len, meta=meta, force=force)


def route_prompt(moe: GatedMoE, prompt: str, system: str | None = None,
                 max_new_tokens: int = 32, force: int | None = None) -> RoutingTrace:
    if not prompt.strip():
        raise UserInputError("--prompt: expected non-empty text")
    messages = ([{"role": "system", "content": system}] if system else []) + \
        [{"role": "user", "content": prompt}]
    return route_messages(moe, messages, None, max_new_tokens, force,
                          meta={"source": "prompt"})


def replay_trajectory(moe: GatedMoE, messages: list[dict[str, Any]],
                      tools: list[dict[str, Any]] | None = None, force: int | None = None,
                      meta: dict[str, Any] | None = None,
                      prefix: TracePrefix | None = None) -> RoutingTrace:
    """Route an existing conversation (e.g. an ingested trajectory) without generating.

    The prompt is everything before the first assistant reply: what `trajectory` mode
    pools over, as it would have at prefill.
    """
    if moe.tokenizer is None:
        raise UserInputError("replaying a trajectory needs a tokenizer; this base has none")
    ids, roles, turns = token_roles(moe.tokenizer, messages, tools, add_generation_prompt=False)
    first_reply = next((i for i, m in enumerate(messages) if m["role"] == "assistant"), None)
    prompt_len = len(ids)
    if first_reply is not None:
        prompt_len = len(token_roles(moe.tokenizer, messages[:first_reply], tools,
                                     add_generation_prompt=True)[0])
    return trace_ids(moe, ids, roles, turns, min(prompt_len, len(ids)),
                     meta={"source": "trajectory", **(meta or {})}, force=force,
                     prefix=prefix)
