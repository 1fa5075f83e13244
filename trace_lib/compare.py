"""Compare two runs (any two datasets, or agent models): pass rates, paired tasks,
capability deltas, the do-nothing floor.

    python -m trace_lib compare A B --json       # A, B: DATASET[@AGENT_MODEL]
    compare_datasets(db, Side("airline_demo.jsonl", "scripted-careful"), "eval-run")

Design decisions
- A side is a dataset, optionally narrowed to one agent model's trajectories
  (`DATASET@AGENT_MODEL`, or a `Side`): one imported file often holds several agents (the
  demo's careful/hasty/sloppy), and they are the runs a person wants side by side. The
  text is read as a whole dataset name or id first (a name may contain "@"), else split
  at the first "@" whose left part is a dataset; an agent model the dataset does not
  have is an error that lists the ones it has. Everything below (outcomes, labels,
  provenance, the one-task view) reads only the side's trajectories.
- Beside each pass rate, the do-nothing floor on the same tasks (`evaluate.floor`): the
  share of the side's tasks that a policy making no call and saying nothing passes, by
  the verifier that scored the run, really run on an empty episode. Known only for runs
  the workbench scored (evaluations, the demo's scripted agents); an imported log's
  floor is unknown and says why, never a guess. `floor` in the output holds both sides,
  the paired tasks' and the rule; each task row says `passes_by_doing_nothing` (a pass
  there is no evidence of skill).
- Per side, the pass rate is over trajectories with a known outcome (every trial counts),
  with a Wilson score interval: it stays inside [0, 1] and is honest at 0 of n, which is
  where a small model starts.
- Pairing is by task id, the only identity two harnesses share; trajectories without a
  task id cannot pair. A task run several times counts as passed by its majority: more
  than half of its trials passed (a tie counts as not passed). The rule is in the output
  (`paired.rule`), since pass^k-style readings would count differently.
- The paired test is the exact McNemar test: under "no difference" the discordant tasks
  (passed by one side only) split 50/50, so p is the two-sided binomial tail of
  min(a_only, b_only) in a_only + b_only at 1/2 (1.0 when no task is discordant). It is
  exact at the small counts a few dozen tasks give, where the chi-square form is not.
- Capability deltas use each side's effective labels (the latest human edit, else the
  majority over label runs): lacking rate = lacking / (lacking + present), na excluded,
  over the side's labelled trajectories; delta = B - A with Newcombe's hybrid score
  interval for a difference of two independent proportions. Listed only for capabilities
  labelled on both sides; `notes` says when a side has no labels at all.
- `tasks` lists the common tasks, the flipped ones (passed by one side only) first.
- Works across formats (a tau2 import against an evaluation made here) because only task
  ids, outcomes and labels are read; two sides with no task id in common, a side
  compared with itself, a name that matches nothing or an unknown agent model is a
  `UserInputError`.
- `task_pair` loads one task's two transcripts (a trial that agrees with each side's
  majority verdict) and aligns their tool calls with explore's alignment (LCS on name +
  canonical arguments), each call marked against the expected actions; the HTML renderer
  escapes every piece of trajectory text through the viewer's one escape
  (`explore.untrusted_text.escape_html`), and its rows say "missed by B" / "extra in B"
  like the transcript viewer. The page shows the two transcripts with the viewer's
  side-by-side renderer (a shared system prompt once, folded).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trace_lib import store
from trace_lib.errors import UserInputError
from trace_lib.evaluate import floor
from trace_lib.explore.untrusted_text import escape_html as _e
from trace_lib.store import labels as store_labels
from trace_lib.store import trajectories as store_trajectories

Z95 = 1.959963984540054
MAJORITY_RULE = ("a task counts as passed when more than half of its trials passed "
                 "(a tie counts as not passed)")


# ------------------------------------------------------------------------- statistics


def wilson(k: int, n: int, z: float = Z95) -> tuple[float | None, float | None]:
    """Wilson score interval for k successes in n trials; (None, None) when n = 0."""
    if n <= 0:
        return None, None
    p = k / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def newcombe_diff(k_a: int, n_a: int, k_b: int, n_b: int
                  ) -> tuple[float | None, float | None]:
    """95% interval of p_b - p_a (Newcombe's hybrid score method, independent samples)."""
    if n_a <= 0 or n_b <= 0:
        return None, None
    pa, pb = k_a / n_a, k_b / n_b
    la, ua = wilson(k_a, n_a)
    lb, ub = wilson(k_b, n_b)
    d = pb - pa
    lo = d - math.sqrt((pb - lb) ** 2 + (ua - pa) ** 2)  # type: ignore[operator]
    hi = d + math.sqrt((ub - pb) ** 2 + (pa - la) ** 2)  # type: ignore[operator]
    return max(-1.0, lo), min(1.0, hi)


def mcnemar_exact(a_only: int, b_only: int) -> float:
    """Two-sided exact McNemar p-value on the discordant counts."""
    n = a_only + b_only
    if n == 0:
        return 1.0
    k = min(a_only, b_only)
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n
    return min(1.0, 2 * tail)


# --------------------------------------------------------------------------- datasets


@dataclass
class DatasetRef:
    """A resolved side: the dataset, and the agent model it is narrowed to (None: all)."""

    id: str
    name: str
    format: str
    agent_model: str | None = None

    @property
    def label(self) -> str:
        return self.name + (f" @ {self.agent_model}" if self.agent_model else "")


@dataclass(frozen=True)
class Side:
    """A side as a person chose it: a dataset (id or name) and optionally one agent model.
    `str(side)` is the CLI's `DATASET@AGENT_MODEL`."""

    dataset: str
    agent_model: str | None = None

    def __str__(self) -> str:
        return self.dataset + (f"@{self.agent_model}" if self.agent_model else "")


SideArg = str | Side


def _narrow(con: Any, ds: DatasetRef, agent_model: str | None) -> DatasetRef:
    """`ds` narrowed to `agent_model`'s trajectories; an agent model it lacks is an error
    that lists the ones it has."""
    if not agent_model:
        return ds
    models = store_trajectories.dataset_agent_models(con, ds.id)
    if agent_model not in {m for m, _ in models}:
        have = (", ".join(f"{m} ({n} trajectories)" for m, n in models) if models
                else "none (its trajectories record no agent model)")
        raise UserInputError(f"{ds.name}@{agent_model}: dataset {ds.name} has no trajectories "
                             f"of agent model {agent_model!r}; agent models in it: {have}")
    return DatasetRef(ds.id, ds.name, ds.format, agent_model)


def resolve_side(con: Any, ref: SideArg) -> DatasetRef:
    """A side from a `Side` or the text `DATASET[@AGENT_MODEL]` (a whole dataset name or id
    first, since names may contain "@"; else split at the first "@" whose left part is a
    dataset)."""
    if isinstance(ref, Side):
        return _narrow(con, resolve_dataset(con, ref.dataset), ref.agent_model)
    text = str(ref)
    if "@" not in text or store_trajectories.find_datasets(con, text):
        return resolve_dataset(con, text)
    for i, ch in enumerate(text):
        if ch == "@" and store_trajectories.find_datasets(con, text[:i]):
            return _narrow(con, resolve_dataset(con, text[:i]), text[i + 1:])
    return resolve_dataset(con, text.split("@", 1)[0])  # the error names the dataset part


def resolve_dataset(con: Any, ref: str) -> DatasetRef:
    """A dataset by id, else by name; unknown or ambiguous names are a clear error."""
    rows = store_trajectories.find_datasets(con, ref)
    if len(rows) == 1:
        return DatasetRef(*rows[0])
    if len(rows) > 1:
        raise UserInputError(f"dataset {ref!r}: {len(rows)} datasets have this name "
                             f"({', '.join(r[0] for r in rows)}); give the id instead")
    known = [f"{n} ({i})" for i, n in store_trajectories.recent_datasets(con, 8)]
    raise UserInputError(f"dataset {ref!r}: no dataset with this id or name; known: "
                         f"{', '.join(known) if known else 'none (import or evaluate first)'}")


def _outcomes(con: Any, ds: DatasetRef) -> list[tuple[str, str | None, bool | None]]:
    return store_trajectories.dataset_outcomes(con, ds.id, ds.agent_model)


def _provenance(con: Any, ds: DatasetRef) -> dict[str, Any]:
    row = store_trajectories.dataset_provenance(con, ds.id, ds.agent_model)
    prov = json.loads(row[2]) if row and row[2] else {}
    agent = row[0] if row and row[1] == 1 else (f"{row[1]} agent models" if row else None)
    return {"agent_model": agent, **prov}


def provenance_line(side: dict[str, Any]) -> str:
    """One readable line: the policy, what it was built from, where the data came from."""
    p = side.get("provenance") or {}
    parts = [str(p.get("policy") or p.get("agent_model") or side.get("dataset"))]
    if p.get("adapter"):
        adapter = Path(str(p["adapter"]))
        name = adapter.parent.name if adapter.name == "adapter" else adapter.name
        trained = p.get("environment")
        parts.append(f"adapter {name}" + (f" trained on {trained}" if trained else "")
                     + (f" for capability {p['capability']}" if p.get("capability") else "")
                     + (f" ({p['capability_status']} in the catalog)"
                        if p.get("capability_status") else ""))
    if p.get("moe"):
        names = ", ".join(str(a.get("name")) for a in p.get("adapters", []))
        parts.append(f"composed {Path(str(p['moe'])).name} ({p.get('moe_mode')}; {names})")
    if p.get("ranking"):
        parts.append(f"chosen from {p['ranking']}")
    if p.get("server_url"):
        parts.append(f"served at {p['server_url']}")
    if p.get("job_id"):
        parts.append(f"job {p['job_id']}")
    parts.append(f"dataset {side.get('label') or side.get('dataset')} ({side.get('format')})")
    return " · ".join(parts)


def _lacking_rates(con: Any, ds: DatasetRef) -> dict[str, tuple[int, int]]:
    """capability -> (lacking, labelled present or lacking) from effective labels."""
    rows = store_labels.dataset_lacking_counts(con, ds.id, ds.agent_model)
    return {cap: (int(k), int(n)) for cap, k, n in rows if n}


def _majority(rows: list[tuple[str, str | None, bool | None]]) -> dict[str, dict[str, Any]]:
    tasks: dict[str, dict[str, Any]] = {}
    for tid, task_id, success in rows:
        if task_id is None or success is None:
            continue
        t = tasks.setdefault(str(task_id), {"trials": 0, "successes": 0, "ids": []})
        t["trials"] += 1
        t["successes"] += int(bool(success))
        t["ids"].append(tid)
    for t in tasks.values():
        t["passed"] = t["successes"] * 2 > t["trials"]
    return tasks


def _side(con: Any, ds: DatasetRef, rows: list[tuple[str, str | None, bool | None]]
          ) -> dict[str, Any]:
    known = [r for r in rows if r[2] is not None]
    k = sum(1 for r in known if r[2])
    lo, hi = wilson(k, len(known))
    return {"dataset": ds.name, "id": ds.id, "format": ds.format,
            "agent_model": ds.agent_model, "label": ds.label, "n": len(known),
            "successes": k, "pass_rate": k / len(known) if known else None,
            "ci95": [lo, hi], "unknown_outcomes": len(rows) - len(known),
            "provenance": _provenance(con, ds)}


def _origins(con: Any, ds: DatasetRef) -> list[floor.TaskOrigin]:
    return [floor.TaskOrigin(*row)
            for row in store_trajectories.task_origins(con, ds.id, ds.agent_model)]


def _side_floor(origins: list[floor.TaskOrigin], verdicts: dict[str, bool | None],
                tasks: set[str]) -> dict[str, Any]:
    """The side's floor over its tasks with a known outcome (those its pass rate counts),
    with why it is unknown where it is."""
    out = floor.floor_summary({t: verdicts.get(t) for t in sorted(tasks)})
    out["why_unknown"] = (floor.unknown_reason([o for o in origins if o.task_id in tasks])
                          if out["unknown_tasks"] else None)
    return out


def compare_datasets(db: str | Path | None, a: SideArg, b: SideArg) -> dict[str, Any]:
    """The `compare --json` document for sides `a` and `b` (`DATASET[@AGENT_MODEL]`, ids or
    names, or `Side`s)."""
    with store.connect(db, read_only=True) as con:
        da, dbb = resolve_side(con, a), resolve_side(con, b)
        if (da.id, da.agent_model) == (dbb.id, dbb.agent_model):
            same = "run" if da.agent_model else "dataset"
            raise UserInputError(f"compare: both sides are the same {same}, {da.label} "
                                 f"({da.id}); choose two different datasets, or two agent "
                                 "models of one dataset (DATASET@AGENT_MODEL)")
        rows_a, rows_b = _outcomes(con, da), _outcomes(con, dbb)
        side_a, side_b = _side(con, da, rows_a), _side(con, dbb, rows_b)
        rates_a, rates_b = _lacking_rates(con, da), _lacking_rates(con, dbb)
        origins_a, origins_b = _origins(con, da), _origins(con, dbb)
    maj_a, maj_b = _majority(rows_a), _majority(rows_b)
    common = sorted(set(maj_a) & set(maj_b))
    if not common:
        sample_a = ", ".join(sorted(maj_a)[:3]) or "none"
        sample_b = ", ".join(sorted(maj_b)[:3]) or "none"
        raise UserInputError(
            f"compare: {da.label} and {dbb.label} have no task id in common ({len(maj_a)} "
            f"tasks, e.g. {sample_a}; {len(maj_b)} tasks, e.g. {sample_b}); a paired "
            "comparison needs runs on the same tasks")
    # The verifier on an empty episode, for the tasks the pass rates count (slow the first
    # time for runs that did not record it; memoised in `evaluate.floor`).
    verdicts_a = floor.task_verdicts(o for o in origins_a if o.task_id in maj_a)
    verdicts_b = floor.task_verdicts(o for o in origins_b if o.task_id in maj_b)
    floor_a = _side_floor(origins_a, verdicts_a, set(maj_a))
    floor_b = _side_floor(origins_b, verdicts_b, set(maj_b))

    def by_nothing(task_id: str) -> bool | None:  # the task's verdict, from either side
        va = verdicts_a.get(task_id)
        return va if va is not None else verdicts_b.get(task_id)
    counts = {"a_only": 0, "b_only": 0, "both": 0, "neither": 0}
    tasks = []
    for task_id in common:
        ta, tb = maj_a[task_id], maj_b[task_id]
        if ta["passed"] and tb["passed"]:
            flip, key = None, "both"
        elif ta["passed"]:
            flip, key = "a_only", "a_only"
        elif tb["passed"]:
            flip, key = "b_only", "b_only"
        else:
            flip, key = None, "neither"
        counts[key] += 1
        tasks.append({"task_id": task_id, "flip": flip,
                      "a_passed": ta["passed"], "a_successes": ta["successes"],
                      "a_trials": ta["trials"],
                      "b_passed": tb["passed"], "b_successes": tb["successes"],
                      "b_trials": tb["trials"],
                      "passes_by_doing_nothing": by_nothing(task_id)})
    tasks.sort(key=lambda t: (t["flip"] is None, t["task_id"]))
    capabilities = []
    for cap in sorted(set(rates_a) & set(rates_b)):
        (ka, na), (kb, nb) = rates_a[cap], rates_b[cap]
        lo, hi = newcombe_diff(ka, na, kb, nb)
        capabilities.append({"capability": cap, "a_lacking_rate": ka / na,
                             "b_lacking_rate": kb / nb, "delta": kb / nb - ka / na,
                             "ci95": [lo, hi], "a_labelled": na, "b_labelled": nb})
    notes = []
    capability_note = None if capabilities else _no_capability_why(da, rates_a, dbb, rates_b)
    for ds, rates in ((da, rates_a), (dbb, rates_b)):
        if not rates:
            notes.append(f"{ds.label} has no effective labels: run `label` on it for "
                         "capability deltas")
    for key, ds, fl in (("A", da, floor_a), ("B", dbb, floor_b)):
        if fl["unknown_tasks"]:
            which = "" if fl["status"] == "unknown" else f" on {fl['unknown_tasks']} tasks"
            notes.append(f"do-nothing floor of {key} ({ds.label}) unknown{which}: "
                         f"{fl['why_unknown']}")
    only_a, only_b = len(set(maj_a) - set(maj_b)), len(set(maj_b) - set(maj_a))
    if only_a or only_b:
        notes.append(f"{only_a} tasks only in {da.label} and {only_b} only in {dbb.label} "
                     "are left out of the pairing")
    return {
        "a": side_a,
        "b": side_b,
        "paired": {"tasks": len(common), **counts,
                   "p_value": mcnemar_exact(counts["a_only"], counts["b_only"]),
                   "test": "exact McNemar on the discordant tasks", "rule": MAJORITY_RULE,
                   "a_unpaired_tasks": only_a, "b_unpaired_tasks": only_b},
        "floor": {"a": floor_a, "b": floor_b,
                  "paired": floor.floor_summary({t: by_nothing(t) for t in common}),
                  "rule": floor.RULE},
        "capabilities": capabilities,
        "capability_note": capability_note,
        "tasks": tasks,
        "notes": notes,
    }


def _no_capability_why(da: DatasetRef, rates_a: dict[str, tuple[int, int]],
                       dbb: DatasetRef, rates_b: dict[str, tuple[int, int]]) -> str:
    """Why there is no capability delta to draw, as a sentence."""
    unlabelled = [ds.label for ds, rates in ((da, rates_a), (dbb, rates_b)) if not rates]
    if len(unlabelled) == 2:
        return ("No capability deltas: neither run has labels yet. Label both (Labels "
                "page, or `label --dataset NAME`) to see which capabilities each lacks.")
    if unlabelled:
        return (f"No capability deltas: {unlabelled[0]} has no labels yet. Label it (Labels "
                "page, or `label --dataset NAME`) to compare capabilities.")
    return ("No capability deltas: no capability is labelled present or lacking on both "
            f"sides (A: {', '.join(sorted(rates_a))}; B: {', '.join(sorted(rates_b))}).")


def default_sides(db: str | Path | None) -> tuple[Side, Side] | None:
    """Two sides that share a task with a known outcome, for a page to open on (None when
    no two do): the newest dataset as B against the newest older one it pairs with (an
    evaluation against the run it follows), else two agent models of one dataset (the
    demo's scripted agents), the newest dataset first and its agent models by name."""
    with store.connect(db, read_only=True) as con:
        rows = store_trajectories.side_task_ids(con)
        order = [i for i, _ in store_trajectories.recent_datasets(con, 1_000_000)]
    whole = {ds: set(tasks) for ds, agent, tasks in rows if agent is None}
    agents: dict[str, dict[str, set[str]]] = {}
    for ds, agent, tasks in rows:
        if agent is not None:
            agents.setdefault(ds, {})[agent] = set(tasks)
    for j, b in enumerate(order):
        for a in order[j + 1:]:
            if whole.get(a, set()) & whole.get(b, set()):
                return Side(a), Side(b)
    for ds in order:
        names = sorted(agents.get(ds, {}))
        for i, x in enumerate(names):
            for y in names[i + 1:]:
                if agents[ds][x] & agents[ds][y]:
                    return Side(ds, x), Side(ds, y)
    return None


# ------------------------------------------------------------------------ one task


@dataclass
class TaskPair:
    task_id: str
    a: Any  # transcript_model.Transcript
    b: Any
    expected: list[Any]  # transcript_model.Call
    rows: list[Any]  # AlignedRow of A's calls vs B's calls


def _representative(con: Any, ds: DatasetRef, task_id: str) -> str:
    rows = [r for r in _outcomes(con, ds) if r[1] == task_id]
    if not rows:
        raise UserInputError(f"task {task_id!r}: not in {ds.label}")
    passed = _majority(rows).get(task_id, {}).get("passed", False)
    for tid, _, success in rows:  # a trial that agrees with the side's verdict
        if bool(success) == passed:
            return tid
    return rows[0][0]


def task_pair(db: str | Path | None, a: SideArg, b: SideArg, task_id: str) -> TaskPair:
    """One task's two transcripts (a trial of each side), aligned on tool calls, with the
    expected actions."""
    from trace_lib.explore.call_alignment import align_calls
    from trace_lib.explore.transcript_loading import load_transcript

    with store.connect(db, read_only=True) as con:
        da, dbb = resolve_side(con, a), resolve_side(con, b)
        ta = load_transcript(con, _representative(con, da, task_id))
        tb = load_transcript(con, _representative(con, dbb, task_id))
    expected = ta.expected or tb.expected
    return TaskPair(task_id, ta, tb, expected, align_calls(ta.agent_calls(), tb.agent_calls()))


_ROW_STYLE = {"same": "", "args differ": "background:#fffbeb",
              "only left": "background:#fef2f2", "only right": "background:#eff6ff"}


def render_pair_html(pair: TaskPair, label_a: str = "A", label_b: str = "B") -> str:
    """A's and B's tool calls aligned row by row, each marked against the expected actions,
    with the expected actions in a column beside them. Row statuses are the transcript
    viewer's plain words ("missed by B", "extra in B")."""
    from trace_lib.explore.call_alignment import status_words

    expected_keys = {c.key for c in pair.expected}

    def cell(c: Any) -> str:
        if c is None:
            return "<td></td>"
        mark = ("✓ expected" if c.key in expected_keys else "✗ not expected") \
            if expected_keys else ""
        err = f'<div style="color:#b91c1c">error: {_e(c.error)}</div>' if c.error else ""
        args = json.dumps(c.arguments, sort_keys=True, ensure_ascii=False, default=str)
        return (f'<td style="vertical-align:top"><code>{_e(c.name)}</code> '
                f'<span style="font-size:0.8em;color:#6b7280">{_e(mark)}</span>'
                f'<pre style="white-space:pre-wrap;word-break:break-word;margin:2px 0;'
                f'font-size:0.8em">{_e(args)}</pre>{err}</td>')

    head = ('<table class="trace-compare" style="width:100%;border-collapse:collapse;'
            f'font-size:13px"><tr><th>status</th><th>{_e(label_a)}</th>'
            f"<th>{_e(label_b)}</th></tr>")
    body = "".join(
        f'<tr class="row-{_e(r.status.replace(" ", "-"))}" style="{_ROW_STYLE.get(r.status, "")};'
        f'border-top:1px solid #e5e7eb"><td style="vertical-align:top;white-space:nowrap">'
        f"{_e(status_words(r.status, 'A', 'B'))}</td>{cell(r.left)}{cell(r.right)}</tr>"
        for r in pair.rows)
    if not pair.rows:
        body = '<tr><td colspan="3">neither side made a tool call</td></tr>'
    expected = "".join(
        f"<li><code>{_e(c.name)}</code> "
        f"{_e(json.dumps(c.arguments, sort_keys=True, ensure_ascii=False, default=str))}</li>"
        for c in pair.expected) or "<li>none given</li>"
    return (f'<div class="trace-pair" data-task="{_e(pair.task_id)}" '
            f'style="display:flex;gap:16px"><div style="flex:3">{head}{body}</table></div>'
            f'<div style="flex:1;font-size:13px"><b>expected actions</b>'
            f'<ol class="trace-expected">{expected}</ol></div></div>')


def capability_delta_chart(result: dict[str, Any]) -> Any:
    """Lacking-rate change per capability (B - A) with its 95% interval: a plotly figure.
    Below zero, B lacks the capability less often than A."""
    import plotly.graph_objects as go

    caps = result.get("capabilities") or []
    fig = go.Figure()
    if not caps:
        fig.update_layout(title=result.get("capability_note")
                          or "No capability labelled on both sides", height=200)
        return fig
    names = [c["capability"] for c in caps]
    delta = [c["delta"] for c in caps]
    fig.add_bar(
        x=delta, y=names, orientation="h",
        marker_color=["#16a34a" if d < 0 else "#dc2626" for d in delta],
        error_x={"type": "data", "symmetric": False,
                 "array": [c["ci95"][1] - c["delta"] for c in caps],
                 "arrayminus": [c["delta"] - c["ci95"][0] for c in caps]},
        customdata=[[c["a_lacking_rate"], c["b_lacking_rate"]] for c in caps],
        hovertemplate="%{y}<br>lacking A %{customdata[0]:.0%} → B %{customdata[1]:.0%}"
                      "<br>delta %{x:+.0%}<extra></extra>")
    fig.add_vline(x=0, line_color="#6b7280")
    fig.update_layout(title="Lacking rate, B − A (95% interval)", xaxis_tickformat="+.0%",
                      xaxis_range=[-1, 1], height=120 + 40 * len(caps),
                      margin={"l": 10, "r": 10, "t": 40, "b": 30})
    return fig
