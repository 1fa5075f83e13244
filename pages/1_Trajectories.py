"""Trajectories: filter, chart, cluster and read the agent's logged runs.

Thin page: every number comes from `trace_lib.workbench.explore` (the `explore` verbs call
the same functions), uploads go through `trace_lib.workbench.data.import_files` (what the
`ingest` verb calls); this file only lays out widgets. The use cases open short
read-only connections, so a CLI writer is blocked for milliseconds at most. The first
visit's unfiltered view (filter options, overview, the listing's first page) is what the
last import stored (issue 35): a store of any size opens without a whole-store query.
"""

from __future__ import annotations

import streamlit as st

from trace_lib.workbench import data, explore
from trace_lib.workbench.errors import ActionError, StoreError, UserInputError
from trace_lib.workbench.explore import TrajectoryFilter

charts, render = explore.trajectory_charts, explore.transcript_render
markdown_literal = explore.untrusted_text.markdown_literal
count_hits = explore.search_highlight.count_hits

st.set_page_config(page_title="Trajectories · TRACE", page_icon="🧭", layout="wide")
st.title("Trajectories")

DB = data.db_path()
OUTCOME_CHOICES = {"all": (), "failures": ("failure",), "successes": ("success",),
                   "unknown": ("unknown",), "errors": ("error",)}


# ------------------------------------------------------------------------- upload
def _upload() -> None:
    # No `type=` filter: a refused file gets a visible sentence (data.upload_refusal), not
    # the widget's small print.
    files = st.file_uploader("Import trajectory files", accept_multiple_files=True,
                             key="upload_files",
                             help="Accepted: " + ", ".join(data.UPLOAD_SUFFIXES))
    skip = st.checkbox("Skip invalid records (report them instead of failing)",
                       key="upload_skip")
    # Same overrides as `ingest --domain / --agent-model`: empty keeps what the file says.
    domain = st.text_input("Domain (optional override)", key="upload_domain").strip() or None
    agent_model = st.text_input("Agent model (optional override)",
                                key="upload_agent_model").strip() or None
    if st.button("Import", disabled=not files, key="upload_go"):
        bar = st.progress(0.0, text="importing")
        done = failed = 0
        for i, f in enumerate(files or []):
            refusal = data.upload_refusal(f.name)
            try:
                if refusal:
                    raise UserInputError(refusal)
                report = data.import_files([data.Upload(f.name, f.getvalue())], db=DB,
                                           skip_invalid=skip, domain=domain,
                                           agent_model=agent_model)
            except ActionError as exc:
                failed += 1
                # the same text the CLI prints; escaped because st.error renders markdown
                st.error(markdown_literal(exc))
            else:
                done += 1
                st.success(f"{f.name}: imported {report.trajectories} trajectories")
                st.code(report.summary(), language=None)
            # Counts what happened, not how many files were looked at: a failed file is
            # never "imported".
            bar.progress((i + 1) / len(files),
                         text=f"{i + 1}/{len(files)} files: {done} imported, {failed} failed")


with st.sidebar.expander("Upload", expanded=not DB.exists()):
    _upload()

if not DB.exists():
    st.info(
        f"No database at `{DB}` yet. Load the demo with `make demo` "
        "(or `python -m trace_lib demo build`), import files with "
        "`python -m trace_lib ingest PATH...`, or upload files in the sidebar."
    )
    st.stop()

# Any write to the store or its search index changes it: the key of every cached result.
VERSION = explore.store_version(DB)


@st.cache_data(show_spinner=False, max_entries=4)
def _options(db: str, version: tuple):
    return explore.filter_options(db)


try:
    options = _options(str(DB), VERSION)
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
    text_mode="substring" if st.sidebar.checkbox(
        "Exact substring", key="f_text_exact",
        help='Off: every word must start a word of some message ("quoted words": a '
             "phrase), answered by the full-text index. On: a case-insensitive substring "
             "of a message, for identifiers and fragments (scans every message: slower).",
    ) else "words",
    text_system=st.sidebar.checkbox(
        "Search the system prompt too", key="f_text_system",
        help="Off: the search reads the conversation (user, assistant and tool messages). "
             "On: also the system prompt, which is mostly the same policy text in every "
             "trajectory of a benchmark (a word from it matches nearly all of them)."),
)


@st.cache_data(show_spinner="querying", max_entries=16)
def _page(db: str, version: tuple, f: TrajectoryFilter):
    # One result per (store version, filter): reruns that only open a transcript or move a
    # tab's widget read it from here. Text hits are computed once inside it.
    return explore.trajectories_page(db, f, limit=500)


@st.cache_resource(show_spinner=False, max_entries=16)
def _figures(db: str, version: tuple, f: TrajectoryFilter) -> dict:
    # Built once per result (cache_resource hands back the same objects, no copy).
    data = _page(db, version, f)
    ov = data.overview
    figs = {"rate": charts.success_rate_chart(ov.by_domain),
            "terminations": charts.termination_chart(ov.terminations),
            "tool_calls": charts.tool_calls_chart(ov.tool_calls),
            "tool_errors": charts.tool_errors_chart(ov.error_kinds)}
    return figs


@st.cache_data(show_spinner="grouping failures", max_entries=16)
def _signatures(db: str, version: tuple, f: TrajectoryFilter):
    # Only when the Failure clusters tab is open (0.3 s of a filter change at 1M before).
    return explore.signature_counts(db, f)


@st.cache_resource(show_spinner=False, max_entries=16)
def _treemap(db: str, version: tuple, f: TrajectoryFilter):
    return charts.signature_treemap(_signatures(db, version, f))


page = _page(str(DB), VERSION, flt)
if not page.status.ok:
    st.caption(markdown_literal(
        "The full-text index or the derived columns are behind this store (it was written "
        "without the importer, or before they existed): answers are right but slower. Run "
        "`python -m trace_lib explore reindex` to rebuild them."))

ov = page.overview
summary, listing = ov.summary.iloc[0], ov.listing

c1, c2, c3, c4, c5 = st.columns(5)
c1.metric("Trajectories", int(summary.n_trajectories))
rate = summary.success_rate
c2.metric("Success rate", "—" if rate != rate or rate is None else f"{rate:.1%}")
c3.metric("Failures", int(summary.n_failure))
c4.metric("Tasks", int(summary.n_tasks))
c5.metric("Tool errors", int(summary.n_tool_errors))

@st.cache_data(show_spinner=False, max_entries=16)
def _missing(db: str, version: tuple, f: TrajectoryFilter, failures_only: bool) -> int:
    # One join on the text hash derived at import; cached like the page's result.
    return explore.missing_embeddings(db, f, failures_only=failures_only)


@st.cache_data(show_spinner=False, max_entries=32)
def _members(db: str, version: tuple, f: TrajectoryFilter, path: tuple[str, ...]):
    # Filters the signature columns derived at import: no signature recomputation.
    return explore.signature_members(db, f, path=list(path))


open_key = "open_trajectory"
# Widgets in a closed tab are not drawn, and Streamlit drops the state of a widget it did
# not draw: re-assigning the tabs' choices each run keeps them across tab switches.
for _key in ("sig_pick", "sem_failures_only", "sem_k", "sem_cluster"):
    if _key in st.session_state:
        st.session_state[_key] = st.session_state[_key]


def _open_on_change(source: str, tid: str | None, *, scroll: bool = False) -> None:
    # Selections persist across reruns; apply one only when it changes, so a later pick in
    # the Trajectory selectbox is not overridden by a stale chart or table selection.
    last = f"_last_{source}"
    if tid and st.session_state.get(last) != tid:
        st.session_state[open_key] = tid
        if scroll:  # the transcript is far below the chart: bring it into view, say so
            st.session_state["_scroll_to_transcript"] = tid
    st.session_state[last] = tid


# Lazy tabs: only the open tab's body runs (a tab click is a rerun), so a visit or a filter
# change draws the four charts and nothing else: no treemap, no members query, and no
# scikit-learn/encoder import competing with the script for the GIL (on a 2-core box
# that contention doubled the first visit).
tab_charts, tab_sig, tab_sem = st.tabs(["Charts", "Failure clusters", "Semantic clusters"],
                                       key="traj_tab", on_change="rerun")

with tab_charts:
    if tab_charts.open:
        figs = _figures(str(DB), VERSION, flt)
        a, b = st.columns(2)
        a.plotly_chart(figs["rate"], width="stretch")
        b.plotly_chart(figs["terminations"], width="stretch")
        a, b = st.columns(2)
        a.plotly_chart(figs["tool_calls"], width="stretch")
        b.plotly_chart(figs["tool_errors"], width="stretch")

with tab_sig:
    if tab_sig.open:
        sigs = _signatures(str(DB), VERSION, flt)
        st.caption(
            "Each failure's signature: termination reason › first tool that returned an "
            "error › that error's kind › first expected action the agent did not reproduce."
        )
        if sigs.empty:
            st.info("No failures in this filter.")
        else:
            # Streamlit (1.67) sends a treemap click as a one-point selection carrying the
            # box's `id`: the click selects that cluster (any level) besides zooming into it.
            tree = st.plotly_chart(_treemap(str(DB), VERSION, flt), width="stretch",
                                   key="sig_tree", on_select="rerun",
                                   selection_mode="points")
            tree_pts = (tree.selection.points if tree and tree.selection else []) or []
            box = tree_pts[0].get("id") if tree_pts else None
            if box != st.session_state.get("_last_tree"):  # a new click, not a stale one
                st.session_state["_last_tree"] = box
                clicked = charts.treemap_box_paths(sigs).get(box) if box else None
                if clicked is not None:
                    st.session_state["sig_pick"] = clicked
            # Options are the cluster keys; labels read as the treemap's boxes do.
            shown = explore.path_label
            labels = {p: f"{shown(p)}  ({n})" for p, n in zip(sigs.path, sigs.n, strict=True)}
            chosen = st.session_state.get("sig_pick")
            if chosen is not None and chosen not in labels:  # a box above the leaves
                parts = chosen.split(explore.PATH_SEP) if chosen else []
                n = int(sigs.n[(sigs[list(explore.SIGNATURE_LEVELS[:len(parts)])]
                                == parts).all(axis=1)].sum()) if parts else int(sigs.n.sum())
                labels = {chosen: f"{shown(chosen) or 'all failures'}  ({n}, every "
                                  "signature below)", **labels}
            st.caption("Click a box of the treemap to select its cluster (and zoom into it).")
            pick = st.selectbox("Cluster", list(labels), format_func=labels.get, key="sig_pick")
            members = _members(str(DB), VERSION, flt,
                               tuple(pick.split(explore.PATH_SEP)) if pick else ())
            st.caption("Select a row to open its transcript below.")
            ev = st.dataframe(members, hide_index=True, width="stretch", key="sig_members",
                              on_select="rerun", selection_mode="single-row")
            rows_sel = ev.selection.rows if ev and ev.selection else []
            _open_on_change("sig", members.trajectory_id.iloc[rows_sel[0]] if rows_sel else None)

with tab_sem:
    if tab_sem.open:
        # scikit-learn and the sentence encoder load once per server process, in the
        # background, from the first time this tab opens; it shows how far they got.
        warm = explore.encoder_warmup()
        failures_only = st.toggle("Failures only", value=True, key="sem_failures_only")
        if not warm.ready():
            st.progress(warm.fraction,
                        text=f"Preparing the encoder in the background: {warm.text}")
        n_missing = _missing(str(DB), VERSION, flt, failures_only)
        if n_missing:
            st.write(f"{n_missing} trajectories in this filter have no up-to-date embedding.")
            if st.button(f"Embed {n_missing} trajectories", key="sem_embed"):
                with st.spinner(warm.text):
                    warm.wait()
                bar = st.progress(0.0, text="embedding")

                def _tick(done: int, total: int) -> None:
                    bar.progress(done / total if total else 1.0,
                                 text=f"embedded {done}/{total}")

                rep = explore.embed(DB, flt, failures_only=failures_only, progress=_tick)
                st.success(f"embedded {rep.n_computed}, reused {rep.n_cached}")
                st.rerun()
        k = st.slider("Clusters (0 = choose by silhouette)", 0, 12, 0, key="sem_k")

        @st.cache_data(show_spinner="clustering", max_entries=8)
        def _semantic(db: str, mtime: float, f: TrajectoryFilter, k: int, fo: bool):
            return explore.semantic_clusters(db, f, k=k or None, failures_only=fo)

        # No wait for the warm-up here: with nothing embedded the map needs no
        # scikit-learn, and with vectors its import waits on the warm-up's own (one
        # import lock per module) under the "clustering" spinner.
        smap = _semantic(str(DB), VERSION, flt, k, failures_only)
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
                            else None, scroll=True)
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
st.subheader("Transcript", anchor="transcript")
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


def _go(target: str) -> None:
    # A button callback runs before the rerun: the target opens like any other pick.
    st.session_state[open_key] = target


# Keyboard navigation as in Inspect's viewer: J / K next / previous, N next failure (in
# the list's order, wrapping round); the keys do nothing while a text field has focus.
listed, outcomes = listing.id.tolist(), listing.outcome.tolist()
pos = listed.index(tid) if tid in listed else -1
fails = [i for k, i in enumerate(listed) if outcomes[k] == "failure" and i != tid]
later = [i for k, i in enumerate(listed) if k > pos and outcomes[k] == "failure"]
next_fail = (later or fails or [None])[0]
nav = st.columns([1, 1, 1, 4], vertical_alignment="center")
nav[0].button("← Previous", key="nav_prev", shortcut="K", disabled=pos <= 0, on_click=_go,
              args=(listed[pos - 1] if pos > 0 else tid,), help="previous in the list (K)")
nav[1].button("Next →", key="nav_next", shortcut="J", disabled=pos + 1 >= len(listed),
              on_click=_go, args=(listed[pos + 1] if pos + 1 < len(listed) else tid,),
              help="next in the list (J)")
nav[2].button("Next failure", key="nav_fail", shortcut="N", disabled=next_fail is None,
              on_click=_go, args=(next_fail or tid,), help="next failed trajectory (N)")
nav[3].caption(f"{pos + 1 if pos >= 0 else '—'} of {len(listed)} in the list · keys J / K "
               "next / previous, N next failure")
@st.cache_resource(show_spinner=False, max_entries=64)
def _transcript(db: str, version: tuple, tid: str):
    # One load per (store version, trajectory): J / K back to a trajectory, a tab click or a
    # widget in the transcript's column reads it from here (each load opens the store).
    return explore.transcript(db, tid)


@st.cache_data(show_spinner=False, max_entries=64)
def _trials(db: str, version: tuple, tid: str):
    return explore.trials(db, tid)


try:
    view = _transcript(str(DB), VERSION, tid)
except UserInputError as exc:
    st.error(markdown_literal(exc))
    st.stop()

tr = view.transcript
meta = tr.trajectory
if st.session_state.get("_scroll_to_transcript") == tid:
    # Once per map click: the script (no trajectory text) scrolls to the heading above.
    st.session_state["_scroll_to_transcript"] = None
    st.toast(markdown_literal(f"Opened the transcript of {tid}"))
    st.html(render.scroll_into_view_script("#transcript", tid, "map"),
            unsafe_allow_javascript=True)
query = flt.text or None  # the search: its hits are marked in the transcript
mode, in_system = flt.text_mode, flt.text_system
st.caption(markdown_literal(
    f"task {meta.get('task_id')} · trial {meta.get('trial')} · {meta.get('domain')} · "
    f"{meta.get('agent_model')} · reward {meta.get('reward')} · "
    f"termination {meta.get('termination')}"
))
left, right = st.columns([3, 2])
with left:
    st.html(render.render_transcript_html(tr, query=query, query_mode=mode,
                                          query_system=in_system))
    if query and count_hits(tr, query, mode, system=in_system):
        st.html(render.jump_to_first_hit_script(tid, query, mode, str(in_system)),
                unsafe_allow_javascript=True)
with right:
    st.markdown("**Expected vs actual actions**")
    if tr.expected:
        st.html(render.render_alignment_html(view.expected_vs_actual, "expected", "agent",
                                             against_expected=True))
    else:
        st.caption("The benchmark ships no expected actions for this task.")

# Any two trials: the others of this task are offered (a passed one first when this one
# failed, and the reverse), any trajectory id can be typed; a task run once says so.
trials = _trials(str(DB), VERSION, tid)
others = trials[trials.id != tid]
n_other = len(others)
title = (f"Compare with another trial ({n_other} other trial{'s' if n_other != 1 else ''} "
         "of this task)" if n_other else
         "Compare with another trajectory (this task has only this one trial)")


def _remember_compare() -> None:
    st.session_state["cmp_wanted"] = bool(st.session_state.get("cmp_open"))


# Lazy like the tabs: the comparison (two transcripts loaded and aligned) is computed only
# while the expander is open, not on every rerun of the page. Its label counts this task's
# trials, and a new label is a new expander to Streamlit: the wish to compare is kept in
# `cmp_wanted`, so it stays open while J / K move through the list.
with st.expander(title, expanded=st.session_state.get("cmp_wanted", False), key="cmp_open",
                 on_change=_remember_compare) as cmp_box:
    if cmp_box.open:
        if not n_other:
            st.info(markdown_literal(
                (f"Task {meta.get('task_id')} has only this one trial in {meta.get('dataset')}"
                 if meta.get("task_id") is not None else "This trajectory has no task id")
                + ", so there is no other trial of it to compare with. Type any trajectory id "
                "below to compare with a run of another task or dataset."))
        desc = {r.id: f"trial {r.trial} · {r.outcome} · {r.id}" for r in trials.itertuples()}
        mine = trials.set_index("id").outcome.get(tid, "unknown")
        contrast = others[others.outcome != mine].id.tolist() if mine != "unknown" else []
        ordered = contrast + [i for i in others.id if i not in contrast]
        other = st.selectbox("Compare with", ordered, format_func=desc.get,
                             key=f"cmp_other::{tid}") if ordered else None
        typed = st.text_input("…or any trajectory id", key=f"cmp_other_id::{tid}").strip()
        other = typed or other
        if other:
            outcome_of = trials.set_index("id").outcome.to_dict()
            # A passed trial is the reference (left) when the two outcomes differ.
            first, second = ((other, tid) if outcome_of.get(other) == "passed"
                             and mine == "failed" else (tid, other))
            try:
                cmp = explore.compare(DB, first, second)
            except UserInputError as exc:
                st.error(markdown_literal(exc))
            else:
                short = {r.id: (f"{r.outcome} trial {r.trial}" if r.outcome != "unknown"
                                else f"trial {r.trial}") for r in trials.itertuples()}
                names = (short.get(first, first), short.get(second, second))
                heads = tuple(f"{short[i]} ({i})" if i in short else i for i in (first, second))
                st.html(render.render_alignment_html(cmp.alignment, *heads, names=names))
                st.html(render.render_side_by_side_html(cmp.left, cmp.right, *heads,
                                                        query=query, query_mode=mode,
                                                        query_system=in_system))
