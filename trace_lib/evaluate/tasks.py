"""Target task sets: a domain's own tasks as Environments whose reward is the task's verdict.

    ts = load_task_set("airline", n=5)
    env = ts.environment(ts.tasks[0], tools="all"); env.reset(0); env.step({...})

Design decisions
- Airline's target tasks are the demo's tasks, not a new set: the domain database for
  seed S at its default size, and `generate_tasks(db, DEMO_TASKS, seed=S)`: the tasks the
  scripted agents play to make `data/demo/airline_demo.jsonl`. So task ids
  (`airline_0_000`, ...) match the demo dataset's, and an evaluation pairs with it.
  `--tasks N` takes the first N of that list (the generator draws in order, so the first N
  are the same whatever the total; a test holds it).
- Retail has no scripted demo agents, so its target tasks are the retail domain's own
  seeded task builders (those of the four built-in capability environments), drawn in turn
  over ONE database for seed S at its default size (not the small per-episode databases the
  environments train on), with request streams of their own (`retail-target:S:K`), and
  scored by the same code verdict as airline's below. Ids `retail_S_000`...; the first N
  are a prefix of the whole set here too. They are the same kinds of task the retail
  capability environments train on: an in-distribution check of those skills on other
  instances, not a held-out benchmark, and the README says so. A task that asks a
  question also needs its answer items in the reply (tau2's `communicate_info`); the
  airline demo tasks have none.
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
- One episode loop: `TargetTaskEnvironment` is a `TaskEnvironment` (the capability
  environments' class) whose instance is the target task over a copy of the task set's
  database; only the verdict (the task's own scorer) and the refusal of tools not offered
  differ. Actions come in any shape `envs.protocol.parse_action` reads, OpenAI's
  `{"type": "function", "function": {"name", "arguments": "<json>"}}` included, so a
  hosted endpoint's tool calls are played as they arrive.
- `tools`: "all" offers every domain tool (the benchmark's prompt); "capability" offers
  only the tools the task set's expected actions use, the union over the whole set (the
  same list for every task, so no task's tool list gives its answer away). It is the
  prompt budget the capability environments train with; a call to a tool not offered is
  an error observation, as an unknown tool is.
- Named splits (`SPLITS`): a split is a task-set seed and a size, the same for every
  domain. `demo` (seed 0, 50 tasks) is the set the demo's scripted agents played, kept so
  an evaluation pairs with the demo dataset; `dev` (seed 1, 100) is where a person or the
  loop diagnoses, chooses settings and checkpoints; `test` (seed 2, 150) is held out: each
  final configuration is run on it once, and nothing is chosen on it. Seeds differ, so
  the splits are drawn from the same generator over different databases (other users,
  reservations, products): no task, user or record id is shared, which a test checks.
  A split's tasks are a prefix-stable draw, so `--tasks N` is its first N and
  `--tasks START:END` the slice (where dev keeps tasks for choosing a checkpoint).
- Nothing here opens the store: this module runs inside evaluation jobs.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from trace_lib.envs.capabilities.task_env import (
    EnvConfig,
    Task,
    TaskEnvironment,
    answer_contains,
)
from trace_lib.envs.domains import Domain, copy_db, db_hash, get_domain, invoke, is_error
from trace_lib.envs.splits import DEFAULT_SPLIT, DEMO_TASKS, SPLITS, get_split, split_of
from trace_lib.errors import UserInputError
from trace_lib.registry import ENTRY_POINT_GROUPS, Registry

TOOLS_MODES = ("all", "capability")




TASKS_FORMS = ("a positive number N (the first N), START:END (that slice of the split) "
               "or 'all'")


def parse_task_slice(text: str | int | None) -> tuple[int, int | None]:
    """(offset, count) of a task selection: N (the first N), START:END (that slice of the
    split), or "all"/None (count None: the rest of the split). The one parser of `--tasks`
    for `evaluate`, the bench scripts and configs; a bad form is a UserInputError."""
    if text is None or str(text) == "all":
        return 0, None
    start, sep, end = str(text).partition(":")
    try:
        a, b = (int(start), int(end)) if sep else (0, int(start))
    except ValueError:
        raise UserInputError(f"expected {TASKS_FORMS}, got {text!r}") from None
    if a < 0 or b <= a:
        raise UserInputError(f"expected {TASKS_FORMS}, got {text!r}")
    return a, b - a




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
    reference_answer: str = ""  # the reference policy's final reply (what it must state)

    @property
    def write_required(self) -> bool:
        return self.writes > 0


# (task, final database, the calls that did not error, the final reply) -> verdict
Scorer = Callable[[Any, Any, list[dict[str, Any]], str], dict[str, Any]]


@dataclass
class TaskSet:
    domain: str
    seed: int
    db: Any
    tasks: list[TargetTask]
    scorer: Scorer
    total: int  # tasks in the whole set (the selection may be a prefix)

    @property
    def split(self) -> str:
        return split_of(self.seed)

    @property
    def spec(self) -> Domain:
        return get_domain(self.domain)

    def tool_names(self, mode: str = "all") -> list[str]:
        if mode not in TOOLS_MODES:
            raise UserInputError(f"--tools {mode!r}: expected one of {', '.join(TOOLS_MODES)}")
        names = self.spec.tool_names()
        if mode == "all":
            return names
        used = {a["name"] for t in _build(self.domain, self.seed)[1]
                for a in t.expected_actions}
        return [n for n in names if n in used]

    def environment(self, task: TargetTask, tools: str = "all",
                    max_steps: int = 30) -> TargetTaskEnvironment:
        return TargetTaskEnvironment(self, task, self.tool_names(tools), max_steps)


# ---------------------------------------------------------------- task set registry


def _canonical(action: dict[str, Any]) -> str:
    return json.dumps({"name": action["name"], "arguments": action.get("arguments", {})},
                      sort_keys=True)


@dataclass
class CodeVerdictTask:
    """What the code verdict needs of a task that has no domain scorer of its own."""

    expected_writes: list[dict[str, Any]]
    expected_db_hash: str
    capability: str
    answer_items: list[list[str]] = field(default_factory=list)  # alternatives per item


def code_verdict(task: CodeVerdictTask, final_db: Any, calls: list[dict[str, Any]],
                 answer: str = "") -> dict[str, Any]:
    """tau2's check, as airline's `tasks.score`: 1.0 iff the final database hash is the
    expected one and every expected write was made with exactly its arguments; and, as
    tau2's `communicate_info`, every item the reply must state is in it (a question's
    answer: without it a task that writes nothing would pass by doing nothing)."""
    made = {_canonical(c) for c in calls}
    missing = [a for a in task.expected_writes if _canonical(a) not in made]
    unsaid = [" | ".join(item) for item in task.answer_items
              if not any(answer_contains(answer, alt) for alt in item)]
    db_match = db_hash(final_db) == task.expected_db_hash
    return {"reward": 1.0 if db_match and not missing and not unsaid else 0.0,
            "db_match": db_match, "missing_writes": missing, "missing_answer": unsaid}


def airline_task_set(seed: int, total: int) -> tuple[Any, list[TargetTask], Scorer, int]:
    from trace_lib.envs.domains.airline.tasks import generate_tasks, score

    db = get_domain("airline").make_db(seed)
    tasks = [
        TargetTask(task_id=t.task_id, request=t.request, expected_actions=t.expected_actions,
                   opportunities=sorted({o for op in t.operations for o in op.opportunities}),
                   operations=[op.kind for op in t.operations], raw=t,
                   writes=len(t.expected_writes))
        for t in generate_tasks(db, total, seed=seed)
    ]
    return (db, tasks, lambda task, final_db, calls, answer: score(task.raw, final_db, calls),
            total)


def retail_task_set(seed: int, total: int) -> tuple[Any, list[TargetTask], Scorer, int]:
    from trace_lib.envs.capabilities import CAPABILITIES, builtin_pairs

    domain = get_domain("retail")
    db = domain.make_db(seed)
    writes = set(domain.write_tools())
    capabilities = sorted(c for d, c in builtin_pairs() if d == "retail")
    tasks: list[TargetTask] = []
    for k in range(total):
        capability = capabilities[k % len(capabilities)]
        for attempt in range(50):
            rng = random.Random(f"retail-target:{seed}:{k}:{attempt}")
            try:
                task: Task = CAPABILITIES[capability].builders["retail"](db, rng, 2)
            except (LookupError, ValueError):
                continue  # the draw found no records that fit: draw again
            final = copy_db(db)
            kit = domain.tools(final)
            if not any(is_error(invoke(kit, a["name"], a["arguments"])) for a in task.actions):
                break
        else:
            raise RuntimeError(f"retail target task {k} ({capability}): no instance in 50 "
                               "draws replays cleanly on this database")
        expected_writes = [a for a in task.actions if a["name"] in writes]
        tasks.append(TargetTask(
            task_id=f"retail_{seed}_{k:03d}", request=task.request,
            expected_actions=[dict(a) for a in task.actions], opportunities=[capability],
            operations=[capability], writes=len(expected_writes),
            reference_answer=task.answer,
            raw=CodeVerdictTask(expected_writes, db_hash(final), capability,
                                [list(item) for item in task.answer_items])))
    return (db, tasks, lambda task, final_db, calls, answer: code_verdict(task.raw, final_db,
                                                                          calls, answer),
            total)


TaskSetBuilder = Callable[[int, int], tuple[Any, list[TargetTask], Scorer, int]]

# domain -> builder (seed, total) -> (database, the first `total` tasks, scorer, total). A
# domain without a builder has no target task set yet, and evaluation says so. A plugin
# domain brings its own through the `trace_workbench.task_sets` entry-point group.
TASK_SETS: Registry[TaskSetBuilder] = Registry(
    "target task set", group=ENTRY_POINT_GROUPS["task_sets"], builtins={
        "airline": "trace_lib.evaluate.tasks:airline_task_set",
        "retail": "trace_lib.evaluate.tasks:retail_task_set",
    })

_CACHE: dict[tuple[str, int, int], tuple[Any, list[TargetTask], Scorer, int]] = {}


def set_size(seed: int) -> int:
    """How many tasks the set for `seed` has: its split's size (a custom seed: the demo's)."""
    name = split_of(seed)
    return SPLITS[name].size if name != "custom" else DEMO_TASKS


def _build(domain: str, seed: int) -> tuple[Any, list[TargetTask], Scorer, int]:
    key = (domain, seed, set_size(seed))
    if key not in _CACHE:
        _CACHE.clear()  # one set at a time: a database is ~1 MB of objects
        _CACHE[key] = TASK_SETS.get(domain)(seed, key[2])
    return _CACHE[key]


def task_set_domains() -> list[str]:
    return sorted(TASK_SETS)


def load_task_set(domain: str, n: int | None = None, seed: int | None = None,
                  split: str | None = None, offset: int = 0) -> TaskSet:
    """The domain's target tasks of `split` (or of the task-set `seed`; the demo split by
    default): `n` of them from position `offset` (all the rest with None)."""
    if split is not None:
        chosen = get_split(split)
        if seed is not None and seed != chosen.seed:
            raise UserInputError(f"--split {split} is task-set seed {chosen.seed}; --seed "
                                 f"{seed} names another set (give one of the two)")
        seed = chosen.seed
    seed = SPLITS[DEFAULT_SPLIT].seed if seed is None else seed
    if domain not in TASK_SETS:
        try:
            get_domain(domain)
        except KeyError as exc:
            raise UserInputError(f"--domain {domain!r}: {exc.args[0]}") from None
        raise UserInputError(
            f"--domain {domain!r}: this domain has no target task set yet (task sets: "
            f"{', '.join(task_set_domains())}); its capability environments can be evaluated "
            "with `env calibrate`")
    if n is not None and (not isinstance(n, int) or n < 1):
        raise UserInputError(f"--tasks {n!r}: expected a positive number or 'all'")
    if not isinstance(offset, int) or offset < 0:
        raise UserInputError(f"--tasks: the first task's position must be a number >= 0, got "
                             f"{offset!r}")
    db, tasks, scorer, total = _build(domain, seed)
    end = total if n is None else offset + n
    if end > total or offset >= total:
        asked = f"{offset}:{end}" if offset else str(n)
        raise UserInputError(f"--tasks {asked}: the {domain} {split_of(seed)} split has {total} "
                             "tasks")
    return TaskSet(domain=domain, seed=seed, db=db, tasks=tasks[offset:end], scorer=scorer,
                   total=total)


def passes_by_doing_nothing(ts: TaskSet, task: TargetTask) -> bool:
    """Whether the verifier passes `task` for the policy that makes no call and says
    nothing: the floor beside every pass rate. A task passes it when its right outcome
    changes nothing and states nothing (a refusal the verifier cannot tell from silence),
    so a pass there is no evidence of skill."""
    env = ts.environment(task)
    env.reset(0)
    env.step({"content": ""})
    return bool(env.summary()["passed"])


def do_nothing_verdicts(ts: TaskSet) -> dict[str, bool]:
    """{task id: passed} of the do-nothing policy over the whole selection."""
    return {task.task_id: passes_by_doing_nothing(ts, task) for task in ts.tasks}


def reference_turn_texts(ts: TaskSet) -> list[str]:
    """Every assistant turn of the reference policy on the selection, as the chat format
    renders it (each expected action as a tool call, then the final reply): what a
    policy's `max_tokens` must hold for the right answer to fit (`runner.turn_budget`)."""
    from trace_lib.runtime.chat_format import IM_END, format_assistant

    out = []
    for task in ts.tasks:
        for k, action in enumerate(task.expected_actions):
            args = action.get("arguments", {})
            call = {"id": f"call_{k}", "type": "function", "function": {
                "name": action["name"],
                "arguments": args if isinstance(args, str) else json.dumps(args)}}
            out.append(format_assistant(None, [call]) + IM_END)
        out.append((task.reference_answer or "Done.") + IM_END)
    return out


# ----------------------------------------------------------------------- environment


class TargetTaskEnvironment(TaskEnvironment):
    """The Environment protocol over one target task: the capability environments' episode
    loop (`TaskEnvironment`) on a copy of the task set's database, with the task's own
    verdict. reset's seed changes nothing: the task fixes the instance; trials differ only
    by the policy's sampling seed."""

    def __init__(self, task_set: TaskSet, task: TargetTask, tool_names: list[str],
                 max_steps: int = 30) -> None:
        super().__init__(name=f"{task_set.domain}/target/{task.task_id}",
                         capability="target_task", domain=task_set.domain,
                         builder=self._target, config=EnvConfig(max_steps=max_steps))
        self.task_set = task_set
        self.target = task
        self._tool_names = list(tool_names)

    def _target(self, db: Any, rng: random.Random, difficulty: int) -> Task:
        return Task(request=self.target.request,
                    actions=[dict(a) for a in self.target.expected_actions],
                    answer=self.target.reference_answer or "Done.")

    def _fresh_db(self) -> Any:
        return copy_db(self.task_set.db)

    def _tool_error(self, name: str) -> str | None:
        if name in self._tool_names:
            return None
        return f"Error: unknown tool {name!r}; available tools: {', '.join(self._tool_names)}"

    def tool_names_shown(self) -> list[str]:
        return list(self._tool_names)

    def summary(self) -> dict[str, Any]:
        self._task()
        ok = [{"name": c["name"], "arguments": c["arguments"]} for c in self.calls
              if not is_error(c["observation"]) and isinstance(c["arguments"], dict)]
        verdict = self.task_set.scorer(self.target, self.db, ok, self.final_answer or "")
        reward = float(verdict["reward"])
        reasons = ["database matches the expected state" if verdict.get("db_match")
                   else "database differs from the expected state"]
        reasons += [f"never made {a['name']}({json.dumps(a.get('arguments', {}), sort_keys=True)})"
                    for a in verdict.get("missing_writes", [])]
        reasons += [f"reply lacks {item}" for item in verdict.get("missing_answer", [])]
        return {"reward": reward, "passed": reward == 1.0, "steps": self.steps,
                "reasons": reasons, "db_match": verdict.get("db_match"),
                "missing_writes": verdict.get("missing_writes", []),
                "final_answer": self.final_answer}
