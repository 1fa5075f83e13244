"""`--json` is one JSON document on stdout, with the real verbs (issue 30, item 4).

`test_json_document.py` walks every `--json` verb through the real parser and `main` with a
stand-in function (the mechanism), and runs a real `train --json`. Here the verbs
themselves run, in one walk over a store the demo builds: whatever a verb or the stages
under it print, and whatever a child process writes to file descriptor 1, would land in
`capfd`'s stdout and break `json.loads`. The walk covers every `--json` verb that runs on a
CPU in seconds; each other verb is named with the test that runs it with `--json`, or why
it is not run, and the list must cover the parser (a new `--json` verb fails this test
until it is placed).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from trace_lib import cli

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_json_document import _json_verbs  # noqa: E402

# --json verbs run elsewhere for real, or not run here, and why.
ELSEWHERE = {
    "train": "tests/cli/test_json_document.py::test_train_json_is_one_document_although_"
             "the_trainer_prints (a real foreground run on tiny)",
    "moe-eval": "tests/compose/test_evaluate_and_sources.py::test_moe_eval_derives_its_turn_"
                "budget_from_the_environments (a real evaluation of a composed tiny model)",
    "gates": "trains a composed model's gates: minutes of rollouts",
    "compose": "builds a composed model from trained adapters",
    "route": "needs a composed model",
    "moe-merge": "needs trained adapters",
    "evaluate": "rolls a policy out on the target tasks (a served model)",
    "loop": "the whole loop: evaluation, labeling, training, composition",
    "demo adapters": "tests/cli/test_demo_adapters.py (a real tiny build started with "
                     "--background --json, then job wait --json)",
    "job submit": "starts a background job",
    "job status": "needs a job",
    "job cancel": "needs a running job",
    "job wait": "needs a job",
    "model prepare": "builds model weights",
    "env generate": "asks an LLM to write an environment",
    "env calibrate": "rolls a model out on an environment",
    "explore embed": "loads a sentence encoder",
    "explore semantic": "needs embeddings (explore embed)",
    "explore reindex": "rebuilds the full-text index of the whole store",
}


def run_json(capfd: pytest.CaptureFixture[str], *argv: str) -> Any:
    capfd.readouterr()
    code = cli.main([*argv, "--json"])
    out = capfd.readouterr()
    assert code == 0, (argv, out.err[-2000:])
    try:
        return json.loads(out.out)
    except json.JSONDecodeError as exc:
        raise AssertionError(f"{argv}: stdout is not one JSON document ({exc}):\n"
                             f"{out.out[:2000]}") from exc


def test_real_verbs_print_one_json_document(tmp_path: Path, capfd, monkeypatch) -> None:
    monkeypatch.setenv("TRACE_RUNS_DIR", str(tmp_path / "runs"))
    db = str(tmp_path / "t.duckdb")
    walked: set[str] = set()

    def verb(*argv: str) -> Any:
        words = [a for a in argv if not a.startswith("-")]
        name = " ".join(words[:2]) if " ".join(words[:2]) in all_verbs else words[0]
        walked.add(name)
        return run_json(capfd, *argv, "--db", db)

    all_verbs = {" ".join(p) for p, _ in _json_verbs(cli.build_parser())}
    built = verb("demo", "build", "--out", str(tmp_path / "demo"), "--n", "60")
    assert built
    records = tmp_path / "more.jsonl"
    records.write_text("".join(json.dumps({
        "id": f"r{i}", "task_id": f"t{i}", "domain": "shop", "agent_model": "m",
        "reward": float(i % 2), "messages": [
            {"role": "user", "content": "refund order 7"},
            {"role": "assistant", "content": "done"}]}) + "\n" for i in range(4)))
    assert verb("ingest", str(records))["trajectories"] == 4
    verb("stats")
    datasets = verb("datasets", "list")
    demo = next(d for d in datasets if d["name"] != "more.jsonl")
    for sub in ("overview", "stats", "signatures"):
        verb("explore", sub)
    listed = verb("explore", "list", "--outcome", "failure")
    rows = listed if isinstance(listed, list) else listed["trajectories"]
    verb("explore", "show", rows[0]["id"])
    verb("explore", "compare", rows[0]["id"], "--with", rows[1]["id"])
    verb("capabilities", "list")
    verb("label", "--labeler", "heuristic", "--runs", "2")
    verb("labels", "runs")
    verb("rank")
    verb("agreement")
    verb("review-queue", "--limit", "3")
    env = "airline/tool_calling_precision"
    verb("env", "list")
    verb("env", "sample", env)
    verb("env", "play", env, "--reference")
    verb("env", "validate", env, "--seeds", "3")  # fewer seeds than the determinism check's 5
    verb("env", "approve", env, "--force", "--note", "test")
    verb("env", "reject", env, "--note", "test")
    verb("job", "list")
    verb("model", "list")
    verb("loops")
    verb("store", "check")
    verb("store", "backup", str(tmp_path / "backup"))
    verb("store", "restore", str(tmp_path / "backup"))
    pair = verb("compare", f"{demo['name']}@scripted-careful", f"{demo['name']}@scripted-hasty")
    assert "floor" in pair
    verb("datasets", "delete", "more.jsonl", "--yes")
    assert verb("store", "compact")["bytes_after"] > 0
    assert not walked & set(ELSEWHERE)
    assert walked | set(ELSEWHERE) == all_verbs, sorted(all_verbs - walked - set(ELSEWHERE))
