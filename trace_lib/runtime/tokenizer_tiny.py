"""An offline byte-level BPE tokenizer for the `tiny` test model, built from code.

Design decisions
- Byte-level BPE (GPT-2/SmolLM2 style): every string round-trips, no <unk>, no download.
  The merges are learnt by `tokenizers`' BPE trainer from a fixed corpus written here
  (the chat/tool-call convention, JSON tool-call shapes and the vocabulary of the built-in
  agent domains), so prompts and tool calls take a few tokens per word instead of one per
  byte, which keeps CPU rollouts and gradient steps on the tiny model short.
- Deterministic: the same corpus and settings give the same `tokenizer.json` byte for byte
  (a test checks it), so a cached `data/models/tiny` and a fresh build agree.
- Saved as a real Hugging Face folder (`tokenizer.json` + `tokenizer_config.json` with the
  shared `CHAT_TEMPLATE`), which transformers, peft, TRL and vLLM all load as a fast
  tokenizer. ChatML markers are special tokens; the Hermes tool markers are added tokens
  (single ids that survive `skip_special_tokens=True`).
"""

from __future__ import annotations

from pathlib import Path

from trace_lib.runtime.chat_format import (
    CHAT_TEMPLATE,
    END_OF_TEXT,
    IM_END,
    SPECIAL_TOKENS,
    TOOL_TOKENS,
    TOOLS_INSTRUCTIONS,
    TOOLS_PREAMBLE,
)

VOCAB_SIZE = 1024

# Words the built-in environments and tau-bench style domains use; repeated in JSON and
# prose shapes below so that the trainer learns merges for them.
_DOMAIN_WORDS = (
    "user user_id order order_id item item_id product reservation reservation_id flight "
    "flight_number passenger passengers payment payment_id method status cancel cancelled "
    "update exchange return refund address email name first_name last_name date origin "
    "destination cabin economy business basic baggage insurance membership gold silver "
    "price total amount balance gift_card credit_card paypal certificate pending delivered "
    "processed shipped account details get find search book modify transfer human agent "
    "policy confirm verify precondition error not found true false null list string number "
    "integer object array properties required description parameters function type arguments "
    "tool call response assistant system yes no please thank you the a to of and is for in "
    "with that this your I can help you have will be are on it order#W"
).split()


def _corpus() -> list[str]:
    lines = [TOOLS_PREAMBLE, TOOLS_INSTRUCTIONS]
    for i, word in enumerate(_DOMAIN_WORDS):
        nxt = _DOMAIN_WORDS[(i * 7 + 3) % len(_DOMAIN_WORDS)]
        lines.append(f'{{"name": "{word}", "arguments": {{"{nxt}": "{word}_{i % 10}"}}}}')
        lines.append(f'"{word}": {{"type": "string", "description": "The {word} of the {nxt}."}}')
        lines.append(f"Please {word} the {nxt} {i} for me. I can help you with the {word}.")
        lines.append(f"<tool_call>\n{{\"name\": \"get_{word}\", \"arguments\": {{}}}}\n"
                     f"</tool_call>\n<tool_response>\n{{\"{word}\": {i}}}\n</tool_response>")
    lines.extend(" ".join(str(n) for n in range(k, k + 20)) for k in range(0, 200, 20))
    return lines * 4  # repetition makes the frequent pairs clearly frequent


def build_tokenizer(vocab_size: int = VOCAB_SIZE):
    """A `tokenizers.Tokenizer` (byte-level BPE) with the ChatML and tool tokens."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in TOOL_TOKENS])
    return tok


def save_tiny_tokenizer(dest: Path, vocab_size: int = VOCAB_SIZE):
    """Write the tokenizer as a Hugging Face folder at `dest`; return the HF tokenizer."""
    from transformers import PreTrainedTokenizerFast

    hf = PreTrainedTokenizerFast(
        tokenizer_object=build_tokenizer(vocab_size),
        eos_token=IM_END,
        pad_token=END_OF_TEXT,
        additional_special_tokens=[t for t in SPECIAL_TOKENS if t not in (IM_END, END_OF_TEXT)],
        model_max_length=16384,
        clean_up_tokenization_spaces=False,
    )
    hf.chat_template = CHAT_TEMPLATE
    dest.mkdir(parents=True, exist_ok=True)
    hf.save_pretrained(str(dest))
    return hf
