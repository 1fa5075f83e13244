"""CLI verbs of imported datasets: `datasets list` and `datasets delete NAME --yes`.

Design decisions
- Deleting is irreversible, so `delete` refuses without `--yes` (it then says what would go);
  the deletion itself is `trace_lib.workbench.data.delete_dataset`, the same call as Home's
  Delete button: one transaction, label edits kept in an audit file.
- NAME is a dataset's name or its id (`datasets list` shows both); an ambiguous name is
  refused with the ids to choose from.
- `--backup PATH` keeps a copy of the whole store first (`store backup PATH`; `store
  restore PATH` brings it back); the refusal without `--yes` says so.
"""

from __future__ import annotations

import argparse
import sys

from trace_lib.cli.output import print_json


def _cmd_list(args: argparse.Namespace) -> int:
    from trace_lib.workbench import data

    rows = data.list_datasets(args.db)
    if args.json:
        print_json(rows)
        return 0
    if not rows:
        print("No datasets yet: import files with `python -m trace_lib ingest PATH...`.")
        return 0
    for r in rows:
        print(f"{r['id']:20s} {r['name']:40s} {r['format']:12s} "
              f"{r['trajectories']:6d} trajectories  {r['failures']:5d} failures")
    return 0


def _cmd_delete(args: argparse.Namespace) -> int:
    from trace_lib.errors import UserInputError
    from trace_lib.workbench import data

    if not args.yes:
        match = [r for r in data.list_datasets(args.db) if args.name in (r["id"], r["name"])]
        what = (f"{match[0]['name']} ({match[0]['trajectories']} trajectories with their "
                "messages, tool calls, embeddings and labels)") if len(match) == 1 \
            else args.name
        raise UserInputError(
            f"deleting {what} cannot be undone; add --yes to delete it. To keep a copy of "
            "the whole store first, add --backup PATH (a new folder; `python -m trace_lib "
            "store restore PATH` brings the store back).")
    done = data.delete_dataset(args.name, db=args.db, backup=args.backup)
    if args.json:
        print_json(done)
        return 0
    parts = ", ".join(f"{n} {table}" for table, n in done["removed"].items())
    print(f"Deleted dataset {done['name']} ({done['id']}): {parts}.")
    if done["audit_file"]:
        print(f"Label edits kept in {done['audit_file']}", file=sys.stderr)
    if done["backup"]:
        print(f"The store before the delete is backed up in {done['backup']} (undo: "
              f"python -m trace_lib store restore {done['backup']})", file=sys.stderr)
    return 0


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """Add `datasets list|delete` to the CLI."""
    ds = sub.add_parser("datasets", parents=[common], help="imported datasets: list, delete")
    dsub = ds.add_subparsers(dest="datasets_verb", metavar="ACTION")
    dsub.required = True
    s = dsub.add_parser("list", parents=[common], help="datasets with trajectory counts")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=_cmd_list)
    s = dsub.add_parser("delete", parents=[common],
                        help="remove a dataset with everything that refers to it")
    s.add_argument("name", help="the dataset's name or id (see `datasets list`)")
    s.add_argument("--yes", action="store_true", help="really delete (cannot be undone)")
    s.add_argument("--backup", metavar="PATH", default=None,
                   help="first back up the whole store into this new folder "
                        "(`store restore PATH` undoes the delete)")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=_cmd_delete)
