"""Tool calls aligned: two runs against each other, or a run against its expected actions.

Design decisions
- Tool-call identity for alignment is `name + canonical JSON of the arguments`
  (`sort_keys`, compact separators), so key order never makes two equal calls differ.
- Alignment is difflib's LCS-style `SequenceMatcher` on those keys (autojunk off: a
  repeated `get_user_details` is signal, not junk). Inside a "replace" block a second
  pass on names alone pairs calls of the same tool as "args differ"; what is left is
  "only left" / "only right". Any two trials (of a task, or any two trajectories) and
  expected-vs-actual use the same function.
- Expected actions are compared side by side: the agent's expected actions with the
  agent's own calls (`requestor` assistant or unknown), the user's (tau2 telecom:
  `toggle_roaming`, ...) with the user simulator's calls. User-side rows carry the status
  with " (user)" (`only left (user)` = the user never made an expected action): a user
  miss is not the agent's deviation, and it is never hidden either.
- Plain words for alignment rows (`status_words`): against the expected actions a row is
  "missed" or "extra"; between two runs, "missed by B" / "extra in B". The row data keep
  the short statuses (`same | args differ | only left | only right`): the CLI's JSON and
  tests read those.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass

import pandas as pd

from trace_lib.transcript_model import Call, Transcript, canonical_json


@dataclass(frozen=True)
class AlignedRow:
    status: str  # same | args differ | only left | only right
    left: Call | None
    right: Call | None



def align_calls(left: list[Call], right: list[Call]) -> list[AlignedRow]:
    """Align two tool-call sequences (LCS on name+args, then names within replacements)."""
    rows: list[AlignedRow] = []
    sm = difflib.SequenceMatcher(None, [c.key for c in left], [c.key for c in right],
                                 autojunk=False)
    for op, i1, i2, j1, j2 in sm.get_opcodes():
        if op == "equal":
            rows += [AlignedRow("same", left[i1 + k], right[j1 + k]) for k in range(i2 - i1)]
        elif op == "delete":
            rows += [AlignedRow("only left", c, None) for c in left[i1:i2]]
        elif op == "insert":
            rows += [AlignedRow("only right", None, c) for c in right[j1:j2]]
        else:
            rows += _align_by_name(left[i1:i2], right[j1:j2])
    return rows


def _align_by_name(left: list[Call], right: list[Call]) -> list[AlignedRow]:
    rows: list[AlignedRow] = []
    sm = difflib.SequenceMatcher(None, [c.name for c in left], [c.name for c in right],
                                 autojunk=False)
    for op, i1, i2, j1, j2 in sm.get_opcodes():
        if op == "equal":
            rows += [AlignedRow("args differ", left[i1 + k], right[j1 + k])
                     for k in range(i2 - i1)]
        else:
            rows += [AlignedRow("only left", c, None) for c in left[i1:i2]]
            rows += [AlignedRow("only right", None, c) for c in right[j1:j2]]
    return rows


def expected_vs_actual(t: Transcript) -> list[AlignedRow]:
    """Expected actions (left) aligned with the calls of the same side (right): the agent's
    first, then the user's (their statuses end in " (user)")."""
    agent, user = t.expected_agent, t.expected_user
    rows = align_calls(agent, t.agent_calls())
    if user:
        rows += [AlignedRow(f"{r.status} (user)", r.left, r.right)
                 for r in align_calls(user, t.user_calls())]
    return rows


def alignment_frame(rows: list[AlignedRow], left: str = "left", right: str = "right"
                    ) -> pd.DataFrame:
    """The alignment as a table (what the CLI prints and `st.dataframe` shows)."""

    def cell(c: Call | None) -> str:
        if c is None:
            return ""
        text = f"{c.name}({canonical_json(c.arguments)})"
        return text + (f"  !! {c.error}" if c.error else "")

    return pd.DataFrame(
        [{"status": r.status, left: cell(r.left), right: cell(r.right)} for r in rows],
        columns=["status", left, right],
    )


def status_words(status: str, left: str = "left", right: str = "right", *,
                 against_expected: bool = False) -> str:
    """An alignment status in plain words. Against the expected actions: "missed" (expected,
    never made) and "extra" (made, not expected); between two runs, `left` and `right`
    name them: "missed by B" (only A made it), "extra in B" (A never made it)."""
    user = status.endswith(" (user)")
    base = status.removesuffix(" (user)")
    if against_expected:
        words = {"same": "as expected", "args differ": "right tool, other arguments",
                 "only left": "missed: expected, never made",
                 "only right": "extra: made, not expected"}
    else:
        words = {"same": "both made it", "args differ": "same tool, other arguments",
                 "only left": f"missed by {right} (only {left} made it)",
                 "only right": f"extra in {right} ({left} never made it)"}
    text = words.get(base, base)
    return text + (" — the user's action" if user else "")
