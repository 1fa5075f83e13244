"""Reading import files safely: size limits, UTF-8, JSON errors that name the place.

Design decisions
- A `Source` is a name plus either a path or bytes, so the CLI (paths) and the Streamlit
  upload widget (bytes) go through the same importers.
- Two ways to read. Whole-document formats (tau-bench, tau2, SWE-agent) are parsed in one
  go, bounded by `max_document_bytes`. JSONL is streamed in chunks and split into lines
  without ever holding more than one record (`max_record_bytes`) plus one chunk: an
  oversized line is skipped over as it streams past, not loaded, so a 200 MB line costs
  at most the limit in memory. Chunks are kept in a list and joined once per line
  (appending to one `bytes` would copy the line again on every chunk).
- The file's SHA-256 is computed while reading: the dataset row is keyed by it.
- Text must be UTF-8 (a leading BOM is accepted). A bad byte is reported with its offset
  and line, never replaced silently: `errors="replace"` would change the content hash.
- Every error is a `UserInputError` whose message starts with the file name; a record-level
  problem is a `RecordError` that the importer may turn into a skipped record.
- Compressed input is read transparently: a name ending in `.gz` is decompressed as it
  streams (users keep their logs compressed), and the suffix that decides the format is
  the one under `.gz` (`runs.jsonl.gz` is JSONL). The hash and every limit apply to the
  decompressed bytes, so a `.json` and its `.json.gz` are the same dataset.
- `json.loads` failures that are not syntax errors are still the file's fault, never a
  traceback: nesting deeper than the parser's recursion limit (`RecursionError`) and
  integers over Python's 4300-digit conversion limit (`ValueError`) are reported as such.
- Records are parsed with orjson (`fast_loads`, ~3x faster than `json.loads`, the largest
  single cost of an import) only where it gives exactly what `json.loads` gives; anything
  it refuses or reads differently goes to `json.loads`, whose result and error messages
  stay the reference: NaN/Infinity (not JSON, accepted by `json`), lone surrogates,
  nesting over 1024 levels, invalid UTF-8, and integers of 19+ digits (orjson turns those
  past 64 bits into floats; the check that spots them also fires on long digit runs in
  strings, which only costs the slow path).
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import re
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from trace_lib.errors import UserInputError

MiB = 1 << 20
_CHUNK = 1 * MiB
_BOM = b"\xef\xbb\xbf"


@dataclass
class IngestLimits:
    """Bounds on what one import may read. Override for tests or unusually large files."""

    max_record_bytes: int = 64 * MiB  # one JSONL line, or one record of a .json list
    max_document_bytes: int = 512 * MiB  # one whole-document file (parsed in memory)
    # DuckDB's memory during the import's one transaction. Without a limit DuckDB keeps
    # every uncommitted row in memory (~100 MiB per 100k trajectories); with it, it spills
    # them to a temporary file next to the store. Its indexes stay in memory (~31 MiB per
    # 100k trajectories), so an import of ~2M trajectories in one call needs more.
    store_memory_bytes: int = 768 * MiB


def human_size(n: int) -> str:
    if n >= MiB:
        return f"{n / MiB:.1f} MiB"
    return f"{n / 1024:.1f} KiB" if n >= 1024 else f"{n} bytes"


class RecordError(ValueError):
    """One record is bad. `field` is a path like `messages[3].role`."""

    def __init__(self, record: int, field: str | None, problem: str, line: int | None = None):
        self.record = record
        self.field = field
        self.problem = problem
        self.line = line
        where = f"record {record}" + (f" (line {line})" if line is not None else "")
        what = f"field '{field}': " if field else ""
        super().__init__(f"{where}: {what}{problem}")


@dataclass
class Source:
    """One input: a file on disk or uploaded bytes."""

    name: str
    path: Path | None = None
    data: bytes | None = None

    @classmethod
    def from_path(cls, path: str | Path) -> Source:
        p = Path(path).expanduser()
        if not p.exists():
            if p.is_symlink():
                try:
                    p.resolve(strict=True)
                except RuntimeError:  # Python 3.11 reports a loop this way
                    raise UserInputError(
                        f"{p}: symbolic link loop; expected a link that ends at a file"
                    ) from None
                except OSError as exc:
                    if "loop" in str(exc).lower() or getattr(exc, "errno", None) == 40:
                        raise UserInputError(
                            f"{p}: symbolic link loop; expected a link that ends at a file"
                        ) from None
                raise UserInputError(f"{p}: broken symbolic link (its target does not exist)")
            raise UserInputError(f"{p}: no such file")
        if p.is_dir():
            raise UserInputError(
                f"{p}: is a directory; expected a file. Pass the files inside it "
                f"(e.g. {p}/*.json) instead"
            )
        if not p.is_file():
            raise UserInputError(f"{p}: not a regular file")
        return cls(name=str(p), path=p)

    @property
    def origin(self) -> str:
        """Where the data came from, for `datasets.source`: an absolute path or an upload."""
        return str(self.path.resolve()) if self.path is not None else f"upload:{self.name}"

    @property
    def compressed(self) -> bool:
        return self.name.lower().endswith(".gz")

    @property
    def suffix(self) -> str:
        """The format suffix, under any `.gz` (`a.jsonl.gz` -> `.jsonl`)."""
        name = self.name[:-3] if self.compressed else self.name
        return Path(name).suffix.lower()

    @property
    def stem_name(self) -> str:
        """The file name without `.gz` (for names that carry meaning: `<model>-<domain>`)."""
        return self.name[:-3] if self.compressed else self.name

    def size(self) -> int:
        """Bytes on disk (compressed size for .gz): what progress counts."""
        if self.data is not None:
            return len(self.data)
        assert self.path is not None
        return self.path.stat().st_size

    def _raw(self) -> io.BufferedIOBase:
        if self.data is not None:
            return io.BytesIO(self.data)
        assert self.path is not None
        return open(self.path, "rb")

    def _open(self) -> io.BufferedIOBase:
        raw = self._raw()
        return gzip.GzipFile(fileobj=raw, mode="rb") if self.compressed else raw

    def head(self, n: int = _CHUNK) -> bytes:
        if self.data is not None and not self.compressed:
            return self.data[:n]
        with self._open() as fh:
            try:
                return fh.read(n)
            except (OSError, EOFError, zlib.error) as exc:
                raise self._gzip_error(exc) from None

    def _gzip_error(self, exc: BaseException) -> UserInputError:
        return UserInputError(
            f"{self.name}: not a readable gzip file ({exc}); expected gzip-compressed JSON or "
            f"JSONL (or drop the .gz suffix if the file is not compressed)"
        )

    def chunks(self, size: int = _CHUNK) -> Iterator[bytes]:
        """Decompressed content in chunks; progress counts compressed bytes on disk."""
        if self.data is not None and not self.compressed:
            for i in range(0, len(self.data), size):
                yield self.data[i : i + size]
            return
        with self._open() as fh:
            while True:
                try:
                    chunk = fh.read(size)
                except (OSError, EOFError, zlib.error) as exc:
                    raise self._gzip_error(exc) from None
                if not chunk:
                    break
                yield chunk


ProgressBytes = Callable[[int], None]  # called with the number of bytes just read


def check_not_empty(src: Source) -> None:
    head = src.head(64 * 1024)
    if not head.removeprefix(_BOM).strip():
        if src.size() == 0:
            raise UserInputError(f"{src.name}: empty file; expected JSON or JSONL trajectories")
        if src.size() <= len(head):
            raise UserInputError(
                f"{src.name}: only whitespace; expected JSON or JSONL trajectories"
            )


def _decode(src: Source, data: bytes, *, base_offset: int = 0, line: int | None = None) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        offset = base_offset + exc.start
        lineno = line if line is not None else data.count(b"\n", 0, exc.start) + 1
        raise UserInputError(
            f"{src.name}: not valid UTF-8 at byte {offset} (line {lineno}): byte "
            f"{data[exc.start : exc.start + 1]!r}; expected UTF-8 text (re-encode the file, "
            f"e.g. `iconv -f latin1 -t utf-8`)"
        ) from None


def looks_truncated(exc: json.JSONDecodeError) -> bool:
    """The text ends inside a value (cut off), as opposed to a bad character mid-way."""
    if exc.msg.startswith("Unterminated string"):
        return True  # the json scanner says this only when the text ends inside a string
    return exc.pos >= len(exc.doc.rstrip()) and exc.msg.startswith("Expecting")


class DocumentJSONError(UserInputError):
    """A whole-document file is not valid JSON; `extra_data` means it held several values
    (e.g. JSONL whose first line is too long to sniff)."""

    def __init__(self, message: str, extra_data: bool):
        super().__init__(message)
        self.extra_data = extra_data


def json_problem(exc: json.JSONDecodeError) -> str:
    """The decoder's message as words that end a sentence: "Unterminated string starting
    at" -> "unterminated string" (the position is given as line and column instead)."""
    msg = re.sub(r"\s+(starting )?at$", "", exc.msg.strip())
    return msg[:1].lower() + msg[1:]


def _json_error(src: Source, exc: json.JSONDecodeError, prefix: str = "") -> UserInputError:
    truncated = looks_truncated(exc)
    kind = "truncated JSON" if truncated else "malformed JSON"
    why = ("the file ends mid-document, so it is not valid JSON" if truncated
           else "the file is not valid JSON")
    return DocumentJSONError(
        f"{src.name}: {prefix}{kind} ({why}) at line {exc.lineno} column {exc.colno}: "
        f"{json_problem(exc)}.",
        extra_data=exc.msg.startswith("Extra data"),
    )


def read_document(
    src: Source, limits: IngestLimits, progress: ProgressBytes | None = None
) -> tuple[Any, str]:
    """Parse a whole-document JSON file; return (document, sha256 of the bytes)."""
    size = src.size()
    if size > limits.max_document_bytes:
        raise UserInputError(
            f"{src.name}: {human_size(size)} is over the {human_size(limits.max_document_bytes)} "
            f"limit for a whole-document JSON file (IngestLimits.max_document_bytes); split it "
            f"or convert it to JSONL"
        )
    parts: list[bytes] = []
    digest = hashlib.sha256()
    held = 0
    for chunk in src.chunks():
        digest.update(chunk)
        parts.append(chunk)
        held += len(chunk)
        if held > limits.max_document_bytes:  # a .gz expands past what its size said
            raise UserInputError(
                f"{src.name}: over the {human_size(limits.max_document_bytes)} limit for a "
                f"whole-document JSON file once decompressed (IngestLimits.max_document_bytes); "
                f"split it or convert it to JSONL"
            )
        if progress:
            progress(len(chunk))
    data = b"".join(parts)
    del parts
    check_record_sizes(src, data, limits)
    body = data[len(_BOM) :] if data.startswith(_BOM) else data
    text = _decode(src, body, base_offset=len(data) - len(body))
    if not text.strip():
        raise UserInputError(f"{src.name}: empty file; expected JSON or JSONL trajectories")
    return loads_checked(src, text), digest.hexdigest()


# A JSON string token (escapes included) or a bracket. Strings are matched whole so that
# brackets inside them are skipped; possessive quantifiers keep a 300 MB string linear.
_TOKENS = re.compile(rb'"(?:[^"\\]++|\\.)*+"|[\[\]{}]')
_QUOTE, _OPEN_LIST = ord('"'), ord("[")


def check_record_sizes(src: Source, data: bytes, limits: IngestLimits) -> None:
    """Refuse a whole-document file holding one record over `max_record_bytes`, before it is
    parsed (parsing a 300 MB record takes ~6x that in memory).

    A record is an object or list directly inside a list at depth 1 or 2: an element of a
    tau-bench list, a simulation (or task) of a tau2 results file, a history entry of a
    SWE-agent file. Only files over the limit are scanned, so small files cost nothing.
    """
    limit = limits.max_record_bytes
    if len(data) <= limit:
        return
    stack: list[list[int]] = []  # [opening byte, start offset, children so far]
    for m in _TOKENS.finditer(data):
        start = m.start()
        c = data[start]
        if c == _QUOTE:
            continue
        if c in b"[{":
            if stack:
                stack[-1][2] += 1
            stack.append([c, start, 0])
            continue
        if not stack:
            return  # unbalanced: json.loads reports it with a line and column
        opened = stack.pop()
        depth = len(stack) + 1
        if depth in (2, 3) and stack[-1][0] == _OPEN_LIST and m.end() - opened[1] > limit:
            index = stack[-1][2] - 1
            raise UserInputError(
                f"{src.name}: record {index} (bytes {opened[1]}-{m.end()}) is "
                f"{human_size(m.end() - opened[1])}, over the {human_size(limit)} record limit "
                f"(IngestLimits.max_record_bytes); expected records of a few MiB at most"
            )


def loads_checked(src: Source, text: str, where: str = "") -> Any:
    """`json.loads` whose every failure is a UserInputError naming the file (and `where`)."""
    try:
        return fast_loads(text)
    except json.JSONDecodeError as exc:
        raise _json_error(src, exc, where) from None
    except RecursionError:
        raise UserInputError(
            f"{src.name}: {where}JSON nested too deeply (over ~{_max_depth()} levels of "
            f"arrays/objects); expected trajectory records, which nest a few levels"
        ) from None
    except ValueError as exc:  # the 4300-digit int limit: "Exceeds the limit ..."
        raise UserInputError(
            f"{src.name}: {where}a number is too large to read ({exc}); expected ids and "
            f"counts that fit in 64 bits"
        ) from None


def _max_depth() -> int:
    import sys

    return sys.getrecursionlimit()


# 19 digits in a row, found as "0" * 19 once every digit reads "0": a translate and a
# substring search are ~10x cheaper than the regex `\d{19}` (which cost more than parsing).
_DIGITS_BYTES = bytes.maketrans(b"123456789", b"000000000")
_DIGITS_STR = str.maketrans("123456789", "000000000")
_LONG_RUN = "0" * 19
_LONG_RUN_BYTES = b"0" * 19


def fast_loads(raw: bytes | str, text: str | None = None) -> Any:
    """`json.loads(text)` (`text` the decoded `raw`, decoded here if not given), through
    orjson when it reads `raw` exactly as `json` would (see the module docstring)."""
    if isinstance(raw, bytes):
        long_int = _LONG_RUN_BYTES in raw.translate(_DIGITS_BYTES)
    else:
        long_int = _LONG_RUN in raw.translate(_DIGITS_STR)
    if not long_int:
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError:
            pass  # json.loads decides: it accepts NaN and surrogates, and words its errors
    if text is None:
        text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
    return json.loads(text)


@dataclass
class JsonlLine:
    """One non-blank JSONL line: `record` is its 0-based line index, `value` the parsed
    object, or `error` when the line could not be read."""

    record: int
    value: Any = None
    error: RecordError | None = None


def iter_jsonl(
    src: Source,
    limits: IngestLimits,
    digest: Any,
    progress: ProgressBytes | None = None,
) -> Iterator[JsonlLine]:
    """Stream a JSONL file line by line; `digest` (a hashlib object) sees every byte."""
    parts: list[bytes] = []
    held = 0  # bytes in `parts`
    oversize = 0  # > 0 while skipping past a line over the limit: its length so far
    index = 0
    offset = 0  # file offset of the current line's first byte
    first = True

    def finish(raw: bytes, line_offset: int) -> JsonlLine | None:
        nonlocal first
        if first:
            first = False
            raw = raw.removeprefix(_BOM)
        if not raw.strip():
            return None
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            return JsonlLine(
                index,
                error=RecordError(
                    index,
                    None,
                    f"not valid UTF-8 at byte {line_offset + exc.start} of the file: byte "
                    f"{raw[exc.start : exc.start + 1]!r}; expected UTF-8 text",
                    line=index + 1,
                ),
            )
        try:
            return JsonlLine(index, value=fast_loads(raw, text))
        except RecursionError:
            return JsonlLine(
                index,
                error=RecordError(
                    index,
                    None,
                    f"JSON nested too deeply (over ~{_max_depth()} levels); expected one "
                    f"trajectory object per line",
                    line=index + 1,
                ),
            )
        except json.JSONDecodeError as exc:
            kind = "truncated JSON" if looks_truncated(exc) else "malformed JSON"
            return JsonlLine(
                index,
                error=RecordError(
                    index,
                    None,
                    f"{kind} at column {exc.colno}: {json_problem(exc)}; expected one JSON object "
                    "per line",
                    line=index + 1,
                ),
            )
        except ValueError as exc:  # an integer over the 4300-digit conversion limit
            return JsonlLine(
                index,
                error=RecordError(
                    index,
                    None,
                    f"a number is too large to read ({exc}); expected ids and counts that "
                    f"fit in 64 bits",
                    line=index + 1,
                ),
            )

    def too_big(length: int) -> JsonlLine:
        return JsonlLine(
            index,
            error=RecordError(
                index,
                None,
                f"line of {human_size(length)} is over the {human_size(limits.max_record_bytes)} "
                f"record limit (IngestLimits.max_record_bytes); expected one trajectory per line",
                line=index + 1,
            ),
        )

    for chunk in src.chunks():
        digest.update(chunk)
        if progress:
            progress(len(chunk))
        start = 0
        while True:
            nl = chunk.find(b"\n", start)
            piece = chunk[start:] if nl < 0 else chunk[start:nl]
            if oversize:
                oversize += len(piece)
            else:
                parts.append(piece)
                held += len(piece)
                if held > limits.max_record_bytes:
                    oversize, parts, held = held, [], 0
            if nl < 0:
                break
            line_len = oversize or held
            if oversize:
                yield too_big(oversize)
            else:
                out = finish(b"".join(parts), offset)
                if out is not None:
                    yield out
            offset += line_len + 1
            parts, held, oversize = [], 0, 0
            index += 1
            start = nl + 1
    if oversize:
        yield too_big(oversize)
    elif parts:
        out = finish(b"".join(parts), offset)
        if out is not None:
            yield out


def env_path(name: str) -> Path | None:
    value = os.environ.get(name)
    return Path(value).expanduser() if value else None
