"""The cutting rule: a transcript shortened to fit a token budget, saying what it left out.

    fitted = fit_transcript(t, budget_tokens, counter.count)
    fitted.text, fitted.cut_messages, fitted.cut_tokens

Design decisions
- A transcript that fits is sent whole: nothing is clipped "just in case" (the old rule
  cut every transcript at 60,000 characters and every tool output at 2,000, whatever the
  model's context).
- One that does not fit is cut by a fixed, documented rule, in three parts:
    head    the task: the messages up to the first user message (the system prompt, a
            greeting, the request), if it comes within the first four messages, else the
            first message; each kept, clipped to a head of `head` characters;
    middle  every tool call kept as its call line and every tool result as the head of its
            text (`middle` characters; an assistant message that made calls keeps that
            much of its text too); every other message (user turns, assistant text
            without calls) is left out, and each run of left-out messages is one line
            `[... N messages omitted ...]`;
    tail    the last turns, whole (tool results clipped to `tail` characters), as many as
            fit: how a trajectory ends is what failure analysis needs most.
  The levels of `LEVELS` are tried from the mildest; at each the tail is as long as fits
  (a binary search: a longer tail never costs fewer tokens), and the first level whose
  tail holds `MIN_TAIL` messages wins. Past the last level the tail shrinks to what
  fits, then the oldest middle calls go too (counted in the marker), and as a last
  resort the text is cut inside (head and end kept, `[... transcript cut here ...]`):
  never a prompt the server would refuse.
- Tokens are counted with the caller's counter (the served model's tokenizer, or an
  estimate): each message's rendering once per shape, summed with one token per line
  break, then the chosen text counted exactly once; should that exceed the budget
  (tokenizers are not quite additive) the search runs again under a budget lowered by
  the excess.
- What was cut is reported, never hidden: `cut_messages` (messages left out entirely)
  and `cut_tokens` (tokens of the whole transcript minus those sent). The label row
  stores both, and the prompt tells the labeler where the gaps are.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from trace_lib.diagnose.transcript_prompt import calls_by_message, render_message
from trace_lib.transcript_model import Transcript

# (head characters per task message (None: whole), middle tool-result/call-text characters,
# tail tool-result characters), mildest first.
LEVELS: tuple[tuple[int | None, int, int], ...] = (
    (None, 2000, 2000), (4000, 800, 2000), (2000, 300, 1000), (1000, 100, 500),
    (500, 0, 300))
MIN_TAIL = 4  # the last turns a level must keep whole to be chosen
HEAD_WITHIN = 4  # the first user message counts as the task only among the first messages
LAST_RESORT = "[... transcript cut here ...]"


def omitted_marker(n: int) -> str:
    return f"[... {n} message{'s' if n != 1 else ''} omitted ...]"


@dataclass
class FittedTranscript:
    text: str
    total_tokens: int  # the whole transcript, uncut
    tokens: int  # what `text` holds
    cut_messages: int = 0  # messages left out entirely
    cut_tokens: int = 0  # total_tokens - tokens when anything was cut, else 0
    rule: str = "whole"  # which step of the rule produced `text`

    @property
    def cut(self) -> bool:
        return self.rule != "whole"


@dataclass(frozen=True)
class _Plan:
    head: int | None
    middle: int
    tail_chars: int
    tail: int  # messages in the tail
    dropped: int = 0  # oldest middle call/tool messages left out as well


class _Fitter:
    def __init__(self, t: Transcript, count: Callable[[str], int]) -> None:
        self.msgs = t.messages
        self.calls = calls_by_message(t)
        self.count = count
        self.n = len(self.msgs)
        first_user = next((i for i, m in enumerate(self.msgs) if m["role"] == "user"), None)
        self.n_head = (first_user + 1 if first_user is not None and first_user < HEAD_WITHIN
                       else min(1, self.n))
        self._tokens: dict[tuple[int, int | None], int] = {}
        self._texts: dict[tuple[int, int | None], str] = {}

    # A message's shape: its text clipped to n characters (None: whole), or left out (-1).
    def text(self, i: int, clip: int | None) -> str:
        key = (i, clip)
        if key not in self._texts:
            m = self.msgs[i]
            self._texts[key] = render_message(m, self.calls.get(int(m["idx"])),
                                              max_content=clip)
        return self._texts[key]

    def tokens(self, i: int, clip: int | None) -> int:
        key = (i, clip)
        if key not in self._tokens:
            self._tokens[key] = self.count(self.text(i, clip))
        return self._tokens[key]

    def is_call(self, i: int) -> bool:
        """A tool result, or a message that made calls: the middle keeps these."""
        m = self.msgs[i]
        return m["role"] == "tool" or bool(self.calls.get(int(m["idx"])))

    def shapes(self, p: _Plan) -> list[int | None]:
        """Per message: characters kept (None: whole) or -1 (left out)."""
        out: list[int | None] = []
        tail_from = self.n - p.tail
        dropped = 0
        for i, m in enumerate(self.msgs):
            if i < self.n_head:
                out.append(p.head)
            elif i >= tail_from:
                out.append(p.tail_chars if m["role"] == "tool" else None)
            elif self.is_call(i):
                if dropped < p.dropped:
                    dropped += 1
                    out.append(-1)
                else:
                    out.append(p.middle)
            else:
                out.append(-1)
        return out

    def lines(self, p: _Plan) -> tuple[list[str], int]:
        """The plan's lines and how many messages it leaves out."""
        lines, run, left_out = [], 0, 0
        for i, shape in enumerate(self.shapes(p)):
            if shape == -1:
                run += 1
                continue
            if run:
                lines.append(omitted_marker(run))
                left_out += run
                run = 0
            lines.append(self.text(i, shape))
        if run:
            lines.append(omitted_marker(run))
            left_out += run
        return lines, left_out

    def estimate(self, p: _Plan) -> int:
        total, run, n_lines = 0, 0, 0
        for i, shape in enumerate(self.shapes(p)):
            if shape == -1:
                run += 1
                continue
            if run:
                total += self.count(omitted_marker(run))
                n_lines += 1
                run = 0
            total += self.tokens(i, shape)
            n_lines += 1
        if run:
            total += self.count(omitted_marker(run))
            n_lines += 1
        return total + max(0, n_lines - 1)

    def longest_tail(self, head: int | None, middle: int, tail_chars: int, budget: int,
                     dropped: int = 0) -> int | None:
        """The longest tail that fits at this level, None if not even an empty one does."""
        rest = self.n - self.n_head

        def fits(k: int) -> bool:
            return self.estimate(_Plan(head, middle, tail_chars, k, dropped)) <= budget

        if not fits(0):
            return None
        lo, hi = 0, rest
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if fits(mid):
                lo = mid
            else:
                hi = mid - 1
        return lo

    def plan(self, budget: int) -> tuple[_Plan, str] | None:
        rest = self.n - self.n_head
        for level, (head, middle, tail_chars) in enumerate(LEVELS, 1):
            k = self.longest_tail(head, middle, tail_chars, budget)
            if k is not None and k >= min(MIN_TAIL, rest):
                return _Plan(head, middle, tail_chars, k), f"level {level}"
        head, middle, tail_chars = LEVELS[-1]
        k = self.longest_tail(head, middle, tail_chars, budget)
        if k is not None and (k >= 1 or rest == 0):
            return _Plan(head, middle, tail_chars, k), "last level, short tail"
        # Leave out the oldest middle calls too, as few as needed, with the last message kept.
        tail = min(1, rest)
        n_middle = sum(1 for i in range(self.n_head, self.n - tail) if self.is_call(i))

        def fits(dropped: int) -> bool:
            return self.estimate(_Plan(head, middle, tail_chars, tail, dropped)) <= budget

        if not fits(n_middle):
            return None
        lo, hi = 0, n_middle
        while lo < hi:
            mid = (lo + hi) // 2
            if fits(mid):
                hi = mid
            else:
                lo = mid + 1
        return _Plan(head, middle, tail_chars, tail, lo), "middle calls left out"


def fit_transcript(t: Transcript, budget: int, count: Callable[[str], int]
                   ) -> FittedTranscript:
    """`t` rendered to at most `budget` tokens by the rule above."""
    f = _Fitter(t, count)
    whole = "\n".join(f.text(i, None) for i in range(f.n))
    total = count(whole)
    if total <= budget:
        return FittedTranscript(whole, total, total)
    target = budget
    for _ in range(3):
        found = f.plan(target)
        if found is None:
            break
        p, rule = found
        lines, left_out = f.lines(p)
        text = "\n".join(lines)
        tokens = count(text)
        if tokens <= budget:
            return FittedTranscript(text, total, tokens, left_out, max(0, total - tokens), rule)
        target -= tokens - budget + 8  # not additive after all: search again, tighter
    return _last_resort(f, whole, total, budget)


def _last_resort(f: _Fitter, whole: str, total: int, budget: int) -> FittedTranscript:
    """The text cut inside: its first third and last two thirds of the characters that fit."""
    lo, hi = 0, len(whole)
    best = LAST_RESORT
    while lo < hi:
        mid = (lo + hi + 1) // 2
        head = mid // 3
        text = whole[:head] + "\n" + LAST_RESORT + "\n" + whole[len(whole) - (mid - head):]
        if f.count(text) <= budget:
            lo, best = mid, text
        else:
            hi = mid - 1
    tokens = f.count(best)
    shown = "\n" + best
    left_out = sum(1 for m in f.msgs if f"\n[{m['idx']}] " not in shown)
    return FittedTranscript(best, total, tokens, left_out, max(0, total - tokens), "cut inside")
