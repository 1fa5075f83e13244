"""Both domains' tool schemas against tau2-bench's own (`tool_schemas_by_domain.json`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trace_lib.envs.domains import get_domain
from trace_lib.envs.domains.base import strip_titles


def _strip_descriptions(x):
    if isinstance(x, dict):
        return {k: _strip_descriptions(v) for k, v in x.items() if k != "description"}
    if isinstance(x, list):
        return [_strip_descriptions(v) for v in x]
    return x


@pytest.mark.parametrize("domain", ["airline", "retail"])
def test_schemas_match_tau2(shared_data: Path, domain: str):
    ref = json.loads((shared_data / "tau2-bench" / "tool_schemas_by_domain.json").read_text())
    ref_tools = {t["function"]["name"]: t for t in ref["domains"][domain]}
    mine = {t["function"]["name"]: t for t in get_domain(domain).tool_schemas()}
    assert set(ref_tools) <= set(mine)
    assert set(mine) - set(ref_tools) == {"think"}  # tau-bench's extra scratchpad tool
    for name, theirs in ref_tools.items():
        ours = mine[name]
        assert ours["type"] == "function"
        assert ours["function"]["description"], name
        p, q = ours["function"]["parameters"], theirs["function"]["parameters"]
        assert list(p["properties"]) == list(q["properties"]), name
        assert p.get("required", []) == q.get("required", []), name
        for arg, spec in q["properties"].items():
            assert p["properties"][arg].get("type") == spec.get("type"), (name, arg)
            assert p["properties"][arg].get("description"), (name, arg)
        # Beyond names and types: nested item schemas, enums and $defs agree too (ours
        # carry no pydantic `title` keys: prompt tokens that repeat the property names).
        assert "title" not in json.dumps(strip_titles(p)).replace('"title": {', "")
        assert _strip_descriptions(p) == _strip_descriptions(strip_titles(q)), name
