"""The schema as a list of forward migrations, and the label views they define.

Design decisions
- The schema is a list of forward migrations. `schema_version` holds the applied
  version; opening an older file migrates it in one transaction (`connection` does the
  opening and refuses a file newer than this code). Never edit a released migration:
  append a new one.
- A view that a later migration redefines over another source is written once, as a
  function of its source table: `majority_labels` and `effective_run_labels` first read
  `labels`, and from the label-run status migration on read `counted_labels` (finished
  runs only). Both migrations call the same function, so the two definitions cannot drift.
- `effective_labels` is a view so that a human edit re-ranks at once: the latest
  edit wins, else the majority over label runs (ties broken lacking > present > na,
  so that an uncertain capability stays visible rather than disappearing).
  `effective_run_labels` applies the same edits inside every run, which is what the
  per-run ranking reads.
- Heavy things (checkpoints, metric streams, routing arrays) are files in a run
  directory that a row points to, not blobs.
"""

from __future__ import annotations

import duckdb


def majority_labels_view(source: str) -> str:
    """`majority_labels` over `source`: per (trajectory, capability) the most voted value,
    ties broken lacking > present > na, with the number of runs and of runs agreeing."""
    return f"""CREATE OR REPLACE VIEW majority_labels AS
SELECT trajectory_id, capability, value, n_runs, n_agree
FROM (
    SELECT trajectory_id, capability, value,
           sum(n) OVER (PARTITION BY trajectory_id, capability) AS n_runs,
           n AS n_agree,
           row_number() OVER (
               PARTITION BY trajectory_id, capability
               ORDER BY n DESC,
                        CASE value WHEN 'lacking' THEN 0 WHEN 'present' THEN 1 ELSE 2 END
           ) AS rn
    FROM (
        SELECT trajectory_id, capability, value, count(*) AS n
        FROM {source} WHERE value IS NOT NULL
        GROUP BY ALL
    )
) WHERE rn = 1;
"""


def effective_run_labels_view(source: str) -> str:
    """`effective_run_labels` over `source`: every run's labels with the latest edit applied."""
    return f"""CREATE OR REPLACE VIEW effective_run_labels AS
SELECT l.run_id, l.trajectory_id, l.capability,
       coalesce(e.value, l.value) AS value,
       e.value IS NOT NULL AS edited
FROM {source} l
LEFT JOIN latest_label_edits e
  ON e.trajectory_id = l.trajectory_id AND e.capability = l.capability
WHERE l.value IS NOT NULL OR e.value IS NOT NULL;
"""


V1_BASE = """
CREATE TABLE IF NOT EXISTS datasets (
    id VARCHAR PRIMARY KEY,
    name VARCHAR NOT NULL,
    format VARCHAR NOT NULL,
    source VARCHAR,
    content_sha256 VARCHAR NOT NULL,
    n_records INTEGER,
    imported_at TIMESTAMP DEFAULT current_timestamp
);
CREATE TABLE IF NOT EXISTS trajectories (
    id VARCHAR PRIMARY KEY,
    dataset_id VARCHAR NOT NULL,
    source_id VARCHAR,
    task_id VARCHAR,
    trial INTEGER,
    agent_model VARCHAR,
    domain VARCHAR,
    reward DOUBLE,
    success BOOLEAN,
    termination VARCHAR,
    n_messages INTEGER,
    n_tool_calls INTEGER,
    n_tool_errors INTEGER,
    content_sha256 VARCHAR NOT NULL UNIQUE,
    meta JSON
);
CREATE TABLE IF NOT EXISTS messages (
    trajectory_id VARCHAR NOT NULL,
    idx INTEGER NOT NULL,
    role VARCHAR NOT NULL,
    content VARCHAR,
    tool_call_id VARCHAR,
    name VARCHAR,
    turn_idx INTEGER,
    PRIMARY KEY (trajectory_id, idx)
);
CREATE TABLE IF NOT EXISTS tool_calls (
    trajectory_id VARCHAR NOT NULL,
    message_idx INTEGER NOT NULL,
    call_idx INTEGER NOT NULL,
    call_id VARCHAR,
    name VARCHAR NOT NULL,
    arguments JSON,
    requestor VARCHAR,
    error VARCHAR,
    PRIMARY KEY (trajectory_id, message_idx, call_idx)
);
CREATE TABLE IF NOT EXISTS expected_actions (
    dataset_id VARCHAR NOT NULL,
    task_id VARCHAR NOT NULL,
    idx INTEGER NOT NULL,
    name VARCHAR NOT NULL,
    arguments JSON,
    PRIMARY KEY (dataset_id, task_id, idx)
);
CREATE TABLE IF NOT EXISTS tool_schemas (
    domain VARCHAR NOT NULL,
    name VARCHAR NOT NULL,
    schema JSON NOT NULL,
    source VARCHAR NOT NULL,
    PRIMARY KEY (domain, name)
);
CREATE TABLE IF NOT EXISTS embeddings (
    trajectory_id VARCHAR NOT NULL,
    model VARCHAR NOT NULL,
    text_sha256 VARCHAR NOT NULL,
    vector FLOAT[] NOT NULL,
    PRIMARY KEY (trajectory_id, model)
);
CREATE TABLE IF NOT EXISTS capabilities (
    name VARCHAR PRIMARY KEY,
    description VARCHAR NOT NULL,
    applies_when VARCHAR,
    source VARCHAR NOT NULL,
    status VARCHAR NOT NULL,
    examples JSON,
    created_at TIMESTAMP DEFAULT current_timestamp,
    updated_at TIMESTAMP DEFAULT current_timestamp
);
CREATE TABLE IF NOT EXISTS label_runs (
    id VARCHAR PRIMARY KEY,
    labeler VARCHAR NOT NULL,
    model VARCHAR,
    prompt_sha256 VARCHAR,
    params JSON,
    started_at TIMESTAMP DEFAULT current_timestamp,
    finished_at TIMESTAMP,
    cost JSON
);
CREATE TABLE IF NOT EXISTS labels (
    run_id VARCHAR NOT NULL,
    trajectory_id VARCHAR NOT NULL,
    capability VARCHAR NOT NULL,
    value VARCHAR,
    evidence JSON,
    confidence DOUBLE,
    error VARCHAR,
    PRIMARY KEY (run_id, trajectory_id, capability)
);
CREATE SEQUENCE IF NOT EXISTS label_edit_seq START 1;
CREATE TABLE IF NOT EXISTS label_edits (
    id BIGINT PRIMARY KEY DEFAULT nextval('label_edit_seq'),
    trajectory_id VARCHAR NOT NULL,
    capability VARCHAR NOT NULL,
    old VARCHAR,
    new VARCHAR NOT NULL,
    editor VARCHAR NOT NULL,
    note VARCHAR,
    edited_at TIMESTAMP DEFAULT current_timestamp
);
CREATE TABLE IF NOT EXISTS environments (
    id VARCHAR PRIMARY KEY,
    name VARCHAR NOT NULL,
    capability VARCHAR NOT NULL,
    domain VARCHAR NOT NULL,
    version INTEGER NOT NULL,
    source VARCHAR NOT NULL,
    code VARCHAR,
    code_sha256 VARCHAR,
    status VARCHAR NOT NULL,
    report JSON,
    created_at TIMESTAMP DEFAULT current_timestamp
);
CREATE TABLE IF NOT EXISTS jobs (
    id VARCHAR PRIMARY KEY,
    kind VARCHAR NOT NULL,
    spec JSON NOT NULL,
    backend VARCHAR NOT NULL,
    run_dir VARCHAR NOT NULL,
    external_id VARCHAR,
    status VARCHAR,
    created_at TIMESTAMP DEFAULT current_timestamp,
    finished_at TIMESTAMP
);
CREATE TABLE IF NOT EXISTS adapters (
    id VARCHAR PRIMARY KEY,
    capability VARCHAR NOT NULL,
    environment VARCHAR,
    job_id VARCHAR,
    path VARCHAR NOT NULL,
    base_model VARCHAR NOT NULL,
    metrics JSON,
    created_at TIMESTAMP DEFAULT current_timestamp
);
CREATE TABLE IF NOT EXISTS moe_models (
    id VARCHAR PRIMARY KEY,
    path VARCHAR NOT NULL,
    base_model VARCHAR NOT NULL,
    adapters JSON NOT NULL,
    mode VARCHAR NOT NULL,
    gate_params BIGINT,
    job_id VARCHAR,
    metrics JSON,
    created_at TIMESTAMP DEFAULT current_timestamp
);
CREATE TABLE IF NOT EXISTS routing_traces (
    id VARCHAR PRIMARY KEY,
    moe_id VARCHAR NOT NULL,
    path VARCHAR NOT NULL,
    source VARCHAR,
    n_tokens INTEGER,
    n_layers INTEGER,
    meta JSON,
    created_at TIMESTAMP DEFAULT current_timestamp
);

CREATE OR REPLACE VIEW latest_label_edits AS
SELECT trajectory_id, capability, new AS value, editor, note, edited_at, id AS edit_id
FROM (
    SELECT *, row_number() OVER (PARTITION BY trajectory_id, capability ORDER BY id DESC) AS rn
    FROM label_edits
) WHERE rn = 1;

""" + majority_labels_view("labels") + """

CREATE OR REPLACE VIEW effective_labels AS
SELECT coalesce(e.trajectory_id, m.trajectory_id) AS trajectory_id,
       coalesce(e.capability, m.capability) AS capability,
       coalesce(e.value, m.value) AS value,
       CASE WHEN e.value IS NOT NULL THEN 'edit' ELSE 'majority' END AS origin,
       m.n_runs, m.n_agree, e.editor, e.edited_at
FROM majority_labels m
FULL OUTER JOIN latest_label_edits e
  ON e.trajectory_id = m.trajectory_id AND e.capability = m.capability;

""" + effective_run_labels_view("labels")

# V2 (diagnose): undo of a label edit is itself an appended row (`undoes` = the edit it
# reverts); the latest edit ignores undo rows and undone edits, so undo falls back to
# the previous edit or to the majority over runs.
V2_LABEL_UNDO = """
ALTER TABLE label_edits ADD COLUMN undoes BIGINT;
CREATE OR REPLACE VIEW latest_label_edits AS
SELECT trajectory_id, capability, new AS value, editor, note, edited_at, id AS edit_id
FROM (
    SELECT *, row_number() OVER (PARTITION BY trajectory_id, capability ORDER BY id DESC) AS rn
    FROM label_edits
    WHERE undoes IS NULL
      AND id NOT IN (SELECT undoes FROM label_edits WHERE undoes IS NOT NULL)
) WHERE rn = 1;
"""

# V3 (environments): every attempt of the environment generation agent, kept whether it
# was validated or rejected, with the code, its hash and the validation report.
V3_ENV_GENERATION = """
CREATE TABLE IF NOT EXISTS env_generation_attempts (
    generation_id VARCHAR NOT NULL,
    attempt INTEGER NOT NULL,
    env_name VARCHAR NOT NULL,
    capability VARCHAR NOT NULL,
    domain VARCHAR NOT NULL,
    generator VARCHAR NOT NULL,
    model VARCHAR,
    code VARCHAR,
    code_sha256 VARCHAR,
    status VARCHAR NOT NULL,
    report JSON,
    created_at TIMESTAMP DEFAULT current_timestamp,
    PRIMARY KEY (generation_id, attempt)
);
"""

# Ingest (issue 10): `trajectories.outcome` is success | failure | unknown | error. `error`
# is a run the harness crashed on (not the agent's failure): its `success` stays NULL, so
# every success rate and ranking that counts known outcomes leaves it out. Rows written
# before this column are filled from `success`. `expected_actions.requestor` says whose
# action it is (tau2: "assistant" or "user"); NULL means the agent's.
INGEST_OUTCOME_REQUESTOR = """
ALTER TABLE trajectories ADD COLUMN outcome VARCHAR;
UPDATE trajectories SET outcome = CASE WHEN success THEN 'success'
    WHEN NOT success THEN 'failure' ELSE 'unknown' END;
ALTER TABLE expected_actions ADD COLUMN requestor VARCHAR;
"""

# Diagnose (issue 16): a label run has a status, running | finished | failed, and the
# reason when it failed. Only finished runs count: the majority and per-run views leave
# out the labels of runs that are running (or were killed while running) or failed, so
# rank, the review queue and exports see finished runs only. A row inserted without a
# status (fixtures, importers that write a whole run at once) is finished; the labeler
# writes 'running' first. Runs from before this version without `finished_at` were
# interrupted: they become 'running' (resumable with `label --resume`).
LABEL_RUN_STATUS = """
ALTER TABLE label_runs ADD COLUMN status VARCHAR DEFAULT 'finished';
ALTER TABLE label_runs ADD COLUMN status_reason VARCHAR;
UPDATE label_runs SET status = CASE WHEN finished_at IS NULL THEN 'running' ELSE 'finished' END,
    status_reason = CASE WHEN finished_at IS NULL
        THEN 'no finish recorded (interrupted before run status existed)' END;
CREATE OR REPLACE VIEW counted_labels AS
SELECT * FROM labels
WHERE run_id NOT IN (SELECT id FROM label_runs WHERE coalesce(status, 'finished') <> 'finished');
""" + majority_labels_view("counted_labels") + effective_run_labels_view("counted_labels")

# Diagnose (issue 15): materialised labels. `label_pairs` holds, per (trajectory, capability),
# the votes of finished runs, their majority, the latest live edit and the effective value;
# `label_run_counts` and `label_pooled_counts` are the ranking's counts per scope key
# (dataset, agent model, domain, outcome). `label_materialised` records what they were
# built from (finished runs and their row counts, the edit watermark) so that any write,
# including one made with plain SQL, is noticed on the next read. They are kept by
# `trace_lib.diagnose.materialise`; the views above stay as the definition.
MATERIALISED_LABELS = """
CREATE TABLE IF NOT EXISTS label_pairs (
    trajectory_id VARCHAR NOT NULL,
    capability VARCHAR NOT NULL,
    n_rows INTEGER NOT NULL,
    nl INTEGER NOT NULL,
    np INTEGER NOT NULL,
    nn INTEGER NOT NULL,
    majority VARCHAR,
    edit_value VARCHAR,
    edit_id BIGINT,
    editor VARCHAR,
    edited_at TIMESTAMP,
    value VARCHAR
);
CREATE TABLE IF NOT EXISTS label_run_counts (
    run_id VARCHAR NOT NULL,
    capability VARCHAR NOT NULL,
    dataset_id VARCHAR,
    agent_model VARCHAR,
    domain VARCHAR,
    success BOOLEAN NOT NULL,
    value VARCHAR NOT NULL,
    n BIGINT NOT NULL
);
CREATE TABLE IF NOT EXISTS label_pooled_counts (
    capability VARCHAR NOT NULL,
    dataset_id VARCHAR,
    agent_model VARCHAR,
    domain VARCHAR,
    success BOOLEAN NOT NULL,
    value VARCHAR NOT NULL,
    n BIGINT NOT NULL
);
CREATE TABLE IF NOT EXISTS label_materialised (
    runs JSON NOT NULL,
    n_labels BIGINT NOT NULL,
    n_trajectories BIGINT NOT NULL,
    edit_max BIGINT NOT NULL,
    edit_count BIGINT NOT NULL
);
"""

# Explore (issue 15): per-trajectory columns derived at import (`trace_lib.store.derived`):
# distinct tool-error kinds, the failure-signature levels and the embedding text's hash.
# Created empty: rows of older stores are backfilled by their next import or by
# `explore reindex`; until every trajectory has its row, readers compute from raw tables.
EXPLORE_DERIVED = """
CREATE TABLE IF NOT EXISTS trajectory_derived (
    trajectory_id VARCHAR NOT NULL,
    error_kinds VARCHAR[] NOT NULL,
    error_tool VARCHAR NOT NULL,
    error_kind VARCHAR NOT NULL,
    deviation VARCHAR NOT NULL,
    text_sha256 VARCHAR NOT NULL
);
"""

# Diagnose (issue 31): what an LLM label rests on. `cut_messages` / `cut_tokens`: how much of
# the transcript the labeler's prompt left out to fit its model's context (0: nothing; NULL:
# a labeler that never cuts, e.g. the heuristic). `evidence_dropped`: evidence items that did
# not quote the message they named; `unsupported`: a lacking/present label left without
# verified evidence (NULL: a labeler that does not check evidence). `label_runs.notes`: how
# the run sized its prompts (the context and where it came from, what counted tokens).
LABEL_GROUNDS = """
ALTER TABLE labels ADD COLUMN cut_messages INTEGER;
ALTER TABLE labels ADD COLUMN cut_tokens INTEGER;
ALTER TABLE labels ADD COLUMN evidence_dropped INTEGER;
ALTER TABLE labels ADD COLUMN unsupported BOOLEAN;
ALTER TABLE label_runs ADD COLUMN notes VARCHAR;
"""

# Transcripts (issue 34): what the source measured of a message (`data_model.Message.meta`:
# tokens in and out, cost, latency of the model call behind it). NULL for messages imported
# before, and for formats that measure nothing.
MESSAGE_META = """
ALTER TABLE messages ADD COLUMN meta JSON;
"""

# Store check (issue 33): how many trajectories the imports of a dataset added (the import
# report's count, summed over re-imports that added rows), so `store check` compares each
# dataset's rows with what its imports reported. NULL for datasets imported before.
IMPORT_REPORTS = """
ALTER TABLE datasets ADD COLUMN n_trajectories INTEGER;
"""

# Rankings (issue 35): the threshold-independent parts of the Rankings view, stored
# (`trace_lib.store.rank_stored`, kept by `trace_lib.diagnose.rank_precompute` and
# `stability`). One `rank_stability` row per inputs (`key`: the counted runs, the scope,
# the requested method, B and seed) holds what `auto` resolved to and the store version it
# was computed for (`version`: a hash of `materialise.version`; a row of another version
# is never read); `rank_stability_counts` holds its per-resample counts (lf pf nf lp pp np
# per capability), from which Cov and Delta follow for any rho, delta and K.
# `rank_clusters` holds the failure clusters per (capabilities, scope) and version.
# Written when a label run finishes, for the Rankings page's default inputs, and by any
# ranking that had to compute them.
RANK_STABILITY = """
CREATE TABLE IF NOT EXISTS rank_stability (
    key VARCHAR NOT NULL,
    version VARCHAR NOT NULL,
    method VARCHAR NOT NULL,
    reason VARCHAR NOT NULL,
    b INTEGER,
    seed INTEGER,
    capabilities VARCHAR[] NOT NULL,
    computed_at TIMESTAMP NOT NULL DEFAULT current_timestamp,
    compute_s DOUBLE NOT NULL
);
CREATE TABLE IF NOT EXISTS rank_stability_counts (
    key VARCHAR NOT NULL,
    resample INTEGER NOT NULL,
    capability VARCHAR NOT NULL,
    lf BIGINT NOT NULL,
    pf BIGINT NOT NULL,
    nf BIGINT NOT NULL,
    lp BIGINT NOT NULL,
    pp BIGINT NOT NULL,
    np BIGINT NOT NULL
);
CREATE TABLE IF NOT EXISTS rank_clusters (
    key VARCHAR NOT NULL,
    version VARCHAR NOT NULL,
    clusters JSON NOT NULL,
    computed_at TIMESTAMP NOT NULL DEFAULT current_timestamp,
    compute_s DOUBLE NOT NULL
);
"""

# Rankings (issue 35, part 2): what the Rankings view computes from its kept set, stored
# threshold-free so that every kept set reads it (`trace_lib.store.rank_stored`, kept by
# `trace_lib.diagnose.rank_precompute`). One row per scope (`key`) and store version: the
# failed trajectories' cover signatures (`ranking.CoverSignatures`: which capabilities
# each lacks and is labelled for, as bit sets, with counts), from which the greedy cover of
# any kept set follows, and per capability its export examples (`ranking.failed_examples`).
RANK_COVER = """
CREATE TABLE IF NOT EXISTS rank_cover (
    key VARCHAR NOT NULL,
    version VARCHAR NOT NULL,
    signatures JSON NOT NULL,
    examples JSON NOT NULL,
    computed_at TIMESTAMP NOT NULL DEFAULT current_timestamp,
    compute_s DOUBLE NOT NULL
);
"""

# Trajectories (issue 35, part 2): the Trajectories page's unfiltered view (filter options,
# overview frames, the first page of the listing), computed when trajectories are imported
# and stored (`trace_lib.store.explore_stored`, kept by `trace_lib.explore.overview_stored`).
# One row per frame: `data` is the frame as Parquet (dtypes kept), `version` the
# trajectories' fingerprint it was computed for (a row of another version is never read).
EXPLORE_STORED = """
CREATE TABLE IF NOT EXISTS explore_stored (
    key VARCHAR NOT NULL,
    version VARCHAR NOT NULL,
    frame VARCHAR NOT NULL,
    data BLOB NOT NULL,
    computed_at TIMESTAMP NOT NULL DEFAULT current_timestamp,
    compute_s DOUBLE NOT NULL
);
"""

# Labels (issue 35): `labels` loses its primary key (run_id, trajectory_id, capability).
# A label run writes 14 rows per trajectory, and DuckDB's ART index of that key cost more
# than the rows (bench/label_write.py, one run over 1M trajectories, chunked commits as a
# run makes them): 1,112 vs 55 MiB of file (the index was 65% of the 1M pages-bench
# store, 1.7 GiB -> 0.6 GiB) and 30.6 vs 15.6 CPU-s; and the keys one statement adds are
# held in memory until it commits (14M rows in one INSERT: 2.3 GiB; a 1 GiB limit fails
# it), so a 10M-trajectory run written in one statement would not fit this machine.
# `label_pairs` was already unkeyed. One row per pair and run is kept by the writers
# (`insert_labels` refuses a pair twice in a write; a run labels a trajectory once; a
# resume deletes what it relabels) and checked by `store check`. DuckDB cannot drop a
# key, so the table is rebuilt (ordered by run and trajectory, so a run's rows stay
# together for zone maps); the views over it bind by name and read the new table.
LABELS_UNKEYED = """
CREATE TABLE labels_unkeyed (
    run_id VARCHAR NOT NULL,
    trajectory_id VARCHAR NOT NULL,
    capability VARCHAR NOT NULL,
    value VARCHAR,
    evidence JSON,
    confidence DOUBLE,
    error VARCHAR,
    cut_messages INTEGER,
    cut_tokens INTEGER,
    evidence_dropped INTEGER,
    unsupported BOOLEAN
);
INSERT INTO labels_unkeyed
SELECT run_id, trajectory_id, capability, value, evidence, confidence, error, cut_messages,
       cut_tokens, evidence_dropped, unsupported
FROM labels ORDER BY run_id, trajectory_id, capability;
DROP TABLE labels;
ALTER TABLE labels_unkeyed RENAME TO labels;
"""

# Scale (issue 35): the bulk tables lose their keys, as `labels` did. An import is one
# transaction, and DuckDB keeps the keys of a transaction's new rows in memory until it
# commits: 2M trajectories' keys took 490 MiB (the content hash's UNIQUE 225, the messages'
# key 179, the id 87), so a 10M import ran out of the 768 MiB it may use. The writer keeps
# ids unique (`ingest.writer`, 16 bytes a trajectory) and `store check` finds repeats.
# Rows are copied in their order (rowid), so what was written together stays together.
BULK_TABLES_UNKEYED = """
CREATE TABLE trajectories_unkeyed (
    id VARCHAR NOT NULL,
    dataset_id VARCHAR NOT NULL,
    source_id VARCHAR,
    task_id VARCHAR,
    trial INTEGER,
    agent_model VARCHAR,
    domain VARCHAR,
    reward DOUBLE,
    success BOOLEAN,
    termination VARCHAR,
    n_messages INTEGER,
    n_tool_calls INTEGER,
    n_tool_errors INTEGER,
    content_sha256 VARCHAR NOT NULL,
    meta JSON,
    outcome VARCHAR
);
INSERT INTO trajectories_unkeyed
SELECT id, dataset_id, source_id, task_id, trial, agent_model, domain, reward, success,
       termination, n_messages, n_tool_calls, n_tool_errors, content_sha256, meta, outcome
FROM trajectories ORDER BY rowid;
DROP TABLE trajectories;
ALTER TABLE trajectories_unkeyed RENAME TO trajectories;
CREATE TABLE messages_unkeyed (
    trajectory_id VARCHAR NOT NULL,
    idx INTEGER NOT NULL,
    role VARCHAR NOT NULL,
    content VARCHAR,
    tool_call_id VARCHAR,
    name VARCHAR,
    turn_idx INTEGER,
    meta JSON
);
INSERT INTO messages_unkeyed
SELECT trajectory_id, idx, role, content, tool_call_id, name, turn_idx, meta
FROM messages ORDER BY rowid;
DROP TABLE messages;
ALTER TABLE messages_unkeyed RENAME TO messages;
CREATE TABLE tool_calls_unkeyed (
    trajectory_id VARCHAR NOT NULL,
    message_idx INTEGER NOT NULL,
    call_idx INTEGER NOT NULL,
    call_id VARCHAR,
    name VARCHAR NOT NULL,
    arguments JSON,
    requestor VARCHAR,
    error VARCHAR
);
INSERT INTO tool_calls_unkeyed
SELECT trajectory_id, message_idx, call_idx, call_id, name, arguments, requestor, error
FROM tool_calls ORDER BY rowid;
DROP TABLE tool_calls;
ALTER TABLE tool_calls_unkeyed RENAME TO tool_calls;
"""

# Append-only. Index i holds the SQL that brings a file from version i to i + 1.
MIGRATIONS: list[str] = [V1_BASE, V2_LABEL_UNDO, V3_ENV_GENERATION, INGEST_OUTCOME_REQUESTOR,
                         LABEL_RUN_STATUS, MATERIALISED_LABELS, EXPLORE_DERIVED, LABEL_GROUNDS,
                         MESSAGE_META, IMPORT_REPORTS, RANK_STABILITY, RANK_COVER,
                         EXPLORE_STORED, LABELS_UNKEYED, BULK_TABLES_UNKEYED]
SCHEMA_VERSION = len(MIGRATIONS)


def schema_version(con: duckdb.DuckDBPyConnection) -> int:
    """The version a store file is at (0 for a file with no migration applied)."""
    row = con.execute("SELECT max(version) FROM schema_version").fetchone()
    return int(row[0]) if row and row[0] is not None else 0


def current_version(con: duckdb.DuckDBPyConnection) -> int:
    """`schema_version`, creating the version table of a new file first."""
    con.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
    return schema_version(con)


def apply_from(con: duckdb.DuckDBPyConnection, current: int,
               target: int = SCHEMA_VERSION) -> None:
    """Bring a file at version `current` to `target` (this trace_lib's by default; an older
    one makes the store an older trace_lib wrote, for migration tests) in one
    transaction."""
    if current >= target:
        return
    con.execute("BEGIN TRANSACTION")
    try:
        for version in range(current, target):
            con.execute(MIGRATIONS[version])
            con.execute("INSERT INTO schema_version VALUES (?)", [version + 1])
        con.execute("COMMIT")
    except Exception:
        con.execute("ROLLBACK")
        raise


def table_counts(con: duckdb.DuckDBPyConnection) -> dict[str, int]:
    """Row counts of every base table (tests compare them around a refused import)."""
    names = [
        r[0]
        for r in con.execute(
            "SELECT table_name FROM information_schema.tables "
            "WHERE table_schema = 'main' AND table_type = 'BASE TABLE' ORDER BY 1"
        ).fetchall()
    ]
    return {n: int(con.execute(f'SELECT count(*) FROM "{n}"').fetchone()[0]) for n in names}
