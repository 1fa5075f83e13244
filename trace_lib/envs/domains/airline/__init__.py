"""The airline domain: flights, users and reservations; tau2-bench's airline tool set.

`get_domain("airline")` returns the registered `Domain`: `make_db(seed, **AirlineDBConfig)`,
`tools(db, enforce_policy=False)` -> `AirlineTools`, `tool_schemas()`, and `policy` (the
text of `policy.md`). Tasks and the scripted demo agent live in `tasks.py` and
`scripted_agent.py`.
"""

from __future__ import annotations

from pathlib import Path

from trace_lib.envs.domains.airline.data_model import NOW, AirlineDB
from trace_lib.envs.domains.airline.database import AirlineDBConfig, generate_db
from trace_lib.envs.domains.airline.tools import AirlineTools
from trace_lib.envs.domains.base import Domain

POLICY = (Path(__file__).parent / "policy.md").read_text(encoding="utf-8")

# DOMAINS (trace_lib.envs.domains) names it; importing this module registers nothing.
DOMAIN = Domain(
    name="airline",
    policy=POLICY,
    toolkit_cls=AirlineTools,
    db_factory=generate_db,
    description="Airline customer service: book, change and cancel flight reservations.",
    extras={"now": NOW},
)

__all__ = ["DOMAIN", "NOW", "POLICY", "AirlineDB", "AirlineDBConfig", "AirlineTools",
           "generate_db"]
