"""Compare: two runs side by side, and evaluate a policy on the target tasks.

Thin page: every figure comes from `trace_lib.workbench.evaluation` (the same use cases as
`python -m trace_lib compare` / `evaluate` and notebook 05); this file lays out widgets.
Evaluations launched here run as background `evaluate` jobs (`workbench.jobs`: the page
never blocks on a model); each rerun runs the one job sync, which imports finished ones as
datasets (so they appear in the pickers) and gives the job list its statuses.
"""

from __future__ import annotations

import pandas as pd
import streamlit as st

from trace_lib.workbench import data, evaluation, jobs
from trace_lib.workbench.errors import ActionError, StoreError

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
    config["max_tokens"] = int(c.number_input("Max tokens per turn", 8, 2048, 128,
                                              key="eval_max_tokens"))
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
            st.success(f"launched {spec.id}")


def _evaluation_jobs() -> None:
    rows = jobs.evaluation_jobs(SYNCED.statuses if SYNCED else None)
    if not rows:
        return
    st.button("Refresh", key="eval_refresh")
    latest = rows[0]
    total = latest["episodes_total"] or "?"
    st.metric("Latest evaluation", latest["state"],
              help=f"{latest['job_id']}: {latest['episodes_done']}/{total} episodes")
    df = pd.DataFrame(rows)[["job_id", "policy", "state", "episodes_done", "episodes_total",
                             "error"]]
    st.dataframe(df, hide_index=True, width="stretch", key="eval_jobs")


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

compare_tab, evaluate_tab = st.tabs(["Compare two runs", "Evaluate a policy"])
with evaluate_tab:
    _evaluate_form()
    _evaluation_jobs()

# ------------------------------------------------------------------------- compare
with compare_tab:
    datasets = evaluation.datasets(DB) if DB.exists() else []
    if len(datasets) < 2:
        st.info("Comparing needs two datasets: import two runs, or evaluate a policy "
                "(tab *Evaluate a policy*) before and after training.")
        st.stop()
    labels = {d["id"]: f"{d['name']} · {d['agent_model'] or '?'} · {d['trajectories']} runs"
              for d in datasets}
    ids = list(labels)
    left, right = st.columns(2)
    a_id = left.selectbox("Run A", ids, index=1, format_func=labels.get, key="cmp_a")
    b_id = right.selectbox("Run B", ids, index=0, format_func=labels.get, key="cmp_b")
    try:
        result = evaluation.compare(DB, a_id, b_id)
    except ActionError as exc:
        st.error(markdown_literal(exc))
        st.stop()

    for col, key in ((left, "a"), (right, "b")):
        side = result[key]
        lo, hi = side["ci95"]
        col.metric(f"Pass rate {key.upper()}", _pct(side["pass_rate"]),
                   help="trajectories passed / trajectories with an outcome")
        col.caption(markdown_literal(
            f"{side['successes']}/{side['n']} passed · 95% CI {_pct(lo)}-{_pct(hi)}"))
        col.caption(markdown_literal(provenance_line(side)))

    p = result["paired"]
    st.markdown(
        f"**Paired on {p['tasks']} tasks** — A only {p['a_only']} · B only {p['b_only']} · "
        f"both {p['both']} · neither {p['neither']} · exact McNemar p = {p['p_value']:.3g}")
    st.caption(markdown_literal(f"Pairing by task id; {p['rule']}."))
    for note in result["notes"]:
        st.caption(markdown_literal(note))

    tasks = pd.DataFrame(result["tasks"])
    tasks["flipped"] = tasks["flip"].map({"a_only": "passed by A only",
                                          "b_only": "passed by B only"}).fillna("")
    tasks["A"] = tasks.a_successes.astype(str) + "/" + tasks.a_trials.astype(str)
    tasks["B"] = tasks.b_successes.astype(str) + "/" + tasks.b_trials.astype(str)
    st.subheader("Tasks (flipped first)")
    st.dataframe(tasks[["task_id", "flipped", "A", "B"]], hide_index=True, width="stretch",
                 key="cmp_tasks")

    task_id = st.selectbox("Task", tasks.task_id.tolist(), key="cmp_task",
                           format_func=lambda t: t + (" (flipped)" if
                                                      tasks.set_index("task_id").flipped[t]
                                                      else ""))
    pair = evaluation.task_pair(DB, a_id, b_id, task_id)
    st.subheader("Tool calls, aligned")
    st.html(render_pair_html(pair, f"A: {pair.a.id}", f"B: {pair.b.id}"))
    with st.expander("Both transcripts", expanded=False):
        # The Trajectories page's side-by-side: a shared system prompt once, folded.
        st.html(render_side_by_side_html(pair.a, pair.b, f"A: {pair.a.id}", f"B: {pair.b.id}"))

    st.subheader("Capabilities")
    st.plotly_chart(capability_delta_chart(result), width="stretch", key="cmp_caps")
