"""The capability catalog: a built-in menu, user edits, and LLM proposals from contrast.

Design decisions
- The built-in menu's names and texts live in `trace_lib.capabilities` (the one catalog the
  environments stage reads too).
- A capability is a row in `capabilities` (name, description, applies_when, source,
  status). The built-in menu is seeded on first use with status `accepted`: it is
  vetted text, and it deliberately contains distractors (tone, fluency, format,
  hallucinated tools, upselling) that a sound ranking must NOT keep; accepting them
  for labeling is how that is tested, not a statement that they matter.
- Status changes and edits are ordinary updates; labels and edits are keyed by name,
  so renaming is not offered (add a new one and reject the old).
- Proposals come from contrastive pairs: a failed and a passed trial of the same task
  when both exist, else of the most similar task in the same domain (Jaccard overlap
  of expected tool names). The LLM sees only those pairs and the current menu, and
  proposes up to 10 new capabilities that land as `proposed` for a person to accept;
  names that already exist are skipped, never overwritten.
- Only `accepted` capabilities are labeled and selected by default; `rejected` ones
  keep their labels (history) but drop out of the ranking's selection.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trace_lib import store
from trace_lib.capabilities import (  # noqa: F401  (re-exported: the menu as before)
    BUILTIN,
    CORE,
    DISTRACTORS,
    BuiltinCapability,
    capability_block,
    prompt_sha256,
)
from trace_lib.data_model import Capability
from trace_lib.errors import UserInputError
from trace_lib.store import capabilities as store_capabilities
from trace_lib.store import trajectories as store_trajectories
from trace_lib.store.capabilities import (  # noqa: F401  (the catalog's reads, as before)
    capabilities_on,
    ensure_builtin,
)

NAME_RE = re.compile(r"^[a-z][a-z0-9_]{1,63}$")
PROMPTS = Path(__file__).resolve().parent.parent / "prompts"




# ----------------------------------------------------------------------------- CRUD

def list_capabilities(db: str | Path | None = None, *, status: str | None = None
                      ) -> list[Capability]:
    with store.connect(db) as con:
        ensure_builtin(con)
        return capabilities_on(con, status)


def _check_name(name: str) -> None:
    if not NAME_RE.match(name or ""):
        raise UserInputError(
            f"capability name {name!r}: expected snake_case (a-z, 0-9, _), 2-64 characters, "
            "starting with a letter")


def add_capability(db: str | Path | None, name: str, description: str, *,
                   applies_when: str | None = None, source: str = "user",
                   status: str = "accepted", examples: list[str] | None = None) -> Capability:
    _check_name(name)
    if not description or not description.strip():
        raise UserInputError(f"capability {name!r}: description: expected non-empty text")
    with store.connect(db) as con:
        ensure_builtin(con)
        if store_capabilities.exists(con, name):
            raise UserInputError(f"capability {name!r} already exists; edit it instead")
        store_capabilities.insert(con, name, description.strip(), applies_when=applies_when,
                                  source=source, status=status, examples=examples or [])
        return _get(con, name)


def _get(con: store.Connection, name: str) -> Capability:
    caps = [c for c in capabilities_on(con) if c.name == name]
    if not caps:
        known = ", ".join(c.name for c in capabilities_on(con))
        raise UserInputError(f"unknown capability {name!r}; known: {known}")
    return caps[0]


def set_status(db: str | Path | None, name: str, status: str) -> Capability:
    if status not in ("proposed", "accepted", "rejected"):
        raise UserInputError(f"status {status!r}: expected proposed, accepted or rejected")
    with store.connect(db) as con:
        ensure_builtin(con)
        _get(con, name)
        store_capabilities.set_status(con, name, status)
        return _get(con, name)


def update_capability(db: str | Path | None, name: str, *, description: str | None = None,
                      applies_when: str | None = None) -> Capability:
    with store.connect(db) as con:
        ensure_builtin(con)
        _get(con, name)
        if description is not None:
            if not description.strip():
                raise UserInputError(f"capability {name!r}: description: expected non-empty text")
            store_capabilities.set_description(con, name, description.strip())
        if applies_when is not None:
            store_capabilities.set_applies_when(con, name, applies_when)
        return _get(con, name)


# ------------------------------------------------------------------------ proposals

@dataclass
class ContrastPair:
    task_id: str
    failed_id: str
    passed_id: str
    same_task: bool


def contrastive_pairs(con: store.Connection, max_pairs: int = 8) -> list[ContrastPair]:
    """Failed vs passed trials of the same task, else of the most similar task."""
    rows = store_trajectories.known_outcomes_with_expected_tools(con)
    failed = [r for r in rows if r[3] is False]
    passed = [r for r in rows if r[3] is True]
    pairs: list[ContrastPair] = []
    used_passed: set[str] = set()
    for f in failed:
        same = [p for p in passed if p[1] == f[1] and p[0] not in used_passed]
        if same:
            pairs.append(ContrastPair(str(f[1]), f[0], same[0][0], True))
            used_passed.add(same[0][0])
    for f in failed:
        if len(pairs) >= max_pairs:
            break
        if any(p.failed_id == f[0] for p in pairs):
            continue
        fn = set(f[4] or [])
        cands = [p for p in passed if p[2] == f[2] and p[0] not in used_passed]
        if not cands:
            continue
        best = max(cands, key=lambda p: (len(fn & set(p[4] or [])) / max(1, len(fn | set(p[4] or []))),
                                         p[0]))
        pairs.append(ContrastPair(str(f[1]), f[0], best[0], False))
        used_passed.add(best[0])
    return pairs[:max_pairs]


PROPOSAL_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "capabilities": {
            "type": "array", "maxItems": 10,
            "items": {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "pattern": NAME_RE.pattern},
                    "description": {"type": "string", "minLength": 20},
                    "example_task_ids": {"type": "array", "items": {"type": "string"}},
                },
                "required": ["name", "description", "example_task_ids"],
                "additionalProperties": False,
            },
        },
    },
    "required": ["capabilities"],
    "additionalProperties": False,
}


def proposal_prompt(con: store.Connection, pairs: list[ContrastPair],
                    max_chars_per_transcript: int = 6000) -> tuple[str, str]:
    """(system, user) for the proposal call."""
    from trace_lib.diagnose.token_count import CharEstimate
    from trace_lib.diagnose.transcript_cut import fit_transcript
    from trace_lib.trajectories import load_transcript

    system = (PROMPTS / "propose_capabilities.md").read_text(encoding="utf-8")
    menu = capability_block([c for c in capabilities_on(con) if c.status != "rejected"])
    parts = [f"## Current capability menu\n{menu}\n"]
    for i, p in enumerate(pairs, 1):
        kind = "same task" if p.same_task else "similar task"
        parts.append(f"## Pair {i} ({kind}; failed task id {p.task_id})")
        for label, tid in (("FAILED", p.failed_id), ("PASSED", p.passed_id)):
            t = load_transcript(con, tid)
            parts.append(f"### {label} trajectory {tid} (task {t.task_id})\n"
                         # the labelers' cutting rule, at about max_chars characters
                         + fit_transcript(t, max_chars_per_transcript // 4,
                                          CharEstimate().count).text)
    return system, "\n\n".join(parts)


def propose_capabilities(db: str | Path | None, provider: Any, *, max_pairs: int = 8,
                         max_new: int = 10) -> list[Capability]:
    """Ask an LLM for up to `max_new` capabilities from contrastive pairs; store as proposed."""
    with store.connect(db) as con:
        ensure_builtin(con)
        pairs = contrastive_pairs(con, max_pairs)
        if not pairs:
            raise UserInputError("no contrastive pairs: the store needs both failed and passed "
                                 "trajectories with known outcomes")
        system, user = proposal_prompt(con, pairs)
    result = provider.complete_json(system, user, PROPOSAL_SCHEMA, schema_name="propose")
    added: list[Capability] = []
    with store.connect(db) as con:
        existing = {c.name for c in capabilities_on(con)}
        for item in result.data["capabilities"][:max_new]:
            if item["name"] in existing:
                continue
            store_capabilities.insert(con, item["name"], item["description"].strip(),
                                      applies_when=None, source="llm", status="proposed",
                                      examples=item["example_task_ids"])
            existing.add(item["name"])
            added.append(_get(con, item["name"]))
    return added
