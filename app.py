"""TRACE Workbench: the pipeline at a glance, and the way into each stage's page.

Thin page: the counts come from `trace_lib.workbench.data.pipeline_counts` (the same
numbers `python -m trace_lib explore overview` prints). A missing database or empty
later-stage tables show as an empty state, never as an error.
"""

from __future__ import annotations

from pathlib import Path

import streamlit as st

from trace_lib.workbench import data
from trace_lib.workbench.errors import StoreError

st.set_page_config(page_title="TRACE Workbench", page_icon="🧭", layout="wide")
st.title("TRACE Workbench")
st.caption(
    "Turn an agent's recurring failures into capability-targeted training: "
    "1 diagnose capabilities from labeled trajectories · 2 build capability-isolating "
    "environments · 3 train one LoRA adapter per capability with GRPO · 4 compose adapters "
    "with token-level top-1 gates."
)

HERE = Path(__file__).resolve().parent
# (stage, page file, link label); a page another stage has not shipped yet is not linked.
PAGES = (
    ("trajectories", "pages/1_Trajectories.py", "Trajectories: filter, cluster, read"),
    ("diagnose", "pages/2_Labels.py", "Labels: label capabilities, edit"),
    ("diagnose", "pages/3_Rankings.py", "Rankings: kept capabilities"),
    ("environments", "pages/4_Environments.py", "Environments: build and validate"),
    ("train", "pages/5_Training.py", "Training: GRPO jobs and adapters"),
    ("compose", "pages/6_Routing.py", "Routing: composed models and gates"),
)
STAGES = ("trajectories", "diagnose", "environments", "train", "compose")
EMPTY_HELP = (
    "**No trajectories yet.** Load the demo data with `make demo` "
    "(or `python -m trace_lib demo build`), import benchmark logs with "
    "`python -m trace_lib ingest PATH...`, or upload files on the Trajectories page."
)

DB = data.db_path()
counts = None
try:
    counts = data.pipeline_counts(DB)
except StoreError as exc:
    st.error(str(exc))

st.caption(f"Store: `{DB}`")
if counts is None or int(counts.loc[counts.item == "trajectories", "n"].iloc[0]) == 0:
    st.info(EMPTY_HELP)

cols = st.columns(len(STAGES))
for col, stage in zip(cols, STAGES, strict=True):
    with col.container(border=True):
        st.markdown(f"**{stage.capitalize()}**")
        if counts is not None:
            for _, row in counts[counts.stage == stage].iterrows():
                st.metric(row["item"], int(row["n"]))
        else:
            st.caption("no data yet")
        for page_stage, path, label in PAGES:
            if page_stage == stage and (HERE / path).exists():
                st.page_link(path, label=label)
