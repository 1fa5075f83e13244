"""Training: launch GRPO LoRA jobs, watch them live, cancel them, see finished adapters.

Thin page: every action is a use case of `trace_lib.workbench`: the form builds the
config with `training.build_config` and launching is `jobs.submit_training` (both what
`train --background` calls; only approved environments, or an explicit smoke run on an
unreviewed built-in), the job list is the one job sync `jobs.sync` (`job list`), the live
panel is `job_progress.live_status` over the run directory (what the notebook draws),
cancel is `jobs.cancel` (`job cancel`).
The jobs table, the "Watch job" selector and the live panel are one fragment over one
snapshot (`jobs.job_views`): a full run shows the statuses the sync read and recorded,
never a status kept from the launch; the fragment, re-read every two seconds while a job
is active, reads run directories only (no database access, so it never holds the store's
lock), so table and panel always show the same step count; when a watched job ended
(`jobs.any_ended`) the page reruns in full, and its sync records the job. Launch moves the selector
to the new job. A job that learned nothing reads "succeeded — no learning signal" with a
warning (`learning_signal`), and the eval-before phase has its own progress (`phase`).
The environment, model and build options sit above the form so that changing them
re-checks at once whether the environment's prompt fits the model's context
(`context_check`), before Launch.
"""

from __future__ import annotations

import pandas as pd
import streamlit as st

from trace_lib.workbench import data, environments, job_progress, jobs, models, training
from trace_lib.workbench.environments import DIFFICULTIES
from trace_lib.workbench.errors import ActionError, StoreError

st.set_page_config(page_title="Training · TRACE", page_icon="🧭", layout="wide")
st.title("Training")
st.caption("One LoRA adapter per approved capability environment, trained with GRPO on a "
           "frozen base; rollouts go through an OpenAI-compatible policy server.")

DB = data.db_path()
if not DB.exists():
    st.info(f"No database at `{DB}` yet. Build the demo with `make demo` (or "
            "`python -m trace_lib demo build`), then approve an environment on the "
            "Environments page.")
    st.stop()

DEFAULTS = training.defaults()
# The adapters table's columns, in reading order (the pass rates before the ids and paths).
_RATE = st.column_config.NumberColumn
ADAPTER_COLUMNS = {
    "capability": "capability", "pass_rate_before": _RATE("pass rate before", format="%.2f"),
    "pass_rate_after": _RATE("pass rate after", format="%.2f"),
    "final_reward": _RATE("final reward", format="%.3f"), "steps": "steps",
    "environment": "environment", "base_model": "base model", "id": "id", "path": "path",
    "created_at": "created",
}


@st.cache_data(show_spinner="Counting the prompt's tokens…", max_entries=64)
def _context_check(db: str, env: str, model: str, tools: str, policy: str, difficulty: int,
                   distractors: int, max_tokens: int):
    return training.context_check(db, env, model, {"tools": tools, "policy": policy,
                                                   "difficulty": difficulty,
                                                   "distractors": distractors}, max_tokens)


@st.cache_data(show_spinner="Measuring the reference turns…", max_entries=64)
def _max_tokens_default(db: str, env: str, model: str, tools: str, policy: str,
                        difficulty: int, distractors: int):
    return training.max_tokens_default(db, env, model, {"tools": tools, "policy": policy,
                                                        "difficulty": difficulty,
                                                        "distractors": distractors})


# ------------------------------------------------------------------------- launch
with st.expander("Launch a training job", expanded=True):
    include_builtins = st.checkbox(
        "also offer built-in environments not approved yet (smoke runs)", key="builtins")
    try:
        envs = environments.trainable_environments(DB, include_builtins=include_builtins)
    except StoreError as exc:
        st.error(str(exc))
        envs = []
    if not envs:
        st.info("No approved environment yet: approve one on the Environments page "
                "(or tick the box above for a smoke run on a built-in).")
    c1, c2, c3 = st.columns(3)
    env = c1.selectbox("Environment", [e["name"] for e in envs], key="env")
    model_names = models.model_names() + ["other (folder or hub name)"]
    model = c2.selectbox("Model", model_names, key="model")
    model_other = c2.text_input("Model folder / hub name (for 'other')", key="model_other")
    c1, c2, c3, c4 = st.columns(4)
    tools = c1.selectbox("Tools (built-ins)", ["capability", "all"], key="tools")
    policy_text = c2.selectbox("Policy (built-ins)", ["excerpt", "full"], key="policy")
    difficulty = c3.selectbox("Difficulty (built-ins)", list(DIFFICULTIES),
                              index=DEFAULTS.difficulty - 1, key="difficulty")
    distractors = c4.number_input("Distractor tools (built-ins, capability tools)", 0, 100,
                                  DEFAULTS.distractors, key="distractors")
    chosen = model_other.strip() if model.startswith("other") else model
    fit = derived = None
    if env and chosen:
        try:
            derived = _max_tokens_default(str(DB), env, chosen, tools, policy_text,
                                          int(difficulty), int(distractors))
            fit = _context_check(str(DB), env, chosen, tools, policy_text, int(difficulty),
                                 int(distractors),
                                 int(st.session_state.get("max_tokens") or 0)
                                 or (derived or {}).get("max_tokens", 0))
        except (*ActionError, OSError, ValueError) as exc:
            st.caption(f"Could not compare the prompt with the model's context: {exc}")
    if fit and fit["warning"]:
        st.warning(fit["warning"], icon="⚠️")
    elif fit:
        st.caption(f"The prompt is {fit['prompt_tokens']} tokens; the model's context is "
                   f"{fit['context']}.")
    if derived:
        st.caption(f"Max tokens / turn left at 0 uses {derived['max_tokens']}: the longest "
                   f"reference turn of {env} is {derived['longest_reference_turn']} tokens of "
                   f"{chosen}, +25%.")
    with st.form("launch"):
        c1, c2, c3 = st.columns(3)
        backend = c1.radio("Backend", ["local", "ray"], horizontal=True, key="backend")
        ray_address = c2.text_input("Ray dashboard URL (ray backend)",
                                    placeholder="http://127.0.0.1:8265", key="ray_address")
        c1, c2, c3, c4 = st.columns(4)
        steps = c1.number_input("Steps", 1, 100_000, DEFAULTS.steps, key="steps")
        group = c2.number_input("Group size G", 2, 256, DEFAULTS.group, key="group")
        groups = c3.number_input("Seeds per step", 1, 256, DEFAULTS.groups_per_step,
                                 key="groups_per_step")
        lr = c4.number_input("Learning rate", 1e-7, 1.0, DEFAULTS.lr, format="%.1e", key="lr")
        c1, c2, c3, c4 = st.columns(4)
        rank = c1.number_input("LoRA rank", 1, 256, DEFAULTS.lora.rank, key="rank")
        alpha = c2.number_input("LoRA alpha", 1, 1024, DEFAULTS.lora.alpha, key="alpha")
        targets = c3.text_input("LoRA targets", ",".join(DEFAULTS.lora.targets), key="targets")
        max_turns = c4.number_input("Max turns", 1, 100, DEFAULTS.max_turns, key="max_turns")
        c1, c2, c3, c4 = st.columns(4)
        max_tokens = c1.number_input(
            "Max tokens / turn", 0, 8192, 0, key="max_tokens",
            help="0: from the environment, its longest reference turn in the model's "
                 "tokens + 25% (shown above the form)")
        temperature = c2.number_input("Temperature", 0.0, 2.0, DEFAULTS.temperature,
                                      key="temperature")
        hint_share = c3.slider("Hinted share of a group", 0.0, 1.0, DEFAULTS.hint_share,
                               key="hint_share")
        kl = c4.number_input("KL coefficient (0 = off)", 0.0, 10.0, DEFAULTS.loss.kl_coef,
                             key="kl")
        c1, c2, c3, c4 = st.columns(4)
        scale = c1.selectbox("Advantage scale", ["group", "batch", "none"], key="scale")
        ckpt = c2.number_input("Checkpoint every N steps", 0, 100_000,
                               DEFAULTS.checkpoint_every, key="checkpoint_every")
        eval_seeds = c3.number_input("Held-out seeds (before/after)", 0, 10_000, 16,
                                     key="eval_seeds")
        seed = c4.number_input("Seed", 0, 2**31 - 1, DEFAULTS.seed, key="seed")
        c1, c2, c3, c4 = st.columns(4)
        micro_batch = c1.number_input("Micro-batch (gradient accumulation)", 1, 256,
                                      DEFAULTS.micro_batch, key="micro_batch")
        grad_ckpt = c2.checkbox("Gradient checkpointing (long prompts, less RAM)",
                                DEFAULTS.gradient_checkpointing, key="grad_ckpt")
        sft_steps = c3.number_input("SFT warm-start steps", 0, 100_000, DEFAULTS.sft_steps,
                                    key="sft_steps")
        stop_quiet = c4.checkbox("Stop on no signal", DEFAULTS.stop_on_no_signal,
                                 key="stop_on_no_signal")
        c1, c2 = st.columns([3, 1])
        init_adapter = c1.text_input(
            "Start from adapter folder (optional: e.g. an SFT warm start; same LoRA shape)",
            key="init_adapter")
        autocast = c2.selectbox(
            "Matmul precision (autocast)", models.AUTOCAST_NAMES,
            index=models.AUTOCAST_NAMES.index(DEFAULTS.autocast), key="autocast",
            help="bf16: the SFT and GRPO passes' matmuls in bf16 over float32 weights; "
                 "several times faster on a CPU with AMX / AVX512-BF16")
        launched = st.form_submit_button("Launch", type="primary", disabled=not envs)
    if launched:
        options = {"address": ray_address.strip()} if ray_address.strip() else {}
        try:
            config = training.build_config(
                env, chosen, steps=int(steps), group=int(group), groups_per_step=int(groups),
                lr=float(lr), max_turns=int(max_turns), max_tokens=int(max_tokens) or None,
                temperature=float(temperature), hint_share=float(hint_share),
                checkpoint_every=int(ckpt), eval_seeds=int(eval_seeds), seed=int(seed),
                micro_batch=int(micro_batch), gradient_checkpointing=bool(grad_ckpt),
                lora_rank=int(rank), lora_alpha=int(alpha), lora_targets=targets,
                kl_coef=float(kl), adv_scale=scale, tools=tools, policy=policy_text,
                difficulty=int(difficulty), distractors=int(distractors),
                init_adapter=init_adapter.strip() or None, sft_steps=int(sft_steps),
                autocast=autocast,
                stop_on_no_signal=bool(stop_quiet))
            spec = jobs.submit_training(DB, config, backend, options,
                                        allow_unreviewed_builtin=include_builtins)
        except (*ActionError, OSError) as exc:
            st.error(str(exc))
        else:
            st.session_state["job_id"] = spec.id
            st.session_state["watch"] = spec.id  # the selector below moves to the new job
            st.success(f"Launched job `{spec.id}` on the {backend} backend.")

# --------------------------------------------------------------------------- jobs
st.subheader("Jobs")
try:
    SYNCED = jobs.sync(DB).statuses  # records finished jobs and their adapters (full runs)
except StoreError as exc:
    st.error(str(exc))
    SYNCED = None
# Which jobs were active at this full run: the fragment polls while any is, and asks for a
# full rerun (which records it) when one of them has ended. The selector sits outside the
# fragment (a dropdown that redraws every two seconds would close under the pointer); the
# table and the live panel inside it read one snapshot, so their step counts agree.
VIEWS = jobs.job_views(statuses=SYNCED)
WATCHED = jobs.active([v["status"] for v in VIEWS])


@st.fragment(run_every="2s" if WATCHED else None)
def jobs_panel(job_id: str) -> None:
    # One snapshot, the full run's while nothing is active (the table and the panel agree);
    # run directories only while the fragment polls.
    if WATCHED and jobs.any_ended(WATCHED):
        st.rerun(scope="app")  # a job just ended: its sync records it and its adapter
    views = jobs.job_views() if WATCHED else VIEWS
    st.dataframe(pd.DataFrame([{
        "job": v["status"].id, "state": v["state"], "backend": v["status"].backend,
        "env": v["status"].config.get("env"), "model": v["status"].config.get("model"),
        "steps": v["steps"], "created": v["status"].created_at,
        "finished": v["status"].finished_at,
    } for v in views]), hide_index=True, width="stretch", key="jobs_table")
    by_id = {v["status"].id: v for v in views}
    if job_id in by_id:
        live(by_id[job_id])


def live(snapshot: dict) -> None:
    view = job_progress.live_status(snapshot["status"])  # the run directory only: never the store
    status, rows, signal, phase = view["status"], view["metrics"], view["signal"], view["phase"]
    job_id = status.id
    total = int(status.config.get("steps") or 1)
    # The state on its own row: "succeeded — no learning signal" in a quarter-width
    # column was cut to "succeeded — …" (a metric's value never wraps).
    st.metric("State", signal["state"])
    c2, c3, c4 = st.columns(3)
    c2.metric("Step", snapshot["steps"])
    c3.metric("Reward", f"{rows[-1]['reward_mean']:.3f}" if rows else "-")
    c4.metric("Pass rate", f"{rows[-1]['pass_rate']:.2f}" if rows else "-")
    quiet = rows[-1].get("no_signal_consecutive", 0) if rows else 0
    if signal["steps"]:
        st.caption(f"No-signal steps: {signal['no_signal_steps']} of {signal['steps']}")
    if signal["warning"]:
        st.warning(signal["warning"], icon="⚠️")
    elif quiet >= DEFAULTS.no_signal_warn_after:
        st.warning(f"No learning signal for {quiet} consecutive steps: every group's "
                   "rollouts got the same reward, so nothing is being learned. Try SFT "
                   "warm-start steps, hints, a lower difficulty or a larger group.")
    if phase["name"] in ("starting", "eval before", "eval after"):
        st.progress(min(phase["done"] / max(phase["total"], 1), 1.0), text=phase["text"])
    else:
        st.progress(min(status.steps_done / total, 1.0),
                    text=f"{status.steps_done}/{total} steps")
    if rows:
        st.plotly_chart(job_progress.metrics_figure(rows), key=f"chart_{job_id}")
    if job_progress.is_active(status.state):
        if st.button("Cancel", key=f"cancel_{job_id}"):
            done = jobs.cancel(DB, job_id, grace_s=10, record=False)
            st.warning(f"Job {job_id}: {done.state}")
            st.rerun(scope="app")
    if status.state == "failed":
        st.error(status.error or "failed")
        st.code(status.log_tail or "", language="text")
    samples = view["samples"]
    if samples:
        with st.expander(f"Latest sample rollout (step {samples[-1]['step']}, "
                         f"reward {samples[-1]['reward']:.2f})"):
            st.json(samples[-1])  # st.json escapes: trajectory text is untrusted
    with st.expander("Log"):
        st.code(view["log"], language="text")


if not VIEWS:
    st.caption("No training jobs yet.")
else:
    ids = [v["status"].id for v in VIEWS]
    if st.session_state.get("watch") not in ids:
        st.session_state["watch"] = ids[0]
    jobs_panel(st.selectbox("Watch job", ids, key="watch"))

# ----------------------------------------------------------------------- adapters
st.subheader("Adapters")
try:
    adapters = training.list_adapters(DB)
except StoreError as exc:
    st.error(str(exc))
    adapters = []
if not adapters:
    st.caption("Finished training jobs put their adapters here.")
else:
    st.caption("Pass rate on held-out seeds (greedy), before training and with the adapter. "
               "Each path is a PEFT folder `vllm serve BASE --enable-lora` loads as it is.")
    # What a person compares comes first: the pass rates sat past the ids and paths, off
    # to the right of the table.
    st.dataframe(pd.DataFrame(adapters)[list(ADAPTER_COLUMNS)], hide_index=True,
                 width="stretch", key="adapters_table", column_config=ADAPTER_COLUMNS)
