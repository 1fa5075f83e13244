"""The one scope picker: the Labels and Rankings pages draw it with the same widget keys."""

from __future__ import annotations

from pathlib import Path

from trace_lib.workbench import diagnose as wb

PAGES = Path(__file__).resolve().parents[2] / "pages"


def test_pick_scope_draws_one_widget_per_scope_field():
    drawn = []

    def multiselect(label, choices, *, key, help):  # the signature st.multiselect is called with
        drawn.append((label, key, help))
        return list(choices[:1])

    opts = {"datasets": ["b", "a"], "agent_models": ["m"], "domains": []}
    scope = wb.pick_scope(multiselect, opts)
    assert scope == wb.Scope(datasets=("b",), agent_models=("m",), domains=())
    assert drawn == [("Datasets", "scope_datasets", "none chosen: every dataset"),
                     ("Agent models", "scope_agents", None), ("Domains", "scope_domains", None)]


def test_both_scoped_pages_draw_the_same_picker():
    for page in ("2_Labels.py", "3_Rankings.py"):
        source = (PAGES / page).read_text(encoding="utf-8")
        assert "wb.pick_scope(st.multiselect, opts)" in source, page
        assert "st.multiselect(\"Datasets\"" not in source, page
