"""The retail domain: products with variants, users, orders; tau2-bench's retail tool set.

`get_domain("retail")` returns the registered `Domain`: `make_db(seed, **RetailDBConfig)`,
`tools(db)` -> `RetailTools`, `tool_schemas()`, and `policy` (the text of `policy.md`).
"""

from __future__ import annotations

from pathlib import Path

from trace_lib.envs.domains.base import Domain
from trace_lib.envs.domains.retail.data_model import RetailDB
from trace_lib.envs.domains.retail.database import RetailDBConfig, generate_db
from trace_lib.envs.domains.retail.tools import RetailTools

POLICY = (Path(__file__).parent / "policy.md").read_text(encoding="utf-8")

# DOMAINS (trace_lib.envs.domains) names it; importing this module registers nothing.
DOMAIN = Domain(
    name="retail",
    policy=POLICY,
    toolkit_cls=RetailTools,
    db_factory=generate_db,
    description="Online store customer service: cancel, change, return and exchange "
                "orders.",
)

__all__ = ["DOMAIN", "POLICY", "RetailDB", "RetailDBConfig", "RetailTools", "generate_db"]
