"""The CLI verbs end to end on the demo store: label -> rank -> edit -> export."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from trace_lib.cli import main


def _json(capsys: pytest.CaptureFixture[str], argv: list[str]):
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_cli_label_rank_edit_export(demo_db: Path, tmp_path: Path,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    db = ["--db", str(demo_db)]
    caps = _json(capsys, ["capabilities", "list", "--json", *db])
    assert len(caps) == 14
    added = _json(capsys, ["capabilities", "add", "refund_math", "--description",
                           "Computes refunds.", "--json", *db])
    assert added["source"] == "user"
    assert _json(capsys, ["capabilities", "reject", "refund_math", "--json", *db])["status"] == \
        "rejected"
    runs = _json(capsys, ["label", "--labeler", "heuristic", "--run", "h", "--json", *db])
    assert runs[0]["run_id"] == "h" and runs[0]["n_failed"] == 0
    ranked = _json(capsys, ["rank", "--json", *db])
    assert {r["capability"] for r in ranked} >= {"tool_calling_precision", "upselling"}
    assert ranked[0]["selected"] and ranked[0]["runs"][0]["run"] == "h"
    out = tmp_path / "selected_capabilities.json"
    _json(capsys, ["rank", "--json", "--export", str(out), *db])
    exported = json.loads(out.read_text())
    assert [e["skill"] for e in exported] == [r["capability"] for r in ranked if r["selected"]]
    # Strict thresholds select nothing.
    assert not any(r["selected"] for r in _json(capsys, ["rank", "--json", "--rho", "0.99",
                                                          *db]))
    # An edit through the CLI moves the ranking; undo moves it back.
    top = ranked[0]
    grid_csv = tmp_path / "labels.csv"
    assert main(["labels", "export", str(grid_csv), *db]) == 0
    capsys.readouterr()
    with open(grid_csv, newline="") as fh:
        lacking = [r["trajectory_id"] for r in csv.DictReader(fh)
                   if (r["capability"], r["value"]) == (top["capability"], "lacking")]
    edit = _json(capsys, ["labels", "edit", lacking[0], top["capability"], "present",
                          "--editor", "ann", "--json", *db])
    moved = {r["capability"]: r for r in _json(capsys, ["rank", "--json", *db])}
    assert moved[top["capability"]]["mean_cov"] < top["mean_cov"]
    _json(capsys, ["labels", "undo", "--edit-id", str(edit["edit_id"]), "--editor", "ann",
                   "--json", *db])
    back = {r["capability"]: r for r in _json(capsys, ["rank", "--json", *db])}
    assert back[top["capability"]]["mean_cov"] == pytest.approx(top["mean_cov"])
    history = _json(capsys, ["labels", "history", "--json", *db])
    assert [h["editor"] for h in history] == ["ann", "ann"]
    # Import the exported CSV as a second run: two runs now, K scales to 2 of 2.
    assert main(["labels", "import", str(grid_csv), "--run", "copy", *db]) == 0
    capsys.readouterr()
    two = _json(capsys, ["rank", "--json", *db])
    assert two[0]["n_runs_total"] == 2 and two[0]["k_effective"] == 2


def test_cli_errors_are_clear(demo_db: Path, tmp_path: Path,
                              capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("trajectory_id,capability,value\nnope,upselling,lacking\n")
    assert main(["labels", "import", str(bad), "--run", "x", "--db", str(demo_db)]) == 1
    err = capsys.readouterr().err
    assert "bad.csv" in err and "line 2" in err and "nope" in err
    assert main(["rank", "--runs", "ghost", "--db", str(demo_db)]) == 1
    assert "unknown label run" in capsys.readouterr().err
