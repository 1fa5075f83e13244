"""bench/compose_real.py on tiny, in-process: the composition table's every row, end to end.

The script trains the two conflicting smoke adapters with the project's GRPO trainer,
composes them, warm-starts the gates and plays every policy (base, each adapter, the linear
merge, top1 / trajectory / soft) on held-out seeds. Run as a user runs it (a subprocess),
so the bench cannot rot unseen; the vllm engine shares its rows (`composed_episodes`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_compose_real_tiny_writes_a_row_per_policy_environment_and_seed(tmp_path):
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "compose_real.py"), "--tiny", "--seeds", "2",
         "--samples", "1", "--out", str(out)],
        capture_output=True, text=True, timeout=600,
        env={**os.environ, "TRACE_RUNS_DIR": str(tmp_path / "runs")})
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((out / "compose_real.json").read_text())
    per_seed = report["per_seed"]
    assert list(per_seed) == ["base", "adapter use_e", "adapter avoid_e", "linear merge",
                              "composed top1", "composed trajectory", "composed soft"]
    for policy, by_env in per_seed.items():
        assert sorted(by_env) == ["env:avoid_e", "env:use_e"], policy
        for rows in by_env.values():
            assert [r["seed"] for r in rows] == [int(report["args"]["seed_start"]) + i
                                                 for i in range(2)]
            for r in rows:
                # greedy and one sampled episode per seed, each scored by the task's code
                assert r["greedy_reward"] in (0.0, 1.0) and 0.0 <= r["reward"] <= 1.0
                assert isinstance(r["greedy_calls"], list)
                # only a routing mode says where the episode went
                assert ("routed_own" in r) == policy.startswith("composed")
    assert "| composed trajectory |" in proc.stdout
