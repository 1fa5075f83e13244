"""SWE-agent `.traj` files: `{trajectory, history, info}`, one run of one instance per file.

Design decisions
- `history` (what the model saw) is the message list; demonstration messages
  (`is_demo: true`) are dropped, their count kept in `meta.n_demo_messages`. Without a
  usable history, the `trajectory` steps (response, action, observation) are replayed as
  assistant/tool pairs.
- Tool calls: function-calling runs store OpenAI `tool_calls` on assistant messages and
  answer with `role: tool` + `tool_call_ids`; those are kept as they are. Thought-action
  runs only have the command text (`action`): it becomes one call named by the command's
  first word (`open`, `edit`, `submit`, `ls`, ...) with `arguments={"command": <full
  action>}`, and the observation that follows becomes the tool message answering it.
  SWE-agent records no per-command error flag, so `error` stays NULL.
- Two generations of the format, detected per file: 1.x history entries carry
  `message_type` (observations are `user` turns with `message_type: observation`); 0.x
  entries have none, and the command's output is simply the next `user` turn after an
  assistant turn with an `action`. Both become tool messages answering the command
  (`meta.swe_agent_format` says which was read). The multi-agent `agent` field of history
  entries (`primary`, `main`, a reviewer...) is kept per message in `meta.message_agents`.
- The instance id is the file's stem (SWE-agent writes `<instance_id>.traj`); it is both
  `task_id` and `source_id`. The domain is `swe` (tool schemas are filed under it).
- Outcome: SWE-agent does not know whether the patch resolved the issue; that comes from
  the evaluation harness. `--success-file` accepts (see `load_success_file`):
    * a JSON list of resolved instance ids (every other instance counts as failed);
    * a JSON object {instance_id: true/false} (instances not listed stay unknown);
    * a SWE-bench evaluation report with `resolved_ids` (and `unresolved_ids`,
      `error_ids`, `empty_patch_ids`, `completed_ids`: those not resolved are failures);
    * the older per-run SWE-bench report `{no_generation, generated, with_logs,
      install_fail, reset_failed, no_apply, applied, test_errored, test_timeout, resolved}`
      (lists of ids): resolved = success, every other listed id = failure.
  Without it `success` is NULL (unknown) and the trajectory is left out of rankings.
- Termination from `info.exit_status`: "submitted..." -> agent_stop; cost, context, time or
  step limits (exit_cost, exit_context, exit_total_execution_time, ...) -> max_steps; any
  other "exit_*" / error -> error. The raw status is kept in `meta.exit_status`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from trace_lib.errors import UserInputError
from trace_lib.ingest.importer import ParseContext
from trace_lib.ingest.normalise import (
    ParsedFile,
    RawMessage,
    Skipped,
    SuccessMap,
    as_object,
    assemble,
    check_type,
    opt_field,
    parse_arguments,
    text_content,
)
from trace_lib.ingest.source import RecordError, Source, read_document

_BUDGET_WORDS = ("cost", "context", "time", "limit", "steps", "api_calls")
OLD_REPORT_KEYS = ("no_generation", "generated", "with_logs", "install_fail", "reset_failed",
                   "no_apply", "applied", "test_errored", "test_timeout")


def termination_from_exit(status: str | None) -> str | None:
    if not status:
        return None
    s = status.strip().lower()
    if s.startswith("submitted"):
        return "agent_stop"
    if any(w in s for w in _BUDGET_WORDS):
        return "max_steps"
    return "error"


def load_success_file(path: str | Path) -> SuccessMap:
    """Read a success file (formats in the module docstring) into instance id -> resolved."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise UserInputError(f"{p}: success file not found")
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UserInputError(f"{p}: not a JSON success file: {exc}") from None
    if isinstance(data, list):
        if not all(isinstance(x, str) for x in data):
            raise UserInputError(f"{p}: expected a JSON list of resolved instance ids (strings)")
        return SuccessMap(dict.fromkeys(data, True), default=False)
    if isinstance(data, dict) and isinstance(data.get("resolved"), list) and any(
        isinstance(data.get(k), list) for k in OLD_REPORT_KEYS
    ):
        old: dict[str, bool] = {}
        for key in OLD_REPORT_KEYS:
            for x in data.get(key) or []:
                old[str(x)] = False
        for x in data["resolved"]:
            old[str(x)] = True
        return SuccessMap(old)
    if isinstance(data, dict) and isinstance(data.get("resolved_ids"), list):
        out: dict[str, bool] = {}
        for key in ("completed_ids", "unresolved_ids", "error_ids", "empty_patch_ids"):
            for x in data.get(key) or []:
                out[str(x)] = False
        for x in data["resolved_ids"]:
            out[str(x)] = True
        return SuccessMap(out)
    if isinstance(data, dict):
        bad = [k for k, v in data.items() if not isinstance(v, bool)]
        if bad:
            raise UserInputError(
                f"{p}: instance {bad[0]!r}: expected true/false, got {type(data[bad[0]]).__name__}; "
                f"a success file is a list of resolved ids, an {{id: bool}} object or a SWE-bench "
                f"report with 'resolved_ids'"
            )
        return SuccessMap(dict(data))
    raise UserInputError(
        f"{p}: expected a JSON list of resolved ids, an {{id: bool}} object or a "
        f"SWE-bench report with 'resolved_ids'"
    )


def history_generation(history: list[Any]) -> str:
    """"1.x" when history entries carry `message_type`, else "0.x"."""
    return "1.x" if any(isinstance(m, dict) and "message_type" in m for m in history) else "0.x"


def _from_history(
    history: list[Any], record: int, agents: list[str | None] | None = None
) -> tuple[list[RawMessage], int]:
    out: list[RawMessage] = []
    n_demo = 0
    pending_call: dict[str, Any] | None = None
    v0 = history_generation(history) == "0.x"
    for i, raw in enumerate(history):
        path = f"history[{i}]"
        m = as_object(raw, record, path)
        if m.get("is_demo") or m.get("message_type") == "demonstration":
            n_demo += 1
            continue
        if agents is not None:
            agents.append(m.get("agent") if isinstance(m.get("agent"), str) else None)
        role = m.get("role")
        content = text_content(m.get("content"), record, f"{path}.content")
        if role == "system":
            out.append(RawMessage(role="system", content=content))
        elif role == "assistant":
            calls = []
            for j, tc in enumerate(opt_field(m, "tool_calls", (list,), record, path) or []):
                cpath = f"{path}.tool_calls[{j}]"
                tc = as_object(tc, record, cpath)
                fn = as_object(tc.get("function") or {}, record, f"{cpath}.function")
                name = fn.get("name") or tc.get("name")
                if not isinstance(name, str):
                    raise RecordError(
                        record, f"{cpath}.function.name", "missing; expected a string"
                    )
                calls.append(
                    {
                        "name": name,
                        "call_id": tc.get("id"),
                        "requestor": "assistant",
                        "arguments": parse_arguments(
                            fn.get("arguments"), record, f"{cpath}.function.arguments"
                        ),
                    }
                )
            action = m.get("action")
            if not calls and isinstance(action, str) and action.strip():
                cmd = action.strip()
                calls.append(
                    {
                        "name": cmd.split()[0],
                        "arguments": {"command": cmd},
                        "call_id": f"step_{i}",
                        "requestor": "assistant",
                    }
                )
                pending_call = calls[0]
            else:
                pending_call = None
            out.append(RawMessage(role="assistant", content=content, tool_calls=calls))
        elif role == "tool":
            ids = m.get("tool_call_ids") or []
            out.append(
                RawMessage(
                    role="tool",
                    content=content,
                    tool_call_id=ids[0] if ids and isinstance(ids[0], str) else None,
                )
            )
            pending_call = None
        elif role == "user":
            if pending_call is not None and (v0 or m.get("message_type") == "observation"):
                out.append(
                    RawMessage(
                        role="tool",
                        content=content,
                        tool_call_id=pending_call["call_id"],
                        name=pending_call["name"],
                    )
                )
            else:
                out.append(RawMessage(role="user", content=content))
            pending_call = None
        else:
            raise RecordError(
                record, f"{path}.role", f"expected system/user/assistant/tool, got {role!r}"
            )
    return out, n_demo


def _from_steps(steps: list[Any], record: int) -> list[RawMessage]:
    out: list[RawMessage] = []
    for i, raw in enumerate(steps):
        path = f"trajectory[{i}]"
        s = as_object(raw, record, path)
        action = opt_field(s, "action", (str,), record, path) or ""
        thought = opt_field(s, "thought", (str,), record, path) or opt_field(
            s, "response", (str,), record, path
        )
        calls = []
        if action.strip():
            calls.append(
                {
                    "name": action.strip().split()[0],
                    "arguments": {"command": action.strip()},
                    "call_id": f"step_{i}",
                    "requestor": "assistant",
                }
            )
        out.append(RawMessage(role="assistant", content=thought, tool_calls=calls))
        if calls:
            out.append(
                RawMessage(
                    role="tool",
                    content=opt_field(s, "observation", (str,), record, path),
                    tool_call_id=f"step_{i}",
                    name=calls[0]["name"],
                )
            )
    return out


def _agent_model(doc: dict[str, Any]) -> str | None:
    replay = doc.get("replay_config")
    try:
        cfg = json.loads(replay) if isinstance(replay, str) else replay
        name = cfg["agent"]["model"]["name"]
        return name if isinstance(name, str) else None
    except (TypeError, KeyError, json.JSONDecodeError):
        return None


class SweAgentImporter:
    name = "swe_agent"
    description = "an object {trajectory, history, info} (a SWE-agent .traj file)"
    streaming = False

    def matches(self, doc: Any) -> bool:
        return isinstance(doc, dict) and "info" in doc and ("trajectory" in doc or "history" in doc)

    def why_not(self, doc: Any) -> str:
        if not isinstance(doc, dict):
            return "not a JSON object"
        return "no 'info' key" if "info" not in doc else "no 'trajectory' or 'history' key"

    def parse(self, src: Source, doc: Any, sha256: str | None, ctx: ParseContext) -> ParsedFile:
        if doc is None:
            doc, sha256 = read_document(src, ctx.limits, ctx.progress)
        if not isinstance(doc, dict):
            raise UserInputError(
                f"{src.name}: expected a SWE-agent .traj object, got {type(doc).__name__}"
            )
        instance = Path(src.stem_name).name.removesuffix(".json").removesuffix(".traj")
        try:
            info = check_type(doc.get("info") or {}, (dict,), 0, "info")
            history = check_type(doc.get("history") or [], (list,), 0, "history")
            steps = check_type(doc.get("trajectory") or [], (list,), 0, "trajectory")
            agents: list[str | None] = []
            messages, n_demo = _from_history(history, 0, agents)
            generation = history_generation(history)
            if not any(m.role == "assistant" for m in messages):
                messages, n_demo, agents = _from_steps(steps, 0), n_demo, []
                generation = "trajectory steps"
            if not messages:
                raise RecordError(
                    0, "history", "no messages; expected a history or trajectory steps"
                )
            exit_status = opt_field(info, "exit_status", (str,), 0, "info")
            success = ctx.success.lookup(instance) if ctx.success is not None else None
            traj = assemble(
                messages,
                0,
                source_id=instance,
                task_id=instance,
                agent_model=_agent_model(doc),
                domain="swe",
                success=success,
                reward=None if success is None else float(success),
                termination=termination_from_exit(exit_status),
                meta={
                    "source_format": "swe_agent",
                    "exit_status": exit_status,
                    "submission": info.get("submission"),
                    "model_stats": info.get("model_stats"),
                    "n_demo_messages": n_demo,
                    "environment": doc.get("environment"),
                    "swe_agent_format": generation,
                    **({"message_agents": agents} if any(agents) else {}),
                },
            )
        except RecordError as exc:
            # One file is one record: --skip-invalid skips the whole file's run.
            if not ctx.skip_invalid:
                raise UserInputError(f"{src.name}: {exc}; nothing was imported") from None
            return ParsedFile(
                name=src.name,
                format=self.name,
                sha256=sha256 or "",
                n_records=1,
                skipped=[Skipped(src.name, 0, str(exc))],
            )
        return ParsedFile(
            name=src.name,
            format=self.name,
            sha256=sha256 or "",
            n_records=1,
            records=iter([traj]),
            meta={"instance_id": instance},
        )


IMPORTER = SweAgentImporter()  # IMPORTERS (formats.py) names it
