"""The normalised shape every importer produces, and the checks that build it.

Design decisions
- An importer turns one file into a `ParsedFile`: `Trajectory` models (trace_lib.data_model),
  expected actions per task, tool schemas the file gives, and the records it skipped. The
  writer never sees a source format.
- Field checks (`field`, `opt_field`) raise `RecordError` with the path of the field and
  the JSON type expected, so a message reads "record 3: field 'traj[5].role': expected
  one of system/user/assistant/tool, got 'bot'".
- Tool errors live on the ToolCall they answer. A tool message is matched to its call by
  id (the latest call with that id: tau-bench reuses ids within a run); without an id, to
  the oldest call of the previous assistant message not answered yet (the order
  OpenAI-style tools answer in).
- `turn_idx` is the conversation turn: 0 until the first user message, then +1 at each
  user message (a user turn and the agent's whole response share one index). tau2's own
  `turn_idx` is just the message position, so it is recomputed the same way for all formats.
- Termination vocabulary (importers map onto it; the raw value stays in `meta`):
    user_stop   the user (or user simulator) ended the conversation
    agent_stop  the agent ended it (final answer, transfer to a human, SWE-agent submit)
    max_steps   a step, turn, cost or context budget ran out
    error       the run stopped on an error (format errors, environment errors)
  tau2's own reasons are kept verbatim (they add `too_many_errors`, `agent_error`).
  When a file says nothing, `infer_termination` guesses from the last message: a user
  message -> user_stop; an assistant message without tool calls -> agent_stop; a tool call
  left hanging or a tool result last -> error if that tool failed, else max_steps.
- Success is tri-state: an explicit boolean wins; else reward >= 1.0 (tau-bench and tau2
  define success as a full reward); else unknown (None).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from dataclasses import field as dc_field
from typing import Any

from pydantic import ValidationError

from trace_lib.data_model import ExpectedAction, ToolSchema, Trajectory
from trace_lib.ingest.source import RecordError

ROLES = ("system", "user", "assistant", "tool")
SUCCESS_REWARD = 1.0

_TYPE_NAMES: dict[type, str] = {
    str: "a string",
    int: "an integer",
    float: "a number",
    bool: "a boolean",
    list: "a list",
    dict: "an object",
    type(None): "null",
}


def type_name(value: Any) -> str:
    return _TYPE_NAMES.get(type(value), type(value).__name__)


def _expected(types: tuple[type, ...]) -> str:
    names = [_TYPE_NAMES.get(t, t.__name__) for t in types if t is not type(None)]
    if float in types and "an integer" in names:
        names.remove("an integer")  # "a number" covers it
    return " or ".join(dict.fromkeys(names))


def check_type(value: Any, types: tuple[type, ...], record: int, path: str) -> Any:
    kind = type(value)
    # Fast path: json.loads yields exact built-in types, so one tuple lookup settles almost
    # every field (these checks run ~20 times per record). Floats still go the slow way
    # for the finiteness check; type(True) is bool, so a JSON true never passes as a number.
    if kind in types and kind is not float:
        return value
    ok = isinstance(value, types) and not (isinstance(value, bool) and bool not in types)
    if not ok:
        got = type_name(value) if value is not None else "null"
        raise RecordError(record, path, f"expected {_expected(types)}, got {got}")
    if isinstance(value, float) and not math.isfinite(value):
        raise RecordError(record, path, f"expected a finite number, got {value}")
    return value


def field(
    obj: dict[str, Any], key: str, types: tuple[type, ...], record: int, path: str = ""
) -> Any:
    """A required field of the right JSON type."""
    if key not in obj:
        raise RecordError(
            record, f"{path}.{key}" if path else key, f"missing; expected {_expected(types)}"
        )
    value = obj[key]
    if type(value) in types and type(value) is not float:
        return value
    return check_type(value, types, record, f"{path}.{key}" if path else key)


def opt_field(
    obj: dict[str, Any], key: str, types: tuple[type, ...], record: int, path: str = ""
) -> Any:
    """An optional field: absent or null gives None, else it must have the right type."""
    value = obj.get(key)
    if value is None or (type(value) in types and type(value) is not float):
        return value
    return check_type(value, types, record, f"{path}.{key}" if path else key)


def as_object(value: Any, record: int, path: str) -> dict[str, Any]:
    if type(value) is dict:
        return value
    return check_type(value, (dict,), record, path or "(record)")


def parse_arguments(raw: Any, record: int, path: str) -> dict[str, Any]:
    """Tool-call arguments: a dict, or a JSON string of one (OpenAI's wire format).

    A string that is not valid JSON is what the model produced, and a malformed call is
    a capability failure worth diagnosing, not a broken file: it is kept verbatim under
    `_unparsed` instead of rejecting the record.
    """
    if raw is None or raw == "":
        return {}
    if isinstance(raw, dict):
        return raw
    if isinstance(raw, str):
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            return {"_unparsed": raw}
        return value if isinstance(value, dict) else {"_unparsed": raw}
    raise RecordError(record, path, f"expected an object or a JSON string, got {type_name(raw)}")


def check_role(role: str, record: int, path: str) -> str:
    """`role` if it is one of ROLES; `path` names the message (`traj[3]`)."""
    if role not in ROLES:
        raise RecordError(
            record, f"{path}.role", f"expected one of {'/'.join(ROLES)}, got {role!r}"
        )
    return role


def expected_actions(
    actions: Any, record: int, path: str, args_key: str = "arguments"
) -> list[ExpectedAction]:
    """A list of `{name, <args_key>: object}` (tau-bench names the arguments `kwargs`)."""
    out = []
    for k, a in enumerate(check_type(actions, (list,), record, path)):
        apath = f"{path}[{k}]"
        a = as_object(a, record, apath)
        out.append(
            ExpectedAction(
                name=field(a, "name", (str,), record, apath),
                arguments=opt_field(a, args_key, (dict,), record, apath) or {},
            )
        )
    return out


def text_content(value: Any, record: int, path: str) -> str | None:
    """Message content: a string, null, or a list of OpenAI content parts (texts joined)."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, list):
        texts = []
        for i, part in enumerate(value):
            if isinstance(part, str):
                texts.append(part)
            elif isinstance(part, dict) and isinstance(part.get("text"), str):
                texts.append(part["text"])
            elif isinstance(part, dict):
                texts.append(f"[{part.get('type', 'part')}]")  # images etc.: keep a marker
            else:
                raise RecordError(
                    record, f"{path}[{i}]", f"expected a content part object, got {type_name(part)}"
                )
        return "\n".join(texts)
    raise RecordError(
        record, path, f"expected a string, a list of content parts or null, got {type_name(value)}"
    )


def success_from(reward: float | None, success: bool | None) -> bool | None:
    if success is not None:
        return success
    if reward is not None:
        return reward >= SUCCESS_REWARD
    return None


@dataclass(slots=True)
class RawMessage:
    """A message on its way into the model: `error` is the tool's error text (tool role)."""

    role: str
    content: str | None = None
    tool_calls: list[dict[str, Any]] = dc_field(default_factory=list)
    tool_call_id: str | None = None
    name: str | None = None
    error: str | None = None


def assemble(messages: list[RawMessage], record: int, **fields: Any) -> Trajectory:
    """Attach tool errors to calls, number turns, and validate into a `Trajectory`."""
    pending: list[dict[str, Any]] = []  # calls of the latest assistant message not yet answered
    by_id: dict[str, dict[str, Any]] = {}
    turns: list[int] = []
    turn = 0
    # First pass: tool results onto their calls (a call's message comes before its answer).
    for m in messages:
        if m.role == "user":
            turn += 1
        turns.append(turn)
        if m.tool_calls:
            pending = list(m.tool_calls)
            for call in m.tool_calls:
                if call.get("call_id"):
                    by_id[call["call_id"]] = call
        if m.role == "tool":
            call = None
            if m.tool_call_id:
                # Ids can repeat within a run (tau-bench reuses them): an unanswered call of
                # the latest assistant message wins over an older one with the same id.
                call = next((c for c in pending if c.get("call_id") == m.tool_call_id), None)
                call = call or by_id.get(m.tool_call_id)
            if call is None and pending:
                call = pending[0]
            if call is not None:
                if any(c is call for c in pending):
                    pending = [c for c in pending if c is not call]
                if m.name is None:
                    m.name = call.get("name")
                if m.error is not None:
                    call["error"] = m.error
    # One validation per trajectory: pydantic checks the nested dicts in one call, which
    # is several times cheaper than building each Message and ToolCall on its own.
    payload = dict(fields)
    payload["messages"] = [
        {
            "role": m.role,
            "content": m.content,
            "tool_call_id": m.tool_call_id,
            "name": m.name,
            "turn_idx": turn,
            "tool_calls": m.tool_calls,
        }
        for m, turn in zip(messages, turns, strict=True)
    ]
    try:
        return Trajectory.model_validate(payload)
    except ValidationError as exc:
        path, problem = _pydantic_problem(exc)
        raise RecordError(record, path, problem) from None


def _pydantic_problem(exc: ValidationError) -> tuple[str | None, str]:
    """The first error as (field path in our `messages[3].tool_calls[0].name` style, text)."""
    err = exc.errors()[0]
    path = ""
    for part in err["loc"]:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    got = err.get("input")
    return (
        path or None
    ), f"{err['msg'].lower()}, got {type_name(got) if got is not None else 'null'}"


def infer_termination(traj_messages: list[RawMessage]) -> str | None:
    """See the module docstring for the rules."""
    if not traj_messages:
        return None
    last = traj_messages[-1]
    if last.role == "user":
        return "user_stop"
    if last.role == "assistant" and not last.tool_calls:
        return "agent_stop"
    if last.role == "tool" and last.error is not None:
        return "error"
    if last.role in ("assistant", "tool"):
        return "max_steps"
    return None


@dataclass
class SuccessMap:
    """Outcomes known from outside the trajectory file (e.g. a SWE-bench report)."""

    known: dict[str, bool]
    default: bool | None = None  # for ids the file does not list

    def lookup(self, key: str) -> bool | None:
        return self.known.get(key, self.default)


@dataclass
class Skipped:
    file: str
    record: int | None
    reason: str

    def to_json(self) -> dict[str, Any]:
        return {"file": self.file, "record": self.record, "reason": self.reason}


@dataclass
class ParsedFile:
    """One file, parsed and normalised, ready for the writer."""

    name: str
    format: str
    sha256: str
    trajectories: list[Trajectory] = dc_field(default_factory=list)
    expected_actions: dict[str, list[ExpectedAction]] = dc_field(default_factory=dict)
    given_schemas: list[ToolSchema] = dc_field(default_factory=list)
    skipped: list[Skipped] = dc_field(default_factory=list)
    n_records: int = 0
    meta: dict[str, Any] = dc_field(default_factory=dict)

    def add_expected(self, task_id: str, actions: list[ExpectedAction], record: int) -> None:
        """Expected actions are per task: the same task seen twice must agree."""
        known = self.expected_actions.get(task_id)
        if known is None:
            self.expected_actions[task_id] = actions
        elif known != actions:
            raise RecordError(
                record,
                "expected_actions",
                f"differ from an earlier record of task_id {task_id!r}; expected the same "
                f"actions for every trial of a task",
            )
