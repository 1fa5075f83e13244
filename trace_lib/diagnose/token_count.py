"""Counting a prompt's tokens: the served model's tokenizer where it is on this machine,
else an estimate of one token per four characters (and the run's notes say which).

Design decisions
- Only local files: a folder holding tokenizer files (what vLLM and the project's policy
  server report as the model's `root` in `/v1/models`, or `--tokenizer PATH`), or a hub id
  already in the local Hugging Face cache. Nothing is downloaded to count tokens, and a
  name that is neither (a hosted model such as `gpt-4.1` or a Claude model) costs no
  transformers import.
- The estimate is `ceil(characters / 4)`; the context budget keeps a larger margin when
  the count is an estimate (`context_budget`), because JSON, code and non-English text run
  to fewer characters per token.
- Counting goes through the fast tokenizer's backend (`encode(text).ids`, no special
  tokens): no "sequence longer than the model's maximum" warning for a transcript that is
  long on purpose. A lock serialises calls, since a labeler counts from its thread pool.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")
CHARS_PER_TOKEN = 4


class TokenCounter(Protocol):
    name: str  # what counts: a tokenizer's source, or "characters / 4"
    exact: bool

    def count(self, text: str) -> int:
        ...


@dataclass
class CharEstimate:
    """ceil(len / 4): the estimate used when no tokenizer is at hand."""

    name: str = f"characters / {CHARS_PER_TOKEN}"
    exact: bool = False

    def count(self, text: str) -> int:
        return -(-len(text) // CHARS_PER_TOKEN)


@dataclass
class TokenizerCount:
    """Tokens as a Hugging Face tokenizer counts them (no special tokens)."""

    tokenizer: Any
    name: str
    exact: bool = True
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def count(self, text: str) -> int:
        backend = getattr(self.tokenizer, "backend_tokenizer", None)
        with self._lock:
            if backend is not None:
                return len(backend.encode(text, add_special_tokens=False).ids)
            return len(self.tokenizer.encode(text, add_special_tokens=False, verbose=False))


def _cached_hub_id(name: str) -> bool:
    """True when `name` looks like a hub id whose tokenizer is in the local HF cache."""
    if name.count("/") != 1 or name.startswith(("/", ".", "~")):
        return False
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return False
    return any(isinstance(try_to_load_from_cache(name, f), str) for f in TOKENIZER_FILES)


def local_counter(candidates: list[Any]) -> tuple[TokenCounter, str]:
    """The first candidate that is a tokenizer on this machine, as a counter, and a note
    saying what counts; else the characters / 4 estimate and a note saying so."""
    tried: list[str] = []
    for c in candidates:
        if not isinstance(c, str) or not c or c in tried:
            continue
        tried.append(c)
        path = Path(c).expanduser()
        source: str | None = None
        if path.is_dir() and any((path / f).is_file() for f in TOKENIZER_FILES):
            source = str(path)
        elif _cached_hub_id(c):
            source = c
        if source is None:
            continue
        try:
            from transformers import AutoTokenizer

            tok = AutoTokenizer.from_pretrained(source, local_files_only=True)
        except (OSError, ValueError, ImportError):  # unreadable or partial files: next one
            continue
        return TokenizerCount(tok, source), f"tokens counted with the tokenizer at {source}"
    named = ", ".join(tried) or "the model"
    return CharEstimate(), (f"tokens estimated as characters / {CHARS_PER_TOKEN}: no "
                            f"tokenizer for {named} on this machine (--tokenizer PATH "
                            "counts exactly)")
