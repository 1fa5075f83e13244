"""Importers: tau-bench, tau2-bench, OpenAI-messages JSONL, SWE-agent and Inspect AI logs.

Public API (the CLI, the Trajectories page and the notebooks call exactly these):
    ingest_paths(paths, *, db=None, fmt="auto", skip_invalid=False, success_file=None,
                 progress=False, limits=None, reward_range=None, require_outcome=False,
                 domain=None, agent_model=None, batch_size=10_000) -> IngestReport
    ingest_bytes(name, data, *, db=None, fmt="auto", skip_invalid=False, reward_range=None,
                 require_outcome=False, domain=None, agent_model=None) -> IngestReport
    store_stats(db=None) -> dict
    format_names() -> list[str]
Formats are registered in `formats.IMPORTERS` (one module each); see each module's
docstring for how its records map onto trace_lib.data_model.Trajectory.
"""

from trace_lib.ingest.formats import format_names
from trace_lib.ingest.pipeline import IngestReport, ingest_bytes, ingest_paths, store_stats
from trace_lib.ingest.source import IngestLimits

__all__ = [
    "IngestLimits",
    "IngestReport",
    "format_names",
    "ingest_bytes",
    "ingest_paths",
    "store_stats",
]
