"""Rankings: which capabilities the agent lacks, how stably, and what the kept set explains.

Thin page: `trace_lib.workbench.diagnose.rankings` computes (the use case `rank` calls
too), its `ranking_charts` draw; the sliders only choose rho, delta, K and the runs, the scope
picker the datasets / agent models / domains, and every change re-selects live from the
current (edited) labels. The export button offers the same document as
`python -m trace_lib rank --export selected_capabilities.json` (with the same scope flags).

Everything shown comes from ONE cached result (`_result`), keyed by the store version
(`wb.rankings_state`: it changes with every label run, edit, undo or capability change)
and the page's inputs: the table, the figures (built once per result) and the export text.
A rerun on an unchanged store with the same inputs recomputes nothing.

What no slider moves (bootstrap stability's resamples, the failure clusters, and the
failed trajectories' cover signatures and examples that any kept set's cover and export
document follow from) is computed when a label run finishes and stored; the ranking
reads it. When it is missing for the
current labels (after an edit, an undo, a capability change, or for another scope, run
set or B) the page computes it first inside an `st.status` box with a progress bar and
says it is stored for the next visit: seconds at 1M trajectories, never a silent wait.

Undefined is not zero, and the table says so with one marker, `EMPTY` ("—"): a ratio
over an empty denominator, a missing interval or p-value. The figures are text for that
(the data grid draws a missing number as "None"), fixed to three decimals and
right-aligned. The cover counts labelled failures and says how many are not labelled.
"""

from __future__ import annotations

import json

import pandas as pd
import streamlit as st

from trace_lib.workbench import data
from trace_lib.workbench import diagnose as wb
from trace_lib.workbench.errors import ActionError

charts = wb.ranking_charts

st.set_page_config(page_title="Rankings · TRACE", page_icon="🧭", layout="wide")
st.title("Rankings")
EMPTY = "—"  # an undefined figure: never 0, never "None"
st.caption("Kept iff Cov ≥ rho and Delta ≥ delta in at least K of N labeling runs "
           f"(Cov = LF / failed, Delta = ER- − ER+). Undefined ratios are shown as {EMPTY}.")

DB = data.db_path()
if not DB.exists():
    st.info(f"No database at `{DB}` yet: import trajectories and label them first "
            "(`python -m trace_lib demo build`, then `python -m trace_lib label`).")
    st.stop()

run_ids = wb.run_ids(DB)
if not run_ids:
    st.info("No labels yet. Run a labeler on the Labels page or with "
            "`python -m trace_lib label --labeler heuristic`.")
    st.stop()

opts = wb.scope_options(DB)
with st.sidebar:
    st.header("Scope")
    scope = wb.pick_scope(st.multiselect, opts)
    st.header("Selection")
    rho = st.slider("rho (min coverage)", 0.0, 1.0, 0.10, 0.01, key="rho")
    delta = st.slider("delta (min contrast)", -1.0, 1.0, 0.20, 0.01, key="delta")
    k = st.slider("K (runs that must pass, of 10)", 1, max(10, len(run_ids)), 8, key="k")
    runs = st.multiselect("Label runs", run_ids, default=run_ids, key="runs")
    st.header("Stability")
    stab_method = st.selectbox(
        "K-of-N over", ["auto", "runs", "bootstrap"], key="stability",
        help="runs: independent label runs. bootstrap: B resamples of the trajectories "
             "(with replacement, within failed and within passed). auto: bootstrap when the "
             "runs cannot differ (one run, or a deterministic labeler's identical runs).")
    # The default B is the one a label run's finish stores (`StabilityConfig()`).
    stab_b = st.number_input("Bootstrap resamples (B)", 10, 2000, wb.StabilityConfig().b, 10,
                             key="stability_b")


def _fmt(x: float | None) -> str:
    return EMPTY if x is None else f"{x:.3f}"


def _ci(ci: tuple[float, float] | None) -> str:
    return EMPTY if ci is None else f"{ci[0]:.2f}–{ci[1]:.2f}"


# The figures are text (see the module docstring): right-aligned like numbers.
FIGURE_COLUMNS = ("mean Cov", "std Cov", "mean Delta", "std Delta", "ER- 95% CI",
                  "ER+ 95% CI", "Fisher p")
TABLE_CONFIG = {c: st.column_config.TextColumn(c, alignment="right") for c in FIGURE_COLUMNS}


@st.cache_data(max_entries=64, show_spinner="Ranking…")
def _result(db: str, version: tuple, cfg: tuple, stability: tuple, scope: tuple) -> dict:
    """The page's one query result: ranking view, table, figures and export text."""
    rho_, delta_, k_, runs_ = cfg
    config = wb.RankConfig(rho=rho_, delta=delta_, k=k_, runs=list(runs_) if runs_ else None)
    view = wb.rankings(db, config,
                       stability=wb.StabilityConfig(method=stability[0], b=stability[1]),
                       scope=wb.Scope(*scope))
    r = view.ranking
    table = pd.DataFrame([{
        "capability": c.capability, "kept": c.selected, "status": c.status,
        "mean Cov": _fmt(c.mean_cov), "std Cov": _fmt(c.std_cov),
        "mean Delta": _fmt(c.mean_delta), "std Delta": _fmt(c.std_delta),
        "runs passed": f"{c.n_runs_passed}/{c.n_runs_total}",
        "runs defined": c.n_runs_defined,
        "ER- 95% CI": _ci(c.er_minus_ci), "ER+ 95% CI": _ci(c.er_plus_ci),
        # Text, not a float: 3.2e-07 stays readable, an underflow says "< 1e-300".
        "Fisher p": wb.format_p(c.fisher_p) or EMPTY,
        "LF/PF/NF": f"{c.pooled['lf']}/{c.pooled['pf']}/{c.pooled['nf']}",
        "LP/PP/NP": f"{c.pooled['lp']}/{c.pooled['pp']}/{c.pooled['np']}",
    } for c in r.rows])
    figs = {"scatter": charts.coverage_contrast(r), "kofn": charts.k_of_n_bars(r),
            "strip": charts.delta_per_run(r),
            "cover": charts.cover_curve(view.cover) if view.cover else None,
            "clusters": charts.cluster_bars(view.clusters) if view.clusters else None}
    return {"view": view, "table": table, "figs": figs,
            "export": json.dumps(view.document, indent=2) + "\n"}


def _prepare(stability: wb.StabilityConfig) -> None:
    """The view's threshold-free parts for the current labels (bootstrap resamples,
    failure clusters), computed in view of the person: a label run's finish stores them
    for the default view; an edit makes them stale."""
    with st.status("Computing the stability and the failure clusters for the current "
                   "labels (once per label change; stored for the next visit)…",
                   expanded=True) as box:
        bar = st.progress(0.0, text="starting")
        wb.prepare_rankings(DB, list(runs) or None, stability, scope,
                            progress=lambda f, text: bar.progress(min(max(f, 0.0), 1.0),
                                                                  text=text))
        box.update(label="Stability and failure clusters computed and stored",
                   state="complete", expanded=False)


try:
    stab = wb.StabilityConfig(method=stab_method, b=int(stab_b))
    state = wb.rankings_state(DB, list(runs) or None, stab, scope)
    if state.pending:
        _prepare(stab)
    res = _result(str(DB), state.version, (rho, delta, k, tuple(runs) or None),
                  (stab_method, int(stab_b)),
                  (scope.datasets, scope.agent_models, scope.domains))
except ActionError as exc:
    st.error("Could not rank:", icon="🚫")
    st.code(str(exc), language=None)  # may quote run names: shown as text, not markdown
    st.stop()

view, figs = res["view"], res["figs"]
ranking, kept, curve, clusters, doc = (view.ranking, view.kept, view.cover, view.clusters,
                                       view.document)
st.caption(f"Scope: {scope.describe()}", help="choose datasets, agent models or domains in "
           "the sidebar; the CLI takes the same as --dataset / --agent-model / --domain")
if ranking.note:
    st.info(ranking.note)
if view.stability is not None and view.stability.method == "runs":
    st.caption(view.stability.sentence().capitalize() + ".")
st.metric("Kept capabilities", f"{len(kept)} of {len(ranking.rows)}",
          help=", ".join(kept) or "none")
with st.container(key="rank_table_box"):  # a stable handle for browser tests
    st.dataframe(res["table"], hide_index=True, width="stretch", key="rank_table",
                 column_config=TABLE_CONFIG)

st.download_button("Export selected_capabilities.json", res["export"],
                   file_name="selected_capabilities.json", mime="application/json",
                   disabled=not doc, key="export")

left, right = st.columns(2)
with left:
    st.subheader("Coverage vs contrast")
    st.plotly_chart(figs["scatter"], key="scatter")
    st.subheader("K-of-N")
    st.plotly_chart(figs["kofn"], key="kofn")
with right:
    st.subheader("Stability: Delta per run (or per resample)")
    st.plotly_chart(figs["strip"], key="strip")
    st.subheader("Greedy cover of failures by the kept set")
    if curve:
        st.plotly_chart(figs["cover"], key="cover")
        last = curve[-1]
        unlabelled = last.get("n_unlabelled", 0)
        st.caption(f"The kept set explains {last['covered']} of {last['n_failed']} labelled "
                   "failed trajectories (lacking in at least one kept capability)."
                   + (f" {unlabelled} more failed trajectories have no label for a kept "
                      "capability: not counted (label them on the Labels page)."
                      if unlabelled else ""))
    else:
        st.caption("Nothing kept at these thresholds.")

st.subheader("Failure clusters by lacking signature")
if clusters:
    st.caption(f"A failed trajectory no label run covered is {wb.UNLABELLED}, not "
               f"{wb.NONE_LACKING}.")
    st.plotly_chart(figs["clusters"], key="clusters")
    st.dataframe(pd.DataFrame(clusters), hide_index=True, key="cluster_table")
