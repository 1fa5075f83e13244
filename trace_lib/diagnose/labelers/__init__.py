"""Labelers: a Protocol and a registry. `get_labeler(name, **cfg)` builds one.

Built in: `heuristic` (offline, deterministic), `anthropic` and `openai` (one structured
LLM call per trajectory). Add one with `register_labeler(name, factory)`.
"""

from trace_lib.diagnose.labelers.protocol import (
    LABELERS,
    Labeler,
    PairLabel,
    TrajectoryLabels,
    get_labeler,
    register_labeler,
)

__all__ = ["LABELERS", "Labeler", "PairLabel", "TrajectoryLabels", "get_labeler",
           "register_labeler"]
