"""Importers: tau-bench, tau2-bench, OpenAI-messages JSONL and SWE-agent trajectories.

Public API (the CLI, the Trajectories page and the notebooks call exactly these):
    ingest_paths(paths, *, db=None, fmt="auto", skip_invalid=False, success_file=None,
                 progress=False) -> IngestReport
    ingest_bytes(name, data, *, db=None, fmt="auto", skip_invalid=False) -> IngestReport
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
