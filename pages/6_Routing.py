"""Routing: compose adapters, train the gates, and watch which expert handles each token.

Thin page: `trace_lib.compose` does everything (gated.py builds/loads the model, traces.py
routes, views.py draws, gate_training.py / evaluate.py train and measure, catalog.py keeps
the rows); the widgets only choose. Every action here is also a CLI verb (`compose`,
`route`, `gates`, `moe-eval`) and a cell of notebooks/04_compose_and_route.ipynb.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import streamlit as st

from trace_lib import store
from trace_lib.compose import catalog, traces, views
from trace_lib.errors import UserInputError

st.set_page_config(page_title="Routing · TRACE", page_icon="🔀", layout="wide")
st.title("Routing")
st.caption("A frozen base + K frozen LoRA adapters; one light gate per block picks, for every "
           "token, one adapter or none (top-1). Compose, train the gates, then watch the "
           "routing token by token.")

DB = store.default_db_path()


@st.cache_resource(max_entries=2, show_spinner="loading the composed model…")
def _load(path: str, mode: str | None, stamp: float):
    from trace_lib.compose.gated import load_moe

    return load_moe(path, mode=mode)


def _moe(path: str, mode: str | None):
    gates = Path(path) / "gates.safetensors"
    return _load(path, mode, gates.stat().st_mtime if gates.exists() else 0.0)


def _run_trace(moe, source: dict, force: int | None):
    if source["kind"] == "prompt":
        return traces.route_prompt(moe, source["prompt"], system=source.get("system") or None,
                                   max_new_tokens=source["max_new_tokens"], force=force)
    if source["kind"] == "env":
        from trace_lib.compose.local_client import route_env

        return route_env(moe, source["env"], source["seed"], force=force,
                         max_tokens=source["max_new_tokens"], max_turns=source["max_turns"])
    messages, tools, meta = catalog.trajectory_messages(DB, source["trajectory"])
    return traces.replay_trajectory(moe, messages, tools, force=force, meta=meta)


models = catalog.list_moe_models(DB) if DB.exists() else []
with st.sidebar:
    st.header("Composed model")
    labels = {f"{Path(m['path']).name} · {m['mode']} · {len(m['adapters'])} experts ({m['id']})":
              m["path"] for m in models}
    picked = st.selectbox("Model", list(labels) or ["(none yet)"], key="moe_pick")
    moe_path = st.text_input("…or a folder", value=labels.get(picked, ""), key="moe_path")
    mode = st.selectbox("Routing mode", ["(as saved)", "top1", "soft", "trajectory"],
                        key="mode")
    mode_arg = None if mode == "(as saved)" else mode

tab_route, tab_compose, tab_gates, tab_eval = st.tabs(
    ["Route", "Compose", "Train gates", "Evaluate"])

# ------------------------------------------------------------------------------ compose
with tab_compose:
    st.subheader("Compose adapters into a gated mixture")
    adapters = []
    if DB.exists():
        try:
            from trace_lib.train.records import list_adapters

            adapters = list_adapters(DB)
        except (ImportError, store.StoreError):
            adapters = []
    # cap=PATH: a trained adapter's folder is named `adapter`, so without its capability
    # every slot would be labelled "adapter" in the legend and the routing views.
    options = {f"{a.get('capability')} · {a.get('id')}":
               f"{a['capability']}={a['path']}" if a.get("capability") else a["path"]
               for a in adapters}
    chosen = st.multiselect("Trained adapters", list(options), key="compose_adapters")
    extra = st.text_area("More adapter folders (one per line, optionally cap=PATH)",
                         key="compose_extra")
    base = st.text_input("Base model (registry name or folder)",
                         value=(adapters[0]["base_model"] if adapters else "tiny"),
                         key="compose_base")
    cmode = st.selectbox("Mode", ["top1", "soft", "trajectory"], key="compose_mode")
    out = st.text_input("Output folder", value=str(Path("data") / "moe" / "composed"),
                        key="compose_out")
    if st.button("Compose", key="compose_go", type="primary"):
        specs = ",".join([options[c] for c in chosen] +
                         [x.strip() for x in extra.splitlines() if x.strip()])
        try:
            from trace_lib.compose.adapters import parse_adapter_arg
            from trace_lib.compose.gated import MoEConfig, compose

            with st.spinner("composing…"):
                moe = compose(base, parse_adapter_arg(specs), out=out, config=MoEConfig(cmode))
                moe_id = catalog.register_moe(DB, out)
            st.success(f"composed {moe.k} experts, {moe.gate_param_count():,} gate parameters "
                       f"→ {out} ({moe_id})")
        except UserInputError as exc:
            st.error(str(exc))

if not moe_path:
    with tab_route:
        st.info("No composed model yet: compose one in the Compose tab or with "
                "`python -m trace_lib compose --model M --adapters A1,A2 --out DIR`.")
    st.stop()

try:
    moe = _moe(moe_path, mode_arg)
except UserInputError as exc:
    st.error(str(exc))
    st.stop()

with st.sidebar:
    st.markdown("**Legend: slot → capability**")
    st.html(views.legend_html(moe.slots))
    st.caption(f"{moe.layers} layers · hidden {moe.hidden} · {moe.gate_param_count():,} gate "
               f"parameters · mode {moe.config.mode}")

# -------------------------------------------------------------------------------- route
with tab_route:
    kind = st.radio("Source", ["Live prompt", "Environment rollout", "Ingested trajectory",
                               "Saved trace"], horizontal=True, key="source")
    source: dict = {}
    if kind == "Live prompt":
        source = {"kind": "prompt",
                  "prompt": st.text_area("Prompt", "Cancel my reservation ABC123, please.",
                                         key="prompt"),
                  "system": st.text_input("System message (optional)", key="system"),
                  "max_new_tokens": st.number_input("Max new tokens", 0, 512, 32,
                                                    key="max_new")}
    elif kind == "Environment rollout":
        from trace_lib.compose.local_client import environment_names

        source = {"kind": "env", "env": st.selectbox("Environment", environment_names(),
                                                     key="env"),
                  "seed": int(st.number_input("Seed", 0, 10**6, 0, key="seed")),
                  "max_new_tokens": st.number_input("Max tokens per turn", 1, 512, 48,
                                                    key="env_tokens"),
                  "max_turns": st.number_input("Max turns", 1, 16, 3, key="env_turns")}
    elif kind == "Ingested trajectory":
        trajs = catalog.list_trajectories(DB) if DB.exists() else []
        if trajs:
            pick = st.selectbox("Trajectory", [
                f"{t['id']} · {t['domain']} · task {t['task_id']} · "
                f"{'pass' if t['success'] else 'fail'} · {t['n_messages']} msgs" for t in trajs],
                key="traj")
            source = {"kind": "trajectory", "trajectory": pick.split(" · ")[0]}
        else:
            st.info("No ingested trajectories in the store yet.")
    else:
        saved = catalog.list_traces(DB, catalog.moe_id_for(moe_path)) if DB.exists() else []
        if saved:
            pick = st.selectbox("Trace", [f"{t['id']} · {t['source']} · {t['n_tokens']} tokens"
                                          for t in saved], key="saved")
            row = saved[[f"{t['id']} · {t['source']} · {t['n_tokens']} tokens"
                         for t in saved].index(pick)]
            if st.button("Open", key="open_saved"):
                st.session_state["trace"] = traces.RoutingTrace.load(row["path"])
                st.session_state.pop("forced", None)
        else:
            st.info("No saved traces for this model yet.")

    c1, c2 = st.columns([1, 1])
    if source and c1.button("Route", key="route_go", type="primary"):
        try:
            with st.spinner("generating and routing…"):
                trace = _run_trace(moe, source, None)
                catalog.save_and_index(DB, moe_path, trace, source["kind"])
            st.session_state["trace"] = trace
            st.session_state["routed_source"] = source
            st.session_state.pop("forced", None)
        except UserInputError as exc:
            st.error(str(exc))
    force = c2.selectbox("Force expert", list(range(len(moe.slots))),
                         format_func=lambda s: f"{s}: {moe.slots[s]}", key="force")
    if "routed_source" in st.session_state and c2.button("Re-run forced", key="force_go"):
        with st.spinner(f"re-running with every token on slot {force}…"):
            st.session_state["forced"] = _run_trace(moe, st.session_state["routed_source"], int(force))

    trace = st.session_state.get("trace")
    if trace is not None:
        layer_opts = ["majority over layers"] + [f"layer {i}" for i in range(trace.n_layers)]
        layer_pick = st.selectbox("Colour by", layer_opts, key="layer")
        layer = None if layer_pick == layer_opts[0] else int(layer_pick.split()[-1])
        st.html(views.legend_html(trace.slots))
        forced = st.session_state.get("forced")
        if forced is not None:
            left, right = st.columns(2)
            left.markdown("**Routed**")
            left.html(views.token_html(trace, layer))
            right.markdown(f"**Forced: slot {forced.meta.get('force')} "
                           f"({trace.slots[forced.meta.get('force') or 0]})**")
            right.html(views.token_html(forced, layer))
        else:
            st.html(views.token_html(trace, layer))
        st.plotly_chart(views.heatmap_figure(trace), key="heatmap")
        a, b = st.columns(2)
        a.plotly_chart(views.share_figure(traces.share(trace, "role", layer), "role",
                                          trace.slots), key="share_role")
        b.plotly_chart(views.share_figure(traces.share(trace, "turn", layer), "turn",
                                          trace.slots), key="share_turn")
        st.plotly_chart(views.entropy_figure(trace), key="entropy")
        saved = catalog.list_traces(DB, catalog.moe_id_for(moe_path)) if DB.exists() else []
        with_outcome = [t for t in saved if t["meta"].get("outcome") in ("success", "failure")]
        if with_outcome:
            pooled = traces.share_many([traces.RoutingTrace.load(t["path"])
                                        for t in with_outcome[:50]], by="outcome")
            st.plotly_chart(views.share_figure(pooled, "outcome", trace.slots),
                            key="share_outcome")
        else:
            st.caption("Expert share by success vs failure appears once traces from "
                       "environment rollouts or ingested trajectories are saved.")

# ---------------------------------------------------------------------------- gates
with tab_gates:
    from trace_lib.compose.gate_training import GateTrainConfig, submit_gate_job
    from trace_lib.compose.local_client import environment_names

    st.subheader("Train the gates (background job)")
    names = environment_names()
    caps = set(moe.slots[1:])
    envs = st.multiselect("Capability environments (mixed round-robin)", names,
                          default=[n for n in names if n.split("/")[-1] in caps] or names[:1],
                          key="gate_envs")
    g1, g2, g3 = st.columns(3)
    warm_seeds = g1.number_input("Warm-start seeds per env", 0, 64, 2, key="warm_seeds")
    warm_steps = g1.number_input("Warm-start KL steps", 0, 500, 20, key="warm_steps")
    steps = g2.number_input("GRPO steps", 0, 1000, 4, key="gate_steps")
    group = g2.number_input("Group size", 2, 64, 4, key="gate_group")
    max_tokens = g3.number_input("Max tokens per turn", 1, 1024, 48, key="gate_tokens")
    max_turns = g3.number_input("Max turns", 1, 16, 2, key="gate_turns")
    if st.button("Start gate training", key="gates_go", type="primary"):
        try:
            cfg = GateTrainConfig(moe=str(Path(moe_path).resolve()), envs=envs,
                                  warm_seeds=int(warm_seeds), warm_steps=int(warm_steps),
                                  steps=int(steps), group=int(group),
                                  max_tokens=int(max_tokens), max_turns=int(max_turns))
            spec = submit_gate_job(cfg)
            from trace_lib.train.records import record_job

            record_job(DB, spec)
            st.success(f"started job {spec.id} → {spec.run_dir}")
        except UserInputError as exc:
            st.error(str(exc))
    jobs_list = catalog.sync_gate_jobs(DB) if DB.exists() else []
    if jobs_list:
        st.button("Refresh", key="gates_refresh")
        st.dataframe(pd.DataFrame([{k: j.get(k) for k in ("id", "state", "steps_done",
                                                          "moe_path", "error")}
                                   for j in jobs_list]), hide_index=True)
        from trace_lib.jobs import read_metrics

        job = st.selectbox("Job", [j["id"] for j in jobs_list], key="gate_job")
        rows = read_metrics(next(j["run_dir"] for j in jobs_list if j["id"] == job))
        grpo = [r for r in rows if r.get("phase") == "grpo"]
        warm = [r for r in rows if r.get("phase") == "warm"]
        if warm:
            st.line_chart(pd.DataFrame(warm).set_index("warm_step")[["kl"]])
        if grpo:
            frame = pd.DataFrame(grpo).set_index("step")
            st.line_chart(frame[["reward_mean", "routing_entropy"]])
            st.area_chart(frame[[c for c in frame.columns if c.startswith("share_")]])
        state = next(j["state"] for j in jobs_list if j["id"] == job)
        if state in ("queued", "running"):
            st.progress(min(1.0, len(grpo) / max(int(steps), 1)),
                        text=f"{state}: {len(warm)} warm steps, {len(grpo)} GRPO steps")

# ----------------------------------------------------------------------------- eval
with tab_eval:
    from trace_lib.compose.evaluate import (
        EvalConfig,
        evaluate_composition,
        policies,
        summary_rows,
        write_eval,
    )
    from trace_lib.compose.local_client import environment_names

    st.subheader("Does composition beat collapse?")
    eval_path = Path(moe_path) / "eval.json"
    names = environment_names()
    e_envs = st.multiselect("Held-out environments", names, default=names, key="eval_envs")
    e1, e2 = st.columns(2)
    e_seeds = e1.number_input("Held-out seeds per env", 1, 200, 2, key="eval_seeds")
    e_tokens = e2.number_input("Max tokens per turn", 1, 1024, 32, key="eval_tokens")
    if st.button("Evaluate", key="eval_go", type="primary") and e_envs:
        cfg = EvalConfig(envs=e_envs, seeds=int(e_seeds), max_tokens=int(e_tokens), max_turns=2)
        total = len(e_envs) * len(policies(moe, cfg.include_merge))
        bar = st.progress(0.0, text="evaluating…")
        table = st.empty()
        done: list[dict] = []

        def _row(row: dict) -> None:
            done.append(row)
            bar.progress(len(done) / total, text=f"{row['env']} · {row['policy']}")
            table.dataframe(pd.DataFrame(done), hide_index=True)

        rows = evaluate_composition(moe, cfg, on_row=_row)
        write_eval(moe_path, rows, cfg)
        catalog.register_moe(DB, moe_path, metrics={"eval": rows,
                                                    "eval_summary": summary_rows(rows)})
    if eval_path.exists():
        data = json.loads(eval_path.read_text())
        st.dataframe(pd.DataFrame(data["summary"]), hide_index=True)
        st.plotly_chart(views.eval_figure(data["rows"]), key="eval_chart")
        st.dataframe(pd.DataFrame(data["rows"]), hide_index=True)
