"""Generic OpenAI-messages JSONL: one trajectory per line.

Each line is an object:
    {"id", "messages", "reward" | "success", "tools"?, "task_id"?, "trial"?, "agent_model"?,
     "domain"?, "termination"?, "expected_actions"?: [{"name", "arguments"}], "meta"?}

Design decisions
- `messages` are OpenAI chat messages ("developer" is read as system, legacy "function"
  as tool). Assistant `tool_calls` may use the wire format
  (`{id, type, function: {name, arguments: JSON string}}`) or the flat one
  (`{id, name, arguments: object}`); both normalise to the same ToolCall. Content may be a
  string, null, or a list of content parts (text parts joined).
- `reward` (number) and `success` (boolean) give the outcome. A record with neither (an
  SFT file, raw rollouts) imports with outcome `unknown` and is left out of rankings;
  `require_outcome=True` (`--require-outcome`) refuses it instead. `"outcome": "error"`
  marks a run the harness crashed on (kept, excluded from success rates).
- A tool message's `error` field (a string, or `true` meaning "the content is the error")
  marks a failed call; without it, content starting with "Error:" does (tau-bench/tau2's
  convention).
- `expected_actions` (this project's extension) fills the expected_actions table keyed by
  (dataset, task_id); it needs a `task_id`, and all trials of one task must agree.
- `tools` (OpenAI function tools) are stored as given schemas for the record's domain.
- A JSON array of such objects (not one per line) is accepted too.
- Lines are streamed (see source.py): one bad line is a record error, so with
  `--skip-invalid` the rest of the file still imports.
- Two routes, one outcome. `fast_rows` turns a plainly valid record (exact JSON types
  everywhere, no declared `outcome`) straight into the writer's
  `TrajectoryRows`, without the pydantic models `parse_record` builds (~1.5 s of CPU per
  100k records: the models, the RawMessage objects and the payload dicts). It checks
  the same things with exact type tests and gives up (None) at the first thing it does
  not take as is; the record then goes through `parse_record`, the reference, which
  accepts it or words the error (file, record, field, expected). So the fast route
  never decides an error, and every record it accepts gives the rows and the content
  hash `parse_record` would give (tests/ingest/test_openai_fast.py compares both on hard
  records; the tables of real files were compared before and after).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterator
from typing import Any

from trace_lib.data_model import ExpectedAction, ToolSchema, Trajectory
from trace_lib.errors import UserInputError
from trace_lib.ingest.importer import ParseContext
from trace_lib.ingest.normalise import (
    INT32,
    ROLES,
    ParsedFile,
    RawMessage,
    Skipped,
    as_object,
    assemble,
    check_role,
    check_type,
    error_outcome,
    field,
    id_field,
    infer_termination,
    int32_field,
    opt_field,
    outcome_fields,
    parse_arguments,
    reward_value,
    text_content,
)
from trace_lib.ingest.rows import CallRow, MessageRow, TrajectoryRows
from trace_lib.ingest.schemas import DEFAULT_DOMAIN
from trace_lib.ingest.source import RecordError, Source, iter_jsonl

# Newer and older OpenAI role names: "developer" is the system prompt of reasoning models,
# "function" the pre-tools way of returning a function's result.
ROLE_ALIASES = {"developer": "system", "function": "tool"}


def _tool_call(tc: Any, record: int, path: str) -> dict[str, Any]:
    tc = as_object(tc, record, path)
    if "function" in tc:
        fn = as_object(tc["function"], record, f"{path}.function")
        name = field(fn, "name", (str,), record, f"{path}.function")
        args = parse_arguments(fn.get("arguments"), record, f"{path}.function.arguments")
    else:
        name = field(tc, "name", (str,), record, path)
        args = parse_arguments(tc.get("arguments"), record, f"{path}.arguments")
    return {
        "name": name,
        "arguments": args,
        "call_id": opt_field(tc, "id", (str,), record, path),
        "requestor": opt_field(tc, "requestor", (str,), record, path) or "assistant",
    }


def _messages(raw_messages: list[Any], record: int) -> list[RawMessage]:
    out = []
    for i, m in enumerate(raw_messages):
        # The common case costs a few dict lookups; field paths are only built for errors.
        role = m.get("role") if type(m) is dict else None
        if type(role) is not str:
            m = as_object(m, record, f"messages[{i}]")
            role = field(m, "role", (str,), record, f"messages[{i}]")
        role = check_role(ROLE_ALIASES.get(role, role), record, f"messages[{i}]")
        path = f"messages[{i}]"
        content = m.get("content")
        if content is not None and type(content) is not str:
            content = text_content(content, record, f"{path}.content")
        # tool_call_id and name keep their names in the model: pydantic checks their types
        # (one validation per trajectory) and reports the same field path.
        msg = RawMessage(
            role=role, content=content, tool_call_id=m.get("tool_call_id"), name=m.get("name")
        )
        calls = m.get("tool_calls")
        if calls:
            for j, tc in enumerate(check_type(calls, (list,), record, f"{path}.tool_calls")):
                msg.tool_calls.append(_tool_call(tc, record, f"{path}.tool_calls[{j}]"))
        elif calls is not None and calls != []:
            check_type(calls, (list,), record, f"{path}.tool_calls")
        if role == "tool":
            err = m.get("error")
            if isinstance(err, str) and err:
                msg.error = err
            elif err is True:
                msg.error = content or "error"
            elif err is None and content and content.startswith("Error:"):
                msg.error = content
            elif err not in (None, False, ""):
                raise RecordError(
                    record,
                    f"{path}.error",
                    f"expected a string or a boolean, got {type(err).__name__}",
                )
        out.append(msg)
    return out


def _expected_actions(rec: dict[str, Any], record: int, task_id: str | None
                      ) -> list[ExpectedAction] | None:
    if rec.get("expected_actions") is None:
        return None
    if task_id is None:
        raise RecordError(
            record, "task_id", "missing; expected a task_id when expected_actions is given"
        )
    expected = []
    for k, a in enumerate(
        check_type(rec["expected_actions"], (list,), record, "expected_actions")
    ):
        path = f"expected_actions[{k}]"
        a = as_object(a, record, path)
        expected.append(
            ExpectedAction(
                name=field(a, "name", (str,), record, path),
                arguments=parse_arguments(a.get("arguments"), record, f"{path}.arguments"),
            )
        )
    return expected


def _tools(rec: dict[str, Any], record: int) -> list[dict[str, Any]]:
    tools = opt_field(rec, "tools", (list,), record) or []
    for k, tool in enumerate(tools):
        fn = as_object(tool, record, f"tools[{k}]").get("function")
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise RecordError(
                record,
                f"tools[{k}].function.name",
                "expected an OpenAI function tool {type: function, function: {name, ...}}",
            )
    return tools


def parse_record(
    raw: Any, record: int, ctx: ParseContext | None = None
) -> tuple[Trajectory, list[ExpectedAction] | None, list[dict[str, Any]]]:
    ctx = ctx or ParseContext()
    rec = as_object(raw, record, "")
    reward = reward_value(rec, "reward", record)
    success = opt_field(rec, "success", (bool,), record)
    declared = opt_field(rec, "outcome", (str,), record)
    if declared is not None and declared not in ("success", "failure", "unknown", "error"):
        raise RecordError(record, "outcome",
                          f"expected one of success/failure/unknown/error, got {declared!r}")
    if reward is None and success is None and declared != "error" and ctx.require_outcome:
        raise RecordError(
            record,
            "reward",
            "missing outcome; expected 'reward' (a number) or 'success' (a boolean) "
            "(--require-outcome)",
        )
    messages_raw = field(rec, "messages", (list,), record)
    if not messages_raw:
        raise RecordError(record, "messages", "empty; expected at least one message")
    messages = _messages(messages_raw, record)
    source_id = id_field(rec, "id", record)
    task_id = id_field(rec, "task_id", record)
    termination = opt_field(rec, "termination", (str,), record) or infer_termination(messages)
    expected = _expected_actions(rec, record, task_id)
    tools = _tools(rec, record)
    meta = {"source_format": "openai_jsonl", **(opt_field(rec, "meta", (dict,), record) or {})}
    if declared == "error":
        outcome = error_outcome(meta, str(meta.get("error") or "outcome: error"), reward)
    else:
        outcome = outcome_fields(reward, success, record, ctx.reward_range)
        if declared is not None and declared != ("unknown" if outcome["success"] is None else
                                                 "success" if outcome["success"] else "failure"):
            raise RecordError(record, "outcome",
                              f"{declared!r} disagrees with reward/success of the record")
    traj = assemble(
        messages,
        record,
        source_id=source_id,
        task_id=task_id,
        trial=int32_field(rec, "trial", record),
        agent_model=opt_field(rec, "agent_model", (str,), record),
        domain=opt_field(rec, "domain", (str,), record),
        termination=termination,
        meta=meta,
        **outcome,
    )
    return traj, expected, tools


class _NotPlain(Exception):
    """The fast route does not take this record as is (`parse_record` decides)."""


ParsedRecord = tuple[Trajectory | TrajectoryRows, list[ExpectedAction] | None,
                     list[dict[str, Any]]]
_STR_OR_NONE = (str, type(None))  # exact types: `type(x) in _STR_OR_NONE`
_ID_TYPES = (str, int, type(None))


def fast_rows(raw: Any, record: int, ctx: ParseContext) -> ParsedRecord | None:
    """`parse_record`'s result with the trajectory as rows, without building models, for
    a plainly valid record; None for anything else (see the module docstring)."""
    if type(raw) is not dict:
        return None
    try:
        return _fast_rows(raw, record, ctx)
    except (_NotPlain, RecordError):
        # A RecordError here comes from a check shared with parse_record; the full route
        # raises it again, after every check it makes first, so the error is its own.
        return None


def _fast_call(tc: Any, record: int) -> CallRow:
    """`_tool_call` for a call of exact types (a list: its answer sets the error later)."""
    if type(tc) is not dict:
        raise _NotPlain
    fn = tc["function"] if "function" in tc else tc  # the wire format, or the flat one
    if type(fn) is not dict:
        raise _NotPlain
    name = fn.get("name")
    args = fn.get("arguments")
    if type(args) is not dict:
        args = parse_arguments(args, record, "")
    call_id = tc.get("id")
    requestor = tc.get("requestor")
    if type(name) is not str or type(call_id) not in _STR_OR_NONE or (
            type(requestor) not in _STR_OR_NONE):
        raise _NotPlain
    return [name, args, call_id, requestor or "assistant", None]


def _fast_messages(raw_messages: list[Any], record: int) -> tuple[list[MessageRow], str | None]:
    """`_messages` + `assemble`'s call matching and turns + `infer_termination`, on rows.

    Written out flat (no generators, no helper per field): it runs for every message.
    """
    rows: list[MessageRow] = []
    turn = 0
    pending: list[CallRow] = []  # calls of the latest assistant message not yet answered
    by_id: dict[str, CallRow] = {}
    role: Any = ""
    calls: list[CallRow] = []
    error = None
    for m in raw_messages:
        if type(m) is not dict:
            raise _NotPlain
        get = m.get
        role = get("role")
        if type(role) is not str:
            raise _NotPlain
        role = ROLE_ALIASES.get(role, role)
        if role not in ROLES:
            raise _NotPlain
        content = get("content")
        if content is not None and type(content) is not str:
            content = text_content(content, record, "")  # content parts (the same function)
        tool_call_id = get("tool_call_id")
        name = get("name")
        if type(tool_call_id) not in _STR_OR_NONE or type(name) not in _STR_OR_NONE:
            raise _NotPlain  # pydantic's to word
        raw_calls = get("tool_calls")
        if raw_calls:
            if type(raw_calls) is not list:
                raise _NotPlain
            calls = [_fast_call(tc, record) for tc in raw_calls]
            # assemble: these calls now wait for their results
            pending = list(calls)
            for call in calls:
                if call[2]:
                    by_id[call[2]] = call
        else:
            if raw_calls is not None and raw_calls != []:
                raise _NotPlain
            calls = []
        error = None
        if role == "user":
            turn += 1
        elif role == "tool":
            err = get("error")  # the same rules, in the same order, as _messages
            if isinstance(err, str) and err:
                error = err
            elif err is True:
                error = content or "error"
            elif err is None and content and content.startswith("Error:"):
                error = content
            elif err not in (None, False, ""):
                raise _NotPlain
            # assemble's matching of a result to its call
            call = None
            if tool_call_id:
                for c in pending:
                    if c[2] == tool_call_id:
                        call = c
                        break
                else:
                    call = by_id.get(tool_call_id)
            if call is None and pending:
                call = pending[0]
            if call is not None:
                pending = [c for c in pending if c is not call]
                if name is None:
                    name = call[0]
                if error is not None:
                    call[4] = error
        rows.append((role, content, tool_call_id, name, turn, calls))
    # infer_termination over the last message
    if role == "user":
        inferred = "user_stop"
    elif role == "assistant" and not calls:
        inferred = "agent_stop"
    elif role == "tool" and error is not None:
        inferred = "error"
    elif role in ("assistant", "tool"):
        inferred = "max_steps"
    else:
        inferred = None
    return rows, inferred


def _fast_rows(rec: dict[str, Any], record: int, ctx: ParseContext) -> ParsedRecord:
    get = rec.get
    reward = get("reward")
    if reward is not None:
        kind = type(reward)
        lo, hi = ctx.reward_range
        # An int out of range (or too big for a float) and a non-finite float: full route.
        if not ((kind is float and math.isfinite(reward)) or kind is int) or not (
                lo <= reward <= hi):
            raise _NotPlain
        reward = float(reward)
    success = get("success")
    if success is not None and type(success) is not bool:
        raise _NotPlain
    if get("outcome") is not None or (reward is None and success is None
                                      and ctx.require_outcome):
        raise _NotPlain
    raw_messages = get("messages")
    if type(raw_messages) is not list or not raw_messages:
        raise _NotPlain
    messages, inferred = _fast_messages(raw_messages, record)
    source_id, task_id, trial = get("id"), get("task_id"), get("trial")
    agent_model, domain, termination = get("agent_model"), get("domain"), get("termination")
    meta = get("meta")
    if (type(source_id) not in _ID_TYPES or type(task_id) not in _ID_TYPES
            or type(agent_model) not in _STR_OR_NONE or type(domain) not in _STR_OR_NONE
            or type(termination) not in _STR_OR_NONE
            or (meta is not None and type(meta) is not dict)
            or (trial is not None and (type(trial) is not int
                                       or not INT32[0] <= trial <= INT32[1]))):
        raise _NotPlain
    if type(source_id) is not str and source_id is not None:
        source_id = str(source_id)  # id_field: an integer id as text
    if type(task_id) is not str and task_id is not None:
        task_id = str(task_id)
    if (source_id is not None and len(source_id) > 1000) or (
            task_id is not None and len(task_id) > 1000):
        raise _NotPlain  # id_field refuses it, with its words
    if success is None and reward is not None:
        success = reward >= ctx.reward_range[1]  # outcome_fields' rule
    rows = TrajectoryRows(
        source_id, task_id, trial, agent_model, domain, reward, success,
        "unknown" if success is None else "success" if success else "failure",
        termination or inferred, {"source_format": "openai_jsonl", **(meta or {})}, messages,
    )  # fmt: skip
    return rows, _expected_actions(rec, record, task_id), _tools(rec, record)


def _is_tau2_simulation(item: Any) -> bool:
    return isinstance(item, dict) and "messages" in item and (
        "reward_info" in item or "termination_reason" in item)


class OpenAIJsonlImporter:
    name = "openai_jsonl"
    description = (
        "JSONL, one {id, messages, reward|success, tools?, task_id?, ...} per line "
        "(OpenAI chat messages)"
    )
    streaming = True

    def matches(self, doc: Any) -> bool:
        if isinstance(doc, dict):
            return "messages" in doc and not _is_tau2_simulation(doc)
        return (
            isinstance(doc, list)
            and bool(doc)
            and isinstance(doc[0], dict)
            and "messages" in doc[0]
            and not _is_tau2_simulation(doc[0])
        )

    def why_not(self, doc: Any) -> str:
        first = doc[0] if isinstance(doc, list) and doc else doc
        if not isinstance(first, dict):
            return "not one JSON object per line (nor a list of objects)"
        if "messages" not in first:
            return "the first record has no 'messages'"
        return "the records carry tau2's reward_info/termination_reason (a tau2 simulation)"

    def parse(self, src: Source, doc: Any, sha256: str | None, ctx: ParseContext) -> ParsedFile:
        out = ParsedFile(name=src.name, format=self.name, sha256=sha256 or "")
        schemas: dict[tuple[str, str], ToolSchema] = {}

        def take(record: int, raw: Any, line: int | None) -> Trajectory | TrajectoryRows | None:
            out.n_records += 1
            try:
                fast = fast_rows(raw, record, ctx)
                traj, expected, tools = (parse_record(raw, record, ctx) if fast is None
                                         else fast)
                if expected is not None:
                    out.add_expected(str(traj.task_id), expected, record)
            except RecordError as exc:
                exc = RecordError(exc.record, exc.field, exc.problem, line=line)
                if not ctx.skip_invalid:
                    raise UserInputError(f"{src.name}: {exc}; nothing was imported") from None
                out.skipped.append(Skipped(src.name, record, str(exc)))
                return None
            # The override applies to the file's tools too (records get it downstream).
            domain = ctx.domain or traj.domain or DEFAULT_DOMAIN
            for tool in tools:
                name = tool["function"]["name"]
                if (domain, name) not in schemas:
                    schemas[(domain, name)] = ToolSchema(
                        domain=domain, name=name, schema=tool, source="given")
                    out.given_schemas.append(schemas[(domain, name)])
            return traj

        def records() -> Iterator[Trajectory | TrajectoryRows]:
            if doc is not None:
                for i, raw in enumerate(doc if isinstance(doc, list) else [doc]):
                    traj = take(i, raw, None)
                    if traj is not None:
                        yield traj
            else:
                digest = hashlib.sha256()
                for line in iter_jsonl(src, ctx.limits, digest, ctx.progress):
                    if line.error is not None:
                        if not ctx.skip_invalid:
                            raise UserInputError(f"{src.name}: {line.error}; nothing was imported")
                        out.n_records += 1
                        out.skipped.append(Skipped(src.name, line.record, str(line.error)))
                        continue
                    traj = take(line.record, line.value, line.record + 1)
                    if traj is not None:
                        yield traj
            if out.n_records == 0:
                raise UserInputError(f"{src.name}: no records; expected one JSON object per line")

        out.records = records()
        return out


IMPORTER = OpenAIJsonlImporter()  # IMPORTERS (formats.py) names it
