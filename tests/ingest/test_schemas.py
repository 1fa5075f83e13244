"""Tool-schema inference and the given-beats-inferred merge rules."""

from __future__ import annotations

import json

from trace_lib.data_model import Message, ToolCall, ToolSchema, Trajectory
from trace_lib.ingest.schemas import infer_schemas, merge_inferred, observed_calls, resolve


def traj(domain: str | None, *calls: tuple[str, dict]) -> Trajectory:
    return Trajectory(
        domain=domain,
        messages=[
            Message(role="assistant", tool_calls=[ToolCall(name=n, arguments=a) for n, a in calls])
        ],
    )


def test_inference_types_and_required() -> None:
    found = infer_schemas(
        [
            traj(
                "air",
                ("book", {"user": "u1", "n": 1, "legs": ["A", "B"]}),
                ("book", {"user": "u2", "n": 2.5}),
            ),
            traj(
                "air",
                ("book", {"user": "u3", "n": 3, "note": None}),
                ("cancel", {"_unparsed": "{oops"}),
            ),
            traj(None, ("ping", {})),
        ]
    )
    by_key = {(s.domain, s.name): s for s in found}
    assert set(by_key) == {("air", "book"), ("air", "cancel"), ("default", "ping")}
    book = by_key[("air", "book")]
    assert book.source == "inferred" and observed_calls(book.schema_) == 3
    assert set(book.schema_) == {"type", "function"}  # plain OpenAI tool JSON
    assert book.schema_["function"]["parameters"] == {
        "type": "object",
        "properties": {
            "legs": {"type": "array", "items": {"type": "string"}},
            "n": {"type": "number"},
            "note": {"type": "null"},
            "user": {"type": "string"},
        },
        "required": ["n", "user"],
    }
    # A malformed call says nothing about arguments: no properties, nothing required.
    assert by_key[("air", "cancel")].schema_["function"]["parameters"]["properties"] == {}
    assert infer_schemas([traj("air", ("book", {"x": 1}))], skip={("air", "book")}) == []


def test_merge_unions_properties_and_intersects_required() -> None:
    a = infer_schemas([traj("d", ("t", {"x": 1, "y": "s"}))])[0].schema_
    b = infer_schemas([traj("d", ("t", {"x": "one"}))])[0].schema_
    merged = merge_inferred(a, b)
    assert merged["function"]["parameters"]["properties"] == {
        "x": {"type": ["integer", "string"]},
        "y": {"type": "string"},
    }
    assert merged["function"]["parameters"]["required"] == ["x"] and observed_calls(merged) == 2


def test_given_beats_inferred() -> None:
    given = ToolSchema(
        domain="d", name="t", schema={"type": "function", "function": {"name": "t"}}, source="given"
    )
    inferred = infer_schemas([traj("d", ("t", {"x": 1}))])[0]
    # An inferred schema never replaces a given one already stored ...
    assert resolve({("d", "t"): (json.dumps(given.schema_), "given")}, [inferred]) == []
    # ... and a given one replaces a stored inferred one.
    assert resolve({("d", "t"): (json.dumps(inferred.schema_), "inferred")}, [given]) == [given]
    # Two inferred schemas merge.
    out = resolve({("d", "t"): (json.dumps(inferred.schema_), "inferred")}, [inferred])
    assert observed_calls(out[0].schema_) == 2
