"""The shared domain machinery: tool marking, schema generation, invoke, hashing, registry."""

from __future__ import annotations

import json
from typing import Literal

import pytest
from pydantic import BaseModel

from trace_lib.envs.domains import domain_names, get_domain
from trace_lib.envs.domains.base import (
    ToolError,
    Toolkit,
    calculate_expression,
    db_hash,
    invoke,
    is_error,
    parse_docstring,
    tool,
)


class Counter(BaseModel):
    value: int = 0
    names: dict[str, int] = {}


class CounterTools(Toolkit):
    domain = "counter"
    db: Counter

    @tool
    def read(self) -> dict:
        """Read the counter."""
        return {"value": self.db.value}

    @tool(write=True)
    def add(self, amount: int, mode: Literal["up", "down"] = "up", note: str = "") -> dict:
        """Add to the counter.

        Second paragraph of the description.

        Args:
            amount: How much to add; must be
                positive.
            mode: Direction.
            note: Free text.
        """
        if amount <= 0:
            raise ToolError("amount must be positive")
        self.db.value += amount if mode == "up" else -amount
        return {"value": self.db.value}


def test_docstring_parsing_joins_continuations_and_keeps_paragraphs():
    desc, args = parse_docstring(CounterTools.add.__doc__)
    assert desc == "Add to the counter.\n\nSecond paragraph of the description."
    assert args == {"amount": "How much to add; must be positive.", "mode": "Direction.",
                    "note": "Free text."}


def test_schemas_come_from_signatures_and_docstrings():
    schemas = {s["function"]["name"]: s for s in CounterTools.tool_schemas()}
    assert list(schemas) == ["add", "read"]
    add = schemas["add"]
    assert add["type"] == "function"
    params = add["function"]["parameters"]
    assert params["type"] == "object" and "title" not in params  # no pydantic title noise
    assert "title" not in json.dumps(params).replace('"title": {', "")
    assert params["required"] == ["amount"]
    assert params["properties"]["amount"]["type"] == "integer"
    assert params["properties"]["amount"]["description"] == "How much to add; must be positive."
    assert params["properties"]["mode"]["enum"] == ["up", "down"]
    assert schemas["read"]["function"]["parameters"]["properties"] == {}
    assert CounterTools.is_write("add") and not CounterTools.is_write("read")


def test_invoke_returns_json_or_error_strings():
    kit = CounterTools(Counter())
    assert json.loads(invoke(kit, "add", {"amount": 3})) == {"value": 3}
    assert json.loads(invoke(kit, "add", '{"amount": 2, "mode": "down"}')) == {"value": 1}
    assert invoke(kit, "add", {"amount": -1}) == "Error: amount must be positive"
    bad_type = invoke(kit, "add", {"amount": "lots"})
    assert is_error(bad_type) and "amount" in bad_type
    missing = invoke(kit, "add", {})
    assert is_error(missing) and "amount" in missing and "required" in missing.lower()
    assert is_error(invoke(kit, "add", {"amount": 1, "mode": "sideways"}))
    assert is_error(invoke(kit, "add", {"amount": "1"}))  # strict: no string-to-int coercion
    extra = invoke(kit, "add", {"amount": 1, "colour": "red"})
    assert extra == ("Error: unexpected argument(s) for add: colour; expected: amount, mode, "
                     "note")
    assert "not valid JSON" in invoke(kit, "add", "{amount")
    assert "unknown tool 'nope'" in invoke(kit, "nope", {})
    assert kit.db.value == 1  # failed calls changed nothing


def test_calculator_is_safe_and_rounds():
    assert calculate_expression("(120 + 80) * 2 / 3") == "133.33"
    for bad in ("__import__('os')", "2 ** 10", "1; 2", ""):
        with pytest.raises(ToolError):
            calculate_expression(bad)
    with pytest.raises(ToolError, match="division by zero"):
        calculate_expression("1 / 0")


def test_db_hash_ignores_dict_order_but_not_content():
    a = Counter(value=1, names={"x": 1, "y": 2})
    b = Counter(value=1, names={"y": 2, "x": 1})
    assert db_hash(a) == db_hash(b)
    assert db_hash(a) != db_hash(Counter(value=2, names={"x": 1, "y": 2}))


def test_registry_knows_the_builtin_domains():
    assert {"airline", "retail"} <= set(domain_names())
    assert get_domain("airline").name == "airline"
    with pytest.raises(KeyError, match="unknown domain"):
        get_domain("telecom-x")
