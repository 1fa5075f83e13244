"""Use cases: the functions a person's action maps to, one module per stage.

Pages (`pages/`, `app.py`), CLI verbs (`trace_lib/cli/`) and notebook cells call these and
nothing else; a use case orchestrates the stage modules and the store, so the three front
ends cannot drift apart.

    data           import files, store stats, the demo data set, the pipeline counts
    explore        the Trajectories page's reads: filters, charts, clusters, transcripts
    diagnose       label, edit / undo a label, capabilities, rank and export
    environments   list, sample, play, validate, calibrate, generate, approve / reject;
                   the one name -> environment resolution and the "only approved
                   environments train" rule
    training       launch / cancel / record training jobs, list adapters; the one place a
                   training config is assembled
    composition    compose, train gates, route (one routing-source dispatch), moe-eval
    evaluation     evaluate policies on task sets, compare runs
    errors         `ActionError`: what a front end shows as a message, not a traceback

Design decisions
- Every use case takes `db` (a path, or None for `TRACE_DB`) and returns plain data or the
  stage's own result objects; none prints, none imports streamlit.
- Submodules are imported by name (`from trace_lib.workbench import training`), never
  eagerly here: a page that only lists environments must not import torch.
"""
