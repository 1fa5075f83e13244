"""The one capability catalog: the built-in menu's names, descriptions and when each applies.

Design decisions
- One text per capability, read by every stage: diagnose seeds its `capabilities` table
  from it (labelers label against these descriptions) and the environments stage
  describes its built-in environments and generation requests with the same text, so a
  capability means the same thing from labeling to training.
- No store and no heavy imports: jobs, pages and the environment registry read it freely.
- The menu deliberately contains distractors (tone, fluency, format, hallucinated tools,
  upselling) that a sound ranking must not keep; `distractor=True` marks them, and no
  environment is built for them.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trace_lib.data_model import Capability


@dataclass(frozen=True)
class BuiltinCapability:
    name: str
    description: str
    applies_when: str
    distractor: bool = False  # in the menu on purpose; a sound ranking should not keep it


BUILTIN: tuple[BuiltinCapability, ...] = (
    BuiltinCapability(
        "structured_data_reasoning",
        "Reads nested records returned by tools correctly: picks the right field of the "
        "right item (payment method ids, item ids, flight segments, dates, prices) and "
        "carries the exact values into later calls and answers.",
        "A tool returned structured data (JSON with nested lists or objects) that later "
        "arguments or claims depend on."),
    BuiltinCapability(
        "multi_step_task_completion",
        "Carries a task with several required actions through to the end: performs every "
        "write the request needs, in a workable order, and does not stop or hand back "
        "while required actions are still pending.",
        "The task needs two or more state-changing actions, or one action after several "
        "look-ups."),
    BuiltinCapability(
        "precondition_verification",
        "Checks what the policy requires before acting: looks up the user, the order or "
        "the reservation and verifies eligibility (status, dates, membership, ownership) "
        "before any state-changing call, and refuses when a precondition fails.",
        "The agent performs, or is asked to perform, a state-changing action governed by "
        "policy conditions."),
    BuiltinCapability(
        "tool_calling_precision",
        "Calls the right tool with the right arguments: correct tool names, argument "
        "names, types and values, no redundant or malformed calls, and recovers cleanly "
        "when a call returns an error.",
        "The agent makes tool calls."),
    BuiltinCapability(
        "adversarial_policy_compliance",
        "Holds to the policy when the user pushes against it: refuses out-of-policy "
        "requests, is not talked into exceptions by pressure, false claims or repeated "
        "asking, and does not reveal or bend rules.",
        "The user asks for something the policy forbids or misstates facts to get it."),
    BuiltinCapability(
        "information_gathering",
        "Asks for the information a task needs and only that: identifies what is missing "
        "(ids, choices, confirmations), asks for it clearly, and confirms the user's "
        "explicit consent before consequential actions.",
        "The request is under-specified, or the policy requires explicit confirmation."),
    BuiltinCapability(
        "numeric_calculation",
        "Computes amounts correctly: refunds, price differences, totals, compensation and "
        "fees, using the calculator tool or careful arithmetic on the exact values.",
        "The answer or an action argument depends on arithmetic over retrieved values."),
    BuiltinCapability(
        "error_recovery",
        "Recovers from failed tool calls and dead ends: reads the error, corrects the "
        "call or the plan, and does not loop on the same failing action.",
        "A tool call returned an error or an empty result."),
    BuiltinCapability(
        "escalation_judgment",
        "Transfers to a human exactly when the policy says so (out-of-scope requests, "
        "explicit user demand) and not as a way to avoid a task it could complete.",
        "A transfer to a human was made, requested, or required by policy."),
    BuiltinCapability(
        "tone_empathy",
        "Responds with a warm, empathetic and professional tone.",
        "Any user-facing reply.", distractor=True),
    BuiltinCapability(
        "language_fluency",
        "Writes grammatical, fluent, natural-sounding text.",
        "Any user-facing reply.", distractor=True),
    BuiltinCapability(
        "format_compliance",
        "Formats replies as requested (lists, markdown, length limits).",
        "The user or the system asks for a specific output format.", distractor=True),
    BuiltinCapability(
        "hallucinated_tools",
        "Avoids calling tools that do not exist in the provided tool list.",
        "The agent makes tool calls.", distractor=True),
    BuiltinCapability(
        "upselling",
        "Proactively offers upgrades, insurance or additional products.",
        "A booking or purchase conversation.", distractor=True),
)
CORE = ("structured_data_reasoning", "multi_step_task_completion", "precondition_verification",
        "tool_calling_precision")
DISTRACTORS = tuple(b.name for b in BUILTIN if b.distractor)
BY_NAME: dict[str, BuiltinCapability] = {b.name: b for b in BUILTIN}


def description(name: str) -> str:
    """The catalog's description of a capability ("" for one outside the built-in menu)."""
    b = BY_NAME.get(name)
    return b.description if b else ""


def capability_block(caps: list[Capability]) -> str:
    """The fixed capability menu text shared by the LLM labeler prompts (cached block).
    Here, not in diagnose.capability_curation, so a label job builds prompts without the store."""
    lines = []
    for c in caps:
        lines.append(f"- {c.name}: {c.description}")
        if c.applies_when:
            lines.append(f"  Applies when: {c.applies_when}")
    return "\n".join(lines)


def prompt_sha256(*texts: str) -> str:
    return hashlib.sha256("\x00".join(texts).encode("utf-8")).hexdigest()
