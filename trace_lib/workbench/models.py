"""Base models and serving them: which models a form offers, building one, the CPU server.

Design decisions
- The registered base models (`runtime.base_models`) are the one list every front end
  offers (the Training page's picker, `model list`); `prepare_model` builds one into the
  models folder once, the same way a training job would on first use.
- `serve_policy` runs our CPU policy server on 127.0.0.1 in the foreground: the same
  server a training job starts in-process, for an evaluation or an agent to call.
- Heavy modules (torch, transformers) are imported inside the functions: a page that only
  lists names stays light.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trace_lib.runtime.base_models import (  # noqa: F401  (the --dtype / --autocast choices)
    AUTOCAST_NAMES,
    DTYPE_NAMES,
)


def list_models() -> list[dict[str, Any]]:
    """Registered base models with their cache state (`model list`)."""
    from trace_lib.runtime.base_models import list_models as _list

    return _list()


def model_names() -> list[str]:
    return [m["name"] for m in list_models()]


def prepare_model(name: str, rebuild: bool = False) -> Path:
    """Build a registered model into the models folder once (`model prepare`)."""
    from trace_lib.runtime.base_models import ensure_model_dir

    return ensure_model_dir(name, rebuild=rebuild)


def serve_policy(model: str = "tiny", port: int = 8000, served_model_name: str | None = None,
                 max_tokens: int = 256, threads: int | None = None,
                 **limits: int | None) -> None:
    """Run the CPU policy server on 127.0.0.1 in the foreground (`serve`). `limits`:
    the server's `kv_cache_mb`, `max_n`, `max_body_bytes` (None: its default)."""
    from trace_lib.runtime.policy_server import ServerConfig, serve

    serve(ServerConfig(model=model, host="127.0.0.1", port=port,
                       served_model_name=served_model_name, default_max_tokens=max_tokens,
                       torch_threads=threads,
                       **{k: v for k, v in limits.items() if v is not None}))


def server_defaults() -> Any:
    """The CPU policy server's default settings (a `ServerConfig`; `serve --help` shows
    its limits). Importing it loads no torch."""
    from trace_lib.runtime.policy_server import ServerConfig

    return ServerConfig()
