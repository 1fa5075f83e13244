"""Labels as a CSV file: export the effective labels, import a file as a label run.

Design decisions
- The export writes effective labels (finished runs and edits, `label_pairs`) in a
  `Scope`, each row qualified with dataset name, task id and trial so that a person can
  read the file; import reads only the first three columns.
- Import validates every row before writing anything (unknown ids, capabilities or
  values are one error listing the first offending lines); `trajectory_id` accepts the
  store's id or the source id from the imported file when that is unambiguous. The rows
  land as one finished label run, written in one transaction, and count at once (the
  materialised labels and the Rankings page's stored default view brought up to
  date, as a labeler's run finishing does).
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import pandas as pd

from trace_lib import store
from trace_lib.data_model import LABEL_VALUES
from trace_lib.diagnose import materialise, rank_precompute
from trace_lib.diagnose.label_runs import create_run
from trace_lib.diagnose.labels import capability_names
from trace_lib.errors import UserInputError
from trace_lib.scope import Scope
from trace_lib.store import labels as store_labels
from trace_lib.store import trajectories as store_trajectories

IMPORT_COLUMNS = ("trajectory_id", "capability", "value")
# The export adds where each trajectory comes from (import ignores these columns).
EXPORT_COLUMNS = (*IMPORT_COLUMNS, "dataset", "task_id", "trial")


def export_rows(db: str | Path | None, scope: Scope | None = None) -> list[tuple[Any, ...]]:
    """Effective labels in scope, each qualified: (trajectory_id, capability, value,
    dataset name, task id, trial). Finished runs only (`left_out_runs` names the others)."""
    with store.connect(db) as con:
        materialise.sync(con)
        return store_labels.export_rows(con, scope)


def labels_csv(db: str | Path | None, scope: Scope | None = None) -> str:
    """The CSV export as text (the Labels page builds it only when the download is clicked)."""
    import io

    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(EXPORT_COLUMNS)
    w.writerows(export_rows(db, scope))
    return buf.getvalue()


def export_labels(db: str | Path | None, path: str | Path, *,
                  scope: Scope | None = None) -> int:
    """Write effective labels as `trajectory_id,capability,value,dataset,task_id,trial`
    (import reads the first three); returns the row count."""
    rows = export_rows(db, scope)
    with open(path, "w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh, lineterminator="\n")
        w.writerow(EXPORT_COLUMNS)
        w.writerows(rows)
    return len(rows)


def import_labels(db: str | Path | None, path: str | Path, run: str, *,
                  labeler: str = "import") -> int:
    """Import a CSV as label run `run`. Validates every row first; writes all or nothing."""
    path = Path(path)
    if not path.exists():
        raise UserInputError(f"{path}: no such file")
    with open(path, newline="", encoding="utf-8-sig") as fh:
        reader = csv.DictReader(fh)
        missing = [c for c in IMPORT_COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise UserInputError(f"{path}: header: missing column(s) {', '.join(missing)}; "
                                 f"expected {','.join(IMPORT_COLUMNS)}")
        records = [(n, r) for n, r in enumerate(reader, start=2)]
    if not records:
        raise UserInputError(f"{path}: no label rows after the header")
    with store.connect(db) as con:
        caps = set(capability_names(con, include_rejected=True))
        ids = set(store_trajectories.all_ids(con))
        by_source: dict[str, list[str]] = {}
        for tid, sid in store_trajectories.source_ids(con):
            by_source.setdefault(str(sid), []).append(tid)
        problems: list[str] = []
        rows: dict[tuple[str, str], str] = {}
        for line, rec in records:
            raw_id = (rec.get("trajectory_id") or "").strip()
            cap = (rec.get("capability") or "").strip()
            value = (rec.get("value") or "").strip().lower()
            if raw_id in ids:
                tid = raw_id
            elif len(by_source.get(raw_id, [])) == 1:
                tid = by_source[raw_id][0]
            elif len(by_source.get(raw_id, [])) > 1:
                problems.append(f"line {line}: trajectory_id {raw_id!r} matches "
                                f"{len(by_source[raw_id])} trajectories by source id; use the "
                                "store id")
                continue
            else:
                problems.append(f"line {line}: trajectory_id {raw_id!r}: no trajectory with this "
                                "store id or source id")
                continue
            if cap not in caps:
                problems.append(f"line {line}: capability {cap!r}: not in the catalog (add it "
                                "with `capabilities add`)")
            if value not in LABEL_VALUES:
                problems.append(f"line {line}: value {value!r}: expected one of "
                                f"{', '.join(LABEL_VALUES)}")
            if (tid, cap) in rows and rows[(tid, cap)] != value:
                problems.append(f"line {line}: ({raw_id}, {cap}) appears twice with different "
                                "values")
            rows[(tid, cap)] = value
        if problems:
            more = f" (and {len(problems) - 10} more)" if len(problems) > 10 else ""
            raise UserInputError(f"{path}: nothing imported; " + "; ".join(problems[:10]) + more)
        with store.transaction(con):
            create_run(con, run, labeler, params={"source": str(path.name)})
            df = pd.DataFrame([[run, tid, cap, v] for (tid, cap), v in rows.items()],
                              columns=["run_id", "trajectory_id", "capability", "value"])
            store_labels.insert_labels(con, df)
            store_labels.set_run_status(con, run, "finished", None, None)
        # the run counts from now: the materialised labels and the Rankings default view
        rank_precompute.run_finished(con)
    return len(rows)
