"""The bulk writer: streamed trajectories -> Arrow record batches -> DuckDB, in one transaction.

Design decisions
- Rows are built as Python column lists for one batch (`batch_size` trajectories, 10k,
  ~120 MiB of Python objects), wrapped in Arrow arrays and inserted with one
  `INSERT ... SELECT` per table over a DuckDB relation of them; then the lists are dropped
  and the next batch starts. DuckDB reads Arrow without copying row by row
  (bench/ingest.py compares it with executemany), and the parsed records never outlive
  their batch. The caller holds the transaction, so a failure in batch 40 still leaves the
  store as it was.
- Memory that grows with the import is 32 bytes per record: two `KeyRuns` (key_runs.py)
  of 64-bit pairs, the contents seen (stored or imported) and the file's source ids. The
  bulk tables have no keys (migration BULK_TABLES_UNKEYED), so the open transaction keeps
  no in-memory index of its new rows (it was ~250 MiB per 1M trajectories and a 10M import
  ran out of DuckDB's 768 MiB) and DuckDB can spill the uncommitted rows to disk. The
  Arrow batches are handed over as relations, because a table given to `con.register`
  stays referenced until COMMIT (it held every batch, ~100 MiB per 100k). The statements
  themselves are `store.trajectories`' (`insert_arrow`, `content_keys`).
- Input: what importers yield, validated `Trajectory` models or `TrajectoryRows` (rows.py;
  the OpenAI importer's fast route builds those without models). Models are turned into
  rows first (`as_rows`), so the hash and the rows are computed from one shape: the same
  trajectory gives the same hash and rows whichever shape it came in.
- Identity: a trajectory is its content hash (`t_` + 16 hex of it is its id). The hash is
  taken over the strings this module builds for the rows anyway (the arguments' JSON,
  the contents, the ids), so no record is serialised twice. Duplicates — already in the
  store, or twice in this import — are counted, not inserted: the first 128 bits of every
  stored content hash are read once, at the first batch (16 bytes per stored trajectory;
  it was a join of each batch with the whole table, quadratic in the import), and each
  batch's new ones are added. The writer is the one place that keeps a trajectory id
  unique (no key does): an id already taken by other content (two digests agreeing in
  their first 64 bits, ~3e-6 for 10M trajectories) stops the import with a clear error,
  as the key's violation did; `store check` finds repeated ids in a store.
- The same source id twice in one file with different content is not a duplicate: both
  rows are kept and the ids are listed in the report's warnings (a harness that reuses
  ids, or two runs concatenated), never silently.
- A lone UTF-16 surrogate (`"\ud800"` in the JSON) cannot be stored as UTF-8. It is found
  where the row strings are encoded for the hash (free when there is none), replaced with
  U+FFFD, and the record is named in the warnings.
- A dataset is its file's content SHA-256 (`d_` + 16 hex); re-importing the same bytes
  reuses the row. The row keeps the import report's count of trajectories added
  (`n_trajectories`, raised by a re-import that adds rows), which `store check` compares
  with the dataset's rows. A file whose every record was skipped registers no dataset.
- What a source measured of a message (`TrajectoryRows.message_meta`: tokens, cost,
  latency) goes into `messages.meta` and is not hashed. A batch where no message has any
  leaves the column out of its insert (NULL), so formats without it pay nothing.
- Expected actions are keyed (dataset_id, task_id, idx), with their requestor, and only
  written with a new dataset. Tool schemas: given ones as the files ship them, inferred
  ones observed batch by batch (`schemas.SchemaObserver`), resolved once at the end.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from json.encoder import c_make_encoder, encode_basestring
from typing import Any

import numpy as np
import pyarrow as pa

from trace_lib import store
from trace_lib.data_model import ToolSchema, Trajectory
from trace_lib.errors import UserInputError
from trace_lib.ingest import schemas as schema_mod
from trace_lib.ingest.key_runs import KeyRuns, as_u64, sha_halves
from trace_lib.ingest.normalise import ParsedFile
from trace_lib.ingest.rows import TrajectoryRows, as_rows
from trace_lib.ingest.schemas import DEFAULT_DOMAIN
from trace_lib.store import trajectories as store_trajectories

BATCH_SIZE = 10_000
TRAJECTORY_COLUMNS = (
    "id", "dataset_id", "source_id", "task_id", "trial", "agent_model", "domain", "reward",
    "success", "outcome", "termination", "n_messages", "n_tool_calls", "n_tool_errors",
    "content_sha256", "meta",
)  # fmt: skip
MESSAGE_COLUMNS = ("trajectory_id", "idx", "role", "content", "tool_call_id", "name", "turn_idx")
TOOL_CALL_COLUMNS = (
    "trajectory_id", "message_idx", "call_idx", "call_id", "name", "arguments", "requestor",
    "error",
)  # fmt: skip
_INT = pa.int32()
_STR = pa.string()
_TYPES = {
    "trial": _INT, "reward": pa.float64(), "success": pa.bool_(), "n_messages": _INT,
    "n_tool_calls": _INT, "n_tool_errors": _INT, "idx": _INT, "turn_idx": _INT,
    "message_idx": _INT, "call_idx": _INT,
}  # fmt: skip
_SURROGATE = re.compile("[\ud800-\udfff]")
_SEP = "\x1f"
_NONE = "\x00"


def dataset_id(sha256: str) -> str:
    return "d_" + sha256[:16]


# allow_nan=False: NaN/Infinity are not JSON; DuckDB and every other reader would choke
# on them later. The caller replaces them with null and says so (`_finite`). One encoder
# for the import: `json.dumps` with arguments builds a new one per call (~1 s per 100k
# trajectories). Its output is what the content hash covers, so it must not change.
_ENCODER = json.JSONEncoder(ensure_ascii=False, default=str, allow_nan=False)


def _make_dumps() -> Callable[[Any], str]:
    """`_ENCODER.encode`, without building a new C encoder on every call.

    `JSONEncoder.encode` makes its C iterencoder anew per call (~1 us of the ~2.5 us an
    arguments dict costs; ~0.2 s per 100k trajectories, two calls each). Here one is made
    with the arguments `JSONEncoder.iterencode` gives it, so the text is the same; it is
    made again after any error, since a failed call can leave entries in its
    circular-reference markers.
    """
    if c_make_encoder is None:  # no C accelerator (another Python): the plain encoder
        return _ENCODER.encode

    def new() -> Any:
        return c_make_encoder({}, _ENCODER.default, encode_basestring, None,
                              _ENCODER.key_separator, _ENCODER.item_separator,
                              _ENCODER.sort_keys, _ENCODER.skipkeys, _ENCODER.allow_nan)

    encoder = new()
    join = "".join

    def dumps(value: Any) -> str:
        nonlocal encoder
        if isinstance(value, str):
            return encode_basestring(value)
        try:
            return join(encoder(value, 0))
        except BaseException:
            encoder = new()
            raise

    return dumps


_dumps = _make_dumps()


def _finite(value: Any) -> Any:
    """`value` with every NaN/Infinity float replaced by None (dicts and lists walked)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def _rewritten(traj: TrajectoryRows, fix: Callable[[Any], Any]) -> TrajectoryRows:
    """`traj` with `fix` applied to every value, validated again (rare records only)."""
    return TrajectoryRows.from_trajectory(
        Trajectory.model_validate(fix(traj.to_trajectory().model_dump())))


def _scrub(value: Any) -> Any:
    """`value` with every lone surrogate replaced by U+FFFD (dicts and lists walked)."""
    if isinstance(value, str):
        return _SURROGATE.sub("\ufffd", value)
    if isinstance(value, dict):
        return {_scrub(k): _scrub(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_scrub(v) for v in value]
    return value


@dataclass
class FileResult:
    dataset_id: str
    name: str
    format: str
    records: int
    new_dataset: bool
    new: int = 0
    successes: int = 0
    failures: int = 0
    unknown: int = 0
    errors: int = 0
    duplicates: int = 0
    warnings: list[str] = field(default_factory=list)
    registered: bool = True  # False: every record was skipped, no dataset row

    def count(self, outcome: str) -> None:
        self.new += 1
        if outcome == "success":
            self.successes += 1
        elif outcome == "failure":
            self.failures += 1
        elif outcome == "error":
            self.errors += 1
        else:
            self.unknown += 1

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.dataset_id if self.registered else None,
            "name": _short_name(self.name),
            "source": self.name,
            "format": self.format,
            "records": self.records,
            "trajectories": self.new,
            "errors": self.errors,
            "duplicates": self.duplicates,
            "new_dataset": self.new_dataset and self.registered,
        }


class _Batch:
    """Column lists of one batch of rows."""

    def __init__(self) -> None:
        self.traj: dict[str, list[Any]] = {k: [] for k in TRAJECTORY_COLUMNS}
        # Messages as the rows' own tuples (role, content, tool_call_id, name, turn_idx,
        # calls), extended per trajectory and split into columns once per batch: ~3.5
        # messages per trajectory made 7 appends each the costliest part of this loop.
        self.msg_tid: list[str] = []
        self.msg_idx: list[int] = []
        self.msg_rows: list[Any] = []
        self.msg_meta: list[str | None] = []  # JSON per message, filled only when one has it
        self.calls: list[tuple[Any, ...]] = []
        self.shas: list[str] = []
        # rows, sha, tid, arguments JSON per call, meta JSON
        self.pending: list[tuple[TrajectoryRows, str, str, list[str], str]] = []

    def __len__(self) -> int:
        return len(self.pending)


def _digest(traj: TrajectoryRows) -> tuple[str, list[str]]:
    """(content sha256, the arguments' JSON per call in order): one serialisation each."""
    args_json: list[str] = []
    parts: list[str] = [
        traj.task_id or _NONE, _NONE if traj.trial is None else str(traj.trial),
        traj.agent_model or _NONE, traj.domain or _NONE,
        _NONE if traj.reward is None else repr(traj.reward),
        _NONE if traj.success is None else str(traj.success), traj.outcome or _NONE,
        traj.source_id or _NONE,
    ]  # fmt: skip
    add = parts.append
    for role, content, tool_call_id, name, turn_idx, calls in traj.messages:
        add("\x1e")
        add(role)
        add(_NONE if content is None else content)
        add(tool_call_id or _NONE)
        add(name or _NONE)
        add(_NONE if turn_idx is None else str(turn_idx))
        for c_name, arguments, call_id, requestor, error in calls:
            a = _dumps(arguments)
            args_json.append(a)
            add("\x1d")
            add(c_name)
            add(a)
            add(call_id or _NONE)
            add(requestor or _NONE)
            add(_NONE if error is None else error)
    # A lone surrogate makes this encode fail: the caller scrubs the record and retries.
    blob = _SEP.join(parts).encode("utf-8")
    return hashlib.sha256(blob).hexdigest(), args_json


class Writer:
    """Writes parsed files into the store inside the caller's transaction."""

    def __init__(
        self,
        connect: Callable[[], store.Connection],
        sources: dict[str, str],
        batch_size: int = BATCH_SIZE,
    ):
        # The connection is opened on first use: a file that fails before its first batch
        # is written never opens (or creates) the store.
        self._connect = connect
        self._con: store.Connection | None = None
        self._known: set[str] | None = None
        self._contents: KeyRuns | None = None  # content hashes' first 128 bits seen
        self.sources = sources
        self.batch_size = batch_size
        self.observer = schema_mod.SchemaObserver()
        self.given: list[ToolSchema] = []

    @property
    def con(self) -> store.Connection:
        if self._con is None:
            self._con = self._connect()
        return self._con

    @property
    def contents(self) -> KeyRuns:
        """id (first 64 bits of the content hash) -> next 64 bits, of every trajectory
        stored or written by this writer."""
        if self._contents is None:
            self._contents = KeyRuns(*store_trajectories.content_keys(self.con))
        return self._contents

    @property
    def known_datasets(self) -> set[str]:
        if self._known is None:
            self._known = store_trajectories.dataset_ids(self.con)
        return self._known

    @staticmethod
    def _digest_finite(
        traj: TrajectoryRows, f: ParsedFile, index: int, result: FileResult
    ) -> tuple[TrajectoryRows, str, list[str], str]:
        """Digest a record whose meta or tool arguments hold NaN/Infinity (not JSON): those
        values are stored as null, and the import's summary says so for that record."""
        try:
            sha, args_json = _digest(traj)
            return traj, sha, args_json, _dumps(traj.meta)
        except ValueError:
            pass
        traj = _rewritten(traj, _finite)
        result.warnings.append(
            f"{f.name}: record {traj.source_id or index}: NaN/Infinity in meta or tool "
            f"arguments (not valid JSON) stored as null"
        )
        sha, args_json = _digest(traj)
        return traj, sha, args_json, _dumps(traj.meta)

    # ------------------------------------------------------------------ one file

    def write_file(self, f: ParsedFile, on_batch: Any = None) -> FileResult:
        result = FileResult("", f.name, f.format, 0, True)
        # source id -> content, both as 64-bit hashes in sorted numpy runs: 16 bytes a
        # record, not every id string and digest (a collision can only miss a warning, at
        # odds of ~1e-7 for 1M ids).
        by_source = KeyRuns()
        dup_ids: list[str] = []
        batch = _Batch()
        for index, record in enumerate(f.records):
            traj = as_rows(record)
            try:
                sha, args_json = _digest(traj)
                meta_json = _dumps(traj.meta)
            except UnicodeEncodeError:
                traj = _rewritten(traj, _scrub)
                result.warnings.append(
                    f"{f.name}: record {traj.source_id or index}: lone UTF-16 surrogate(s) "
                    f"replaced with U+FFFD"
                )
                traj, sha, args_json, meta_json = self._digest_finite(traj, f, index, result)
            except ValueError:
                traj, sha, args_json, meta_json = self._digest_finite(traj, f, index, result)
            batch.pending.append((traj, sha, Trajectory.id_from_sha(sha), args_json, meta_json))
            if len(batch) >= self.batch_size:
                _note_repeated_sources(batch, by_source, dup_ids)
                self._flush(batch, f, result)
                batch = _Batch()
                _release_freed_memory()
                if on_batch is not None:
                    on_batch()
        _note_repeated_sources(batch, by_source, dup_ids)
        self._flush(batch, f, result)
        result.records = f.n_records
        ds = result.dataset_id = dataset_id(f.sha256)
        result.new_dataset = ds not in self.known_datasets
        if dup_ids:
            shown = ", ".join(repr(i) for i in dup_ids[:20])
            more = f" and {len(dup_ids) - 20} more" if len(dup_ids) > 20 else ""
            result.warnings.append(
                f"{f.name}: {len(dup_ids)} source id(s) appear more than once with different "
                f"content (both kept): {shown}{more}"
            )
        if f.n_records and len(f.skipped) >= f.n_records:
            result.registered = False  # every record skipped: no dataset for nothing
            return result
        if result.new_dataset:
            self.known_datasets.add(ds)
            self._write_dataset(f, ds, result.new)
        elif result.new:  # the same bytes again, with other overrides: rows added to it
            store_trajectories.add_imported(self.con, ds, result.new)
        self.given.extend(f.given_schemas)
        return result

    def _write_dataset(self, f: ParsedFile, ds: str, n_new: int) -> None:
        n_valid = f.n_records - len(f.skipped)
        self._insert("datasets", {
            "id": pa.array([ds], _STR),
            "name": pa.array([_short_name(f.name)], _STR),
            "format": pa.array([f.format], _STR),
            "source": pa.array([self.sources.get(f.name, f.name)], _STR),
            "content_sha256": pa.array([f.sha256], _STR),
            "n_records": pa.array([n_valid], _INT),
            "n_trajectories": pa.array([n_new], _INT),  # the import report's count
        })  # fmt: skip
        rows: dict[str, list[Any]] = {k: [] for k in
                                      ("dataset_id", "task_id", "idx", "name", "arguments",
                                       "requestor")}
        for task_id, actions in f.expected_actions.items():
            for i, a in enumerate(actions):
                for k, v in zip(rows, (ds, task_id, i, a.name, _dumps(_finite(a.arguments)), a.requestor),
                                strict=True):
                    rows[k].append(v)
        self._insert("expected_actions",
                     {k: pa.array(v, _INT if k == "idx" else _STR) for k, v in rows.items()},
                     ("arguments",))

    # ------------------------------------------------------------------ batches

    def _flush(self, batch: _Batch, f: ParsedFile, result: FileResult) -> None:
        if not batch.pending:
            return
        # Streaming formats know the file's hash only at its end; they hash it up front
        # (`ParsedFile.sha256` set before the first record) so rows can name the dataset.
        ds = dataset_id(f.sha256)
        hi, lo = sha_halves([sha for _, sha, _, _, _ in batch.pending])
        found, known_lo = self.contents.get(hi)
        new_hi: dict[int, int] = {}  # this batch's new contents: id bits -> next 64 bits
        m_tid, m_idx, m_rows = batch.msg_tid.extend, batch.msg_idx.extend, batch.msg_rows.extend
        c_row = batch.calls.append
        t_cols = [batch.traj[k].append for k in TRAJECTORY_COLUMNS]
        observe = self.observer.add_call  # inferred schemas, fed by the loop over the calls
        for i, (traj, sha, tid, args_json, meta_json) in enumerate(batch.pending):
            h, low = int(hi[i]), int(lo[i])
            prior = int(known_lo[i]) if found[i] else new_hi.get(h)
            if prior == low:
                result.duplicates += 1
                continue
            if prior is not None:
                raise UserInputError(
                    f"{f.name}: record {traj.source_id or '(no id)'}: its id {tid} is already the id "
                    f"of a trajectory with other content (two SHA-256 digests agree in their "
                    f"first 64 bits); it cannot be stored. Nothing was imported.")
            new_hi[h] = low
            result.count(traj.outcome or "unknown")
            domain = traj.domain or DEFAULT_DOMAIN
            n_calls = n_errors = 0
            messages = traj.messages
            n_messages = len(messages)
            m_tid([tid] * n_messages)
            m_idx(range(n_messages))
            m_rows(messages)
            if traj.message_meta or batch.msg_meta:
                if not batch.msg_meta:  # the batch's first measured message: pad before it
                    batch.msg_meta = [None] * (len(batch.msg_tid) - n_messages)
                measured = traj.message_meta
                batch.msg_meta.extend(_dumps(measured[i]) if i in measured else None
                                      for i in range(n_messages))
            if args_json:  # only then has any message calls
                for idx, m in enumerate(messages):
                    for ci, (c_name, arguments, call_id, requestor, error) in enumerate(m[5]):
                        c_row((tid, idx, ci, call_id, c_name, args_json[n_calls], requestor,
                               error))
                        observe(domain, c_name, arguments)
                        n_calls += 1
                        n_errors += error is not None
            row = (
                tid, ds, traj.source_id, traj.task_id, traj.trial, traj.agent_model,
                traj.domain, traj.reward, traj.success, traj.outcome, traj.termination,
                n_messages, n_calls, n_errors, sha, meta_json,
            )  # fmt: skip
            for append, v in zip(t_cols, row, strict=True):
                append(v)
        batch.pending.clear()
        self.contents.add(np.fromiter(new_hi, np.uint64, len(new_hi)),
                          np.fromiter(new_hi.values(), np.uint64, len(new_hi)))
        self._insert("trajectories",
                     {k: pa.array(v, _TYPES.get(k, _STR)) for k, v in batch.traj.items()},
                     ("meta",))
        split = list(zip(*batch.msg_rows, strict=True)) if batch.msg_rows else [()] * 6
        message_columns = {
            k: pa.array(list(v), _TYPES.get(k, _STR)) for k, v in zip(
                MESSAGE_COLUMNS, (batch.msg_tid, batch.msg_idx, *split[:5]), strict=True)}
        if batch.msg_meta:
            message_columns["meta"] = pa.array(batch.msg_meta, _STR)
        self._insert("messages", message_columns, ("meta",))
        columns = list(zip(*batch.calls, strict=True)) if batch.calls else [[]] * len(
            TOOL_CALL_COLUMNS)
        self._insert("tool_calls",
                     {k: pa.array(list(v), _TYPES.get(k, _STR))
                      for k, v in zip(TOOL_CALL_COLUMNS, columns, strict=True)},
                     ("arguments",))

    def _insert(self, table: str, columns: dict[str, pa.Array],
                json_cols: tuple[str, ...] = ()) -> None:
        store_trajectories.insert_arrow(self.con, table, columns, json_cols)

    # ------------------------------------------------------------------ schemas

    def finish(self) -> None:
        """Upsert given and inferred tool schemas (once, after every file)."""
        existing = store_trajectories.tool_schema_rows(self.con)
        covered = {(s.domain, s.name) for s in self.given} | {
            k for k, (_, src) in existing.items() if src == "given"
        }
        inferred = self.observer.schemas(skip=covered)
        rows = schema_mod.resolve(existing, self.given + inferred)
        store_trajectories.upsert_tool_schemas(
            self.con, [(s.domain, s.name, _dumps(_finite(s.schema_)), s.source) for s in rows])


def _note_repeated_sources(batch: _Batch, by_source: KeyRuns, dup_ids: list[str]) -> None:
    """Add to `dup_ids` each source id of this batch that came earlier in the file (or
    earlier in the batch) with other content, once; remember the batch's first ones."""
    pairs = [(traj.source_id, sha) for traj, sha, _, _, _ in batch.pending
             if traj.source_id is not None]
    if not pairs:
        return
    keys = as_u64([hash(src) for src, _ in pairs])
    values = as_u64([hash(sha) for _, sha in pairs])
    found, prior = by_source.get(keys)
    first: dict[int, int] = {}  # this batch's new source ids -> their first content
    named = set(dup_ids)
    for i, (src, _) in enumerate(pairs):
        key, value = int(keys[i]), int(values[i])
        before = int(prior[i]) if found[i] else first.setdefault(key, value)
        if before != value and src not in named:
            dup_ids.append(src)
            named.add(src)
    by_source.add(np.fromiter(first, np.uint64, len(first)),
                  np.fromiter(first.values(), np.uint64, len(first)))


def _release_freed_memory() -> None:
    """Hand a flushed batch's freed memory back to the OS: the batch's Python objects are
    gone (tracemalloc: ~33 MiB live after 100k trajectories), but Arrow's pool and glibc
    keep freed blocks cached (measured: 907 -> 882 MiB peak at 300k)."""
    pa.default_memory_pool().release_unused()
    if _LIBC is not None:
        _LIBC.malloc_trim(0)


def _load_libc() -> Any:
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        libc.malloc_trim.argtypes = [ctypes.c_size_t]
        return libc
    except (OSError, AttributeError):  # not glibc (macOS, musl): nothing to trim
        return None


_LIBC = _load_libc()


def _short_name(name: str) -> str:
    return name.replace("\\", "/").rsplit("/", 1)[-1]
