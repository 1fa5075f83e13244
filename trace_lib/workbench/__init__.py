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
    training       the one place a training config is assembled; a foreground run; adapters
    models         base models (list, prepare) and the CPU policy server
    composition    compose, train gates here, route (one routing-source dispatch), moe-eval
    routing_demo   the routing demo: build it (here or as a job), find the last build
    evaluation     evaluate policies on task sets, compare runs
    jobs           every job kind: submit, record, the one sync (run directories -> store),
                   status, cancel, wait, list
    job_progress   a job's progress from its run directory: learning signal, phase, live
                   panel, gate movement (never the store)
    store_admin    the store itself: check (and repair), backup, restore, the app's
                   check on opening a store
    errors         `ActionError`: what a front end shows as a message, not a traceback

Design decisions
- Every use case takes `db` (a path, or None for `TRACE_DB`) and returns plain data or the
  stage's own result objects; none prints, none imports streamlit.
- Submodules are imported by name (`from trace_lib.workbench import training`), never
  eagerly here: a page that only lists environments must not import torch.
"""
