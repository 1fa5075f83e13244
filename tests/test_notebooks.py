"""Execute every notebook in notebooks/ top to bottom against a fresh temporary store.

Each notebook runs in its own kernel with `TRACE_DB` pointing at a new DuckDB file and the
notebooks folder as working directory, so notebooks cannot depend on each other's state or
on the developer's data/trace.duckdb. A per-notebook timeout keeps a stuck cell from
hanging CI; a notebook may lower it with `metadata.trace.timeout_s`.
"""

from __future__ import annotations

import os
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
DEFAULT_TIMEOUT_S = 600


@pytest.mark.parametrize("path", sorted(NOTEBOOKS.glob("*.ipynb")), ids=lambda p: p.name)
def test_notebook_runs(path: Path, tmp_path: Path, monkeypatch):
    monkeypatch.setenv("TRACE_DB", str(tmp_path / "trace.duckdb"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRACE_NOTEBOOK_N", "36")  # notebooks that build demo data keep it small
    for key in ("ANTHROPIC_API_KEY", "TRACE_OPENAI_BASE_URL", "OPENAI_API_KEY"):
        monkeypatch.delenv(key, raising=False)  # embedded defaults: offline
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")
    # The kernel imports trace_lib from this checkout even where it is not pip-installed.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        p for p in (str(NOTEBOOKS.parent), os.environ.get("PYTHONPATH", "")) if p))
    nb = nbformat.read(path, as_version=4)
    timeout = int(nb.metadata.get("trace", {}).get("timeout_s", DEFAULT_TIMEOUT_S))
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3",
                            resources={"metadata": {"path": str(NOTEBOOKS)}})
    client.execute()  # raises CellExecutionError naming the cell and its traceback
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
              if o.get("output_type") == "error"]
    assert not errors
