"""How far each curriculum level is from the target tasks (issue 29, item 4).

    python bench/env_distance.py [--seeds 200] [--split dev] [--capability NAME ...]

For each airline capability environment and each level of the curriculum
(`trace_lib.envs.curriculum.CURRICULUM`), and for the split's target tasks: prompt tokens,
reference-episode tokens (SmolLM2's tokenizer, the sequence SFT trains on), tools shown,
reference turns, reads before the first write, the share of instances with a required
write, and distinct request templates over the seeds. Each level is compared with the
split's tasks that exercise its capability (`target_shaped.KIND_CAPABILITIES`). No model
forward: CPU-cheap. Prints a markdown table; writes bench/results/env-distance.json.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from trace_lib.evaluate.env_distance import FIGURES, curriculum_distance

OUT = Path(__file__).resolve().parent / "results" / "env-distance.json"
SHORT = {"prompt_tokens": "prompt tok", "episode_tokens": "episode tok",
         "tools_shown": "tools", "reference_turns": "turns",
         "reads_before_write": "reads<write", "write_share": "write share",
         "templates": "templates"}


def _row(label: str, level: str, f: dict, gap: dict | None) -> str:
    cells = [f"{f['prompt_tokens']:.0f}", f"{f['episode_tokens']:.0f}", f"{f['tools_shown']:g}",
             f"{f['reference_turns']:.2f}", f"{f['reads_before_write']:.2f}",
             f"{f['write_share']:.2f}", str(f["templates"])]
    mean_gap = "" if gap is None else f"{sum(gap.values()) / len(gap):.3f}"
    return f"| {label} | {level} | {f['n']} | " + " | ".join(cells) + f" | {mean_gap} |"


def table(result: dict) -> str:
    head = ("| capability | level | n | " + " | ".join(SHORT[k] for k in
            (*FIGURES, "templates")) + " | mean gap |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    split = result["split"]
    lines.append(_row(f"**{split} target tasks (all)**", "target", result["targets"]["all"],
                      None))
    for cap in dict.fromkeys(r["capability"] for r in result["levels"]):
        lines.append(_row(f"**{split} tasks exercising {cap}**", "target",
                          result["targets"][cap], None))
        for r in (r for r in result["levels"] if r["capability"] == cap):
            lines.append(_row(cap, f"{r['step']}. {r['level']} ({r['kind']})", r, r["gap"]))
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=200, help="instances per level")
    ap.add_argument("--split", default="dev", help="the target tasks compared with")
    ap.add_argument("--capability", action="append", default=None,
                    help="only this capability (repeatable; default: every airline one)")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    started = time.monotonic()
    result = curriculum_distance("airline", seeds=args.seeds, capabilities=args.capability,
                                 split=args.split)
    result["seconds"] = round(time.monotonic() - started, 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    print(table(result))
    print(f"\n{result['seconds']} s; written to {args.out}")


if __name__ == "__main__":
    main()
