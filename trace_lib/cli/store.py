"""CLI verbs of the store itself: `store check [--repair]`, `store backup PATH`,
`store restore PATH`, `store compact`.

Design decisions
- Thin: each verb is one call of `trace_lib.workbench.store_admin` and prints its result.
- `store check` prints one line per finding (ok / FAIL, what was found, what to do) and
  exits 1 when any finding fails, so a script or CI can gate on it; `--json` prints the
  whole report as one document (exit status the same).
- `store restore` needs no `--yes`: nothing is lost, the store it replaces is kept beside
  it (renamed), and the output says where.
"""

from __future__ import annotations

import argparse
import sys

from trace_lib.cli.output import print_json


def _cmd_check(args: argparse.Namespace) -> int:
    from trace_lib.workbench import store_admin

    report = store_admin.check_store(args.db, repair=args.repair, sample=args.sample)
    if args.json:
        print_json(report.to_json())
        return 0 if report.ok else 1
    for line in report.repaired:
        print(f"repaired  {line}")
    for f in report.findings:
        print(f"{'ok  ' if f.ok else 'FAIL'}  {f.check:13s} {f.message}")
        if not f.ok and f.fix:
            print(f"{'':20s}what to do: {f.fix}")
    if report.ok:
        print(f"{report.path}: every check passed.")
        return 0
    print(f"{report.path}: {len(report.problems)} check(s) failed (see FAIL above).",
          file=sys.stderr)
    return 1


def _cmd_backup(args: argparse.Namespace) -> int:
    from trace_lib.workbench import store_admin

    done = store_admin.backup_store(args.db, args.path)
    if args.json:
        print_json(done)
        return 0
    rows = sum(done["tables"].values())
    print(f"Backed up {done['store']} (schema version {done['schema_version']}, "
          f"{len(done['tables'])} tables, {rows} rows, "
          f"{'with' if len(done['files']) > 1 else 'without'} its search index) to "
          f"{done['backup']}.")
    print(f"Restore it with: {done['restore']}")
    return 0


def _cmd_restore(args: argparse.Namespace) -> int:
    from trace_lib.workbench import store_admin

    done = store_admin.restore_store(args.path, args.db)
    if args.json:
        print_json(done)
        return 0
    rows = sum(done["tables"].values())
    print(f"Restored {done['store']} from {done['backup']} ({len(done['tables'])} tables, "
          f"{rows} rows, schema version {done['schema_version']}).")
    if done["kept"]:
        print(f"The store it replaced is kept as {done['kept']}.")
    return 0


def _cmd_compact(args: argparse.Namespace) -> int:
    from trace_lib.workbench import store_admin

    done = store_admin.compact_store(args.db)
    if args.json:
        print_json(done)
        return 0
    mib = 1 << 20
    print(f"Compacted {done['store']}: {done['bytes_before'] / mib:.1f} MiB -> "
          f"{done['bytes_after'] / mib:.1f} MiB ({len(done['tables'])} tables, "
          f"{sum(done['tables'].values())} rows, unchanged).")
    return 0


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """Add `store check|backup|restore|compact` to the CLI."""
    st = sub.add_parser("store", parents=[common],
                        help="the store file: check, back up, restore, compact")
    ssub = st.add_subparsers(dest="store_verb", metavar="ACTION")
    ssub.required = True
    s = ssub.add_parser("check", parents=[common],
                        help="verify schema version, row counts per dataset, materialised "
                             "labels and the search index; exit 1 on a mismatch")
    s.add_argument("--repair", action="store_true",
                   help="rebuild the search index and materialised labels where they are "
                        "wrong, then check again")
    s.add_argument("--sample", type=int, default=50,
                   help="trajectories whose words are looked up in the search index (50)")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=_cmd_check)
    s = ssub.add_parser("backup", parents=[common],
                        help="copy the store and its search index into a new folder")
    s.add_argument("path", help="a new (or empty) folder for the backup")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=_cmd_backup)
    s = ssub.add_parser("restore", parents=[common],
                        help="replace the store with a backup (the replaced store is kept)")
    s.add_argument("path", help="a folder written by `store backup`")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=_cmd_restore)
    s = ssub.add_parser("compact", parents=[common],
                        help="give back the space deletes left in the store file (a copy of "
                             "the live rows, swapped in under the store's lock)")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=_cmd_compact)
