"""What an importer is: the `Importer` protocol and the `ParseContext` it is handed.

Design decisions
- The contract lives apart from the registry of formats (`formats.py`), so an importer
  module imports only this, and `formats` names the importers as lazy "module:IMPORTER"
  strings: neither side imports the other at import time, and no module registers itself
  by being imported.
- An importer is a small object with a `name`, a one-line `description`, `matches(doc)`
  for whole-document detection, `why_not(doc)` for the detection error, and
  `parse(src, doc, sha256, ctx)`. A streaming importer (`streaming = True`) reads the
  source itself; the others get the document `formats` already parsed, so no file is
  parsed twice.
- `ParseContext` carries everything besides the file that changes how it is read (limits,
  the success map, the reward range, overrides), one object for every format, so adding
  an option never changes an importer's signature.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from trace_lib.ingest.normalise import DEFAULT_REWARD_RANGE, ParsedFile, SuccessMap
from trace_lib.ingest.source import IngestLimits, ProgressBytes, Source


@dataclass
class ParseContext:
    """What an importer needs besides the file."""

    limits: IngestLimits = field(default_factory=IngestLimits)
    skip_invalid: bool = False
    success: SuccessMap | None = None  # SWE-agent: instance id -> resolved
    progress: ProgressBytes | None = None
    reward_range: tuple[float, float] = DEFAULT_REWARD_RANGE
    require_outcome: bool = False  # OpenAI JSONL: refuse records without reward/success
    domain: str | None = None  # overrides what the file says or the name suggests
    agent_model: str | None = None


class Importer(Protocol):
    name: str
    description: str
    streaming: bool  # True: parse() reads the source itself (doc is None)

    def matches(self, doc: Any) -> bool:
        """Whether a parsed whole document has this format's shape."""
        ...

    def why_not(self, doc: Any) -> str:
        """Why `doc` does not have this format's shape (for the detection error)."""
        ...

    def parse(self, src: Source, doc: Any, sha256: str | None, ctx: ParseContext) -> ParsedFile:
        """Normalise the file. `doc`/`sha256` are given when detection already parsed it."""
        ...
