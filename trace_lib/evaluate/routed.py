"""A composed model served the way vLLM can serve it: a router in front of per-capability adapters.

    python -m trace_lib moe-merge --per-request --moe data/runs/<gates>/moe --out routed/
    vllm serve BASE --enable-lora --lora-modules cap_a=routed/cap_a cap_b=routed/cap_b
    python -m trace_lib evaluate --router routed/ --server-url http://host:8000 \
        --served-model BASE --tasks all

Design decisions
- vLLM applies one adapter per request, so the composed model it can serve is
  `trajectory` routing: `moe-merge --per-request` writes one merged adapter per capability
  and a router (the gates' own request-level choice, `compose.export.Router`). This module
  puts that router in front of any OpenAI-compatible endpoint: each episode is routed once,
  on its opening request (the messages up to and including the first user turn, and the
  tools), and every turn of the episode goes to the chosen adapter's served name. The
  choice pools over the request, so later turns (tool results) could not change it; routing
  once also costs one prefill per episode, not per turn.
- Served names are the router's (`compose.export.served_name`: the capability with `/` as
  `_`, what `vllm_command` writes); a capability whose pattern is the base at every layer
  goes to `--served-model`. With `--server-url`, the endpoint must already serve them (a
  missing name is a clear error naming the `vllm serve` command); without it, the
  project's own policy server starts on the router's base model and hot-loads each
  adapter through `/v1/load_lora_adapter`, exactly as vLLM would be asked to.
- The router runs here, one route per distinct opening request, under a lock. It keeps
  the KV cache of the prompt's shared system + tools block per route pattern and prefills
  only the user turn over it (`compose.export.Router.route`: exact, with the full prefill
  as the fallback), so routing a target task costs a few hundred tokens, not the whole
  ~3k-token prompt (`bench/router_prefix.py`).
- Every episode's record says where it went (`meta.routed_to`), so routing accuracy on the
  target tasks can be read from the dataset.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from trace_lib.errors import UserInputError


def router_meta(folder: str | Path, where: str = "evaluate") -> dict[str, Any]:
    """router.json of a `moe-merge --per-request` folder, or a UserInputError."""
    from trace_lib.compose.export import ROUTER_FORMAT

    path = Path(folder).expanduser() / "router.json"
    try:
        meta = json.loads(path.read_text())
    except OSError:
        raise UserInputError(f"{where}: --router {folder}: no router.json (write one with "
                             "`moe-merge --per-request --moe DIR --out DIR`)") from None
    except json.JSONDecodeError as exc:
        raise UserInputError(f"{where}: {path}: not JSON ({exc})") from None
    if not isinstance(meta, dict) or meta.get("format") != ROUTER_FORMAT:
        raise UserInputError(f"{where}: {path}: format "
                             f"{meta.get('format') if isinstance(meta, dict) else None!r}, "
                             f"expected {ROUTER_FORMAT!r}")
    return meta


def opening_request(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages up to and including the first user turn (all of them if none)."""
    for i, m in enumerate(messages):
        if m.get("role") == "user":
            return list(messages[: i + 1])
    return list(messages)


class RoutedChatClient:
    """A `ChatClient` that sends each episode to the adapter its opening request routes to."""

    def __init__(self, inner: Any, router: Any, names: dict[str, str | None]):
        self.inner, self.router, self.names = inner, router, names
        self._routes: dict[str, str] = {}
        self._lock = threading.Lock()

    def routed_capability(self, messages: list[dict[str, Any]],
                          tools: list[dict[str, Any]] | None) -> str:
        opening = opening_request(messages)
        key = json.dumps([opening, tools], sort_keys=True, default=str)
        with self._lock:  # one route per distinct opening request, even when episodes race
            if key not in self._routes:
                self._routes[key] = self.router.route(opening, tools)
            return self._routes[key]

    def chat(self, messages: list[dict[str, Any]], *, tools: list[dict[str, Any]] | None = None,
             model: str | None = None, **kw: Any) -> list[Any]:
        cap = self.routed_capability(messages, tools)
        return self.inner.chat(messages, tools=tools, model=self.names.get(cap) or model, **kw)

    def close(self) -> None:
        self.inner.close()


@contextlib.contextmanager
def routed_endpoint(cfg: Any, key: str | None) -> Iterator[tuple[RoutedChatClient, str]]:
    """(routed client, base model's served name) for `cfg.router`; a local server (when no
    `server_url`) lives for the duration of the `with` block."""
    from trace_lib.compose.export import Router, served_name
    from trace_lib.evaluate.client import EvalChatClient

    folder = Path(cfg.router).expanduser()
    meta = router_meta(folder)
    router = Router.load(folder, meta=meta)
    names = {cap: (served_name(cap) if entry["adapter"] else None)
             for cap, entry in meta["routes"].items()}
    if cfg.server_url:
        inner = EvalChatClient(cfg.server_url, key, cfg.request_timeout_s)
        try:
            _check_served(inner, names, meta, cfg.served_model)
            yield RoutedChatClient(inner, router, names), str(cfg.served_model)
        finally:
            inner.close()
        return
    from trace_lib.evaluate.client import local_server_config
    from trace_lib.runtime.policy_server import PolicyServer

    with PolicyServer(local_server_config(cfg, meta["base_model"])) as server:
        inner = EvalChatClient(server.url, timeout_s=cfg.request_timeout_s)
        try:
            for cap, entry in meta["routes"].items():
                if not entry["adapter"]:
                    continue
                inner.load_adapter(names[cap], str(folder / entry["adapter"]),
                                   f"--router {folder}: the adapter of {cap}")
            yield RoutedChatClient(inner, router, names), server.model_name
        finally:
            inner.close()


def _check_served(client: Any, names: dict[str, str | None], meta: dict[str, Any],
                  base_name: str | None) -> None:
    """Every adapter name the router sends to must be a model of the endpoint."""
    from trace_lib.compose.export import vllm_command

    served = client.model_ids()
    if served is None:  # an endpoint without /v1/models is checked by use
        return
    missing = sorted(n for n in [*names.values(), base_name] if n and n not in served)
    if missing:
        raise UserInputError(
            f"--router: {client.base_url} does not serve {missing} (it serves "
            f"{sorted(served)}); start it with the router's adapters, e.g. "
            f"`{vllm_command(meta['base_model'], meta['routes'])}`")
