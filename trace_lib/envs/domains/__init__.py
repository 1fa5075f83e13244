"""Customer-service domains (airline, retail): databases, tools and policies.

`get_domain(name)` imports the domain's package on first use (which registers it) and
returns its `Domain`; `domain_names()` lists the built-in ones. See `base.py` for the API.
"""

from __future__ import annotations

import importlib

from trace_lib.envs.domains.base import (
    DOMAINS,
    Domain,
    ToolError,
    Toolkit,
    copy_db,
    db_hash,
    invoke,
    is_error,
    tool,
)

BUILTIN_DOMAINS: tuple[str, ...] = ("airline", "retail")

__all__ = [
    "BUILTIN_DOMAINS",
    "Domain",
    "ToolError",
    "Toolkit",
    "copy_db",
    "db_hash",
    "domain_names",
    "get_domain",
    "invoke",
    "is_error",
    "tool",
]


def get_domain(name: str) -> Domain:
    """The registered domain `name` (importing a built-in one on first use)."""
    if name not in DOMAINS and name in BUILTIN_DOMAINS:
        importlib.import_module(f"trace_lib.envs.domains.{name}")
    if name not in DOMAINS:
        raise KeyError(f"unknown domain {name!r}; known: {', '.join(domain_names())}")
    return DOMAINS[name]


def domain_names() -> list[str]:
    return sorted(set(BUILTIN_DOMAINS) | set(DOMAINS))
