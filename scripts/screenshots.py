"""Screenshots of every page for the README: `make screenshots` (or `python scripts/screenshots.py`).

Design decisions
- The app runs on a throwaway store in a temp dir (demo data, labeled offline), never on the
  user's data/trace.duckdb, so the pictures are reproducible and nothing private leaks in.
- The real app server (`python -m trace_lib app`, as `make demo`) on a free 127.0.0.1
  port and Debian's headless Chromium through the `playwright` package (never `playwright install`), like the e2e tests.
- One PNG per page, `docs/screenshots/<page>.png` (and per part of a page in `PARTS`,
  e.g. `transcript.png`: the Trajectories page scrolled to its transcript viewer), taken
  after the page's script has finished running (no running indicator) so no half-drawn
  page is committed. `--only NAME` retakes one.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
PAGES = (("home", ""), ("trajectories", "Trajectories"), ("labels", "Labels"),
         ("rankings", "Rankings"), ("environments", "Environments"),
         ("training", "Training"), ("routing", "Routing"))
# Shots of a part of a page: name -> (page path, CSS selector scrolled into view first).
PARTS = {"transcript": ("Trajectories", ".trace-transcript")}
# What a page shows once drawn, waited for before its shot (on a loaded machine the script
# can start after `_settle`'s first grace, and the shot would show a bare title).
READY = {"trajectories": ".js-plotly-plot .main-svg", "rankings": ".js-plotly-plot .main-svg",
         "labels": '[data-testid="stDataFrame"] table td'}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _prepare_store(tmp: Path, n: int, runs: int) -> Path:
    from trace_lib.demo import build_demo
    from trace_lib.diagnose.labeling import run_labeling

    db = tmp / "trace.duckdb"
    build_demo(tmp / "demo", n=n, seed=0, db=db, progress=True)
    run_labeling(db, "heuristic", runs=runs)
    return db


def _start_app(db: Path, tmp: Path) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    env = {**os.environ, "TRACE_DB": str(db), "TRACE_RUNS_DIR": str(tmp / "runs"),
           "HF_HUB_OFFLINE": "1", "STREAMLIT_BROWSER_GATHER_USAGE_STATS": "false"}
    log = open(tmp / "streamlit.log", "wb")  # noqa: SIM115 - lives as long as the app
    proc = subprocess.Popen(
        [sys.executable, "-m", "trace_lib", "app", "--port", str(port), "--",
         "--server.headless", "true", "--server.fileWatcherType", "none"],
        cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            with urllib.request.urlopen(url + "/_stcore/health", timeout=2) as r:
                if r.status == 200:
                    return proc, url
        except OSError:
            time.sleep(0.3)
    proc.terminate()
    raise SystemExit(f"streamlit did not start:\n{(tmp / 'streamlit.log').read_text()[-3000:]}")


def _settle(page) -> None:
    page.wait_for_selector('[data-testid="stMain"] h1', timeout=120_000)
    # The sidebar first lists the pages/ folder ("app" first) until the script's
    # st.navigation replaces it with Home first: wait for that, as a person would see it.
    page.wait_for_function(
        "() => { const a = document.querySelector('[data-testid=\"stSidebarNav\"] a');"
        " return a && a.textContent.includes('Home'); }", timeout=120_000)
    page.wait_for_timeout(500)
    page.wait_for_function("() => !document.querySelector('[data-testid=\"stStatusWidget\"]')",
                           timeout=120_000)
    page.wait_for_timeout(1500)  # plotly draws after the script ends


def take(out: Path, n: int, runs: int, only: set[str] | None = None) -> list[Path]:
    from playwright.sync_api import sync_playwright

    out.mkdir(parents=True, exist_ok=True)
    saved = []
    with tempfile.TemporaryDirectory(prefix="trace-shots-") as t:
        tmp = Path(t)
        db = _prepare_store(tmp, n, runs)
        proc, url = _start_app(db, tmp)
        try:
            with sync_playwright() as pw:
                browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True,
                                             args=CHROMIUM_ARGS)
                page = browser.new_page(viewport={"width": 1500, "height": 1000})
                shots = [(name, path, None) for name, path in PAGES] + [
                    (name, path, head) for name, (path, head) in PARTS.items()]
                for name, path, head in shots:
                    if only and name not in only:
                        continue
                    page.goto(f"{url}/{path}")
                    if name in READY:
                        page.wait_for_selector(READY[name], state="attached", timeout=180_000)
                    _settle(page)
                    if head:
                        part = page.locator(head).first
                        part.wait_for(timeout=120_000)
                        part.evaluate("el => el.scrollIntoView({block: 'start'})")
                        page.wait_for_function(
                            "s => document.querySelector(s).getBoundingClientRect().top < 200",
                            arg=head, timeout=30_000)
                    target = out / f"{name}.png"
                    page.screenshot(path=str(target), full_page=False)
                    saved.append(target)
                    print(f"saved {target}")
                browser.close()
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    return saved


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=REPO_ROOT / "docs" / "screenshots")
    p.add_argument("--n", type=int, default=120, help="demo trajectories")
    p.add_argument("--runs", type=int, default=3, help="offline labeling runs")
    p.add_argument("--only", action="append", metavar="NAME",
                   choices=[n for n, _ in PAGES] + list(PARTS),
                   help="take only this shot (repeatable), e.g. --only transcript")
    args = p.parse_args(argv)
    if not Path(CHROMIUM).exists():
        raise SystemExit(f"{CHROMIUM} is missing: `make chromium` installs Debian's chromium")
    take(args.out, args.n, args.runs, set(args.only or ()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
