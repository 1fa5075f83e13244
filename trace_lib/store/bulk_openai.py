"""The OpenAI-messages import's DuckDB route: plainly valid JSONL lines parsed, hashed and
turned into trajectory / message / tool-call rows by DuckDB, not Python.

Design decisions
- Why, and why it is not the default. After the Python fast route
  (`ingest/openai_jsonl.fast_rows`) the import's CPU was still ~9x DuckDB's own
  `read_json` of the file, over half of it per-record Python (parse, rows, hash, column
  lists). Here the importer hands DuckDB a batch of raw lines (one Arrow string column)
  and DuckDB's JSON functions do the rest. Measured on the 2-core box (bench/README.md,
  issue 35), it costs *more* CPU than the Python route (5.4 vs 4.5 s per 100k, DuckDB's
  threads counted) and memory (838 vs 438 MiB at 100k): proving a record plain takes a
  shape pass (`json_structure`), a typed read, four key-list passes for duplicate keys and
  a regex, and the hash's string assembly and the joins of messages with calls cost
  ~0.9 s per 100k alone. So `ingest_paths(bulk=True)` asks for it; the default stays
  Python.
- Same rule as the fast route: DuckDB only takes a record it can *prove* plain, and
  proves it narrowly (`accepted` on the record's `json_structure`, judged once per
  distinct shape, then per-row SQL): exact JSON types for every field the importer
  reads; nothing DuckDB reads more leniently than Python (`_LENIENT`: trailing commas,
  nan/inf, long digit runs; nesting past `MAX_DEPTH`); no duplicate keys in any object
  it reads (Python keeps the last, DuckDB the first); no `\\u0000` (a lone surrogate
  DuckDB refuses, so Python reads it); no `meta`/`tools`/`expected_actions`/`outcome`; content a
  string or null; calls only on assistant messages; arguments a JSON string already in
  the exact text Python's encoder writes for it (a flat object of escape-free strings,
  small integers, booleans and nulls, so the stored and hashed text is the file's own);
  tool results answered by unique call ids of earlier messages. Every other record goes
  to the Python route, which accepts it or words the error, so this route never decides
  an error.
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
  batch: the importer holds one batch, and DuckDB's temporary tables count against the
  import's memory limit (`IngestLimits.store_memory_bytes`); measured peak RSS 830 MiB at
  100k, 1,271 MiB at 1M (the Python route: 436 and 1,094 MiB).
"""

from __future__ import annotations

import json
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
MAX_DEPTH = 200
# What DuckDB's JSON reader accepts and Python's `json` refuses (trailing commas, `nan`
# and `inf` in any case), or reads otherwise (integers of 19+ digits: `fast_loads` hands
# those to `json.loads`, whose 4,300-digit limit refuses some): such lines go to the
# Python route. The patterns may also match inside strings; that only costs speed.
_LENIENT = r",\s*[\]}]|[:,\[]\s*[-+]?(?i:nan|inf)|[0-9]{19}"

_MACROS = [
    "CREATE OR REPLACE TEMP MACRO _buniq(k) AS len(k) = len(list_distinct(k))",
    "CREATE OR REPLACE TEMP MACRO _ball_uniq(ks) AS "
    "coalesce(list_bool_and(list_transform(ks, lambda k: len(k) = len(list_distinct(k)))), true)",
    # Python's `x or '\\0'` of the hash (None and '' alike)
    "CREATE OR REPLACE TEMP MACRO _bor(x) AS coalesce(nullif(x, ''), chr(0))",
]

# What the importer reads, typed. A value of another JSON type would be cast (5 -> '5'),
# so a record is only read this way when its `json_structure` says every field has the
# exact type (`accepted`); NULL merges with any type there, so per-row checks remain.
_TYPED = ('{"id":"VARCHAR","task_id":"VARCHAR","trial":"BIGINT","agent_model":"VARCHAR",'
          '"domain":"VARCHAR","reward":"DOUBLE","success":"BOOLEAN","termination":"VARCHAR",'
          '"messages":[{"role":"VARCHAR","content":"VARCHAR","tool_call_id":"VARCHAR",'
          '"name":"VARCHAR","error":"VARCHAR","tool_calls":[{"id":"VARCHAR",'
          '"requestor":"VARCHAR","function":{"name":"VARCHAR","arguments":"VARCHAR"}}]}]}')
_ID = frozenset({"VARCHAR", "UBIGINT", "BIGINT", "NULL"})
_INT = frozenset({"UBIGINT", "BIGINT", "NULL"})
_STR = frozenset({"VARCHAR", "NULL"})
_TOP = {"id": _ID, "task_id": _ID, "trial": _INT, "agent_model": _STR, "domain": _STR,
        "termination": _STR, "reward": frozenset({"DOUBLE", "UBIGINT", "BIGINT", "NULL"}),
        "success": frozenset({"BOOLEAN", "NULL"}), "outcome": frozenset({"NULL"}),
        "meta": frozenset({"NULL"}), "tools": frozenset({"NULL"}),
        "expected_actions": frozenset({"NULL"})}  # fmt: skip
_MESSAGE = {"role": _STR, "content": _STR, "tool_call_id": _STR, "name": _STR,
            "error": frozenset({"VARCHAR", "BOOLEAN", "NULL"})}
_CALL_KEYS = {"id": _STR, "requestor": _STR}
_FUNCTION = {"name": _STR, "arguments": _STR}


def _fits(obj: Any, spec: dict[str, frozenset[str]]) -> bool:
    return isinstance(obj, dict) and all(
        k not in obj or (isinstance(obj[k], str) and obj[k] in kinds) for k, kinds in spec.items())


def _depth(value: Any) -> int:
    """Nesting depth of a parsed JSON value (iterative: a shape may be deep)."""
    deepest, todo = 0, [(value, 1)]
    while todo:
        v, d = todo.pop()
        if isinstance(v, dict | list):
            deepest = max(deepest, d)
            todo.extend((x, d + 1) for x in (v.values() if isinstance(v, dict) else v))
    return deepest


def accepted(structure: str) -> tuple[bool, bool] | None:
    """Whether a record of this `json_structure` can be read typed: None if not, else
    (its tool messages' `error` is a boolean, not a string or null; it has a `trial`,
    which must then read as a 32-bit integer: the typed read gives NULL past 64 bits)."""
    try:
        s = json.loads(structure)
    except RecursionError:
        return None
    # Python refuses a record nested past its recursion limit (~1,000), in any field;
    # DuckDB reads it: far below that limit, or the Python route decides.
    if _depth(s) > MAX_DEPTH or not _fits(s, _TOP):
        return None
    msgs = s.get("messages")
    if not (isinstance(msgs, list) and len(msgs) == 1 and _fits(msgs[0], _MESSAGE)):
        return None
    calls = msgs[0].get("tool_calls", "NULL")
    if calls not in ("NULL", ["NULL"]):
        if not (isinstance(calls, list) and len(calls) == 1 and _fits(calls[0], _CALL_KEYS)
                and _fits(calls[0].get("function"), _FUNCTION)):
            return None
    return msgs[0].get("error") == "BOOLEAN", s.get("trial", "NULL") != "NULL"


_REC_SQL = f"""
CREATE OR REPLACE TEMP TABLE {_REC} AS
SELECT record, h.s, json_transform(l.line, '{_TYPED}') AS j,
       json_keys(l.line) AS k0, json_keys(l.line, '$.messages[*]') AS k1,
       json_keys(l.line, '$.messages[*].tool_calls[*]') AS k2,
       json_keys(l.line, '$.messages[*].tool_calls[*].function') AS k3
FROM {LINES} l JOIN _bulk_shape h USING (record) SEMI JOIN _bulk_ok o ON o.s = h.s
WHERE NOT contains(l.line, '\\u0000')
"""

# The records whose shape is accepted, with their top-level fields checked and read.
_TOP_SQL = f"""
CREATE OR REPLACE TEMP TABLE _bulk_top AS
SELECT r.record, o.err_bool, j.messages AS msgs, j.id AS source_id, j.task_id,
       j.trial::INTEGER AS trial, coalesce($agent_model, j.agent_model) AS agent_model,
       coalesce($domain, j.domain) AS domain, j.reward,
       coalesce(j.success, CASE WHEN j.reward IS NOT NULL THEN j.reward >= $hi END) AS success,
       j.termination
FROM {_REC} r JOIN _bulk_ok o USING (s)
WHERE _buniq(k0) AND k1 IS NOT NULL AND k2 IS NOT NULL AND k3 IS NOT NULL
  AND _ball_uniq(k1) AND _ball_uniq(k2) AND _ball_uniq(k3)
  AND o.has_trial = (j.trial IS NOT NULL)
  AND (j.reward IS NULL OR (isfinite(j.reward) AND j.reward BETWEEN $lo AND $hi
       AND abs(j.reward) < 1e15 AND (j.reward = 0 OR abs(j.reward) >= 1e-4)
       AND regexp_matches(CAST(j.reward AS VARCHAR), '{_REWARD_TEXT}')))
  AND NOT (j.reward IS NULL AND j.success IS NULL AND $require_outcome)
  AND len(j.messages) > 0
  AND (j.trial IS NULL OR j.trial BETWEEN -2147483648 AND 2147483647)
  AND coalesce(strlen(j.id), 0) <= 1000 AND coalesce(strlen(j.task_id), 0) <= 1000
"""

_MSG_SQL = f"""
CREATE OR REPLACE TEMP TABLE {_MSG} AS
WITH u AS (
  SELECT record, err_bool, unnest(msgs) AS m, generate_subscripts(msgs, 1) - 1 AS idx
  FROM _bulk_top
), v AS (
  SELECT record, idx, err_bool, m.content, m.tool_call_id, m.name, m.error AS err,
         m.tool_calls AS calls,
         CASE m.role WHEN 'developer' THEN 'system' WHEN 'function' THEN 'tool'
              ELSE m.role END AS role
  FROM u
)
SELECT record, idx, role, content, tool_call_id, name, calls,
       CASE WHEN role <> 'tool' THEN NULL
            WHEN err_bool AND err = 'true' THEN coalesce(nullif(content, ''), 'error')
            WHEN NOT err_bool AND err <> '' THEN err
            WHEN err IS NULL AND starts_with(content, 'Error:') THEN content END AS error,
       sum(CASE WHEN role = 'user' THEN 1 ELSE 0 END)
         OVER (PARTITION BY record ORDER BY idx ROWS UNBOUNDED PRECEDING)::INTEGER AS turn_idx,
       coalesce(role IN ('system', 'user', 'assistant', 'tool')
                AND (role = 'assistant' OR coalesce(len(calls), 0) = 0), false) AS ok
FROM v
"""

_CALL_SQL = f"""
CREATE OR REPLACE TEMP TABLE {_CALL} AS
WITH u AS (
  SELECT record, idx AS message_idx, unnest(calls) AS c,
         generate_subscripts(calls, 1) - 1 AS call_idx
  FROM {_MSG} WHERE ok AND len(calls) > 0
)
SELECT record, message_idx, call_idx, c.id AS call_id, c.function.name AS name,
       CASE WHEN coalesce(c.function.arguments, '') = '' THEN '{{}}'
            ELSE c.function.arguments END AS arguments,
       coalesce(nullif(c.requestor, ''), 'assistant') AS requestor,
       coalesce(c.function IS NOT NULL AND c.function.name IS NOT NULL
                AND (coalesce(c.function.arguments, '') = ''
                     OR (regexp_matches(c.function.arguments, '{ARGS_CANONICAL}')
                         AND NOT contains(c.function.arguments, '"_unparsed"')
                         AND _buniq(try(json_keys(c.function.arguments))))), false) AS ok
FROM u
"""

# A record is plain when it, each message and each call is, and the calls and results
# pair up the one way the importer's matching cannot read otherwise (see the docstring).
_PLAIN_SQL = f"""
CREATE OR REPLACE TEMP TABLE {_PLAIN} AS
WITH mc AS (
  SELECT record, bool_and(ok) AS ok, sum(coalesce(len(calls), 0)) AS n_calls
  FROM {_MSG} GROUP BY record
), cc AS (
  SELECT record, count(*) AS n_call, bool_and(ok AND nullif(call_id, '') IS NOT NULL) AS ok,
         count(DISTINCT call_id) = count(*) AS uniq
  FROM {_CALL} GROUP BY record
), answers AS (
  SELECT m.record,
         bool_and(c.call_id IS NOT NULL AND c.message_idx < m.idx) AS ok,
         count(DISTINCT m.tool_call_id) = count(*) AS uniq
  FROM {_MSG} m LEFT JOIN {_CALL} c ON c.record = m.record AND c.call_id = m.tool_call_id
  WHERE m.role = 'tool' GROUP BY m.record
)
SELECT r.record FROM _bulk_top r
JOIN mc ON mc.record = r.record AND mc.ok
LEFT JOIN cc ON cc.record = r.record
LEFT JOIN answers a ON a.record = r.record
WHERE coalesce(cc.n_call, 0) = mc.n_calls AND coalesce(cc.ok AND cc.uniq, true)
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
    # Few shapes per file: each distinct one is judged once, here (`accepted`), and only
    # lines of an accepted shape are read further (a shape is invalid JSON's NULL).
    con.execute(f"CREATE OR REPLACE TEMP TABLE _bulk_shape AS SELECT record, "
                f"try(json_structure(line)) AS s FROM {LINES} "
                f"WHERE NOT regexp_matches(line, '{_LENIENT}')")
    shapes = [(s, accepted(s)) for (s,) in con.execute(
        "SELECT DISTINCT s FROM _bulk_shape WHERE starts_with(s, '{')").fetchall()]
    con.execute("CREATE OR REPLACE TEMP TABLE _bulk_ok (s VARCHAR, err_bool BOOLEAN, "
                "has_trial BOOLEAN)")
    ok = [(s, *e) for s, e in shapes if e is not None]
    if ok:
        con.executemany("INSERT INTO _bulk_ok VALUES (?, ?, ?)", ok)
    con.execute(_REC_SQL)
    con.execute(_TOP_SQL, params)
    con.execute(_MSG_SQL)
    con.execute(_CALL_SQL)
    con.execute(_PLAIN_SQL)
    con.execute(f"DROP TABLE {LINES}")
    return [r[0] for r in con.execute(f"SELECT record FROM {_PLAIN} ORDER BY record").fetchall()]


_ROWS_SQL = f"""
CREATE OR REPLACE TEMP TABLE _bulk_rows AS
WITH sel AS (
  SELECT r.* FROM _bulk_top r JOIN {_PLAIN} p USING (record)
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
