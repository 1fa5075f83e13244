"""tau2-bench results files: `{timestamp, info, tasks, simulations}`.

Design decisions
- One trajectory per simulation. Messages carry `tool_calls[{id, name, arguments (a dict),
  requestor}]`; in telecom's default mode the *user* simulator calls device tools too, so
  `requestor` is kept on every call. Tool messages answer by `id`; `error: true` puts the
  message text on the call as its error. The ToolOrchestra files drop `error`: there a
  result starting with "Error:" counts as one (tau2's own error text format).
- tau2 does not store the agent's system prompt; it builds it from
  `info.environment_info.policy`. The policy is put first as a system message so that every
  imported trajectory shows what the agent was told (tau-bench stores its prompt the same
  way); `meta.system_prompt` says where it came from.
- Outcome: `reward_info.reward`, the whole breakdown kept as `meta.reward_info`. A
  simulation whose reward is null (or has no reward_info) or whose `termination_reason` is
  an infrastructure error (`INFRA_TERMINATIONS`: the user simulator or the environment
  failed, not the agent) is imported with outcome `error`. Termination:
  `termination_reason` verbatim. Agent model: `info.agent_info.llm`; domain:
  `info.environment_info.domain_name`.
- What tau2 measured of each message a model wrote (the agent's or the user simulator's:
  it has a `usage` or a cost above 0) is kept on it (`Message.meta`): its `cost`, its
  `usage` (`prompt_tokens` in, `completion_tokens` out) and its latency, the seconds
  since the previous message's `timestamp` (tau2 stamps a message when it is made, so the
  gap is the call that made it). A timestamp that does not parse gives no latency; the
  canned greeting (cost 0, no usage) is not measured.
- Expected actions: `tasks[].evaluation_criteria.actions` (name, arguments, requestor), per
  task id. In telecom most expected actions are the *user's* (`toggle_roaming`, ...):
  `requestor` is kept so deviations are compared side by side (the agent's calls against
  the agent's expected actions, the user's against the user's).
- A bare JSON list of simulations (no `info`/`tasks` wrapper, as some submissions and
  scripts save them) is tau2 too: imported without expected actions, domain or agent
  model (the notes say so; `--domain` / `--agent-model` supply the latter two).
- Tool schemas: the file's `environment_info.tool_defs` when present, else
  `tool_schemas_by_domain.json` (the tau2 data folder's derived schemas), found through
  `TRACE_TAU2_TOOL_SCHEMAS` or in the results file's parent folders. Both are stored as
  source='given'; tools neither covers (telecom device tools) are inferred by the caller.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

from trace_lib.data_model import ExpectedAction, ToolSchema, Trajectory
from trace_lib.errors import UserInputError
from trace_lib.ingest.importer import ParseContext
from trace_lib.ingest.normalise import (
    ParsedFile,
    RawMessage,
    Skipped,
    as_object,
    assemble,
    check_role,
    error_outcome,
    expected_actions,
    field,
    id_field,
    int32_field,
    message_meta,
    opt_field,
    outcome_fields,
    parse_arguments,
    reward_value,
    text_content,
)
from trace_lib.ingest.source import RecordError, Source, env_path, read_document

INFRA_TERMINATIONS = frozenset({"user_error", "infrastructure_error", "env_error"})
SCHEMA_FILE = "tool_schemas_by_domain.json"
SCHEMA_ENV = "TRACE_TAU2_TOOL_SCHEMAS"


def find_schema_file(src: Source) -> Path | None:
    """`$TRACE_TAU2_TOOL_SCHEMAS`, else tool_schemas_by_domain.json up to 3 folders above."""
    explicit = env_path(SCHEMA_ENV)
    if explicit is not None:
        if not explicit.is_file():
            raise UserInputError(f"{SCHEMA_ENV}={explicit}: no such file")
        return explicit
    if src.path is None:
        return None
    for parent in list(src.path.resolve().parents)[:3]:
        candidate = parent / SCHEMA_FILE
        if candidate.is_file():
            return candidate
    return None


def given_schemas(
    src: Source, domain: str | None, tool_defs: Any
) -> tuple[list[ToolSchema], str | None]:
    """Schemas the data ships for `domain`, and where they came from."""
    if domain is None:
        return [], None
    if isinstance(tool_defs, list) and tool_defs:
        return _schemas(domain, tool_defs, src.name), "info.environment_info.tool_defs"
    path = find_schema_file(src)
    if path is None:
        return [], None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UserInputError(f"{path}: cannot read tool schemas: {exc}") from None
    tools = (data.get("domains") or {}).get(domain) if isinstance(data, dict) else None
    if not tools:
        return [], None
    return _schemas(domain, tools, str(path)), str(path)


def _schemas(domain: str, tools: list[Any], where: str) -> list[ToolSchema]:
    out = []
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise UserInputError(
                f"{where}: tool {i} of domain {domain!r}: expected "
                f"{{'type': 'function', 'function': {{'name': ...}}}}"
            )
        out.append(ToolSchema(domain=domain, name=fn["name"], schema=tool, source="given"))
    return out


def _timestamp(m: dict[str, Any]) -> datetime | None:
    value = m.get("timestamp")
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        return None


def _measured(m: dict[str, Any], previous: datetime | None) -> dict[str, int | float] | None:
    """What tau2 measured of one message (see the module docstring)."""
    usage = m.get("usage") if isinstance(m.get("usage"), dict) else {}
    cost = m.get("cost")
    generated = bool(usage) or (isinstance(cost, int | float) and cost > 0)
    now = _timestamp(m)
    latency = ((now - previous).total_seconds()
               if generated and now is not None and previous is not None
               and (now.tzinfo is None) == (previous.tzinfo is None) else None)
    # A message no model wrote (the agent's canned greeting) has cost 0 and no usage:
    # nothing was measured, so nothing is kept.
    return message_meta(input_tokens=usage.get("prompt_tokens"),
                        output_tokens=usage.get("completion_tokens"),
                        cost=cost if generated else None, latency_s=latency)


def _messages(raw_messages: list[Any], record: int) -> list[RawMessage]:
    out: list[RawMessage] = []
    previous: datetime | None = None
    for i, raw in enumerate(raw_messages):
        path = f"messages[{i}]"
        m = as_object(raw, record, path)
        meta, previous = _measured(m, previous), _timestamp(m) or previous
        role = check_role(field(m, "role", (str,), record, path), record, path)
        content = text_content(m.get("content"), record, f"{path}.content")
        if role == "tool":
            failed = opt_field(m, "error", (bool,), record, path)
            if failed is None:
                failed = bool(content and content.startswith("Error:"))
            out.append(
                RawMessage(
                    role="tool",
                    content=content,
                    tool_call_id=opt_field(m, "id", (str,), record, path),
                    error=(content or "error") if failed else None,
                    meta=meta,
                )
            )
            continue
        calls = []
        for j, tc in enumerate(opt_field(m, "tool_calls", (list,), record, path) or []):
            cpath = f"{path}.tool_calls[{j}]"
            tc = as_object(tc, record, cpath)
            calls.append(
                {
                    "name": field(tc, "name", (str,), record, cpath),
                    "arguments": parse_arguments(tc.get("arguments"), record, f"{cpath}.arguments"),
                    "call_id": opt_field(tc, "id", (str,), record, cpath),
                    "requestor": opt_field(tc, "requestor", (str,), record, cpath) or role,
                }
            )
        out.append(RawMessage(role=role, content=content, tool_calls=calls, meta=meta))
    return out


def _expected(task: dict[str, Any], record: int) -> list[ExpectedAction] | None:
    crit = task.get("evaluation_criteria")
    if not isinstance(crit, dict) or crit.get("actions") is None:
        return None
    return expected_actions(crit["actions"], record, "tasks.evaluation_criteria.actions")


def parse_simulation(
    raw: Any, record: int, common: dict[str, Any], policy: str | None,
    reward_range: tuple[float, float] = (0.0, 1.0),
) -> Trajectory:
    sim = as_object(raw, record, "simulations[]")
    task_id = id_field(sim, "task_id", record, required=True)
    if "reward_info" not in sim:  # absent is a malformed file; null is "not evaluated"
        field(sim, "reward_info", (dict,), record)
    reward_info = opt_field(sim, "reward_info", (dict,), record)
    reward = None if reward_info is None else reward_value(reward_info, "reward", record,
                                                           "reward_info")
    termination = opt_field(sim, "termination_reason", (str,), record)
    messages = _messages(field(sim, "messages", (list,), record), record)
    if policy:
        messages.insert(0, RawMessage(role="system", content=policy))
    meta = {
        "source_format": "tau2",
        "simulation_id": sim.get("id"),
        "seed": sim.get("seed"),
        "termination_reason": sim.get("termination_reason"),
        "reward_info": reward_info,
        "agent_cost": sim.get("agent_cost"),
        "user_cost": sim.get("user_cost"),
        "duration": sim.get("duration"),
        "user_model": common.get("user_model"),
        "agent_implementation": common.get("agent_implementation"),
        "system_prompt": "info.environment_info.policy" if policy else None,
    }
    if termination in INFRA_TERMINATIONS:
        outcome = error_outcome(meta, f"termination_reason {termination}", reward)
    elif reward is None:
        outcome = error_outcome(meta, "no reward (the simulation was not evaluated)")
    else:
        outcome = outcome_fields(reward, None, record, reward_range, "reward_info.reward")
    return assemble(
        messages,
        record,
        source_id=id_field(sim, "id", record),
        task_id=task_id,
        trial=int32_field(sim, "trial", record),
        agent_model=common.get("agent_model"),
        domain=common.get("domain"),
        termination=termination,
        meta=meta,
        **outcome,
    )


def _is_simulation(item: Any) -> bool:
    return isinstance(item, dict) and "messages" in item and "task_id" in item and (
        "reward_info" in item or "termination_reason" in item)


class Tau2Importer:
    name = "tau2"
    description = (
        "an object {info, tasks, simulations} (a tau2-bench results file), or a bare list of "
        "tau2 simulations {id, task_id, messages, reward_info, termination_reason}"
    )
    streaming = False

    def matches(self, doc: Any) -> bool:
        if isinstance(doc, list):
            return bool(doc) and _is_simulation(doc[0])
        return isinstance(doc, dict) and "simulations" in doc and "tasks" in doc

    def why_not(self, doc: Any) -> str:
        if isinstance(doc, dict):
            missing = [k for k in ("simulations", "tasks") if k not in doc]
            return f"no {' or '.join(repr(k) for k in missing)} key"
        if isinstance(doc, list):
            return ("the first item is not a simulation {task_id, messages, reward_info|"
                    "termination_reason}") if doc else "the list is empty"
        return "not a JSON object or list"

    def parse(self, src: Source, doc: Any, sha256: str | None, ctx: ParseContext) -> ParsedFile:
        if doc is None:
            doc, sha256 = read_document(src, ctx.limits, ctx.progress)
        if isinstance(doc, list):
            doc = {"simulations": doc, "tasks": []}
            bare = True
        else:
            bare = False
        if not isinstance(doc, dict):
            raise UserInputError(
                f"{src.name}: expected a tau2 results object, got {type(doc).__name__}"
            )
        info = doc.get("info") if isinstance(doc.get("info"), dict) else {}
        env_info = (
            info.get("environment_info") if isinstance(info.get("environment_info"), dict) else {}
        )
        agent_info = info.get("agent_info") if isinstance(info.get("agent_info"), dict) else {}
        user_info = info.get("user_info") if isinstance(info.get("user_info"), dict) else {}
        sims = doc.get("simulations")
        if not isinstance(sims, list):
            raise UserInputError(
                f"{src.name}: field 'simulations': expected a list, got {type(sims).__name__}"
            )
        if not sims:
            raise UserInputError(f"{src.name}: field 'simulations' is empty; expected simulations")
        tasks = doc.get("tasks")
        if not isinstance(tasks, list):
            raise UserInputError(
                f"{src.name}: field 'tasks': expected a list, got {type(tasks).__name__}"
            )
        domain = (
            env_info.get("domain_name") if isinstance(env_info.get("domain_name"), str) else None
        )
        common = {
            "domain": domain,
            "agent_model": agent_info.get("llm")
            if isinstance(agent_info.get("llm"), str)
            else None,
            "agent_implementation": agent_info.get("implementation"),
            "user_model": user_info.get("llm"),
        }
        policy = env_info.get("policy") if isinstance(env_info.get("policy"), str) else None
        schemas, schema_source = given_schemas(src, domain, env_info.get("tool_defs"))
        out = ParsedFile(
            name=src.name,
            format=self.name,
            sha256=sha256 or "",
            n_records=len(sims),
            given_schemas=schemas,
            meta={**common, "timestamp": doc.get("timestamp"), "tool_schemas_from": schema_source},
        )
        if bare:
            out.notes.append(
                f"{src.name}: a bare list of tau2 simulations (no info/tasks wrapper): imported "
                f"without expected actions, domain or agent model (pass --domain / --agent-model)"
            )
        for k, task in enumerate(tasks):
            if not isinstance(task, dict) or "id" not in task:
                raise UserInputError(f"{src.name}: tasks[{k}]: expected an object with an 'id'")
            try:
                expected = _expected(task, k)
            except RecordError as exc:
                raise UserInputError(
                    f"{src.name}: tasks[{k}] {str(exc).split(': ', 1)[1]}"
                ) from None
            if expected is not None:
                out.expected_actions[str(task["id"])] = expected

        def records() -> Iterator[Trajectory]:
            for i, raw in enumerate(sims):
                try:
                    traj = parse_simulation(raw, i, common, policy, ctx.reward_range)
                except RecordError as exc:
                    if not ctx.skip_invalid:
                        raise UserInputError(
                            f"{src.name}: simulations {exc}; nothing was imported"
                        ) from None
                    out.skipped.append(Skipped(src.name, i, str(exc)))
                    continue
                sims[i] = None  # free the raw simulation once normalised
                yield traj

        out.records = records()
        return out


IMPORTER = Tau2Importer()  # IMPORTERS (formats.py) names it
