"""Labelers: a Protocol and a registry. `get_labeler(name, **cfg)` builds one.

Built in: `heuristic` (offline, deterministic), `anthropic` and `openai` (one structured
LLM call per trajectory). Add one with `register_labeler(name, factory)`, or from your own
package with an entry point in the `trace_workbench.labelers` group (`trace_lib.registry`).
"""

from trace_lib.diagnose.labelers.protocol import (
    LABELERS,
    Labeler,
    LabelerUnavailable,
    PairLabel,
    TrajectoryLabels,
    get_labeler,
    register_labeler,
)

__all__ = ["LABELERS", "Labeler", "LabelerUnavailable", "PairLabel", "TrajectoryLabels", "get_labeler",
           "register_labeler"]
