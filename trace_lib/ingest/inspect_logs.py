"""Inspect AI evaluation logs (`.eval` archives and `.json` logs): one sample = one trajectory.

Design decisions
- Read through Inspect's own reader (`inspect_ai.log.read_eval_log` for the header,
  `read_eval_log_samples` for the samples, one at a time), never a hand-written parser of
  its format: the format is versioned by Inspect and its reader follows it. Samples are
  streamed, so a large log costs one sample of memory at a time. Message attachments are
  resolved.
- Tool schemas come from the log: every `ModelEvent` records the tools offered to the
  model (`tools`: name, description, JSON-schema parameters), so they are stored as given
  schemas (OpenAI function-tool shape) under the task's domain, first definition of a name
  wins. Reading them means reading each sample's events (one sample at a time still); a
  log without model events (written with events stripped) falls back to schemas inferred
  from the calls, and the import's notes say so.
- What Inspect measured of a model call goes on the assistant message it produced
  (`Message.meta`): the `ModelEvent`'s usage (input and output tokens, `total_cost` when
  the provider priced it) and its `output.time` (else the event's `working_time`) as the
  latency. An event is matched to its message by the output message's id; a log whose
  ids do not match (an older writer) pairs events and assistant messages in order when
  their counts agree, and leaves them unmeasured otherwise.
- Messages map one to one: system/user/assistant/tool. An assistant's `tool_calls`
  (`function`, `arguments`, `id`) become ToolCalls; a tool message answers by
  `tool_call_id`, and its `error` (Inspect's ToolCallError) becomes the call's error text.
  A call Inspect could not parse keeps the raw text under `_unparsed` (`parse_error`).
- Outcome: the first score of the sample (the task's first scorer), converted with
  Inspect's `value_to_float` (C=1, P=0.5, I=0, numbers as they are): reward, and success =
  reward at the top of the reward range. A sample with an `error` (the model API or the
  sandbox failed) is outcome `error`; a sample without a score is `unknown`.
- Ids: task_id = the sample id, trial = the epoch, source_id = `<sample id>/<epoch>`,
  agent_model = the log's model, domain = the task name (tool schemas are filed under it),
  `meta` keeps the task, run id, scorer, explanation and the sample's limit.
- Termination: the sample hit a limit (`limit.type`: message, token, time, ...) ->
  max_steps; an error -> error; otherwise inferred from the last message.
- A `.json` log from which the streaming reader yields nothing (it walks the header's
  `sample_ids`, which writers other than Inspect's own may leave out or empty) is read
  again with the whole-log reader, bounded by the record limit
  (`IngestLimits.max_record_bytes`), and the import's notes say which reader read it.
- Inspect's reader needs a file: uploaded bytes and `.gz` logs are written to a temporary
  file first (removed when the import ends).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from trace_lib.data_model import ToolSchema, Trajectory
from trace_lib.errors import UserInputError
from trace_lib.ingest.importer import ParseContext
from trace_lib.ingest.normalise import (
    ParsedFile,
    RawMessage,
    Skipped,
    assemble,
    error_outcome,
    infer_termination,
    message_meta,
    outcome_fields,
    parse_arguments,
)
from trace_lib.ingest.source import RecordError, Source, human_size

_ROLES = {"system", "user", "assistant", "tool"}


@contextlib.contextmanager
def _local_file(src: Source) -> Iterator[Path]:
    """A plain file holding the log's bytes (Inspect's reader takes a path)."""
    if src.path is not None and not src.compressed:
        yield src.path
        return
    fd, name = tempfile.mkstemp(suffix=Path(src.stem_name).suffix or ".eval")
    try:
        with os.fdopen(fd, "wb") as fh:
            for chunk in src.chunks():
                fh.write(chunk)
        yield Path(name)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name)


def _call_meta(event: Any) -> dict[str, int | float] | None:
    """A ModelEvent's usage and time as a message's `meta`."""
    output = getattr(event, "output", None)
    usage = getattr(output, "usage", None)
    return message_meta(input_tokens=getattr(usage, "input_tokens", None),
                        output_tokens=getattr(usage, "output_tokens", None),
                        cost=getattr(usage, "total_cost", None),
                        latency_s=getattr(output, "time", None)
                        or getattr(event, "working_time", None))


def _measured(sample: Any) -> list[dict[str, int | float] | None]:
    """Per message of the sample, what its model call measured (assistant messages only;
    see the module docstring for the matching)."""
    events = [e for e in getattr(sample, "events", None) or []
              if getattr(e, "event", None) == "model" and getattr(e, "output", None)]
    by_id: dict[str, dict[str, int | float] | None] = {}
    for e in events:
        choices = getattr(e.output, "choices", None) or []
        msg_id = getattr(choices[0].message, "id", None) if choices else None
        if msg_id:
            by_id[msg_id] = _call_meta(e)
    assistants = [i for i, m in enumerate(sample.messages)
                  if getattr(m, "role", None) == "assistant"]
    out: list[dict[str, int | float] | None] = [None] * len(sample.messages)
    matched = [i for i in assistants if getattr(sample.messages[i], "id", None) in by_id]
    if matched:
        for i in matched:
            out[i] = by_id[sample.messages[i].id]
    elif len(events) == len(assistants):
        for i, e in zip(assistants, events, strict=True):
            out[i] = _call_meta(e)
    return out


def _messages(sample: Any, record: int) -> list[RawMessage]:
    out: list[RawMessage] = []
    measured = _measured(sample)
    for i, m in enumerate(sample.messages):
        role = getattr(m, "role", None)
        if role not in _ROLES:
            raise RecordError(record, f"messages[{i}].role",
                              f"expected one of system/user/assistant/tool, got {role!r}")
        text = m.text if isinstance(m.content, list) else m.content
        if role == "tool":
            err = getattr(m, "error", None)
            out.append(RawMessage(
                role="tool", content=text, tool_call_id=getattr(m, "tool_call_id", None),
                name=getattr(m, "function", None),
                error=(err.message or err.type) if err is not None else None,
            ))
            continue
        calls = []
        for j, tc in enumerate(getattr(m, "tool_calls", None) or []):
            args = tc.arguments
            if getattr(tc, "parse_error", None):
                args = {"_unparsed": str(tc.parse_error)} if not args else args
            calls.append({
                "name": tc.function,
                "arguments": parse_arguments(args, record, f"messages[{i}].tool_calls[{j}]"),
                "call_id": tc.id,
                "requestor": "assistant",
            })
        out.append(RawMessage(role=role, content=text, tool_calls=calls, meta=measured[i]))
    return out


def _score(sample: Any) -> tuple[float | None, dict[str, Any]]:
    from inspect_ai.scorer import value_to_float

    if not sample.scores:
        return None, {}
    name, score = next(iter(sample.scores.items()))
    info = {"scorer": name, "score_value": score.value, "answer": score.answer,
            "explanation": score.explanation}
    if isinstance(score.value, dict | list):
        return None, info  # several metrics in one score: no single reward
    return float(value_to_float()(score.value)), info


def offered_tools(sample: Any) -> list[Any]:
    """The tools the model was offered in this sample (Inspect `ToolInfo`s, by name, in the
    order first offered), read from its model events."""
    seen: dict[str, Any] = {}
    for event in getattr(sample, "events", None) or []:
        if getattr(event, "event", None) == "model":
            for info in event.tools or []:
                seen.setdefault(info.name, info)
    return list(seen.values())


def tool_schema(info: Any, domain: str) -> ToolSchema:
    """An Inspect `ToolInfo` as an OpenAI function tool (what `tool_schemas` stores)."""
    function: dict[str, Any] = {"name": info.name, "description": info.description,
                                "parameters": info.parameters.model_dump(exclude_none=True)}
    return ToolSchema(domain=domain, name=info.name,
                      schema={"type": "function", "function": function}, source="given")


def parse_sample(sample: Any, record: int, header: dict[str, Any], ctx: ParseContext
                 ) -> Trajectory:
    messages = _messages(sample, record)
    reward, score_info = _score(sample)
    limit = getattr(sample, "limit", None)
    meta: dict[str, Any] = {
        "source_format": "inspect",
        "task": header["task"],
        "run_id": header["run_id"],
        "eval_id": header["eval_id"],
        "sample_uuid": getattr(sample, "uuid", None),
        "limit": getattr(limit, "type", None),
        **score_info,
    }
    if sample.error is not None:
        outcome = error_outcome(meta, sample.error.message, reward)
        termination = "error"
    else:
        outcome = outcome_fields(reward, None, record, ctx.reward_range, "scores")
        termination = "max_steps" if limit is not None else infer_termination(messages)
    return assemble(
        messages,
        record,
        source_id=f"{sample.id}/{sample.epoch}",
        task_id=str(sample.id),
        trial=sample.epoch,
        agent_model=header["model"],
        domain=header["task"],
        termination=termination,
        meta=meta,
        **outcome,
    )


class InspectImporter:
    name = "inspect"
    description = "an Inspect AI evaluation log (.eval archive, or .json with eval/samples)"
    streaming = True

    def matches(self, doc: Any) -> bool:
        return isinstance(doc, dict) and "eval" in doc and "version" in doc and "status" in doc

    def why_not(self, doc: Any) -> str:
        if not isinstance(doc, dict):
            return "not a JSON object"
        missing = [k for k in ("eval", "version", "status") if k not in doc]
        return f"no {', '.join(repr(k) for k in missing)} key(s)"

    def parse(self, src: Source, doc: Any, sha256: str | None, ctx: ParseContext) -> ParsedFile:
        from inspect_ai.log import read_eval_log

        out = ParsedFile(name=src.name, format=self.name, sha256=sha256 or "")
        stack = contextlib.ExitStack()
        path = stack.enter_context(_local_file(src))
        try:
            log = read_eval_log(str(path), header_only=True)
        except Exception as exc:  # Inspect raises many types for a file it cannot read
            stack.close()
            raise UserInputError(
                f"{src.name}: not a readable Inspect log ({type(exc).__name__}: "
                f"{str(exc)[:300]}); expected an .eval or .json log written by inspect_ai"
            ) from None
        header = {"task": log.eval.task, "model": log.eval.model, "run_id": log.eval.run_id,
                  "eval_id": getattr(log.eval, "eval_id", None)}
        out.meta.update(header | {"status": log.status})
        if log.status != "success":
            out.notes.append(f"{src.name}: the Inspect log's status is {log.status!r}; "
                             f"samples that did not finish are imported as they are")

        domain = ctx.domain or header["task"]
        given: set[str] = set()
        calls = [0]  # tool calls seen: whether a missing definition is worth a note

        def take_tools(sample: Any) -> None:
            for info in offered_tools(sample):
                if info.name not in given:
                    given.add(info.name)
                    out.given_schemas.append(tool_schema(info, domain))

        def streamed() -> Iterator[Any]:
            """Inspect's streaming reader, or, for a `.json` log it reads nothing from, the
            whole-log reader (see `_samples`)."""
            samples, why = _first_samples(path)
            if samples is not None:
                yield from samples
                return
            if path.suffix != ".json":
                if why:
                    raise why
                return
            size = path.stat().st_size
            if size > ctx.limits.max_record_bytes:
                raise UserInputError(
                    f"{src.name}: Inspect's streaming reader found no samples "
                    f"({_reason(why)}) and the log ({human_size(size)}) is over the "
                    f"{human_size(ctx.limits.max_record_bytes)} record limit for reading it "
                    "whole (IngestLimits.max_record_bytes); nothing was imported")
            full = read_eval_log(str(path), resolve_attachments=True)
            out.notes.append(
                f"{src.name}: read with Inspect's whole-log reader: the streaming reader "
                f"found no samples ({_reason(why)})")
            yield from full.samples or []

        def records() -> Iterator[Trajectory]:
            with stack:
                samples = streamed()
                i = -1
                try:
                    for i, sample in enumerate(samples):
                        out.n_records += 1
                        take_tools(sample)
                        try:
                            traj = parse_sample(sample, i, header, ctx)
                            calls[0] += traj.n_tool_calls
                            yield traj
                        except RecordError as exc:
                            if not ctx.skip_invalid:
                                raise UserInputError(
                                    f"{src.name}: sample {sample.id} epoch {sample.epoch}: "
                                    f"{exc}; nothing was imported") from None
                            out.skipped.append(Skipped(src.name, i, str(exc)))
                except (UserInputError, GeneratorExit):
                    raise
                except Exception as exc:
                    raise UserInputError(
                        f"{src.name}: record {i + 1}: Inspect could not read the sample "
                        f"({type(exc).__name__}: {str(exc)[:300]})"
                    ) from None
            if out.n_records == 0:
                raise UserInputError(f"{src.name}: the Inspect log holds no samples")
            if calls[0] and not given:
                out.notes.append(
                    f"{src.name}: the log records no tool definitions (no model events); "
                    f"tool schemas are inferred from the calls")

        out.records = records()
        return out


def _first_samples(path: Path) -> tuple[Iterator[Any] | None, Exception | None]:
    """Inspect's streaming reader (`read_eval_log_samples`, one sample at a time), once it
    has produced a sample; (None, why) when it produced none. It walks the header's
    `eval.dataset.sample_ids` x epochs, so a log whose header lists no sample ids (some
    writers other than Inspect's own leave them out or empty) streams nothing although its
    `samples` are all there: the caller then reads the log whole."""
    from inspect_ai.log import read_eval_log_samples

    samples = read_eval_log_samples(
        str(path), all_samples_required=False, resolve_attachments=True,
        exclude_fields={"store", "attachments"},
    )
    try:
        first = next(samples)
    except StopIteration:
        return None, None
    except Exception as exc:  # noqa: BLE001 - Inspect raises many types; the caller decides
        return None, exc
    return itertools.chain([first], samples), None


def _reason(exc: Exception | None) -> str:
    return "it yielded none" if exc is None else f"{type(exc).__name__}: {str(exc)[:200]}"


IMPORTER = InspectImporter()  # IMPORTERS (formats.py) names it
