"""CLI verbs of background jobs: `job submit|list|status|logs|cancel|wait|run`.

Design decisions
- `job run SPEC.json` runs a job in this process through the same function as the entry
  point every backend starts (`python -m trace_lib.jobs.runner SPEC.json`, which imports
  no CLI); it never opens the database. The other `job` verbs read run directories and
  sync the store through the one jobs use case module (`trace_lib.workbench.jobs`), for
  every kind.
- Heavy modules (torch, transformers, ray) are imported inside handlers.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from trace_lib.cli.output import print_json


def _show_status(st: Any, as_json: bool) -> None:
    from trace_lib.workbench import job_progress

    # A job that learned nothing is not a plain "succeeded" (the page says the same).
    report = job_progress.job_report(st)
    signal, movement = report["learning_signal"], report["gate_movement"]
    if as_json:
        print_json(st.to_dict() | {"learning_signal": signal}
                   | ({"gate_movement": movement} if movement else {}))
        return
    print(f"{st.id}  {signal['state']}  backend={st.backend}  steps={st.steps_done}  "
          f"no-signal steps={signal['no_signal_steps']}/{signal['steps']}  "
          f"run_dir={st.run_dir}")
    if movement is not None:
        print(report["movement_line"])
    if signal["warning"]:
        print(f"WARNING: {signal['warning']}")
    if st.error:
        print(f"error: {st.error}")
    if st.log_tail:
        print("--- log tail ---")
        print(st.log_tail)


def _cmd_job_submit(args: argparse.Namespace) -> int:
    from trace_lib.workbench import jobs

    spec = jobs.submit_spec_file(args.db, args.spec, backend=args.backend)
    print_json({"job_id": spec.id, "run_dir": spec.run_dir}) if args.json else print(spec.id)
    return 0


def _cmd_job_list(args: argparse.Namespace) -> int:
    from trace_lib.workbench import jobs

    statuses = jobs.sync(args.db).statuses
    if args.json:
        print_json([s.to_dict() | {"log_tail": None} for s in statuses])
        return 0
    for view in jobs.job_views(kind=None, statuses=statuses):
        st = view["status"]
        print(f"{st.id:40s} {view['state']:10s} {st.backend:6s} steps={st.steps_done}")
    return 0


def _cmd_job_status(args: argparse.Namespace) -> int:
    from trace_lib.workbench import jobs

    _show_status(jobs.job_status(args.db, args.job_id), args.json)
    return 0


def _cmd_job_logs(args: argparse.Namespace) -> int:
    from trace_lib.workbench import jobs

    if not args.follow:
        sys.stdout.write(jobs.job_log(args.db, args.job_id, tail=args.tail) + "\n")
        return 0
    for chunk in jobs.follow_log(args.db, args.job_id):  # until the job ends
        sys.stdout.write(chunk)
        sys.stdout.flush()
    return 0


def _cmd_job_cancel(args: argparse.Namespace) -> int:
    from trace_lib.workbench import jobs

    _show_status(jobs.cancel(args.db, args.job_id, grace_s=args.grace), args.json)
    return 0


def _cmd_job_wait(args: argparse.Namespace) -> int:
    from trace_lib.workbench import jobs

    st = jobs.wait(args.db, args.job_id, timeout_s=args.timeout)
    _show_status(st, args.json)
    return 0 if st.state == "succeeded" else 1


def _cmd_job_run(args: argparse.Namespace) -> int:
    from trace_lib.workbench import jobs

    return jobs.run_job_here(args.spec)


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """Add `job` and its actions to the CLI."""
    job = sub.add_parser("job", parents=[common], help="background jobs")
    jsub = job.add_subparsers(dest="job_verb", metavar="ACTION")
    jsub.required = True
    s = jsub.add_parser("submit", parents=[common], help="submit SPEC.json ({kind, config})")
    s.add_argument("spec")
    s.add_argument("--backend", default="local", choices=("local", "ray"))
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=_cmd_job_submit)
    s = jsub.add_parser("list", parents=[common], help="jobs, newest first")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=_cmd_job_list)
    for name, fn, helptext in (("status", _cmd_job_status, "state, steps, error, log tail"),
                               ("cancel", _cmd_job_cancel, "SIGTERM, then SIGKILL"),
                               ("wait", _cmd_job_wait, "block until the job ends")):
        s = jsub.add_parser(name, parents=[common], help=helptext)
        s.add_argument("job_id")
        s.add_argument("--json", action="store_true")
        if name == "cancel":
            s.add_argument("--grace", type=float, default=10.0, help="seconds before SIGKILL")
        if name == "wait":
            s.add_argument("--timeout", type=float, default=3600.0)
        s.set_defaults(func=fn)
    s = jsub.add_parser("logs", parents=[common], help="the job's log.txt")
    s.add_argument("job_id")
    s.add_argument("--tail", type=int, default=None)
    s.add_argument("--follow", "-f", action="store_true")
    s.set_defaults(func=_cmd_job_logs)
    s = jsub.add_parser("run", parents=[common], help="the job entrypoint (backends call it)")
    s.add_argument("spec")
    s.set_defaults(func=_cmd_job_run)
