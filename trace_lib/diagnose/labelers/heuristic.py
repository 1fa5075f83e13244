"""The offline default labeler: deterministic rules over tool calls and expected actions.

Design decisions
- It labels the four core capabilities from things a program can check, and says `na`
  when it has no grounds (no expected actions, no writes, no tool calls). Capabilities
  it has no rule for get `na` with evidence saying so; an LLM labeler or a person
  labels those.
- Only the agent's expected actions are diffed: expected actions whose requestor is the
  user (tau2 telecom's device actions, `Transcript.expected_user`) are the user
  simulator's to take, so missing one is not the agent lacking a capability.
- The agent's calls (requestor assistant) are diffed against the benchmark's expected
  actions: an expected action is `matched` (same tool, every expected argument equal),
  `wrong_args` (same tool called, some argument differs) or `missing`. Numbers compare
  by value (1 == 1.0), everything else exactly, as tau2's action check does. The
  user's own tool calls (telecom device tools) count as done but are never blamed on
  the agent.
- Tool errors: on a write, the tool refused an action whose conditions did not hold
  (precondition_verification); on a read, only errors that say the call was malformed
  count (tool_calling_precision), since "not found" usually reflects the user's data.
- Expected actions must belong to the conversation (their ids appear in it), else the
  diff is skipped: third-party result files sometimes pair simulations with another
  task list. Look-ups with other arguments than expected are exploration, not errors.
- How a write argument went wrong decides the capability: if the wrong value was
  copied verbatim from an earlier tool output (another reservation's id, another
  payment method, another record's flights) the call referenced the wrong record
  (tool_calling_precision); if it was derived (a count, an edited passenger list) the
  agent misread or mis-combined nested fields (structured_data_reasoning).
- Writes are the domain tools that change state: everything except reads (get_,
  search_, list_, find_, check_, calculate) and the hand-off to a human. A write needs
  a prior read that shares one of its entity ids (reservation_id, order_id, user_id,
  ...): without it, or when the write is not among the expected actions at all, the
  agent did not verify preconditions.
- Writes that match no expected action, and expected writes never made, are blamed by
  what the agent had seen: it had read that record (misjudged it: structured data
  reasoning), it read another record and acted on this one (tool calling precision), or
  it never looked (precondition verification). An expected write whose record was never
  touched, or expected look-ups never made, mean it stopped early (multi-step task
  completion); evidence then points at the last agent message.
- Each wrong action is blamed on one capability, so one slip does not count four times.
- Every evidence item names a message index so the Labels page can highlight it.
"""

from __future__ import annotations

import json
import re
from typing import Any

from trace_lib.data_model import Capability
from trace_lib.diagnose.labelers.protocol import PairLabel, TrajectoryLabels
from trace_lib.transcript_model import Call, Transcript

# State-changing tools start with a verb that changes something; everything else
# (get_, search_, run_speed_test, can_send_mms, calculate, ...) only reads.
WRITE_PREFIXES = ("book_", "cancel_", "modify_", "update_", "exchange_", "return_", "send_",
                  "make_", "toggle_", "enable_", "disable_", "suspend_", "resume_", "refuel_",
                  "set_", "reset_", "add_", "remove_", "delete_", "create_", "change_", "apply_",
                  "grant_", "pay_", "refund_", "issue_", "reboot_", "submit_", "transfer_funds")
HANDOFF = ("transfer_to_human_agents", "transfer_to_human", "escalate")
CORE = ("structured_data_reasoning", "multi_step_task_completion", "precondition_verification",
        "tool_calling_precision")
FREE_TEXT_MIN = 30
# Tool errors that say the call itself was malformed (not "no such user": that is data).
MALFORMED = re.compile(r"argument|missing|required|invalid|unexpected|must be|type|format|"
                       r"unknown tool|not a valid|validation|schema", re.I)  # an expected string argument this long with spaces is prose, not data


def is_write(name: str) -> bool:
    return name.startswith(WRITE_PREFIXES) and name not in HANDOFF


def is_read(name: str) -> bool:
    return not is_write(name) and name not in HANDOFF


def _is_prose(v: Any) -> bool:
    return isinstance(v, str) and len(v) >= FREE_TEXT_MIN and " " in v


def _norm(v: Any) -> Any:
    if isinstance(v, bool) or v is None:
        return v
    if isinstance(v, int | float):
        return float(v)
    if isinstance(v, dict):
        return {k: _norm(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_norm(x) for x in v]
    return v


def _diff_keys(expected: dict[str, Any], got: dict[str, Any]) -> list[str]:
    return [k for k, v in expected.items() if not _is_prose(v) and _norm(got.get(k)) != _norm(v)]


def expected_belongs(t: Transcript) -> bool:
    """Do the expected actions belong to this conversation? Their identifying values
    (ids, emails) must appear somewhere in it; a results file whose task list does
    not match its simulations (seen in third-party tau2 submissions) fails this."""
    keys = [str(v) for c in t.expected_agent for k, v in c.arguments.items()
            if (k.endswith("_id") or k == "email") and isinstance(v, str | int)]
    if not keys:
        return True
    text = " ".join(m["content"] or "" for m in t.messages)
    if any(k in text for k in keys):  # the usual case: no need to serialise the calls
        return True
    text += " ".join(json.dumps(c.arguments) for c in t.calls)
    return any(k in text for k in keys)


def _scalars(v: Any) -> list[str]:
    """Leaf values worth searching for in tool outputs (ids, amounts, dates)."""
    if isinstance(v, dict):
        return [s for x in v.values() for s in _scalars(x)]
    if isinstance(v, list):
        return [s for x in v for s in _scalars(x)]
    if isinstance(v, bool) or v is None:
        return []
    s = str(v)
    return [s] if len(s) >= 3 else []


def _seen_before(t: Transcript, msg_idx: int, value: str) -> int | None:
    """Index of the first tool output before `msg_idx` that contains `value`."""
    for m in t.messages:
        if m["idx"] >= msg_idx:
            break
        if m["role"] == "tool" and m["content"] and value in m["content"]:
            return m["idx"]
    return None


def _ev(idx: int, text: str) -> dict[str, Any]:
    return {"message_idx": int(idx), "text": text}


class HeuristicLabeler:
    name = "heuristic"
    model = None
    concurrency = 1
    # In-process and fast (hundreds of trajectories/s): the run holds one store connection
    # and writes large Arrow batches (see labeling.py).
    fast = True

    def prompt_sha256(self, capabilities: list[Capability]) -> str | None:
        return None

    def label(self, t: Transcript, capabilities: list[Capability], *, seed: int = 0,
              n_runs: int = 1) -> TrajectoryLabels:
        diff = ActionDiff(t)
        rules = {
            "tool_calling_precision": diff.tool_calling_precision,
            "structured_data_reasoning": diff.structured_data_reasoning,
            "multi_step_task_completion": diff.multi_step_task_completion,
            "precondition_verification": diff.precondition_verification,
        }
        out = []
        for cap in capabilities:
            rule = rules.get(cap.name)
            if rule is None:  # no grounds: `na`, with no evidence to point at
                out.append(PairLabel(cap.name, "na", [], None, None))
                continue
            value, evidence = rule()
            out.append(PairLabel(cap.name, value, evidence, 1.0 if value != "na" else None))
        return TrajectoryLabels(t.id, out)


class ActionDiff:
    """The agent's calls diffed against the expected actions, computed once per trajectory."""

    def __init__(self, t: Transcript) -> None:
        self.t = t
        self.agent = [c for c in t.calls if c.requestor in (None, "assistant")]
        self.all_calls = t.calls
        self.expected_ok = expected_belongs(t)
        self.expected = ([(c.name, c.arguments) for c in t.expected_agent]
                         if self.expected_ok else [])
        self.matched: list[tuple[int, Call]] = []
        self.wrong: list[tuple[int, Call, list[str]]] = []
        self.missing: list[int] = []
        used: set[int] = set()
        for i, (name, args) in enumerate(self.expected):
            same = [c for c in self.all_calls if c.name == name and id(c) not in used]
            if not is_write(name) and not [c for c in same if not _diff_keys(args, c.arguments)]:
                # A look-up with other arguments is exploration, not an error: only
                # writes are held to their expected arguments.
                if not same:
                    self.missing.append(i)
                continue
            exact = [c for c in same if not _diff_keys(args, c.arguments)]
            if exact:
                used.add(id(exact[0]))
                self.matched.append((i, exact[0]))
            elif same:
                best = min(same, key=lambda c: len(_diff_keys(args, c.arguments)))
                used.add(id(best))
                self.wrong.append((i, best, _diff_keys(args, best.arguments)))
            else:
                self.missing.append(i)
        self.expected_names = {n for n, _ in self.expected}
        self.used = used
        self.blame: dict[str, list[dict[str, Any]]] = {
            "structured_data_reasoning": [], "tool_calling_precision": [],
            "precondition_verification": [], "multi_step_task_completion": []}

        last = [m["idx"] for m in t.messages if m["role"] == "assistant"]
        self.last_agent_idx = last[-1] if last else (t.messages[-1]["idx"] if t.messages else 0)
        self._classify_unexpected_writes()

    def _ids(self, c: Call) -> set[str]:
        return {str(v) for k, v in c.arguments.items()
                if k.endswith("_id") and "payment" not in k and isinstance(v, str | int)}

    def _looked_up(self, before_idx: int) -> tuple[set[str], set[str]]:
        """(id values the agent looked up before `before_idx`, their argument names)."""
        vals, keys = set(), set()
        for r in self.all_calls:
            if is_read(r.name) and r.message_idx < before_idx:
                for k, v in r.arguments.items():
                    vals.add(str(v))
                    keys.add(k)
        return vals, keys

    def _classify_unexpected_writes(self) -> None:
        """Blame writes that match no expected action, and expected writes never made.

        Acting on a record it had read, against the expected outcome, or reading a record
        and then not doing the required write: the agent had the data and judged it wrongly
        (structured_data_reasoning). Acting on a record it never read while it read another
        one of the same kind, with this id visible in a tool output: it took the wrong
        record (tool_calling_precision). Acting on a record it never looked at:
        precondition_verification. Never touching a required write's record at all:
        multi_step_task_completion."""
        if not self.expected:
            return
        end = 1 << 30
        for w in self.agent:
            if not is_write(w.name) or id(w) in self.used or w.error:
                continue
            ids = self._ids(w)
            looked, keys = self._looked_up(w.message_idx)
            what = f"{w.name} on {sorted(ids)} is not among the expected actions"
            if ids and ids <= looked:
                self.blame["structured_data_reasoning"].append(_ev(
                    w.message_idx, f"{what}: it read that record and misjudged it"))
            elif ids and any(k.endswith("_id") and k in keys for k in w.arguments) and all(
                    _seen_before(self.t, w.message_idx, i) is not None for i in ids):
                self.blame["tool_calling_precision"].append(_ev(
                    w.message_idx, f"{what}: it read another record and acted on this one"))
            else:
                self.blame["precondition_verification"].append(_ev(
                    w.message_idx, f"{what}: the policy's conditions for it were not checked"))
        looked_all, _ = self._looked_up(end)
        for i in self.missing:
            name, args = self.expected[i]
            if not is_write(name):
                continue
            ids = {str(v) for k, v in args.items() if k.endswith("_id") and "payment" not in k}
            if ids and ids <= looked_all:
                self.blame["structured_data_reasoning"].append(_ev(
                    self.last_agent_idx, f"read {sorted(ids)} but never made the required "
                                         f"{name}: misjudged the record"))
            else:
                self.blame["multi_step_task_completion"].append(_ev(
                    self.last_agent_idx, f"stopped ({self.t.termination or 'end'}) with the "
                                         f"expected {name} never attempted"))

    def _data_reading_keys(self, i: int, call: Call, keys: list[str]) -> list[str]:
        """Differing keys the agent got wrong by reasoning over data, not by copying.

        If every leaf value the agent sent for the key already appeared in an earlier
        tool output, it copied a field of the wrong record (an imprecise call). If the
        value is derived (a count, an edited list, anything not seen verbatim), it
        misread or mis-combined nested fields: structured data reasoning."""
        out = []
        for k in keys:
            got = _scalars(call.arguments.get(k))
            copied = bool(got) and all(
                _seen_before(self.t, call.message_idx, v) is not None for v in got)
            if not copied:
                out.append(k)
        return out

    # --------------------------------------------------------------------- rules

    def tool_calling_precision(self) -> tuple[str, list[dict[str, Any]]]:
        if not self.agent and not self.expected:
            return "na", []
        ev = []
        for c in self.agent:
            if c.error and MALFORMED.search(c.error) and not is_write(c.name):
                ev.append(_ev(c.message_idx, f"{c.name} was malformed: {c.error[:160]}"))
        for i, c, keys in self.wrong:
            if c.requestor not in (None, "assistant"):
                continue
            format_keys = [k for k in keys if k not in self._data_reading_keys(i, c, keys)]
            if format_keys:
                exp = {k: self.expected[i][1].get(k) for k in format_keys}
                got = {k: c.arguments.get(k) for k in format_keys}
                ev.append(_ev(c.message_idx, f"{c.name}: wrong argument(s) {format_keys}: "
                                             f"expected {json.dumps(exp)[:160]}, "
                                             f"got {json.dumps(got)[:160]}"))
        ev += self.blame["tool_calling_precision"]
        if ev:
            return "lacking", ev
        if not self.agent:
            return "na", []
        return "present", [_ev(self.agent[0].message_idx,
                               f"{len(self.agent)} agent call(s), none failed or mis-argued")]

    def structured_data_reasoning(self) -> tuple[str, list[dict[str, Any]]]:
        ev = []
        for i, c, keys in self.wrong:
            if c.requestor not in (None, "assistant"):
                continue
            for k in self._data_reading_keys(i, c, keys):
                want = self.expected[i][1].get(k)
                ev.append(_ev(c.message_idx, f"{c.name}.{k} = {json.dumps(c.arguments.get(k))[:120]}"
                                             f", derived wrongly from the records read; expected "
                                             f"{json.dumps(want)[:120]}"))
        ev += self.blame["structured_data_reasoning"]
        if ev:
            return "lacking", ev
        # Grounds for "present": an argument of a correct call was read out of a tool output.
        for _, c in self.matched:
            if c.requestor not in (None, "assistant"):
                continue
            for v in _scalars(c.arguments):
                src = _seen_before(self.t, c.message_idx, v)
                if src is not None:
                    return "present", [_ev(c.message_idx,
                                           f"{c.name} used {v[:60]!r} read from [{src}]")]
        return "na", []

    def multi_step_task_completion(self) -> tuple[str, list[dict[str, Any]]]:
        writes = [(i, n) for i, (n, _) in enumerate(self.expected) if is_write(n)]
        if len(self.expected) < 2:
            return "na", []
        # Expected look-ups of a specific record (by id) that never happened: the part of
        # the task that needed them was never started.
        # A record the agent wrote to without reading is a precondition problem instead.
        touched = {str(v) for c in self.all_calls for v in _scalars(c.arguments)}
        unread = [n for n, a in self.expected if is_read(n) and any(k.endswith("_id") for k in a)
                  and not any(c.name == n and not _diff_keys(a, c.arguments)
                              for c in self.all_calls)
                  and not any(str(v) in touched for k, v in a.items() if k.endswith("_id"))]
        ev = list(self.blame["multi_step_task_completion"])
        if unread:
            ev.append(_ev(self.last_agent_idx, f"stopped ({self.t.termination or 'end'}) before "
                                               f"the look-ups {', '.join(unread)}"))
        if ev:
            return "lacking", ev
        if not writes:
            return "na", []
        first = min((c.message_idx for c in self.all_calls if c.name == writes[-1][1]), default=0)
        return "present", [_ev(first, f"all {len(writes)} expected write action(s) attempted")]

    def precondition_verification(self) -> tuple[str, list[dict[str, Any]]]:
        writes = [c for c in self.agent if is_write(c.name)]
        if not writes:
            return "na", []
        reads = [c for c in self.all_calls if is_read(c.name)]
        ev = []
        # A write with a wrong argument is blamed once, on the capability that explains
        # the wrong argument; its refusal or missing look-up follows from that.
        wrong_calls = {id(c) for _, c, _ in self.wrong}
        for w in writes:
            if id(w) in wrong_calls:
                continue
            if self.expected and id(w) not in self.used and not w.error:
                continue  # an unexpected write: `_classify_unexpected_writes` blamed it
            if w.error:
                ev.append(_ev(w.message_idx, f"{w.name} was refused: {w.error[:160]}"))
                continue
            ids = {str(v) for k, v in w.arguments.items()
                   if k.endswith("_id") and "payment" not in k and isinstance(v, str | int)}
            if ids:
                prior = [r for r in reads if r.message_idx < w.message_idx
                         and ids & {str(v) for v in r.arguments.values()}]
                if not prior:
                    ev.append(_ev(w.message_idx, f"{w.name} on {sorted(ids)} without an earlier "
                                                 "look-up of that record"))
                    continue
        ev += [e for e in self.blame["precondition_verification"]
               if e["message_idx"] not in {x["message_idx"] for x in ev}]
        if ev:
            return "lacking", ev
        return "present", [_ev(writes[0].message_idx,
                               f"{len(writes)} write(s), each after a look-up of its record")]
