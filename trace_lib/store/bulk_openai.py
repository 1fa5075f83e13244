"""The OpenAI-messages import's DuckDB route: plainly valid JSONL lines parsed, hashed and
turned into trajectory / message / tool-call rows by DuckDB, not Python.

Design decisions
- Why. After the Python fast route (`ingest/openai_jsonl.fast_rows`) the import's CPU
  was still ~9x DuckDB's own `read_json` of the file: the per-record Python (parse,
  rows, hash, column lists) was over half of it. Here the importer hands DuckDB a batch
  of raw lines (one Arrow string column) and DuckDB's C++ JSON reader does the rest on
  every core.
- Same rule as the fast route: DuckDB only takes a record it can *prove* plain, and
  proves it narrowly (`_PLAIN`'s conditions: exact JSON types for every field the
  importer reads, no duplicate keys in any object it reads (Python keeps the last,
  DuckDB the first), no `\\u0000` (lone surrogates DuckDB refuses to parse), no `meta`/`tools`/
  `expected_actions`/`outcome`, content as a string or null, calls only on assistant
  messages, arguments a JSON string already in the exact text Python's encoder writes
  for it (a flat object of escape-free strings, small integers, booleans and nulls:
  so the stored and hashed text is the file's own), and tool results answered by unique
  call ids of earlier messages). Every other record goes to the Python route, which
  accepts it or words the error, so this route never decides an error.
- One hash. The content hash is the writer's (`ingest/writer._digest`): the same parts
  in the same order joined by U+001F, NULL and (where Python uses `or`) empty as
  U+0000, `repr(reward)` only where DuckDB's shortest double text is the same string
  (plain decimals of <= 15 significant digits, no exponent). tests/ingest/
  test_bulk_route.py compares both routes row for row, hashes included.
- First in the file wins. Runs of plain records are inserted in file order between the
  Python route's batches (the caller flushes those first), each run joined with the
  store (which holds this transaction's earlier rows) and deduplicated by record order
  inside the run, so duplicates count and land exactly as on the Python route.
- Everything lives in temporary tables of the import's transaction, replaced per
  batch: memory is one batch, whatever the file's size.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from trace_lib.store.connection import Connection

LINES = "_bulk_lines"
_REC, _MSG, _CALL, _PLAIN = "_bulk_rec", "_bulk_msg", "_bulk_call", "_bulk_plain"

# The exact text Python's `json.dumps(..., ensure_ascii=False)` writes for a flat object
# of strings without anything it escapes, integers of <= 15 digits, booleans and nulls.
_SIMPLE = r'("[^"\\\x00-\x1f]*"|0|-?[1-9][0-9]{0,14}|true|false|null)'
_KEY = r'"[^"\\\x00-\x1f]*"'
ARGS_CANONICAL = rf"^\{{({_KEY}: {_SIMPLE}(, {_KEY}: {_SIMPLE})*)?\}}$"
# repr(float) and DuckDB's double text agree on these (shortest round trip, no exponent).
_REWARD_TEXT = r"^-?(0|[1-9][0-9]{0,6})\.[0-9]{1,8}$"

_MACROS = [
    # the JSON kind of a fragment; absent and null are the same to the importer (`get`)
    "CREATE OR REPLACE TEMP MACRO _bk(x) AS coalesce(json_type(x), 'NULL')",
    "CREATE OR REPLACE TEMP MACRO _bs(x) AS "
    "CASE WHEN _bk(x) = 'VARCHAR' THEN json_extract_string(x, '$') END",
    "CREATE OR REPLACE TEMP MACRO _buniq(k) AS len(k) = len(list_distinct(k))",
    # Python's `x or '\\0'` of the hash (None and '' alike)
    "CREATE OR REPLACE TEMP MACRO _bor(x) AS coalesce(nullif(x, ''), chr(0))",
]

_REC_SQL = f"""
CREATE OR REPLACE TEMP TABLE {_REC} AS
WITH p AS MATERIALIZED (
  SELECT record, try(json_keys(line)) AS keys,
         try(json_transform(line, '{{"id":"JSON","task_id":"JSON","trial":"JSON",
           "agent_model":"JSON","domain":"JSON","reward":"JSON","success":"JSON",
           "outcome":"JSON","termination":"JSON","meta":"JSON","tools":"JSON",
           "expected_actions":"JSON","messages":"JSON"}}')) AS j
  FROM {LINES}
  WHERE NOT contains(line, '\\u0000')
), q AS MATERIALIZED (
  SELECT record, keys, j, _bk(j.reward) AS rk, _bk(j.id) AS ik, _bk(j.task_id) AS tk,
         _bk(j.trial) AS trk,
         CASE WHEN _bk(j.reward) IN ('UBIGINT', 'BIGINT', 'DOUBLE')
              THEN TRY_CAST(j.reward AS DOUBLE) END AS reward,
         CASE WHEN _bk(j.success) = 'BOOLEAN' THEN j.success::BOOLEAN END AS success0,
         try(json_transform(j.messages, '["JSON"]')) AS msgs
  FROM p WHERE j IS NOT NULL AND keys IS NOT NULL
)
SELECT record, msgs,
       CASE WHEN ik = 'VARCHAR' THEN _bs(j.id)
            WHEN ik IN ('BIGINT', 'UBIGINT') THEN CAST(CAST(j.id AS HUGEINT) AS VARCHAR) END
         AS source_id,
       CASE WHEN tk = 'VARCHAR' THEN _bs(j.task_id)
            WHEN tk IN ('BIGINT', 'UBIGINT') THEN CAST(CAST(j.task_id AS HUGEINT) AS VARCHAR)
       END AS task_id,
       CASE WHEN trk <> 'NULL' THEN TRY_CAST(j.trial AS INTEGER) END AS trial,
       coalesce($agent_model, _bs(j.agent_model)) AS agent_model,
       coalesce($domain, _bs(j.domain)) AS domain,
       reward,
       coalesce(success0, CASE WHEN reward IS NOT NULL THEN reward >= $hi END) AS success,
       _bs(j.termination) AS termination
FROM q
WHERE _buniq(keys)
  AND rk IN ('NULL', 'UBIGINT', 'BIGINT', 'DOUBLE')
  AND (reward IS NULL OR (isfinite(reward) AND reward BETWEEN $lo AND $hi
       AND abs(reward) < 1e15 AND (reward = 0 OR abs(reward) >= 1e-4)
       AND regexp_matches(CAST(reward AS VARCHAR), '{_REWARD_TEXT}')))
  AND _bk(j.success) IN ('NULL', 'BOOLEAN')
  AND _bk(j.outcome) = 'NULL' AND _bk(j.meta) = 'NULL' AND _bk(j.tools) = 'NULL'
  AND _bk(j.expected_actions) = 'NULL'
  AND NOT (reward IS NULL AND success0 IS NULL AND $require_outcome)
  AND _bk(j.messages) = 'ARRAY' AND len(msgs) > 0
  AND ik IN ('NULL', 'VARCHAR', 'BIGINT', 'UBIGINT')
  AND tk IN ('NULL', 'VARCHAR', 'BIGINT', 'UBIGINT')
  AND (ik <> 'VARCHAR' OR strlen(_bs(j.id)) <= 1000)
  AND (tk <> 'VARCHAR' OR strlen(_bs(j.task_id)) <= 1000)
  AND (trk = 'NULL' OR (trk IN ('BIGINT', 'UBIGINT')
       AND TRY_CAST(j.trial AS INTEGER) IS NOT NULL))
  AND _bk(j.agent_model) IN ('NULL', 'VARCHAR') AND _bk(j.domain) IN ('NULL', 'VARCHAR')
  AND _bk(j.termination) IN ('NULL', 'VARCHAR')
"""

_MSG_SQL = f"""
CREATE OR REPLACE TEMP TABLE {_MSG} AS
WITH u AS MATERIALIZED (
  SELECT record, unnest(msgs) AS m, generate_subscripts(msgs, 1) - 1 AS idx FROM {_REC}
), t AS MATERIALIZED (
  SELECT record, idx, try(json_keys(m)) AS keys,
         try(json_transform(m, '{{"role":"JSON","content":"JSON","tool_call_id":"JSON",
           "name":"JSON","error":"JSON","tool_calls":"JSON"}}')) AS j
  FROM u WHERE json_type(m) = 'OBJECT'
), v AS MATERIALIZED (
  SELECT record, idx, keys, j,
         CASE _bs(j.role) WHEN 'developer' THEN 'system' WHEN 'function' THEN 'tool'
              ELSE _bs(j.role) END AS role,
         _bs(j.content) AS content, _bk(j.error) AS ek
  FROM t WHERE j IS NOT NULL AND keys IS NOT NULL
)
SELECT record, idx, role, content, _bs(j.tool_call_id) AS tool_call_id, _bs(j.name) AS name,
       CASE WHEN _bk(j.tool_calls) = 'ARRAY' THEN try(json_transform(j.tool_calls, '["JSON"]'))
       END AS calls,
       CASE WHEN role <> 'tool' THEN NULL
            WHEN ek = 'VARCHAR' AND _bs(j.error) <> '' THEN _bs(j.error)
            WHEN ek = 'BOOLEAN' AND j.error::BOOLEAN THEN coalesce(nullif(content, ''), 'error')
            WHEN ek = 'NULL' AND starts_with(content, 'Error:') THEN content END AS error,
       sum(CASE WHEN role = 'user' THEN 1 ELSE 0 END)
         OVER (PARTITION BY record ORDER BY idx ROWS UNBOUNDED PRECEDING)::INTEGER AS turn_idx,
       coalesce(_buniq(keys)
         AND role IN ('system', 'user', 'assistant', 'tool')
         AND _bk(j.content) IN ('NULL', 'VARCHAR')
         AND _bk(j.tool_call_id) IN ('NULL', 'VARCHAR') AND _bk(j.name) IN ('NULL', 'VARCHAR')
         AND _bk(j.tool_calls) IN ('NULL', 'ARRAY')
         AND (role <> 'tool' OR ek IN ('NULL', 'BOOLEAN', 'VARCHAR'))
         AND (role = 'assistant' OR coalesce(len(calls), 0) = 0), false) AS ok
FROM v
"""

_CALL_SQL = f"""
CREATE OR REPLACE TEMP TABLE {_CALL} AS
WITH u AS MATERIALIZED (
  SELECT record, idx AS message_idx, unnest(calls) AS c,
         generate_subscripts(calls, 1) - 1 AS call_idx
  FROM {_MSG} WHERE ok AND len(calls) > 0
), t AS MATERIALIZED (
  SELECT record, message_idx, call_idx, try(json_keys(c)) AS keys,
         try(json_transform(c, '{{"id":"JSON","requestor":"JSON","function":"JSON",
           "name":"JSON","arguments":"JSON"}}')) AS j
  FROM u WHERE json_type(c) = 'OBJECT'
), f AS MATERIALIZED (
  SELECT record, message_idx, call_idx, keys, j,
         list_contains(keys, 'function') AS wire,
         CASE WHEN list_contains(keys, 'function') AND _bk(j.function) = 'OBJECT'
              THEN try(json_keys(j.function)) END AS fkeys,
         CASE WHEN list_contains(keys, 'function') AND _bk(j.function) = 'OBJECT'
              THEN try(json_transform(j.function, '{{"name":"JSON","arguments":"JSON"}}')) END AS fn
  FROM t WHERE j IS NOT NULL AND keys IS NOT NULL
), g AS MATERIALIZED (
  SELECT record, message_idx, call_idx, keys, j, wire, fkeys,
         CASE WHEN wire THEN fn.name ELSE j.name END AS name_j,
         CASE WHEN wire THEN fn.arguments ELSE j.arguments END AS args_j
  FROM f
)
SELECT record, message_idx, call_idx, _bs(j.id) AS call_id, _bs(name_j) AS name,
       CASE WHEN _bk(args_j) = 'NULL' OR _bs(args_j) = '' THEN '{{}}' ELSE _bs(args_j) END
         AS arguments,
       coalesce(nullif(_bs(j.requestor), ''), 'assistant') AS requestor,
       coalesce(_buniq(keys) AND (NOT wire OR _buniq(fkeys))
         AND _bk(name_j) = 'VARCHAR'
         AND _bk(j.id) IN ('NULL', 'VARCHAR') AND _bk(j.requestor) IN ('NULL', 'VARCHAR')
         AND (_bk(args_j) = 'NULL' OR (_bk(args_j) = 'VARCHAR' AND (_bs(args_j) = ''
              OR (regexp_matches(_bs(args_j), '{ARGS_CANONICAL}')
                  AND NOT contains(_bs(args_j), '"_unparsed"')
                  AND _buniq(try(json_keys(_bs(args_j)))))))), false) AS ok
FROM g
"""

# A record is plain when it, each message and each call is, and the calls and results
# pair up the one way the importer's matching cannot read otherwise (see the docstring).
_PLAIN_SQL = f"""
CREATE OR REPLACE TEMP TABLE {_PLAIN} AS
WITH mc AS (
  SELECT record, count(*) AS n_msg, bool_and(ok) AS ok FROM {_MSG} GROUP BY record
), cc AS (
  SELECT record, count(*) AS n_call, bool_and(ok AND nullif(call_id, '') IS NOT NULL) AS ok,
         count(DISTINCT call_id) = count(*) AS uniq
  FROM {_CALL} GROUP BY record
), expected AS (
  SELECT m.record, sum(coalesce(len(m.calls), 0)) AS n FROM {_MSG} m GROUP BY m.record
), answers AS (
  SELECT m.record,
         bool_and(c.call_id IS NOT NULL AND c.message_idx < m.idx) AS ok,
         count(DISTINCT m.tool_call_id) = count(*) AS uniq
  FROM {_MSG} m LEFT JOIN {_CALL} c ON c.record = m.record AND c.call_id = m.tool_call_id
  WHERE m.role = 'tool' GROUP BY m.record
)
SELECT r.record FROM {_REC} r
JOIN mc ON mc.record = r.record AND mc.ok AND mc.n_msg = len(r.msgs)
JOIN expected e ON e.record = r.record
LEFT JOIN cc ON cc.record = r.record
LEFT JOIN answers a ON a.record = r.record
WHERE coalesce(cc.n_call, 0) = e.n AND coalesce(cc.ok AND cc.uniq, true)
  AND coalesce(a.ok AND a.uniq, true)
"""


def stage(con: Connection, records: list[int], lines: list[str], *, reward_range: tuple[float,
          float], require_outcome: bool, domain: str | None, agent_model: str | None
          ) -> list[int]:
    """Classify one batch of lines (`records[i]` is `lines[i]`'s record index); returns the
    plain records, in order, whose rows `insert_run` then writes."""
    for sql in _MACROS:
        con.execute(sql)
    con.execute(f"CREATE OR REPLACE TEMP TABLE {LINES} (record INTEGER, line VARCHAR)")
    con.from_arrow(pa.table({"record": pa.array(records, pa.int32()),
                             "line": pa.array(lines, pa.string())})).query(
        "_bulk_in", f"INSERT INTO {LINES} SELECT * FROM _bulk_in")
    params = {"lo": reward_range[0], "hi": reward_range[1],
              "require_outcome": require_outcome, "domain": domain, "agent_model": agent_model}
    con.execute(_REC_SQL, params)
    con.execute(_MSG_SQL)
    con.execute(_CALL_SQL)
    con.execute(_PLAIN_SQL)
    con.execute(f"DROP TABLE {LINES}")
    return [r[0] for r in con.execute(f"SELECT record FROM {_PLAIN} ORDER BY record").fetchall()]


_ROWS_SQL = f"""
CREATE OR REPLACE TEMP TABLE _bulk_rows AS
WITH sel AS (
  SELECT r.* FROM {_REC} r JOIN {_PLAIN} p USING (record)
  WHERE r.record BETWEEN $first AND $last
), msg AS (
  SELECT m.record, m.idx, m.role, m.content, m.tool_call_id,
         CASE WHEN m.name IS NULL AND m.role = 'tool' THEN c.name ELSE m.name END AS name,
         m.turn_idx, coalesce(len(m.calls), 0) AS n_calls, m.error
  FROM {_MSG} m JOIN sel USING (record)
  LEFT JOIN {_CALL} c ON m.role = 'tool' AND c.record = m.record AND c.call_id = m.tool_call_id
), call AS (
  SELECT c.record, c.message_idx, c.call_idx, c.call_id, c.name, c.arguments, c.requestor,
         a.error
  FROM {_CALL} c JOIN sel USING (record)
  LEFT JOIN {_MSG} a ON a.role = 'tool' AND a.record = c.record AND a.tool_call_id = c.call_id
), call_parts AS (
  SELECT record, message_idx,
         string_agg(chr(31) || chr(29) || chr(31) || name || chr(31) || arguments || chr(31)
                    || _bor(call_id) || chr(31) || _bor(requestor) || chr(31)
                    || coalesce(error, chr(0)), '' ORDER BY call_idx) AS part,
         count(error) AS n_errors
  FROM call GROUP BY record, message_idx
), msg_parts AS (
  SELECT m.record,
         string_agg(chr(31) || chr(30) || chr(31) || m.role || chr(31)
                    || coalesce(m.content, chr(0)) || chr(31) || _bor(m.tool_call_id)
                    || chr(31) || _bor(m.name) || chr(31) || m.turn_idx::VARCHAR
                    || coalesce(cp.part, ''), '' ORDER BY m.idx) AS part,
         count(*) AS n_messages, sum(m.n_calls) AS n_calls,
         coalesce(sum(cp.n_errors), 0) AS n_errors,
         arg_max(CASE WHEN m.role = 'user' THEN 'user_stop'
                      WHEN m.role = 'assistant' AND m.n_calls = 0 THEN 'agent_stop'
                      WHEN m.role = 'tool' AND m.error IS NOT NULL THEN 'error'
                      WHEN m.role IN ('assistant', 'tool') THEN 'max_steps' END, m.idx)
           AS inferred
  FROM msg m LEFT JOIN call_parts cp ON cp.record = m.record AND cp.message_idx = m.idx
  GROUP BY m.record
), h AS (
  SELECT s.*, mp.n_messages, mp.n_calls, mp.n_errors, mp.inferred,
         CASE WHEN s.success IS NULL THEN 'unknown' WHEN s.success THEN 'success'
              ELSE 'failure' END AS outcome,
         sha256(_bor(s.task_id) || chr(31) || coalesce(s.trial::VARCHAR, chr(0)) || chr(31)
                || _bor(s.agent_model) || chr(31) || _bor(s.domain) || chr(31)
                || coalesce(s.reward::VARCHAR, chr(0)) || chr(31)
                || CASE WHEN s.success IS NULL THEN chr(0) WHEN s.success THEN 'True'
                        ELSE 'False' END || chr(31)
                || CASE WHEN s.success IS NULL THEN 'unknown' WHEN s.success THEN 'success'
                        ELSE 'failure' END || chr(31)
                || _bor(s.source_id) || mp.part) AS sha
  FROM sel s JOIN msg_parts mp USING (record)
)
SELECT h.*, 't_' || sha[1:16] AS id,
       row_number() OVER (PARTITION BY sha ORDER BY record) = 1
         AND sha NOT IN (SELECT content_sha256 FROM trajectories) AS new
FROM h
"""


def insert_run(con: Connection, first: int, last: int, dataset_id: str, default_domain: str
               ) -> dict[str, Any]:
    """Insert the plain records of this batch in [first, last] (the Python route's earlier
    rows are in the store already). Returns the run's counts, its (source id, hash) pairs
    in record order, and its new calls' argument types for the schema observer."""
    con.execute(_ROWS_SQL, {"first": first, "last": last})
    con.execute(
        "INSERT INTO trajectories (id, dataset_id, source_id, task_id, trial, agent_model, "
        "domain, reward, success, outcome, termination, n_messages, n_tool_calls, "
        "n_tool_errors, content_sha256, meta) "
        "SELECT id, $ds, source_id, task_id, trial, agent_model, domain, reward, success, "
        "outcome, coalesce(nullif(termination, ''), inferred), n_messages, n_calls, n_errors, "
        "sha, '{\"source_format\": \"openai_jsonl\"}'::JSON FROM _bulk_rows WHERE new "
        "ORDER BY record", {"ds": dataset_id})
    con.execute(f"""
        INSERT INTO messages (trajectory_id, idx, role, content, tool_call_id, name, turn_idx)
        SELECT r.id, m.idx, m.role, m.content, m.tool_call_id,
               CASE WHEN m.name IS NULL AND m.role = 'tool' THEN c.name ELSE m.name END,
               m.turn_idx
        FROM _bulk_rows r JOIN {_MSG} m USING (record)
        LEFT JOIN {_CALL} c ON m.role = 'tool' AND c.record = m.record
                            AND c.call_id = m.tool_call_id
        WHERE r.new ORDER BY r.record, m.idx""")
    con.execute(f"""
        INSERT INTO tool_calls (trajectory_id, message_idx, call_idx, call_id, name, arguments,
                                requestor, error)
        SELECT r.id, c.message_idx, c.call_idx, c.call_id, c.name, c.arguments::JSON,
               c.requestor, a.error
        FROM _bulk_rows r JOIN {_CALL} c USING (record)
        LEFT JOIN {_MSG} a ON a.role = 'tool' AND a.record = c.record
                           AND a.tool_call_id = c.call_id
        WHERE r.new ORDER BY r.record, c.message_idx, c.call_idx""")
    outcomes = dict(con.execute(
        "SELECT outcome, count(*) FROM _bulk_rows WHERE new GROUP BY outcome").fetchall())
    ids = con.execute("SELECT source_id, sha FROM _bulk_rows ORDER BY record").to_arrow_table()
    calls = con.execute(f"""
        SELECT coalesce(r.domain, $d) AS domain, c.name, count(*)
        FROM _bulk_rows r JOIN {_CALL} c USING (record) WHERE r.new GROUP BY ALL""",
                        {"d": default_domain}).fetchall()
    keys = con.execute(f"""
        SELECT coalesce(r.domain, $d) AS domain, c.name, e.key, list(DISTINCT e.type),
               count(*)
        FROM _bulk_rows r JOIN {_CALL} c USING (record), json_each(c.arguments) e
        WHERE r.new GROUP BY ALL""", {"d": default_domain}).fetchall()
    con.execute("DROP TABLE _bulk_rows")
    return {"outcomes": outcomes, "ids": ids, "calls": calls, "keys": keys}
