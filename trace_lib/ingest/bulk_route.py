"""The bulk route of a JSONL import: batches of raw lines parsed by DuckDB where it can
prove a record plain, by the Python importer otherwise.

Design decisions
- Opt-in (`ingest_paths(bulk=True)`): measured, it costs more CPU than the Python route
  on the 2-core box (store/bulk_openai.py says where it goes).
- The importer (openai_jsonl.py) splits the file into lines in Python (the limits, the
  file hash and the progress bar stay `source.iter_jsonl_raw`'s) and yields them as
  `LineBatch`es of `LINES` lines instead of records when the import asks for it
  (`ParseContext.bulk`, set by the pipeline; other callers of `load` still get records).
- The writer hands each batch here. DuckDB classifies the lines and builds the rows of
  the plain ones (`store.bulk_openai`: the SQL and its proof of "plain"); the others are
  parsed by the importer's own `take`, the reference, which accepts them or raises /
  skips with its usual words. Records are then written in file order: a run of plain
  records is inserted by one statement per table after the Python route's pending batch
  is flushed, so "first in the file wins" for duplicates, the outcome counts, the
  same-id-other-content warning (fed with the run's ids and hashes, in order) and the
  inferred tool schemas (fed with the run's counted argument types) are what the Python
  route alone gives.
- A line that is not UTF-8 is never sent to DuckDB: the Python route words its error.
- Batches of 50k lines: ~30 MB of text and DuckDB's temporary tables, dropped per batch,
  so memory does not grow with the file.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from trace_lib.ingest.source import JsonlLine, RawLine
from trace_lib.store import bulk_openai

LINES = 50_000


@dataclass
class LineBatch:
    """Raw lines of a file (and the errors of lines over the record limit), in order, and
    the importer's Python route for one of them (None: skipped)."""

    items: list[RawLine | JsonlLine]
    take: Callable[[RawLine | JsonlLine], Any]
    count: Callable[[int], None]  # the importer counts records the bulk route took


@dataclass
class RunResult:
    """What one run of plain records added (the writer folds it into its FileResult)."""

    records: int
    outcomes: dict[str, int]
    ids: list[tuple[str | None, str]]
    calls: list[tuple[str, str, int]]  # (domain, tool, calls)
    keys: list[tuple[str, str, str, list[str], int]]  # (domain, tool, key, JSON types, n)


_TYPE_NAMES = {"VARCHAR": "string", "UBIGINT": "integer", "BIGINT": "integer",
               "BOOLEAN": "boolean", "NULL": "null"}


def plain_records(con: Any, lb: LineBatch, ctx: Any) -> set[int]:
    """The records of `lb` DuckDB takes (see the module docstring)."""
    records, lines = [], []
    for item in lb.items:
        if type(item) is tuple:  # a RawLine; a JsonlLine is a line's error
            try:
                lines.append(item[1].decode("utf-8"))
            except UnicodeDecodeError:
                continue
            records.append(item[0])
    if not records:
        return set()
    return set(bulk_openai.stage(
        con, records, lines, reward_range=ctx.reward_range,
        require_outcome=ctx.require_outcome, domain=ctx.domain,
        agent_model=ctx.agent_model))


def insert_run(con: Any, first: int, last: int, dataset_id: str, default_domain: str
               ) -> RunResult:
    out = bulk_openai.insert_run(con, first, last, dataset_id, default_domain)
    ids = out["ids"]
    pairs = list(zip(ids.column("source_id").to_pylist(), ids.column("sha").to_pylist(),
                     strict=True))
    keys = [(d, t, k, sorted({_TYPE_NAMES[x] for x in types}), n)
            for d, t, k, types, n in out["keys"]]
    return RunResult(len(pairs), out["outcomes"], pairs, out["calls"], keys)


def walk(lb: LineBatch, plain: set[int], on_run: Callable[[int, int], None],
         on_record: Callable[[Any], None]) -> None:
    """Visit `lb` in file order: `on_run(first, last)` for each run of plain records,
    `on_record(record)` for each record the Python route parsed and kept."""
    first = last = -1
    n_plain = 0
    for item in lb.items:
        rec = item[0] if type(item) is tuple else item.record
        if rec in plain:
            if first < 0:
                first = rec
            last = rec
            n_plain += 1
            continue
        if first >= 0:
            on_run(first, last)
            first = -1
        kept = lb.take(item)
        if kept is not None:
            on_record(kept)
    if first >= 0:
        on_run(first, last)
    lb.count(n_plain)
