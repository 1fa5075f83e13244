"""`ingest_paths` / `ingest_bytes` / `store_stats`: the library calls behind the CLI and the page.

Design decisions
- Two phases. First every file is read, detected and normalised in memory; only when all
  of them parsed (or, with `skip_invalid`, their bad records were set aside) does one
  `store.transaction` write them all. A bad record or file therefore imports nothing,
  across all paths of one call, and the database is never touched by a failed import.
- `--skip-invalid` skips bad *records* (and one-record SWE-agent files); a file that
  cannot be read at all (not UTF-8, truncated JSON document, empty, a directory, unknown
  format) still stops the import: skipping it silently would hide a whole dataset.
- The report counts what this call added: `trajectories` = new rows, split into
  `successes` / `failures` / `unknown`; `duplicates` = records already in the store (or
  repeated in this import); `skipped` lists each skipped record with its reason.
- The cyclic garbage collector is paused during an import: parsing allocates millions of
  small objects that all stay alive until the write, so every collection would re-scan
  them for nothing (it halved parse time in bench/ingest.py). It is re-enabled when the
  import ends, whatever happens; the parsed objects are acyclic and freed by refcount.
- `progress`: True shows a tqdm bar on stderr (bytes read, then a write step); a callable
  gets (fraction in [0, 1], text) — the Streamlit page passes one that drives st.progress.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trace_lib import store
from trace_lib.errors import UserInputError
from trace_lib.ingest.formats import ParseContext, load
from trace_lib.ingest.records import ParsedFile, Skipped, SuccessMap
from trace_lib.ingest.source import IngestLimits, Source
from trace_lib.ingest.swe_agent import load_success_file
from trace_lib.ingest.writer import FileResult, write_files

ProgressFn = Callable[[float, str], None]


@dataclass
class IngestReport:
    """What one import call did; `to_json()` is the `ingest --json` document."""

    trajectories: int = 0
    successes: int = 0
    failures: int = 0
    unknown: int = 0
    duplicates: int = 0
    skipped: list[Skipped] = field(default_factory=list)
    datasets: list[dict[str, Any]] = field(default_factory=list)
    formats: dict[str, str] = field(default_factory=dict)  # file -> detected/chosen format

    def to_json(self) -> dict[str, Any]:
        return {
            "trajectories": self.trajectories,
            "successes": self.successes,
            "failures": self.failures,
            "unknown": self.unknown,
            "duplicates": self.duplicates,
            "skipped": [s.to_json() for s in self.skipped],
            "datasets": self.datasets,
            "formats": self.formats,
        }

    def summary(self) -> str:
        lines = [
            f"imported {self.trajectories} trajectories ({self.successes} successes, "
            f"{self.failures} failures, {self.unknown} unknown); {self.duplicates} duplicates, "
            f"{len(self.skipped)} skipped"
        ]
        for d in self.datasets:
            lines.append(
                f"  {d['name']}: {d['format']}, {d['records']} records, "
                f"{d['trajectories']} new, {d['duplicates']} duplicates -> dataset {d['id']}"
            )
        for s in self.skipped:
            lines.append(f"  skipped {s.file} record {s.record}: {s.reason}")
        return "\n".join(lines)


class _Progress:
    """Bytes read drive the first 90%; writing is the last step."""

    def __init__(self, progress: bool | ProgressFn, total: int):
        self.total = max(total, 1)
        self.done = 0
        self.bar = None
        self.fn: ProgressFn | None = None
        if progress is True:
            from tqdm import tqdm

            self.bar = tqdm(total=total, unit="B", unit_scale=True, desc="reading", leave=False)
        elif callable(progress):
            self.fn = progress

    def read(self, n: int) -> None:
        self.done += n
        if self.bar is not None:
            self.bar.update(n)
        if self.fn is not None:
            self.fn(min(0.9, 0.9 * self.done / self.total), f"reading {self.done / 1e6:.1f} MB")

    def step(self, text: str) -> None:
        if self.bar is not None:
            self.bar.set_description(text)
        if self.fn is not None:
            self.fn(0.9, text)

    def close(self, text: str = "done") -> None:
        if self.bar is not None:
            self.bar.close()
        if self.fn is not None:
            self.fn(1.0, text)


def _ingest(
    sources: list[Source],
    *,
    db: str | Path | None,
    fmt: str,
    skip_invalid: bool,
    success: SuccessMap | None,
    progress: bool | ProgressFn,
    limits: IngestLimits | None,
) -> IngestReport:
    if not sources:
        raise UserInputError("no input files given; expected one or more paths")
    bar = _Progress(progress, sum(s.size() for s in sources))
    ctx = ParseContext(
        limits=limits or IngestLimits(),
        skip_invalid=skip_invalid,
        success=success,
        progress=bar.read if (bar.bar or bar.fn) else None,
    )
    parsed: list[ParsedFile] = []
    with _gc_paused():
        try:
            for src in sources:
                parsed.append(load(src, fmt, ctx))
            bar.step("writing")
            with store.connect(db) as con, store.transaction(con):
                results = write_files(con, parsed, {s.name: s.origin for s in sources})
        finally:
            bar.close()
        return _report(parsed, results)


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _report(parsed: list[ParsedFile], results: list[FileResult]) -> IngestReport:
    report = IngestReport()
    for f, r in zip(parsed, results, strict=True):
        report.formats[f.name] = f.format
        report.skipped.extend(f.skipped)
        report.duplicates += r.duplicates
        report.datasets.append(r.to_json())
        for t in r.new:
            report.trajectories += 1
            if t.success is True:
                report.successes += 1
            elif t.success is False:
                report.failures += 1
            else:
                report.unknown += 1
    return report


def ingest_paths(
    paths: list[str | Path],
    *,
    db: str | Path | None = None,
    fmt: str = "auto",
    skip_invalid: bool = False,
    success_file: str | Path | None = None,
    progress: bool | ProgressFn = False,
    limits: IngestLimits | None = None,
) -> IngestReport:
    """Import trajectory files into the store, all or nothing. Raises UserInputError."""
    if isinstance(paths, str | Path):
        paths = [paths]  # one path given bare: never iterate over its characters
    sources = [Source.from_path(p) for p in paths]
    success = load_success_file(success_file) if success_file else None
    return _ingest(
        sources,
        db=db,
        fmt=fmt,
        skip_invalid=skip_invalid,
        success=success,
        progress=progress,
        limits=limits,
    )


def ingest_bytes(
    name: str,
    data: bytes,
    *,
    db: str | Path | None = None,
    fmt: str = "auto",
    skip_invalid: bool = False,
    progress: bool | ProgressFn = False,
    limits: IngestLimits | None = None,
) -> IngestReport:
    """Import one uploaded file (the Streamlit upload widget). `name` gives the suffix."""
    return _ingest(
        [Source(name=name, data=data)],
        db=db,
        fmt=fmt,
        skip_invalid=skip_invalid,
        success=None,
        progress=progress,
        limits=limits,
    )


def store_stats(db: str | Path | None = None) -> dict[str, Any]:
    """Counts over the whole store (the same outcome keys as an IngestReport)."""
    path = store.resolve_db_path(db)
    if not path.exists():
        return {
            "db": str(path),
            "trajectories": 0,
            "successes": 0,
            "failures": 0,
            "unknown": 0,
            "messages": 0,
            "tool_calls": 0,
            "tool_errors": 0,
            "expected_actions": 0,
            "tool_schemas": {},
            "datasets": [],
            "formats": {},
            "domains": {},
        }
    with store.connect(db, read_only=True) as con:
        n, succ, fail, unk = con.execute(
            "SELECT count(*), count(*) FILTER (success), count(*) FILTER (NOT success), "
            "count(*) FILTER (success IS NULL) FROM trajectories"
        ).fetchone()
        n_msgs = con.execute("SELECT count(*) FROM messages").fetchone()[0]
        n_calls, n_err = con.execute("SELECT count(*), count(error) FROM tool_calls").fetchone()
        n_ea = con.execute("SELECT count(*) FROM expected_actions").fetchone()[0]
        schemas = dict(
            con.execute(
                "SELECT source, count(*) FROM tool_schemas GROUP BY 1 ORDER BY 1"
            ).fetchall()
        )
        datasets = [
            {
                "id": r[0],
                "name": r[1],
                "format": r[2],
                "trajectories": r[3],
                "successes": r[4],
                "imported_at": str(r[5]),
            }
            for r in con.execute(
                "SELECT d.id, d.name, d.format, count(t.id), count(t.id) FILTER (t.success), d.imported_at "
                "FROM datasets d LEFT JOIN trajectories t ON t.dataset_id = d.id "
                "GROUP BY ALL ORDER BY d.imported_at, d.name"
            ).fetchall()
        ]
        formats = dict(
            con.execute(
                "SELECT d.format, count(*) FROM trajectories t JOIN datasets d ON d.id = t.dataset_id "
                "GROUP BY 1 ORDER BY 1"
            ).fetchall()
        )
        domains = dict(
            con.execute(
                "SELECT coalesce(domain, '(none)'), count(*) FROM trajectories GROUP BY 1 ORDER BY 1"
            ).fetchall()
        )
    return {
        "db": str(path),
        "trajectories": n,
        "successes": succ,
        "failures": fail,
        "unknown": unk,
        "messages": n_msgs,
        "tool_calls": n_calls,
        "tool_errors": n_err,
        "expected_actions": n_ea,
        "tool_schemas": schemas,
        "datasets": datasets,
        "formats": formats,
        "domains": domains,
    }
