"""The one chat and tool-call convention: the chat template and the parser that inverts it.

Design decisions
- ChatML turns (`<|im_start|>role\\n...<|im_end|>\\n`) with Hermes-style tool calls, the
  convention of Qwen2.5 and NousResearch Hermes: tools are listed in the system turn inside
  `<tools></tools>`, a call is `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`
  inside the assistant turn, and tool results come back in a user turn inside
  `<tool_response></tool_response>`. SmolLM2 already speaks ChatML, and vLLM ships a parser
  for exactly this format (`--tool-call-parser hermes`), so the same model folder serves
  through our CPU server and through vLLM with the same tool calls.
- The template is Jinja (`CHAT_TEMPLATE`), written into every model folder we prepare
  (`tokenizer_config.json` / `chat_template.jinja`) and rendered here through transformers'
  own renderer, so a prompt rendered by `render_prompt`, by `tokenizer.apply_chat_template`
  and by vLLM is the same string.
- The assistant's sampled part (content, tool calls and the closing `<|im_end|>`) is wrapped
  in `{% generation %}` so `apply_chat_template(..., return_assistant_tokens_mask=True)`
  masks everything else (system, user and tool tokens) for a loss.
- `format_assistant` is the exact inverse of `parse_assistant` on well-formed calls: the
  template renders an assistant message as `format_assistant(content, tool_calls)`, so a
  parsed generation renders back to the text that was generated (when the model used the
  canonical spacing). Trainers should still keep the sampled token ids, never re-tokenise.
- Generated text is untrusted: a `<tool_call>` block whose body is not a JSON object with a
  string `name` and object `arguments` stays in the content as plain text; nothing raises.
  What small models actually write is accepted: compact JSON (`{"name":"x","arguments":{}}`),
  any surrounding whitespace, and the JSON-list form `<tool_call>[{...}, {...}]</tool_call>`
  (each element one call; a list with any bad element is kept as text, whole).
- Templates per model family live in `CHAT_TEMPLATES` (`chat_template_for`), a `Registry`
  like every other table of names: the model's own where it has one that speaks this
  tool convention (SmolLM2 and tiny use ChatML, so ours *is* their template plus the
  Hermes tool blocks), one registry for all of them.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

from trace_lib.errors import UserInputError
from trace_lib.registry import ENTRY_POINT_GROUPS, Registry

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
END_OF_TEXT = "<|endoftext|>"
TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
SPECIAL_TOKENS: tuple[str, ...] = (END_OF_TEXT, IM_START, IM_END)
# Added (not special) tokens: they survive `skip_special_tokens=True` decoding, which the
# parser needs, and give vLLM's hermes parser the single-token markers it looks for.
TOOL_TOKENS: tuple[str, ...] = (TOOL_CALL_OPEN, TOOL_CALL_CLOSE, "<tool_response>",
                                "</tool_response>", "<tools>", "</tools>")

TOOLS_PREAMBLE = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
TOOLS_INSTRUCTIONS = (
    "\n</tools>\n\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)

CHAT_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages and messages[0].role == 'system' %}"
    "{{- messages[0].content + '\\n\\n' }}"
    "{%- endif %}"
    "{{- " + json.dumps(TOOLS_PREAMBLE) + " }}"
    "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
    "{{- " + json.dumps(TOOLS_INSTRUCTIONS) + " + '<|im_end|>\\n' }}"
    "{%- elif messages and messages[0].role == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'system' and loop.first %}"
    "{%- elif message.role == 'user' or message.role == 'system' %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- elif message.role == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- generation %}"
    "{%- if message.content %}{{- message.content }}{%- endif %}"
    "{%- for tool_call in (message.tool_calls or []) %}"
    "{%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}"
    "{%- if message.content or not loop.first %}{{- '\\n' }}{%- endif %}"
    "{{- '<tool_call>\\n{\"name\": ' + (tool_call.name | tojson) + ', \"arguments\": ' }}"
    "{%- if tool_call.arguments is string %}{{- tool_call.arguments }}"
    "{%- else %}{{- tool_call.arguments | tojson }}{%- endif %}"
    "{{- '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>' }}"
    "{%- endgeneration %}"
    "{{- '\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}"
    "{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}"
    "{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

# One registry of chat templates by model family. SmolLM2-Instruct's own template is ChatML
# without tools; ours is that ChatML with Hermes tool blocks added, so it is the family's
# template for both. A template is named, never given as text ("module:CONSTANT": a string
# value of a registry is a target); a plugin names its template string in the
# `trace_workbench.chat_templates` entry-point group.
CHAT_TEMPLATES: Registry[str] = Registry(
    "chat template", group=ENTRY_POINT_GROUPS["chat_templates"], builtins={
        # ChatML + Hermes tools (Qwen2.5, Hermes, SmolLM2, tiny)
        "chatml": "trace_lib.runtime.chat_format:CHAT_TEMPLATE",
        "smollm2": "trace_lib.runtime.chat_format:CHAT_TEMPLATE",
        "tiny": "trace_lib.runtime.chat_format:CHAT_TEMPLATE",
        "qwen2": "trace_lib.runtime.chat_format:CHAT_TEMPLATE",
    })


def chat_template_for(family: str) -> str:
    """The chat template of a model family (see `CHAT_TEMPLATES`); unknown -> a clear error."""
    if family not in CHAT_TEMPLATES:
        raise UserInputError(f"no chat template for model family {family!r}; known: "
                             f"{', '.join(sorted(CHAT_TEMPLATES))}")
    return CHAT_TEMPLATES.get(family)


_BLOCK = re.compile(re.escape(TOOL_CALL_OPEN) + r"(.*?)" + re.escape(TOOL_CALL_CLOSE), re.DOTALL)
_ROLES = ("system", "user", "assistant", "tool")


@dataclass
class ParsedAssistant:
    """An assistant turn recovered from generated text, in OpenAI message shape."""

    content: str | None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    raw_text: str = ""
    malformed_calls: int = 0  # <tool_call> blocks kept as content because they did not parse

    def to_message(self) -> dict[str, Any]:
        msg: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            msg["tool_calls"] = self.tool_calls
        return msg


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


def _text(content: Any, where: str) -> str:
    """OpenAI content is a string or a list of parts; the template needs a string."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for i, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text":
                raise UserInputError(f"{where}.content[{i}]: only text parts are supported")
            parts.append(str(part.get("text", "")))
        return "".join(parts)
    raise UserInputError(f"{where}.content: expected a string or a list of text parts")


def normalize_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Check roles and flatten content so the template sees plain strings."""
    if not isinstance(messages, list) or not messages:
        raise UserInputError("messages: expected a non-empty list of chat messages")
    out = []
    for i, msg in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(msg, dict) or msg.get("role") not in _ROLES:
            raise UserInputError(f"{where}.role: expected one of {', '.join(_ROLES)}")
        norm = dict(msg)
        norm["content"] = _text(msg.get("content"), where)
        if msg["role"] == "assistant" and msg.get("tool_calls"):
            calls = []
            for j, call in enumerate(msg["tool_calls"]):
                fn = call.get("function", call) if isinstance(call, dict) else None
                if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                    raise UserInputError(f"{where}.tool_calls[{j}].function.name: expected a string")
                calls.append({**call, "function": {"name": fn["name"],
                                                   "arguments": fn.get("arguments", {})}})
            norm["tool_calls"] = calls
        out.append(norm)
    return out


def render_prompt(
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None = None,
    add_generation_prompt: bool = True,
    chat_template: str = CHAT_TEMPLATE,
) -> str:
    """The prompt text for `messages` (+ `tools`), exactly as apply_chat_template renders it."""
    from transformers.utils.chat_template_utils import render_jinja_template

    rendered, _ = render_jinja_template(
        conversations=[normalize_messages(messages)],
        tools=tools or None,
        chat_template=chat_template,
        add_generation_prompt=add_generation_prompt,
    )
    return rendered[0]


def format_tool_call(name: str, arguments: dict[str, Any] | str) -> str:
    args = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    return f"{TOOL_CALL_OPEN}\n{{\"name\": {json.dumps(name, ensure_ascii=False)}, " \
           f"\"arguments\": {args}}}\n{TOOL_CALL_CLOSE}"


def format_assistant(content: str | None, tool_calls: list[dict[str, Any]] | None = None) -> str:
    """The text a model generates for this assistant turn (without the closing <|im_end|>)."""
    text = content or ""
    for i, call in enumerate(tool_calls or []):
        fn = call.get("function", call)
        if text or i:
            text += "\n"
        text += format_tool_call(fn["name"], fn.get("arguments", {}))
    return text


def _one_call(obj: Any) -> tuple[str, dict[str, Any]] | None:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    args = obj.get("arguments", {})
    if isinstance(args, str):  # some models emit arguments as a JSON string
        try:
            args = json.loads(args) if args.strip() else {}
        except (json.JSONDecodeError, RecursionError):
            return None
    if not isinstance(args, dict):
        return None
    return obj["name"].strip(), args


def _parse_calls(body: str) -> list[tuple[str, dict[str, Any]]] | None:
    """One block's calls: a JSON object, or a JSON list of them (compact or spaced)."""
    try:
        obj = json.loads(body.strip())
    except (json.JSONDecodeError, RecursionError, ValueError):
        return None
    items = obj if isinstance(obj, list) else [obj]
    calls = [_one_call(item) for item in items]
    if not calls or any(c is None for c in calls):
        return None
    return [c for c in calls if c is not None]


def parse_assistant(text: str, parse_tools: bool = True) -> ParsedAssistant:
    """Split generated text into content and OpenAI `tool_calls`; never raises on bad output."""
    raw = text
    for stop in (IM_END, END_OF_TEXT):  # a decoded stop token is not content
        cut = text.find(stop)
        if cut >= 0:
            text = text[:cut]
    if not parse_tools:
        return ParsedAssistant(content=text, raw_text=raw)
    calls: list[dict[str, Any]] = []
    kept: list[str] = []
    malformed = 0
    pos = 0
    for match in _BLOCK.finditer(text):
        parsed = _parse_calls(match.group(1))
        if parsed is None:
            malformed += 1
            continue  # stays in the content below
        kept.append(text[pos:match.start()])
        pos = match.end()
        for name, args in parsed:
            calls.append({"id": new_call_id(), "type": "function",
                          "function": {"name": name,
                                       "arguments": json.dumps(args, ensure_ascii=False)}})
    kept.append(text[pos:])
    content = "".join(kept)
    if calls:
        content = content.strip()
    return ParsedAssistant(content=content or (None if calls else ""), tool_calls=calls,
                           raw_text=raw, malformed_calls=malformed)
