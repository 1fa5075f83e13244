"""Trajectories: filter, chart, cluster and read the agent's logged runs.

Thin page: every number comes from `trace_lib.workbench.explore` (the `explore` verbs call
the same functions), uploads go through `trace_lib.workbench.data.import_files` (what the
`ingest` verb calls); this file only lays out widgets. The use cases open short
read-only connections, so a CLI writer is blocked for milliseconds at most.
"""

from __future__ import annotations

import streamlit as st

from trace_lib.workbench import data, explore
from trace_lib.workbench.errors import ActionError, StoreError, UserInputError
from trace_lib.workbench.explore import TrajectoryFilter

charts, transcript = explore.charts, explore.transcript_views

st.set_page_config(page_title="Trajectories · TRACE", page_icon="🧭", layout="wide")
st.title("Trajectories")

DB = data.db_path()
OUTCOME_CHOICES = {"all": (), "failures": ("failure",), "successes": ("success",),
                   "unknown": ("unknown",), "errors": ("error",)}


# ------------------------------------------------------------------------- upload
def _upload() -> None:
    files = st.file_uploader("Import trajectory files", accept_multiple_files=True,
                             type=["json", "jsonl", "traj", "eval", "gz"], key="upload_files")
    skip = st.checkbox("Skip invalid records (report them instead of failing)",
                       key="upload_skip")
    # Same overrides as `ingest --domain / --agent-model`: empty keeps what the file says.
    domain = st.text_input("Domain (optional override)", key="upload_domain").strip() or None
    agent_model = st.text_input("Agent model (optional override)",
                                key="upload_agent_model").strip() or None
    if st.button("Import", disabled=not files, key="upload_go"):
        bar = st.progress(0.0, text="importing")
        for i, f in enumerate(files or []):
            try:
                report = data.import_files([data.Upload(f.name, f.getvalue())], db=DB,
                                           skip_invalid=skip, domain=domain,
                                           agent_model=agent_model)
            except ActionError as exc:
                # the same text the CLI prints; escaped because st.error renders markdown
                st.error(transcript.markdown_literal(exc))
            else:
                st.success(f"imported {report.trajectories} trajectories")
                st.code(report.summary(), language=None)
            bar.progress((i + 1) / len(files), text=f"imported {i + 1}/{len(files)}")


with st.sidebar.expander("Upload", expanded=not DB.exists()):
    _upload()

if not DB.exists():
    st.info(
        f"No database at `{DB}` yet. Load the demo with `make demo` "
        "(or `python -m trace_lib demo build`), import files with "
        "`python -m trace_lib ingest PATH...`, or upload files in the sidebar."
    )
    st.stop()

try:
    options = explore.filter_options(DB)
except StoreError as exc:
    st.error(str(exc))
    st.stop()

if options.empty:
    st.info(
        "The store holds no trajectories yet. Load the demo with `make demo`, import files "
        "with `python -m trace_lib ingest PATH...`, or upload files in the sidebar."
    )
    st.stop()


# ------------------------------------------------------------------------- filters
def _choices(field: str) -> dict[str, str]:
    sub = options[options.field == field]
    unit = " calls" if field == "tool" else ""
    return {str(v): f"{lbl} ({n}{unit})" for v, lbl, n in zip(sub.value, sub.label, sub.n,
                                                                strict=True)}


def _multi(label: str, field: str) -> tuple[str, ...]:
    choices = _choices(field)
    picked = st.sidebar.multiselect(label, list(choices), format_func=choices.get,
                                    key=f"f_{field}")
    return tuple(picked)


st.sidebar.header("Filters")
outcome = st.sidebar.radio("Outcome", list(OUTCOME_CHOICES), horizontal=True, key="f_outcome")
flt = TrajectoryFilter(
    datasets=_multi("Dataset", "dataset"),
    domains=_multi("Domain", "domain"),
    agent_models=_multi("Agent model", "agent_model"),
    outcomes=OUTCOME_CHOICES[outcome],
    terminations=_multi("Termination reason", "termination"),
    tools_used=_multi("Tool used", "tool"),
    tool_error={"any": None, "with tool errors": True, "without": False}[
        st.sidebar.radio("Tool errors", ["any", "with tool errors", "without"],
                         horizontal=True, key="f_tool_error")],
    error_kinds=_multi("Tool error kind", "error_kind"),
    text=st.sidebar.text_input("Text contains", key="f_text"),
)

ov = explore.overview(DB, flt, limit=500)
summary, by_domain, terms = ov.summary.iloc[0], ov.by_domain, ov.terminations
hist, errs, listing = ov.tool_calls, ov.error_kinds, ov.listing

c1, c2, c3, c4, c5 = st.columns(5)
c1.metric("Trajectories", int(summary.n_trajectories))
rate = summary.success_rate
c2.metric("Success rate", "—" if rate != rate or rate is None else f"{rate:.1%}")
c3.metric("Failures", int(summary.n_failure))
c4.metric("Tasks", int(summary.n_tasks))
c5.metric("Tool errors", int(summary.n_tool_errors))

def _db_version() -> float:
    # DuckDB writes land in the .wal first; either file changing means new data.
    wal = DB.with_name(DB.name + ".wal")
    return DB.stat().st_mtime + (wal.stat().st_mtime if wal.exists() else 0.0)


@st.cache_data(show_spinner="computing failure signatures", max_entries=16)
def _signatures(db: str, version: float, f: TrajectoryFilter):
    # Signatures join expected actions with every call: ~1 s at 100k trajectories, so
    # they are cached per (store version, filter) rather than recomputed on each rerun.
    return explore.signature_counts(db, f)


@st.cache_data(show_spinner=False, max_entries=16)
def _missing(db: str, version: float, f: TrajectoryFilter, failures_only: bool) -> int:
    # Hashes every in-scope failure's text; cached like the signatures.
    return explore.missing_embeddings(db, f, failures_only=failures_only)


sigs = _signatures(str(DB), _db_version(), flt)
open_key = "open_trajectory"


def _open_on_change(source: str, tid: str | None) -> None:
    # Selections persist across reruns; apply one only when it changes, so a later pick in
    # the Trajectory selectbox is not overridden by a stale chart or table selection.
    last = f"_last_{source}"
    if tid and st.session_state.get(last) != tid:
        st.session_state[open_key] = tid
    st.session_state[last] = tid


tab_charts, tab_sig, tab_sem = st.tabs(["Charts", "Failure clusters", "Semantic clusters"])

with tab_charts:
    a, b = st.columns(2)
    a.plotly_chart(charts.success_rate_chart(by_domain), width="stretch")
    b.plotly_chart(charts.termination_chart(terms), width="stretch")
    a, b = st.columns(2)
    a.plotly_chart(charts.tool_calls_chart(hist), width="stretch")
    b.plotly_chart(charts.tool_errors_chart(errs), width="stretch")

with tab_sig:
    st.caption(
        "Each failure's signature: termination reason › first tool that returned an error › "
        "that error's kind › first expected action the agent did not reproduce."
    )
    if sigs.empty:
        st.info("No failures in this filter.")
    else:
        st.plotly_chart(charts.signature_treemap(sigs), width="stretch")
        labels = {p: f"{p}  ({n})" for p, n in zip(sigs.path, sigs.n, strict=True)}
        pick = st.selectbox("Cluster", list(labels), format_func=labels.get, key="sig_pick")
        members = explore.signature_members(DB, flt, path=pick.split(explore.PATH_SEP))
        st.caption("Select a row to open its transcript below.")
        ev = st.dataframe(members, hide_index=True, width="stretch", key="sig_members",
                          on_select="rerun", selection_mode="single-row")
        rows_sel = ev.selection.rows if ev and ev.selection else []
        _open_on_change("sig", members.trajectory_id.iloc[rows_sel[0]] if rows_sel else None)

with tab_sem:
    failures_only = st.toggle("Failures only", value=True, key="sem_failures_only")
    n_missing = _missing(str(DB), _db_version(), flt, failures_only)
    if n_missing:
        st.write(f"{n_missing} trajectories in this filter have no up-to-date embedding.")
        if st.button(f"Embed {n_missing} trajectories", key="sem_embed"):
            bar = st.progress(0.0, text="embedding")

            def _tick(done: int, total: int) -> None:
                bar.progress(done / total if total else 1.0, text=f"embedded {done}/{total}")

            rep = explore.embed(DB, flt, failures_only=failures_only, progress=_tick)
            st.success(f"embedded {rep.n_computed}, reused {rep.n_cached}")
            st.rerun()
    k = st.slider("Clusters (0 = choose by silhouette)", 0, 12, 0, key="sem_k")

    @st.cache_data(show_spinner="clustering", max_entries=8)
    def _semantic(db: str, mtime: float, f: TrajectoryFilter, k: int, fo: bool):
        return explore.semantic_clusters(db, f, k=k or None, failures_only=fo)

    smap = _semantic(str(DB), _db_version(), flt, k, failures_only)
    if smap.points.empty:
        st.info("Nothing embedded in this filter yet.")
    else:
        st.caption(f"k = {smap.k}" + (f", silhouette {smap.silhouette:.2f}"
                                      if smap.silhouette is not None else "")
                   + " · click a point to open its transcript below")
        event = st.plotly_chart(charts.semantic_map(smap.points), on_select="rerun",
                                selection_mode="points", key="sem_map", width="stretch")
        pts = (event.selection.points if event and event.selection else []) or []
        _open_on_change("map", pts[0]["customdata"][0] if pts and pts[0].get("customdata")
                        else None)
        st.dataframe(smap.clusters, hide_index=True, width="stretch")
        cid = st.selectbox("Typical members of cluster", smap.clusters.cluster.tolist(),
                           key="sem_cluster")
        typical = smap.points[smap.points.cluster == cid].sort_values("typical_rank").head(5)
        ev = st.dataframe(
            typical[["trajectory_id", "task_id", "outcome", "termination", "distance", "text"]],
            hide_index=True, width="stretch", key="sem_typical", on_select="rerun",
            selection_mode="single-row")
        rows_sel = ev.selection.rows if ev and ev.selection else []
        _open_on_change("typical",
                        typical.trajectory_id.iloc[rows_sel[0]] if rows_sel else None)

st.subheader(f"Trajectories ({len(listing)}{'+' if len(listing) >= 500 else ''})")
picked = st.dataframe(listing, hide_index=True, width="stretch", key="listing",
                      on_select="rerun", selection_mode="single-row")
rows_sel = picked.selection.rows if picked and picked.selection else []
_open_on_change("listing", listing.id.iloc[rows_sel[0]] if rows_sel else None)

# ------------------------------------------------------------------ transcript viewer
st.subheader("Transcript")
ids = listing.id.tolist()
wanted = st.session_state.get(open_key)
if "_deep_link_done" not in st.session_state:  # ?trajectory=ID opens it once
    st.session_state["_deep_link_done"] = True
    wanted = wanted or st.query_params.get("trajectory")
if wanted and wanted not in ids:
    ids = [wanted, *ids]
if wanted:
    st.session_state["trajectory_pick"] = wanted
    st.session_state[open_key] = None
if not ids:
    st.info("No trajectories match the filter.")
    st.stop()
tid = st.selectbox("Trajectory", ids, key="trajectory_pick")
st.query_params["trajectory"] = tid
try:
    view = explore.transcript(DB, tid)
except UserInputError as exc:
    st.error(transcript.markdown_literal(exc))
    st.stop()

tr, pair = view.transcript, view.pair
meta = tr.trajectory
st.caption(transcript.markdown_literal(
    f"task {meta.get('task_id')} · trial {meta.get('trial')} · {meta.get('domain')} · "
    f"{meta.get('agent_model')} · reward {meta.get('reward')} · "
    f"termination {meta.get('termination')}"
))
left, right = st.columns([3, 2])
with left:
    st.html(transcript.render_transcript_html(tr))
with right:
    st.markdown("**Expected vs actual actions**")
    if tr.expected:
        st.html(transcript.render_alignment_html(view.expected_vs_actual, "expected", "agent"))
    else:
        st.caption("The benchmark ships no expected actions for this task.")

if pair is not None:
    with st.expander("Passed vs failed trial of the same task, aligned on tool calls",
                     expanded=False):
        cmp = explore.compare(DB, tid)
        passed, failed = cmp.passed, cmp.failed
        st.html(transcript.render_alignment_html(cmp.alignment, f"passed {passed.id}",
                                                 f"failed {failed.id}"))
        pl, fr = st.columns(2)
        pl.html(transcript.render_transcript_html(passed))
        fr.html(transcript.render_transcript_html(failed))
