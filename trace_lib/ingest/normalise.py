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
- Outcome (`outcome_fields`): an explicit boolean wins; else reward >= the top of the
  reward range (tau-bench and tau2 define success as a full reward); else unknown. A run
  the harness crashed on is `error` (success None, reward None: its 0.0 is the harness's
  placeholder, kept in `meta.harness_reward`). A reward outside the range ([0, 1] unless
  the import declares `--reward-range LO,HI`) is refused: a reward of 7 is not a success.
- Integers go into INTEGER columns (`trial`, indices): anything outside 32 bits is refused
  with the field named, rather than failing inside the batch write with no record to name.
- A `ParsedFile` is streamed: `records` is a generator the writer consumes in batches
  (of `Trajectory` models, or of `rows.TrajectoryRows` where an importer builds rows
  directly, as the OpenAI-messages importer does for plainly valid records), and
  the importer fills `expected_actions`, `skipped` and `notes` as it goes; the writer reads
  them once the generator is exhausted.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from dataclasses import field as dc_field
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from trace_lib.data_model import MESSAGE_META_KEYS, ExpectedAction, ToolSchema, Trajectory
from trace_lib.ingest.source import RecordError, fast_loads

if TYPE_CHECKING:
    from trace_lib.ingest.rows import TrajectoryRows

ROLES = ("system", "user", "assistant", "tool")
SUCCESS_REWARD = 1.0
DEFAULT_REWARD_RANGE = (0.0, 1.0)
INT32 = (-(2**31), 2**31 - 1)

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
            value = fast_loads(raw)
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
    """A list of `{name, <args_key>: object, requestor?}` (tau-bench names the arguments
    `kwargs`; tau2 says whose action it is in `requestor`: "assistant" or "user")."""
    out = []
    for k, a in enumerate(check_type(actions, (list,), record, path)):
        apath = f"{path}[{k}]"
        a = as_object(a, record, apath)
        out.append(
            ExpectedAction(
                name=field(a, "name", (str,), record, apath),
                arguments=opt_field(a, args_key, (dict,), record, apath) or {},
                requestor=opt_field(a, "requestor", (str,), record, apath),
            )
        )
    return out


def int32_field(obj: dict[str, Any], key: str, record: int, path: str = "") -> int | None:
    """An optional integer that must fit the store's INTEGER column."""
    value = opt_field(obj, key, (int,), record, path)
    if value is not None and not INT32[0] <= value <= INT32[1]:
        where = f"{path}.{key}" if path else key
        digits = len(str(abs(value)))
        shown = value if digits <= 20 else f"an integer of {digits} digits"
        raise RecordError(record, where, f"expected an integer within 32 bits, got {shown}")
    return value


def id_field(obj: dict[str, Any], key: str, record: int, path: str = "", *, required: bool = False
             ) -> str | None:
    """An id (string or integer) as text; a very long one is refused, not stored."""
    value = (field if required else opt_field)(obj, key, (str, int), record, path)
    if value is None:
        return None
    text = value if isinstance(value, str) else str(value)
    if len(text) > 1000:
        raise RecordError(record, f"{path}.{key}" if path else key,
                          f"expected an id of at most 1000 characters, got {len(text)}")
    return text


def reward_value(obj: dict[str, Any], key: str, record: int, path: str = "", *,
                 required: bool = False) -> float | None:
    """A reward as a float (an integer over the float range is refused, not overflowed)."""
    value = (field if required else opt_field)(obj, key, (int, float), record, path)
    if value is None:
        return None
    try:
        return float(value)
    except OverflowError:
        raise RecordError(record, f"{path}.{key}" if path else key,
                          "expected a number within the float range, got a huge integer"
                          ) from None


def outcome_fields(
    reward: float | None,
    success: bool | None,
    record: int,
    reward_range: tuple[float, float] = DEFAULT_REWARD_RANGE,
    field_name: str = "reward",
) -> dict[str, Any]:
    """`reward`, `success` and `outcome` for a run that completed (see the docstring)."""
    lo, hi = reward_range
    if reward is not None and not lo <= reward <= hi:
        example = f"{min(lo, reward):g},{max(hi, reward):g}"
        hint = (f"; pass --reward-range LO,HI (e.g. --reward-range {example}) if this "
                "dataset uses its own reward scale"
                if reward_range == DEFAULT_REWARD_RANGE else "")
        raise RecordError(record, field_name,
                          f"expected a reward within [{lo:g}, {hi:g}], got {reward:g}{hint}")
    if success is None and reward is not None:
        success = reward >= hi
    return {"reward": reward, "success": success}


def error_outcome(meta: dict[str, Any], reason: str, harness_reward: Any = None
                  ) -> dict[str, Any]:
    """The fields of a run the harness crashed on: outcome `error`, no reward or success."""
    meta["harness_error"] = reason
    if harness_reward is not None:
        meta["harness_reward"] = harness_reward
    return {"reward": None, "success": None, "outcome": "error"}


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


@dataclass(slots=True)
class RawMessage:
    """A message on its way into the model: `error` is the tool's error text (tool role),
    `meta` what the source measured of it (`message_meta`)."""

    role: str
    content: str | None = None
    tool_calls: list[dict[str, Any]] = dc_field(default_factory=list)
    tool_call_id: str | None = None
    name: str | None = None
    error: str | None = None
    meta: dict[str, int | float] | None = None


def message_meta(**measured: Any) -> dict[str, int | float] | None:
    """A message's `meta` from what a source measured (`data_model.MESSAGE_META_KEYS`):
    only finite, non-negative numbers are kept (a source's null, a string or a NaN is
    "not measured", never 0); None when nothing is left."""
    out: dict[str, int | float] = {}
    for key, value in measured.items():
        if key not in MESSAGE_META_KEYS:
            raise ValueError(f"message meta {key!r}: not one of {MESSAGE_META_KEYS}")
        if (isinstance(value, int | float) and not isinstance(value, bool)
                and math.isfinite(value) and value >= 0):
            out[key] = value
    return out or None


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
            "meta": m.meta,
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
    """One file on its way to the writer. `records` is consumed once, in batches; the
    other fields are complete once it is exhausted (see the module docstring)."""

    name: str
    format: str
    sha256: str
    # Validated models, or the same as writer rows (rows.py: the OpenAI importer's fast route)
    records: Iterator[Trajectory | TrajectoryRows] = dc_field(default_factory=lambda: iter(()))
    expected_actions: dict[str, list[ExpectedAction]] = dc_field(default_factory=dict)
    given_schemas: list[ToolSchema] = dc_field(default_factory=list)
    skipped: list[Skipped] = dc_field(default_factory=list)
    n_records: int = 0
    meta: dict[str, Any] = dc_field(default_factory=dict)
    notes: list[str] = dc_field(default_factory=list)  # what was inferred, said in the summary

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
