"""Target task sets: a domain's own tasks as Environments whose reward is the task's verdict.

    ts = load_task_set("airline", n=5)
    env = ts.environment(ts.tasks[0], tools="all"); env.reset(0); env.step({...})

Design decisions
- The target tasks are the demo's tasks, not a new set: the domain database for seed S
  at its default size, and `generate_tasks(db, DEMO_TASKS, seed=S)`: the tasks the
  scripted agents play to make `data/demo/airline_demo.jsonl`. So task ids
  (`airline_0_000`, ...) match the demo dataset's, and an evaluation pairs with it.
  `--tasks N` takes the first N of that list (the generator draws in order, so the first N
  are the same whatever the total; a test holds it).
- The reward is the task's own code verdict (`tasks.score`: final database hash and every
  expected write made with exactly its arguments), computed on the calls that did not
  error, exactly as the scripted agent's trajectories were scored. No partial credit: a
  target task is passed or not, as on tau2-bench. Reads are free there too, so on a task
  whose right outcome is a refusal (no expected write: 11 of the 50 airline tasks) a policy
  that does nothing passes; every result therefore also counts the tasks with a write
  (`write_required`), the part a do-nothing policy cannot pass.
- An episode is a conversation with no simulated user: the request is written out in
  full with the user's confirmation, so the system prompt is the domain policy plus the
  capability environments' framing (`task_env.FRAMING`: reply without a tool call to end).
- `tools`: "all" offers every domain tool (the benchmark's prompt); "capability" offers
  only the tools the task set's expected actions use, the union over the whole set (the
  same list for every task, so no task's tool list gives its answer away). It is the
  prompt budget the capability environments train with; a call to a tool not offered is
  an error observation, as an unknown tool is.
- Nothing here opens the store: this module runs inside evaluation jobs.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from trace_lib.envs.capabilities.task_env import FRAMING
from trace_lib.envs.domains import Domain, copy_db, get_domain, invoke, is_error
from trace_lib.envs.protocol import parse_action, tool_arguments
from trace_lib.errors import UserInputError

# trace_lib.demo builds ceil(300 trajectories / (3 agents x 2 trials)) = 50 tasks; the
# constant is repeated here because a job must not import the demo module (it imports the
# store). tests/evaluate checks that the two agree.
DEMO_TASKS = 50
TOOLS_MODES = ("all", "capability")


@dataclass
class TargetTask:
    """One target task, domain-independent: what evaluation and the store need from it."""

    task_id: str
    request: str
    expected_actions: list[dict[str, Any]]
    opportunities: list[str] = field(default_factory=list)  # capabilities it can exercise
    operations: list[str] = field(default_factory=list)
    raw: Any = None  # the domain's own task object, for its scorer
    writes: int = 0  # expected write calls; 0 = the right outcome is a refusal

    @property
    def write_required(self) -> bool:
        return self.writes > 0


Scorer = Callable[[Any, Any, list[dict[str, Any]]], dict[str, Any]]


@dataclass
class TaskSet:
    domain: str
    seed: int
    db: Any
    tasks: list[TargetTask]
    scorer: Scorer
    total: int  # tasks in the whole set (the selection may be a prefix)

    @property
    def spec(self) -> Domain:
        return get_domain(self.domain)

    def tool_names(self, mode: str = "all") -> list[str]:
        if mode not in TOOLS_MODES:
            raise UserInputError(f"--tools {mode!r}: expected one of {', '.join(TOOLS_MODES)}")
        names = self.spec.tool_names()
        if mode == "all":
            return names
        used = {a["name"] for t in _all_tasks(self.domain, self.seed, self.total)
                for a in t.expected_actions}
        return [n for n in names if n in used]

    def environment(self, task: TargetTask, tools: str = "all",
                    max_steps: int = 30) -> TargetTaskEnvironment:
        return TargetTaskEnvironment(self, task, self.tool_names(tools), max_steps)


# ---------------------------------------------------------------- task set registry


def _airline(seed: int, n: int) -> tuple[Any, list[TargetTask], Scorer]:
    from trace_lib.envs.domains.airline.tasks import generate_tasks, score

    db = get_domain("airline").make_db(seed)
    tasks = [
        TargetTask(task_id=t.task_id, request=t.request, expected_actions=t.expected_actions,
                   opportunities=sorted({o for op in t.operations for o in op.opportunities}),
                   operations=[op.kind for op in t.operations], raw=t,
                   writes=len(t.expected_writes))
        for t in generate_tasks(db, n, seed=seed)
    ]
    return db, tasks, lambda task, final_db, calls: score(task.raw, final_db, calls)


# domain -> builder (seed, n) -> (database, tasks, scorer). A domain without a builder has
# no target task set yet, and evaluation says so.
TASK_SETS: dict[str, Callable[[int, int], tuple[Any, list[TargetTask], Scorer]]] = {
    "airline": _airline,
}

_CACHE: dict[tuple[str, int, int], tuple[Any, list[TargetTask], Scorer]] = {}


def _build(domain: str, seed: int, n: int) -> tuple[Any, list[TargetTask], Scorer]:
    key = (domain, seed, n)
    if key not in _CACHE:
        _CACHE.clear()  # one set at a time: a database is ~1 MB of objects
        _CACHE[key] = TASK_SETS[domain](seed, n)
    return _CACHE[key]


def _all_tasks(domain: str, seed: int, total: int) -> list[TargetTask]:
    return _build(domain, seed, total)[1]


def task_set_domains() -> list[str]:
    return sorted(TASK_SETS)


def load_task_set(domain: str, n: int | None = None, seed: int = 0) -> TaskSet:
    """The domain's target tasks (the first `n`, or all with None)."""
    if domain not in TASK_SETS:
        try:
            get_domain(domain)
        except KeyError as exc:
            raise UserInputError(f"--domain {domain!r}: {exc.args[0]}") from None
        raise UserInputError(
            f"--domain {domain!r}: this domain has no target task set yet (task sets: "
            f"{', '.join(task_set_domains())}); its capability environments can be evaluated "
            "with `env calibrate`")
    total = DEMO_TASKS
    if n is not None and (not isinstance(n, int) or n < 1):
        raise UserInputError(f"--tasks {n!r}: expected a positive number or 'all'")
    if n is not None and n > total:
        raise UserInputError(f"--tasks {n}: the {domain} task set has {total} tasks")
    db, tasks, scorer = _build(domain, seed, total)
    return TaskSet(domain=domain, seed=seed, db=db, tasks=tasks[: n or total], scorer=scorer,
                   total=total)


# ----------------------------------------------------------------------- environment


class TargetTaskEnvironment:
    """The Environment protocol over one target task (reset's seed changes nothing: the
    task fixes the instance; trials differ only by the policy's sampling seed)."""

    version = 1
    capability = "target_task"

    def __init__(self, task_set: TaskSet, task: TargetTask, tool_names: list[str],
                 max_steps: int = 30) -> None:
        self.task_set = task_set
        self.task = task
        self.domain = task_set.domain
        self.name = f"{task_set.domain}/target/{task.task_id}"
        self._tool_names = list(tool_names)
        self.max_steps = max_steps
        self._spec = task_set.spec
        self.db: Any = None
        self.calls: list[dict[str, Any]] = []
        self.final_answer: str | None = None
        self._done = False

    def reset(self, seed: int) -> None:
        self.db = copy_db(self.task_set.db)
        self.toolkit = self._spec.tools(self.db)
        self.calls = []
        self.final_answer = None
        self._done = False

    @property
    def system_prompt(self) -> str:
        return f"{self._spec.policy.strip()}\n\n{FRAMING}"

    @property
    def tool_schemas(self) -> list[dict[str, Any]]:
        return self._spec.tool_schemas(self._tool_names)

    @property
    def messages(self) -> list[dict[str, Any]]:
        return [{"role": "system", "content": self.system_prompt},
                {"role": "user", "content": self.task.request}]

    @property
    def hint(self) -> str | None:
        return None

    @property
    def done(self) -> bool:
        return self._done

    @property
    def steps(self) -> int:
        return len(self.calls) + (1 if self.final_answer is not None else 0)

    def step(self, action: str | dict[str, Any]) -> str:
        if self.db is None:
            raise RuntimeError(f"{self.name}: call reset(seed) first")
        if self._done:
            return "Error: the episode is over"
        try:
            act = parse_action(action)
        except ValueError as exc:
            return self._record("", {}, f"Error: {exc}")
        if act.get("name"):
            name = str(act["name"])
            arguments = tool_arguments(act)
            if name not in self._tool_names:
                return self._record(name, arguments, (
                    f"Error: unknown tool {name!r}; available tools: "
                    f"{', '.join(self._tool_names)}"))
            return self._record(name, arguments, invoke(self.toolkit, name, arguments))
        if "content" in act:
            self.final_answer = str(act.get("content") or "")
            self._done = True
            return "The conversation has ended."
        return self._record("", {}, 'Error: an action is {"name": TOOL, "arguments": {...}} '
                                    'or {"content": TEXT}')

    def _record(self, name: str, arguments: Any, obs: str) -> str:
        self.calls.append({"name": name, "arguments": arguments, "error": is_error(obs)})
        if self.steps >= self.max_steps:
            self._done = True
        return obs

    def summary(self) -> dict[str, Any]:
        if self.db is None:
            raise RuntimeError(f"{self.name}: call reset(seed) first")
        ok = [{"name": c["name"], "arguments": c["arguments"]} for c in self.calls
              if not c["error"] and isinstance(c["arguments"], dict)]
        verdict = self.task_set.scorer(self.task, self.db, ok)
        reward = float(verdict["reward"])
        reasons = ["database matches the expected state" if verdict.get("db_match")
                   else "database differs from the expected state"]
        reasons += [f"never made {a['name']}({json.dumps(a.get('arguments', {}), sort_keys=True)})"
                    for a in verdict.get("missing_writes", [])]
        return {"reward": reward, "passed": reward == 1.0, "steps": self.steps,
                "reasons": reasons, "db_match": verdict.get("db_match"),
                "missing_writes": verdict.get("missing_writes", []),
                "final_answer": self.final_answer}
