"""Target-shaped airline instances: the target-task generator over training databases.

    env = make_capability_env("airline", "precondition_verification", difficulty=5)
    env.reset(7)   # a target-shaped task drawn over training database 1007

The top of the curriculum (`envs.curriculum`): difficulty 4 ("target-shaped, values told")
and 5 ("target-shaped") of every airline capability environment. An instance IS a target
task (`envs.domains.airline.tasks.generate_tasks`, the generator of the demo/dev/test
splits), drawn over a training database, filtered to the capability, and verified by that
task's own code verdict.

Design decisions
- Training databases are the airline database at its default size (the target tasks'
  size) for seed `TRAIN_SEED_BASE + instance seed`. Every split's task-set seed is < 10
  (`envs.splits.SPLITS`: demo 0, dev 1, test 2) and instance seeds are >= 0, so no
  instance ever builds a split's database. Ids are random strings, so two databases can
  still share one by chance: a draw whose user, or any reservation of that user, has an
  id present in a split's database is drawn again (`held_out_ids`; the split databases
  are built only to read their ids, never to draw from). Task ids are
  `airline_train_<db seed>_<attempt>`, a namespace no split uses.
- The capability filter is a documented table, `KIND_CAPABILITIES` (Operation.kind ->
  the capabilities the operation exercises), plus `multi_step_task_completion` for any task
  of two or more operations. It agrees with the generator's own `opportunities` (a test
  holds that every opportunity the generator records is in the table); structured data
  reasoning here means writes whose values come from read records (the new bag totals, the
  whole passenger list), since target tasks ask no questions.
- One draw per (capability, seed): `generate_tasks(db, 1, seed=f"train:...:{attempt}")`
  until the task's operations exercise the capability. The same task and the same request
  phrasing at difficulty 4 and 5, so the step between them changes one axis only.
- Several request templates: the generator writes one phrasing per operation kind; here
  each part of a request (greeting, list intro, each operation, confirmation) is one of
  three phrasings, the generator's own being phrasing 0, so the splits' requests are inside
  this distribution. The meaning never changes: the expected calls are the generator's.
- Values read (difficulty 5): the request names the user, the reservations, the reasons and
  the card (by brand and last four) and nothing the agent must look up (payment ids, bag
  totals and allowances, the passenger list, the flights, eligibility facts): exactly the
  generator's request. Values told (difficulty 4): the same request with, after each
  operation, what the records show (the write's computed values, the eligibility facts).
- The verdict is the target task's own (`airline.tasks.score`: final database hash and
  every expected write with exactly its arguments, on the calls that did not error), as
  `evaluate.tasks.TargetTaskEnvironment` scores it: binary, reads free. One addition, only
  where the task has no write (every operation is refused by the policy): the target
  verdict passes doing nothing there (the task sets' do-nothing floor), and a training
  reward that pays for nothing trains nothing and fails validation's loophole rule
  (<= 0.05 for always-refuse, echo, keyword stuffing, random read then refuse). So such a
  task also needs each refused reservation read before replying, and a reply that refuses
  and names every refused reservation id (the capability environments' `refusal_of` rule).
  Every pass here is a pass of the target verdict; never the reverse.
- Partial credit below a pass (the reward GRPO learns from; `passed` stays the verdict
  above). With pass-or-nothing, no rollout of a short SFT passed and no group had a
  gradient in two seeds (bench/README, session 23). An episode that does not pass earns
  the mean of its checks, as the lower levels' `TaskEnvironment` verdict does, capped at
  0.99: each expected write by the share of its arguments that are right in its best
  accepted call (an exactly right call the tool refused keeps half), and each written
  reservation read (`get_reservation_details`) before the first write; times 0.5 when the
  database is wrong. No reward without the work: the reads count only once some write
  earned something, and on a refusal-only task the reads count only beside a refusing
  reply and the named refusal only after the reads, while any write there earns 0. So
  every loophole probe (refuse, echo, keyword stuffing, random read then refuse) and
  "read, then stop" still earn 0, and the first step the verdict pays for (the right
  write, then the reads before it) is the first step the reward pays for.
- No simulated user: the target tasks have none (one user turn with the confirmation
  written in), so a scripted multi-turn user would move the instances away from the tasks.
"""

from __future__ import annotations

import random
from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import Any

from trace_lib.envs.capabilities.task_env import (
    REFUSAL_PHRASES,
    EnvConfig,
    Task,
    TaskEnvironment,
    answer_contains,
)
from trace_lib.envs.domains import copy_db, get_domain, is_error

TRAIN_SEED_BASE = 1000  # training database seed = TRAIN_SEED_BASE + instance seed
TOLD, READ = 4, 5  # the two target-shaped difficulties
LEVEL_NAMES = {TOLD: "target-shaped, values told", READ: "target-shaped"}
MULTI_STEP = "multi_step_task_completion"

# Operation.kind -> the capabilities it exercises (the capability filter).
KIND_CAPABILITIES: dict[str, tuple[str, ...]] = {
    "cancel": ("precondition_verification",),  # eligible only by the records' facts
    "cancel_denied": ("precondition_verification",),  # refuse after reading
    "change_flight_denied": ("precondition_verification",),  # basic economy: refuse
    "add_bags": ("tool_calling_precision", "structured_data_reasoning"),  # totals from records
    "change_passenger": ("tool_calling_precision", "structured_data_reasoning"),  # whole list
    "upgrade_cabin": ("tool_calling_precision",),  # every flight listed again
}
# The tools each kind's reference uses (tools="capability" shows these + distractors).
_READS = ("get_user_details", "get_reservation_details")
KIND_TOOLS: dict[str, tuple[str, ...]] = {
    "cancel": (*_READS, "get_flight_status", "cancel_reservation"),
    "cancel_denied": (*_READS, "get_flight_status"),
    "change_flight_denied": _READS,
    "add_bags": (*_READS, "update_reservation_baggages"),
    "change_passenger": (*_READS, "update_reservation_passengers"),
    "upgrade_cabin": (*_READS, "update_reservation_flights"),
}
# The policy sections each kind exercises (policy="excerpt").
KIND_SECTIONS: dict[str, tuple[str, ...]] = {
    "cancel": ("Records", "Cancelling"),
    "cancel_denied": ("Records", "Cancelling"),
    "change_flight_denied": ("Records", "Changing a reservation"),
    "add_bags": ("Records", "Booking", "Changing a reservation"),
    "change_passenger": ("Changing a reservation",),
    "upgrade_cabin": ("Records", "Changing a reservation"),
}


def capabilities_of(kinds: list[str]) -> set[str]:
    """The capabilities a task of these operation kinds exercises."""
    caps = {c for k in kinds for c in KIND_CAPABILITIES[k]}
    return caps | ({MULTI_STEP} if len(kinds) >= 2 else set())


def kinds_of(capability: str) -> tuple[str, ...]:
    """The operation kinds whose tasks may be drawn for `capability`."""
    if capability == MULTI_STEP:
        return tuple(KIND_CAPABILITIES)
    return tuple(k for k, caps in KIND_CAPABILITIES.items() if capability in caps)


# A filtered task may pair its operation with one of any other kind (a cancellation and
# added bags), so tools="capability" / policy="excerpt" show what ANY kind needs: the same
# list for every capability, as the target task set's own tools="capability" (the union
# over the set, so no task's tool list gives its answer away).
def needed_tools(capability: str) -> tuple[str, ...]:
    kinds_of(capability)  # an unknown capability is an error here too
    return tuple(dict.fromkeys(t for k in KIND_TOOLS for t in KIND_TOOLS[k]))


def policy_sections(capability: str) -> tuple[str, ...]:
    kinds_of(capability)
    return tuple(dict.fromkeys(s for k in KIND_SECTIONS for s in KIND_SECTIONS[k]))


# ------------------------------------------------------------------------ drawing

_HELD_OUT: frozenset[str] | None = None


def held_out_ids() -> frozenset[str]:
    """Every user and reservation id of every split's database: ids no training draw uses."""
    global _HELD_OUT
    if _HELD_OUT is None:
        from trace_lib.envs.splits import SPLITS

        ids: set[str] = set()
        for split in SPLITS.values():
            db = get_domain("airline").make_db(split.seed)
            ids |= set(db.users) | set(db.reservations)
        _HELD_OUT = frozenset(ids)
    return _HELD_OUT


@dataclass
class Drawn:
    db_seed: int
    db: Any  # the training database (never mutated: episodes copy it)
    task: Any  # the generator's AirlineTask


_DRAWN: OrderedDict[tuple[str, int], Drawn] = OrderedDict()
_CACHE_SIZE = 32  # validation replays one seed per policy: build each once (~2 MB each)
# (capability, seed) -> the attempt that was kept: a later miss redraws only that one.
_KEPT: dict[tuple[str, int], int] = {}


def draw(capability: str, seed: int, attempts: int = 200) -> Drawn:
    """The target task of (capability, instance seed): deterministic, cached."""
    from trace_lib.envs.domains.airline.tasks import generate_tasks

    if int(seed) < 0:
        raise ValueError(f"target-shaped instance seeds are >= 0, got {seed}")
    key = (capability, int(seed))
    if key in _DRAWN:
        _DRAWN.move_to_end(key)
        return _DRAWN[key]
    db_seed = TRAIN_SEED_BASE + int(seed)
    db = get_domain("airline").make_db(db_seed)
    banned = held_out_ids()
    for attempt in range(_KEPT.get(key, 0), attempts):
        task = generate_tasks(db, 1, seed=f"train:{db_seed}:{capability}:{attempt}")[0]
        if capability not in capabilities_of([op.kind for op in task.operations]):
            continue
        if {task.user_id, *db.users[task.user_id].reservations} & banned:
            continue  # an id a split's database also has: never train on it
        drawn = Drawn(db_seed, db, replace(task, task_id=f"airline_train_{db_seed}_{attempt}"))
        _DRAWN[key], _KEPT[key] = drawn, attempt
        while len(_DRAWN) > _CACHE_SIZE:
            _DRAWN.popitem(last=False)
        return drawn
    raise RuntimeError(f"no {capability} target task in {attempts} draws over training "
                       f"database {db_seed}")


# ----------------------------------------------------------------------- requests

GREETINGS = (
    "Hi, this is {first} {last}, user id {uid}.",
    "Hello, my user id is {uid} ({first} {last}).",
    "I'm {first} {last} (user {uid}).",
)
INTROS = (
    "I have {n} things to sort out, please do all of them:",
    "There are {n} things I need, please handle all of them:",
    "Please take care of these {n} requests:",
)
CONFIRMS = (
    "I confirm these changes: go ahead with whatever the policy allows, no need to ask me "
    "again.",
    "You have my confirmation for all of this; do what the policy allows without asking me "
    "again.",
    "Yes, I confirm: go ahead with whatever is allowed, no need to check back with me.",
)
SENTENCES: dict[str, tuple[str, ...]] = {
    "cancel": (
        "Please cancel reservation {rid}: {reason}.",
        "I need to cancel my booking {rid} because {reason}.",
        "Can you cancel {rid} for me? The reason: {reason}.",
    ),
    "add_bags": (
        "Please add {k} checked bag{s} to reservation {rid} and charge any fee to {pay}.",
        "I'd like {k} more checked bag{s} on reservation {rid}; put any fee on {pay}.",
        "Reservation {rid}: add {k} checked bag{s}, and use {pay} for any charge.",
    ),
    "change_passenger": (
        "On reservation {rid}, the passenger {old} should be {new} (born {dob}); I typed the "
        "name wrong.",
        "I made a typo on reservation {rid}: {old} should read {new}, date of birth {dob}.",
        "Please correct a passenger's name on {rid}: {old} is really {new} (born {dob}).",
    ),
    "change_flight_denied": (
        "Please move reservation {rid} from {day} to {new_day}, same flight {fno}.",
        "Can you push reservation {rid} by a day, to {new_day}? Same flight, {fno}.",
        "I want to fly one day later on reservation {rid}: flight {fno} on {new_day} instead "
        "of {day}.",
    ),
    "upgrade_cabin": (
        "Please upgrade reservation {rid} to business class on all its flights and charge the "
        "difference to {pay}.",
        "I'd like to move reservation {rid} up to business class for every flight; pay the "
        "difference with {pay}.",
        "Upgrade {rid} to business on all flights, please, charging {pay} for the difference.",
    ),
}
SENTENCES["cancel_denied"] = SENTENCES["cancel"]
PAYMENTS = ("my {brand} card ending in {last_four}", "the {brand} card that ends in {last_four}")


def _payment(hint: dict[str, Any], rng: random.Random) -> str:
    if hint["source"] == "credit_card":
        return rng.choice(PAYMENTS).format(**hint)
    return f"my gift card {hint['payment_id']}"


def _sentence(db: Any, op: Any, rng: random.Random) -> str:
    res = db.reservations[op.reservation_id]
    values: dict[str, Any] = {"rid": op.reservation_id, **op.params}
    if "payment" in op.params:
        values["pay"] = _payment(op.params["payment"], rng)
    if op.kind == "add_bags":
        values |= {"k": op.params["add"], "s": "s" if op.params["add"] > 1 else ""}
    if op.kind == "change_passenger":
        old, new = res.passengers[op.params["index"]], op.params["new"]
        values |= {"old": f"{old.first_name} {old.last_name}",
                   "new": f"{new['first_name']} {new['last_name']}", "dob": new["dob"]}
    if op.kind == "change_flight_denied":
        values |= {"day": res.flights[0].date, "new_day": op.params["new_date"],
                   "fno": res.flights[0].flight_number}
    return rng.choice(SENTENCES[op.kind]).format(**values)


def _told(db: Any, op: Any, write: dict[str, Any] | None) -> str:
    """What the records show for `op`, written out (difficulty 4)."""
    res = db.reservations[op.reservation_id]
    args = (write or {}).get("arguments", {})
    if op.kind == "add_bags":
        return (f"(It has {res.total_baggages} checked bags now, {res.nonfree_baggages} paid: "
                f"make it {args['total_baggages']} in total, {args['nonfree_baggages']} paid, "
                f"charged to payment id {args['payment_id']}.)")
    if op.kind == "change_passenger":
        people = "; ".join(f"{p['first_name']} {p['last_name']}, born {p['dob']}"
                           for p in args["passengers"])
        return f"(The passenger list then reads, in this order: {people}.)"
    if op.kind == "upgrade_cabin":
        legs = ", ".join(f"{f['flight_number']} on {f['date']}" for f in args["flights"])
        return f"(Its flights are {legs}; that card is payment id {args['payment_id']}.)"
    legs = ", ".join(f"{leg.flight_number} on {leg.date} "
                     f"({db.flights[leg.flight_number].dates[leg.date].status})"
                     for leg in res.flights)
    return (f"(The records show: created {res.created_at}, {res.flight_type}, cabin "
            f"{res.cabin}, insurance {res.insurance}, flights {legs}.)")


def render_request(db: Any, task: Any, rng: random.Random, told: bool) -> str:
    """The task's request in one of the templates; with `told`, the looked-up values too."""
    from trace_lib.envs.domains.airline.tasks import write_call

    user = db.users[task.user_id]
    ops = task.operations
    parts = []
    for op in ops:
        text = _sentence(db, op, rng)
        if told:
            write = (write_call(db, user, db.reservations[op.reservation_id], op)
                     if op.allowed else None)
            text = f"{text} {_told(db, op, write)}"
        parts.append(text)
    lines = [rng.choice(GREETINGS).format(first=user.name.first_name,
                                          last=user.name.last_name, uid=user.user_id)]
    if len(ops) > 1:
        lines.append(rng.choice(INTROS).format(n=len(ops)))
        lines += [f"{i + 1}. {p}" for i, p in enumerate(parts)]
    else:
        lines.append(parts[0])
    lines.append(rng.choice(CONFIRMS))
    return "\n".join(lines)


def reference_reply(task: Any) -> str:
    out = []
    for op in task.operations:
        rid = op.reservation_id
        if op.allowed:
            out.append(f"Done for reservation {rid}.")
        else:
            verb = "cancel" if op.kind == "cancel_denied" else "change the flight of"
            out.append(f"I'm sorry, but I cannot {verb} reservation {rid}: the policy does "
                       "not allow it.")
    return " ".join(out)


# -------------------------------------------------------------------- environment


class TargetShapedEnvironment(TaskEnvironment):
    """A capability's target-shaped level: one filtered target task per seed."""

    def __init__(self, capability: str, config: EnvConfig, name: str | None = None,
                 version: int = 1, description: str = "") -> None:
        if config.difficulty not in LEVEL_NAMES:
            raise ValueError(f"target-shaped difficulties are {sorted(LEVEL_NAMES)}, got "
                             f"{config.difficulty}")
        if not kinds_of(capability):
            raise KeyError(f"capability {capability!r} has no target-shaped airline tasks")
        super().__init__(name=name or f"airline/{capability}", capability=capability,
                         domain="airline", builder=self._build, config=config,
                         version=version, description=description)
        self.drawn: Drawn | None = None

    def reset(self, seed: int) -> None:
        # TaskEnvironment.reset replays the reference on a copy to find the expected
        # state; the generator already did (its replay is the task's expected hash), and a
        # default-size database costs ~25 ms per copy or hash, so reset skips that.
        self.drawn = draw(self.capability, int(seed))
        self.seed = int(seed)
        self.db = copy_db(self.drawn.db)
        self.toolkit = self._domain.tools(self.db)
        self.task = self._build(self.db, random.Random(0), self.config.difficulty)
        self.expected_hash = self.drawn.task.expected_db_hash
        self.calls, self.final_answer, self._done = [], None, False

    def _build(self, db: Any, rng: random.Random, difficulty: int) -> Task:
        assert self.drawn is not None
        task = self.drawn.task
        # The phrasing depends on (capability, seed) only: levels 4 and 5 share it.
        phrasing = random.Random(f"target-shaped:{self.capability}:{self.seed}")
        denied = [op.reservation_id for op in task.operations if not op.allowed]
        return Task(
            request=render_request(db, task, phrasing, told=difficulty == TOLD),
            actions=[dict(a) for a in task.expected_actions],
            answer=reference_reply(task),
            required_reads=([{"name": "get_reservation_details",
                              "arguments": {"reservation_id": rid}} for rid in denied]
                            if not task.expected_writes else []),
            refusal_of=" ".join(denied) if not task.expected_writes else None,
            hint=("Read the user's profile and each reservation first; check the policy "
                  "against the records; make each allowed change with values from the "
                  "records; refuse what the policy does not allow, naming the reservation."),
            facts={"task_id": task.task_id, "db_seed": self.drawn.db_seed,
                   "user_id": task.user_id, "operations": [op.kind for op in task.operations],
                   "reservation_ids": [op.reservation_id for op in task.operations],
                   "level": LEVEL_NAMES[difficulty]},
        )

    def summary(self) -> dict[str, Any]:
        from trace_lib.envs.domains.airline.tasks import score

        task = self._task()
        assert self.drawn is not None
        ok = [{"name": c["name"], "arguments": c["arguments"]} for c in self.calls
              if not is_error(c["observation"]) and isinstance(c["arguments"], dict)]
        verdict = score(self.drawn.task, self.db, ok)  # the target task's own verdict
        checks = [{"check": "database", "score": float(verdict["db_match"]),
                   "reason": "database matches the expected state" if verdict["db_match"]
                   else "database differs from the expected state"}]
        writes = [a for a in task.actions if a["name"] in self._domain.write_tools()]
        for gold in writes:
            score_, why = self._write_score(gold)
            checks.append({"check": "write", "score": score_, "reason": why})
        for read in _reads_before(writes):
            score_, why = self._read_score(read)
            checks.append({"check": "read_before_write", "score": score_, "reason": why})
        answer = self.final_answer or ""
        refused = any(answer_contains(answer, p) for p in REFUSAL_PHRASES)
        if task.refusal_of is not None:  # no write anywhere: doing nothing must not pass
            for read in task.required_reads:
                score_, why = self._read_score(read)
                checks.append({"check": "read_before_write", "score": score_, "reason": why})
            unnamed = [r for r in task.refusal_of.split() if not answer_contains(answer, r)]
            checks.append({"check": "refusal", "score": float(refused and not unnamed),
                           "reason": ("reply refuses and names " + task.refusal_of)
                           if refused and not unnamed else
                           (f"reply does not name {', '.join(unnamed)}" if unnamed
                            else "reply does not refuse")})
        # A pass is the target verdict plus, on a refusal-only task, the reads and the
        # named refusal; the reads before a write are partial credit only (reads are free
        # on the target tasks).
        passed = verdict["reward"] == 1.0 and all(
            c["score"] == 1.0 for c in checks
            if c["check"] in ("database", "refusal")
            or (c["check"] == "read_before_write" and task.refusal_of is not None))
        reward = 1.0 if passed else min(0.99, _partial_credit(
            checks, has_writes=bool(writes), wrote=any(c["write"] for c in self.calls),
            refused=refused))
        return {"reward": round(reward, 6), "passed": passed, "steps": self.steps,
                "reasons": [c["reason"] for c in checks], "checks": checks,
                "target_verdict": verdict["reward"], "final_answer": self.final_answer}


def _reads_before(writes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The record each write changes, read first: one `get_reservation_details` per
    reservation the expected writes touch (partial credit only)."""
    rids = dict.fromkeys(str(w["arguments"]["reservation_id"]) for w in writes
                         if isinstance(w.get("arguments"), dict)
                         and "reservation_id" in w["arguments"])
    return [{"name": "get_reservation_details", "arguments": {"reservation_id": rid}}
            for rid in rids]


def _partial_credit(checks: list[dict[str, Any]], *, has_writes: bool, wrote: bool,
                    refused: bool) -> float:
    """The reward of an episode that did not pass (module docstring: no reward without
    the work)."""
    by = {kind: [c["score"] for c in checks if c["check"] == kind]
          for kind in ("database", "write", "read_before_write", "refusal")}
    if has_writes:
        writes = by["write"]
        reads = by["read_before_write"] if sum(writes) > 0 else [0.0] * len(
            by["read_before_write"])
        scores = writes + reads
        reward = sum(scores) / len(scores)
        return reward * (1.0 if by["database"][0] == 1.0 else 0.5)
    if wrote:  # the task is to refuse, and the agent changed the database
        return 0.0
    reads = by["read_before_write"]
    named_refusal = by["refusal"][0] if by["refusal"] else 0.0
    scores = ([r if refused else 0.0 for r in reads]
              + [named_refusal if all(r == 1.0 for r in reads) else 0.0])
    return sum(scores) / len(scores)
