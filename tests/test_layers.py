"""Pages are thin front ends: they import the use cases (`trace_lib.workbench`) and the UI
libraries, never the stages, the store or another page. `lint-imports` checks the library
(pyproject.toml); pages and app.py are scripts, not a package, so this test reads them."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PAGES = sorted((REPO / "pages").glob("*.py")) + [REPO / "app.py"]
# Widgets several front ends show (`page_parts.py`, beside app.py): a front end itself,
# checked like the pages, and the one non-page module pages and Home may import.
SHARED = [REPO / "page_parts.py"]
FRONT_ENDS = PAGES + SHARED
UI_LIBRARIES = {"streamlit", "pandas", "plotly"}


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """(line, module) for every import in the file, at any depth (function bodies too)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # a relative import: pages are scripts, this would be a page
                out.append((node.lineno, "." * node.level + (node.module or "")))
            else:
                out.append((node.lineno, node.module or ""))
    return out


def allowed(module: str) -> bool:
    top = module.split(".")[0]
    if top in {p.stem for p in SHARED}:
        return True
    if module == "trace_lib.workbench" or module.startswith("trace_lib.workbench."):
        return True
    return top in UI_LIBRARIES or (top in sys.stdlib_module_names and top != "trace_lib")


def test_there_are_front_ends_to_check():
    assert len(FRONT_ENDS) >= 7 and all(p.exists() for p in FRONT_ENDS)


@pytest.mark.parametrize("path", FRONT_ENDS, ids=lambda p: p.name)
def test_front_end_imports_only_use_cases_and_ui_libraries(path: Path):
    bad = [f"{path.name}:{line} imports {mod}" for line, mod in imported_modules(path)
           if not allowed(mod)]
    assert not bad, "pages call trace_lib.workbench only:\n" + "\n".join(bad)


@pytest.mark.parametrize("path", FRONT_ENDS, ids=lambda p: p.name)
def test_no_page_imports_another_page(path: Path):
    page_names = {p.stem for p in PAGES}
    bad = [f"{path.name}:{line} imports {mod}" for line, mod in imported_modules(path)
           if mod.lstrip(".").split(".")[0] in page_names | {"pages"} or mod.startswith(".")]
    assert not bad, "\n".join(bad)


def test_the_check_catches_a_stage_import(tmp_path: Path):
    page = tmp_path / "9_Bad.py"
    page.write_text("import streamlit as st\nfrom trace_lib import store\n"
                    "def f():\n    from trace_lib.diagnose import labels\n")
    assert [m for _, m in imported_modules(page) if not allowed(m)] == [
        "trace_lib", "trace_lib.diagnose"]


# ------------------------------------------------------ the CLI and the notebooks too

NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))
CLI_MODULES = sorted((REPO / "trace_lib" / "cli").glob("*.py"))


def notebook_imports(path: Path) -> list[tuple[str, str]]:
    """(cell id, module) for every import in the notebook's code cells (shell and magic
    lines left out: they are not Python)."""
    import json

    out = []
    for i, cell in enumerate(json.loads(path.read_text(encoding="utf-8"))["cells"]):
        if cell["cell_type"] != "code":
            continue
        src = "".join(cell["source"])
        code = "\n".join(line for line in src.splitlines()
                         if not line.lstrip().startswith(("%", "!")))
        for node in ast.walk(ast.parse(code, filename=f"{path.name} cell {i}")):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            out += [(cell.get("id", str(i)), n) for n in names]
    return out


def _library_use_case(module: str, also: tuple[str, ...] = ()) -> bool:
    """Outside trace_lib anything goes; inside it, the use cases (and `also`) only."""
    if module.split(".")[0] != "trace_lib":
        return True
    return any(module == m or module.startswith(m + ".")
               for m in ("trace_lib.workbench", *also))


def test_there_are_notebooks_and_cli_modules_to_check():
    assert len(NOTEBOOKS) >= 6 and len(CLI_MODULES) >= 10


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebooks_reach_the_library_through_the_use_cases(path: Path):
    bad = [f"{path.name} cell {cell} imports {mod}" for cell, mod in notebook_imports(path)
           if not _library_use_case(mod)]
    assert not bad, "a notebook cell is a page action: trace_lib.workbench only\n" + \
        "\n".join(bad)


@pytest.mark.parametrize("path", CLI_MODULES, ids=lambda p: p.name)
def test_cli_verbs_reach_the_library_through_the_use_cases(path: Path):
    bad = [f"cli/{path.name}:{line} imports {mod}" for line, mod in imported_modules(path)
           if not _library_use_case(mod, ("trace_lib.cli", "trace_lib.errors"))]
    assert not bad, "a CLI verb is a page action: trace_lib.workbench only\n" + "\n".join(bad)


# ------------------------------------------------------ one home for the schema

LIBRARY = REPO / "trace_lib"
# The analytical query modules keep their SQL (over views the store defines).
QUERY_MODULES = {"explore/queries.py", "diagnose/ranking.py", "diagnose/materialise.py"}


def _imports_duckdb(path: Path) -> bool:
    return any(mod.split(".")[0] == "duckdb" for _, mod in imported_modules(path))


def test_duckdb_is_imported_only_by_the_store_and_the_query_modules():
    importers = {p.relative_to(LIBRARY).as_posix() for p in LIBRARY.rglob("*.py")
                 if _imports_duckdb(p)}
    assert importers, "the store imports duckdb: the check reads nothing"
    bad = sorted(m for m in importers
                 if not m.startswith("store/") and m not in QUERY_MODULES)
    assert not bad, "SQL lives in trace_lib/store (and the named query modules):\n" + \
        "\n".join(bad)
