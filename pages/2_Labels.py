"""Labels: trajectories x capabilities, with the transcript and its evidence below them.

Thin page: every read and action is a use case of `trace_lib.workbench.diagnose` (the
`label`, `labels` and `capabilities` verbs call the same functions); a background run is a
`label` job of `trace_lib.workbench.jobs`, recorded by its one job sync. An edit in the grid is
saved at once as an append-only edit row (editor, note, time), so the Rankings page moves
on its next run; once committed, the save status above the grid (and a toast) names the
saved edits by id (`describe_grid_save`), so every save reads differently and a killed
server never leaves a confirmed edit unsaved (tests/e2e/test_server_killed_browser.py). Trajectory text is untrusted: it is shown with st.text/st.code, or as
the transcript viewer's escaped HTML (`transcript_render`, the Trajectories page's
renderer), which opens in its own scroll box at the message the evidence points at, the
system prompt folded, each turn with its tokens, cost and latency where the source has
them.

Every read goes through `_read`: one cached query result per (use case, store version,
arguments), where the version (`wb.version`) changes with every label run, edit, undo or
capability change. A rerun on an unchanged store therefore does no query work. The tabs
are lazy (`st.tabs(..., on_change="rerun")`): only the open tab's body runs, so a visit
to the grid does not compute the review queue's sensitivity or the agreement report
(35 s of a 36 s first visit at 10k trajectories before); the grid's filters are kept
across tab switches. The CSV export is built only when its download is clicked (a
callable `data`). The scope picker (datasets,
agent models, domains) narrows the grid, the queue, the labeler and the export alike.
After the capability columns the grid shows, read-only, what the labels rest on
(`wb.GRID_GROUNDS`): how much an LLM labeler's prompt cut of the trajectory to fit its
model's context, and which capabilities carry an unsupported label (lacking/present with
no evidence that quotes the transcript); the review queue lists those first.
"""

from __future__ import annotations

import os
from datetime import datetime

import pandas as pd
import streamlit as st

from trace_lib.workbench import data, explore, jobs
from trace_lib.workbench import diagnose as wb
from trace_lib.workbench.errors import ActionError, LLMError, UserInputError

LABEL_VALUES = wb.LABEL_VALUES
ID_COLUMNS = ("trajectory_id", "task_id", "domain", "success")  # the grid's read-only columns
READ_ONLY = (*ID_COLUMNS, *wb.GRID_GROUNDS)
# A colour emoji per label value: the grid's cells are drawn on a canvas, so a glyph that
# carries its own colour is what colours an editable cell (see the grid below).
GLYPHS = {"present": "🟢", "lacking": "🔴", "na": "⚪"}


def _glyph(value: str) -> str:
    return f"{GLYPHS.get(value, '')} {value}".strip()


st.set_page_config(page_title="Labels · TRACE", page_icon="🧭", layout="wide")
st.title("Labels")

DB = data.db_path()
if not DB.exists():
    st.info(f"No database at `{DB}` yet: import trajectories first "
            "(`python -m trace_lib demo build` or the Trajectories page).")
    st.stop()

ss = st.session_state
ss.setdefault("grid_version", 0)
# Widgets in a closed tab are not drawn, and Streamlit drops the state of a widget it did
# not draw: re-assigning the tabs' filters each run keeps them across tab switches.
for _key in ("f_caps", "f_outcome", "f_value", "f_search", "t_pick", "t_cap", "q_order"):
    if _key in ss:
        ss[_key] = ss[_key]


@st.cache_data(max_entries=256, show_spinner=False)
def _cached(use_case: str, db: str, version: tuple, *args, **kwargs):
    return getattr(wb, use_case)(db, *args, **kwargs)


def _read(use_case: str, *args, **kwargs):
    """A use case's result, cached per store version (see the module docstring)."""
    return _cached(use_case, str(DB), wb.version(DB), *args, **kwargs)


def _show_error(msg: str) -> None:
    # Messages can quote file or trajectory content: shown as code, never as markdown.
    st.error("That did not work:", icon="🚫")
    st.code(msg, language=None)


def _guard(fn, *args, **kwargs):
    try:
        return fn(*args, **kwargs)
    except ActionError as exc:
        _show_error(str(exc))
        return None


# ------------------------------------------------------------------------ sidebar
opts = _read("scope_options")
with st.sidebar:
    st.header("Scope")
    scope = wb.pick_scope(st.multiselect, opts)
    editor = st.text_input("Your name (recorded with every edit)",
                           value=os.environ.get("USER", "analyst"), key="editor")
    st.header("Run a labeler")
    labeler = st.selectbox("Labeler", ["heuristic", "anthropic", "openai"], key="labeler",
                           help="heuristic: offline, rules over tool calls and expected "
                                "actions. anthropic: needs ANTHROPIC_API_KEY. openai: any "
                                "OpenAI-compatible server (vLLM).")
    n_runs = st.number_input("Independent runs", 1, 20, 1, key="n_runs")
    model = base_url = max_context = None
    if labeler != "heuristic":
        model = st.text_input("Model (blank: from the environment)", key="model") or None
    if labeler == "openai":
        base_url = st.text_input("Base URL (blank: TRACE_OPENAI_BASE_URL)",
                                 key="base_url") or None
    if labeler != "heuristic":
        max_context = int(st.number_input(
            "Context in tokens (0: ask the server)", 0, 10_000_000, 0, step=1024,
            key="max_context", help="transcripts longer than the model's context are cut "
                                    "by a fixed rule; the grid shows how much")) or None
    background = st.checkbox("Run in background", key="label_background",
                             help="as a `label` job (see `job status`); its labels are "
                                  "recorded here once it ended")
    # Ended background runs are recorded (once) before anything below reads the labels.
    synced = _guard(jobs.sync, DB)
    recorded = [r for r in (synced.labels if synced else []) if r["outcome"] == "recorded"]
    if recorded:
        st.success("recorded " + ", ".join(f"{r['run_id']} ({r['n_labels']} labels)"
                                           for r in recorded))
        ss.grid_version += 1
    what = "all trajectories" if scope.is_empty() else "the trajectories in scope"
    clicked = st.button(f"Label {what}", key="run_labeler")
    if clicked and background:
        specs = _guard(jobs.submit_labeling, DB, labeler, runs=int(n_runs), model=model,
                       base_url=base_url, scope=scope, max_context=max_context)
        if specs:
            st.info("started " + ", ".join(f"job {s.id} (run {s.config['run_id']})"
                                           for s in specs))
    elif clicked:
        bar = st.progress(0.0, text="labeling")
        out = _guard(wb.label, DB, labeler, runs=int(n_runs), model=model, base_url=base_url,
                     scope=scope, max_context=max_context,
                     progress=lambda d, t: bar.progress(d / t, text=f"labeled {d}/{t}"))
        if out:
            st.success("; ".join(f"{s.run_id}: {s.n_labels} labels, {s.n_failed} failed, "
                                 f"{s.n_cut} cut, {s.n_unsupported} unsupported"
                                 for s in out))
            ss.grid_version += 1

# Lazy tabs: only the open tab's body runs (a tab click is a rerun). The review queue's
# sensitivity and the agreement report are the page's costliest reads; a visit to the grid
# must not pay for them.
tab_grid, tab_queue, tab_history, tab_caps, tab_io = st.tabs(
    ["Grid", "Review queue", "History", "Capabilities", "Import / export"], key="labels_tab",
    on_change="rerun")

# --------------------------------------------------------------------------- grid
with tab_grid:
    if tab_grid.open:
        all_caps = [c.name for c in _read("list_capabilities") if c.status != "rejected"]
        f1, f2, f3, f4 = st.columns([3, 1, 1, 2])
        # The default goes through the session state, never `default=`: the key is also
        # re-assigned each run (above), and Streamlit warns on a widget given both.
        ss["f_caps"] = ([c for c in ss["f_caps"] if c in all_caps] if "f_caps" in ss
                        else [c for c in wb.CORE if c in all_caps] or all_caps)
        shown = f1.multiselect("Capabilities", all_caps, key="f_caps")
        outcome = f2.selectbox("Outcome", ["all", "failed", "passed"], key="f_outcome")
        value = f3.selectbox("Has value", ["any", *LABEL_VALUES], key="f_value")
        search = f4.text_input("Search id / task", key="f_search")
        flt = wb.LabelFilter(capabilities=shown or None,
                             success={"all": None, "failed": False, "passed": True}[outcome],
                             value=None if value == "any" else value, search=search or None,
                             scope=scope)
        grid = _guard(_read, "label_grid", flt)
        if grid is None or grid.empty:
            st.info("No labels match. Run a labeler (sidebar) or widen the filters.")
        else:
            # The grid spans the page (the transcript sits below it), and its label cells carry
            # a colour glyph: a data editor is a canvas, and a pandas Styler colours only its
            # non-editable columns. The glyph is the option's label (`format_func`); the cell's
            # value, and so every saved edit, stays exactly present/lacking/na.
            st.caption(" · ".join(_glyph(v) for v in LABEL_VALUES)
                       + " — click a label cell and type or pick a value; each edit is saved "
                         "at once (History tab: who, when, undo).")
            cols = {c: st.column_config.SelectboxColumn(c, options=list(LABEL_VALUES),
                                                        format_func=_glyph)
                    for c in grid.columns if c not in READ_ONLY}
            cols |= {
                "cut_messages": st.column_config.NumberColumn(
                    "cut msgs", help="messages an LLM labeler's prompt left out to fit its "
                                     "model's context (most over the runs; blank: none cut)"),
                "cut_tokens": st.column_config.NumberColumn(
                    "cut tokens", help="transcript tokens the prompt left out"),
                "unsupported": st.column_config.TextColumn(
                    "unsupported", help="capabilities with a lacking/present label whose "
                                        "evidence did not quote the transcript"),
            }
            # The save status: the last save's confirmation, kept on the page (a toast
            # vanishes in seconds), each naming its edits by id, so two saves never read
            # the same. It is set only after `edit_labels` returned, i.e. committed: what
            # it names survives a killed server (issue 33's kill test reads it as the
            # acknowledgement). Drawn on every run, before the grid, so the grid never moves.
            with st.container(key="grid_save_status"):
                st.text("✅ " + ss["grid_last_saved"] if "grid_last_saved" in ss
                        else "No edit saved in this session yet.")
            edited = st.data_editor(
                grid, column_config=cols, hide_index=True, width="stretch",
                disabled=list(READ_ONLY), key=f"grid_{ss.grid_version}")
            # The save's confirmation is also toasted, by the run after the save: a toast
            # sent just before `st.rerun()` did not always reach the browser. Removed only
            # once toasted: a rerun that interrupts this run at the toast keeps it for the next.
            if saved := ss.get("grid_saved"):
                st.toast(saved)
                del ss["grid_saved"]
            changes = wb.grid_changes(grid, edited)
            if changes:
                ids = _guard(wb.edit_labels, DB, changes, editor=editor, note="grid edit",
                             skip_unchanged=True)
                if ids is not None:
                    ss["grid_saved"] = ss["grid_last_saved"] = wb.describe_grid_save(
                        changes, ids, datetime.now())
                    ss.grid_version += 1
                    st.rerun()
            with st.expander(f"Bulk edit the {len(grid)} filtered trajectories"):
                b1, b2 = st.columns(2)
                bulk_value = b1.selectbox("Set every shown label to", LABEL_VALUES,
                                          key="bulk_value")
                bulk_note = b2.text_input("Note", key="bulk_note")
                if st.button("Apply bulk edit", key="bulk_go"):
                    ids = _guard(wb.bulk_edit, DB, flt, bulk_value, editor=editor,
                                 note=bulk_note or "bulk edit")
                    if ids:
                        st.success(f"{len(ids)} edits saved")
                        ss.grid_version += 1
                        st.rerun()
            st.subheader("Transcript and evidence")
            p1, p2 = st.columns(2)
            tid = p1.selectbox("Transcript", list(grid["trajectory_id"]), key="t_pick")
            cap = p2.selectbox("Evidence for", shown or all_caps, key="t_cap")
            view = _guard(wb.evidence_transcript, DB, tid, cap) if tid and cap else None
            if view:
                t = view.transcript
                # Text from the trajectory or a labeler: st.text/st.code, or escaped HTML.
                st.text(f"task {t.task_id} · {'passed' if t.success else 'failed'} · "
                        "evidence at " + (", ".join(f"message {i}" for i in sorted(view.at))
                                          or "no message"))
                for e in view.evidence:
                    if e["error"]:
                        _show_error(f"{e['run']}: labeler failed: {e['error']}")
                    elif e.get("unsupported"):
                        st.text(f"❔ {e['run']} ({e['value']}): unsupported, no evidence "
                                "that quotes the transcript")
                    if e.get("cut_messages") or e.get("cut_tokens"):
                        st.text(f"✂ {e['run']}: the prompt left out {e['cut_messages']} "
                                f"messages, {e['cut_tokens']} tokens, to fit the context")
                render = explore.transcript_render
                st.html(render.scroll_box_html(
                    render.render_transcript_html(t, evidence=view.at), 620))
                if view.first is not None:  # open the box at the evidence, not at the top
                    st.html(render.scroll_box_to_evidence_script(t.id, cap),
                            unsafe_allow_javascript=True)

# ------------------------------------------------------------------------- queue
with tab_queue:
    if tab_queue.open:
        st.caption("Pairs where label runs, labelers or people disagree, and pairs whose flip "
                   "would change whether a capability is kept (sensitivity, from the Rankings' "
                   "keep rule at its defaults). Pairs a person decided leave the queue unless "
                   "people disagree about them.")
        q_order = st.radio("Order by", wb.ORDERS, horizontal=True, key="q_order")
        queue = _guard(_read, "review_queue_ranked", None, wb.StabilityConfig(), limit=100,
                       order=q_order, scope=scope)
        if queue is None or queue.empty:
            st.info("Nothing to review: no disagreement, and no single flip moves the ranking.")
        else:
            st.caption(f"{len(queue)} pairs to review · "
                       f"{queue.attrs['stability']['sentence']}")
            st.dataframe(queue, hide_index=True, key="queue_table")
            q1, q2, q3 = st.columns(3)
            pick = q1.selectbox("Pair", [f"{r.trajectory_id} · {r.capability}"
                                         for r in queue.itertuples()], key="q_pick")
            decision = q2.selectbox("Decision", LABEL_VALUES, key="q_value")
            note = q3.text_input("Note", key="q_note")
            if st.button("Save decision", key="q_go") and pick:
                t_id, c_name = pick.split(" · ")
                if _guard(wb.edit_label, DB, t_id, c_name, decision, editor=editor, note=note):
                    ss.grid_version += 1
                    st.rerun()

        st.subheader("Agreement")
        agree = _guard(_read, "agreement", scope=scope)
        if agree is not None:
            st.caption("Cohen's κ: each labeler (majority over its runs) against people's "
                       "decisions (latest edit), labelers and people against each other, on the "
                       "pairs both rated; people edit where they doubt a labeler, so it is a "
                       "biased sample (n beside it). n/a: undefined (one category only, or "
                       "nothing rated by both).")
            cohen = [c for c in agree.cohen if c.n] or agree.cohen
            for row in [cohen[i:i + 4] for i in range(0, len(cohen), 4)]:
                for col, c in zip(st.columns(4), row, strict=False):
                    col.metric(f"Cohen's κ · {c.rater_a} vs {c.rater_b}",
                               "n/a" if c.kappa is None else f"{c.kappa:.2f}",
                               help=f"{c.kind}; n={c.n}"
                               + ("" if c.observed is None else f"; agreement {c.observed:.0%}")
                               + (f"; {c.why}" if c.why else ""))
            st.caption(f"Fleiss' κ across the {len(agree.runs)} finished label run(s), per "
                       "capability (raw labels; edits apply to every run alike).")
            # Undefined reads "n/a", as the caption says (the grid draws a missing number
            # as "None"): the figures are text, right-aligned.
            st.dataframe(pd.DataFrame([{
                "capability": r.capability,
                "Fleiss κ": "n/a" if r.kappa is None else f"{r.kappa:.3f}",
                "observed agreement": "n/a" if r.observed is None else f"{r.observed:.3f}",
                "trajectories": r.n_trajectories, "runs": r.n_runs, "why n/a": r.why or "",
            } for r in agree.fleiss]), hide_index=True, key="fleiss_table",
                column_config={c: st.column_config.TextColumn(c, alignment="right")
                               for c in ("Fleiss κ", "observed agreement")})

# ----------------------------------------------------------------------- history
with tab_history:
    if tab_history.open:
        hist = _guard(_read, "edit_history", limit=500)
        if hist is None or hist.empty:
            st.info("No edits yet.")
        else:
            st.dataframe(hist, hide_index=True, key="history_table")
            live = hist[hist["undoes"].isna() & ~hist["undone"].astype(bool)]
            if not live.empty:
                # An id alone said nothing: the picker names the pair, the change and who.
                described = {int(r["id"]): wb.describe_edit(r)
                             for r in live.to_dict(orient="records")}
                eid = st.selectbox("Undo edit", list(described), key="undo_pick",
                                   format_func=described.get)
                if st.button("Undo", key="undo_go"):
                    if _guard(wb.undo_edit, DB, editor=editor, edit_id=int(eid)):
                        ss.grid_version += 1
                        st.rerun()

# ------------------------------------------------------------------ capabilities
with tab_caps:
    if tab_caps.open:
        caps = _read("list_capabilities")
        st.dataframe(pd.DataFrame([c.model_dump() for c in caps]), hide_index=True,
                     key="caps_table")
        c1, c2, c3 = st.columns(3)
        name = c1.selectbox("Capability", [c.name for c in caps], key="cap_pick")
        if c2.button("Accept", key="cap_accept"):
            _guard(wb.set_status, DB, name, "accepted")
            st.rerun()
        if c3.button("Reject", key="cap_reject"):
            _guard(wb.set_status, DB, name, "rejected")
            st.rerun()
        with st.form("edit_cap"):
            current = next((c for c in caps if c.name == name), None)
            new_text = st.text_area(f"Description of {name}",
                                    value=current.description if current else "",
                                    key=f"edit_cap_desc_{name}")
            if st.form_submit_button("Save description"):
                if _guard(wb.update_capability, DB, name, description=new_text):
                    st.rerun()
        with st.form("add_cap"):
            new_name = st.text_input("New capability (snake_case)", key="new_cap_name")
            new_desc = st.text_area("Description", key="new_cap_desc")
            if st.form_submit_button("Add"):
                if _guard(wb.add_capability, DB, new_name, new_desc):
                    st.rerun()
        with st.expander("Propose capabilities with an LLM (contrastive pairs)"):
            provider = st.selectbox("Provider", ["anthropic", "openai"], key="prop_provider")
            if st.button("Propose", key="prop_go"):
                try:
                    added = wb.propose_capabilities(DB, provider, model=model, base_url=base_url)
                except (LLMError, UserInputError) as exc:
                    _show_error(str(exc))
                else:
                    st.success(f"proposed: {', '.join(c.name for c in added) or 'nothing new'}")

# ---------------------------------------------------------------- import/export
with tab_io:
    if tab_io.open:
        import tempfile
        from pathlib import Path

        # Built when the download is clicked (not on every render): the same rows as
        # `labels export FILE.csv` with the scope flags, qualified by dataset, task and trial.
        st.download_button(f"Export effective labels (CSV) · {scope.describe()}",
                           data=lambda: wb.labels_csv(DB, scope), file_name="labels.csv",
                           mime="text/csv", key="export_csv")
        up = st.file_uploader("Import labels CSV (trajectory_id,capability,value)", type=["csv"],
                              key="import_csv")
        run_name = st.text_input("As label run", value="imported", key="import_run")
        if st.button("Import", disabled=up is None, key="import_go") and up is not None:
            with tempfile.TemporaryDirectory() as tmp:
                path = Path(tmp) / up.name
                path.write_bytes(up.getvalue())
                n = _guard(wb.import_labels, DB, path, run_name)
            if n:
                st.success(f"imported {n} labels as run {run_name}")
                ss.grid_version += 1
        st.dataframe(_guard(_read, "label_runs"), hide_index=True, key="runs_table")
