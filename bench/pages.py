"""Page settle times in a real browser: `streamlit run` + headless Chromium (Playwright).

    nice -n 10 python bench/pages.py [--sizes 10000,100000] [--runs 1] [--repeats 2]
                                     [--stores DIR]

For each size the bench builds its own store (or reuses it from `--stores DIR`):
bench/ingest.py's synthetic OpenAI-messages file (`write_dataset`: 4 domains, one tool
call each, ~10% tool errors) imported with `ingest_paths` (the real importer: derived
columns and the full-text index included) in a child process as bench/ingest.py measures
one (its CPU and peak memory kept with the store's build figures) and finished as an import finishes (the
Trajectories page's unfiltered view stored, `overview_stored.store_default`, issue 35),
then `--runs` finished label runs over the
built-in capabilities (lacking more often on failures, as bench/rank.py draws them),
finished as a label run finishes: the materialised labels brought up to date and the
Rankings page's default view stored (`rank_precompute.store_default`, issue 35; both
also done to a reused store that lacks them, and their seconds printed). One server serves it,
started the way `make demo` starts it (`python -m trace_lib app`).

What is timed (each visit in a fresh browser context, median of `--repeats`):
- navigation to settled for Trajectories, Labels and Rankings: from `page.goto` to the
  end of the script run it triggered, read from the `data-test-script-state` attribute
  Streamlit puts on `.stApp` (a MutationObserver records each transition with
  `performance.now()`); the first visit after the server started is reported apart
  ("cold": every cache empty), then warm visits;
- "drawn": the same until every plotly chart has drawn its SVG and every table its
  canvas and the browser's main thread is idle (plotly draws after the run ended); each
  action starts on a drawn page;
- on Trajectories: a filter change (Outcome), a text search (words mode, the index) and
  the same text as an exact substring (the scan), each from the action's key or pointer
  press in the page to the end of the rerun it triggered; each repeat picks an outcome and
  a text no earlier repeat picked (the server caches results for every session, so the
  same action again would time a cache hit); the steps marked "(cached)" go back to one;
- on Rankings: a slider move (one key press on rho: a value no earlier repeat ranked);
- the server process's CPU time (user + system from /proc) over each measurement;
- "script run": the last script run's own time (its `running` to `notRunning` in the
  page), the server's part of a step plus the browser's handling of its messages; the
  rest of "settle" is the browser's and the widget's (page load and websocket on a visit).

Every step's medians are also written to `--out` (bench/results/pages.json): one row per
(size, label runs, page, step) with `settle_s`, `drawn_s`, `server_cpu_s`, `script_s`
(null past the step limit, `over_limit` true) and `kind` (`first_visit`, `visit`,
`action`), beside the store's size on disk and the source file's, per trajectory, and the
store's build time (kept in `<store>.build.json`, so a reused store still reports how
long it took to build). A row replaces the one of the same key; other sizes stay.

Nothing here is a pass/fail threshold; the figures go into bench/README.md ("Pages").
The query-level before/after of the same paths (old subquery scan vs index, computed vs
derived columns) is bench/explore.py's `--paths` part: the page can only run the new one.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
PAGES = ("Trajectories", "Labels", "Rankings")
TIMEOUT_MS = 600_000  # per step; a step past it is reported as "> limit", not retried

# Records every change of the script-run state with its time (ms since navigation start).
# The observer watches the whole document (subtree), not one element: React may re-create
# the `.stApp` node, and an observer on the old node would miss every later run.
OBSERVER = """
window.__runs = [];
const note = () => {
  const app = document.querySelector('[data-testid="stApp"]');
  const state = app && app.getAttribute('data-test-script-state');
  const r = window.__runs;
  if (state && (r.length === 0 || r[r.length - 1][0] !== state)) {
    r.push([state, performance.now()]);
  }
};
new MutationObserver(note).observe(document, {subtree: true, childList: true,
    attributes: true, attributeFilter: ['data-test-script-state']});
// The user's inputs as the page saw them: an action's time starts at its last key or
// pointer press, not when Playwright was asked to act (locating the element, its
// actionability checks and the round trips cost 0.3-1 s on this box).
window.__inputs = [];
for (const kind of ['pointerdown', 'keydown']) {
  document.addEventListener(kind, () => window.__inputs.push(performance.now()), true);
}
"""
# Settled: a run started after `since` and the state is back to notRunning. Returns
# [start of the last script run, its end]: the time before the start is the browser's and
# the widget's (page load, websocket, a slider's commit), the run itself is the server's.
SETTLED = """(since) => {
  const r = window.__runs || [];
  const started = r.findIndex(([s, t]) => s === 'running' && t >= since);
  if (started < 0) return null;
  const last = r[r.length - 1];
  if (last[0] !== 'notRunning' || r.length - 1 <= started) return null;
  return [r[r.length - 2][1], last[1]];
}"""

# Drawn: after the script run, every plotly chart has drawn its SVG and every table its
# canvas, then the browser's main thread is idle (requestIdleCallback). Plotly draws after
# the run has ended (its bundle loads on first use, each chart renders in JS); a person sees
# the page when this resolves, and an action taken before it waits for the main thread.
DRAWN = """async () => {
  const done = () => {
    const charts = [...document.querySelectorAll('[data-testid="stPlotlyChart"]')];
    const tables = [...document.querySelectorAll('[data-testid="stDataFrame"]')];
    return charts.every(c => c.querySelector('.main-svg'))
        && tables.every(t => t.querySelector('canvas'));
  };
  while (!done()) await new Promise(r => setTimeout(r, 20));
  await new Promise(r => requestIdleCallback(r, {timeout: 10000}));
  return performance.now();
}"""


def _bench_module(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", REPO / "bench" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def build(db: Path, n: int, runs: int) -> float:
    """The store for one size; returns the import's wall seconds."""
    from trace_lib import store
    from trace_lib.diagnose import materialise
    from trace_lib.diagnose.capability_curation import BUILTIN, ensure_builtin

    data = db.with_suffix(".jsonl")
    ingest = _bench_module("ingest")
    ingest.write_dataset(data, n)
    source_bytes = data.stat().st_size
    t0 = time.perf_counter()
    # In a child process, as bench/ingest.py measures an import: its CPU and peak memory
    # are the import's own (this size's row of the import figures, issue 35).
    measured = ingest.measure("ingest", data, db)
    took = time.perf_counter() - t0
    overview_s = store_explore_view(db)
    data.unlink()
    caps = [b.name for b in BUILTIN]
    with store.connect(db) as con:
        ensure_builtin(con)
        con.execute("SELECT setseed(0.42)")
        for r in range(runs):
            con.execute("INSERT INTO label_runs (id, labeler, finished_at, status) "
                        "VALUES (?, 'bench', now(), 'finished')", [f"r{r}"])
        con.execute(f"""
            INSERT INTO labels (run_id, trajectory_id, capability, value)
            SELECT 'r' || r.i, t.id, c.name,
                   CASE WHEN random() < CASE WHEN c.k < 4 AND NOT t.success THEN 0.5 ELSE 0.15
                        END THEN 'lacking' WHEN random() < 0.3 THEN 'na' ELSE 'present' END
            FROM trajectories t, range({runs}) r(i),
                 (SELECT unnest(?::VARCHAR[]) AS name,
                         generate_subscripts(?::VARCHAR[], 1) - 1 AS k) c
        """, [caps, caps])
        # A labeling run adds itself to the materialised label tables when it finishes;
        # these runs were written by SQL, so do that here, or the first page visit would
        # time the one-off rebuild instead of the page.
        materialise.sync(con)
        con.execute("CHECKPOINT")
    precompute_s = store_rank_view(db)
    _build_record(db).write_text(json.dumps({
        "trajectories": n, "label_runs": runs, "import_wall_s": round(took, 1),
        "import_cpu_s": round(measured["cpu"], 1), "import_peak_mib": round(measured["peak_mib"]),
        "build_wall_s": round(time.perf_counter() - t0, 1), "source_bytes": source_bytes,
        "rank_precompute_s": precompute_s, "explore_overview_s": overview_s,
        "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}, indent=2))
    return took


def store_rank_view(db: Path) -> float | None:
    """What a label run's finish does after the materialised labels (issue 35): compute and
    store the Rankings page's default view's threshold-free parts (bootstrap stability,
    failure clusters). A store reused from before that finish stored them gets them here,
    so the first visit times the page. Returns the seconds it took (None: already there)."""
    from trace_lib import store
    from trace_lib.diagnose import rank_precompute

    with store.connect(db) as con:
        t0 = time.perf_counter()
        done = rank_precompute.store_default(con)
        took = time.perf_counter() - t0
        con.execute("CHECKPOINT")
    if set(done.values()) <= {"stored"}:
        return None
    print(f"  stored the Rankings default view at the label runs' finish: {took:.1f} s "
          f"({done})", flush=True)
    return round(took, 2)


def store_explore_view(db: Path) -> float | None:
    """What an import's finish does (`workbench.data.import_files`, issue 35): compute
    and store the Trajectories page's unfiltered view and the filters' rollup
    (`explore.overview_rollup`). A store reused from before imports
    stored it gets it here, so the first visit times the page. Returns the seconds it
    took (None: already there)."""
    from trace_lib import store
    from trace_lib.explore import overview_stored

    with store.connect(db) as con:
        t0 = time.perf_counter()
        done = overview_stored.store_default(con)
        took = time.perf_counter() - t0
        con.execute("CHECKPOINT")
    if done == "stored":
        return None
    print(f"  stored the Trajectories page's unfiltered view at the import's finish: "
          f"{took:.1f} s", flush=True)
    return round(took, 2)


def _build_record(db: Path) -> Path:
    """The store's build figures, beside it (a reused store keeps them); the same file
    for the store and its `.part` while it builds."""
    return db.with_name(db.name.replace(".part.duckdb", ".duckdb") + ".build.json")


def _store_bytes(db: Path) -> int:
    from trace_lib.store.search import index_path

    side = index_path(db)
    return db.stat().st_size + (side.stat().st_size if side.exists() else 0)


def _kind(step: str) -> str:
    return ("first_visit" if "first visit" in step else
            "visit" if step.startswith("visit") else "action")


def _commit() -> str | None:
    """The checkout's commit (with `+` when its tracked files differ from it)."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO,
                              capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "diff", "--quiet", "HEAD"], cwd=REPO).returncode
        return head + ("+" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return None


def json_rows(n: int, runs: int, db: Path, steps: dict[str, Step]) -> list[dict]:
    """pages.json rows of one store's medians (see the module docstring)."""
    built = json.loads(_build_record(db).read_text()) if _build_record(db).exists() else {}
    size = _store_bytes(db)
    common = {"size": n, "runs": runs, "store_bytes": size,
              "store_bytes_per_trajectory": round(size / n, 1),
              "source_bytes_per_trajectory": round(built["source_bytes"] / n, 1)
              if built.get("source_bytes") else None,
              "build_wall_s": built.get("build_wall_s"),
              "import_wall_s": built.get("import_wall_s"),
              "import_cpu_s": built.get("import_cpu_s"),
              "import_peak_mib": built.get("import_peak_mib"),
              "load_average": round(os.getloadavg()[0], 2),
              "commit": _commit(),
              "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    def sec(x: float) -> float | None:  # past the step limit: no figure
        return None if x == float("inf") else round(x, 3)

    rows = []
    for key, (settle, drawn, cpu, script) in steps.items():
        page, _, step = key.partition(": ")
        rows.append({**common, "page": page, "step": step, "kind": _kind(step),
                     "settle_s": sec(settle), "drawn_s": sec(drawn),
                     "server_cpu_s": round(cpu, 3), "script_s": sec(script),
                     "over_limit": settle == float("inf")})
    return rows


def save_rows(out: Path, rows: list[dict]) -> None:
    """Merge `rows` into `out`: a row replaces the one of the same (size, runs, page,
    step); every other row stays."""
    key = ("size", "runs", "page", "step")
    doc = json.loads(out.read_text()) if out.exists() else {"rows": []}
    new = {tuple(r[k] for k in key) for r in rows}
    doc["rows"] = [r for r in doc["rows"] if tuple(r[k] for k in key) not in new] + rows
    doc["rows"].sort(key=lambda r: (r["size"], r["runs"], r["page"], r["kind"], r["step"]))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")


class Server:
    def __init__(self, db: Path, log: Path):
        port = _free_port()
        env = {**os.environ, "TRACE_DB": str(db), "HF_HUB_OFFLINE": "1",
               "STREAMLIT_BROWSER_GATHER_USAGE_STATS": "false"}
        self.url = f"http://127.0.0.1:{port}"
        self.log = log
        with open(log, "wb") as fh:
            # The way `make demo` starts it: the `app` verb (libraries preloaded).
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "trace_lib", "app", "--port", str(port), "--",
                 "--server.headless", "true", "--server.fileWatcherType", "none",
                 "--browser.gatherUsageStats", "false"],
                cwd=REPO, env=env, stdout=fh, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and self.proc.poll() is None:
            try:
                with urllib.request.urlopen(self.url + "/_stcore/health", timeout=2):
                    return
            except OSError:
                time.sleep(0.3)  # polling a starting server, not synchronising a test
        self.stop()
        raise RuntimeError(f"streamlit did not start:\n{log.read_text()[-3000:]}")

    def cpu_s(self) -> float:
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _settle(page, since: float) -> tuple[float, float]:
    """(start, end) on the page clock (ms) of the last script run after `since`, once the
    app is idle again; (inf, inf) past the limit."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    try:
        handle = page.wait_for_function(SETTLED, arg=since, timeout=TIMEOUT_MS, polling=100)
    except PlaywrightTimeout:
        return float("inf"), float("inf")
    start, end = handle.json_value()
    return float(start), float(end)


# (seconds to the end of the script run, seconds to drawn, server CPU seconds, script run s)
Step = tuple[float, float, float, float]
FIELDS = ("settle", "drawn", "server CPU", "script run")


def _drawn(page) -> float:
    """performance.now() once the page is drawn and idle (see DRAWN)."""
    return float(page.evaluate(DRAWN))


def navigate(browser, server: Server, name: str) -> tuple[Step, object]:
    """(the step's figures, the open page) for one fresh visit."""
    ctx = browser.new_context(viewport={"width": 1500, "height": 1000})
    ctx.add_init_script(OBSERVER)
    page = ctx.new_page()
    page.set_default_timeout(TIMEOUT_MS)  # clicks wait for the widget as long as a settle
    cpu0 = server.cpu_s()
    page.goto(f"{server.url}/{name}", timeout=TIMEOUT_MS)
    start, end = _settle(page, 0.0)  # performance.now() counts from navigation start
    drawn = _drawn(page) if end != float("inf") else end
    return (end / 1000, drawn / 1000, server.cpu_s() - cpu0, (end - start) / 1000), page


def act(page, server: Server, action) -> Step:
    """(seconds from the action's last key or pointer press in the page to the end of its
    rerun, to drawn, server CPU, script run). The action starts on a drawn, idle page (the
    previous step waited for it)."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    inf = float("inf")
    since = page.evaluate("performance.now()")
    cpu0 = server.cpu_s()
    try:
        action(page)
    except PlaywrightTimeout:
        return inf, inf, server.cpu_s() - cpu0, inf
    start, end = _settle(page, since)
    drawn = _drawn(page) if end != inf else inf
    pressed = [t for t in page.evaluate("window.__inputs") if since <= t <= start]
    since = pressed[-1] if pressed else since
    return ((end - since) / 1000, (drawn - since) / 1000, server.cpu_s() - cpu0,
            (end - start) / 1000)


# Each repeat's actions choose what no earlier repeat chose: the pages cache results per
# (store version, inputs) for every session of the server, so a repeat of the same action
# would time a cache hit. (The "clear the text" steps go back to a cached result.)
OUTCOMES = ("failures", "successes", "unknown", "errors")
TEXTS = ("not found", "request done", "user id", "help order")
SLIDER_KEYS = ("ArrowRight", "ArrowLeft", "Home", "End")


def _outcome(choice: str):
    def run(page) -> None:
        side = page.get_by_test_id("stSidebar")
        side.get_by_test_id("stRadio").first.get_by_text(choice, exact=True).click()
    return run


def _search(text: str):
    def run(page) -> None:
        field = page.get_by_test_id("stSidebar").get_by_role("textbox", name="Text contains")
        field.fill(text)
        field.press("Enter")
    return run


def _exact_mode(page) -> None:
    """Toggle "Exact substring": its own step, so that each timed action triggers exactly
    one rerun (a settle after the toggle's rerun would end the search's timing early)."""
    box = page.get_by_test_id("stSidebar").get_by_test_id("stCheckbox").filter(
        has_text="Exact substring")
    box.locator("label").click()


def _slider_key(key: str):
    """One key press on the Rankings page's first slider (rho): +0.01, -0.01, 0 or 1 from
    the default, a configuration no earlier repeat ranked, so the rerun really ranks."""
    def run(page) -> None:
        thumb = page.get_by_test_id("stSidebar").get_by_role("slider").first
        thumb.focus()
        thumb.press(key)
    return run


def _clear_search(page) -> None:
    field = page.get_by_test_id("stSidebar").get_by_role("textbox", name="Text contains")
    field.fill("")
    field.press("Enter")


def _report(out: dict, key: str, value: Step) -> None:
    out.setdefault(key, []).append(value)
    print(f"    {key:<55} {_fmt(value[0])}   drawn {_fmt(value[1])}   "
          f"server CPU {value[2]:6.2f} s   script run {_fmt(value[3])}", flush=True)


def _fmt(seconds: float) -> str:
    return f"> {TIMEOUT_MS / 1000:.0f} s" if seconds == float("inf") else f"{seconds:.2f} s"


def measure(server: Server, repeats: int, pages: tuple[str, ...]) -> dict[str, Step]:
    from playwright.sync_api import sync_playwright

    out: dict[str, list[Step]] = {}
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True,
                                     args=CHROMIUM_ARGS)
        for name in pages:  # the first visit of each page after the server started
            step, page = navigate(browser, server, name)
            _report(out, f"{name}: first visit (cold caches)", step)
            page.context.close()
        for r in range(repeats):
            outcome, text = OUTCOMES[r % len(OUTCOMES)], TEXTS[r % len(TEXTS)]
            for name in pages:
                step, page = navigate(browser, server, name)
                s = step[0]
                _report(out, f"{name}: visit (warm)", step)
                if name == "Trajectories" and s != float("inf"):
                    steps = [("filter change (outcome, a new one)", _outcome(outcome)),
                             ("text search, words (index)", _search(text)),
                             ("clear the text (cached)", _clear_search),
                             ("exact-substring mode on", _exact_mode),
                             ("text search, exact substring (scan)", _search(text)),
                             ("clear the text (cached)", _clear_search),
                             ("exact-substring mode off (cached)", _exact_mode)]
                    for label, action in steps:
                        _report(out, f"Trajectories: {label}", act(page, server, action))
                if name == "Rankings" and s != float("inf"):
                    _report(out, "Rankings: slider move (rho, a new value: re-rank)",
                            act(page, server, _slider_key(SLIDER_KEYS[r % len(SLIDER_KEYS)])))
                page.context.close()
        browser.close()
    return {k: tuple(statistics.median(x[i] for x in v) for i in range(len(FIELDS)))
            for k, v in out.items()}


def _open_tab(name: str):
    def run(page) -> None:
        page.get_by_role("tab", name=name, exact=True).click()
    return run


def measure_embed(tmp: Path, wait_for_warmup: bool) -> dict[str, Step]:
    """The semantic map on the demo store (300 trajectories, its failures not embedded yet),
    on a fresh server: open the Semantic clusters tab (it starts the encoder's background
    warm-up), then press "Embed N trajectories", at once or once the warm-up is done, and
    time it to the map drawn (the press embeds, stores the vectors and reruns)."""
    from playwright.sync_api import sync_playwright

    from trace_lib.workbench import data

    db = tmp / f"embed-{int(wait_for_warmup)}.duckdb"
    data.build_demo(tmp / "demo", db=db, progress=False)
    server = Server(db, tmp / "streamlit-embed.log")
    out: dict[str, list[Step]] = {}
    when = "after the warm-up" if wait_for_warmup else "at once"
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True,
                                         args=CHROMIUM_ARGS)
            step, page = navigate(browser, server, "Trajectories")
            _report(out, "Trajectories: first visit (cold caches)", step)
            _report(out, "Semantic clusters tab opened", act(page, server,
                                                             _open_tab("Semantic clusters")))
            button = page.get_by_role("button", name="Embed ")
            label = button.inner_text()
            deadline = time.monotonic() + TIMEOUT_MS / 1000
            while wait_for_warmup and time.monotonic() < deadline:
                # the progress bar is drawn by a run, so look again with a fresh run
                time.sleep(1.0)
                page.reload()  # a new session: the Charts tab again
                _settle(page, 0.0)
                act(page, server, _open_tab("Semantic clusters"))
                if not page.get_by_text("Preparing the encoder").count():
                    break
            button = page.get_by_role("button", name="Embed ")
            since = page.evaluate("performance.now()")
            cpu0 = server.cpu_s()
            button.click()
            chart = page.locator('[data-testid="stPlotlyChart"] .main-svg').first
            chart.wait_for(timeout=TIMEOUT_MS)
            start, end = _settle(page, since)
            drawn = _drawn(page)
            pressed = [t for t in page.evaluate("window.__inputs") if t >= since]
            since = pressed[0] if pressed else since
            _report(out, f"{label}, pressed {when} (to the map)",
                    ((end - since) / 1000, (drawn - since) / 1000, server.cpu_s() - cpu0,
                     (end - start) / 1000))
            browser.close()
    finally:
        server.stop()
    return {k: v[0] for k, v in out.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="10000,100000")
    ap.add_argument("--runs", type=int, default=1, help="label runs per store")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--pages", default=",".join(PAGES),
                    help="comma-separated subset of " + ", ".join(PAGES))
    ap.add_argument("--timeout", type=float, default=600, help="seconds per step")
    ap.add_argument("--embed", action="store_true",
                    help="instead: the semantic map's embedding on the demo store")
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "pages.json",
                    help="the JSON rows (merged: other sizes' rows stay)")
    ap.add_argument("--stores", type=Path, default=None,
                    help="keep the built stores in this folder and reuse them on the next "
                         "run (same size and label runs); default: a temporary folder")
    args = ap.parse_args()
    global TIMEOUT_MS
    TIMEOUT_MS = int(args.timeout * 1000)
    pages = tuple(p for p in args.pages.split(",") if p)
    random.seed(0)
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    if args.embed:
        with tempfile.TemporaryDirectory() as tmp:
            for wait in (False, True):
                measure_embed(Path(tmp), wait)
        print(f"load average {os.getloadavg()[0]:.1f} at the end")
        return 0
    results: dict[int, dict[str, Step]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        keep = args.stores or Path(tmp)
        keep.mkdir(parents=True, exist_ok=True)
        for n in (int(x) for x in args.sizes.split(",")):
            db = keep / f"pages-{n}x{args.runs}.duckdb"
            if db.exists():
                print(f"{n:,} trajectories x {args.runs} label run(s): reusing {db}",
                      flush=True)
                store_explore_view(db)
                store_rank_view(db)
            else:
                part = db.with_name(db.stem + ".part.duckdb")  # a stopped build is not reused
                part.unlink(missing_ok=True)
                took = build(part, n, args.runs)
                from trace_lib.store.search import index_path

                index_path(part).rename(index_path(db))  # the side full-text index
                part.rename(db)
                print(f"{n:,} trajectories x {args.runs} label run(s): imported in "
                      f"{took:.0f} s", flush=True)
            server = Server(db, Path(tmp) / f"streamlit-{n}.log")
            try:
                results[n] = measure(server, args.repeats, pages)
            finally:
                server.stop()
            save_rows(args.out, json_rows(n, args.runs, db, results[n]))
    sizes = list(results)
    print("\n| what | " + " | ".join(f"{n:,}: " + " / ".join(FIELDS) for n in sizes) + " |")
    print("|---|" + "---|" * len(sizes))
    for k in results[sizes[0]]:
        cells = [f"{_fmt(results[n][k][0])} / {_fmt(results[n][k][1])} / "
                 f"{results[n][k][2]:.1f} s / {_fmt(results[n][k][3])}" if k in results[n]
                 else "" for n in sizes]
        print(f"| {k} | " + " | ".join(cells) + " |")
    print(f"load average {os.getloadavg()[0]:.1f} at the end")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
