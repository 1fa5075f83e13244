"""TRACE Workbench: the entry point (navigation) and the Home page.

Design decisions
- Navigation is `st.navigation`, so the first sidebar entry is "Home" (with the plain
  `pages/` folder Streamlit names it after this file: "app"). Every file in `pages/` is
  listed, in file-name order, so a page added there appears without an edit here.
- Home is a function of this file, not a page file: it is the default page, at the root URL.
- Thin page: the counts are `trace_lib.workbench.data.pipeline_counts` (the same numbers
  `python -m trace_lib explore overview` prints, environments counted as the Environments
  page lists them) and "what next" is `data.next_step` over the same counts. A missing
  database or empty later-stage tables show as an empty state, never as an error. The
  counts of jobs (running) and what they made are read after the one job sync
  (`jobs.sync`), so Home never shows a job as running that has ended; while one runs, a
  fragment re-reads its run directory every three seconds (`jobs.any_ended`, never the
  store) and reruns Home when it ended, so the count moves without a click.
- Deleting a dataset is `data.delete_dataset` (what `datasets delete NAME --yes` runs),
  behind a confirmation that names what will go.
- Opening the store is checked before any page runs (`store_admin.open_check`, again
  whenever the store's files change): a damaged file or a newer schema shows its message
  (what happened, what to do) in place of the page, never a traceback; a missing search
  index is rebuilt and a notice says so. A damaged block that only a page's query reads
  ends that page with the same message (`store_admin.explain_error`).
"""

from __future__ import annotations

from pathlib import Path

import streamlit as st

import page_parts
from trace_lib.workbench import data, explore, jobs, routing_demo, store_admin
from trace_lib.workbench.errors import ActionError, DatabaseError, StoreError

HERE = Path(__file__).resolve().parent
# (stage, page file, link label). Labels are short so the link text is never cut in a
# stage's column; the column title says the stage.
PAGES = (
    ("trajectories", "pages/1_Trajectories.py", "Trajectories →"),
    ("diagnose", "pages/2_Labels.py", "Labels →"),
    ("diagnose", "pages/3_Rankings.py", "Rankings →"),
    ("environments", "pages/4_Environments.py", "Environments →"),
    ("train", "pages/5_Training.py", "Training →"),
    ("compose", "pages/6_Routing.py", "Routing →"),
)
STAGES = ("trajectories", "diagnose", "environments", "train", "compose")
EMPTY_HELP = (
    "**No trajectories yet.** Load the demo data with `make demo` "
    "(or `python -m trace_lib demo build`), import benchmark logs with "
    "`python -m trace_lib ingest PATH...`, or upload files on the Trajectories page."
)


def _datasets(db: Path) -> None:
    st.subheader("Datasets")
    try:
        rows = data.list_datasets(db)
    except StoreError as exc:
        st.error(str(exc))
        return
    if done := st.session_state.pop("deleted_dataset", None):
        st.success(done)
    if not rows:
        st.caption("No datasets imported yet.")
        return
    by_id = {r["id"]: r for r in rows}
    for r in rows:  # one row per dataset, with its own Delete button
        with st.container(key=f"dataset_{r['id']}"):
            c1, c2, c3 = st.columns([4, 4, 1], vertical_alignment="center")
            c1.markdown(f"**{r['name']}** · {r['format']} · `{r['id']}`")
            c2.caption(f"{r['trajectories']} trajectories, {r['failures']} failures · "
                       f"imported {r['imported_at']:%Y-%m-%d %H:%M}")
            if c3.button("Delete…", key=f"delete_ask_{r['id']}"):
                st.session_state["delete_pending"] = r["id"]
    pending = st.session_state.get("delete_pending")
    if pending in by_id:
        row = by_id[pending]
        with st.container(border=True, key="delete_confirm"):
            st.warning(f"Delete dataset **{row['name']}** with its {row['trajectories']} "
                       "trajectories, their messages, tool calls, expected actions, "
                       "embeddings and labels? This cannot be undone (label edits are kept "
                       "in an audit file). To keep a copy of the whole store first: "
                       f"`python -m trace_lib store backup PATH --db {db}` "
                       "(`store restore PATH` brings it back).")
            c1, c2, _ = st.columns([1, 1, 4])
            if c1.button("Yes, delete", type="primary", key="delete_yes"):
                st.session_state.pop("delete_pending", None)
                try:
                    done = data.delete_dataset(pending, db=db)
                except ActionError as exc:
                    st.error(str(exc))
                else:
                    n = done["removed"].get("trajectories", 0)
                    kept = (f" Label edits kept in `{done['audit_file']}`."
                            if done["audit_file"] else "")
                    st.session_state["deleted_dataset"] = (
                        f"Deleted dataset {done['name']} and its {n} trajectories.{kept}")
                    st.rerun()
            if c2.button("Cancel", key="delete_no"):
                st.session_state.pop("delete_pending", None)
                st.rerun()


def _follow_jobs(running: list) -> None:
    @st.fragment(run_every="3s")
    def follow() -> None:
        # The run directories only (no store lock every three seconds); a full rerun syncs.
        if jobs.any_ended(running):
            st.rerun(scope="app")
        st.caption(f"{len(running)} job(s) running; this page updates when they end.")

    follow()


def _routing_demo(db: Path) -> None:
    """Build the routing demo from Home (the same job as the Routing page's button)."""
    with st.container(border=True, key="home_routing_demo"):
        demo = routing_demo.find()
        if demo is not None:
            st.markdown(f"**Routing demo** (base `{demo['model']}`): "
                        f"{demo['what_you_see'].splitlines()[0]}")
            st.page_link("pages/6_Routing.py", label="See it on Routing →")
            return
        running = routing_demo.active_job(db)
        if running is not None:
            st.markdown(f"**Routing demo**: building (job `{running.id}`); the Routing page "
                        "follows it.")
            st.page_link("pages/6_Routing.py", label="Routing →")
            return
        st.markdown("**Routing demo**: two conflicting skills (two LoRA adapters of "
                    "SmolLM2-135M), their per-request router, and the replies that show each "
                    "skill winning its own requests (a background job, ~15 CPU-minutes).")
        page_parts.routing_demo_build(db, key="home_demo")


def home() -> None:
    st.title("TRACE Workbench")
    st.caption(
        "Turn an agent's recurring failures into capability-targeted training: "
        "1 diagnose capabilities from labeled trajectories · 2 build capability-isolating "
        "environments · 3 train one LoRA adapter per capability with GRPO · 4 compose "
        "adapters with token-level top-1 gates."
    )
    db = data.db_path()
    counts = None
    running = []
    try:
        if data.db_exists(db):
            # job rows and what ended jobs made, before they are counted
            running = jobs.active(jobs.sync(db).statuses)
        counts = data.pipeline_counts(db)
    except StoreError as exc:
        st.error(str(exc))

    st.caption(f"Store: `{db}`")
    if running:
        _follow_jobs(running)
    if counts is None or int(counts.loc[counts.item == "trajectories", "n"].iloc[0]) == 0:
        st.info(EMPTY_HELP)
    sentence, page = data.next_step(counts)
    with st.container(border=True, key="next_step"):
        st.markdown(f"**Next:** {sentence}")
        if (HERE / page).exists():
            st.page_link(page, label=f"Open {Path(page).stem.split('_', 1)[1]}")

    _routing_demo(db)

    cols = st.columns(len(STAGES))
    for col, stage in zip(cols, STAGES, strict=True):
        with col.container(border=True):
            st.markdown(f"**{stage.capitalize()}**")
            for page_stage, path, label in PAGES:
                if page_stage == stage and (HERE / path).exists():
                    st.page_link(path, label=label)
            if counts is not None:
                for _, row in counts[counts.stage == stage].iterrows():
                    st.metric(row["item"], int(row["n"]))
            else:
                st.caption("no data yet")
    if counts is not None:
        _datasets(db)


def _store_opens() -> bool:
    """The store's open check, once per version of its files; False when it failed (its
    message is shown)."""
    db = data.db_path()
    key = (str(db), explore.store_version(db))
    if st.session_state.get("store_checked") == key:
        return True
    try:
        with st.spinner("Checking the store…"):
            notices = store_admin.open_check(db)
    except StoreError as exc:
        st.error(str(exc))
        return False
    for notice in notices:
        st.info(notice)
    st.session_state["store_checked"] = (str(db), explore.store_version(db))
    return True


st.set_page_config(page_title="TRACE Workbench", page_icon="🧭", layout="wide")
nav = st.navigation(
    [st.Page(home, title="Home", icon=":material/home:", default=True)]
    + [st.Page(f"pages/{p.name}") for p in sorted((HERE / "pages").glob("*.py"))]
)
if _store_opens():
    try:
        nav.run()
    except DatabaseError as exc:
        damaged = store_admin.explain_error(exc, data.db_path())
        if damaged is None:
            raise
        st.error(str(damaged))
