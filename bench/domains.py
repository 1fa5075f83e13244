"""Domain machinery speed: per-episode database copies, tool dispatch, demo generation.

Run:  python bench/domains.py [--repeats 20]

Side by side on the same machine and the same seeded airline database (default size):
  1. Copying the database for an episode: `copy_db` (a JSON round trip through
     pydantic-core) vs the peer `model_copy(deep=True)` (pydantic's Python deepcopy).
  2. Dispatching a tool call: `invoke` (strict argument validation against the generated
     schema model + JSON observation) vs the peer: calling the method directly and dumping
     its result (no validation), to show what validation costs per call.
  3. Hashing a database state (`db_hash`) and playing one scripted demo trajectory, as
     absolute figures.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from trace_lib.envs.domains import copy_db, db_hash, get_domain, invoke  # noqa: E402
from trace_lib.envs.domains.airline.scripted_agent import play  # noqa: E402
from trace_lib.envs.domains.airline.tasks import generate_tasks  # noqa: E402


def timed(fn, repeats: int) -> float:
    """Median seconds of `repeats` calls (one warm-up call first)."""
    fn()
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=20)
    args = ap.parse_args()
    dom = get_domain("airline")
    db = dom.make_db(seed=0)
    size_kb = len(db.model_dump_json()) / 1e3
    print(f"airline database: {len(db.flights)} flights, {len(db.users)} users, "
          f"{len(db.reservations)} reservations, {size_kb:.0f} kB of JSON")

    ours = timed(lambda: copy_db(db), args.repeats)
    peer = timed(lambda: db.model_copy(deep=True), args.repeats)
    print(f"copy per episode   copy_db {ours * 1e3:7.2f} ms | model_copy(deep=True) "
          f"{peer * 1e3:7.2f} ms | speed-up x{peer / ours:.1f}")

    kit = dom.tools(copy_db(db))
    rid = next(iter(db.reservations))
    n = 200

    def via_invoke():
        for _ in range(n):
            invoke(kit, "get_reservation_details", {"reservation_id": rid})

    def direct():
        for _ in range(n):
            json.dumps(kit.get_reservation_details(rid).model_dump(mode="json"))

    ours = timed(via_invoke, max(3, args.repeats // 4)) / n
    peer = timed(direct, max(3, args.repeats // 4)) / n
    print(f"tool call          invoke  {ours * 1e6:7.1f} us | direct call + dumps "
          f"{peer * 1e6:7.1f} us | validation overhead x{ours / peer:.2f}")

    print(f"db_hash            {timed(lambda: db_hash(db), args.repeats) * 1e3:7.2f} ms")
    tasks = generate_tasks(db, 6, seed=0)
    per = timed(lambda: [play(t, db, dom.policy, agent="scripted-hasty") for t in tasks],
                max(3, args.repeats // 5)) / len(tasks)
    print(f"scripted episode   {per * 1e3:7.1f} ms per trajectory "
          f"(~{300 * per:.0f} s for the 300-trajectory demo)")


if __name__ == "__main__":
    main()
