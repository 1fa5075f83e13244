"""Customer-service domains (airline, retail): databases, tools and policies.

`get_domain(name)` returns a domain's `Domain`, importing its package on first use;
`domain_names()` lists them. See `base.py` for the API.

Design decisions
- `DOMAINS` is the one registry of domains: the built-ins are lazy
  "trace_lib.envs.domains.<name>:DOMAIN" strings (a domain package defines its `Domain`
  and registers nothing on import), a third party's domain is a `Domain` object named in
  the `trace_workbench.domains` entry-point group, and `DOMAINS.register(name, domain)`
  adds one in-process. Listing names imports no domain.
"""

from __future__ import annotations

from trace_lib.envs.domains.base import (
    Domain,
    ToolError,
    Toolkit,
    copy_db,
    db_hash,
    invoke,
    is_error,
    tool,
)
from trace_lib.registry import ENTRY_POINT_GROUPS, Registry

DOMAINS: Registry[Domain] = Registry("domain", group=ENTRY_POINT_GROUPS["domains"], builtins={
    "airline": "trace_lib.envs.domains.airline:DOMAIN",
    "retail": "trace_lib.envs.domains.retail:DOMAIN",
})

__all__ = [
    "DOMAINS",
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
    """The domain `name` (a built-in's package is imported on first use)."""
    if name not in DOMAINS:
        raise KeyError(f"unknown domain {name!r}; known: {', '.join(domain_names())}")
    return DOMAINS.get(name)


def domain_names() -> list[str]:
    return sorted(DOMAINS)
