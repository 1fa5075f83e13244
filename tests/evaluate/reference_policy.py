"""A real OpenAI-compatible HTTP server on 127.0.0.1 that plays the target tasks' reference
actions: a policy whose outcome per task the test chooses, so evaluation and comparison
can be checked against known counts without a model.

For a task in `fail_ids` it answers at once with no tool call (every chosen task has a
write, so that fails on the task's own verdict); for any other task it makes the expected
calls one per turn, then a final reply. It keeps each request body for wire checks.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from trace_lib.evaluate.tasks import TaskSet


class ReferencePolicyServer:
    def __init__(self, task_set: TaskSet, fail_ids: set[str] | None = None,
                 model: str = "reference-policy") -> None:
        self.by_request = {t.request: t for t in task_set.tasks}
        self.fail_ids = set(fail_ids or ())
        self.model = model
        self.requests: list[dict[str, Any]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # keep test output clean
                pass

            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests.append(body)
                status, payload = outer.answer(body)
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def answer(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        if body.get("model") != self.model:
            return 404, {"error": {"message": f"The model `{body.get('model')}` does not exist."}}
        user = next(m["content"] for m in body["messages"] if m["role"] == "user")
        task = self.by_request[user]
        done = sum(1 for m in body["messages"] if m["role"] == "tool")
        plan = [] if task.task_id in self.fail_ids else task.expected_actions
        if done < len(plan):
            action = plan[done]
            message = {"role": "assistant", "content": None, "tool_calls": [{
                "id": f"call_{done}", "type": "function",
                "function": {"name": action["name"],
                             "arguments": json.dumps(action["arguments"])}}]}
            finish = "tool_calls"
        else:
            message = {"role": "assistant", "content": "All done <b>as asked</b>."}
            finish = "stop"
        return 200, {"id": "chatcmpl-ref", "object": "chat.completion", "model": self.model,
                     "choices": [{"index": 0, "message": message, "finish_reason": finish}]}

    def __enter__(self) -> ReferencePolicyServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def tasks_with_writes(task_set: TaskSet) -> list[str]:
    return [t.task_id for t in task_set.tasks if t.raw.expected_writes]


def tau2_results_file(path: Path, ts: TaskSet, passed: set[str],
                      payload: str = "<script>alert(1)</script>") -> Path:
    """A tau2-bench results file over the target tasks: the agent makes the expected calls
    on tasks in `passed` and only the first read elsewhere."""
    tasks = [{"id": t.task_id, "evaluation_criteria": {"actions": [
        {"action_id": f"{t.task_id}_{i}", "requestor": "assistant", **a}
        for i, a in enumerate(t.expected_actions)]}} for t in ts.tasks]
    sims = []
    for t in ts.tasks:
        calls = t.expected_actions if t.task_id in passed else t.expected_actions[:1]
        msgs = [{"role": "user", "content": t.request}]
        for i, c in enumerate(calls):
            args = dict(c["arguments"])
            if i == 0:
                args = {**args, "note": payload}
            msgs.append({"role": "assistant", "content": None, "tool_calls": [
                {"id": f"c{i}", "name": c["name"], "arguments": args,
                 "requestor": "assistant"}]})
            msgs.append({"role": "tool", "id": f"c{i}", "content": "{}"})
        msgs.append({"role": "assistant", "content": "done"})
        sims.append({"id": f"sim-{t.task_id}", "task_id": t.task_id, "trial": 0,
                     "termination_reason": "agent_stop", "messages": msgs,
                     "reward_info": {"reward": 1.0 if t.task_id in passed else 0.0}})
    doc = {"timestamp": "2025-01-01T00:00:00", "info": {
        "agent_info": {"implementation": "llm_agent", "llm": "gpt-test"},
        "user_info": {"llm": "gpt-user"},
        "environment_info": {"domain_name": "airline", "policy": "policy text"}},
        "tasks": tasks, "simulations": sims}
    path.write_text(json.dumps(doc))
    return path
