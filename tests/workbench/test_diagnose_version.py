"""The store version the Labels and Rankings pages cache their one result under: it stays
put while nothing changes and moves with every label run, edit, undo and capability
change (a stale cached page would show an old ranking)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "diagnose"))

from synthetic import make_store  # noqa: E402

from trace_lib.workbench import diagnose as wb  # noqa: E402


def test_version_moves_with_every_change_and_only_then(db_path: Path) -> None:
    make_store(db_path, {"f1": False, "p1": True},
               {"r1": {"upselling": ["lacking", "present"]}})
    v0 = wb.version(db_path)
    assert wb.version(db_path) == v0  # reading changes nothing
    eid = wb.edit_label(db_path, "f1", "upselling", "present", editor="ann")
    v1 = wb.version(db_path)
    assert v1 != v0
    wb.undo_edit(db_path, editor="ann", edit_id=eid)
    v2 = wb.version(db_path)
    assert v2 not in (v0, v1)
    wb.set_status(db_path, "upselling", "rejected")
    v3 = wb.version(db_path)
    assert v3 != v2
    wb.label(db_path, "heuristic", run_prefix="h")
    assert wb.version(db_path) != v3
    view = wb.rankings(db_path, wb.RankConfig(), scope=wb.Scope(datasets=["syn"]))
    assert view.ranking.scope.datasets == ("syn",)
    assert wb.scope_options(db_path)["datasets"] == ["syn"]
