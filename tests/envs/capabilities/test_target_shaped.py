"""The target-shaped levels (difficulty 4 and 5): target tasks over training databases,
filtered by capability, verified by the target task's own verdict."""

from __future__ import annotations

import json

import pytest

from trace_lib.envs.capabilities import make_capability_env
from trace_lib.envs.capabilities import target_shaped as ts
from trace_lib.envs.domains import get_domain
from trace_lib.envs.domains.airline.tasks import OP_KINDS, generate_tasks
from trace_lib.envs.policies import TRIVIAL_POLICIES, make_policy, run_episode
from trace_lib.envs.splits import SPLITS
from trace_lib.envs.validate import ValidationConfig, validate_environment
from trace_lib.evaluate.tasks import load_task_set

CAPS = ("multi_step_task_completion", "precondition_verification",
        "structured_data_reasoning", "tool_calling_precision")


def _fresh_caches() -> None:
    ts._DRAWN.clear()
    ts._KEPT.clear()


def test_the_kind_table_covers_the_generator_and_its_opportunities():
    assert set(ts.KIND_CAPABILITIES) == set(OP_KINDS) == set(ts.KIND_TOOLS) == set(
        ts.KIND_SECTIONS)
    db = get_domain("airline").make_db(ts.TRAIN_SEED_BASE + 77)
    for task in generate_tasks(db, 30, seed="table-check"):
        kinds = [op.kind for op in task.operations]
        recorded = {o for op in task.operations for o in op.opportunities}
        assert recorded <= ts.capabilities_of(kinds), (kinds, recorded)


@pytest.mark.parametrize("capability", CAPS)
def test_instances_come_from_the_seed_alone(capability):
    a = make_capability_env("airline", capability, difficulty=5)
    a.reset(5)
    first = (a.messages, json.dumps(a.ground_truth, sort_keys=True))
    _fresh_caches()  # a new process draws the same task
    b = make_capability_env("airline", capability, difficulty=5)
    b.reset(5)
    assert (b.messages, json.dumps(b.ground_truth, sort_keys=True)) == first
    b.reset(6)
    assert b.messages != first[0]


@pytest.mark.parametrize("capability", CAPS)
def test_the_filter_keeps_tasks_exercising_the_capability(capability):
    env = make_capability_env("airline", capability, difficulty=5)
    for seed in range(12):
        env.reset(seed)
        kinds = env.ground_truth["facts"]["operations"]
        assert capability in ts.capabilities_of(kinds), kinds
        if capability == "multi_step_task_completion":
            assert len(kinds) >= 2


def test_no_task_user_or_reservation_id_is_shared_with_any_split():
    held: set[str] = set()
    task_ids: set[str] = set()
    for split in SPLITS:
        tset = load_task_set("airline", split=split)
        held |= set(tset.db.users) | set(tset.db.reservations)
        task_ids |= {t.task_id for t in tset.tasks}
    assert held == set(ts.held_out_ids())
    split_seeds = {s.seed for s in SPLITS.values()}
    for capability in CAPS:
        for seed in range(10):
            drawn = ts.draw(capability, seed)
            assert drawn.db_seed >= ts.TRAIN_SEED_BASE and drawn.db_seed not in split_seeds
            assert drawn.task.task_id.startswith("airline_train_")
            assert drawn.task.task_id not in task_ids
            user = drawn.db.users[drawn.task.user_id]
            assert not ({user.user_id, *user.reservations} & held)


@pytest.mark.slow
@pytest.mark.parametrize("capability", CAPS)
@pytest.mark.parametrize("difficulty", [4, 5])
def test_validation_passes(capability, difficulty):
    """validate.py's rules (reference solves, null/random <= 0.10, every loophole probe
    <= 0.05, determinism, schema fidelity, distinct instances) on 12 seeds (the 50-seed
    run is in the bench notes: ~1 minute per level on 2 cores)."""
    env = make_capability_env("airline", capability, difficulty=difficulty)
    report = validate_environment(env, ValidationConfig(n_seeds=12, determinism_seeds=2))
    assert report["status"] == "validated", report["errors"]
    checks = report["checks"]
    assert checks["reference_solves"]["figure"] == 1.0
    assert checks["reference_solves"]["mean_reward"] == 1.0
    for name in TRIVIAL_POLICIES:
        assert checks[f"loophole_{name}"]["figure"] <= 0.05


def _seed_where(env, predicate, limit=80):
    for seed in range(limit):
        env.reset(seed)
        if predicate(env):
            return seed
    raise AssertionError("no seed with the wanted instance")


def test_a_refusal_only_task_needs_the_reads_and_a_named_refusal():
    env = make_capability_env("airline", "precondition_verification", difficulty=5)
    seed = _seed_where(env, lambda e: e.task.refusal_of is not None)
    # Doing nothing passes the target verdict (the do-nothing floor) but earns nothing here.
    null = run_episode(env, seed, make_policy("null"))
    assert null["target_verdict"] == 1.0 and null["reward"] == 0.0
    env.reset(seed)
    rid = env.task.refusal_of.split()[0]
    env.step({"content": f"I'm sorry, I cannot change reservation {env.task.refusal_of}."})
    assert env.summary()["reward"] == 0.0  # refused without reading
    ref = run_episode(env, seed, make_policy("reference"))
    assert ref["passed"] and ref["reward"] == 1.0 and ref["target_verdict"] == 1.0
    assert rid in ref["final_answer"]


def test_a_wrong_write_fails_as_on_the_target_tasks():
    env = make_capability_env("airline", "tool_calling_precision", difficulty=5)
    seed = _seed_where(env, lambda e: any(
        a["name"] == "update_reservation_baggages" for a in e.task.actions))
    env.reset(seed)
    for action in env.task.actions:
        action = json.loads(json.dumps(action))
        if action["name"] == "update_reservation_baggages":
            action["arguments"]["total_baggages"] += 1  # one bag too many
        env.step(action)
    env.step({"content": "Done."})
    summary = env.summary()
    assert not summary["passed"] and summary["target_verdict"] == 0.0
    # Partial credit: the bag write's other arguments, the reads before it, halved for
    # the wrong database; never near a pass.
    bags = next(c for c in summary["checks"] if c["check"] == "write"
                and "update_reservation_baggages" in c["reason"])
    assert 0 < bags["score"] < 1 and "total_baggages" in bags["reason"]
    assert 0 < summary["reward"] <= 0.5


def _one_write_seed(env, tool):
    writes = env._domain.write_tools()
    return _seed_where(env, lambda e: [a["name"] for a in e.task.actions
                                       if a["name"] in writes] == [tool])


def _play(env, seed, actions, reply="Done."):
    env.reset(seed)
    for action in actions:
        env.step(json.loads(json.dumps(action)))
    env.step({"content": reply})
    return env.summary()


def test_partial_credit_pays_the_write_first_then_the_reads_before_it():
    """What a short SFT needs a gradient for: nothing and reading-then-stopping earn 0; a
    write's right arguments earn a share, more after reading the reservation it changes;
    only the verdict's pass earns 1."""
    env = make_capability_env("airline", "tool_calling_precision", difficulty=5)
    seed = _one_write_seed(env, "update_reservation_baggages")
    env.reset(seed)
    actions = env.task.actions
    writes = env._domain.write_tools()
    reads = [a for a in actions if a["name"] not in writes]
    write = json.loads(json.dumps(next(a for a in actions if a["name"] in writes)))
    rid = write["arguments"]["reservation_id"]
    assert {"name": "get_reservation_details", "arguments": {"reservation_id": rid}} in reads
    write["arguments"]["total_baggages"] += 1  # one bag too many: a wrong database

    assert _play(env, seed, [])["reward"] == 0.0
    assert _play(env, seed, reads)["reward"] == 0.0
    blind = _play(env, seed, [write])
    read_first = _play(env, seed, [*reads, write])
    assert 0 < blind["reward"] < read_first["reward"] <= 0.5
    assert not read_first["passed"] and read_first["target_verdict"] == 0.0
    assert _play(env, seed, actions)["reward"] == 1.0

    # Reads are free on the target tasks: the right cancellation alone passes there and
    # here (the cancel-first reflex of bench/README is wrong where the policy refuses).
    env = make_capability_env("airline", "precondition_verification", difficulty=5)
    seed = _one_write_seed(env, "cancel_reservation")
    env.reset(seed)
    cancel = next(a for a in env.task.actions if a["name"] == "cancel_reservation")
    alone = _play(env, seed, [cancel])
    assert alone["passed"] and alone["reward"] == 1.0 and alone["target_verdict"] == 1.0


def test_a_write_on_a_refusal_task_earns_nothing_and_a_read_needs_a_refusal():
    env = make_capability_env("airline", "precondition_verification", difficulty=5)
    seed = _seed_where(env, lambda e: e.task.refusal_of is not None
                       and len(e.task.refusal_of.split()) == 1)
    env.reset(seed)
    rid = env.task.refusal_of
    read = {"name": "get_reservation_details", "arguments": {"reservation_id": rid}}
    res = env.db.reservations[rid]
    card = next(iter(env.db.users[res.user_id].payment_methods))
    add_bag = {"name": "update_reservation_baggages",  # a write the user did not ask for
               "arguments": {"reservation_id": rid, "total_baggages": res.total_baggages + 1,
                             "nonfree_baggages": res.nonfree_baggages + 1,
                             "payment_id": card}}
    refusal = f"I'm sorry, I cannot cancel reservation {rid}: the policy does not allow it."
    assert _play(env, seed, [read], reply="Let me know.")["reward"] == 0.0  # no refusal
    assert _play(env, seed, [], reply=refusal)["reward"] == 0.0  # no read
    generic = _play(env, seed, [read], reply="Sorry, that is not possible.")
    assert 0 < generic["reward"] < 1 and not generic["passed"]  # read, refusal unnamed
    wrote = _play(env, seed, [read, add_bag], reply=refusal)
    assert wrote["reward"] == 0.0 and not wrote["passed"]
    assert _play(env, seed, [read], reply=refusal)["passed"]


def test_told_and_read_differ_only_by_the_values_written_out():
    told = make_capability_env("airline", "tool_calling_precision", difficulty=4)
    read = make_capability_env("airline", "tool_calling_precision", difficulty=5)
    for seed in range(6):
        told.reset(seed)
        read.reset(seed)
        assert told.task.actions == read.task.actions
        facts = {k: v for k, v in told.ground_truth["facts"].items() if k != "level"}
        assert facts == {k: v for k, v in read.ground_truth["facts"].items() if k != "level"}
        writes = [a for a in read.task.actions if a["name"].startswith("update_")]
        for write in writes:
            pid = write["arguments"].get("payment_id", "")
            if pid.startswith("credit_card"):  # a card named by brand: its id is looked up
                assert pid not in read.messages[1]["content"]
                assert pid in told.messages[1]["content"]
        # The same phrasing: every line of the read request opens the told one's line.
        for a, b in zip(read.messages[1]["content"].splitlines(),
                        told.messages[1]["content"].splitlines(), strict=True):
            assert b.startswith(a)


class _First:
    """An rng whose every choice is the first option."""

    def choice(self, seq):
        return seq[0]


def test_the_generators_phrasing_is_one_of_the_templates():
    for capability in CAPS:
        drawn = ts.draw(capability, 3)
        assert ts.render_request(drawn.db, drawn.task, _First(), told=False) == \
            drawn.task.request


def test_several_request_templates():
    from trace_lib.evaluate.env_distance import request_template

    env = make_capability_env("airline", "tool_calling_precision", difficulty=5)
    templates = set()
    for seed in range(30):
        env.reset(seed)
        templates.add(request_template(env.messages[1]["content"]))
    assert len(templates) >= 15


def test_capability_tools_and_excerpt_still_show_what_the_reference_uses():
    for capability in CAPS:
        env = make_capability_env("airline", capability, difficulty=5, tools="capability",
                                  policy="excerpt")
        shown = {t["function"]["name"] for t in env.tool_schemas}
        for seed in range(6):
            env.reset(seed)
            assert {a["name"] for a in env.task.actions} <= shown
        full = make_capability_env("airline", capability, difficulty=5)
        assert len(env.system_prompt) < len(full.system_prompt)


def test_retail_has_no_target_shaped_level():
    with pytest.raises(ValueError, match="airline only"):
        make_capability_env("retail", "precondition_verification", difficulty=4)
