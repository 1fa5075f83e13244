"""The labeler protocol: a trajectory and a capability menu in, one label per capability out.

Design decisions
- A labeler labels one whole trajectory per call, every requested capability at once
  (the LLM labelers make exactly one structured call; the heuristic reads the
  trajectory once). Per-pair calls would repeat the transcript for each capability.
- A pair the labeler could not decide is a `PairLabel` with `value=None` and an
  `error` string; the runner stores it as a failed pair, never as a silent `na`.
- Evidence is a list of `{"message_idx": int, "text": str}` so that the Labels page
  can highlight the message it points at. A labeler that checks its evidence against the
  transcript (the LLM labelers, `evidence_check`) says how many items it dropped and
  whether a judgment was left unsupported; one that does not leaves both None.
- A labeler that cut the transcript to fit its model's context says how much
  (`cut_messages`, `cut_tokens`, 0 when nothing was cut); None means it does not cut.
  Such a labeler may also have `notes` (a list of sentences: its context and what counted
  tokens), which the runner records on the label run.
- `seed` is the run's index; stochastic labelers vary their sampling by it so that N
  runs are N independent samples, and deterministic ones ignore it.
- A labeler that cannot reach its server raises `LabelerUnavailable` (from an optional
  `preflight()` before the first call, or from `label` on connection refused) instead of
  returning failed pairs: the runner then stops and marks the run failed.
- Registry values are "module:factory" strings imported on first use, so that listing
  labelers does not import an SDK.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from trace_lib.data_model import Capability
from trace_lib.llm import Usage
from trace_lib.llm.protocol import build_lazily
from trace_lib.registry import ENTRY_POINT_GROUPS, Registry
from trace_lib.transcript_model import Transcript


class LabelerUnavailable(RuntimeError):
    """The labeler cannot work at all (no server at its URL): the run stops at once."""


@dataclass
class PairLabel:
    capability: str
    value: str | None  # present | lacking | na; None when the labeler failed on the pair
    evidence: list[dict[str, Any]] = field(default_factory=list)
    confidence: float | None = None
    error: str | None = None
    unsupported: bool | None = None  # a lacking/present judgment with no verified evidence
    evidence_dropped: int | None = None  # evidence items that did not quote their message


@dataclass
class TrajectoryLabels:
    trajectory_id: str
    labels: list[PairLabel]
    usage: Usage = field(default_factory=Usage)
    cut_messages: int | None = None  # messages the prompt left out (None: never cuts)
    cut_tokens: int | None = None  # transcript tokens the prompt left out

    @property
    def cut(self) -> bool:
        return bool(self.cut_messages or self.cut_tokens)


@runtime_checkable
class Labeler(Protocol):
    name: str
    model: str | None
    concurrency: int  # how many trajectories the runner may label at once

    def prompt_sha256(self, capabilities: list[Capability]) -> str | None:
        """Hash of the fixed instructions (None for labelers without a prompt)."""
        ...

    def label(self, t: Transcript, capabilities: list[Capability], *, seed: int = 0,
              n_runs: int = 1) -> TrajectoryLabels:
        ...


# Built-ins, in-process registrations and the `trace_workbench.labelers` entry points.
LABELERS: Registry[Callable[..., Labeler]] = Registry(
    "labeler", group=ENTRY_POINT_GROUPS["labelers"], builtins={
        "heuristic": "trace_lib.diagnose.labelers.heuristic:HeuristicLabeler",
        "anthropic": "trace_lib.diagnose.labelers.llm:anthropic_labeler",
        "openai": "trace_lib.diagnose.labelers.llm:openai_labeler",
    })


def register_labeler(name: str, factory: Callable[..., Labeler]) -> None:
    LABELERS.register(name, factory, replace=True)


def get_labeler(name: str, **cfg: Any) -> Labeler:
    return build_lazily(LABELERS.get(name), cfg)
