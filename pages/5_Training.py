"""Training: launch GRPO LoRA jobs, watch them live, cancel them, see finished adapters.

Thin page: every action is a use case of `trace_lib.workbench.training`: the form builds
the config with `build_config` and launching is `launch` (both what `train --background`
calls; only approved environments, or an explicit smoke run on an unreviewed built-in),
the job list is `sync_jobs` (`job list`), the live panel is `live_status` over the run
directory (what the notebook draws), cancel is `cancel` (`job cancel`).
The live panel is a fragment that re-reads only the run directory every two seconds (no
database access, so it never holds the store's lock); a full rerun records finished jobs.
"""

from __future__ import annotations

import pandas as pd
import streamlit as st

from trace_lib.workbench import data, environments, training
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
    with st.form("launch"):
        c1, c2, c3 = st.columns(3)
        env = c1.selectbox("Environment", [e["name"] for e in envs], key="env")
        model_names = training.model_names() + ["other (folder or hub name)"]
        model = c2.selectbox("Model", model_names, key="model")
        model_other = c2.text_input("Model folder / hub name (for 'other')", key="model_other")
        backend = c3.radio("Backend", ["local", "ray"], horizontal=True, key="backend")
        ray_address = c3.text_input("Ray dashboard URL (ray backend)",
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
        max_tokens = c1.number_input("Max tokens / turn", 1, 8192, DEFAULTS.max_tokens,
                                     key="max_tokens")
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
        c1, c2, c3, _ = st.columns(4)
        tools = c1.selectbox("Tools (built-ins)", ["capability", "all"], key="tools")
        policy_text = c2.selectbox("Policy (built-ins)", ["excerpt", "full"], key="policy")
        difficulty = c3.selectbox("Difficulty (built-ins)", [1, 2, 3],
                                  index=DEFAULTS.difficulty - 1, key="difficulty")
        launched = st.form_submit_button("Launch", type="primary", disabled=not envs)
    if launched:
        chosen = model_other.strip() if model.startswith("other") else model
        options = {"address": ray_address.strip()} if ray_address.strip() else {}
        try:
            config = training.build_config(
                env, chosen, steps=int(steps), group=int(group), groups_per_step=int(groups),
                lr=float(lr), max_turns=int(max_turns), max_tokens=int(max_tokens),
                temperature=float(temperature), hint_share=float(hint_share),
                checkpoint_every=int(ckpt), eval_seeds=int(eval_seeds), seed=int(seed),
                micro_batch=int(micro_batch), gradient_checkpointing=bool(grad_ckpt),
                lora_rank=int(rank), lora_alpha=int(alpha), lora_targets=targets,
                kl_coef=float(kl), adv_scale=scale, tools=tools, policy=policy_text,
                difficulty=int(difficulty), sft_steps=int(sft_steps),
                stop_on_no_signal=bool(stop_quiet))
            spec = training.launch(DB, config, backend, options,
                                   allow_unreviewed_builtin=include_builtins)
        except (*ActionError, OSError) as exc:
            st.error(str(exc))
        else:
            st.session_state["job_id"] = spec.id
            st.success(f"Launched job `{spec.id}` on the {backend} backend.")

# --------------------------------------------------------------------------- jobs
st.subheader("Jobs")
try:
    statuses = training.sync_jobs(DB)
except StoreError as exc:
    st.error(str(exc))
    statuses = []
if not statuses:
    st.caption("No training jobs yet.")
else:
    st.dataframe(pd.DataFrame([{
        "job": s.id, "state": s.state, "backend": s.backend, "env": s.config.get("env"),
        "model": s.config.get("model"), "steps": f"{s.steps_done}/{s.config.get('steps')}",
        "created": s.created_at, "finished": s.finished_at,
    } for s in statuses]), hide_index=True, width="stretch")
    ids = [s.id for s in statuses]
    current = st.session_state.get("job_id")
    job_id = st.selectbox("Watch job", ids, index=ids.index(current) if current in ids else 0,
                          key="watch")
    active = training.is_active(next(s for s in statuses if s.id == job_id).state)

    @st.fragment(run_every="2s" if active else None)
    def live(job_id: str) -> None:
        view = training.live_status(job_id)  # the run directory only: never the store
        status, rows = view["status"], view["metrics"]
        total = int(status.config.get("steps") or 1)
        c1, c2, c3, c4 = st.columns(4)
        c1.metric("State", status.state)
        c2.metric("Step", f"{status.steps_done}/{total}")
        c3.metric("Reward", f"{rows[-1]['reward_mean']:.3f}" if rows else "-")
        c4.metric("Pass rate", f"{rows[-1]['pass_rate']:.2f}" if rows else "-")
        quiet = rows[-1].get("no_signal_consecutive", 0) if rows else 0
        if rows:
            st.caption(f"No-signal steps: {sum(bool(r.get('no_signal')) for r in rows)} "
                       f"of {len(rows)}")
        if quiet >= DEFAULTS.no_signal_warn_after:
            st.warning(f"No learning signal for {quiet} consecutive steps: every group's "
                       "rollouts got the same reward, so nothing is being learned. Try SFT "
                       "warm-start steps, hints, a lower difficulty or a larger group.")
        st.progress(min(status.steps_done / total, 1.0), text=f"{status.steps_done}/{total} steps")
        if rows:
            st.plotly_chart(training.metrics_figure(rows), key=f"chart_{job_id}")
        if training.is_active(status.state):
            if st.button("Cancel", key=f"cancel_{job_id}"):
                done = training.cancel(DB, job_id, grace_s=10, record=False)
                st.warning(f"Job {job_id}: {done.state}")
                st.rerun()
        elif active:
            st.rerun()  # it just ended: a full rerun records it and its adapter
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

    live(job_id)

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
    st.dataframe(pd.DataFrame(adapters)[[
        "id", "capability", "environment", "base_model", "steps", "final_reward",
        "pass_rate_before", "pass_rate_after", "path", "created_at"]],
        hide_index=True, width="stretch")
