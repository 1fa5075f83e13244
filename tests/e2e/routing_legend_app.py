"""A test's own page: the Routing page's sidebar legend (`views.legend_html`, drawn in the
sidebar as the page draws it) for the slots a model composed of the four core capability
adapters has; test_layout_browser measures its chips."""

import streamlit as st

from trace_lib.workbench.composition import views

SLOTS = ["base", "precondition_verification", "multi_step_task_completion",
         "structured_data_reasoning", "tool_calling_precision",
         "a_capability_name_much_longer_than_the_sidebar_is_wide_to_show_the_cut"]

st.title("Legend")
with st.sidebar:
    st.markdown("**Legend: slot → capability**")
    st.html(views.legend_html(SLOTS))
