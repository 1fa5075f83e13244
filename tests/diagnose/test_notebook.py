"""notebooks/01_diagnose.ipynb executes top to bottom on the demo data (small setting)."""

from __future__ import annotations

import os
from pathlib import Path

import nbformat
from nbclient import NotebookClient

NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / "01_diagnose.ipynb"


def test_diagnose_notebook_runs(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("TRACE_NOTEBOOK_N", "36")
    for key in ("ANTHROPIC_API_KEY", "TRACE_OPENAI_BASE_URL"):
        monkeypatch.delenv(key, raising=False)
    nb = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(nb, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code"
                      for o in c.get("outputs", []))
    assert "kept vs planted" in outputs and "no LLM configured" in outputs
    assert os.environ.get("TRACE_NOTEBOOK_N") == "36"
