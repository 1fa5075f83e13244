"""A frozen base plus K frozen LoRA adapters, mixed per token by light trained gates.

Design decisions
- The base stays an ordinary Hugging Face causal LM: the mixture is installed with
  forward hooks (a pre-hook per decoder block computes the routing, a hook per wrapped
  projection adds the chosen low-rank product), never by replacing modules. So
  `.generate`, the KV cache, the project's policy server and `save_pretrained` of the base
  keep working unchanged, and `remove()` restores the plain model.
- One gate per decoder block: `Linear(hidden, K+1, bias=True)` in fp32, zero-initialised,
  reading the block's input hidden state detached (the gates learn where to route, never
  change what the base computes). Slot 0 is "base only". Zero init means uniform
  probabilities and an argmax of slot 0 (torch breaks ties to the first index), so a
  freshly composed top-1 model is exactly the base until its gates are trained.
- Every wrapped projection computes `W x + sum_i w_i * scale_i * B_i A_i x`. Modes:
  `top1` w = one-hot of the argmax in the forward, the softmax in the backward
  (straight-through, `w = hard + p - p.detach()`); the same rule in rollout and in the
  loss pass so the GRPO ratio compares like with like. `soft` w = softmax (the reference
  implementation's mix). `trajectory` one choice per sequence and layer from the gate
  probabilities averaged over the request, held through decoding (what per-request
  adapter routing in vLLM can serve).
- The request is the user's turn: the tokens of every ChatML user block that is not a
  tool response, found from the token ids themselves at prefill (so the rollout client,
  the GRPO loss pass, the policy server's engine thread and the traces all pool over the
  same tokens without being told). Pooling over the whole prompt barely separates tasks:
  over 95% of a real prompt is the shared system + tools block. A user turn's hidden
  states are causal in what precedes it, so every turn of a multi-turn episode, and the
  loss pass over the whole episode, pools the same vectors. No user block (a bare
  completion) falls back to the whole prompt.
- Zero-initialised top-1 gates route every token to slot 0 (the base), so the rollout is
  the base; the gates still learn from it because the straight-through estimator passes
  d loss / d w_i = <d loss / d y, scale_i B_i A_i x> for every slot i, chosen or not
  (`estimator="full"`, the default). `estimator="chosen"` passes a gradient only through
  the chosen slot; at slot 0 that is the base, whose weight multiplies nothing, so from
  zero init its gradient is exactly zero (docs/COMPOSE.md, "Gates that learn").
- Sparse dispatch: the chosen slot of every token is bincounted once per block, and each
  adapter's A/B product runs only on the tokens routed to it (index_select, two thin
  matmuls, index_add). A block whose tokens all chose one slot (always, when decoding one
  sequence) skips the gather. The dense reference runs every adapter on every token and
  multiplies by w; the two agree to float tolerance (a test holds them to it).
- Straight-through through every slot needs every adapter's output for every token, so
  when gates need a gradient with `estimator="full"` (the default) the dense path runs;
  `estimator="chosen"` (Switch-Transformer style: only the chosen slot's probability gets
  a gradient) keeps sparse dispatch in training too. Rollouts run under no_grad and are
  always sparse.
- `force(k)` routes every token to slot k: single-adapter baselines, the page's "force
  expert k", and the warm-start reward table all use the same model object.
- Only gate parameters require grad. Adapter factors are non-persistent buffers on the
  projections, so the base's state_dict is unchanged and `.to()` moves everything.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import nn

from trace_lib.compose.adapters import Adapter, read_adapter, read_adapters
from trace_lib.errors import UserInputError

RoutingMode = Literal["top1", "soft", "trajectory"]
ROUTING_MODES: tuple[str, ...] = ("top1", "soft", "trajectory")
DISPATCHES: tuple[str, ...] = ("sparse", "dense")
ESTIMATORS: tuple[str, ...] = ("full", "chosen")
MOE_FORMAT = "trace-moe/1"
BASE_SLOT = "base"


@dataclass
class MoEConfig:
    mode: RoutingMode = "top1"
    dispatch: Literal["sparse", "dense"] = "sparse"
    estimator: Literal["full", "chosen"] = "full"

    def check(self) -> None:
        for value, allowed, what in ((self.mode, ROUTING_MODES, "mode"),
                                     (self.dispatch, DISPATCHES, "dispatch"),
                                     (self.estimator, ESTIMATORS, "estimator")):
            if value not in allowed:
                raise UserInputError(f"{what}: expected one of {', '.join(allowed)}, got {value!r}")


@dataclass
class LayerRoute:
    """The routing of one block for the current forward pass (tokens flattened)."""

    weights: torch.Tensor  # [N, K+1]; one-hot values in top1/trajectory/forced
    chosen: torch.Tensor  # [N] slot per token
    groups: list[tuple[int, torch.Tensor | None]]  # (slot>0, token indices or None = all)
    dense: bool  # run every adapter on every token


@dataclass
class RoutingRecord:
    """What `recording()` captured: per token and layer, the chosen slot and probabilities."""

    chosen: torch.Tensor | None = None  # [B, T, L] int
    probs: torch.Tensor | None = None  # [B, T, L, K+1] float
    _chunks: list[list[tuple[torch.Tensor, torch.Tensor]]] = field(default_factory=list)

    def finish(self) -> None:
        if not self._chunks or not self._chunks[0]:
            return
        per_layer_c = [torch.cat([c for c, _ in layer], 1) for layer in self._chunks]
        per_layer_p = [torch.cat([p for _, p in layer], 1) for layer in self._chunks]
        self.chosen = torch.stack(per_layer_c, dim=2)
        self.probs = torch.stack(per_layer_p, dim=2)
        self._chunks = []


class _RoutingState(threading.local):
    """Per-thread routing state: a server thread generating and a request thread tracing
    can share one model, each with its own force/mix/recording and in-flight routes."""

    def __init__(self) -> None:
        self.force_slot: int | list[int] | None = None
        self.request_after_prefix = False
        self.mix_weights: torch.Tensor | None = None
        self.current: dict[int, LayerRoute] = {}
        self.held: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.new_sequence = True
        self.attention_mask: torch.Tensor | None = None
        self.prompt_mask: torch.Tensor | None = None
        self.record: RoutingRecord | None = None
        self.collect: list[tuple[int, torch.Tensor, torch.Tensor]] | None = None
        self.request_mask: torch.Tensor | None = None


def _state_property(name: str, doc: str) -> property:
    return property(lambda self: getattr(self._state, name),
                    lambda self, value: setattr(self._state, name, value), doc=doc)


class ExpertBank(nn.Module):
    """The K adapters' factors for one projection (None where an adapter skips it)."""

    def __init__(self, factors: list[tuple[torch.Tensor, torch.Tensor, float] | None]):
        super().__init__()
        self.scales: list[float] = []
        self.present: list[bool] = []
        for i, f in enumerate(factors):
            self.present.append(f is not None)
            self.scales.append(f[2] if f is not None else 0.0)
            if f is not None:
                self.register_buffer(f"A{i}", f[0], persistent=False)
                self.register_buffer(f"B{i}", f[1], persistent=False)

    def pair(self, i: int) -> tuple[torch.Tensor, torch.Tensor, float] | None:
        if not self.present[i]:
            return None
        return getattr(self, f"A{i}"), getattr(self, f"B{i}"), self.scales[i]


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The decoder blocks of a HF causal LM (Llama/Qwen/Mistral/GPT-2 families)."""
    for path in ("model.layers", "model.decoder.layers", "transformer.h", "gpt_neox.layers"):
        obj: Any = model
        for part in path.split("."):
            obj = getattr(obj, part, None)
            if obj is None:
                break
        if isinstance(obj, nn.ModuleList) and len(obj):
            return obj
    raise UserInputError(f"{type(model).__name__}: cannot find its decoder layers to gate")


def request_markers(tokenizer: Any) -> tuple[int, list[int], list[int], int | None] | None:
    """Token ids that delimit a user turn in this tokenizer's ChatML: (`<|im_start|>`, the
    ids of "user\\n" after it, the ids a tool response opens with, `<|im_end|>`), taken by
    tokenising the template's own strings, so they match whatever the tokenizer splits
    "<tool_response>" into. None when the tokenizer does not speak ChatML."""
    from trace_lib.runtime.chat_format import IM_END, IM_START

    if tokenizer is None:
        return None
    try:
        header = tokenizer(IM_START + "user\n", add_special_tokens=False)["input_ids"]
        tool = tokenizer(IM_START + "user\n<tool_response>",
                         add_special_tokens=False)["input_ids"]
        end = tokenizer(IM_END, add_special_tokens=False)["input_ids"]
    except (TypeError, ValueError, KeyError):
        return None
    if len(header) < 2 or tool[:len(header)] != header or len(tool) == len(header):
        return None
    return int(header[0]), list(header[1:]), list(tool[len(header):]), \
        (int(end[0]) if len(end) == 1 else None)


def request_mask(ids: torch.Tensor,
                 markers: tuple[int, list[int], list[int], int | None]) -> torch.Tensor:
    """[B, T] float: 1 on the tokens of every user turn that is not a tool response (the
    content and its closing `<|im_end|>`), 0 elsewhere (system, tools, assistant, tool
    results, padding)."""
    start, user_tail, tool_tail, end = markers
    rows = ids.detach().cpu().tolist()
    out = torch.zeros(len(rows), len(rows[0]) if rows else 0)
    nu, nt = len(user_tail), len(tool_tail)
    for r, row in enumerate(rows):
        starts = [i for i, tok in enumerate(row) if tok == start] + [len(row)]
        for p, nxt in zip(starts[:-1], starts[1:], strict=True):
            q = p + 1 + nu
            if row[p + 1:q] != user_tail or row[q:q + nt] == tool_tail:
                continue
            stop = nxt
            if end is not None and end in row[q:nxt]:
                stop = q + row[q:nxt].index(end) + 1
            out[r, q:stop] = 1.0
    return out.to(ids.device)


def load_base(name_or_path: str, device: str = "cpu", dtype: Any = None
              ) -> tuple[nn.Module, Any]:
    """(model, tokenizer) through the training stage's registry: a name (`tiny`,
    `smollm2-135m`) or any HF folder; the same loader the trainer and the server use.
    `device` is a resolved torch device ("cpu", "cuda:0"), `dtype` a torch dtype (None:
    float32)."""
    from trace_lib.runtime.base_models import load_model

    model, tokenizer = load_model(name_or_path, dtype=dtype, device=device)
    return model.eval(), tokenizer


class GatedMoE:
    """A base causal LM with K LoRA experts and per-block top-1 gates installed in place."""

    force_slot = _state_property("force_slot", "route every token to this slot, or to slot "
                                 "[l] at layer l (None = gates)")
    request_after_prefix = _state_property(
        "request_after_prefix", "forwards continue a cached prefix as a new request "
        "(`request_over_prefix`)")
    mix_weights = _state_property("mix_weights", "fixed [K+1] mixture (the linear merge)")
    prompt_mask = _state_property("prompt_mask", "[B, T] prompt tokens for trajectory pooling")
    collect = _state_property("collect", "gate training: route() appends (layer, probs, chosen)")

    def __init__(
        self,
        model: nn.Module,
        adapters: list[Adapter],
        config: MoEConfig | None = None,
        tokenizer: Any = None,
        base_model: str = "",
    ):
        self.config = config or MoEConfig()
        self.config.check()
        if not adapters:
            raise UserInputError("compose: give at least one adapter")
        self.model = model
        self.tokenizer = tokenizer
        self.base_model = base_model
        self.adapters = adapters
        self.blocks = decoder_layers(model)
        self.layers = len(self.blocks)
        self.hidden = int(model.config.hidden_size)
        self.k = len(adapters)
        self.slots = [BASE_SLOT] + [a.name for a in adapters]
        for p in model.parameters():
            p.requires_grad_(False)
        dtype = next(model.parameters()).dtype
        device = next(model.parameters()).device
        self.gates = nn.ModuleList()
        for _ in range(self.layers):
            gate = nn.Linear(self.hidden, self.k + 1, bias=True, device=device,
                             dtype=torch.float32)
            nn.init.zeros_(gate.weight)
            nn.init.zeros_(gate.bias)
            self.gates.append(gate)
        self._state = _RoutingState()
        self._markers = request_markers(tokenizer)
        self.folder: Path | None = None  # set when loaded from / saved to a folder
        self._handles: list[Any] = []
        self._banks: list[ExpertBank] = []
        self._install(dtype, device)

    # ------------------------------------------------------------------ installation
    def _install(self, dtype: torch.dtype, device: torch.device) -> None:
        modules = dict(self.model.named_modules())
        block_of: dict[str, int] = {}
        for name, module in modules.items():
            for idx, block in enumerate(self.blocks):
                if module is block:
                    block_of[name] = idx
        wanted = sorted({m for a in self.adapters for m in a.factors})
        for name in wanted:
            target = modules.get(name)
            if not isinstance(target, nn.Linear):
                where = next(a.path for a in self.adapters if name in a.factors)
                raise UserInputError(
                    f"{where}: module {name!r} is not a Linear of this base model "
                    f"({type(self.model).__name__}); was the adapter trained on another base?"
                )
            layer = next((i for prefix, i in block_of.items() if name.startswith(prefix + ".")),
                         None)
            if layer is None:
                raise UserInputError(f"module {name!r} is outside the decoder blocks; only "
                                     f"projections inside blocks can be gated")
            factors: list[tuple[torch.Tensor, torch.Tensor, float] | None] = []
            for adapter in self.adapters:
                f = adapter.factors.get(name)
                if f is None:
                    factors.append(None)
                    continue
                if f.A.shape[1] != target.in_features or f.B.shape[0] != target.out_features:
                    raise UserInputError(
                        f"{adapter.path}: {name}: lora_A {tuple(f.A.shape)} / lora_B "
                        f"{tuple(f.B.shape)} do not fit a Linear({target.in_features}, "
                        f"{target.out_features}); the adapter belongs to another base model"
                    )
                factors.append((f.A.to(device, dtype), f.B.to(device, dtype), f.scale))
            bank = ExpertBank(factors)
            target.trace_experts = bank  # a child module: moves with .to(), not in state_dict
            self._banks.append(bank)
            self._handles.append(target.register_forward_hook(self._lora_hook(layer)))
        for idx, block in enumerate(self.blocks):
            block.trace_gate = self.gates[idx]
            self._handles.append(
                block.register_forward_pre_hook(self._gate_hook(idx), with_kwargs=True))
        self._handles.append(
            self.model.register_forward_pre_hook(self._model_hook, with_kwargs=True))

    def remove(self) -> None:
        """Uninstall: the model is the plain base again."""
        for h in self._handles:
            h.remove()
        self._handles = []
        for module in list(self.model.modules()):
            if hasattr(module, "trace_experts"):
                del module.trace_experts
            if hasattr(module, "trace_gate"):
                del module.trace_gate

    # ------------------------------------------------------------------------- hooks
    def _model_hook(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        cache = kwargs.get("past_key_values")
        past = 0
        if cache is not None and hasattr(cache, "get_seq_length"):
            past = int(cache.get_seq_length())
        st = self._state
        st.new_sequence = past == 0 or st.request_after_prefix
        if st.new_sequence:
            st.held = {}
            st.attention_mask = kwargs.get("attention_mask")
            ids = kwargs.get("input_ids", args[0] if args else None)
            st.request_mask = None
            if self.config.mode == "trajectory" and ids is not None and self._markers:
                st.request_mask = request_mask(ids, self._markers)

    def _gate_hook(self, layer: int):
        def hook(module: nn.Module, args: tuple, kwargs: dict) -> None:
            hidden = args[0] if args else kwargs["hidden_states"]
            self._state.current[layer] = self.route(layer, hidden)
        return hook

    def _lora_hook(self, layer: int):
        def hook(module: nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor:
            route = self._state.current.get(layer)
            if route is None or (not route.dense and not route.groups):
                return output
            return self._apply_experts(module.trace_experts, args[0], output, route)
        return hook

    # ------------------------------------------------------------------------ routing
    def route(self, layer: int, hidden: torch.Tensor) -> LayerRoute:
        """Gate one block's input `hidden` [B, T, H] into a LayerRoute (and record it)."""
        b, t, _ = hidden.shape
        logits = self.gates[layer](hidden.detach().float())
        probs = torch.softmax(logits, dim=-1)
        grad = torch.is_grad_enabled() and self.gates[layer].weight.requires_grad
        mode = self.config.mode
        if self.mix_weights is not None and self.force_slot is None:
            w = self.mix_weights.to(device=hidden.device, dtype=probs.dtype)
            chosen = w.argmax().expand(b, t)
            weights = w.expand(b, t, self.k + 1)
            grad = False
        elif self.force_slot is not None:
            slot = self.force_slot if isinstance(self.force_slot, int) else self.force_slot[layer]
            chosen = torch.full((b, t), slot, dtype=torch.long, device=hidden.device)
            weights = F.one_hot(chosen, self.k + 1).to(probs.dtype)
            grad = False
        elif mode == "soft":
            chosen = probs.argmax(-1)
            weights = probs
        elif mode == "top1":
            chosen = probs.argmax(-1)
            hard = F.one_hot(chosen, self.k + 1).to(probs.dtype)
            weights = self._straight_through(hard, probs) if grad else hard
        else:  # trajectory: pooled over the request at prefill, held while decoding
            st = self._state
            if st.new_sequence or layer not in st.held:
                mask = self._pool_mask(b, t, hidden.device).to(probs.dtype).unsqueeze(-1)
                pooled = (probs * mask).sum(1) / mask.sum(1).clamp_min(1.0)  # [B, K+1]
                seq_chosen = pooled.argmax(-1)
                st.held[layer] = (seq_chosen.detach(), pooled.detach())
            else:
                seq_chosen, pooled = st.held[layer]
            hard = F.one_hot(seq_chosen, self.k + 1).to(probs.dtype)
            seq_w = self._straight_through(hard, pooled) if grad else hard
            chosen = seq_chosen[:, None].expand(b, t)
            weights = seq_w[:, None, :].expand(b, t, self.k + 1)
        if self.collect is not None:
            self.collect.append((layer, probs, chosen))
        if self._state.record is not None:
            self._state.record._chunks[layer].append((chosen.detach().cpu().to(torch.int16),
                                                probs.detach().cpu().float()))
        flat_chosen = chosen.reshape(-1)
        dense = (mode == "soft" and self.force_slot is None) or self.config.dispatch == "dense" \
            or (grad and self.config.estimator == "full") \
            or (self.mix_weights is not None and self.force_slot is None)
        groups: list[tuple[int, torch.Tensor | None]] = []
        if not dense:
            counts = torch.bincount(flat_chosen, minlength=self.k + 1).tolist()
            n = flat_chosen.numel()
            for slot in range(1, self.k + 1):
                if counts[slot] == n:
                    groups.append((slot, None))
                elif counts[slot]:
                    groups.append((slot, torch.nonzero(flat_chosen == slot).squeeze(1)))
        return LayerRoute(weights=weights.reshape(-1, self.k + 1), chosen=flat_chosen,
                          groups=groups, dense=dense)

    def _pool_mask(self, b: int, t: int, device: torch.device) -> torch.Tensor:
        """[B, T] tokens a trajectory choice pools over: the request (user turns) within the
        allowed region (`prompt_mask`, else the attention mask, else every token); a row
        whose region holds no request token pools over the whole region."""
        st = self._state
        region = st.prompt_mask
        if region is None and st.attention_mask is not None:
            region = st.attention_mask[:, -t:]
        region = (torch.ones(b, t, device=device) if region is None
                  else region.to(device=device, dtype=torch.float32))
        req = st.request_mask
        if req is None or tuple(req.shape) != (b, t):
            return region
        both = region * req.to(device=device, dtype=torch.float32)
        empty = both.sum(1, keepdim=True) == 0
        return torch.where(empty, region, both)

    def _straight_through(self, hard: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
        if self.config.estimator == "full":
            return hard + probs - probs.detach()
        return hard * (1.0 + probs - probs.detach())  # gradient through the chosen slot only

    def _apply_experts(self, bank: ExpertBank, x: torch.Tensor, out: torch.Tensor,
                       route: LayerRoute) -> torch.Tensor:
        shape = out.shape
        x2 = x.reshape(-1, x.shape[-1])
        out2 = out.reshape(-1, shape[-1])
        w = route.weights.to(out.dtype)
        needs_w = w.requires_grad or route.dense
        if route.dense:
            for i in range(self.k):
                pair = bank.pair(i)
                if pair is None:
                    continue
                a, b_, scale = pair
                out2 = out2 + w[:, i + 1:i + 2] * (F.linear(F.linear(x2, a), b_) * scale)
            return out2.view(shape)
        for slot, idx in route.groups:
            pair = bank.pair(slot - 1)
            if pair is None:
                continue
            a, b_, scale = pair
            if idx is None:
                delta = F.linear(F.linear(x2, a), b_) * scale
                out2 = out2 + (w[:, slot:slot + 1] * delta if needs_w else delta)
            else:
                delta = F.linear(F.linear(x2.index_select(0, idx), a), b_) * scale
                if needs_w:
                    delta = delta * w.index_select(0, idx)[:, slot:slot + 1]
                out2 = out2.index_add(0, idx, delta)
        return out2.view(shape)

    # ---------------------------------------------------------------------- controls
    @contextlib.contextmanager
    def force(self, slot: int | list[int] | None) -> Iterator[None]:
        """Route every token to `slot` (0 = base only) inside the block; a list is one slot
        per layer (a request-level choice pattern, what a merged per-request adapter is)."""
        slots = [slot] if isinstance(slot, int) else list(slot or [])
        if isinstance(slot, list) and len(slot) != self.layers:
            raise UserInputError(f"force: a pattern of {len(slot)} layers for a model with "
                                 f"{self.layers}")
        if any(not 0 <= s <= self.k for s in slots):
            raise UserInputError(f"force: slots must be in 0..{self.k}, got {slot}")
        previous, self.force_slot = self.force_slot, slot
        try:
            yield
        finally:
            self.force_slot = previous

    @contextlib.contextmanager
    def request_over_prefix(self) -> Iterator[None]:
        """Forwards inside the block continue a cached prefix as a new request: trajectory
        pools over their own request tokens instead of holding the previous choice."""
        previous, self.request_after_prefix = self.request_after_prefix, True
        try:
            yield
        finally:
            self.request_after_prefix = previous

    @contextlib.contextmanager
    def mix(self, weights: list[float] | None) -> Iterator[None]:
        """Apply fixed slot weights to every token: `[0, 1/K, ..., 1/K]` is the uniform linear
        merge of the adapters (exactly: sum_i w_i scale_i B_i A_i on every projection)."""
        if weights is not None and len(weights) != self.k + 1:
            raise UserInputError(f"mix: expected {self.k + 1} weights (base + {self.k} "
                                 f"adapters), got {len(weights)}")
        previous = self.mix_weights
        self.mix_weights = None if weights is None else torch.tensor(weights, dtype=torch.float32)
        try:
            yield
        finally:
            self.mix_weights = previous

    @contextlib.contextmanager
    def recording(self) -> Iterator[RoutingRecord]:
        """Capture per-token, per-layer routing of every forward inside the block."""
        record = RoutingRecord(_chunks=[[] for _ in range(self.layers)])
        previous, self._state.record = self._state.record, record
        try:
            yield record
        finally:
            self._state.record = previous
            record.finish()

    def set_mode(self, mode: str) -> None:
        self.config = MoEConfig(mode=mode, dispatch=self.config.dispatch,  # type: ignore[arg-type]
                                estimator=self.config.estimator)
        self.config.check()

    @property
    def request_markers(self) -> tuple[int, list[int], list[int], int | None] | None:
        """The tokenizer's ChatML user-turn markers (`request_markers`), None without."""
        return self._markers

    def request_tokens(self, ids: list[int]) -> torch.Tensor:
        """[T] bool: the request (user-turn) tokens of `ids`, what `trajectory` pools over;
        every token when there is no user turn or no ChatML tokenizer."""
        if self._markers is None:
            return torch.ones(len(ids), dtype=torch.bool)
        mask = request_mask(torch.tensor([ids]), self._markers)[0].bool()
        return mask if bool(mask.any()) else torch.ones(len(ids), dtype=torch.bool)

    def gate_parameters(self) -> list[nn.Parameter]:
        return list(self.gates.parameters())

    def gate_param_count(self) -> int:
        return sum(p.numel() for p in self.gate_parameters())

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.model(*args, **kwargs)

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        return self.model.generate(*args, **kwargs)

    def summary(self) -> dict[str, Any]:
        return {"layers": self.layers, "hidden": self.hidden, "experts": self.slots[1:],
                "gate_params": self.gate_param_count(), "mode": self.config.mode}

    # ------------------------------------------------------------------------ saving
    def gate_state(self) -> dict[str, torch.Tensor]:
        return {f"layers.{i}.{n}": p.detach().cpu().contiguous()
                for i, g in enumerate(self.gates) for n, p in g.named_parameters()}

    def load_gate_state(self, state: dict[str, torch.Tensor], where: str = "gates") -> None:
        expected = self.gate_state()
        missing = sorted(set(expected) - set(state))
        if missing:
            raise UserInputError(f"{where}: missing gate tensors {missing[:3]}")
        for key, ref in expected.items():
            if tuple(state[key].shape) != tuple(ref.shape):
                raise UserInputError(f"{where}: {key} is {tuple(state[key].shape)}, "
                                     f"expected {tuple(ref.shape)}")
        with torch.no_grad():
            for i, gate in enumerate(self.gates):
                gate.weight.copy_(state[f"layers.{i}.weight"])
                gate.bias.copy_(state[f"layers.{i}.bias"])

    def save(self, out: str | Path, copy_adapters: bool = True,
             extra: dict[str, Any] | None = None) -> Path:
        """Write the composed model folder: moe.json, gates.safetensors, adapters/<name>/."""
        from safetensors.torch import save_file

        folder = Path(out).expanduser()
        folder.mkdir(parents=True, exist_ok=True)
        entries = []
        for adapter in self.adapters:
            path = adapter.path
            if copy_adapters:
                dest = folder / "adapters" / adapter.name.replace("/", "_")
                if dest.resolve() != path.resolve():
                    dest.mkdir(parents=True, exist_ok=True)
                    for f in ("adapter_config.json", "adapter_model.safetensors",
                              "trace_adapter.json"):
                        if (path / f).is_file():
                            shutil.copy2(path / f, dest / f)
                entries.append({"name": adapter.name, "path": str(dest.relative_to(folder))})
            else:
                entries.append({"name": adapter.name, "path": str(path)})
        save_file(self.gate_state(), str(folder / "gates.safetensors"))
        meta = {
            "format": MOE_FORMAT,
            "base_model": self.base_model,
            "adapters": entries,
            **asdict(self.config),
            **self.summary(),
            "saved_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            **(extra or {}),
        }
        (folder / "moe.json").write_text(json.dumps(meta, indent=2))
        self.folder = folder
        return folder


def read_moe_meta(folder: str | Path) -> dict[str, Any]:
    path = Path(folder).expanduser() / "moe.json"
    if not path.is_file():
        raise UserInputError(f"{Path(folder)}: not a composed model folder (no moe.json)")
    try:
        meta = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise UserInputError(f"{path}: not valid JSON ({exc})") from exc
    if meta.get("format") != MOE_FORMAT:
        raise UserInputError(f"{path}: format is {meta.get('format')!r}, expected {MOE_FORMAT!r}")
    return meta


def compose(
    base_model: str,
    adapter_specs: list[tuple[str | None, Path]],
    out: str | Path | None = None,
    config: MoEConfig | None = None,
    base: tuple[nn.Module, Any] | None = None,
) -> GatedMoE:
    """Build the gated model (zero gates) and, with `out`, write its folder."""
    adapters = read_adapters(adapter_specs)
    model, tokenizer = base if base is not None else load_base(base_model)
    moe = GatedMoE(model, adapters, config, tokenizer=tokenizer, base_model=base_model)
    if out is not None:
        moe.save(out)
    return moe


def load_moe(
    folder: str | Path,
    mode: str | None = None,
    base: tuple[nn.Module, Any] | None = None,
    dispatch: str | None = None,
    device: str = "cpu",
    dtype: Any = None,
) -> GatedMoE:
    """Load a composed model folder (its base, adapters and trained gates); `device` and
    `dtype` place the base (and with it the adapters' factors; the gates stay float32)."""
    from safetensors.torch import load_file

    root = Path(folder).expanduser()
    meta = read_moe_meta(root)
    specs = []
    for entry in meta["adapters"]:
        path = Path(entry["path"])
        specs.append(read_adapter(path if path.is_absolute() else root / path, entry["name"]))
    config = MoEConfig(mode=mode or meta.get("mode", "top1"),
                       dispatch=dispatch or meta.get("dispatch", "sparse"),
                       estimator=meta.get("estimator", "full"))
    model, tokenizer = (base if base is not None
                        else load_base(meta["base_model"], device=device, dtype=dtype))
    moe = GatedMoE(model, specs, config, tokenizer=tokenizer, base_model=meta["base_model"])
    gates = root / "gates.safetensors"
    if gates.is_file():
        moe.load_gate_state(load_file(str(gates)), where=str(gates))
    moe.folder = root
    return moe
