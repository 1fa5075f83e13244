"""Warnings a dependency emits while a file is read become the import report's notes.

    with third_party_warnings() as caught:
        ...read files with Inspect's reader...
    report.notes += caught.notes()

Design decisions
- A reader we call (Inspect's, pyarrow, pydantic, ...) may warn through the `logging`
  module (Inspect: "Could not find sandbox environment plugin for type 'k8s'" on a METR
  log) or through `warnings.warn`. Either way the text went to stderr, outside the
  report a user or a script reads, and in the middle of `--json` runs. Both are
  captured while the import runs and turned into notes that say where they came from.
- Only other packages' records are taken: a `trace_lib` logger's records are ours and
  keep their handlers. The capture is a handler on the root logger, taking WARNING and
  above, so Python's last-resort stderr handler stays silent. A third-party logger with
  handlers of its own keeps them: what it prints is its configuration, not rewritten.
- Notes are de-duplicated (a warning per sample becomes one note with a count) and cut
  to 300 characters: a note is a sentence, not a log.
- The capture is per call and restores everything on exit (handler, warning filters),
  also when the import fails; it is not thread-safe across concurrent imports in one
  process, which the store's single writer rules out anyway.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

MAX_NOTE_CHARS = 300


@dataclass
class CaughtWarnings:
    """What dependencies said during an import, in order of first appearance."""

    counts: Counter[tuple[str, str]] = field(default_factory=Counter)

    def add(self, source: str, message: str) -> None:
        text = " ".join(message.split())
        if len(text) > MAX_NOTE_CHARS:
            text = text[: MAX_NOTE_CHARS - 1] + "…"
        self.counts[(source, text)] += 1

    def notes(self) -> list[str]:
        out = []
        for (source, text), n in self.counts.items():
            times = f" ({n} times)" if n > 1 else ""
            out.append(f"{source} warned while reading{times}: {text}")
        return out


class _Collect(logging.Handler):
    def __init__(self, caught: CaughtWarnings) -> None:
        super().__init__(level=logging.WARNING)
        self.caught = caught

    def emit(self, record: logging.LogRecord) -> None:
        if record.name == "trace_lib" or record.name.startswith("trace_lib."):
            return
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a malformed log call must not fail the import
            message = str(record.msg)
        self.caught.add(record.name.split(".")[0], message)


@contextlib.contextmanager
def third_party_warnings() -> Iterator[CaughtWarnings]:
    """Capture dependencies' log warnings and `warnings.warn` calls while the block runs."""
    caught = CaughtWarnings()
    handler = _Collect(caught)
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        with warnings.catch_warnings(record=True) as recorded:
            warnings.simplefilter("always")
            yield caught
            for w in recorded:
                module = getattr(w, "filename", "") or ""
                if "/trace_lib/" in module:
                    continue
                caught.add(_package_of(module), f"{w.category.__name__}: {w.message}")
    finally:
        root.removeHandler(handler)


def _package_of(filename: str) -> str:
    """`.../site-packages/inspect_ai/log/_file.py` -> `inspect_ai`."""
    parts = filename.replace("\\", "/").split("/")
    if "site-packages" in parts:
        rest = parts[parts.index("site-packages") + 1:]
        if rest:
            return rest[0].removesuffix(".py")
    return parts[-1].removesuffix(".py") or "a dependency"
