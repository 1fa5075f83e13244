"""Compare: two runs side by side, and evaluate a policy on the target tasks.

Thin page: every figure comes from `trace_lib.workbench.evaluation` (the same use cases as
`python -m trace_lib compare` / `evaluate` and notebook 05); this file lays out widgets.
- A side is two pickers, dataset and agent model ("all agent models" or one of the
  dataset's): `evaluation.Side`, what `compare DATASET@AGENT_MODEL` takes. The page opens
  on `evaluation.compare_choices`' default, a pair that shares tasks (the demo's scripted
  agents against each other when the demo is all there is), or on an empty choice with a
  sentence when no two sides share a task; a pair chosen by hand that cannot be compared
  is explained as a warning, never a red error.
- Beside each pass rate, the do-nothing floor on the same tasks (unknown, with the
  reason, for runs the workbench did not score); the paired table marks the tasks that
  pass by doing nothing. An empty capability chart is a sentence saying why instead.
- Evaluations launched here run as background `evaluate` jobs (`workbench.jobs`: the page
  never blocks on a model). A full run shows the one job sync's statuses (the sync also
  imports finished ones as datasets, so they appear in the pickers); while an evaluation
  is active the job list is a fragment that re-reads the run directories every two
  seconds and reruns the page when one ended. A launch reruns the page, so the new job
  is listed from the sync, never from what the launch returned.
"""

from __future__ import annotations

import pandas as pd
import streamlit as st

from trace_lib.workbench import data, evaluation, job_progress, jobs
from trace_lib.workbench.errors import ActionError, StoreError, UserInputError

capability_delta_chart = evaluation.compare_views.capability_delta_chart
provenance_line = evaluation.compare_views.provenance_line
render_pair_html = evaluation.compare_views.render_pair_html
markdown_literal = evaluation.untrusted_text.markdown_literal
render_side_by_side_html = evaluation.transcript_render.render_side_by_side_html

st.set_page_config(page_title="Compare · TRACE", page_icon="⚖️", layout="wide")
st.title("Compare")

DB = data.db_path()


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.1%}"


# ------------------------------------------------------------------------ evaluate
def _evaluate_form() -> None:
    st.caption("Run a policy on the domain's target tasks (the demo's task set) as a "
               "background job; the result becomes a dataset you can compare.")
    try:
        parts = evaluation.policies(DB)
    except StoreError as exc:
        st.error(markdown_literal(exc))
        return
    kind = st.radio("Policy", ["base model", "base + adapter", "composed model",
                               "composed, per request (as vLLM serves it)",
                               "OpenAI-compatible endpoint"], key="eval_kind")
    config: dict = {}
    if kind.startswith("composed, per request"):
        config["router"] = st.text_input(
            "Router folder", key="eval_router",
            help="what `moe-merge --per-request --out` wrote: one adapter per capability "
                 "and the gates' router; each episode goes to the adapter its request "
                 "routes to") or None
        if not config["router"]:
            st.info("Give the folder `moe-merge --per-request --out` wrote (Routing page, "
                    "or the CLI).")
            return
        url = st.text_input("Server URL (blank: a local server loads the adapters)",
                            key="eval_router_url")
        if url:
            config["server_url"] = url
            config["served_model"] = st.text_input("Served base model name",
                                                   key="eval_router_served") or None
    elif kind == "OpenAI-compatible endpoint":
        config["server_url"] = st.text_input("Server URL", "http://127.0.0.1:8000/v1",
                                             key="eval_url")
        config["served_model"] = st.text_input("Served model name", key="eval_served")
    else:
        config["model"] = st.text_input("Base model", "tiny", key="eval_model",
                                        help="tiny | smollm2-135m | a HF folder")
    if kind == "base + adapter":
        adapters = {a["path"]: f"{a['capability']} · {a['environment']} · {a['job_id']}"
                    for a in parts["adapters"]}
        if not adapters:
            st.info("No trained adapter recorded yet (Training page).")
            return
        config["adapter"] = st.selectbox("Adapter", list(adapters), format_func=adapters.get,
                                         key="eval_adapter")
    if kind == "composed model":
        moes = {m["path"]: f"{m['id']} · {m['mode']} · "
                f"{', '.join(a.get('name', '?') for a in m['adapters'])}" for m in parts["moe"]}
        if not moes:
            st.info("No composed model recorded yet (Routing page).")
            return
        config["moe"] = st.selectbox("Composed model", list(moes), format_func=moes.get,
                                     key="eval_moe")
    a, b, c = st.columns(3)
    config["domain"] = a.selectbox("Domain", evaluation.task_set_domains(), key="eval_domain")
    splits = {s["name"]: s for s in evaluation.task_splits()}
    config["split"] = c.selectbox(
        "Split", list(splits), key="eval_split",
        format_func=lambda n: f"{n} ({splits[n]['size']} tasks)",
        help="; ".join(f"{n}: {s['purpose']}" for n, s in splits.items()))
    n_tasks = b.number_input("Tasks (0 = all)", 0, max(s["size"] for s in splits.values()), 5,
                             key="eval_tasks")
    config["tasks"] = int(n_tasks) or None
    config["trials"] = int(c.number_input("Trials", 1, 16, 1, key="eval_trials"))
    config["tools"] = a.radio("Tools", ["all", "capability"], key="eval_tools",
                              help="capability: only the tools the task set uses")
    config["max_turns"] = int(b.number_input("Max turns", 1, 30, 8, key="eval_turns"))
    config["max_tokens"] = int(c.number_input(
        "Max tokens per turn", 0, 2048, 0, key="eval_max_tokens",
        help="0: the tasks' longest reference turn in the policy's tokens + 25%")) or None
    config["temperature"] = float(a.number_input("Temperature", 0.0, 2.0, 0.0, 0.1,
                                                 key="eval_temperature"))
    ctx = b.number_input("Context (0 = the model's)", 0, 131072, 0, key="eval_ctx")
    config["max_model_len"] = int(ctx) or None
    if st.button("Launch evaluation", key="eval_launch", type="primary"):
        try:
            spec = jobs.submit_evaluation(DB, config)
        except ActionError as exc:
            st.error(markdown_literal(exc))
        else:
            st.session_state["eval_job"] = spec.id
            st.session_state["eval_launched"] = f"launched {spec.id}"
            st.rerun()  # the sync at the top lists the new job, as every later run does
    if launched := st.session_state.pop("eval_launched", None):
        st.success(launched)


if not DB.exists():
    st.info(f"No database at `{DB}` yet. Load the demo with `make demo`, import runs with "
            "`python -m trace_lib ingest PATH...`, or evaluate a model below.")

try:
    SYNCED = jobs.sync(DB) if DB.exists() else None
except ActionError as exc:
    SYNCED = None
    st.error(markdown_literal(exc))
for item in SYNCED.evaluations if SYNCED else []:
    st.toast(f"evaluation imported: {item['dataset']}")
# The evaluations this full run saw active: the job list polls while there are any.
WATCHED = jobs.active(SYNCED.statuses if SYNCED else jobs.run_dir_statuses(), jobs.EVALUATE)
EVAL_ROWS = jobs.evaluation_jobs(SYNCED.statuses if SYNCED else None)


@st.fragment(run_every="2s" if WATCHED else None)
def _evaluation_jobs() -> None:
    # While an evaluation is active: its run directory every two seconds (never the
    # store), and a full rerun once it ended, whose sync imports it.
    if WATCHED and jobs.any_ended(WATCHED):
        st.rerun(scope="app")
    rows = jobs.evaluation_jobs() if WATCHED else EVAL_ROWS
    if not rows:
        return
    st.button("Refresh", key="eval_refresh")
    latest = rows[0]
    total = latest["episodes_total"] or "?"
    st.metric("Latest evaluation", latest["state"],
              help=f"{latest['job_id']}: {latest['episodes_done']}/{total} episodes")
    if job_progress.is_active(latest["state"]):
        st.caption("This list follows the job every two seconds; the run becomes a "
                   "dataset when it has finished.")
    df = pd.DataFrame(rows)[["job_id", "policy", "state", "episodes_done", "episodes_total",
                             "error"]]
    st.dataframe(df, hide_index=True, width="stretch", key="eval_jobs")


compare_tab, evaluate_tab = st.tabs(["Compare two runs", "Evaluate a policy"])
with evaluate_tab:
    _evaluate_form()
    _evaluation_jobs()

# ------------------------------------------------------------------------- compare
ALL_AGENTS = ""  # the agent picker's "whole dataset" choice


def _side_pickers(col, key: str, by_id: dict, default) -> evaluation.Side | None:
    """A side's two pickers (dataset, agent model); the first visit opens on `default`."""
    ds_key, agent_key = f"cmp_{key}", f"cmp_{key}_agent"
    if ds_key not in st.session_state:
        st.session_state[ds_key] = default.dataset if default else None
        st.session_state[agent_key] = (default.agent_model or ALL_AGENTS) if default \
            else ALL_AGENTS
    elif st.session_state[ds_key] not in by_id:  # deleted since: back to no choice
        st.session_state[ds_key] = None
    ds_id = col.selectbox(
        f"Run {key.upper()}", list(by_id), key=ds_key, placeholder="choose a dataset",
        format_func=lambda i: f"{by_id[i]['name']} · {_agents_text(by_id[i])} · "
                              f"{by_id[i]['trajectories']} runs")
    agents = [ALL_AGENTS] + (by_id[ds_id]["agent_models"] if ds_id else [])
    if st.session_state.get(agent_key) not in agents:  # another dataset was chosen
        st.session_state[agent_key] = ALL_AGENTS
    agent = col.selectbox(
        f"Agent model {key.upper()}", agents, key=agent_key, disabled=ds_id is None,
        format_func=lambda m: m or f"all agent models ({len(agents) - 1})",
        help="narrow the side to one agent model's runs (compare DATASET@AGENT_MODEL)")
    return evaluation.Side(ds_id, agent or None) if ds_id else None


def _agents_text(d: dict) -> str:
    models = d["agent_models"]
    return models[0] if len(models) == 1 else (f"{len(models)} agent models" if models
                                                else "?")


def _floor_text(fl: dict) -> str:
    if fl["status"] == "unknown":
        return "unknown"
    return _pct(fl["pass_rate"])


with compare_tab:
    try:
        choices = evaluation.compare_choices(DB) if DB.exists() else {"datasets": [],
                                                                       "default": None}
    except ActionError as exc:
        st.error(markdown_literal(exc))
        st.stop()
    by_id = {d["id"]: d for d in choices["datasets"]}
    if not by_id:
        st.info("Comparing needs runs: import a run, or evaluate a policy (tab *Evaluate a "
                "policy*) before and after training.")
        st.stop()
    left, right = st.columns(2)
    side_a = _side_pickers(left, "a", by_id, choices["default"] and choices["default"][0])
    side_b = _side_pickers(right, "b", by_id, choices["default"] and choices["default"][1])
    if side_a is None or side_b is None:
        if choices["default"] is None:
            st.info("No two runs here share a task yet, so there is nothing to pair: a "
                    "comparison pairs tasks by id. Evaluate a policy on the target tasks "
                    "(tab *Evaluate a policy*), import a run of the same tasks, or pick "
                    "two runs above to see what they hold.")
        else:
            st.info("Choose a run on each side (a dataset, optionally one agent model of "
                    "it) to compare them.")
        st.stop()
    try:
        with st.spinner("Comparing (the do-nothing floor runs each task's verifier once)…"):
            result = evaluation.compare(DB, side_a, side_b)
    except UserInputError as exc:  # a pair chosen by hand that cannot be compared
        st.warning(markdown_literal(exc))
        st.stop()
    except ActionError as exc:
        st.error(markdown_literal(exc))
        st.stop()

    for col, key in ((left, "a"), (right, "b")):
        side, fl = result[key], result["floor"][key]
        lo, hi = side["ci95"]
        rate, idle = col.columns(2)
        rate.metric(f"Pass rate {key.upper()}", _pct(side["pass_rate"]),
                    help="trajectories passed / trajectories with an outcome")
        idle.metric(f"Do-nothing floor {key.upper()}", _floor_text(fl),
                    help="the share of the same tasks that a policy making no call and "
                         "saying nothing passes, by the verifier that scored this run")
        col.caption(markdown_literal(
            f"{side['successes']}/{side['n']} passed · 95% CI {_pct(lo)}-{_pct(hi)}"))
        if fl["status"] == "unknown":
            col.caption(markdown_literal(f"Floor unknown: {fl['why_unknown']}."))
        else:
            col.caption(markdown_literal(
                f"{fl['passes']}/{fl['tasks']} tasks pass by doing nothing"
                + (f" ({fl['unknown_tasks']} unknown)" if fl["unknown_tasks"] else "")))
        col.caption(markdown_literal(provenance_line(side)))

    p, pf = result["paired"], result["floor"]["paired"]
    idle_paired = (f" · {pf['passes']} of the paired tasks pass by doing nothing"
                   if pf["status"] != "unknown" else "")
    st.markdown(
        f"**Paired on {p['tasks']} tasks** — A only {p['a_only']} · B only {p['b_only']} · "
        f"both {p['both']} · neither {p['neither']} · exact McNemar p = {p['p_value']:.3g}"
        + idle_paired)
    st.caption(markdown_literal(f"Pairing by task id; {p['rule']}."))
    for note in result["notes"]:
        st.caption(markdown_literal(note))

    tasks = pd.DataFrame(result["tasks"])
    tasks["flipped"] = tasks["flip"].map({"a_only": "passed by A only",
                                          "b_only": "passed by B only"}).fillna("")
    tasks["A"] = tasks.a_successes.astype(str) + "/" + tasks.a_trials.astype(str)
    tasks["B"] = tasks.b_successes.astype(str) + "/" + tasks.b_trials.astype(str)
    tasks["doing nothing"] = tasks.passes_by_doing_nothing.map(
        {True: "passes", False: ""}).fillna("unknown")
    st.subheader("Tasks (flipped first)")
    st.caption("*doing nothing*: whether a policy that makes no call and says nothing "
               "passes the task (a pass there is no evidence of skill).")
    st.dataframe(tasks[["task_id", "flipped", "A", "B", "doing nothing"]], hide_index=True,
                 width="stretch", key="cmp_tasks")

    marks = tasks.set_index("task_id")

    def _task_label(t: str) -> str:
        row = marks.loc[t]
        return t + (" (flipped)" if row.flipped else "") + (
            " (passes by doing nothing)" if row["doing nothing"] == "passes" else "")

    task_id = st.selectbox("Task", tasks.task_id.tolist(), key="cmp_task",
                           format_func=_task_label)
    pair = evaluation.task_pair(DB, side_a, side_b, task_id)
    st.subheader("Tool calls, aligned")
    st.html(render_pair_html(pair, f"A: {pair.a.id}", f"B: {pair.b.id}"))
    with st.expander("Both transcripts", expanded=False):
        # The Trajectories page's side-by-side: a shared system prompt once, folded.
        st.html(render_side_by_side_html(pair.a, pair.b, f"A: {pair.a.id}", f"B: {pair.b.id}"))

    st.subheader("Capabilities")
    if result["capabilities"]:
        st.plotly_chart(capability_delta_chart(result), width="stretch", key="cmp_caps")
    else:  # an empty chart says nothing: say why there is none
        st.info(markdown_literal(result["capability_note"]))
