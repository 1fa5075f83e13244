"""How many tokens of transcript a labeler's request may carry: the model's context, less
the instructions, the answer and a margin.

    window = context_window(model, max_context=None, served=card, tokenizer=None)
    budget = window.budget(fixed_tokens, answer_tokens=None)

Design decisions
- The context comes from, in order: `--max-context N` (the person knows best); the
  served model's card in `/v1/models` (`max_model_len`, which vLLM and the project's
  policy server report; `context_length`/`context_window` of other servers); the
  documented window of a hosted family (Claude: 200k); else `DEFAULT_CONTEXT` (32k), and
  the run's notes say that it was assumed. Each source is named in the notes.
- Tokens are counted with the served model's tokenizer where it is on this machine
  (`token_count`), else estimated; the margin is 2% of the context with a tokenizer and
  10% with the estimate, plus a fixed allowance for the chat template's role tags.
- The answer's room is reserved: the labeler's `max_tokens` when set, else
  `ANSWER_BASE + ANSWER_PER_CAPABILITY` per capability (a value, a confidence and a short
  quote or two each), at most a quarter of the context and 4096; the request asks for
  exactly that, so prompt + answer never exceed the context (vLLM refuses such a request
  outright). One repair round is reserved too: it sends the invalid answer back with the
  validation error (`REPAIR_TEXT` tokens), and must fit as well.
- A context too small to hold the instructions, the answer and `MIN_TRANSCRIPT` tokens
  of transcript is the person's error, said before the first call (`UserInputError`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from trace_lib.diagnose.token_count import TokenCounter, local_counter
from trace_lib.errors import UserInputError

DEFAULT_CONTEXT = 32_768
DEFAULT_ANSWER = 4096  # the most a default answer reserves
ANSWER_BASE = 256
ANSWER_PER_CAPABILITY = 160
REPAIR_TEXT = 256  # the validation error and the request to answer again
KNOWN_CONTEXTS = {"claude-": 200_000}  # documented windows of hosted families, by prefix
CARD_FIELDS = ("max_model_len", "context_length", "context_window", "max_context_length")
CHAT_OVERHEAD = 64  # role tags and separators a chat template adds around two messages
MIN_TRANSCRIPT = 256


def card_context(card: dict[str, Any] | None) -> tuple[int, str] | None:
    """(context, field) from a `/v1/models` card, None when it reports none."""
    for name in CARD_FIELDS:
        value = (card or {}).get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value, name
    return None


@dataclass
class Budget:
    context: int
    answer_tokens: int
    fixed_tokens: int  # instructions and the prompt's own text around the transcript
    repair_tokens: int  # room for a repair round: the invalid answer and the error
    margin: int
    transcript_tokens: int  # what the transcript may take


@dataclass
class ContextWindow:
    context: int
    source: str  # where `context` came from, in words
    counter: TokenCounter
    notes: list[str] = field(default_factory=list)

    def budget(self, fixed_tokens: int, answer_tokens: int | None = None, *,
               n_capabilities: int = 1, repairs: int = 1) -> Budget:
        """The transcript's share of the window, given the prompt's fixed tokens."""
        answer = answer_tokens or min(DEFAULT_ANSWER, self.context // 4,
                                      ANSWER_BASE + ANSWER_PER_CAPABILITY * n_capabilities)
        repair = answer + REPAIR_TEXT if repairs > 0 else 0
        margin = CHAT_OVERHEAD + self.context * (2 if self.counter.exact else 10) // 100
        room = self.context - answer - repair - fixed_tokens - margin
        if room < MIN_TRANSCRIPT:
            raise UserInputError(
                f"context of {self.context} tokens ({self.source}) leaves {max(room, 0)} for "
                f"the transcript after the instructions ({fixed_tokens}), the answer "
                f"({answer}), a repair round ({repair}) and a margin ({margin}); at least "
                f"{MIN_TRANSCRIPT} are needed: raise --max-context (or serve the model with "
                "a longer context)")
        return Budget(self.context, answer, fixed_tokens, repair, margin, room)


def context_window(model: str | None, *, max_context: int | None = None,
                   served: dict[str, Any] | None = None, tokenizer: str | None = None
                   ) -> ContextWindow:
    """The labeler's context and token counter, with notes saying where each came from."""
    if max_context is not None and (isinstance(max_context, bool) or max_context < 1):
        raise UserInputError(f"--max-context {max_context}: expected a positive number of "
                             "tokens")
    from_card = card_context(served)
    if max_context is not None:
        context, source = int(max_context), "--max-context"
    elif from_card is not None:
        context, source = from_card[0], f"/v1/models {from_card[1]}"
    else:
        known = next((n for prefix, n in KNOWN_CONTEXTS.items()
                      if (model or "").startswith(prefix)), None)
        if known is not None:
            context, source = known, f"the documented window of {model}"
        else:
            context, source = DEFAULT_CONTEXT, ("assumed: the server reports no context "
                                                "length; set --max-context")
    counter, count_note = local_counter([tokenizer, (served or {}).get("root"), model])
    return ContextWindow(context, source, counter,
                         [f"context {context} tokens ({source})", count_note])
