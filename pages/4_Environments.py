"""Environments: list, inspect, play, validate, calibrate, approve; generate new ones.

Thin page: every action is a use case of `trace_lib.workbench.environments` that a CLI
verb also calls (`env list|sample|play|validate|calibrate|approve|reject|generate`).
Generated code runs only in the sandbox (the use cases decide); environment text is shown
with st.code/st.text/st.json, which escape, never as markdown or HTML. A tool's result in
the Play tab is indented when it is JSON (the transcript viewer's `pretty_output`) and
wraps inside the page (a one-line JSON result ran off it); a long one scrolls in its box.
"""

from __future__ import annotations

import json

import pandas as pd
import streamlit as st

from trace_lib.workbench import data, explore
from trace_lib.workbench import environments as envs
from trace_lib.workbench.environments import DIFFICULTIES, SandboxError
from trace_lib.workbench.errors import ActionError, StoreError, UserInputError

st.set_page_config(page_title="Environments · TRACE", page_icon="🧭", layout="wide")
st.title("Environments")
st.caption("One environment per capability: seeded instances, the domain's own tools, rewards "
           "from code. Validate, calibrate and approve before training; only approved "
           "environments can be trained on.")

DB = data.db_path()
OUTPUT_LINES, OUTPUT_HEIGHT = 24, 420  # a tool result longer than this scrolls in its box


def _progress_cb(bar):
    return lambda done, total: bar.progress(done / max(1, total), text=f"{done}/{total}")


# ------------------------------------------------------------------ generate (sidebar)
with st.sidebar:
    st.header("Generate an environment")
    with st.form("generate"):
        gen_cap = st.selectbox("Capability", envs.capability_names(), key="gen_cap")
        gen_domain = st.selectbox("Domain", envs.domain_names(), key="gen_domain")
        gen_kind = st.radio("Generator", ["template", "llm"], key="gen_kind", horizontal=True,
                            help="template: offline, parameterises the built-in task builder; "
                                 "llm: an LLM writes the module (API key from the environment)")
        gen_provider = st.selectbox("LLM provider", ["anthropic", "openai"], key="gen_provider")
        gen_model = st.text_input("Model", key="gen_model")
        gen_url = st.text_input("Base URL (OpenAI-compatible)", key="gen_url")
        gen_attempts = st.number_input("Attempts", 1, 10, 3, key="gen_attempts")
        gen_seeds = st.number_input("Validation seeds", 5, 200, 50, key="gen_seeds")
        generate_clicked = st.form_submit_button("Generate and validate")
    if generate_clicked:
        with st.status("Generating…", expanded=True) as status:
            try:
                result = envs.generate(
                    gen_cap, gen_domain, generator=gen_kind, provider=gen_provider,
                    model=gen_model or None, base_url=gen_url or None,
                    attempts=int(gen_attempts), seeds=int(gen_seeds), db=DB,
                    progress=st.write)
            except ActionError as exc:
                status.update(label="Generation failed", state="error")
                st.code(str(exc), language=None)
            else:
                state = "complete" if result["status"] == "validated" else "error"
                status.update(label=f"{result['name']}: {result['status']}", state=state)
                st.session_state["env_name"] = result["name"]
                for h in result["history"]:
                    st.text(f"attempt {h['attempt']}: {h['status']}")
                    for err in h["errors"]:
                        st.code(err, language=None)

# ----------------------------------------------------------------------------- list
try:
    rows = envs.list_environments(db=DB)
except StoreError as exc:
    st.error("Could not read the environments:")
    st.code(str(exc), language=None)
    st.stop()

table = pd.DataFrame([{k: r[k] for k in ("name", "capability", "domain", "version", "source",
                                         "status", "calibration_mean_reward")} for r in rows])
st.dataframe(table, hide_index=True, width="stretch")
names = [r["name"] for r in rows]
if not names:
    st.info("No environments: the domain packages are not importable.")
    st.stop()
if st.session_state.get("env_name") not in names:
    st.session_state["env_name"] = names[0]
name = st.selectbox("Environment", names, key="env_name")
info = envs.detail(name, db=DB)
spec, report = info["spec"], info["report"]
row = {"status": info["status"]}
st.subheader(f"{envs.STATUS_ICONS.get(row['status'], '')} {name}")
st.caption(f"capability {spec.capability} · domain {spec.domain} · v{spec.version} · "
           f"{spec.source} · status {row['status']}")
build = {}
if spec.source == "builtin":  # how the prompt is built: what training will show the model
    o1, o2, o3, o4 = st.columns(4)
    build = {"tools": o1.selectbox("Tools", ["all", "capability"], key="build_tools"),
             "policy": o2.selectbox("Policy", ["full", "excerpt"], key="build_policy"),
             "difficulty": o3.selectbox("Difficulty", list(DIFFICULTIES), index=1,
                                        key="build_difficulty"),
             "distractors": int(o4.number_input("Distractor tools (with capability tools)",
                                                0, 100, 2, key="build_distractors"))}


def _session_env():
    """The environment being inspected/played, kept across reruns; sandboxed if generated."""
    held = st.session_state.get("live_env")
    if held and held["name"] == name and held["sha"] == spec.code_sha256 \
            and held.get("build") == build:
        return held["env"]
    if held and hasattr(held["env"], "close"):
        held["env"].close()
    env = envs.start_environment(spec, build)
    seed = int(st.session_state.get("seed", 0))
    env.reset(seed)
    st.session_state["live_env"] = {"name": name, "sha": spec.code_sha256, "env": env,
                                    "seed": seed, "transcript": [], "build": dict(build)}
    return env


tab_report, tab_code, tab_tools, tab_instance, tab_play, tab_cal, tab_review = st.tabs(
    ["Validation", "Code", "Tool schemas", "Instance", "Play", "Calibration", "Review"])

# ----------------------------------------------------------------------- validation
with tab_report:
    validation = report.get("validation")
    seeds = st.number_input("Seeds", 5, 500, 50, key="val_seeds")
    if st.button("Validate", key="validate"):
        bar = st.progress(0.0, text="validating")
        with st.spinner("running reference and trivial policies"):
            validation = envs.validate(name, n_seeds=int(seeds), db=DB, options=build,
                                       progress=_progress_cb(bar))
        held = st.session_state.pop("live_env", None)
        if held and hasattr(held["env"], "close"):
            held["env"].close()  # a sandboxed module: end its worker now, not at GC
        st.rerun()
    if validation:
        st.metric("Validation", validation["status"])
        checks = pd.DataFrame([
            {"check": k, "passed": v.get("passed"), "figure": json.dumps(v.get("figure")),
             "threshold": str(v.get("threshold"))}
            for k, v in validation.get("checks", {}).items()])
        st.dataframe(checks, hide_index=True, width="stretch")
        for err in validation.get("errors", []):
            st.code(err, language=None)
        with st.expander("Full report"):
            st.json(validation)
    else:
        st.info("Not validated yet.")

# ----------------------------------------------------------------------------- code
with tab_code:
    st.caption("Generated module" if spec.code else
               "Built-in task builders of this capability (trace_lib.envs.capabilities)")
    st.code(info["code"], language="python", line_numbers=True)
    for att in info["attempts"]:
        with st.expander(f"attempt {att['attempt']}: {att['status']} "
                         f"({att['generator']}, sha {str(att['code_sha256'])[:10]})"):
            for err in att["report"].get("errors", []):
                st.code(err, language=None)
            st.code(att["code"] or "", language="python")

# ----------------------------------------------------------------------- tool schemas
try:
    live = _session_env()
    tools = live.tool_schemas
except SandboxError as exc:
    live, tools = None, []
    st.error("The environment could not be started in the sandbox:")
    st.code(str(exc), language=None)

with tab_tools:
    if live is not None:
        diff = envs.schema_diff(tools, spec.domain)
        if diff["identical"]:
            st.success(f"Identical to the {spec.domain} domain's {len(tools)} tool schemas.")
        st.dataframe(pd.DataFrame([{"tool": t["tool"], "ok": t["ok"],
                                    "problems": "; ".join(t["problems"])}
                                   for t in diff["tools"]]), hide_index=True)
        if diff["diff"]:
            st.code(diff["diff"], language="diff")

# ------------------------------------------------------------------- instance + play
seed = st.session_state.get("seed", 0)
if live is not None:
    held = st.session_state["live_env"]
    if held.get("seed") != seed:
        live.reset(int(seed))
        held["seed"] = seed
        held["transcript"] = []

with tab_instance:
    st.number_input("Seed", 0, 10**9, key="seed")
    if live is not None:
        st.markdown("**User request**")
        st.text(live.messages[-1]["content"] if live.messages else "")
        with st.expander("System prompt"):
            st.text(live.system_prompt)
        if live.hint:
            st.markdown("**Hint** (added to a share of training rollouts)")
            st.text(live.hint)
        if st.toggle("Show ground truth", key="show_truth"):
            st.json(getattr(live, "ground_truth", None) or {})

with tab_play:
    if live is not None:
        held = st.session_state["live_env"]
        st.caption('One action at a time: {"name": TOOL, "arguments": {...}} for a tool call, '
                   '{"content": "..."} for the final reply (ends the episode).')
        action = st.text_area("Action (JSON)", key="action", height=90)
        c1, c2, c3 = st.columns(3)
        if c1.button("Send", key="send", disabled=live.done):
            try:
                parsed = json.loads(action)
            except json.JSONDecodeError as exc:
                st.error(f"Not JSON: {exc}")
            else:
                held["transcript"].append({"action": parsed, "observation": live.step(parsed)})
        if c2.button("Reference step", key="ref_step", disabled=live.done):
            ref = live.reference_action()
            held["transcript"].append({"action": ref, "observation": live.step(ref)})
        if c3.button("Restart", key="restart"):
            live.reset(int(seed))
            held["transcript"] = []
        for i, t in enumerate(held["transcript"]):
            st.text(f"[{i + 1}] {json.dumps(t['action'])}")
            shown, is_json = explore.transcript_render.pretty_output(t["observation"])
            st.code(shown, language="json" if is_json else None, wrap_lines=True,
                    height=OUTPUT_HEIGHT if shown.count("\n") > OUTPUT_LINES else "content")
        if live.done:
            summary = live.summary()
            # The outcome is a word in its colour, not a delta arrow: a failed episode
            # must not show a green "↑".
            st.metric("Reward", f"{summary['reward']:.3f}",
                      delta="passed" if summary["passed"] else "failed",
                      delta_color="green" if summary["passed"] else "red", delta_arrow="off")
            for reason in summary["reasons"]:
                st.text(f"• {reason}")

# ------------------------------------------------------------------------ calibration
with tab_cal:
    with st.form("calibrate"):
        policy = st.text_input("Policy", "epsilon:0.5", key="cal_policy",
                               help="reference | random | epsilon:P | openai:MODEL@URL | URL#MODEL")
        cal_seeds = st.number_input("Seeds", 1, 1000, 20, key="cal_seeds")
        cal_group = st.number_input("Group size", 1, 64, 8, key="cal_group")
        run_cal = st.form_submit_button("Calibrate")
    if run_cal and live is not None:
        bar = st.progress(0.0, text="rolling out")
        try:
            result = envs.calibrate(name, policy, options=build, seeds=int(cal_seeds),
                                    group=int(cal_group),
                                    db=DB, progress=_progress_cb(bar), env=live)
        except (UserInputError, SandboxError) as exc:
            st.code(str(exc), language=None)
        else:
            report["calibration"] = result
            held = st.session_state["live_env"]
            held["seed"] = None  # calibration reset the env: re-show the chosen seed
    cal = report.get("calibration")
    if cal:
        verdict = "in the target band" if cal["in_band"] else "outside the target band"
        st.metric("Mean reward", f"{cal['mean_reward']:.3f}", delta=verdict,
                  delta_color="normal" if cal["in_band"] else "inverse")
        for miss in cal.get("band_misses", []):
            st.text(f"• {miss}")
        cols = st.columns(3)
        for col, fig in zip(cols, envs.calibration_figures(cal), strict=True):
            col.plotly_chart(fig, width="stretch")
    else:
        st.info("No calibration yet.")

# ----------------------------------------------------------------------------- review
with tab_review:
    st.write(f"Status: **{row['status']}**. Only approved environments can be trained on; "
             "approving needs a passing validation.")
    note = st.text_input("Note", key="review_note")
    r1, r2 = st.columns(2)
    if r1.button("Approve", key="approve", disabled=row["status"] not in ("validated",)):
        envs.approve(name, note=note, db=DB)
        st.rerun()
    if r2.button("Reject", key="reject", disabled=row["status"] == "rejected"):
        envs.reject(name, note=note, db=DB)
        st.rerun()
    if report.get("review"):
        st.json(report["review"])
