"""Policies that play an environment, and the one episode loop they share.

    summary = run_episode(env, seed, make_policy("reference"))

Design decisions
- A policy sees what an agent would: the conversation so far (OpenAI chat messages with
  tool calls and tool results) and the tool schemas; it returns ONE action in the
  protocol's shape. The reference policy alone also reads `env.reference_action()`,
  which is how an environment exposes the solution it was built with.
- The trivial baselines that validation requires are policies too: `null` replies at
  once with nothing, `random` makes 1-4 schema-valid calls with arguments drawn from the
  schema types and from tokens of the request (so ids sometimes hit), then replies with
  nothing. Loophole probes (validation requires mean reward <= 0.05 for each): `refuse`
  (refuse at once), `echo` (repeat the request), `stuffing` (every word of the policy and
  request plus refusal phrases), `read_refuse` (one random read tool, then refuse).
  `epsilon:P` follows the reference but takes a random action with probability
  P per step (a tunable stand-in for a learning policy when calibrating offline).
- `openai:MODEL@URL` (or a bare http URL) drives any OpenAI-compatible server through
  the chat API with tools: vLLM, the project's CPU policy server, or a hosted endpoint.
  The API key comes from OPENAI_API_KEY only.
- The loop is deliberately simple (no hint injection, no token accounting): the GRPO
  rollout loop lives in `trace_lib.train`; this one serves validation and calibration.
"""

from __future__ import annotations

import json
import os
import random
import re
from dataclasses import dataclass, field
from typing import Any, Protocol

from trace_lib.envs.protocol import Environment
from trace_lib.errors import UserInputError


class Policy(Protocol):
    name: str

    def act(self, env: Environment, conversation: list[dict[str, Any]]) -> dict[str, Any]:
        """The next action: {"name", "arguments"} or {"content"}."""
        ...


@dataclass
class ReferencePolicy:
    name: str = "reference"

    def act(self, env: Environment, conversation: list[dict[str, Any]]) -> dict[str, Any]:
        action = getattr(env, "reference_action", lambda: None)()
        return action if action is not None else {"content": ""}


@dataclass
class NullPolicy:
    name: str = "null"

    def act(self, env: Environment, conversation: list[dict[str, Any]]) -> dict[str, Any]:
        return {"content": ""}


def _random_value(schema: dict[str, Any], rng: random.Random, tokens: list[str], defs: dict,
                  depth: int = 0) -> Any:
    if "$ref" in schema:
        schema = defs.get(schema["$ref"].split("/")[-1], {})
    if "anyOf" in schema:
        return _random_value(rng.choice(schema["anyOf"]), rng, tokens, defs, depth)
    if "enum" in schema:
        return rng.choice(schema["enum"])
    kind = schema.get("type")
    if kind == "integer":
        return rng.randint(0, 5)
    if kind == "number":
        return round(rng.uniform(0, 500), 2)
    if kind == "boolean":
        return rng.random() < 0.5
    if kind == "array":
        if depth > 2:
            return []
        return [_random_value(schema.get("items", {}), rng, tokens, defs, depth + 1)
                for _ in range(rng.randint(1, 2))]
    if kind == "object":
        props = schema.get("properties", {})
        return {k: _random_value(v, rng, tokens, defs, depth + 1) for k, v in props.items()}
    if tokens and rng.random() < 0.6:
        return rng.choice(tokens)
    return "".join(rng.choice("ABCDEFGHJKLMNPQRSTUVWXYZ0123456789") for _ in range(6))


@dataclass
class RandomPolicy:
    """Schema-valid random calls, then an empty reply: the 'random valid calls' baseline."""

    seed: int = 0
    name: str = "random"
    _rng: random.Random = field(default_factory=random.Random, repr=False)
    _budget: int = 0

    def begin(self, seed: int) -> None:
        self._rng = random.Random(f"random-policy:{self.seed}:{seed}")
        self._budget = self._rng.randint(1, 4)

    def act(self, env: Environment, conversation: list[dict[str, Any]]) -> dict[str, Any]:
        if self._budget <= 0:
            return {"content": ""}
        self._budget -= 1
        schema = self._rng.choice(env.tool_schemas)["function"]
        params = schema.get("parameters", {})
        request = " ".join(str(m.get("content") or "") for m in conversation
                           if m.get("role") == "user")
        tokens = sorted(set(re.findall(r"[A-Za-z0-9_]{4,}", request)))
        args = {k: _random_value(v, self._rng, tokens, params.get("$defs", {}))
                for k, v in params.get("properties", {}).items()}
        return {"name": schema["name"], "arguments": args}


REFUSAL_TEXT = ("I'm sorry, but I cannot do that: it is not allowed by the policy, so I am "
                "unable to help and it is not possible. Unfortunately this is not eligible.")


def _request_text(conversation: list[dict[str, Any]]) -> str:
    return " ".join(str(m.get("content") or "") for m in conversation if m.get("role") == "user")


@dataclass
class RefusePolicy:
    """Loophole probe: refuse at once, no reads, every generic refusal phrase."""

    name: str = "refuse"

    def act(self, env: Environment, conversation: list[dict[str, Any]]) -> dict[str, Any]:
        return {"content": REFUSAL_TEXT}


@dataclass
class EchoPolicy:
    """Loophole probe: reply with the user's request (every id and amount it names)."""

    name: str = "echo"

    def act(self, env: Environment, conversation: list[dict[str, Any]]) -> dict[str, Any]:
        return {"content": _request_text(conversation)}


@dataclass
class KeywordStuffingPolicy:
    """Loophole probe: one reply holding every word of the policy, the request and refusals."""

    name: str = "stuffing"

    def act(self, env: Environment, conversation: list[dict[str, Any]]) -> dict[str, Any]:
        words = re.findall(r"[\w$#.'-]+", f"{env.system_prompt} {_request_text(conversation)}")
        seen = dict.fromkeys(w for w in words)  # unique, first-seen order
        return {"content": f"{REFUSAL_TEXT} {' '.join(seen)}"}


@dataclass
class ReadThenRefusePolicy:
    """Loophole probe: one random read tool with random arguments, then refuse."""

    seed: int = 0
    name: str = "read_refuse"
    _rng: random.Random = field(default_factory=random.Random, repr=False)
    _called: bool = False

    def begin(self, seed: int) -> None:
        self._rng = random.Random(f"read-refuse:{self.seed}:{seed}")
        self._called = False

    def act(self, env: Environment, conversation: list[dict[str, Any]]) -> dict[str, Any]:
        if self._called:
            return {"content": REFUSAL_TEXT}
        self._called = True
        if hasattr(env, "write_tool_names"):
            writes = set(env.write_tool_names())
            reads = [t["function"] for t in env.tool_schemas
                     if t["function"]["name"] not in writes]
        else:  # a sandboxed module: read tools by their conventional names
            reads = [t["function"] for t in env.tool_schemas
                     if t["function"]["name"].startswith(("get_", "find_", "search_", "list_"))]
        if not reads:
            return {"content": REFUSAL_TEXT}
        fn = self._rng.choice(reads)
        params = fn.get("parameters", {})
        args = {k: _random_value(v, self._rng, [], params.get("$defs", {}))
                for k, v in params.get("properties", {}).items()}
        return {"name": fn["name"], "arguments": args}


# The loophole probes validation runs on every environment (mean reward must stay <= 0.05).
TRIVIAL_POLICIES: tuple[str, ...] = ("refuse", "echo", "stuffing", "read_refuse")


@dataclass
class EpsilonPolicy:
    """The reference policy with a random action instead, with probability `epsilon`."""

    epsilon: float = 0.3
    seed: int = 0
    name: str = "epsilon"
    _rng: random.Random = field(default_factory=random.Random, repr=False)
    _random: RandomPolicy = field(default_factory=RandomPolicy, repr=False)

    def begin(self, seed: int) -> None:
        self._rng = random.Random(f"epsilon:{self.seed}:{seed}")
        self._random.begin(self._rng.randrange(1 << 30))
        self._random._budget = 10**6

    def act(self, env: Environment, conversation: list[dict[str, Any]]) -> dict[str, Any]:
        if self._rng.random() < self.epsilon:
            return self._random.act(env, conversation)
        return ReferencePolicy().act(env, conversation)


@dataclass
class OpenAIChatPolicy:
    """Any OpenAI-compatible chat server with tool calling."""

    model: str
    base_url: str
    temperature: float = 1.0
    max_tokens: int = 512
    name: str = "openai"
    _client: Any = field(default=None, repr=False)

    def _get_client(self) -> Any:
        if self._client is None:
            from openai import OpenAI

            self._client = OpenAI(base_url=self.base_url,
                                  api_key=os.environ.get("OPENAI_API_KEY") or "not-needed",
                                  timeout=120.0, max_retries=1)
        return self._client

    def act(self, env: Environment, conversation: list[dict[str, Any]]) -> dict[str, Any]:
        resp = self._get_client().chat.completions.create(
            model=self.model, messages=conversation, tools=env.tool_schemas,
            temperature=self.temperature, max_tokens=self.max_tokens,
        )
        msg = resp.choices[0].message
        if msg.tool_calls:
            tc = msg.tool_calls[0]  # one action per step; the loop asks again
            try:
                args = json.loads(tc.function.arguments or "{}")
            except json.JSONDecodeError:
                args = tc.function.arguments
            return {"name": tc.function.name, "arguments": args, "id": tc.id}
        return {"content": msg.content or ""}


def make_policy(spec: str, seed: int = 0) -> Policy:
    """reference | null | random | refuse | echo | stuffing | read_refuse | epsilon:P |
    openai:MODEL@URL | http(s)://URL[#MODEL]."""
    if spec == "reference":
        return ReferencePolicy()
    if spec in ("null", "nothing"):
        return NullPolicy()
    if spec == "random":
        return RandomPolicy(seed=seed)
    if spec == "refuse":
        return RefusePolicy()
    if spec == "echo":
        return EchoPolicy()
    if spec == "stuffing":
        return KeywordStuffingPolicy()
    if spec == "read_refuse":
        return ReadThenRefusePolicy(seed=seed)
    if spec.startswith("epsilon:"):
        try:
            eps = float(spec.split(":", 1)[1])
        except ValueError as exc:
            raise UserInputError(f"--policy {spec!r}: expected epsilon:P with P in [0, 1]") from exc
        return EpsilonPolicy(epsilon=eps, seed=seed)
    if spec.startswith("openai:") and "@" in spec:
        model, url = spec[len("openai:"):].split("@", 1)
        return OpenAIChatPolicy(model=model, base_url=url)
    if spec.startswith(("http://", "https://")):
        url, _, model = spec.partition("#")
        return OpenAIChatPolicy(model=model or "policy", base_url=url)
    raise UserInputError(
        f"--policy {spec!r}: expected reference, null, random, refuse, echo, stuffing, "
        "read_refuse, epsilon:P, openai:MODEL@URL "
        "or an http(s) URL of an OpenAI-compatible server (URL#MODEL to name the model)"
    )


def run_episode(env: Environment, seed: int, policy: Policy, max_steps: int = 40) -> dict[str, Any]:
    """Reset `env` to `seed`, let `policy` act until done; return the env's summary."""
    env.reset(seed)
    if hasattr(policy, "begin"):
        policy.begin(seed)  # type: ignore[attr-defined]
    conversation = [dict(m) for m in env.messages]
    for i in range(max_steps):
        if env.done:
            break
        action = policy.act(env, conversation)
        if "name" in action:
            call_id = str(action.pop("id", None) or f"call_{i}")
            args = action.get("arguments", {})
            arg_text = args if isinstance(args, str) else json.dumps(args)
            conversation.append({"role": "assistant", "content": None, "tool_calls": [
                {"id": call_id, "type": "function",
                 "function": {"name": action["name"], "arguments": arg_text}}]})
            obs = env.step(action)
            conversation.append({"role": "tool", "tool_call_id": call_id, "content": obs})
        else:
            conversation.append({"role": "assistant", "content": action.get("content", "")})
            env.step({"content": action.get("content", "")})
    return env.summary()
