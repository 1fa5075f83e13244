"""tau-bench (v1) historical trajectories: a JSON list of `{task_id, trial, reward, info, traj}`.

Design decisions
- `traj` is OpenAI chat messages: assistant `tool_calls[].function.arguments` is a JSON
  string (parsed into a dict; an unparsable string is kept under `_unparsed`), tool
  messages answer by `tool_call_id`.
- tau-bench tools report failures as a result string starting with "Error:" (its
  environment catches the exception and returns `f"Error: {e}"`); that text becomes the
  error of the call it answers.
- Termination from `info.source`: "user" -> user_stop (the simulated user sent ###STOP###),
  "transfer_to_human_agents" -> agent_stop (the agent handed off), any other tool name ->
  max_steps (tau-bench's loop ended after its step budget on that action). The raw value is
  kept as `meta.end_source`.
- The file does not name its agent or domain; the upstream file names do
  (`gpt-4o-airline.json`, `sonnet-35-new-retail.json`): `<agent model>-<domain>.json` is
  read when the stem ends with a known domain, else both stay unknown.
- Expected actions come from `info.task.actions` (`{name, kwargs}`), per task id.
- `reward` is required (a number); success = reward >= 1.0, as tau-bench defines it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trace_lib.data_model import ExpectedAction, Trajectory
from trace_lib.errors import UserInputError
from trace_lib.ingest.formats import ParseContext, register_importer
from trace_lib.ingest.records import (
    ParsedFile,
    RawMessage,
    Skipped,
    as_object,
    assemble,
    check_role,
    expected_actions,
    field,
    opt_field,
    parse_arguments,
    success_from,
)
from trace_lib.ingest.source import RecordError, Source, read_document

DOMAINS = ("airline", "retail")
TOOL_ERROR_PREFIX = "Error:"


def model_and_domain(name: str) -> tuple[str | None, str | None]:
    stem = Path(name).stem
    for domain in DOMAINS:
        if stem.endswith("-" + domain) and len(stem) > len(domain) + 1:
            return stem[: -len(domain) - 1], domain
    return None, None


def termination_from_source(source: str | None) -> str | None:
    if source is None:
        return None
    if source == "user":
        return "user_stop"
    if source == "transfer_to_human_agents":
        return "agent_stop"
    return "max_steps"


def _messages(traj: list[Any], record: int) -> list[RawMessage]:
    out: list[RawMessage] = []
    for i, raw in enumerate(traj):
        path = f"traj[{i}]"
        m = as_object(raw, record, path)
        role = check_role(field(m, "role", (str,), record, path), record, path)
        content = opt_field(m, "content", (str,), record, path)
        calls = []
        for j, tc in enumerate(opt_field(m, "tool_calls", (list,), record, path) or []):
            cpath = f"{path}.tool_calls[{j}]"
            tc = as_object(tc, record, cpath)
            fn = as_object(
                field(tc, "function", (dict,), record, cpath), record, f"{cpath}.function"
            )
            calls.append(
                {
                    "name": field(fn, "name", (str,), record, f"{cpath}.function"),
                    "arguments": parse_arguments(
                        fn.get("arguments"), record, f"{cpath}.function.arguments"
                    ),
                    "call_id": opt_field(tc, "id", (str,), record, cpath),
                    "requestor": "assistant",
                }
            )
        msg = RawMessage(
            role=role,
            content=content,
            tool_calls=calls,
            tool_call_id=opt_field(m, "tool_call_id", (str,), record, path),
            name=opt_field(m, "name", (str,), record, path),
        )
        if role == "tool" and content and content.startswith(TOOL_ERROR_PREFIX):
            msg.error = content
        out.append(msg)
    return out


def _expected(task: dict[str, Any] | None, record: int) -> list[ExpectedAction] | None:
    if not task or task.get("actions") is None:
        return None
    return expected_actions(task["actions"], record, "info.task.actions", args_key="kwargs")


def parse_record(
    raw: Any, record: int, model: str | None, domain: str | None
) -> tuple[Trajectory, list[ExpectedAction] | None]:
    rec = as_object(raw, record, "")
    task_id = field(rec, "task_id", (int, str), record)
    trial = opt_field(rec, "trial", (int,), record)
    reward = float(field(rec, "reward", (int, float), record))
    info = opt_field(rec, "info", (dict,), record) or {}
    traj = field(rec, "traj", (list,), record)
    messages = _messages(traj, record)
    task = opt_field(info, "task", (dict,), record, "info")
    end_source = opt_field(info, "source", (str,), record, "info")
    meta = {
        "source_format": "tau_bench",
        "end_source": end_source,
        "reward_info": info.get("reward_info"),
        "user_cost": info.get("user_cost"),
    }
    if task:
        meta["instruction"] = task.get("instruction")
        meta["user_id"] = task.get("user_id")
        meta["expected_outputs"] = task.get("outputs")
    traj_model = assemble(
        messages,
        record,
        source_id=f"{task_id}/{trial}",
        task_id=str(task_id),
        trial=trial,
        agent_model=model,
        domain=domain,
        reward=reward,
        success=success_from(reward, None),
        termination=termination_from_source(end_source),
        meta=meta,
    )
    return traj_model, _expected(task, record)


class TauBenchImporter:
    name = "tau_bench"
    description = (
        "a JSON list of {task_id, trial, reward, info, traj} (tau-bench v1 historical trajectories)"
    )
    streaming = False

    def matches(self, doc: Any) -> bool:
        return (
            isinstance(doc, list)
            and bool(doc)
            and isinstance(doc[0], dict)
            and "traj" in doc[0]
            and "task_id" in doc[0]
        )

    def parse(self, src: Source, doc: Any, sha256: str | None, ctx: ParseContext) -> ParsedFile:
        if doc is None:
            doc, sha256 = read_document(src, ctx.limits, ctx.progress)
        if not isinstance(doc, list):
            raise UserInputError(
                f"{src.name}: expected a JSON list of tau-bench episodes, got {type(doc).__name__}"
            )
        if not doc:
            raise UserInputError(f"{src.name}: the list is empty; expected tau-bench episodes")
        model, domain = model_and_domain(src.name)
        out = ParsedFile(
            name=src.name,
            format=self.name,
            sha256=sha256 or "",
            n_records=len(doc),
            meta={"agent_model": model, "domain": domain},
        )
        for i, raw in enumerate(doc):
            try:
                traj, expected = parse_record(raw, i, model, domain)
                if expected is not None:
                    out.add_expected(str(traj.task_id), expected, i)
            except RecordError as exc:
                if not ctx.skip_invalid:
                    raise UserInputError(f"{src.name}: {exc}; nothing was imported") from None
                out.skipped.append(Skipped(src.name, i, str(exc)))
                continue
            out.trajectories.append(traj)
        return out


register_importer(TauBenchImporter())
