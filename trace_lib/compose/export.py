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
- `router.json` records, per capability, the pattern, the merged adapter's folder and
  how many requests measured it, so `vllm serve BASE --enable-lora --lora-modules
  cap=DIR ...` can be written from it (`vllm_command`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from trace_lib.compose.adapters import Adapter, linear_merge
from trace_lib.compose.gated import GatedMoE, load_moe
from trace_lib.errors import UserInputError

ROUTER_FORMAT = "trace-router/1"
BASE_TARGET = "base"


def request_choice(moe: GatedMoE, messages: list[dict[str, Any]],
                   tools: list[dict[str, Any]] | None = None) -> list[int]:
    """The per-layer slot `trajectory` routing picks for this request (one prefill)."""
    from trace_lib.runtime.chat_format import render_prompt

    if moe.tokenizer is None:
        raise UserInputError("routing a request needs the base model's tokenizer")
    ids = moe.tokenizer(render_prompt(messages, tools), add_special_tokens=False)["input_ids"]
    previous = moe.config.mode
    moe.set_mode("trajectory")
    try:
        with torch.no_grad(), moe.recording() as rec:
            moe.model(input_ids=torch.tensor([ids], device=next(moe.model.parameters()).device),
                      use_cache=False)
    finally:
        moe.set_mode(previous)
    assert rec.chosen is not None
    return [int(c) for c in rec.chosen[0, -1].tolist()]  # held: equal at every token


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

    @classmethod
    def load(cls, folder: str | Path, base: tuple[Any, Any] | None = None) -> Router:
        root = Path(folder)
        path = root / "router.json"
        if not path.is_file():
            raise UserInputError(f"{root}: no router.json (write one with `moe-merge "
                                 f"--per-request`)")
        meta = json.loads(path.read_text())
        if meta.get("format") != ROUTER_FORMAT:
            raise UserInputError(f"{path}: format {meta.get('format')!r}, expected "
                                 f"{ROUTER_FORMAT!r}")
        moe = load_moe(root / meta["moe"], mode="trajectory", base=base)
        return cls(moe=moe, patterns={c: e["layer_slots"] for c, e in meta["routes"].items()},
                   adapters={c: (str(root / e["adapter"]) if e["adapter"] else None)
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
        """The capability (adapter name in vLLM) this request goes to."""
        return self.route_from_choice(request_choice(self.moe, messages, tools))


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


def env_requests(env_map: dict[str, str], seeds: list[int], db: Any = None
                 ) -> dict[str, list[tuple[list[dict[str, Any]], list[dict[str, Any]] | None]]]:
    """Opening requests (messages, tools) of `seeds` of each capability's environment."""
    from trace_lib.compose.local_client import env_factory

    out: dict[str, list[tuple[list[dict[str, Any]], list[dict[str, Any]] | None]]] = {}
    for cap, name in env_map.items():
        make = env_factory(name, db=db)
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
