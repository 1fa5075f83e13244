"""The labeler's two prompt messages: the shared instructions, and one fenced transcript.

    system = system_prompt(capabilities)                 # the same for every trajectory
    nonce = fence_nonce(run_key, t.id, [c.name for c in capabilities], seed, body)
    user = user_prompt(body, nonce=nonce, cut=fitted.cut)

Design decisions
- Shared parts first: the system message holds everything a run repeats (instructions,
  how the transcript is written, the capability definitions, the answer's format), so it
  is byte-identical across a run's requests and a prefix cache (vLLM's, Anthropic's
  `cache_control`) serves it. Nothing from a trajectory goes into it.
- Trajectory text is data. The user message puts the transcript between
  `<transcript-NONCE>` and `</transcript-NONCE>` lines; the text cannot close a fence it
  cannot know. The words around the fence say that nothing inside is an instruction,
  before the transcript and again after it. Everything taken from the trajectory, its id,
  domain and task id included, is inside the fence; outside is only the template's own
  text (`prompts/label_transcript.md`).
- The NONCE is keyed, not random: 16 hex digits of HMAC-SHA256 under the run's key
  (`fence_key`) of (trajectory id, capability names, seed), derived again with a counter
  in the unlikely case the transcript contains it. The key is drawn (`new_fence_key`, 256
  bits from `secrets`) once per label run after its trajectories were written, and kept
  with the run's settings (the label run's params, a label job's spec), so the text
  cannot know it and cannot forge the fence, while each request of a run still gets its
  own tag (ids differ; runs differ by seed). A random tag per request would do as well
  against injection but makes two runs at the same settings send different bytes, so a
  deterministic model answers differently and a local run and a Ray run of one job can
  never be compared label for label (42 of 112 rows differed for that reason). Runs
  given the same key (a person's `fence_key`, or the stored one on `--resume`) send
  byte-identical prompts. A key reused for trajectories written after it was shown (it
  is in the run's params) would let their text aim at it: pass a key to reproduce a run,
  not as a constant.
- Inside, the rendering (`transcript_prompt`) keeps every message's continuation lines
  prefixed, so the text cannot forge another message's header either.
- Templates are filled in one pass: the transcript is spliced in last, so text in it that
  looks like a placeholder (`{nonce}`) stays as written.
"""

from __future__ import annotations

import hashlib
import hmac
import json
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


def new_fence_key() -> str:
    """A run's fence key: 256 random bits as hex (drawn once per label run)."""
    return secrets.token_hex(32)


def fence_nonce(key: str, trajectory_id: str, capabilities: list[str], seed: int,
                body: str) -> str:
    """The fence tag of one request: HMAC-SHA256 under `key` of (trajectory id, capability
    names, seed), NONCE_HEX hex digits; the first of the tags derived with a counter that
    does not occur in `body` (any case)."""
    lowered = body.lower()
    message = json.dumps([trajectory_id, list(capabilities), int(seed)])
    attempt = 0
    while True:
        digest = hmac.new(key.encode("utf-8"), f"{message}\n{attempt}".encode(),
                          hashlib.sha256).hexdigest()
        if digest[:NONCE_HEX] not in lowered:
            return digest[:NONCE_HEX]
        attempt += 1


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
