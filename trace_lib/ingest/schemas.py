"""Tool schemas: inferred from observed calls when a file does not ship them.

Design decisions
- An inferred schema is an OpenAI function tool, like a given one, so everything
  downstream (environments, the policy's tool list) reads one shape. What was observed:
  argument names; JSON types (integer and number merge to number; several types give a
  type list); array item types; `required` = the arguments present in every observed call.
  The description says how many calls it rests on ("Inferred from 12 observed call(s).");
  that count is read back when two inferred schemas merge. No extra keys: the schema must
  stay valid to pass as-is to an OpenAI-compatible API.
- Only new trajectories feed inference, so re-importing a file changes nothing.
- Merge rules when a (domain, name) already exists: a given schema always wins and is
  never overwritten by an inferred one; a new given schema replaces an inferred one; two
  inferred schemas merge (union of properties and types, intersection of required, counts
  added), so a tool's schema gets more accurate as more runs are imported.
- Schemas are keyed by domain; a trajectory without a domain files its tools under
  `default`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from trace_lib.data_model import ToolSchema, Trajectory

DEFAULT_DOMAIN = "default"
_OBSERVED = re.compile(r"^Inferred from (\d+) observed call")


def observed_calls(schema: dict[str, Any]) -> int:
    """How many calls an inferred schema rests on (0 if it does not say)."""
    match = _OBSERVED.match(str(schema.get("function", {}).get("description", "")))
    return int(match.group(1)) if match else 0


def _description(calls: int) -> str:
    return f"Inferred from {calls} observed call(s)."


_JSON_TYPES: dict[type, str] = {
    type(None): "null",
    bool: "boolean",
    int: "integer",
    float: "number",
    str: "string",
    list: "array",
    dict: "object",
}


def json_type(value: Any) -> str:
    # A dict lookup on the exact type: this runs once per argument of every imported call.
    return _JSON_TYPES.get(type(value), "object")


def _type_value(types: set[str]) -> str | list[str]:
    if {"integer", "number"} <= types:
        types = types - {"integer"}
    ordered = sorted(types)
    return ordered[0] if len(ordered) == 1 else ordered


def _types_of(spec: dict[str, Any]) -> set[str]:
    t = spec.get("type")
    if isinstance(t, str):
        return {t}
    return set(t) if isinstance(t, list) else set()


@dataclass
class _Observed:
    calls: int = 0
    parsed: int = 0  # calls whose arguments could be read
    types: dict[str, set[str]] = field(default_factory=dict)
    items: dict[str, set[str]] = field(default_factory=dict)
    present: dict[str, int] = field(default_factory=dict)

    def add(self, arguments: dict[str, Any]) -> None:
        self.calls += 1
        if "_unparsed" in arguments and len(arguments) == 1:
            return  # a malformed call tells us nothing about the arguments
        self.parsed += 1
        types, present = self.types, self.present
        for name, value in arguments.items():
            kind = _JSON_TYPES.get(type(value), "object")
            if name in present:
                types[name].add(kind)
                present[name] += 1
            else:
                types[name] = {kind}
                present[name] = 1
            if kind == "array" and value:
                self.items.setdefault(name, set()).update(json_type(v) for v in value)

    def schema(self, tool: str) -> dict[str, Any]:
        props: dict[str, Any] = {}
        for name in sorted(self.types):
            spec: dict[str, Any] = {"type": _type_value(self.types[name])}
            if self.items.get(name):
                spec["items"] = {"type": _type_value(self.items[name])}
            props[name] = spec
        required = sorted(n for n, k in self.present.items() if k == self.parsed)
        return {
            "type": "function",
            "function": {
                "name": tool,
                "description": _description(self.calls),
                "parameters": {"type": "object", "properties": props, "required": required},
            },
        }


class SchemaObserver:
    """Observed calls per (domain, tool), fed one trajectory at a time (the writer streams
    batches, so inference cannot wait for a list of every trajectory)."""

    def __init__(self) -> None:
        self.observed: dict[tuple[str, str], _Observed] = {}

    def add(self, traj: Trajectory) -> None:
        domain = traj.domain or DEFAULT_DOMAIN
        for m in traj.messages:
            for call in m.tool_calls:
                self.add_call(domain, call.name, call.arguments)

    def add_call(self, domain: str, tool: str, arguments: dict[str, Any]) -> None:
        """One call (the writer feeds calls from the loop that builds its rows)."""
        key = (domain, tool)
        obs = self.observed.get(key)
        if obs is None:
            obs = self.observed[key] = _Observed()
        obs.add(arguments)

    def schemas(
        self, skip: frozenset[tuple[str, str]] | set[tuple[str, str]] = frozenset()
    ) -> list[ToolSchema]:
        return [
            ToolSchema(domain=domain, name=name, schema=obs.schema(name), source="inferred")
            for (domain, name), obs in sorted(self.observed.items())
            if (domain, name) not in skip
        ]


def infer_schemas(
    trajectories: Iterable[Trajectory],
    skip: frozenset[tuple[str, str]] | set[tuple[str, str]] = frozenset(),
) -> list[ToolSchema]:
    """Schemas for every (domain, tool) called in `trajectories`, except those in `skip`."""
    observer = SchemaObserver()
    for traj in trajectories:
        observer.add(traj)
    return observer.schemas(skip)


def merge_inferred(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """Combine two inferred schemas of the same tool (see the module docstring)."""
    o_params = old.get("function", {}).get("parameters", {})
    n_params = new.get("function", {}).get("parameters", {})
    props: dict[str, Any] = {}
    for name in sorted(set(o_params.get("properties", {})) | set(n_params.get("properties", {}))):
        a = o_params.get("properties", {}).get(name, {})
        b = n_params.get("properties", {}).get(name, {})
        spec: dict[str, Any] = {"type": _type_value(_types_of(a) | _types_of(b))}
        items = _types_of(a.get("items", {})) | _types_of(b.get("items", {}))
        if items:
            spec["items"] = {"type": _type_value(items)}
        props[name] = spec
    required = sorted(set(o_params.get("required", [])) & set(n_params.get("required", [])))
    calls = observed_calls(old) + observed_calls(new)
    name = new.get("function", {}).get("name") or old.get("function", {}).get("name")
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": _description(calls),
            "parameters": {"type": "object", "properties": props, "required": required},
        },
    }


def resolve(
    existing: dict[tuple[str, str], tuple[str, str]], incoming: list[ToolSchema]
) -> list[ToolSchema]:
    """The rows to upsert, given existing {(domain, name): (schema_json, source)}."""
    out: dict[tuple[str, str], ToolSchema] = {}
    for s in incoming:
        key = (s.domain, s.name)
        current = out.get(key)
        if current is None and key in existing:
            schema_json, source = existing[key]
            current = ToolSchema(
                domain=s.domain, name=s.name, schema=json.loads(schema_json), source=source
            )
            if s.source == "given" and current.source == "given" and current.schema_ == s.schema_:
                continue
        if current is None or (s.source == "given" and current.source != "given"):
            out[key] = s
        elif s.source == "inferred" and current.source == "inferred":
            out[key] = ToolSchema(
                domain=s.domain,
                name=s.name,
                source="inferred",
                schema=merge_inferred(current.schema_, s.schema_),
            )
        elif s.source == "given" and current.source == "given" and key in out:
            continue  # two given schemas in one import: the first wins
        elif s.source == "given":
            out[key] = s  # a newer given schema replaces an older given one
    return list(out.values())
