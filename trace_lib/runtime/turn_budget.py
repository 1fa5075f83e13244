"""The one rule for a run's default tokens per assistant turn.

A fixed default cut the right answer of environments whose reference turn is longer
(issue 30: `train`'s 64, `moe-eval`'s 96, the Routing page's 32, `evaluate`'s 128 against
airline's 154-token `update_reservation_passengers` call and retail's 194-token answers):
every rollout that tries it is cut mid-JSON and earns nothing. So a run given no
`max_tokens` measures the longest reference turn of what it runs on, in the policy's
tokens, and adds a margin. Measuring is the caller's (an environment's reference episodes:
`train.local_rollouts.reference_turn_budget`; the target tasks' expected actions and
answers: `evaluate.runner.turn_budget`); the rule is here, torch-free, for both.
"""

from __future__ import annotations

import math

RULE = "longest reference turn + 25%, rounded up to 32 (64 without one)"


def derived_max_tokens(longest_turn: int) -> int:
    """The per-turn token budget for runs whose longest reference turn is `longest_turn`
    tokens: +25% (a sampled turn is rarely the shortest way to say it), rounded up to 32;
    64 when there is no reference to measure."""
    if longest_turn <= 0:
        return 64
    return max(64, 32 * math.ceil(longest_turn * 1.25 / 32))
