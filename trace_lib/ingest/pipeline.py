"""`ingest_paths` / `ingest_bytes` / `store_stats`: the library calls behind the CLI and the page.

Design decisions
- Streaming, all or nothing. Each file is parsed record by record and written in Arrow
  batches (writer.py) inside ONE transaction over every path of the call: memory is one
  batch, not the file, and a bad record anywhere (file 3, record 900k) rolls everything
  back. The store is opened at the first batch, so a file that fails early never opens it,
  and a store this call created is deleted again when the import fails.
- `--skip-invalid` skips bad *records* (and one-record SWE-agent files); a file that
  cannot be read at all (not UTF-8, truncated JSON document, empty, a directory, unknown
  format) still stops the import: skipping it silently would hide a whole dataset.
- The report counts what this call added: `trajectories` = new rows, split into
  `successes` / `failures` / `unknown` / `errors` (runs the harness crashed on);
  `duplicates` = records already in the store (or repeated in this import); `skipped`
  lists each skipped record with its reason; `notes` says what was inferred (a domain from
  the policy text, a model from the file name); `warnings` what looks wrong but imported.
- Overrides: `domain` / `agent_model` replace what a file says or what was inferred, for
  every record (and the domain of the file's given tool schemas).
- The cyclic garbage collector is paused during an import: parsing allocates millions of
  small acyclic objects, so every collection would re-scan them for nothing. It is
  re-enabled when the import ends, whatever happens.
- `progress`: True shows a tqdm bar on stderr (bytes read); a callable gets (fraction in
  [0, 1], text) — the Streamlit page passes one that drives st.progress.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trace_lib import store
from trace_lib.data_model import Trajectory
from trace_lib.errors import UserInputError
from trace_lib.ingest.formats import load
from trace_lib.ingest.importer import ParseContext
from trace_lib.ingest.normalise import DEFAULT_REWARD_RANGE, ParsedFile, Skipped, SuccessMap
from trace_lib.ingest.rows import TrajectoryRows
from trace_lib.ingest.source import IngestLimits, Source
from trace_lib.ingest.swe_agent import load_success_file
from trace_lib.ingest.third_party_warnings import third_party_warnings
from trace_lib.ingest.writer import BATCH_SIZE, FileResult, Writer
from trace_lib.store import derived
from trace_lib.store import trajectories as store_trajectories
from trace_lib.store.search import IndexBehind

ProgressFn = Callable[[float, str], None]


@dataclass
class IngestReport:
    """What one import call did; `to_json()` is the `ingest --json` document."""

    trajectories: int = 0
    successes: int = 0
    failures: int = 0
    unknown: int = 0
    errors: int = 0
    duplicates: int = 0
    skipped: list[Skipped] = field(default_factory=list)
    datasets: list[dict[str, Any]] = field(default_factory=list)
    formats: dict[str, str] = field(default_factory=dict)  # file -> detected/chosen format
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def add(self, f: ParsedFile, r: FileResult) -> None:
        self.formats[f.name] = f.format
        self.skipped.extend(f.skipped)
        self.notes.extend(f.notes)
        self.warnings.extend(r.warnings)
        self.duplicates += r.duplicates
        self.datasets.append(r.to_json())
        self.trajectories += r.new
        self.successes += r.successes
        self.failures += r.failures
        self.unknown += r.unknown
        self.errors += r.errors

    def to_json(self) -> dict[str, Any]:
        return {
            "trajectories": self.trajectories,
            "successes": self.successes,
            "failures": self.failures,
            "unknown": self.unknown,
            "errors": self.errors,
            "duplicates": self.duplicates,
            "skipped": [s.to_json() for s in self.skipped],
            "datasets": self.datasets,
            "formats": self.formats,
            "notes": self.notes,
            "warnings": self.warnings,
        }

    def summary(self) -> str:
        lines = [
            f"imported {self.trajectories} trajectories ({self.successes} successes, "
            f"{self.failures} failures, {self.unknown} unknown, {self.errors} errors); "
            f"{self.duplicates} duplicates, {len(self.skipped)} skipped"
        ]
        for d in self.datasets:
            target = f"dataset {d['id']}" if d["id"] else "no dataset (every record skipped)"
            lines.append(
                f"  {d['name']}: {d['format']}, {d['records']} records, "
                f"{d['trajectories']} new, {d['duplicates']} duplicates -> {target}"
            )
        lines += [f"  note: {n}" for n in self.notes]
        lines += [f"  warning: {w}" for w in self.warnings]
        for s in self.skipped:
            lines.append(f"  skipped {s.file} record {s.record}: {s.reason}")
        return "\n".join(lines)


class _Progress:
    """Bytes read drive the bar; the last step is the commit."""

    def __init__(self, progress: bool | ProgressFn, total: int):
        self.total = max(total, 1)
        self.done = 0
        self.bar = None
        self.fn: ProgressFn | None = None
        if progress is True:
            from tqdm import tqdm

            self.bar = tqdm(total=total, unit="B", unit_scale=True, desc="importing", leave=False)
        elif callable(progress):
            self.fn = progress

    def read(self, n: int) -> None:
        self.done += n
        if self.bar is not None:
            self.bar.update(n)
        if self.fn is not None:
            self.fn(min(0.95, 0.95 * self.done / self.total), f"read {self.done / 1e6:.1f} MB")

    def step(self, text: str) -> None:
        if self.bar is not None:
            self.bar.set_description(text)
        if self.fn is not None:
            self.fn(0.95, text)

    def close(self, text: str = "done") -> None:
        if self.bar is not None:
            self.bar.close()
        if self.fn is not None:
            self.fn(1.0, text)


def _file_sha256(src: Source) -> str:
    digest = hashlib.sha256()
    for chunk in src.chunks():
        digest.update(chunk)
    return digest.hexdigest()


def _overridden(records: Iterator[Trajectory | TrajectoryRows], ctx: ParseContext
                ) -> Iterator[Trajectory | TrajectoryRows]:
    # Both shapes name these fields alike (rows.py).
    for t in records:
        if ctx.domain is not None:
            t.domain = ctx.domain
        if ctx.agent_model is not None:
            t.agent_model = ctx.agent_model
        yield t


def _prepare(src: Source, fmt: str, ctx: ParseContext) -> ParsedFile:
    parsed = load(src, fmt, ctx)
    if not parsed.sha256:
        # Streaming importers learn the file's hash only at its end, but every row names
        # its dataset: hash the file first (a fast pass, ~2% of the import's CPU).
        parsed.sha256 = _file_sha256(src)
    if ctx.domain is not None or ctx.agent_model is not None:
        parsed.records = _overridden(parsed.records, ctx)
        if ctx.domain is not None:
            for s in parsed.given_schemas:
                s.domain = ctx.domain
    return parsed


def _ingest(sources: list[Source], *, db: str | Path | None, fmt: str, success: SuccessMap | None,
            progress: bool | ProgressFn, ctx: ParseContext, batch_size: int) -> IngestReport:
    if not sources:
        raise UserInputError("no input files given; expected one or more paths")
    bar = _Progress(progress, sum(s.size() for s in sources))
    ctx.success = success
    ctx.progress = bar.read if (bar.bar or bar.fn) else None
    report = IngestReport()
    target = store.LazyWriteTransaction(db, ctx.limits.store_memory_bytes)
    with _gc_paused(), third_party_warnings() as caught:
        try:
            writer = Writer(target.connect, {s.name: s.origin for s in sources}, batch_size)
            for src in sources:
                parsed = _prepare(src, fmt, ctx)
                report.add(parsed, writer.write_file(parsed))
            bar.step("committing")
            writer.finish()
            # Derived columns and search documents of the new rows, in the same
            # all-or-nothing import (the search index commits after DuckDB's commit).
            try:
                # DuckDB's close (a checkpoint) waits until the index committed: a kill
                # between the two commits, which leaves the index behind, is then rarer
                with derived.on_import(target.con, target.path):
                    target.commit(close=False)
            except IndexBehind as exc:  # committed: only the side index lags, say so
                report.notes.append(str(exc))
            target.close()
            report.notes += caught.notes()
        except store.OutOfMemoryError as exc:
            target.abort()
            raise UserInputError(
                f"the import needs more than the {ctx.limits.store_memory_bytes >> 20} MiB of "
                f"database memory it may use (IngestLimits.store_memory_bytes): {exc}. Import "
                f"the files in several calls, or raise the limit"
            ) from None
        except BaseException:
            target.abort()
            raise
        finally:
            bar.close()
    return report


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def parse_reward_range(value: str | tuple[float, float] | None) -> tuple[float, float]:
    """`"LO,HI"` (the CLI's --reward-range) or a pair -> (lo, hi); None is [0, 1]."""
    if value is None:
        return DEFAULT_REWARD_RANGE
    if isinstance(value, str):
        parts = value.split(",")
        try:
            lo, hi = (float(p) for p in parts)
        except ValueError:
            raise UserInputError(
                f"--reward-range {value!r}: expected two numbers LO,HI (e.g. 0,10)"
            ) from None
    else:
        lo, hi = (float(v) for v in value)
    if not lo < hi:
        raise UserInputError(f"reward range [{lo:g}, {hi:g}]: expected LO < HI")
    return lo, hi


def _context(skip_invalid: bool, limits: IngestLimits | None, reward_range: Any,
             require_outcome: bool, domain: str | None, agent_model: str | None) -> ParseContext:
    for name, value in (("domain", domain), ("agent model", agent_model)):
        if value is not None and not value.strip():
            raise UserInputError(f"{name} override: expected a non-empty name")
    return ParseContext(
        limits=limits or IngestLimits(),
        skip_invalid=skip_invalid,
        reward_range=parse_reward_range(reward_range),
        require_outcome=require_outcome,
        domain=domain.strip() if domain else None,
        agent_model=agent_model.strip() if agent_model else None,
    )


def ingest_paths(
    paths: list[str | Path],
    *,
    db: str | Path | None = None,
    fmt: str = "auto",
    skip_invalid: bool = False,
    success_file: str | Path | None = None,
    progress: bool | ProgressFn = False,
    limits: IngestLimits | None = None,
    reward_range: str | tuple[float, float] | None = None,
    require_outcome: bool = False,
    domain: str | None = None,
    agent_model: str | None = None,
    batch_size: int = BATCH_SIZE,
) -> IngestReport:
    """Import trajectory files into the store, all or nothing. Raises UserInputError."""
    if isinstance(paths, str | Path):
        paths = [paths]  # one path given bare: never iterate over its characters
    ctx = _context(skip_invalid, limits, reward_range, require_outcome, domain, agent_model)
    sources = [Source.from_path(p) for p in paths]
    success = load_success_file(success_file) if success_file else None
    return _ingest(sources, db=db, fmt=fmt, success=success, progress=progress, ctx=ctx,
                   batch_size=batch_size)


def ingest_bytes(
    name: str,
    data: bytes,
    *,
    db: str | Path | None = None,
    fmt: str = "auto",
    skip_invalid: bool = False,
    progress: bool | ProgressFn = False,
    limits: IngestLimits | None = None,
    reward_range: str | tuple[float, float] | None = None,
    require_outcome: bool = False,
    domain: str | None = None,
    agent_model: str | None = None,
) -> IngestReport:
    """Import one uploaded file (the Streamlit upload widget). `name` gives the suffix."""
    ctx = _context(skip_invalid, limits, reward_range, require_outcome, domain, agent_model)
    return _ingest([Source(name=name, data=data)], db=db, fmt=fmt, success=None,
                   progress=progress, ctx=ctx, batch_size=BATCH_SIZE)


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
            "errors": 0,
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
        return {"db": str(path), **store_trajectories.store_counts(con)}
