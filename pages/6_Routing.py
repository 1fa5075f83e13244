"""Routing: compose adapters, train the gates, and watch which expert handles each token.

Thin page: every action is a use case of `trace_lib.workbench.composition` (compose,
route through its one source dispatch, evaluate; it also keeps the rows) or, for a gate
job, of `trace_lib.workbench.jobs` (submit, the one job sync) and `job_progress` (the
live panel), and `views` draws; the widgets only choose. Every action here is also a CLI verb (`compose`,
`route`, `gates`, `moe-eval`) and a cell of notebooks/04_compose_and_route.ipynb.
Picking an adapter whose training run reported no learning signal shows a warning
(`composition.adapter_warnings`) before Compose. The composed model in use is the
sidebar's pick unless a folder is typed; Compose selects
the model it made (a rerun, no reload) and writes under the runs directory. Forcing one
expert is a separate, labelled counterfactual below routing. The gate-training panel is a
fragment that follows an active job from its run directory every two seconds.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import streamlit as st

import page_parts
from trace_lib.workbench import composition, data, job_progress, jobs, routing_demo, training
from trace_lib.workbench.composition import views
from trace_lib.workbench.errors import StoreError, UserInputError

st.set_page_config(page_title="Routing · TRACE", page_icon="🔀", layout="wide")
st.title("Routing")
st.caption("A frozen base + K frozen LoRA adapters; one light gate per block picks, for every "
           "token, one adapter or none (top-1). Compose, train the gates, then watch the "
           "routing token by token.")

DB = data.db_path()


@st.cache_resource(max_entries=2, show_spinner="loading the composed model…")
def _load(path: str, mode: str | None, stamp: float):
    return composition.load_moe(path, mode=mode)


@st.cache_data(max_entries=16, show_spinner=False)
def _turn_default(_model, path: str, envs: tuple[str, ...], max_turns: int) -> dict | None:
    """What "Max tokens per turn" left at 0 uses (the one rule every run derives it by)."""
    return composition.eval_max_tokens_default(_model, list(envs), DB, max_turns)


def _turn_caption(model, path: str, envs: list[str], max_turns: int) -> None:
    derived = _turn_default(model, path, tuple(envs), max_turns) if envs else None
    if derived:
        st.caption(f"Max tokens per turn left at 0 uses {derived['max_tokens']}: the longest "
                   f"reference turn of these environments is "
                   f"{derived['longest_reference_turn']} tokens of this model, + 25%.")


def _moe(path: str, mode: str | None):
    gates = Path(path) / "gates.safetensors"
    return _load(path, mode, gates.stat().st_mtime if gates.exists() else 0.0)


# The one job sync first: a demo build that just ended has its composed model recorded
# before the picker lists the models.
demo_statuses = jobs.sync(DB).statuses if data.db_exists(DB) else jobs.run_dir_statuses()
models = composition.list_moe_models(DB)
labels = {f"{Path(m['path']).name} · {m['mode']} · {len(m['adapters'])} experts ({m['id']})":
          m["path"] for m in models}
# The routing demo's composed model: the page opens on it (issue 36).
demo = routing_demo.find()
if demo is not None:
    demo_moe = Path(demo["moe_path"]).resolve()
    demo_label = next((lab for lab, p in labels.items() if Path(p).resolve() == demo_moe),
                      None)
    if demo_label is None:  # built by a CLI run against another store: offer it anyway
        demo_label = f"routing demo · {demo['model']} · {len(demo['capabilities'])} experts"
        labels = {demo_label: str(demo_moe), **labels}
    st.session_state.setdefault("moe_pick", demo_label)
# Compose just made a model: select it (widget state may only be set before the widget).
if made_path := st.session_state.pop("composed_path", None):
    st.session_state["moe_pick"] = next(
        (lab for lab, p in labels.items() if Path(p).resolve() == Path(made_path).resolve()),
        st.session_state.get("moe_pick"))
    st.session_state["moe_folder"] = ""
    st.session_state["compose_out"] = str(composition.default_compose_dir())
st.session_state.setdefault("compose_out", str(composition.default_compose_dir()))
with st.sidebar:
    st.header("Composed model")
    if labels:
        picked = st.selectbox("Model", list(labels), key="moe_pick")
    else:  # nothing to pick: say how to get a model instead of an empty picker
        picked = ""
        st.caption("No composed model yet: **Build the routing demo** (on this page) makes "
                   "one, or compose your own adapters in the Compose tab.")
    folder = st.text_input("…or a folder", key="moe_folder",
                           placeholder="a composed model's folder (overrides the pick)")
    moe_path = folder.strip() or labels.get(picked, "")
    mode = st.selectbox("Routing mode", ["(as saved)", "top1", "soft", "trajectory"],
                        key="mode")
    mode_arg = None if mode == "(as saved)" else mode

# ------------------------------------------------------------------------- the demo
BUILD_HELP = (
    "**Build the routing demo** trains two conflicting skills on the airline domain "
    "(`tool_calling_precision`: write the exact call at once; `precondition_verification`: "
    "read first, refuse what the policy forbids), each as a LoRA adapter by SFT on the "
    "environment's reference actions; composes them with one gate per layer; warm-starts "
    "the gates from a small table of rewards; exports the per-request router; and replays "
    "held-out requests of both environments through the base model, each adapter, their "
    "linear merge and the composed model, each judged by the environment. It runs as a "
    "background job (about 15 CPU-minutes with SmolLM2-135M on a CPU, measured in "
    "bench/README.md; seconds with `tiny`, which learns nothing), is kept under the "
    "models folder and is reused afterwards. The same build: "
    "`python -m trace_lib demo adapters [--model smollm2-135m] [--background]`.")


def _reply_text(messages: list[dict]) -> str:
    """The assistant turns and the tools' answers after the request, as plain text."""
    first = next((i for i, m in enumerate(messages) if m["role"] == "assistant"),
                 len(messages))
    parts = []
    for m in messages[first:]:
        if m["role"] == "assistant":
            for call in m.get("tool_calls") or []:
                fn = call.get("function", {})
                parts.append(f"→ {fn.get('name')}({fn.get('arguments')})")
            if m.get("content"):
                parts.append(str(m["content"]))
        elif m["role"] == "tool":
            parts.append(f"  ⤷ {str(m.get('content'))[:200]}")
    return "\n".join(parts) or "(no reply)"


def _demo_build_controls(statuses) -> None:
    running = routing_demo.active_job(DB, statuses=statuses)
    if running is not None:
        @st.fragment(run_every="2s")
        def follow() -> None:
            if jobs.any_ended([running]):
                st.rerun(scope="app")
            prog = routing_demo.progress(running)
            total = max(prog["total"], 1)
            st.progress(min(1.0, prog["done"] / total),
                        text=f"building the routing demo (job {running.id}): "
                             f"{prog['done']}/{prog['total']} · {prog['phase']}: "
                             f"{prog['message']}")

        follow()
        return
    page_parts.routing_demo_build(DB, key="demo")


with st.container(border=True, key="routing_demo"):
    st.subheader("Routing demo: two skills and their router")
    finished = [s for s in demo_statuses if s.kind == jobs.ROUTING_DEMO
                and s.state in ("failed", "cancelled")]
    if demo is None:
        st.info(BUILD_HELP)
        if finished and routing_demo.active_job(DB, statuses=demo_statuses) is None:
            st.warning(f"The last build (job {finished[0].id}) ended {finished[0].state}: "
                       f"{finished[0].error or 'see its log'}; building again continues "
                       "from what it saved.")
        _demo_build_controls(demo_statuses)
    else:
        st.markdown("**What you are seeing** (measured by the last build, "
                    f"{demo['built_at']}, base `{demo['model']}`)")
        st.markdown("\n".join(f"- {line}" for line in demo["what_you_see"].splitlines()))
        examples = demo["examples"]
        names = [f"{e['capability']} · seed {e['seed']} · {e['request'][:70]}…"
                 for e in examples]
        pick = st.selectbox("Example request (held-out seed)", names, key="demo_example")
        ex = examples[names.index(pick)]
        st.markdown(f"**Request** ({ex['env']}, seed {ex['seed']}): {ex['request']}")
        own = sum(1 for s in ex["choice"] if s == demo["slots"].index(ex["routed_to"]))
        verdict = "its own skill ✅" if ex["right"] else f"not {ex['capability']} ❌"
        st.markdown(f"**The router sends it to `{ex['routed_to']}`** ({verdict}): the "
                    f"gates' per-request choice picks that adapter at {own} of "
                    f"{len(ex['choice'])} layers.", help="Per-request (trajectory) routing: "
                    "one choice per request and layer, pooled over the request's tokens, "
                    "matched to the nearest exported adapter.")
        trace = routing_demo.load_trace(demo, ex)
        with st.expander("Per-token routing of the composed reply (token-level top-1 "
                         "gates, majority over layers)", expanded=True):
            st.html(views.legend_html(trace.slots))
            start = next((i for i, r in enumerate(trace.roles) if r == "user"), 0)
            st.html(views.token_html(trace, start=start))
        cols = st.columns(len(demo["policies"]))
        for col, policy in zip(cols, demo["policies"], strict=True):
            reply = ex["replies"][policy]
            with col.container(border=True, key=f"demo_reply_{demo['policies'].index(policy)}"):
                st.markdown(f"**{policy}**")
                mark = "✅ passed" if reply["passed"] else "❌ failed"
                st.markdown(f"{mark} · reward {reply['reward']:.2f}")
                if reply.get("reused_from"):
                    st.caption(f"= {reply['reused_from']}: the router's adapter for this "
                               "request is that adapter at every layer")
                st.code(_reply_text(reply["messages"]), language=None, wrap_lines=True)
                if reply.get("reasons"):
                    st.caption("Checks: " + "; ".join(str(r) for r in reply["reasons"]))
        st.caption(f"Kept in `{demo['path']}`; `python -m trace_lib demo adapters` finds it "
                   "and does nothing.")

tab_route, tab_compose, tab_gates, tab_eval = st.tabs(
    ["Route", "Compose", "Train gates", "Evaluate"])

# ------------------------------------------------------------------------------ compose
with tab_compose:
    st.subheader("Compose adapters into a gated mixture")
    try:
        adapters = training.list_adapters(DB)
    except StoreError:
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
    out = st.text_input("Output folder (under the runs directory by default)",
                        key="compose_out")
    specs = ",".join([options[c] for c in chosen] +
                     [x.strip() for x in extra.splitlines() if x.strip()])
    # An adapter whose training learned nothing is the base model in a slot: say so as
    # soon as it is picked (composing it stays possible, e.g. as a control).
    try:
        picked_warnings = composition.adapter_warnings(DB, specs) if specs else []
    except (UserInputError, StoreError):
        picked_warnings = []  # a malformed list (Compose reports it) or a busy store
    for warning in picked_warnings:
        st.warning(warning, icon="⚠️")
    if st.button("Compose", key="compose_go", type="primary"):
        try:
            with st.spinner("composing…"):
                made = composition.compose(DB, base, specs, out, mode=cmode)
        except UserInputError as exc:
            st.error(str(exc))
        else:
            st.session_state["composed_path"] = made["path"]  # the Route tab uses it
            st.session_state["composed_msg"] = (
                f"composed {len(made['experts'])} experts, {made['gate_params']:,} gate "
                f"parameters → {made['path']} ({made['id']})")
            st.rerun()
    if msg := st.session_state.pop("composed_msg", None):
        st.success(msg)

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
    source: composition.RouteSource | None = None
    if kind == "Live prompt":
        source = composition.RouteSource(
            "prompt",
            prompt=st.text_area("Prompt", "Cancel my reservation ABC123, please.", key="prompt"),
            system=st.text_input("System message (optional)", key="system"),
            max_new_tokens=int(st.number_input("Max new tokens", 0, 512, 32, key="max_new")))
    elif kind == "Environment rollout":
        source = composition.RouteSource(
            "env", env=st.selectbox("Environment", composition.environment_names(), key="env"),
            seed=int(st.number_input("Seed", 0, 10**6, 0, key="seed")),
            max_new_tokens=int(st.number_input("Max tokens per turn", 1, 512, 48,
                                               key="env_tokens")),
            max_turns=int(st.number_input("Max turns", 1, 16, 3, key="env_turns")))
    elif kind == "Ingested trajectory":
        trajs = composition.list_trajectories(DB)
        if trajs:
            pick = st.selectbox("Trajectory", [
                f"{t['id']} · {t['domain']} · task {t['task_id']} · "
                f"{'pass' if t['success'] else 'fail'} · {t['n_messages']} msgs" for t in trajs],
                key="traj")
            source = composition.RouteSource("trajectory", trajectory=pick.split(" · ")[0])
        else:
            st.info("No ingested trajectories in the store yet.")
    else:
        saved = composition.list_traces(DB, composition.moe_id_for(moe_path))
        if saved:
            pick = st.selectbox("Trace", [f"{t['id']} · {t['source']} · {t['n_tokens']} tokens"
                                          for t in saved], key="saved")
            row = saved[[f"{t['id']} · {t['source']} · {t['n_tokens']} tokens"
                         for t in saved].index(pick)]
            if st.button("Open", key="open_saved"):
                st.session_state["trace"] = composition.load_trace(row["path"])
                st.session_state.pop("forced", None)
        else:
            st.info("No saved traces for this model yet.")

    if source and st.button("Route", key="route_go", type="primary"):
        try:
            with st.spinner("generating and routing…"):
                trace, _ = composition.route(DB, moe_path, source, moe=moe)
            st.session_state["trace"] = trace
            st.session_state["routed_source"] = source
            st.session_state.pop("forced", None)
        except UserInputError as exc:
            st.error(str(exc))
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
        # A counterfactual, not routing: kept apart so that nobody reads it as the gates'
        # choice.
        with st.container(border=True, key="force_box"):
            st.markdown("**Counterfactual: force one expert**")
            st.caption("Not the gates' routing: re-runs the same input with every token "
                       "sent to one expert, shown beside the routed run.")
            f1, f2 = st.columns([2, 1], vertical_alignment="bottom")
            force = f1.selectbox("Force expert", list(range(len(moe.slots))),
                                 format_func=lambda s: f"{s}: {moe.slots[s]}", key="force")
            if "routed_source" in st.session_state and f2.button("Re-run forced",
                                                                   key="force_go"):
                with st.spinner(f"re-running with every token on slot {force}…"):
                    st.session_state["forced"], _ = composition.route(
                        DB, moe_path, st.session_state["routed_source"], force=int(force),
                        moe=moe, save=False)
                st.rerun()
        st.plotly_chart(views.heatmap_figure(trace), key="heatmap")
        a, b = st.columns(2)
        a.plotly_chart(views.share_figure(composition.share(trace, "role", layer), "role",
                                          trace.slots), key="share_role")
        b.plotly_chart(views.share_figure(composition.share(trace, "turn", layer), "turn",
                                          trace.slots), key="share_turn")
        st.plotly_chart(views.entropy_figure(trace), key="entropy")
        pooled = composition.outcome_shares(DB, moe_path)
        if pooled:
            st.plotly_chart(views.share_figure(pooled, "outcome", trace.slots),
                            key="share_outcome")
        else:
            st.caption("Expert share by success vs failure appears once traces from "
                       "environment rollouts or ingested trajectories are saved.")

# ---------------------------------------------------------------------------- gates
with tab_gates:
    st.subheader("Train the gates (background job)")
    names = composition.environment_names()
    caps = set(moe.slots[1:])
    envs = st.multiselect("Capability environments (mixed round-robin)", names,
                          default=[n for n in names if n.split("/")[-1] in caps] or names[:1],
                          key="gate_envs")
    g1, g2, g3 = st.columns(3)
    warm_seeds = g1.number_input("Warm-start seeds per env", 0, 64, 2, key="warm_seeds")
    warm_steps = g1.number_input("Warm-start KL steps", 0, 2000, 100, key="warm_steps")
    steps = g2.number_input("GRPO steps", 0, 1000, 4, key="gate_steps")
    group = g2.number_input("Group size", 2, 64, 4, key="gate_group")
    max_tokens = g3.number_input("Max tokens per turn", 0, 1024, 0, key="gate_tokens",
                                 help="0: from the environments, their longest reference "
                                      "turn in the model's tokens + 25%")
    max_turns = g3.number_input("Max turns", 1, 16, 2, key="gate_turns")
    if not max_tokens:
        _turn_caption(moe, moe_path, envs, int(max_turns))
    if st.button("Start gate training", key="gates_go", type="primary"):
        try:
            cfg = composition.gate_config(moe_path, envs, warm_seeds=int(warm_seeds),
                                          warm_steps=int(warm_steps), steps=int(steps),
                                          group=int(group), max_tokens=int(max_tokens) or None,
                                          max_turns=int(max_turns))
            started = jobs.submit_gates(DB, cfg)
            st.success(f"started job {started.id} → {started.run_dir}")
        except UserInputError as exc:
            st.error(str(exc))
    # Full runs record finished jobs and their models through the one job sync.
    synced = jobs.sync(DB).statuses if data.db_exists(DB) else None
    gate_views = jobs.job_views(kind=jobs.TRAIN_GATES, statuses=synced)
    gate_active = jobs.active([v["status"] for v in gate_views])

    @st.fragment(run_every="2s" if gate_active else None)
    def gate_panel(job: str) -> None:
        # Run directories only (never the store): safe to poll while a job writes. The
        # job selector is outside: a dropdown redrawn every two seconds would close.
        if gate_active and jobs.any_ended(gate_active):
            st.rerun(scope="app")  # a job just ended: its sync records its composed model
        views_ = jobs.job_views(kind=jobs.TRAIN_GATES) if gate_active else gate_views
        st.dataframe(pd.DataFrame([{
            "id": v["status"].id, "state": v["state"], "steps_done": v["status"].steps_done,
            "moe_path": v["status"].config.get("moe"), "error": v["status"].error,
        } for v in views_]), hide_index=True, key="gate_jobs_table")
        by_id = {v["status"].id: v["status"] for v in views_}
        if job not in by_id:
            return
        status = by_id[job]
        rows = job_progress.read_metrics(status.run_dir)
        grpo = [r for r in rows if r.get("phase") == "grpo"]
        warm = [r for r in rows if r.get("phase") == "warm"]
        if warm:
            st.line_chart(pd.DataFrame(warm).set_index("warm_step")[["kl"]])
        if grpo:
            frame = pd.DataFrame(grpo).set_index("step")
            st.line_chart(frame[["reward_mean", "routing_entropy"]])
            st.area_chart(frame[[c for c in frame.columns if c.startswith("share_")]])
        # Gate movement: norm, distance from the start, routing entropy; warn when the gates
        # have not moved (no group with reward variance, or a dead estimator).
        movement = job_progress.gate_movement(
            status.run_dir, finished=status.state in ("succeeded", "failed", "cancelled"))
        m1, m2, m3, m4, m5 = st.columns(5)
        m1.metric("State", job_progress.learning_signal(status, rows)["state"])
        m2.metric("Gate norm", "-" if movement["gate_norm"] is None
                  else f"{movement['gate_norm']:.4g}")
        m3.metric("Gates moved by", "-" if movement["gate_delta"] is None
                  else f"{movement['gate_delta']:.4g}")
        m4.metric("Routing entropy", "-" if movement["routing_entropy"] is None
                  else f"{movement['routing_entropy']:.3f}")
        m5.metric("GRPO steps with signal",
                  f"{movement['informative_steps']}/{movement['steps']}")
        if movement["shares"]:
            st.caption("Share per slot (last step): " + ", ".join(
                f"{k} {v:.2f}" for k, v in movement["shares"].items()))
        if movement["warning"]:
            st.warning(movement["warning"])
        if any("gate_norm" in r for r in rows):
            st.line_chart(pd.DataFrame([{"row": i, "gate_norm": r["gate_norm"]}
                                        for i, r in enumerate(rows) if "gate_norm" in r])
                          .set_index("row"))
        if job_progress.is_active(status.state):
            total = int(status.config.get("steps") or 1)
            st.progress(min(1.0, len(grpo) / max(total, 1)),
                        text=f"{status.state}: {len(warm)} warm steps, {len(grpo)}/{total} "
                             "GRPO steps")

    if gate_views:
        gate_panel(st.selectbox("Job", [v["status"].id for v in gate_views], key="gate_job"))

# ----------------------------------------------------------------------------- eval
with tab_eval:
    st.subheader("Does composition beat collapse?")
    names = composition.environment_names()
    e_envs = st.multiselect("Held-out environments", names, default=names, key="eval_envs")
    e1, e2 = st.columns(2)
    e_seeds = e1.number_input("Held-out seeds per env", 1, 200, 2, key="eval_seeds")
    e_tokens = e2.number_input("Max tokens per turn", 0, 1024, 0, key="eval_tokens",
                               help="0: from the environments, their longest reference "
                                    "turn in the model's tokens + 25%")
    if not e_tokens:
        _turn_caption(moe, moe_path, e_envs, 2)
    if st.button("Evaluate", key="eval_go", type="primary") and e_envs:
        total = len(e_envs) * composition.eval_policy_count(moe)
        bar = st.progress(0.0, text="evaluating…")
        table = st.empty()
        done: list[dict] = []

        def _row(row: dict) -> None:
            done.append(row)
            bar.progress(len(done) / total, text=f"{row['env']} · {row['policy']}")
            table.dataframe(pd.DataFrame(done), hide_index=True)

        composition.moe_eval(DB, moe_path, e_envs, seeds=int(e_seeds),
                             max_tokens=int(e_tokens) or None, max_turns=2, moe=moe,
                             on_row=_row)
    saved_eval = composition.saved_eval(moe_path)
    if saved_eval:
        used = saved_eval.get("config", {})
        if used.get("max_tokens"):
            st.caption(f"Evaluated with {used['max_tokens']} tokens per turn, "
                       f"{used.get('max_turns')} turns, {used.get('seeds')} seeds per "
                       "environment" + (" (tokens derived from the environments' longest "
                                        "reference turn)" if used.get("turn_budget") else ""))
        st.dataframe(pd.DataFrame(saved_eval["summary"]), hide_index=True)
        st.plotly_chart(views.eval_figure(saved_eval["rows"]), key="eval_chart")
        st.dataframe(pd.DataFrame(saved_eval["rows"]), hide_index=True)
