"""Environment benchmarks: the cost of the sandbox, side by side with the same environment
in-process, and how calibration moves with the policy's noise.

    python bench/envs.py [--episodes 40] [--env airline/precondition_verification]

1. Sandbox overhead. Peer: the built-in environment in this process. Ours: the same task
   builder served from the sandbox (a template module: bwrap namespaces, rlimits, audit
   hook, JSON lines), and for reference the unsafe-local mode (no bwrap). Same seeds, same reference episodes; prints episodes/s and the ratio, plus
   the sandbox's start-up time.
2. Calibration sweep: mean reward and informative-group share for epsilon:P policies, to
   show which P lands in the GRPO band (0.2-0.6 mean, >= 50% informative).
"""

from __future__ import annotations

import argparse
import statistics
import time

from trace_lib.envs.calibrate import CalibrationConfig, calibrate
from trace_lib.envs.capabilities import make_capability_env
from trace_lib.envs.generate import TEMPLATE
from trace_lib.envs.policies import make_policy, run_episode
from trace_lib.envs.sandbox import SandboxedEnvironment, SandboxLimits


def episodes_per_s(env, seeds: list[int]) -> float:
    policy = make_policy("reference")
    run_episode(env, seeds[0], policy)  # warm caches
    start = time.perf_counter()
    for s in seeds:
        assert run_episode(env, s, policy)["passed"]
    return len(seeds) / (time.perf_counter() - start)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--episodes", type=int, default=40)
    ap.add_argument("--env", default="airline/precondition_verification")
    args = ap.parse_args()
    domain, capability = args.env.split("/")
    seeds = list(range(args.episodes))

    builtin = make_capability_env(domain, capability)
    code = TEMPLATE.format(capability=capability, domain=domain, difficulty=2,
                           name=args.env, version=1)
    kernel = SandboxLimits()  # bwrap namespaces + rlimits + audit hook
    unsafe = SandboxLimits(unsafe_local=True)  # no bwrap: the layers inside the worker only
    starts: dict[str, list[float]] = {"bwrap": [], "unsafe-local": []}
    for _ in range(3):
        for mode, limits in (("bwrap", kernel), ("unsafe-local", unsafe)):
            t = time.perf_counter()
            SandboxedEnvironment.from_code(code, limits).close()
            starts[mode].append(time.perf_counter() - t)
    boxed = SandboxedEnvironment.from_code(code, kernel)
    loose = SandboxedEnvironment.from_code(code, unsafe)
    try:
        rates = {"in-process (peer)": [], "sandboxed": [], "unsafe-local": []}
        for _ in range(3):  # interleaved, so machine load hits all alike
            rates["in-process (peer)"].append(episodes_per_s(builtin, seeds))
            rates["sandboxed"].append(episodes_per_s(boxed, seeds))
            rates["unsafe-local"].append(episodes_per_s(loose, seeds))
    finally:
        boxed.close()
        loose.close()
    peer = statistics.median(rates["in-process (peer)"])
    ours = statistics.median(rates["sandboxed"])
    bare = statistics.median(rates["unsafe-local"])
    print(f"## sandbox overhead: {args.env}, {args.episodes} reference episodes x 3")
    print(f"in-process (peer) {peer:8.1f} episodes/s")
    print(f"sandboxed (bwrap) {ours:8.1f} episodes/s   ratio x{peer / ours:.2f} slower")
    print(f"unsafe-local      {bare:8.1f} episodes/s   ratio x{peer / bare:.2f} slower")
    for mode, times in starts.items():
        print(f"start-up {mode:12s} {statistics.median(times) * 1000:6.0f} ms (median of 3)")

    print("\n## calibration sweep (20 seeds x group 8)")
    for eps in (0.2, 0.4, 0.6, 0.8):
        cal = calibrate(builtin, f"epsilon:{eps}", CalibrationConfig(seeds=20, group=8))
        print(f"epsilon:{eps}  mean {cal['mean_reward']:.3f}  informative "
              f"{cal['informative_share']:.0%}  all-success {cal['all_success_share']:.0%}  "
              f"all-fail {cal['all_fail_share']:.0%}  in band: {cal['in_band']}")


if __name__ == "__main__":
    main()
