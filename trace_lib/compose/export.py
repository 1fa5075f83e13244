"""Export a trained composition for vLLM: one merged adapter per capability and a router.

    export = export_per_request(moe, out, requests={"tool_calling_precision": [msgs, ...]})
    router = Router.load(out)                  # later, in front of `vllm serve`
    router.route(messages, tools)              # -> "tool_calling_precision"

Design decisions
- vLLM applies one LoRA per request, so it cannot run token-level top-1; it can run what
  `trajectory` routing does: one choice per request and layer. For each capability the
  gates' request-level choice per layer is measured on that capability's own requests
  (majority over them, per layer); its merged adapter takes, at every layer, the LoRA
  factors of the slot chosen there (none where the base was chosen). Layers never share
  a module, so the concatenation in `linear_merge` is exact: the merged adapter equals
  the composed model in trajectory mode on any request that produces that choice
  pattern. Without example requests a capability's pattern is its own adapter at every
  layer (the merged adapter is then a plain copy of it).
- The router is the gates' own request-level decision, not a new classifier: it keeps the
  composed folder (base name, adapters, gates; the gates are ~0.03% of the base's size)
  in trajectory mode, runs one prefill over the request, and picks the capability whose
  choice pattern is nearest (fewest layers that differ; ties to the first). It needs the
  base model for that prefill, which is the honest cost: one prefill per request beside
  vLLM (CPU is fine at SmolLM2 size), or `route_from_choice` with a choice you computed.
- The router's prefill is over the whole prompt, and a target benchmark's prompts are
  ~95% one shared system + tools block (2,892 of SmolLM2's tokens on airline). So the
  router keeps, per route pattern, the KV cache of that shared prefix computed under the
  pattern (`force(pattern)`), and routes a request by running only its own tokens (the user
  turn) over it. That is exact when the choice comes back equal to the pattern it assumed:
  at layer l the choice pools over request tokens whose inputs depend only on the choices
  at layers < l, so by induction the full prefill makes the same choices, and two patterns
  cannot both come back equal. When no candidate comes back equal to itself (a request
  between routes), the router runs the full prefill, and keeps its KV cache cropped to the
  prefix (the prefix under exactly that choice) as one more candidate: requests on a target
  benchmark that the gates place between the routes tend to make the same few choices.
  `route_stats` counts both paths. A cache costs 2 x layers x kv-width floats per prefix
  token (129 MB for SmolLM2's airline prefix); `max_patterns` per prefix and the last
  `max_prefixes` prefixes are kept.
- `router.json` records, per capability, the pattern, the merged adapter's folder and
  how many requests measured it, so `vllm serve BASE --enable-lora --lora-modules
  cap=DIR ...` can be written from it (`vllm_command`).
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from trace_lib.compose.adapters import Adapter, linear_merge
from trace_lib.compose.gated import GatedMoE, load_moe
from trace_lib.errors import UserInputError

ROUTER_FORMAT = "trace-router/1"
BASE_TARGET = "base"


def request_ids(moe: GatedMoE, messages: list[dict[str, Any]],
                tools: list[dict[str, Any]] | None = None) -> list[int]:
    """The prompt's token ids, as the router's prefill sees them."""
    from trace_lib.runtime.chat_format import render_prompt

    if moe.tokenizer is None:
        raise UserInputError("routing a request needs the base model's tokenizer")
    return list(moe.tokenizer(render_prompt(messages, tools), add_special_tokens=False)
                ["input_ids"])


def request_choice(moe: GatedMoE, messages: list[dict[str, Any]],
                   tools: list[dict[str, Any]] | None = None) -> list[int]:
    """The per-layer slot `trajectory` routing picks for this request (one prefill)."""
    return prefill_choice(moe, request_ids(moe, messages, tools))[0]


def _trajectory_forward(moe: GatedMoE, ids: list[int], **kw: Any) -> Any:
    """One forward of `ids` in trajectory mode, no grad (the mode is restored after). Its
    callers read the routing and the KV cache, never the logits: only the last position's
    are computed (the LM head over a 1,500-token prompt is ~15% of the forward)."""
    device = next(moe.model.parameters()).device
    previous = moe.config.mode
    moe.set_mode("trajectory")
    try:
        with torch.no_grad():
            return moe.model(input_ids=torch.tensor([ids], device=device), logits_to_keep=1,
                             **kw)
    finally:
        moe.set_mode(previous)


def _held_choice(rec: Any) -> list[int]:
    assert rec.chosen is not None
    return [int(c) for c in rec.chosen[0, -1].tolist()]  # held: equal at every token


def prefill_choice(moe: GatedMoE, ids: list[int], keep_prefix: int = 0
                   ) -> tuple[list[int], Any]:
    """The full prefill's choice, and (keep_prefix > 0) its KV cache cropped to the first
    `keep_prefix` tokens: that prefix under exactly this choice."""
    with moe.recording() as rec:
        out = _trajectory_forward(moe, ids, use_cache=keep_prefix > 0)
    cache = out.past_key_values if keep_prefix > 0 else None
    if cache is not None:
        cache.crop(keep_prefix - len(ids))
    return _held_choice(rec), cache


def _majority(patterns: list[list[int]], k1: int) -> list[int]:
    t = torch.tensor(patterns)
    return [int(torch.bincount(t[:, layer], minlength=k1).argmax()) for layer in range(t.shape[1])]


def _layer_of(module: str, moe: GatedMoE) -> int:
    for idx in range(moe.layers):
        if f".{idx}." in f".{module}." and any(
                module.startswith(p) for p in (f"model.layers.{idx}.",
                                               f"model.decoder.layers.{idx}.",
                                               f"transformer.h.{idx}.",
                                               f"gpt_neox.layers.{idx}.")):
            return idx
    raise UserInputError(f"{module}: cannot tell which decoder layer it belongs to")


def merged_for_pattern(moe: GatedMoE, pattern: list[int], out: Path, name: str) -> Path | None:
    """One exact PEFT adapter applying, at layer l, the adapter of slot pattern[l]."""
    if len(pattern) != moe.layers:
        raise UserInputError(f"{name}: a pattern of {len(pattern)} layers for a model with "
                             f"{moe.layers}")
    parts: list[Adapter] = []
    for slot, adapter in enumerate(moe.adapters, start=1):
        keep = {m: f for m, f in adapter.factors.items() if pattern[_layer_of(m, moe)] == slot}
        if keep:
            parts.append(Adapter(name=adapter.name, path=adapter.path,
                                 base_model=adapter.base_model, rank=adapter.rank,
                                 alpha=adapter.alpha, target_modules=adapter.target_modules,
                                 factors=keep))
    if not parts:
        return None  # the base at every layer: served as the base model itself
    folder = linear_merge(parts, out, weights=[1.0] * len(parts), base_model=moe.base_model)
    meta = json.loads((folder / "trace_adapter.json").read_text())
    meta.update({"capability": name, "layer_slots": pattern, "slots": moe.slots})
    (folder / "trace_adapter.json").write_text(json.dumps(meta, indent=2))
    return folder


@dataclass
class Router:
    """The gates' request-level choice, mapped to one merged adapter per capability."""

    moe: GatedMoE
    patterns: dict[str, list[int]]
    adapters: dict[str, str | None]  # capability -> merged adapter folder (None = base)
    max_prefixes: int = 4  # shared prefixes whose per-pattern KV caches are kept
    max_patterns: int = 8  # KV caches kept per prefix (one per choice pattern)
    route_stats: dict[str, int] = field(default_factory=lambda: {"prefix_cache": 0,
                                                                 "full_prefill": 0})
    _prefixes: OrderedDict = field(default_factory=OrderedDict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @classmethod
    def load(cls, folder: str | Path, base: tuple[Any, Any] | None = None,
             meta: dict[str, Any] | None = None) -> Router:
        """The router of a `moe-merge --per-request` folder; `meta` is its router.json when
        the caller has read and checked it already."""
        root = Path(folder)
        path = root / "router.json"
        if meta is None:
            if not path.is_file():
                raise UserInputError(f"{root}: no router.json (write one with `moe-merge "
                                     f"--per-request`)")
            meta = json.loads(path.read_text())
        if meta.get("format") != ROUTER_FORMAT:
            raise UserInputError(f"{path}: format {meta.get('format')!r}, expected "
                                 f"{ROUTER_FORMAT!r}")
        return cls.over(load_moe(root / meta["moe"], mode="trajectory", base=base), meta,
                        root)

    @classmethod
    def over(cls, moe: GatedMoE, meta: dict[str, Any], root: str | Path) -> Router:
        """The router that router.json `meta` (in the folder `root`) describes, over a
        composed model already loaded (the routing demo's build routes with the model it
        just trained, not a second copy)."""
        return cls(moe=moe, patterns={c: e["layer_slots"] for c, e in meta["routes"].items()},
                   adapters={c: (str(Path(root) / e["adapter"]) if e["adapter"] else None)
                             for c, e in meta["routes"].items()})

    def route_from_choice(self, choice: list[int]) -> str:
        best, best_d = "", None
        for cap, pattern in self.patterns.items():
            d = sum(a != b for a, b in zip(choice, pattern, strict=True))
            if best_d is None or d < best_d:
                best, best_d = cap, d
        return best

    def route(self, messages: list[dict[str, Any]],
              tools: list[dict[str, Any]] | None = None) -> str:
        """The capability (adapter name in vLLM) this request goes to (`choice`)."""
        return self.route_from_choice(self.choice(messages, tools))

    def choice(self, messages: list[dict[str, Any]],
               tools: list[dict[str, Any]] | None = None) -> list[int]:
        """The gates' per-layer choice over the whole prompt (`request_choice`), computed
        over the cached shared prefix when it can be."""
        ids = request_ids(self.moe, messages, tools)
        split = self.shared_prefix_length(ids)
        with self._lock:
            if split == 0:
                self.route_stats["full_prefill"] += 1
                return prefill_choice(self.moe, ids)[0]
            caches = self._prefix_caches(tuple(ids[:split]))
            # the choices this prefix made most recently first, then the routes' patterns
            candidates = list(reversed(caches))
            candidates += [p for p in dict.fromkeys(tuple(p) for p in self.patterns.values())
                           if p not in caches]
            for pattern in candidates:
                if pattern not in caches:
                    caches[pattern] = self._prefill_under(ids[:split], list(pattern))
                if self._choice_over(ids, split, caches[pattern]) == list(pattern):
                    caches[pattern] = caches.pop(pattern)  # most recent last
                    self.route_stats["prefix_cache"] += 1
                    return list(pattern)
            self.route_stats["full_prefill"] += 1
            choice, cache = prefill_choice(self.moe, ids, keep_prefix=split)
            if len(caches) < self.max_patterns:  # the next request may make the same choice
                caches[tuple(choice)] = cache
            return choice

    def shared_prefix_length(self, ids: list[int]) -> int:
        """Where the first user turn's header starts (0: no user turn to split at). The
        suffix keeps the header so the request tokens are found in it as in a full prefill."""
        request = self.moe.request_tokens(ids)
        markers = self.moe.request_markers
        if markers is None or bool(request.all()):
            return 0
        split = int(request.nonzero()[0]) - 1 - len(markers[1])
        return split if split > 0 and ids[split] == markers[0] else 0

    def _prefix_caches(self, key: tuple[int, ...]) -> dict[tuple[int, ...], Any]:
        """pattern -> KV cache of the prefix `key` under that pattern (the last
        `max_prefixes` prefixes are kept)."""
        caches = self._prefixes.pop(key, None) or {}
        self._prefixes[key] = caches  # most recent last
        while len(self._prefixes) > self.max_prefixes:
            self._prefixes.popitem(last=False)
        return caches

    def _prefill_under(self, prefix: list[int], pattern: list[int]) -> Any:
        with self.moe.force(pattern):
            return _trajectory_forward(self.moe, prefix, use_cache=True).past_key_values

    def _choice_over(self, ids: list[int], split: int, cache: Any) -> list[int]:
        """The trajectory choice of `ids[split:]` as a new request over `cache` (the
        prefix `ids[:split]`); the cache is cropped back to the prefix afterwards."""
        try:
            with self.moe.request_over_prefix(), self.moe.recording() as rec:
                _trajectory_forward(self.moe, ids[split:], past_key_values=cache,
                                    use_cache=True)
        finally:
            cache.crop(split - len(ids))
        return _held_choice(rec)


def export_per_request(
    moe: GatedMoE, out: str | Path,
    requests: dict[str, list[tuple[list[dict[str, Any]], list[dict[str, Any]] | None]]]
    | None = None,
) -> dict[str, Any]:
    """Write `<out>/<capability>/` (merged PEFT adapters), `<out>/moe/` (the composed folder
    the router runs, trajectory mode) and `<out>/router.json`. `requests` maps a capability
    to example (messages, tools) of its own requests; without them the pattern is the
    capability's own adapter at every layer."""
    root = Path(out)
    root.mkdir(parents=True, exist_ok=True)
    requests = requests or {}
    unknown = sorted(set(requests) - set(moe.slots[1:]))
    if unknown:
        raise UserInputError(f"--per-request: {unknown} are not capabilities of this "
                             f"composition ({', '.join(moe.slots[1:])})")
    routes: dict[str, Any] = {}
    for slot, cap in enumerate(moe.slots[1:], start=1):
        examples = requests.get(cap) or []
        if examples:
            choices = [request_choice(moe, m, t) for m, t in examples]
            pattern = _majority(choices, moe.k + 1)
            agree = sum(c == pattern for c in choices) / len(choices)
        else:
            pattern, agree = [slot] * moe.layers, None
        safe = served_name(cap)
        folder = merged_for_pattern(moe, pattern, root / safe, cap)
        routes[cap] = {"layer_slots": pattern, "adapter": safe if folder else None,
                       "requests": len(examples), "pattern_agreement": agree}
    previous = moe.config.mode
    moe.set_mode("trajectory")
    try:
        moe.save(root / "moe")
    finally:
        moe.set_mode(previous)
    meta = {"format": ROUTER_FORMAT, "base_model": moe.base_model, "slots": moe.slots,
            "moe": "moe", "routes": routes}
    (root / "router.json").write_text(json.dumps(meta, indent=2))
    return {"path": str(root.resolve()), **meta, "vllm": vllm_command(moe.base_model, routes)}


def served_name(capability: str) -> str:
    """The model name a capability's merged adapter is served under (vLLM ids: no `/`)."""
    return capability.replace("/", "_")


def vllm_command(base_model: str, routes: dict[str, Any]) -> str:
    mods = " ".join(f"{served_name(cap)}={entry['adapter']}"
                    for cap, entry in routes.items() if entry["adapter"])
    return f"vllm serve {base_model} --enable-lora --lora-modules {mods}"


def env_requests(env_map: dict[str, str], seeds: list[int],
                 env_specs: dict[str, dict[str, Any]] | None = None
                 ) -> dict[str, list[tuple[list[dict[str, Any]], list[dict[str, Any]] | None]]]:
    """Opening requests (messages, tools) of `seeds` of each capability's environment
    (`env_specs`: serialised specs of environments the store holds, by name)."""
    from trace_lib.compose.local_client import env_factory

    out: dict[str, list[tuple[list[dict[str, Any]], list[dict[str, Any]] | None]]] = {}
    for cap, name in env_map.items():
        make = env_factory(name, env_spec=(env_specs or {}).get(name))
        out[cap] = []
        for seed in seeds:
            env = make()
            try:
                env.reset(seed)
                out[cap].append((list(env.messages), env.tool_schemas or None))
            finally:
                if hasattr(env, "close"):
                    env.close()
    return out
