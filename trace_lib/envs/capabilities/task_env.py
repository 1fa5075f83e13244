"""One seeded task over a domain's database, verified by code: the body of every built-in
capability environment.

A capability module contributes only a *task builder* per domain: given a fresh database,
a seeded RNG and a difficulty, it returns a `Task` (the user's request written out in full,
the reference tool calls, the answer items a correct reply must contain, the reads that
must come before any write, a hint). `TaskEnvironment` does the rest, the same way for
every capability and domain.

Design decisions
- The expected end state is not written by hand: it is the initial database with the
  reference write calls replayed through the domain's own tools. A builder therefore
  cannot state a ground truth its own tools disagree with; if a reference call errors,
  `reset` raises (a builder bug, never an agent's fault).
- The verdict is a list of checks, each with a score in [0, 1] and a reason:
  one per reference write (the share of its arguments the agent got right in its best
  matching call the tool accepted: partial credit for precision; a refused call earns
  nothing, or half when every argument was right), one per required read (made before the
  first write), one per answer item (found in the final reply), and the database check
  (final hash == expected hash, with the first differing paths as the reason).
  reward = mean of the non-database checks, times 0.5 if the database is wrong, times 0
  if the task needed no write and the agent changed the database anyway (that change is
  the failure the task is about). A fully correct episode is exactly 1.0.
- Answer items are lists of alternatives, matched case-insensitively on normalised text
  (thousands separators and "$" removed; numbers matched as whole tokens, so "2" does not
  match "2024").
- No reward without the work: answer items count only when every required read was
  made (before any write), and a task whose right outcome is a refusal credits the
  refusal only if the reads were made, nothing was written, and the reply both refuses
  and names the instance's id (`Task.refusal_of`). Generic refusal words alone earn 0;
  `validate.TRIVIAL_POLICIES` (always refuse, echo, keyword stuffing, random read then
  refuse) must stay at mean reward <= 0.05 on every built-in.
- `tools="capability"` / `policy="excerpt"` shrink the prompt (see capabilities/__init__);
  the tools a call may use are still the domain's whole toolkit (a call to a tool not
  shown is answered like any other), only the prompt changes.
- Writes are the domain's `@tool(write=True)` tools; no hashing per step.
- The instance seed is mixed with the environment's name and difficulty, so two
  environments on the same seed do not draw the same request.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from trace_lib.envs.domains import Domain, copy_db, db_hash, get_domain, invoke, is_error
from trace_lib.envs.protocol import parse_action, tool_arguments

FRAMING = """\
# This conversation
The user's whole request is in their first message; they will not answer questions.
Act on it with the tools above, following the policy (the request already contains the
user's explicit confirmation where an action needs one). When you are done, or when the
policy does not allow what they ask, reply to the user with a final message and no tool
call: that ends the conversation. Quote ids, amounts and counts exactly as the records
show them."""


@dataclass
class Task:
    request: str  # the user's full request: the only user turn
    actions: list[dict[str, Any]]  # the reference tool calls, in order
    answer: str  # the reference final reply
    answer_items: list[list[str]] = field(default_factory=list)  # alternatives per item
    required_reads: list[dict[str, Any]] = field(default_factory=list)  # before any write
    hint: str = ""
    facts: dict[str, Any] = field(default_factory=dict)  # what the instance is about
    # A task whose correct outcome is a refusal: the id the reply must name. Credit needs
    # the required reads first, no write, a refusal phrase and this id in the reply.
    refusal_of: str | None = None


TaskBuilder = Callable[[Any, random.Random, int], Task]


@dataclass
class EnvConfig:
    difficulty: int = 2  # 1 easy .. 3 hard: each builder documents what it changes
    max_steps: int = 30  # tool calls + final reply; the episode ends at this many
    db_size: dict[str, Any] = field(default_factory=dict)  # passed to Domain.make_db
    tools: str = "all"  # "all" | "capability": which tool schemas the prompt carries
    policy: str = "full"  # "full" | "excerpt": which policy text the system prompt carries
    distractors: int = 2  # with tools="capability": this many other domain tools too
    needed_tools: tuple[str, ...] = ()  # declared by the task builder
    policy_sections: tuple[str, ...] = ()  # "## " sections of the policy the tasks exercise


def _normalise_text(text: str) -> str:
    text = text.lower().replace("$", " ")
    return re.sub(r"(?<=\d),(?=\d{3})", "", text)


def answer_contains(answer: str, alternative: str) -> bool:
    """Whole-token, case-insensitive match of one alternative in a reply."""
    hay = _normalise_text(answer)
    needle = _normalise_text(alternative).strip()
    if not needle:
        return False
    return re.search(r"(?<![\w.])" + re.escape(needle) + r"(?![\w])", hay) is not None


REFUSAL_PHRASES = (
    "cannot", "can't", "can not", "unable", "not able", "not possible", "not eligible",
    "not allowed", "won't be able", "not permitted", "do not allow", "does not allow",
)


def policy_excerpt(policy: str, sections: tuple[str, ...] | list[str]) -> str:
    """The policy's opening, its "How to work" section and `sections`, cut verbatim."""
    parts = re.split(r"(?m)^(?=## )", policy.strip())
    head, body = parts[0], parts[1:]
    by_title = {p.splitlines()[0][3:].strip(): p for p in body}
    missing = [t for t in sections if t not in by_title]
    if missing:
        raise KeyError(f"policy has no sections {missing}; it has {sorted(by_title)}")
    wanted = ["How to work", *[t for t in sections if t != "How to work"]]
    kept = [by_title[t].rstrip() for t in by_title if t in wanted]  # policy order
    return "\n\n".join([head.rstrip(), *kept])


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False, default=str)


def _first_differences(a: Any, b: Any, path: str = "", limit: int = 5) -> list[str]:
    out: list[str] = []
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b)):
            if len(out) >= limit:
                break
            if key not in a or key not in b:
                out.append(f"{path}/{key}: {'added' if key not in b else 'missing'}")
            elif a[key] != b[key]:
                out.extend(_first_differences(a[key], b[key], f"{path}/{key}", limit - len(out)))
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            if len(out) >= limit:
                break
            if x != y:
                out.extend(_first_differences(x, y, f"{path}[{i}]", limit - len(out)))
    else:
        out.append(f"{path or '/'}: {_canonical(a)[:60]} (expected {_canonical(b)[:60]})")
    return out[:limit]


def call_text(call: dict[str, Any]) -> str:
    args = ", ".join(f"{k}={_canonical(v)[:40]}" for k, v in call.get("arguments", {}).items())
    return f"{call['name']}({args})"


class TaskEnvironment:
    """A built-in capability environment: one `Task` per seed over one domain."""

    def __init__(
        self,
        name: str,
        capability: str,
        domain: str,
        builder: TaskBuilder,
        config: EnvConfig | None = None,
        version: int = 1,
        description: str = "",
    ) -> None:
        self.name = name
        self.capability = capability
        self.domain = domain
        self.version = version
        self.description = description
        self.config = config or EnvConfig()
        self._domain: Domain = get_domain(domain)
        self._builder = builder
        self.seed: int | None = None
        self.task: Task | None = None
        self.calls: list[dict[str, Any]] = []
        self.final_answer: str | None = None
        self._done = False

    # ------------------------------------------------------------------ protocol
    def reset(self, seed: int) -> None:
        self.seed = int(seed)
        rng = random.Random(f"{self.name}:{self.seed}:{self.config.difficulty}")
        db = self._fresh_db()
        task = self._builder(db, rng, self.config.difficulty)
        expected = copy_db(db)
        kit = self._domain.tools(expected)
        for call in task.actions:
            obs = invoke(kit, call["name"], call["arguments"])
            if is_error(obs):
                raise RuntimeError(
                    f"{self.name} seed {seed}: reference call {call_text(call)} failed: {obs}"
                )
        self.expected_db = expected
        self.expected_hash = db_hash(expected)
        self.db = db
        self.toolkit = self._domain.tools(db)
        self.task = task
        self.calls = []
        self.final_answer = None
        self._done = False

    def _fresh_db(self) -> Any:
        """The instance's starting database (a subclass may start from a fixed one)."""
        return self._domain.make_db(self.seed, **self.config.db_size)

    def _tool_error(self, name: str) -> str | None:
        """An error observation for a call to `name` that this environment refuses; None
        answers every domain tool (a tool the prompt does not show included)."""
        return None

    @property
    def system_prompt(self) -> str:
        policy = self._domain.policy.strip()
        if self.config.policy == "excerpt" and self.config.policy_sections:
            policy = policy_excerpt(policy, self.config.policy_sections)
        return f"{policy}\n\n{FRAMING}"

    def write_tool_names(self) -> list[str]:
        return self._domain.write_tools()

    def tool_names_shown(self) -> list[str]:
        """The tools the prompt lists, in the domain's order."""
        every = self._domain.tool_names()
        if self.config.tools == "all" or not self.config.needed_tools:
            return list(every)
        needed = set(self.config.needed_tools)
        others = sorted((n for n in every if n not in needed),
                        key=lambda n: hashlib.sha1(f"{self.capability}:{n}".encode()).hexdigest())
        shown = needed | set(others[: max(0, self.config.distractors)])
        return [n for n in every if n in shown]

    @property
    def tool_schemas(self) -> list[dict[str, Any]]:
        return self._domain.tool_schemas(self.tool_names_shown())

    @property
    def messages(self) -> list[dict[str, Any]]:
        if self.task is None:  # before reset (also what isinstance(env, Environment) sees)
            return []
        return [
            {"role": "system", "content": self.system_prompt},
            {"role": "user", "content": self._task().request},
        ]

    @property
    def hint(self) -> str | None:
        return self.task.hint or None if self.task is not None else None

    @property
    def done(self) -> bool:
        return self._done

    @property
    def steps(self) -> int:
        return len(self.calls) + (1 if self.final_answer is not None else 0)

    def step(self, action: str | dict[str, Any]) -> str:
        self._task()
        if self._done:
            return "Error: the episode is over"
        try:
            act = parse_action(action)
        except ValueError as exc:
            obs = f"Error: {exc}"
            self.calls.append({"name": "", "arguments": {}, "observation": obs, "write": False})
            self._check_budget()
            return obs
        if "name" in act and act["name"]:  # parse_action unwraps OpenAI's function shape
            name = str(act["name"])
            arguments = tool_arguments(act)
            obs = self._tool_error(name) or invoke(self.toolkit, name, arguments)
            write = name in self._domain.write_tools() and not is_error(obs)
            self.calls.append({"name": name, "arguments": arguments, "observation": obs,
                               "write": write})
            self._check_budget()
            return obs
        if "content" in act:
            self.final_answer = str(act.get("content") or "")
            self._done = True
            return "The conversation has ended."
        obs = 'Error: an action is {"name": TOOL, "arguments": {...}} or {"content": TEXT}'
        self.calls.append({"name": "", "arguments": {}, "observation": obs, "write": False})
        self._check_budget()
        return obs

    def _check_budget(self) -> None:
        if self.steps >= self.config.max_steps:
            self._done = True

    def reference_action(self) -> dict[str, Any] | None:
        """The reference policy: the task's calls in order, then its reply."""
        task = self._task()
        if self._done:
            return None
        i = len(self.calls)
        if i < len(task.actions):
            return dict(task.actions[i])
        return {"content": task.answer}

    @property
    def ground_truth(self) -> dict[str, Any]:
        if self.task is None:
            return {}
        task = self.task
        return {
            "seed": self.seed,
            "difficulty": self.config.difficulty,
            "reference_actions": task.actions,
            "reference_answer": task.answer,
            "answer_items": task.answer_items,
            "required_reads": task.required_reads,
            "expected_db_hash": self.expected_hash,
            "facts": task.facts,
        }

    # ------------------------------------------------------------------ verifier
    def _task(self) -> Task:
        if self.task is None:
            raise RuntimeError(f"{self.name}: call reset(seed) first")
        return self.task

    def _normalised_args(self, name: str, args: Any) -> dict[str, str]:
        if not isinstance(args, dict):
            return {}
        try:
            model = self._domain.toolkit_cls.params_model(name)
            dumped = model.model_validate(args).model_dump(mode="json")
        except (ValidationError, KeyError, AttributeError, TypeError):
            dumped = args
        return {k: _canonical(v) for k, v in dumped.items()}

    def _write_score(self, gold: dict[str, Any]) -> tuple[float, str]:
        want = self._normalised_args(gold["name"], gold["arguments"])
        best, best_wrong = 0.0, sorted(want)
        for call in self.calls:
            if call["name"] != gold["name"]:
                continue
            got = self._normalised_args(call["name"], call["arguments"])
            wrong = [k for k in want if got.get(k) != want[k]]
            score = 1.0 - len(wrong) / max(1, len(want))
            if call["write"] is False:  # the tool refused it: nothing was written
                # An exactly right call the tool still refused keeps half; a partly right
                # one earns nothing. (It used to earn its share of right arguments: GRPO
                # from a short SFT learned to send the right id with a cut-down passenger
                # list, which the tool rejects, for a steady 0.25; session 11.)
                score = 0.5 if score == 1.0 else 0.0
                wrong = ["(the tool returned an error)"]
            if score > best:
                best, best_wrong = score, wrong
        if best == 1.0:
            return 1.0, f"did {call_text(gold)}"
        if best == 0.0:
            return 0.0, f"never did {call_text(gold)}"
        return best, f"{call_text(gold)}: wrong {', '.join(best_wrong)}"

    def _read_score(self, read: dict[str, Any]) -> tuple[float, str]:
        first_write = next((i for i, c in enumerate(self.calls) if c["write"]), len(self.calls))
        for call in self.calls[:first_write]:
            if call["name"] != read["name"] or is_error(call["observation"]):
                continue
            args = call["arguments"] if isinstance(call["arguments"], dict) else {}
            if all(_canonical(args.get(k)) == _canonical(v) for k, v in read["arguments"].items()):
                return 1.0, f"checked {call_text(read)} before acting"
        return 0.0, f"did not check {call_text(read)} before acting"

    def summary(self) -> dict[str, Any]:
        task = self._task()
        checks: list[dict[str, Any]] = []
        writes = [a for a in task.actions if a["name"] in self._domain.write_tools()]
        for gold in writes:
            score, why = self._write_score(gold)
            checks.append({"check": "write", "score": score, "reason": why})
        for read in task.required_reads:
            score, why = self._read_score(read)
            checks.append({"check": "read_before_write", "score": score, "reason": why})
        answer = self.final_answer or ""
        reads_ok = all(c["score"] == 1.0 for c in checks if c["check"] == "read_before_write")
        wrote = any(c["write"] for c in self.calls)
        for item in task.answer_items:
            found = any(answer_contains(answer, alt) for alt in item)
            shown = " | ".join(item)
            if found and not reads_ok:
                checks.append({"check": "answer", "score": 0.0,
                               "reason": f"reply states {shown} without the required reads"})
                continue
            checks.append({"check": "answer", "score": 1.0 if found else 0.0,
                           "reason": ("reply states " if found else "reply lacks ") + shown})
        if task.refusal_of is not None:
            refused = any(answer_contains(answer, alt) for alt in REFUSAL_PHRASES)
            named = answer_contains(answer, task.refusal_of)
            if not reads_ok:
                score, why = 0.0, "refused without the required reads"
            elif wrote:
                score, why = 0.0, "wrote to the database instead of refusing"
            elif not (refused and named):
                score, why = 0.0, (f"reply does not refuse {task.refusal_of}" if not refused
                                   else f"reply refuses without naming {task.refusal_of}")
            else:
                score, why = 1.0, f"refused {task.refusal_of} after checking the records"
            checks.append({"check": "refusal", "score": score, "reason": why})
        final_hash = db_hash(self.db)
        state_ok = final_hash == self.expected_hash
        if state_ok:
            state_reason = "database matches the expected state"
        else:
            diffs = _first_differences(self.db.model_dump(mode="json"),
                                       self.expected_db.model_dump(mode="json"))
            state_reason = "database differs from the expected state: " + "; ".join(diffs)
        checks.append({"check": "database", "score": 1.0 if state_ok else 0.0,
                       "reason": state_reason})
        scores = [c["score"] for c in checks[:-1]]
        reward = sum(scores) / len(scores) if scores else float(state_ok)
        if not state_ok:
            reward *= 0.5 if writes else 0.0
        passed = state_ok and all(s == 1.0 for s in scores)
        reward = 1.0 if passed else min(reward, 0.99)
        return {
            "reward": round(float(reward), 6),
            "passed": passed,
            "steps": self.steps,
            "reasons": [c["reason"] for c in checks],
            "checks": checks,
            "final_answer": self.final_answer,
            "db_hash": final_hash,
        }
