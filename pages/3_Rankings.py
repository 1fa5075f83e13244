"""Rankings: which capabilities the agent lacks, how stably, and what the kept set explains.

Thin page: `trace_lib.workbench.diagnose.rankings` computes (the use case `rank` calls
too), its `charts` draw; the sliders only choose rho, delta, K and the runs, and every
change re-selects live from the current (edited) labels. The export button offers the
same document as `python -m trace_lib rank --export selected_capabilities.json`.
"""

from __future__ import annotations

import json

import pandas as pd
import streamlit as st

from trace_lib.workbench import data
from trace_lib.workbench import diagnose as wb
from trace_lib.workbench.errors import ActionError

charts = wb.charts

st.set_page_config(page_title="Rankings · TRACE", page_icon="🧭", layout="wide")
st.title("Rankings")
st.caption("Kept iff Cov ≥ rho and Delta ≥ delta in at least K of N labeling runs "
           "(Cov = LF / failed, Delta = ER- − ER+). Undefined ratios are shown as empty.")

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

with st.sidebar:
    st.header("Selection")
    rho = st.slider("rho (min coverage)", 0.0, 1.0, 0.10, 0.01, key="rho")
    delta = st.slider("delta (min contrast)", -1.0, 1.0, 0.20, 0.01, key="delta")
    k = st.slider("K (runs that must pass, of 10)", 1, max(10, len(run_ids)), 8, key="k")
    runs = st.multiselect("Label runs", run_ids, default=run_ids, key="runs")

try:
    view = wb.rankings(DB, wb.RankConfig(rho=rho, delta=delta, k=k, runs=runs or None))
except ActionError as exc:
    st.error("Could not rank:", icon="🚫")
    st.code(str(exc), language=None)  # may quote run names: shown as text, not markdown
    st.stop()

ranking, kept, curve, clusters, doc = (view.ranking, view.kept, view.cover, view.clusters,
                                       view.document)
if ranking.note:
    st.info(ranking.note)
st.metric("Kept capabilities", f"{len(kept)} of {len(ranking.rows)}",
          help=", ".join(kept) or "none")


def _fmt(x: float | None) -> float | None:
    return None if x is None else round(x, 3)


table = pd.DataFrame([{
    "capability": r.capability, "kept": r.selected, "status": r.status,
    "mean Cov": _fmt(r.mean_cov), "std Cov": _fmt(r.std_cov),
    "mean Delta": _fmt(r.mean_delta), "std Delta": _fmt(r.std_delta),
    "runs passed": f"{r.n_runs_passed}/{r.n_runs_total}",
    "runs defined": r.n_runs_defined,
    "ER- 95% CI": None if r.er_minus_ci is None else f"{r.er_minus_ci[0]:.2f}–{r.er_minus_ci[1]:.2f}",
    "ER+ 95% CI": None if r.er_plus_ci is None else f"{r.er_plus_ci[0]:.2f}–{r.er_plus_ci[1]:.2f}",
    "Fisher p": None if r.fisher_p is None else float(f"{r.fisher_p:.3g}"),
    "LF/PF/NF": f"{r.pooled['lf']}/{r.pooled['pf']}/{r.pooled['nf']}",
    "LP/PP/NP": f"{r.pooled['lp']}/{r.pooled['pp']}/{r.pooled['np']}",
} for r in ranking.rows])
st.dataframe(table, hide_index=True, width="stretch", key="rank_table")

st.download_button("Export selected_capabilities.json", json.dumps(doc, indent=2),
                   file_name="selected_capabilities.json", mime="application/json",
                   disabled=not doc, key="export")

left, right = st.columns(2)
with left:
    st.subheader("Coverage vs contrast")
    st.plotly_chart(charts.coverage_contrast(ranking), key="scatter")
    st.subheader("K-of-N")
    st.plotly_chart(charts.k_of_n_bars(ranking), key="kofn")
with right:
    st.subheader("Stability: Delta per run")
    st.plotly_chart(charts.delta_per_run(ranking), key="strip")
    st.subheader("Greedy cover of failures by the kept set")
    if curve:
        st.plotly_chart(charts.cover_curve(curve), key="cover")
        last = curve[-1]
        st.caption(f"The kept set explains {last['covered']} of {last['n_failed']} failed "
                   "trajectories (lacking in at least one kept capability).")
    else:
        st.caption("Nothing kept at these thresholds.")

st.subheader("Failure clusters by lacking signature")
if clusters:
    st.plotly_chart(charts.cluster_bars(clusters), key="clusters")
    st.dataframe(pd.DataFrame(clusters), hide_index=True, key="cluster_table")
