"""LLM providers behind one small typed interface, shared by every stage.

Use it like this (the environment-generation stage does the same):

    from trace_lib.llm import get_provider
    llm = get_provider("anthropic")                    # key from ANTHROPIC_API_KEY
    llm = get_provider("openai", base_url="http://127.0.0.1:8000/v1", model="Qwen/Qwen3-8B")
    res = llm.complete_json(system, user, schema, temperature=0.0)
    res.data          # a dict that validates against `schema` (else MalformedOutputError)
    res.usage         # Usage(input_tokens, output_tokens, cache_read_tokens, ...)

Providers: `anthropic` (official SDK, forced tool use, prompt caching of the system
block, Message Batches), `openai` (any OpenAI-compatible server, JSON-schema response
format), `replay` (offline: answers recorded earlier by `RecordingProvider`).
"""

from trace_lib.llm.protocol import (
    PROVIDERS,
    JSONOptions,
    JSONResult,
    LLMError,
    LLMProvider,
    MalformedOutputError,
    Usage,
    get_provider,
    register_provider,
    validate_json,
)

__all__ = [
    "PROVIDERS",
    "JSONOptions",
    "JSONResult",
    "LLMError",
    "LLMProvider",
    "MalformedOutputError",
    "Usage",
    "get_provider",
    "register_provider",
    "validate_json",
]
