"""The labeler's two prompt messages: the shared instructions, and one fenced transcript.

    system = system_prompt(capabilities)                 # the same for every trajectory
    user = user_prompt(t, body, nonce=new_nonce(body), cut=fitted.cut)

Design decisions
- Shared parts first: the system message holds everything a run repeats (instructions,
  how the transcript is written, the capability definitions, the answer's format), so it
  is byte-identical across a run's requests and a prefix cache (vLLM's, Anthropic's
  `cache_control`) serves it. Nothing from a trajectory goes into it.
- Trajectory text is data. The user message puts the transcript between
  `<transcript-NONCE>` and `</transcript-NONCE>` lines, NONCE 16 hex digits drawn per
  request (`secrets`), and redrawn in the unlikely case the transcript contains it; the
  text cannot close a fence it cannot know. The words around the fence say that nothing
  inside is an instruction, before the transcript and again after it. Everything taken
  from the trajectory, its id, domain and task id included, is inside the fence; outside
  is only the template's own text (`prompts/label_transcript.md`).
- Inside, the rendering (`transcript_prompt`) keeps every message's continuation lines
  prefixed, so the text cannot forge another message's header either.
- Templates are filled in one pass: the transcript is spliced in last, so text in it that
  looks like a placeholder (`{nonce}`) stays as written.
"""

from __future__ import annotations

import secrets
from pathlib import Path

from trace_lib.capabilities import capability_block
from trace_lib.data_model import Capability
from trace_lib.diagnose.transcript_prompt import one_line
from trace_lib.transcript_model import Transcript

PROMPTS = Path(__file__).resolve().parent.parent / "prompts"
SYSTEM_TEMPLATE = "label_trajectory.md"
USER_TEMPLATE = "label_transcript.md"
NONCE_HEX = 16
CUT_NOTE = (" Parts of this transcript were left out to fit the context: each"
            " `[... N messages omitted ...]` line marks where.")


def _template(name: str) -> str:
    return (PROMPTS / name).read_text(encoding="utf-8")


def system_prompt(capabilities: list[Capability], template: str = SYSTEM_TEMPLATE) -> str:
    return _template(template).replace("{capabilities}", capability_block(capabilities))


def user_template() -> str:
    """The user message's fixed text (part of the prompt's hash)."""
    return _template(USER_TEMPLATE)


def fence(nonce: str) -> tuple[str, str]:
    """The opening and closing lines around a transcript."""
    return f"<transcript-{nonce}>", f"</transcript-{nonce}>"


def new_nonce(body: str) -> str:
    """A fresh random tag that does not occur in `body` (any case)."""
    lowered = body.lower()
    while True:
        nonce = secrets.token_hex(NONCE_HEX // 2)
        if nonce not in lowered:
            return nonce


def transcript_header(t: Transcript) -> str:
    """The trajectory's own header lines (inside the fence: they come from the data)."""
    return (f"trajectory: {one_line(t.id)}\ndomain: {one_line(t.domain or 'unknown')}\n"
            f"task: {one_line(t.task_id or 'unknown')}\n\n")


def user_prompt(body: str, *, nonce: str, cut: bool = False) -> str:
    """The user message: the template around `body` (header and rendered transcript)."""
    before, after = user_template().split("{transcript}")
    fill = {"{nonce}": nonce, "{cut_note}": CUT_NOTE if cut else ""}
    for key, value in fill.items():
        before, after = before.replace(key, value), after.replace(key, value)
    return before + body + after


def fixed_text(*, cut: bool = True) -> str:
    """The user message without a transcript (what the budget counts as fixed)."""
    return user_prompt("", nonce="0" * NONCE_HEX, cut=cut)
