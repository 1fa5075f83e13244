"""What a policy did on `airline/precondition_verification`, per held-out seed.

    python bench/precondition_behaviour.py bench/results/learning-s6.transcripts.jsonl sft_only

Reads the greedy transcripts `bench/learning.py` writes beside its `--out` and counts, for
each seed, whether the instance was eligible, which reservation was read, whether the
policy cancelled or refused, and whether it passed; then lists the refusal reasons given.

Design decisions
- The instance is rebuilt from its seed (`make_capability_env(...).reset(seed)`) rather
  than trusted from the transcript: eligibility and the requested reservation come from the
  environment's own facts, so the counts cannot inherit a mistake of the policy's.
- The environment settings default to the learning bench's (difficulty 1, capability tools,
  policy excerpt, one distractor); other settings rebuild other instances, so pass the same
  ones the transcripts were made with.
- A reward that a memorised sentence can earn is a loophole, not learning: the distinct
  refusal reasons are printed so that "every refusal says the same thing" is visible.
"""

from __future__ import annotations

import argparse
import collections
import json
from pathlib import Path
from typing import Any


def _final_text(messages: list[dict[str, Any]]) -> str:
    for m in reversed(messages):
        if m["role"] == "assistant" and m.get("content"):
            return str(m["content"])
    return ""


def behaviour(rows: list[dict[str, Any]], env: Any) -> tuple[collections.Counter, collections.Counter]:
    """(counts per (eligibility, reservation read, final action, verdict), refusal reasons).

    A refusal is what the verifier and `learning.behaviour` call one: a reply containing
    one of the environment's `REFUSAL_PHRASES`.
    """
    from trace_lib.envs.capabilities.task_env import REFUSAL_PHRASES, answer_contains

    counts: collections.Counter = collections.Counter()
    reasons: collections.Counter = collections.Counter()
    for row in rows:
        env.reset(row["seed"])
        facts = env.ground_truth["facts"]
        rid = facts["reservation_id"]
        calls = [tc["function"] for m in row["messages"] if m["role"] == "assistant"
                 for tc in (m.get("tool_calls") or [])]
        reads = [c["arguments"] for c in calls if c["name"] == "get_reservation_details"]
        read = ("read_requested" if any(rid in a for a in reads)
                else "read_another" if reads else "no_reservation_read")
        final = _final_text(row["messages"])
        refused = any(answer_contains(final, phrase) for phrase in REFUSAL_PHRASES)
        action = ("cancel" if any(c["name"] == "cancel_reservation" for c in calls)
                  else "refuse" if refused else "neither")
        counts[("eligible" if facts["eligible"] else "ineligible", read, action,
                "passed" if row["passed"] else "failed")] += 1
        if refused:
            reasons[final.split(":", 1)[-1].strip()] += 1
    return counts, reasons


def main(argv: list[str] | None = None) -> int:
    from trace_lib.envs.capabilities import make_capability_env

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("transcripts", type=Path)
    p.add_argument("condition", help="e.g. base, sft_only, sft_grpo")
    p.add_argument("--difficulty", type=int, default=1)
    p.add_argument("--tools", default="capability", choices=["capability", "all"])
    p.add_argument("--policy", default="excerpt", choices=["excerpt", "full"])
    p.add_argument("--distractors", type=int, default=1)
    args = p.parse_args(argv)
    rows = [json.loads(line) for line in args.transcripts.read_text().splitlines() if line]
    rows = [r for r in rows if r["condition"].split()[-1] == args.condition]
    if not rows:
        p.error(f"{args.transcripts}: no transcript of condition {args.condition!r}")
    env = make_capability_env("airline", "precondition_verification",
                              difficulty=args.difficulty, tools=args.tools,
                              policy=args.policy, distractors=args.distractors)
    counts, reasons = behaviour(rows, env)
    print(f"{len(rows)} greedy episodes of {args.condition}")
    for key, n in sorted(counts.items()):
        print(f"{n:4d}  {' / '.join(key)}")
    print(f"refusals: {sum(reasons.values())}, distinct reasons: {len(reasons)}")
    for reason, n in reasons.most_common(5):
        print(f"{n:4d}  {reason[:120]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
