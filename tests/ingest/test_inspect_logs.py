"""Inspect AI logs: a real Inspect task with a tool, run on Inspect's mock model
(`mockllm/model`), writes real `.eval` and `.json` logs; they are imported as trajectories."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trace_lib import store
from trace_lib.errors import UserInputError
from trace_lib.ingest import ingest_bytes, ingest_paths

pytest.importorskip("inspect_ai")

# Three samples: one answered right after a tool call, one answered wrong after a tool
# error (ToolError: the model sees it), one whose tool crashes (a sample error), two epochs.
TASK = r'''
import sys
from inspect_ai import Task, eval as inspect_eval
from inspect_ai.dataset import Sample
from inspect_ai.model import ModelOutput, ModelUsage, get_model
from inspect_ai.scorer import includes
from inspect_ai.solver import generate, use_tools
from inspect_ai.tool import ToolError, tool


@tool
def add():
    async def execute(x: int, y: int):
        """Add two integers.

        Args:
            x: the first
            y: the second
        """
        if x < 0:
            raise ToolError("negative numbers are not supported")
        if x > 100:
            raise RuntimeError("calculator crashed")
        return x + y
    return execute


def outputs():
    m = "mockllm/model"
    out = []
    for _ in range(2):  # two epochs, samples run in order (max_samples=1)
        out += [
            ModelOutput.for_tool_call(model=m, tool_name="add", tool_arguments={"x": 1, "y": 2}),
            ModelOutput.from_content(model=m, content="The answer is 3"),
            ModelOutput.for_tool_call(model=m, tool_name="add", tool_arguments={"x": -1, "y": 5}),
            ModelOutput.from_content(model=m, content="I could not add them"),
            ModelOutput.for_tool_call(model=m, tool_name="add", tool_arguments={"x": 101, "y": 1}),
        ]
    for o in out:  # explicit usage: the mock model would otherwise count tokens with tiktoken
        o.usage = ModelUsage(input_tokens=10, output_tokens=5, total_tokens=15)
    return out


task = Task(
    name="adder",
    dataset=[Sample(input="What is 1+2?", target="3", id="s1"),
             Sample(input="What is -1+5?", target="4", id="s2"),
             Sample(input="What is 101+1?", target="102", id="s3")],
    solver=[use_tools(add()), generate()],
    scorer=includes(),
)
for fmt in ("eval", "json"):
    inspect_eval(task, model=get_model("mockllm/model", custom_outputs=outputs()),
                 log_dir=sys.argv[1] + "/" + fmt, log_format=fmt, display="none",
                 max_samples=1, epochs=2, fail_on_error=False)
'''


@pytest.fixture(scope="module")
def inspect_logs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("inspect")
    script = out / "task.py"
    script.write_text(TASK)
    env = {**os.environ, "INSPECT_LOG_LEVEL": "warning", "OMP_NUM_THREADS": "1",
           "INSPECT_DISPLAY": "none"}
    run = subprocess.run([sys.executable, str(script), str(out)], capture_output=True, text=True,
                         timeout=300, env=env, cwd=out)
    assert run.returncode == 0, run.stderr[-3000:]
    logs = {fmt: next((out / fmt).glob(f"*.{fmt}")) for fmt in ("eval", "json")}
    return logs


def rows(db: Path, sql: str) -> list[tuple]:
    with store.connect(db, read_only=True) as con:
        return con.execute(sql).fetchall()


@pytest.mark.parametrize("fmt", ["eval", "json"])
def test_inspect_log_imports_one_trajectory_per_sample_and_epoch(
    inspect_logs: dict[str, Path], db_path: Path, fmt: str
) -> None:
    report = ingest_paths([inspect_logs[fmt]], db=db_path)
    assert report.formats == {str(inspect_logs[fmt]): "inspect"}
    assert (report.trajectories, report.successes, report.failures, report.errors) == (6, 2, 2, 2)
    got = rows(db_path, "SELECT task_id, trial, outcome, reward, agent_model, domain, termination "
                        "FROM trajectories ORDER BY task_id, trial")
    assert got == [
        ("s1", 1, "success", 1.0, "mockllm/model", "adder", "agent_stop"),
        ("s1", 2, "success", 1.0, "mockllm/model", "adder", "agent_stop"),
        ("s2", 1, "failure", 0.0, "mockllm/model", "adder", "agent_stop"),
        ("s2", 2, "failure", 0.0, "mockllm/model", "adder", "agent_stop"),
        ("s3", 1, "error", None, "mockllm/model", "adder", "error"),
        ("s3", 2, "error", None, "mockllm/model", "adder", "error"),
    ]
    # Messages with the tool call, its result, and the ToolError on the call it answers.
    msgs = rows(db_path, "SELECT m.role, m.content, m.name FROM messages m JOIN trajectories t "
                         "ON t.id = m.trajectory_id WHERE t.task_id = 's1' AND t.trial = 1 "
                         "ORDER BY m.idx")
    assert [m[0] for m in msgs] == ["user", "assistant", "tool", "assistant"]
    assert msgs[2][1:] == ("3", "add") and msgs[3][1] == "The answer is 3"
    calls = rows(db_path, "SELECT t.task_id, c.name, c.arguments::VARCHAR, c.error FROM "
                          "tool_calls c JOIN trajectories t ON t.id = c.trajectory_id "
                          "WHERE t.trial = 1 ORDER BY t.task_id")
    assert [(c[0], c[1], json.loads(c[2])) for c in calls] == [
        ("s1", "add", {"x": 1, "y": 2}), ("s2", "add", {"x": -1, "y": 5}),
        ("s3", "add", {"x": 101, "y": 1})]
    assert calls[1][3] == "negative numbers are not supported" and calls[0][3] is None
    meta = json.loads(rows(db_path, "SELECT meta FROM trajectories WHERE outcome = 'error' "
                                    "LIMIT 1")[0][0])
    assert "calculator crashed" in meta["harness_error"] and meta["task"] == "adder"
    # What each model call measured, on the assistant message it produced (issue 34): the
    # mock model's usage (10 in, 5 out) and its time.
    measured = rows(db_path, "SELECT m.role, m.meta FROM messages m JOIN trajectories t "
                             "ON t.id = m.trajectory_id WHERE t.task_id = 's1' AND t.trial = 1 "
                             "ORDER BY m.idx")
    assert [r[1] is not None for r in measured] == [False, True, False, True]
    for _, meta in measured[1::2]:
        got = json.loads(meta)
        assert (got["input_tokens"], got["output_tokens"]) == (10, 5)
        assert got["latency_s"] >= 0 and "cost" not in got  # the mock model prices nothing
    # The tool schema is the one the log says the model was offered (its ModelEvents), not
    # one inferred from the calls: the docstring's description and parameter texts survive.
    schema = rows(db_path, "SELECT schema, source FROM tool_schemas WHERE domain = 'adder'")
    assert len(schema) == 1 and schema[0][1] == "given"
    assert json.loads(schema[0][0]) == {"type": "function", "function": {
        "name": "add", "description": "Add two integers.",
        "parameters": {"type": "object", "properties": {
            "x": {"type": "integer", "description": "the first"},
            "y": {"type": "integer", "description": "the second"}},
            "required": ["x", "y"], "additionalProperties": False}}}
    assert not report.notes


def test_inspect_tool_schemas_follow_the_domain_override(
    inspect_logs: dict[str, Path], db_path: Path
) -> None:
    ingest_paths([inspect_logs["eval"]], db=db_path, domain="calculator")
    assert rows(db_path, "SELECT domain, name, source FROM tool_schemas") == [
        ("calculator", "add", "given")]


@pytest.mark.parametrize("fmt", ["eval", "json"])
def test_inspect_log_without_model_events_infers_schemas_and_says_so(
    inspect_logs: dict[str, Path], db_path: Path, tmp_path: Path, fmt: str
) -> None:
    # A log whose events were dropped (as some pipelines do to save space), written back by
    # Inspect's own writer: no tool definitions left, so they are inferred from the calls.
    from inspect_ai.log import read_eval_log, write_eval_log

    log = read_eval_log(str(inspect_logs[fmt]))
    for sample in log.samples or []:
        sample.events = []
        sample.events_data = None
    stripped = tmp_path / f"stripped.{fmt}"
    write_eval_log(log, str(stripped), format=fmt)
    report = ingest_paths([stripped], db=db_path)
    assert report.trajectories == 6
    assert any("no tool definitions" in n and "inferred from the calls" in n
               for n in report.notes), report.notes
    schema = rows(db_path, "SELECT schema, source FROM tool_schemas WHERE domain = 'adder'")
    assert schema[0][1] == "inferred"
    assert set(json.loads(schema[0][0])["function"]["parameters"]["properties"]) == {"x", "y"}


def test_inspect_log_upload_and_gzip_and_reimport(
    inspect_logs: dict[str, Path], db_path: Path, tmp_path: Path
) -> None:
    data = inspect_logs["eval"].read_bytes()
    first = ingest_bytes("run.eval", data, db=db_path)
    assert first.trajectories == 6
    packed = tmp_path / "run.eval.gz"
    packed.write_bytes(gzip.compress(data))
    again = ingest_paths([packed], db=db_path)
    assert (again.trajectories, again.duplicates) == (0, 6)


def test_broken_inspect_log_is_a_clear_error(tmp_path: Path, db_path: Path) -> None:
    bad = tmp_path / "broken.eval"
    bad.write_bytes(b"PK\x03\x04 not really a zip")
    with pytest.raises(UserInputError, match="broken.eval: not a readable Inspect log"):
        ingest_paths([bad], db=db_path)
    assert not db_path.exists()


@pytest.mark.parametrize("sample_ids", ["missing", "empty"])
def test_json_log_the_streaming_reader_cannot_walk_is_read_whole(
    inspect_logs: dict[str, Path], db_path: Path, tmp_path: Path, sample_ids: str
) -> None:
    # A writer other than Inspect's own (or an older one) may leave the header's sample id
    # list out or empty: `read_eval_log` reads every sample, the streaming reader none.
    from inspect_ai.log import read_eval_log, read_eval_log_samples

    doc = json.loads(inspect_logs["json"].read_text())
    if sample_ids == "missing":
        del doc["eval"]["dataset"]["sample_ids"]
    else:
        doc["eval"]["dataset"]["sample_ids"] = []
    log = tmp_path / f"no-ids-{sample_ids}.json"
    log.write_text(json.dumps(doc))
    assert len(read_eval_log(str(log)).samples) == 6
    try:
        assert not list(read_eval_log_samples(str(log), all_samples_required=False))
    except RuntimeError:
        pass  # no sample_ids at all: the streaming reader refuses the log
    report = ingest_paths([log], db=db_path)
    assert (report.trajectories, report.successes, report.failures, report.errors) == (6, 2, 2, 2)
    assert any("whole-log reader" in n for n in report.notes), report.notes
    # too large to read whole: a clear error, nothing imported
    from trace_lib.ingest.source import IngestLimits

    with pytest.raises(UserInputError, match="streaming reader found no samples.*record limit"):
        ingest_paths([log], db=tmp_path / "other.duckdb",
                     limits=IngestLimits(max_record_bytes=log.stat().st_size // 2))
    assert not (tmp_path / "other.duckdb").exists()


def test_a_dependency_warning_becomes_a_note_not_stderr(
    inspect_logs: dict[str, Path], db_path: Path, tmp_path: Path
) -> None:
    # METR's logs name a k8s sandbox: Inspect's reader logs a warning for a sandbox plugin
    # that is not installed. It belongs in the report, not on stderr (and not in --json).
    doc = json.loads(inspect_logs["json"].read_text())
    doc["eval"]["sandbox"] = {"type": "k8s", "config": {"values": "values.yaml"}}
    log = tmp_path / "k8s.json"
    log.write_text(json.dumps(doc))
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    out = subprocess.run([sys.executable, "-m", "trace_lib", "ingest", str(log), "--json",
                          "--db", str(db_path)], capture_output=True, text=True, timeout=300,
                         env=env)
    assert out.returncode == 0, out.stderr
    assert "Could not find sandbox" not in out.stderr
    notes = json.loads(out.stdout)["notes"]
    assert any(n.startswith("inspect_ai warned while reading: Could not find sandbox "
                            "environment plugin for type 'k8s'") for n in notes), notes


def test_captured_warnings_are_counted_and_ours_are_left_alone() -> None:
    import logging

    from trace_lib.ingest.third_party_warnings import third_party_warnings

    with third_party_warnings() as caught:
        for _ in range(3):
            logging.getLogger("somepkg.reader").warning("field %s is deprecated", "x")
        logging.getLogger("trace_lib.ingest").warning("our own message")
        logging.getLogger("somepkg").info("below the warning level")
    assert caught.notes() == ["somepkg warned while reading (3 times): field x is deprecated"]
