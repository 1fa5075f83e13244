"""Shared machinery of a customer-service domain (tau2-style): tools, schemas, `Domain`.

A domain is a database (a pydantic model), a toolkit of methods over it, and a policy
text. Capability environments, the scripted demo agent and the tests all use this API:

    from trace_lib.envs.domains import get_domain
    dom = get_domain("airline")
    db = dom.make_db(seed=0)                 # deterministic from the seed
    kit = dom.tools(db)                      # the toolkit; mutates `db` in place
    obs = invoke(kit, "get_user_details", {"user_id": "..."})   # JSON text or "Error: ..."
    dom.tool_schemas()                       # OpenAI function tools, from the code
    db_hash(db)                              # what verifiers compare

Design decisions
- A tool is a toolkit method marked with `@tool` (read) or `@tool(write=True)`. Its JSON
  schema is generated from the method itself: the signature's type hints become a pydantic
  model named "parameters" (the same construction tau2-bench uses, so `$defs`, `anyOf`
  and enums come out in the same shape; pydantic's `title` keys are dropped: on a small
  model's prompt budget they cost tokens and repeat the property names) and the
  Google-style docstring gives the tool and argument descriptions. There is no second, hand-written copy of a schema to
  drift from the code.
- `invoke` validates arguments against that same model before calling, strictly (no
  "2" -> 2 coercion) and refusing unknown argument names, so a wrong type, a missing or an
  invented argument is an observation ("Error: ...") the agent can read, exactly like a
  rule violation (`ToolError`): tool-calling precision is measured, not papered over.
  Any other exception is a bug and propagates.
- Observations are strings: JSON for structured results (pydantic models dumped with
  `mode="json"`), "Error: <why>" for failures, as tau2-bench returns them.
- `enforce_policy` on a toolkit: tau2's APIs do NOT check policy rules (cancellation
  eligibility, basic-economy changes...): the agent must. That is the default here too,
  because precondition checking is a capability being measured. With
  `enforce_policy=True` write tools also refuse policy violations, for guarded demos
  and for tests of the rules themselves. Integrity rules (unknown ids, balances, seats)
  are always enforced.
- `db_hash` is the sha256 of the canonical JSON dump: equal states hash equal whatever
  the dict order, so a verifier compares one string.
- What tau2's airline and retail share is written once here: the customer records (`Name`,
  `Address`, `CreditCard`, same field names in both benchmarks) and the domain-free tools
  (`think`, `transfer_to_human_agents`) in `CustomerServiceTools`. `calculate` stays per
  domain: its argument example differs, and the schemas must stay as they were.
"""

from __future__ import annotations

import ast
import hashlib
import inspect
import json
import operator
import re
import typing
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError, create_model

# ----------------------------------------------------------------------------- records
# Customer records with the same fields in tau2's airline and retail databases.


class Name(BaseModel):
    first_name: str
    last_name: str


class Address(BaseModel):
    address1: str
    address2: str
    city: str
    country: str
    state: str
    zip: str


class CreditCard(BaseModel):
    source: Literal["credit_card"] = "credit_card"
    id: str
    brand: str
    last_four: str


class Customer(BaseModel):
    """The fields a user record starts with in both databases; each domain's `User` adds
    its own (payment methods of its kinds, reservations or orders) after them."""

    user_id: str
    name: Name
    address: Address
    email: str


# ----------------------------------------------------------------------------- tools


class ToolError(Exception):
    """A tool refused the call; the message becomes the observation 'Error: <message>'."""


@dataclass(frozen=True)
class ToolSpec:
    name: str
    write: bool


def tool(fn: Callable | None = None, *, write: bool = False) -> Any:
    """Mark a toolkit method as a tool. `@tool` for reads, `@tool(write=True)` for writes."""

    def mark(f: Callable) -> Callable:
        f.__tool_spec__ = ToolSpec(name=f.__name__, write=write)  # type: ignore[attr-defined]
        return f

    return mark(fn) if fn is not None else mark


_SECTION = re.compile(r"^\s*(Args|Arguments|Returns|Raises|Yields|Examples?|Notes?):\s*$")


def parse_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
    """Google-style docstring -> (description, {arg: description}).

    Continuation lines of an argument are joined with a space; the description keeps its
    paragraph breaks (tau2's descriptions have them too).
    """
    lines = inspect.cleandoc(doc or "").splitlines()
    desc: list[str] = []
    args: dict[str, str] = {}
    section = None
    current = None
    arg_indent = 0
    for line in lines:
        m = _SECTION.match(line)
        if m:
            section, current = m.group(1), None
            continue
        if section is None:
            desc.append(line)
        elif section in ("Args", "Arguments") and line.strip():
            indent = len(line) - len(line.lstrip())
            am = re.match(r"^\s*(\w+)\s*(?:\([^)]*\))?:\s*(.*)$", line)
            if am and (current is None or indent <= arg_indent):
                current, arg_indent = am.group(1), indent
                args[current] = am.group(2).strip()
            elif current:
                args[current] = (args[current] + " " + line.strip()).strip()
    paragraphs = "\n".join(desc).strip().split("\n\n")
    text = "\n\n".join(" ".join(ln.strip() for ln in p.splitlines()) for p in paragraphs)
    return text.strip(), args


_SPEC_CACHE: dict[type, dict[str, ToolSpec]] = {}


class Toolkit:
    """Base class of a domain's toolkit: holds the database, finds the `@tool` methods."""

    domain: str = ""

    def __init__(self, db: BaseModel, *, enforce_policy: bool = False) -> None:
        self.db = db
        self.enforce_policy = enforce_policy

    @classmethod
    def tool_specs(cls) -> dict[str, ToolSpec]:
        """{name: spec} of every `@tool` method, sorted by name (cached per class)."""
        if cls not in _SPEC_CACHE:
            specs = {}
            for name in sorted(dir(cls)):
                spec = getattr(getattr(cls, name, None), "__tool_spec__", None)
                if spec is not None:
                    specs[spec.name] = spec
            _SPEC_CACHE[cls] = specs
        return _SPEC_CACHE[cls]

    @classmethod
    def tool_names(cls) -> list[str]:
        return list(cls.tool_specs())

    @classmethod
    def is_write(cls, name: str) -> bool:
        spec = cls.tool_specs().get(name)
        if spec is None:
            raise KeyError(f"{cls.domain}: no tool named {name!r}")
        return spec.write

    @classmethod
    def params_model(cls, name: str) -> type[BaseModel]:
        return _params_model(cls, name)

    @classmethod
    def tool_schemas(cls) -> list[dict[str, Any]]:
        """OpenAI function tools for every tool, sorted by name."""
        return [tool_schema(cls, name) for name in cls.tool_names()]


class CustomerServiceTools(Toolkit):
    """The tools every customer-service domain has, whatever its database."""

    @tool
    def think(self, thought: str) -> str:
        """Write down a reasoning step. Changes nothing and returns nothing.

        Args:
            thought: The reasoning to record.
        """
        return ""

    @tool
    def transfer_to_human_agents(self, summary: str) -> str:
        """Hand the conversation to a human agent, with a summary of the user's problem. Only
        when the user asks for a human, or the policy and tools cannot resolve the request.

        Args:
            summary: What the user needs and what has been done so far.
        """
        return "Transfer successful"


_MODEL_CACHE: dict[tuple[type, str], type[BaseModel]] = {}


def _params_model(cls: type, name: str) -> type[BaseModel]:
    key = (cls, name)
    if key not in _MODEL_CACHE:
        fn = getattr(cls, name)
        module = inspect.getmodule(fn)
        hints = typing.get_type_hints(fn, globalns=vars(module) if module else None)
        _, arg_docs = parse_docstring(fn.__doc__)
        fields: dict[str, Any] = {}
        for pname, param in inspect.signature(fn).parameters.items():
            if pname == "self":
                continue
            default = ... if param.default is inspect.Parameter.empty else param.default
            fields[pname] = (hints[pname], Field(default, description=arg_docs.get(pname)))
        _MODEL_CACHE[key] = create_model("parameters", **fields)
    return _MODEL_CACHE[key]


def strip_titles(schema: Any) -> Any:
    """A JSON schema without pydantic's `title` keys (prompt tokens that say nothing new).

    Only the `title` *keyword* of a schema object goes; a property that happens to be
    named "title" (a key of `properties`) stays."""
    if isinstance(schema, list):
        return [strip_titles(v) for v in schema]
    if not isinstance(schema, dict):
        return schema
    out = {}
    for key, value in schema.items():
        if key == "title" and isinstance(value, str):
            continue
        if key in ("properties", "$defs", "definitions") and isinstance(value, dict):
            out[key] = {k: strip_titles(v) for k, v in value.items()}
        else:
            out[key] = strip_titles(value)
    return out


def tool_schema(cls: type, name: str) -> dict[str, Any]:
    """The OpenAI function schema of one tool, generated from its signature and docstring."""
    fn = getattr(cls, name)
    description, _ = parse_docstring(fn.__doc__)
    params = strip_titles(_params_model(cls, name).model_json_schema())
    return {
        "type": "function",
        "function": {"name": name, "description": description, "parameters": params},
    }


def to_observation(result: Any) -> str:
    """A tool's return value as the observation text the agent reads."""
    if isinstance(result, str):
        return result
    if isinstance(result, BaseModel):
        result = result.model_dump(mode="json")
    elif isinstance(result, list):
        result = [r.model_dump(mode="json") if isinstance(r, BaseModel) else r for r in result]
    elif isinstance(result, dict):
        result = {
            k: v.model_dump(mode="json") if isinstance(v, BaseModel) else v
            for k, v in result.items()
        }
    return json.dumps(result, ensure_ascii=False)


def _validation_message(name: str, exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err.get("loc", ())) or "(arguments)"
        parts.append(f"{loc}: {err.get('msg')}")
    return f"invalid arguments for {name}: " + "; ".join(parts)


def invoke(toolkit: Toolkit, name: str, arguments: dict[str, Any] | str | None) -> str:
    """Call tool `name` with `arguments`; return the observation (JSON text or 'Error: ...')."""
    specs = toolkit.tool_specs()
    if name not in specs:
        return f"Error: unknown tool {name!r}; available tools: {', '.join(specs)}"
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as exc:
            return f"Error: arguments of {name} are not valid JSON: {exc}"
    arguments = arguments or {}
    if not isinstance(arguments, dict):
        return f"Error: arguments of {name} must be a JSON object"
    model = _params_model(type(toolkit), name)
    unknown = sorted(set(arguments) - set(model.model_fields))
    if unknown:
        return (f"Error: unexpected argument(s) for {name}: {', '.join(unknown)}; expected: "
                f"{', '.join(model.model_fields) or 'none'}")
    try:
        parsed = model.model_validate(arguments, strict=True)
    except ValidationError as exc:
        return "Error: " + _validation_message(name, exc)
    kwargs = {k: getattr(parsed, k) for k in model.model_fields}
    try:
        return to_observation(getattr(toolkit, name)(**kwargs))
    except ToolError as exc:
        return f"Error: {exc}"


def is_error(observation: str) -> bool:
    return observation.startswith("Error:")


# ---------------------------------------------------------------------- calculator

_OPS: dict[type, Callable[..., float]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}


def _eval_node(node: ast.AST) -> float:
    if isinstance(node, ast.Expression):
        return _eval_node(node.body)
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_eval_node(node.left), _eval_node(node.right))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_eval_node(node.operand))
    raise ToolError("only numbers, + - * / and parentheses are allowed")


def calculate_expression(expression: str) -> str:
    """Evaluate arithmetic safely (an AST walk, never `eval`); rounded to 2 decimals."""
    if not re.fullmatch(r"[0-9+\-*/(). ]+", expression or ""):
        raise ToolError("only numbers, + - * / and parentheses are allowed")
    try:
        value = _eval_node(ast.parse(expression, mode="eval"))
    except ZeroDivisionError as exc:
        raise ToolError("division by zero") from exc
    except SyntaxError as exc:
        raise ToolError(f"cannot parse expression {expression!r}") from exc
    return str(round(float(value), 2))


# ------------------------------------------------------------------------- hashing


def db_hash(db: BaseModel | dict[str, Any]) -> str:
    """sha256 of the canonical JSON of a database state."""
    data = db.model_dump(mode="json") if isinstance(db, BaseModel) else db
    blob = json.dumps(data, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def copy_db(db: BaseModel) -> BaseModel:
    """An independent copy of a database (tools mutate in place).

    A JSON round trip through pydantic-core is about 2x faster than `model_copy(deep=True)`
    (Python deepcopy) on a database of a few hundred kB, and copies happen per episode.
    """
    return type(db).model_validate_json(db.model_dump_json())


# -------------------------------------------------------------------------- domain


@dataclass
class Domain:
    """A registered domain: its name, policy text, database generator and toolkit class."""

    name: str
    policy: str
    toolkit_cls: type[Toolkit]
    db_factory: Callable[..., BaseModel]
    description: str = ""
    extras: dict[str, Any] = field(default_factory=dict)

    def make_db(self, seed: int = 0, **size: Any) -> BaseModel:
        """A fresh database, the same for the same seed and sizes."""
        return self.db_factory(seed, **size)

    def tools(self, db: BaseModel, *, enforce_policy: bool = False) -> Toolkit:
        """The toolkit over `db` (tools mutate `db` in place)."""
        return self.toolkit_cls(db, enforce_policy=enforce_policy)

    def tool_schemas(self, names: Iterable[str] | None = None) -> list[dict[str, Any]]:
        """OpenAI function tools of the domain (all, or only `names`, in their order)."""
        schemas = {s["function"]["name"]: s for s in self.toolkit_cls.tool_schemas()}
        if names is None:
            return list(schemas.values())
        missing = [n for n in names if n not in schemas]
        if missing:
            raise KeyError(f"{self.name}: no tools named {', '.join(missing)}")
        return [schemas[n] for n in names]

    def tool_names(self) -> list[str]:
        return self.toolkit_cls.tool_names()

    def write_tools(self) -> list[str]:
        return [n for n, s in self.toolkit_cls.tool_specs().items() if s.write]

