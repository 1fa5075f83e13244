"""Evidence checked against the transcript: an item must quote the message it points at.

    kept, dropped = check_evidence(t, items)
    unsupported = is_unsupported(value, kept)

Design decisions
- An evidence item `{message_idx, text}` is kept only if `message_idx` names a message of
  the trajectory and `text` occurs in that message once case and whitespace are
  normalised (casefolded, every run of whitespace one space, surrounding quotes and
  ellipses trimmed). What a message "says" is its text, and for a message that made calls
  each call as the prompt showed it (`name({...})`); for a tool message, also its tool's
  name. The prompt's continuation prefix (`  | `) is taken out of a quote that carried it.
- A quote shorter than `MIN_QUOTE` characters after normalising proves nothing (it occurs
  almost anywhere) and is dropped too.
- Dropped items are counted, not stored: the label keeps its verified evidence only.
- A `lacking` or `present` label left with no verified item is "unsupported": it stays a
  vote, is stored with `unsupported = true`, shown in the Labels grid, put first in the
  review queue, and counted per capability in the run's report. `na` needs no evidence.
- Pure functions over the shared transcript model: the job-side labelers use it and must
  not import the store.
"""

from __future__ import annotations

import re
from typing import Any

from trace_lib.diagnose.transcript_prompt import CONTINUATION, call_text, calls_by_message
from trace_lib.transcript_model import Transcript

MIN_QUOTE = 3
JUDGED = ("lacking", "present")
_TRIM = " \t\n\"'`“”‘’«»…."


def normalise(text: str) -> str:
    """Casefolded, whitespace runs as one space."""
    return " ".join(str(text).casefold().split())


def _quotes(text: str) -> set[str]:
    """The quote normalised, as written and without the prompt's continuation prefixes
    (a quote across lines may carry them; a table's ` | ` may be the message's own)."""
    raw = str(text)
    forms = {raw, raw.replace(CONTINUATION, "\n"),
             re.sub(r"\s\|\s", " ", raw.replace(CONTINUATION, "\n"))}
    out = set()
    for form in forms:
        form = form.strip(_TRIM)
        if form.endswith("..."):
            form = form[:-3]
        out.add(normalise(form.strip(_TRIM)))
    return out


def message_texts(t: Transcript) -> dict[int, str]:
    """Per message index, the normalised text evidence may quote from it."""
    calls = calls_by_message(t)
    out: dict[int, str] = {}
    for m in t.messages:
        idx = int(m["idx"])
        parts = [m.get("content") or ""]
        if m["role"] == "tool" and m.get("name"):
            parts.append(str(m["name"]))
        parts += [call_text(c) for c in calls.get(idx, [])]
        out[idx] = "\n".join(normalise(p) for p in parts)
    return out


def check_evidence(t: Transcript, items: list[dict[str, Any]],
                   texts: dict[int, str] | None = None) -> tuple[list[dict[str, Any]], int]:
    """(the items that quote the message they name, how many were dropped)."""
    texts = message_texts(t) if texts is None else texts
    kept = []
    for item in items:
        try:
            idx = int(item["message_idx"])
        except (KeyError, TypeError, ValueError):
            continue
        said = texts.get(idx)
        if said is not None and any(len(q) >= MIN_QUOTE and q in said
                                    for q in _quotes(item.get("text", ""))):
            kept.append(item)
    return kept, len(items) - len(kept)


def is_unsupported(value: str | None, kept: list[dict[str, Any]]) -> bool:
    """A judgment (lacking/present) with no verified evidence."""
    return value in JUDGED and not kept
