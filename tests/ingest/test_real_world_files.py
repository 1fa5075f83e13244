"""Files shaped like the ones users' harnesses write (issue 10's faithfulness list).

Each test builds a file with the shape of a real third-party file (tau-bench `run.py`
output, a telecom tau2 results file, SWE-agent 0.x/1.x `.traj`, an old SWE-bench report)
and checks what lands in the store and in the views that read it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trace_lib import store
from trace_lib.errors import UserInputError
from trace_lib.ingest import ingest_bytes, ingest_paths, store_stats

# ----------------------------------------------------------------------------- tau2


def tau2_message(role: str, content: str | None = None, calls: list | None = None,
                 **extra) -> dict:
    m = {"role": role, "content": content, "turn_idx": None, "timestamp": "2025-06-01T00:00:00"}
    if calls is not None:
        m["tool_calls"] = calls
    m.update(extra)
    return m


def tau2_call(cid: str, name: str, requestor: str, **args) -> dict:
    return {"id": cid, "name": name, "arguments": args, "requestor": requestor}


def telecom_simulation(sid: str, task: str, *, roaming: bool, reward: float | None,
                       termination: str = "user_stop") -> dict:
    """A telecom run: the agent looks the customer up, the user toggles roaming (or not)."""
    msgs = [
        tau2_message("user", "My phone has no data abroad."),
        tau2_message("assistant", None, [tau2_call("c1", "get_customer_by_phone", "assistant",
                                                   phone_number="555-123-2002")]),
        tau2_message("tool", '{"customer_id": "C1"}', id="c1", requestor="assistant",
                     error=False),
        tau2_message("assistant", "Please turn data roaming on."),
    ]
    if roaming:
        msgs += [
            tau2_message("user", None, [tau2_call("u1", "toggle_roaming", "user")]),
            tau2_message("tool", "Data roaming is now ON", id="u1", requestor="user",
                         error=False),
        ]
    msgs.append(tau2_message("user", "Thanks ###STOP###"))
    return {
        "id": sid, "task_id": task, "trial": 0, "seed": 1, "termination_reason": termination,
        "duration": 1.0, "agent_cost": 0.0, "user_cost": 0.0, "messages": msgs,
        "reward_info": None if reward is None else {"reward": reward, "info": None},
    }


def telecom_file(sims: list[dict]) -> dict:
    return {
        "timestamp": "2025-06-01T00:00:00",
        "info": {
            "agent_info": {"implementation": "llm_agent", "llm": "gpt-4.1"},
            "user_info": {"implementation": "user_simulator", "llm": "gpt-4.1"},
            "environment_info": {"domain_name": "telecom", "policy": "# Telecom agent policy"},
        },
        "tasks": [{
            "id": "[mobile_data_issue]roaming",
            "evaluation_criteria": {"actions": [
                {"action_id": "a0", "requestor": "assistant", "name": "get_customer_by_phone",
                 "arguments": {"phone_number": "555-123-2002"}, "info": None},
                {"action_id": "a1", "requestor": "user", "name": "toggle_roaming",
                 "arguments": {}, "info": None},
            ]},
        }],
        "simulations": sims,
    }


def test_tau2_user_side_actions_keep_their_requestor(tmp_path: Path, db_path: Path) -> None:
    task = "[mobile_data_issue]roaming"
    path = tmp_path / "telecom_default.json"
    path.write_text(json.dumps(telecom_file([
        telecom_simulation("s-ok", task, roaming=True, reward=1.0),
        telecom_simulation("s-user-miss", task, roaming=False, reward=0.0),
    ])))
    report = ingest_paths([path], db=db_path)
    assert (report.successes, report.failures) == (1, 1)
    with store.connect(db_path, read_only=True) as con:
        rows = con.execute("SELECT name, requestor FROM expected_actions ORDER BY idx").fetchall()
        assert rows == [("get_customer_by_phone", "assistant"), ("toggle_roaming", "user")]
        ids = dict(con.execute("SELECT source_id, id FROM trajectories").fetchall())

        from trace_lib.explore import call_alignment, clusters, transcript_loading

        # The success shows no deviation: the user's action is compared with the user's call.
        ok = transcript_loading.load_transcript(con, ids["s-ok"])
        assert [r.status for r in call_alignment.expected_vs_actual(ok)] == ["same", "same (user)"]
        # The failure's signature blames the user side, not a missing agent action.
        miss = transcript_loading.load_transcript(con, ids["s-user-miss"])
        assert [r.status for r in call_alignment.expected_vs_actual(miss)] == ["same", "only left (user)"]
        sig = clusters.failure_signatures(con)
        assert list(sig.deviation) == ["missing (user): toggle_roaming"]

        # The heuristic labeler's view: the user's action is not among the agent's.
        from trace_lib.trajectories import load_transcript

        t = load_transcript(con, ids["s-user-miss"])
        assert [c.name for c in t.expected_agent] == ["get_customer_by_phone"]
        assert [c.name for c in t.expected_user] == ["toggle_roaming"]


def test_tau2_infrastructure_errors_and_null_rewards_are_error_outcomes(
    tmp_path: Path, db_path: Path
) -> None:
    task = "[mobile_data_issue]roaming"
    path = tmp_path / "telecom_errors.json"
    path.write_text(json.dumps(telecom_file([
        telecom_simulation("s1", task, roaming=True, reward=1.0),
        telecom_simulation("s2", task, roaming=False, reward=None),
        telecom_simulation("s3", task, roaming=False, reward=0.0, termination="user_error"),
    ])))
    report = ingest_paths([path], db=db_path)
    assert (report.trajectories, report.successes, report.failures, report.errors) == (3, 1, 0, 2)
    with store.connect(db_path, read_only=True) as con:
        rows = con.execute("SELECT source_id, outcome, success, reward FROM trajectories "
                           "ORDER BY source_id").fetchall()
    assert rows == [("s1", "success", True, 1.0), ("s2", "error", None, None),
                    ("s3", "error", None, None)]


def test_bare_list_of_tau2_simulations_is_tau2(tmp_path: Path, db_path: Path) -> None:
    sims = [telecom_simulation(f"s{i}", "t", roaming=True, reward=float(i % 2)) for i in range(3)]
    path = tmp_path / "simulations.json"
    path.write_text(json.dumps(sims))
    report = ingest_paths([path], db=db_path, domain="telecom")
    assert report.formats == {str(path): "tau2"}
    assert (report.successes, report.failures) == (1, 2)
    assert any("bare list of tau2 simulations" in n and "without expected actions" in n
               for n in report.notes)
    with store.connect(db_path, read_only=True) as con:
        assert con.execute("SELECT DISTINCT domain FROM trajectories").fetchall() == [("telecom",)]


def test_detection_error_says_what_each_format_tried(tmp_path: Path, db_path: Path) -> None:
    path = tmp_path / "odd.json"
    path.write_text(json.dumps([{"conversation": [], "score": 1}]))
    with pytest.raises(UserInputError) as err:
        ingest_paths([path], db=db_path)
    text = str(err.value)
    assert "a list of 1 objects with keys ['conversation', 'score']" in text
    assert "tau2 (expects" in text and "the first item is not a simulation" in text
    assert "openai_jsonl (expects" in text and "the first record has no 'messages'" in text
    assert "tau_bench (expects" in text and "no 'traj' and 'task_id'" in text


# ------------------------------------------------------------------------ tau-bench


def run_py_episode(task_id: int, reward: float, *, trial: int = 0, domain: str = "Retail") -> dict:
    return {
        "task_id": task_id,
        "reward": reward,
        "info": {"task": {"user_id": "u1", "actions": [
            {"name": "get_user_details", "kwargs": {"user_id": "u1"}}], "instruction": "x",
            "outputs": []}, "source": "user", "user_cost": 0.0,
            "reward_info": {"reward": reward, "info": {}, "actions": []}},
        "traj": [
            {"role": "system", "content": f"# {domain} agent policy\n\nAs a {domain.lower()} "
                                          "agent, you can help users..."},
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello", "tool_calls": None},
        ],
        "trial": trial,
    }


def crashed_episode(task_id: int) -> dict:
    # What run.py writes when the agent loop raises (litellm, parsing, token limit...).
    return {"task_id": task_id, "reward": 0.0,
            "info": {"error": "litellm.APIConnectionError: Connection reset by peer",
                     "traceback": "Traceback (most recent call last):\n  ..."},
            "traj": [], "trial": 0}


RUN_PY_NAME = ("tool-calling-claude-3-5-sonnet-20241022-0.0_range_0--1_user-gpt-4o-llm_"
               "1209151235.json")


def test_run_py_crashed_runs_are_errors_not_failures(tmp_path: Path, db_path: Path) -> None:
    path = tmp_path / RUN_PY_NAME
    path.write_text(json.dumps([run_py_episode(0, 1.0), run_py_episode(1, 0.0),
                                crashed_episode(2)]))
    report = ingest_paths([path], db=db_path)
    assert (report.successes, report.failures, report.errors) == (1, 1, 1)
    assert report.to_json()["errors"] == 1 and report.datasets[0]["errors"] == 1
    with store.connect(db_path, read_only=True) as con:
        row = con.execute("SELECT outcome, success, reward, termination, meta->>'harness_error' "
                          "FROM trajectories WHERE task_id = '2'").fetchone()
        assert row[:4] == ("error", None, None, "error")
        assert "Connection reset by peer" in row[4]
        from trace_lib.explore import queries as q

        summary = q.outcome_summary(con).iloc[0]
        assert (summary.n_success, summary.n_failure, summary.n_unknown, summary.n_error) == (
            1, 1, 0, 1)
        assert summary.success_rate == 0.5  # the crash is not in the denominator
        only = q.list_trajectories(con, q.TrajectoryFilter(outcomes=("error",)))
        assert list(only.task_id) == ["2"] and list(only.outcome) == ["error"]
        opts = q.filter_options(con)
        assert ("outcome", "error") in set(zip(opts.field, opts.value, strict=True))
        assert q.success_by_domain_agent(con).iloc[0].n_known == 2
    stats = store_stats(db_path)
    assert (stats["successes"], stats["failures"], stats["unknown"], stats["errors"]) == (1, 1, 0, 1)


def test_run_py_names_and_policy_infer_model_and_domain(tmp_path: Path, db_path: Path) -> None:
    path = tmp_path / RUN_PY_NAME
    path.write_text(json.dumps([run_py_episode(0, 1.0, domain="Airline")]))
    report = ingest_paths([path], db=db_path)
    notes = " | ".join(report.notes)
    assert "agent model 'claude-3-5-sonnet-20241022' inferred from the run.py file name" in notes
    assert "domain 'airline' inferred from the policy in the first system message" in notes
    with store.connect(db_path, read_only=True) as con:
        assert con.execute("SELECT agent_model, domain FROM trajectories").fetchone() == (
            "claude-3-5-sonnet-20241022", "airline")


def test_domain_and_model_overrides(tmp_path: Path, db_path: Path) -> None:
    path = tmp_path / "results.json"
    path.write_text(json.dumps([run_py_episode(0, 1.0), run_py_episode(1, 0.0)]))
    report = ingest_bytes(path.name, path.read_bytes(), db=db_path, domain="shop",
                          agent_model="my-agent-v2")
    assert report.trajectories == 2
    with store.connect(db_path, read_only=True) as con:
        assert con.execute("SELECT DISTINCT agent_model, domain FROM trajectories").fetchall() == [
            ("my-agent-v2", "shop")]


# ------------------------------------------------------------------------- SWE-agent


def swe_v0_traj() -> dict:
    """SWE-agent 0.x: thought-action history, no message_type, observations as user turns."""
    return {
        "environment": "swe_main",
        "trajectory": [
            {"action": "ls\n", "observation": "setup.py\nsrc\n", "response": "...",
             "thought": "Let me look around.", "state": "{}"},
            {"action": "submit\n", "observation": "diff --git a/x b/x", "response": "...",
             "thought": "Done.", "state": "{}"},
        ],
        "history": [
            {"role": "system", "content": "SETTING: You are an autonomous programmer",
             "agent": "primary"},
            {"role": "user", "content": "We're currently solving the following issue...",
             "agent": "primary"},
            {"role": "assistant", "content": "Let me look around.\n```\nls\n```",
             "thought": "Let me look around.", "action": "ls\n", "agent": "primary"},
            {"role": "user", "content": "setup.py\nsrc\n(Open file: n/a)\nbash-$",
             "agent": "primary"},
            {"role": "assistant", "content": "Done.\n```\nsubmit\n```", "thought": "Done.",
             "action": "submit\n", "agent": "primary"},
            {"role": "user", "content": "diff --git a/x b/x", "agent": "primary"},
        ],
        "info": {"exit_status": "submitted", "submission": "diff --git a/x b/x",
                 "model_stats": {"total_cost": 0.5}},
    }


def swe_v1_traj() -> dict:
    """SWE-agent 1.x thought-action: history entries carry message_type."""
    return {
        "trajectory": [{"action": "ls", "observation": "a.py", "response": "r", "thought": "t"}],
        "history": [
            {"role": "system", "content": "You are a helpful assistant", "agent": "main",
             "message_type": "system_prompt"},
            {"role": "user", "content": "<uploaded_files>", "agent": "main",
             "message_type": "observation"},
            {"role": "assistant", "content": "t\n```\nls\n```", "thought": "t", "action": "ls",
             "agent": "main", "message_type": "action"},
            {"role": "user", "content": "OBSERVATION:\na.py", "agent": "main",
             "message_type": "observation"},
        ],
        "info": {"exit_status": "exit_cost"},
        "replay_config": json.dumps({"agent": {"model": {"name": "gpt-4o"}}}),
    }


@pytest.mark.parametrize(("make", "generation"), [(swe_v0_traj, "0.x"), (swe_v1_traj, "1.x")])
def test_swe_agent_observations_become_tool_messages(
    tmp_path: Path, db_path: Path, make, generation: str
) -> None:
    path = tmp_path / "astropy__astropy-12907.traj"
    path.write_text(json.dumps(make()))
    ingest_paths([path], db=db_path)
    with store.connect(db_path, read_only=True) as con:
        roles = [r[0] for r in con.execute("SELECT role FROM messages ORDER BY idx").fetchall()]
        meta = json.loads(con.execute("SELECT meta FROM trajectories").fetchone()[0])
        answered = con.execute(
            "SELECT m.name, c.name FROM messages m JOIN tool_calls c ON c.trajectory_id = "
            "m.trajectory_id AND c.call_id = m.tool_call_id WHERE m.role = 'tool'").fetchall()
    # The first user turn is the task; every command's output answers that command.
    assert roles[:2] == ["system", "user"] and roles.count("user") == 1
    assert roles.count("tool") == roles.count("assistant")
    assert all(m == c for m, c in answered) and answered
    assert meta["swe_agent_format"] == generation
    assert set(meta["message_agents"]) == ({"primary"} if generation == "0.x" else {"main"})


def test_old_swe_bench_report_as_success_file(tmp_path: Path, db_path: Path) -> None:
    for name in ("a__a-1", "b__b-2", "c__c-3"):
        (tmp_path / f"{name}.traj").write_text(json.dumps(swe_v0_traj()))
    report_file = tmp_path / "report.json"
    report_file.write_text(json.dumps({
        "no_generation": ["c__c-3"], "generated": ["a__a-1", "b__b-2"], "with_logs": ["a__a-1",
        "b__b-2"], "install_fail": [], "reset_failed": [], "no_apply": [], "applied": ["a__a-1",
        "b__b-2"], "test_errored": [], "test_timeout": [], "resolved": ["a__a-1"]}))
    report = ingest_paths(sorted(tmp_path.glob("*.traj")), db=db_path, success_file=report_file)
    assert (report.successes, report.failures, report.unknown) == (1, 2, 0)


# ------------------------------------------------------------------ duplicate source ids


def test_duplicate_ids_with_different_content_are_reported(tmp_path: Path, db_path: Path) -> None:
    def rec(i: str, text: str) -> str:
        return json.dumps({"id": i, "reward": 1.0, "messages": [
            {"role": "user", "content": text}, {"role": "assistant", "content": "ok"}]})

    path = tmp_path / "two_runs.jsonl"
    path.write_text("\n".join([rec("a", "x"), rec("b", "y"), rec("a", "z"), rec("b", "y")]) + "\n")
    report = ingest_paths([path], db=db_path)
    assert (report.trajectories, report.duplicates) == (3, 1)  # b twice, identical: a duplicate
    assert len(report.warnings) == 1
    assert "1 source id(s) appear more than once with different content" in report.warnings[0]
    assert "'a'" in report.warnings[0] and "'b'" not in report.warnings[0]
    assert "warning:" in report.summary()


# ------------------------------------------------------------- error outcomes downstream


def test_error_outcome_is_consistent_and_left_out_of_rankings(
    tmp_path: Path, db_path: Path
) -> None:
    from trace_lib.data_model import Trajectory

    with pytest.raises(ValueError, match="outcome 'error'"):
        Trajectory(messages=[], outcome="error", success=False)
    with pytest.raises(ValueError, match="disagrees"):
        Trajectory(messages=[], outcome="success", success=False)
    assert Trajectory(messages=[], reward=None).outcome == "unknown"

    path = tmp_path / RUN_PY_NAME
    path.write_text(json.dumps([run_py_episode(0, 1.0), run_py_episode(1, 0.0),
                                crashed_episode(2)]))
    ingest_paths([path], db=db_path)
    from trace_lib.diagnose.capability_curation import ensure_builtin
    from trace_lib.diagnose.ranking import rank

    with store.connect(db_path) as con:
        ensure_builtin(con)
        con.execute("INSERT INTO label_runs (id, labeler, finished_at) "
                    "VALUES ('r1', 'test', current_timestamp)")
        # Every trajectory, the crashed one included, is labelled "lacking".
        con.execute("INSERT INTO labels (run_id, trajectory_id, capability, value) "
                    "SELECT 'r1', id, 'precondition_verification', 'lacking' FROM trajectories")
    pv = {r.capability: r for r in rank(db_path).rows}["precondition_verification"]
    assert (pv.runs[0].lf, pv.runs[0].lp) == (1, 1)  # the crash counts on neither side
