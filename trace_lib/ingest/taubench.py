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
- The file does not name its agent or domain. Both are inferred, and the report's notes
  say so: the historical file names (`gpt-4o-airline.json`) are `<agent model>-<domain>`;
  files written by tau-bench's `run.py` are
  `<strategy>-<model>-<temperature>_range_<start>-<end>_user-<user model>-<user strategy>_<time>.json`
  (the model is read from there); the domain also comes from the policy that opens the
  first system message ("# Retail agent policy", "# Airline Agent Policy"). `--domain` /
  `--agent-model` override both.
- Crashed runs: when the harness throws (connection reset, token limit, parse error),
  `run.py` writes `{task_id, reward: 0.0, info: {error, traceback}, traj: []}`. Those are
  imported with outcome `error` (the 0.0 kept as `meta.harness_reward`, `info.error` as
  `meta.harness_error`), never as the agent's failures.
- Expected actions come from `info.task.actions` (`{name, kwargs}`), per task id.
- `reward` is required (a number in the reward range); success = reward >= 1.0, as
  tau-bench defines it.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from trace_lib.data_model import ExpectedAction, Trajectory
from trace_lib.errors import UserInputError
from trace_lib.ingest import normalise
from trace_lib.ingest.importer import ParseContext
from trace_lib.ingest.source import RecordError, Source, read_document

DOMAINS = ("airline", "retail")
TOOL_ERROR_PREFIX = "Error:"


# tau-bench run.py: f"{agent_strategy}-{model.split('/')[-1]}-{temperature}_range_{start}-{end}"
# f"_user-{user_model}-{user_strategy}_{time}.json"
_RUN_PY_NAME = re.compile(
    r"^(?P<strategy>tool-calling|act|react|few-shot|[a-z_]+)-(?P<model>.+)-(?P<temperature>"
    r"[0-9.]+)_range_(?P<start>-?\d+)-(?P<end>-?\d+)_user-(?P<user>.+)_(?P<time>[0-9]{4,}.*)$"
)
_POLICY = re.compile(r"^\s*#\s*(?P<domain>[A-Za-z]+)\s+agent\s+policy", re.I)


def model_and_domain(name: str) -> tuple[str | None, str | None]:
    stem = Path(name).stem
    for domain in DOMAINS:
        if stem.endswith("-" + domain) and len(stem) > len(domain) + 1:
            return stem[: -len(domain) - 1], domain
    return None, None


def run_py_name(name: str) -> dict[str, str] | None:
    """The parts of a tau-bench `run.py` result file name, or None if it is not one."""
    match = _RUN_PY_NAME.match(Path(name).stem)
    return match.groupdict() if match else None


def domain_from_policy(traj: list[Any]) -> str | None:
    """"# Retail agent policy" at the top of the first system message -> "retail"."""
    for m in traj[:2]:
        if isinstance(m, dict) and m.get("role") == "system" and isinstance(m.get("content"), str):
            match = _POLICY.match(m["content"])
            return match.group("domain").lower() if match else None
    return None


def termination_from_source(source: str | None) -> str | None:
    if source is None:
        return None
    if source == "user":
        return "user_stop"
    if source == "transfer_to_human_agents":
        return "agent_stop"
    return "max_steps"


def _messages(traj: list[Any], record: int) -> list[normalise.RawMessage]:
    out: list[normalise.RawMessage] = []
    for i, raw in enumerate(traj):
        path = f"traj[{i}]"
        m = normalise.as_object(raw, record, path)
        role = normalise.check_role(normalise.field(m, "role", (str,), record, path), record, path)
        content = normalise.opt_field(m, "content", (str,), record, path)
        calls = []
        for j, tc in enumerate(normalise.opt_field(m, "tool_calls", (list,), record, path) or []):
            cpath = f"{path}.tool_calls[{j}]"
            tc = normalise.as_object(tc, record, cpath)
            fn = normalise.as_object(
                normalise.field(tc, "function", (dict,), record, cpath), record, f"{cpath}.function"
            )
            calls.append(
                {
                    "name": normalise.field(fn, "name", (str,), record, f"{cpath}.function"),
                    "arguments": normalise.parse_arguments(
                        fn.get("arguments"), record, f"{cpath}.function.arguments"
                    ),
                    "call_id": normalise.opt_field(tc, "id", (str,), record, cpath),
                    "requestor": "assistant",
                }
            )
        msg = normalise.RawMessage(
            role=role,
            content=content,
            tool_calls=calls,
            tool_call_id=normalise.opt_field(m, "tool_call_id", (str,), record, path),
            name=normalise.opt_field(m, "name", (str,), record, path),
        )
        if role == "tool" and content and content.startswith(TOOL_ERROR_PREFIX):
            msg.error = content
        out.append(msg)
    return out


def _expected(task: dict[str, Any] | None, record: int) -> list[ExpectedAction] | None:
    if not task or task.get("actions") is None:
        return None
    return normalise.expected_actions(task["actions"], record, "info.task.actions",
                                      args_key="kwargs")


def parse_record(
    raw: Any, record: int, model: str | None, domain: str | None,
    reward_range: tuple[float, float] = (0.0, 1.0),
) -> tuple[Trajectory, list[ExpectedAction] | None]:
    rec = normalise.as_object(raw, record, "")
    task_id = normalise.id_field(rec, "task_id", record, required=True)
    trial = normalise.int32_field(rec, "trial", record)
    reward = normalise.reward_value(rec, "reward", record, required=True)
    info = normalise.opt_field(rec, "info", (dict,), record) or {}
    traj = normalise.field(rec, "traj", (list,), record)
    messages = _messages(traj, record)
    task = normalise.opt_field(info, "task", (dict,), record, "info")
    end_source = normalise.opt_field(info, "source", (str,), record, "info")
    meta = {
        "source_format": "tau_bench",
        "end_source": end_source,
        "reward_info": info.get("reward_info"),
        "user_cost": info.get("user_cost"),
    }
    if "error" in info:
        # run.py caught an exception: the harness failed, not the agent.
        outcome = normalise.error_outcome(meta, str(info.get("error")), reward)
        meta["traceback"] = info.get("traceback")
    else:
        outcome = normalise.outcome_fields(reward, None, record, reward_range)
    if task:
        meta["instruction"] = task.get("instruction")
        meta["user_id"] = task.get("user_id")
        meta["expected_outputs"] = task.get("outputs")
    traj_model = normalise.assemble(
        messages,
        record,
        source_id=f"{task_id}/{trial}",
        task_id=task_id,
        trial=trial,
        agent_model=model,
        domain=domain,
        termination="error" if outcome.get("outcome") == "error" else termination_from_source(
            end_source),
        meta=meta,
        **outcome,
    )
    return traj_model, _expected(task, record)


def _looks_like_episode(item: Any) -> bool:
    return isinstance(item, dict) and "traj" in item and "task_id" in item


class TauBenchImporter:
    name = "tau_bench"
    description = (
        "a JSON list of {task_id, trial, reward, info, traj} (tau-bench historical "
        "trajectories or run.py results)"
    )
    streaming = False

    def matches(self, doc: Any) -> bool:
        return isinstance(doc, list) and bool(doc) and _looks_like_episode(doc[0])

    def why_not(self, doc: Any) -> str:
        if not isinstance(doc, list):
            return "not a JSON list"
        if not doc:
            return "the list is empty"
        return "the first item has no 'traj' and 'task_id'"

    def _infer(self, src: Source, doc: list[Any], out: normalise.ParsedFile
               ) -> tuple[str | None, str | None]:
        model, domain = model_and_domain(src.stem_name)
        how_model = how_domain = "the file name <model>-<domain>.json"
        run = run_py_name(src.stem_name)
        if model is None and run is not None:
            model, how_model = run["model"], "the run.py file name"
            out.meta["run_py"] = run
        if domain is None:
            first = next((d for d in doc if isinstance(d, dict) and d.get("traj")), None)
            if first is not None and isinstance(first.get("traj"), list):
                domain = domain_from_policy(first["traj"])
                how_domain = "the policy in the first system message"
        if model is not None:
            out.notes.append(f"{src.name}: agent model {model!r} inferred from {how_model}")
        if domain is not None:
            out.notes.append(f"{src.name}: domain {domain!r} inferred from {how_domain}")
        if model is None or domain is None:
            missing = " and ".join(w for w, v in (("agent model", model), ("domain", domain))
                                   if v is None)
            out.notes.append(f"{src.name}: {missing} unknown (pass --agent-model / --domain)")
        return model, domain

    def parse(self, src: Source, doc: Any, sha256: str | None, ctx: ParseContext
              ) -> normalise.ParsedFile:
        if doc is None:
            doc, sha256 = read_document(src, ctx.limits, ctx.progress)
        if not isinstance(doc, list):
            raise UserInputError(
                f"{src.name}: expected a JSON list of tau-bench episodes, got {type(doc).__name__}"
            )
        if not doc:
            raise UserInputError(f"{src.name}: the list is empty; expected tau-bench episodes")
        out = normalise.ParsedFile(name=src.name, format=self.name, sha256=sha256 or "",
                         n_records=len(doc))
        model, domain = self._infer(src, doc, out)
        out.meta.update({"agent_model": model, "domain": domain})

        def records() -> Iterator[Trajectory]:
            for i, raw in enumerate(doc):
                try:
                    traj, expected = parse_record(raw, i, model, domain, ctx.reward_range)
                    if expected is not None:
                        out.add_expected(str(traj.task_id), expected, i)
                except RecordError as exc:
                    if not ctx.skip_invalid:
                        raise UserInputError(f"{src.name}: {exc}; nothing was imported") from None
                    out.skipped.append(normalise.Skipped(src.name, i, str(exc)))
                    continue
                doc[i] = None  # free the raw record once normalised
                yield traj

        out.records = records()
        return out


IMPORTER = TauBenchImporter()  # IMPORTERS (formats.py) names it
