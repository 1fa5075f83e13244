"""How far an environment level is from the target tasks, measured on the reference policy.

    table = curriculum_distance("airline", seeds=200)   # {"levels": [...], "target": {...}}

Design decisions
- Measured without a model: every figure comes from the prompt and the reference episode
  (the environment's own solution), tokenised with the tokenizer the project trains
  (SmolLM2's) through `train.local_rollouts.reference_episode`, the same token sequence
  SFT trains on. So the table costs CPU seconds and says what a policy would have to
  read and write, not how well one does.
- The same figures for a level and for the target tasks (`evaluate.tasks`, a split's
  tasks in `TargetTaskEnvironment`, all tools), so the two are compared like for like:
  prompt tokens (system prompt + tool schemas + request, as rendered for the model),
  reference episode tokens (prompt, calls, observations, reply), tools shown, reference
  turns (calls + the reply), reads before the first write (every read when the task has
  no write), the share of instances with a required write, and distinct request templates.
- A request template is the request with its values masked (anything with a digit, ids,
  names from the generators' name lists, card brands, cabins, airport codes, insurance
  yes/no, bag plurals): a heuristic that counts phrasings, not values. Target tasks with
  two operations count each combination of operation phrasings as its own template.
- A capability's levels are compared with the split's tasks that exercise that
  capability (the same `KIND_CAPABILITIES` filter the target-shaped level draws with),
  the whole split reported beside them. `gap` is the relative distance
  |level - target| / target per figure of FIGURES; tests/envs/test_distance.py holds that
  its mean falls at every move of the schedule after difficulty 3.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from statistics import mean
from typing import Any

# The figures a level's gap to the target is taken on (means over instances). Templates
# are reported but not compared: a count depends on how many instances were drawn.
FIGURES = ("prompt_tokens", "episode_tokens", "tools_shown", "reference_turns",
           "reads_before_write", "write_share")


def _masked_words() -> set[str]:
    from trace_lib.envs.capabilities.instances import FIRST_NAMES as CAP_NAMES
    from trace_lib.envs.domains.airline.database import CARD_BRANDS, FIRST_NAMES, LAST_NAMES

    return {w.lower() for w in (*CAP_NAMES, *FIRST_NAMES, *LAST_NAMES, *CARD_BRANDS)}


def request_template(text: str, masked: set[str] | None = None) -> str:
    """The request with its values masked (see the module docstring)."""
    masked = _masked_words() if masked is None else masked
    text = re.sub(r"(?i)\binsurance:? (yes|no)\b", "insurance X", text)
    text = re.sub(r"\b(basic[ _]economy|economy|business)\b", "CABIN", text)
    text = re.sub(r"\bbags\b", "bag", text)
    text = re.sub(r"\b[A-Z0-9]{6}\b", "ID", text)  # reservation ids
    text = re.sub(r"\b[A-Z]{3}\b", "AP", text)  # airport codes
    text = re.sub(r"[\w.@:-]*\d[\w.@:-]*", "#", text)  # ids, dates, amounts, counts
    return re.sub(r"[A-Za-z]+", lambda m: "NAME" if m.group(0).lower() in masked
                  else m.group(0), text)


def _write_names(env: Any) -> set[str]:
    from trace_lib.envs.domains import get_domain

    return set(get_domain(env.domain).write_tools())


def episode_figures(env: Any, seed: int, tokenizer: Any) -> dict[str, Any]:
    """The figures of one instance (`env` reset to `seed` by the reference episode)."""
    from trace_lib.train.local_rollouts import reference_episode

    episode = reference_episode(env, seed, tokenizer, max_turns=60)
    if episode is None:
        raise RuntimeError(f"{env.name} seed {seed}: no reference episode")
    seq, mask = episode
    actions = env.ground_truth["reference_actions"]
    writes = _write_names(env)
    first_write = next((i for i, a in enumerate(actions) if a["name"] in writes), len(actions))
    return {"prompt_tokens": mask.index(1), "episode_tokens": len(seq),
            "tools_shown": len(env.tool_schemas), "reference_turns": len(actions) + 1,
            "reads_before_write": first_write,
            "write": any(a["name"] in writes for a in actions),
            "template": request_template(env.messages[1]["content"])}


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "n": len(rows),
        "prompt_tokens": round(mean(r["prompt_tokens"] for r in rows), 1),
        "prompt_tokens_max": max(r["prompt_tokens"] for r in rows),
        "episode_tokens": round(mean(r["episode_tokens"] for r in rows), 1),
        "episode_tokens_max": max(r["episode_tokens"] for r in rows),
        "tools_shown": round(mean(r["tools_shown"] for r in rows), 2),
        "reference_turns": round(mean(r["reference_turns"] for r in rows), 2),
        "reference_turns_max": max(r["reference_turns"] for r in rows),
        "reads_before_write": round(mean(r["reads_before_write"] for r in rows), 2),
        "write_share": round(mean(float(r["write"]) for r in rows), 3),
        "templates": len({r["template"] for r in rows}),
    }


def env_distance(env: Any, seeds: Iterable[int], tokenizer: Any) -> dict[str, Any]:
    return summarise([episode_figures(env, s, tokenizer) for s in seeds])


def target_rows(domain: str, split: str, tokenizer: Any, n: int | None = None,
                ) -> list[dict[str, Any]]:
    """Per target task of a split (every tool shown, as evaluated): its figures and the
    capabilities its operations exercise (`target_shaped.capabilities_of`; airline)."""
    from trace_lib.evaluate.tasks import load_task_set

    ts = load_task_set(domain, n=n, split=split)
    rows = []
    for task in ts.tasks:
        row = episode_figures(ts.environment(task, tools="all"), 0, tokenizer)
        if domain == "airline":
            from trace_lib.envs.capabilities.target_shaped import capabilities_of

            row["capabilities"] = sorted(capabilities_of(task.operations))
        else:
            row["capabilities"] = list(task.opportunities)
        rows.append(row)
    return rows


def gaps(level: dict[str, Any], target: dict[str, Any]) -> dict[str, float]:
    """|level - target| / target per figure of FIGURES."""
    return {f: round(abs(level[f] - target[f]) / max(abs(target[f]), 1e-9), 3)
            for f in FIGURES}


def default_tokenizer() -> Any:
    from trace_lib.runtime.base_models import load_tokenizer, resolve_model

    return load_tokenizer(resolve_model("smollm2-135m"))


def curriculum_distance(domain: str = "airline", seeds: int = 200,
                        capabilities: Iterable[str] | None = None, split: str = "dev",
                        tokenizer: Any = None, seed_start: int = 0,
                        target_n: int | None = None) -> dict[str, Any]:
    """Every curriculum level of every capability of `domain`, and the `split` target
    tasks (the first `target_n`; all by default): the figures and each level's gaps to the
    target."""
    from trace_lib.envs.capabilities import builtin_pairs, make_capability_env
    from trace_lib.envs.curriculum import CURRICULUM, DIFFICULTY_NAMES

    tok = tokenizer or default_tokenizer()
    tasks = target_rows(domain, split, tok, n=target_n)
    caps = list(capabilities or sorted(c for d, c in builtin_pairs() if d == domain))
    # A capability's levels are compared with the split's tasks that exercise it (the
    # target-shaped level draws exactly those); the whole split is reported beside them.
    targets = {"all": summarise(tasks)}
    targets |= {cap: summarise([r for r in tasks if cap in r["capabilities"]]) for cap in caps}
    rows = []
    for cap in caps:
        for i, level in enumerate(CURRICULUM.for_domain(domain)):
            figures = env_distance(make_capability_env(domain, cap, **level.options),
                                   range(seed_start, seed_start + seeds), tok)
            rows.append({"capability": cap, "step": i + 1, "level": level.name,
                         **level.options, "kind": DIFFICULTY_NAMES[level.difficulty],
                         **figures, "gap": gaps(figures, targets[cap]),
                         "gap_to_all": gaps(figures, targets["all"])})
    return {"domain": domain, "split": split, "seeds": seeds, "seed_start": seed_start,
            "schedule": CURRICULUM.as_list(), "targets": targets, "levels": rows}
