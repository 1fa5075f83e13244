"""Pydantic models of the records the workbench moves around.

Design decisions
- One normalised trajectory shape for every source format: OpenAI-style chat messages
  (`role` in system/user/assistant/tool), tool calls with arguments as a dict, and the
  tool's error text on the call it answers. Importers map their format onto it; nothing
  downstream knows which benchmark a trajectory came from except through `meta`.
- `success` is tri-state: True, False, or None (unknown, e.g. a SWE-agent run without a
  success file). Rankings only count known outcomes. `outcome` names the four cases:
  success | failure | unknown | error, where `error` is a run the harness crashed on
  (connection reset, parse error): not the agent's failure, so `success` stays None and
  it is left out of success rates and rankings. `outcome` is derived from `success` when
  not given, and the two can never disagree.
- A trajectory's identity is the hash of its content (`content_sha256`), so importing
  the same file twice inserts nothing the second time; `id` is a short prefix of it.
- Label values are a closed set; a labeler that could not decide records an error on
  the pair instead of a silent `na`.
- A message may carry what the source measured about it (`Message.meta`, issue 34): the
  tokens in and out, the cost and the latency of the model call that produced it, under
  the names of `MESSAGE_META_KEYS`, only those the source has. It describes the run, not
  what the agent said: it is not part of the content hash.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Literal

from pydantic import BaseModel, Field, model_validator

Role = Literal["system", "user", "assistant", "tool"]
LabelValue = Literal["present", "lacking", "na"]
LABEL_VALUES: tuple[str, ...] = ("present", "lacking", "na")
CapabilitySource = Literal["builtin", "llm", "user"]
CapabilityStatus = Literal["proposed", "accepted", "rejected"]
Outcome = Literal["success", "failure", "unknown", "error"]
OUTCOMES: tuple[str, ...] = ("success", "failure", "unknown", "error")


# What a message's `meta` may hold: tokens the model read and wrote for it, its cost (the
# source's currency, USD for tau2 and Inspect) and the seconds it took.
MESSAGE_META_KEYS: tuple[str, ...] = ("input_tokens", "output_tokens", "cost", "latency_s")


def outcome_of(success: bool | None) -> str:
    return "unknown" if success is None else ("success" if success else "failure")


class ToolCall(BaseModel):
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    call_id: str | None = None
    requestor: str | None = None  # tau2: "assistant" or "user"
    error: str | None = None  # the tool's error text, from the message that answers it


class Message(BaseModel):
    role: Role
    content: str | None = None
    tool_calls: list[ToolCall] = Field(default_factory=list)
    tool_call_id: str | None = None  # on role=tool: which call this answers
    name: str | None = None  # on role=tool: the tool's name
    turn_idx: int | None = None
    meta: dict[str, int | float] | None = None  # MESSAGE_META_KEYS the source measured


class ExpectedAction(BaseModel):
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    requestor: str | None = None  # tau2: "assistant" or "user"; None: the agent's


class ToolSchema(BaseModel):
    domain: str
    name: str
    schema_: dict[str, Any] = Field(alias="schema")  # OpenAI function-tool JSON
    source: Literal["given", "inferred", "domain"] = "given"

    model_config = {"populate_by_name": True}


class Trajectory(BaseModel):
    source_id: str | None = None  # the id in the imported file, if it has one
    task_id: str | None = None
    trial: int | None = None
    agent_model: str | None = None
    domain: str | None = None
    reward: float | None = None
    success: bool | None = None
    outcome: Outcome | None = None  # derived from `success` when not given
    termination: str | None = None
    messages: list[Message]
    meta: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _outcome_matches_success(self) -> Trajectory:
        derived = outcome_of(self.success)
        if self.outcome is None:
            self.outcome = derived  # type: ignore[assignment]
        elif self.outcome == "error":
            if self.success is not None:
                raise ValueError("outcome 'error' (a crashed run) cannot have success set")
        elif self.outcome != derived:
            raise ValueError(f"outcome {self.outcome!r} disagrees with success={self.success}")
        return self

    def content_sha256(self) -> str:
        """Hash of what makes this trajectory this one (not where it was imported from)."""
        payload = {
            "task_id": self.task_id,
            "trial": self.trial,
            "agent_model": self.agent_model,
            "domain": self.domain,
            "reward": self.reward,
            "success": self.success,
            "messages": [m.model_dump(exclude_none=True) for m in self.messages],
            "source_id": self.source_id,
        }
        blob = json.dumps(payload, sort_keys=True, ensure_ascii=False, default=str)
        return hashlib.sha256(blob.encode("utf-8")).hexdigest()

    @staticmethod
    def id_from_sha(sha: str) -> str:
        return "t_" + sha[:16]

    @property
    def n_tool_calls(self) -> int:
        return sum(len(m.tool_calls) for m in self.messages)


class Capability(BaseModel):
    name: str = Field(pattern=r"^[a-z][a-z0-9_]*$")
    description: str
    applies_when: str | None = None
    source: CapabilitySource = "builtin"
    status: CapabilityStatus = "proposed"
    examples: list[str] = Field(default_factory=list)


class Label(BaseModel):
    run_id: str
    trajectory_id: str
    capability: str
    value: LabelValue | None
    evidence: list[dict[str, Any]] = Field(default_factory=list)  # [{"message_idx", "text"}]
    confidence: float | None = None
    error: str | None = None  # set when the labeler failed on this pair
