"""Browser-test fixtures: the real app server (`python -m trace_lib app`, what `make demo`
runs; `streamlit run` for a test's own script) on a free 127.0.0.1 port, a real headless
Chromium (Debian's /usr/bin/chromium through the `playwright` package).

Reuse in any e2e test:

    def test_x(streamlit_server, browser_page, wait_for_app, db_path):
        server = streamlit_server(db_path)          # app.py by default; TRACE_DB=db_path
        browser_page.goto(server.url + "/Trajectories")
        wait_for_app(browser_page)                  # the `wait_for_app` fixture

The server's output goes to a log file that a failing start quotes, so a crash in the app
shows up in the test report rather than as a bare timeout; `server.tracebacks()` lists
the tracebacks it holds (a test that walks pages asserts there are none).

Servers start with Streamlit's file watcher off (nothing is edited during a test, and it
spares a loaded machine the watching); `streamlit_server(db, watch=True)` starts one as
`make demo` does, watcher on.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run",
]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class StreamlitServer:
    url: str
    proc: subprocess.Popen
    log: Path

    def tracebacks(self) -> list[str]:
        """Every traceback in the server's log so far, each with the line before it (the
        logger's message) and up to 30 lines of it."""
        lines = self.log.read_text(errors="replace").splitlines()
        return ["\n".join(lines[max(i - 1, 0):i + 30])
                for i, line in enumerate(lines) if line.startswith("Traceback")]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


def start_streamlit(db: Path, app: str = "app.py", *, log_dir: Path,
                    timeout_s: float = 90.0, watch: bool = False, port: int | None = None,
                    own_group: bool = False) -> StreamlitServer:
    """`port`: a given one (a restart on the port the open page talks to), else a free one.
    `own_group`: the server leads its own process group, so a test can SIGKILL it and
    anything it spawned at once (`os.killpg`) without touching pytest's group."""
    port = port or free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "STREAMLIT_BROWSER_GATHER_USAGE_STATS": "false"}
    # The `app` verb gets the store as `--db` (every browser test checks that it reaches the
    # pages); a test's own script through TRACE_DB.
    env.pop("TRACE_DB", None)
    if app != "app.py":
        env["TRACE_DB"] = str(db)
    log = log_dir / f"streamlit-{port}.log"
    with open(log, "ab") as fh:  # append: a restart on the same port keeps the log before
        proc = subprocess.Popen(
            # `app.py` starts the way `make demo` starts it (the `app` verb); another script
            # (a test's own) through `streamlit run`.
            ([sys.executable, "-m", "trace_lib", "app", "--db", str(db), "--port", str(port),
              "--"]
             if app == "app.py" else
             [sys.executable, "-m", "streamlit", "run", str(REPO_ROOT / app),
              "--server.port", str(port), "--server.address", "127.0.0.1"])
            + ["--server.headless", "true", "--browser.gatherUsageStats", "false"]
            # watch: the project's .streamlit/config.toml decides, as under `make demo`
            + ([] if watch else ["--server.fileWatcherType", "none"]),
            cwd=REPO_ROOT, env=env, stdout=fh, stderr=subprocess.STDOUT,
            start_new_session=own_group,
        )
    server = StreamlitServer(url=f"http://127.0.0.1:{port}", proc=proc, log=log)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            break
        try:
            with urllib.request.urlopen(server.url + "/_stcore/health", timeout=2) as r:
                if r.status == 200:
                    return server
        except OSError:
            time.sleep(0.3)
    server.stop()
    raise RuntimeError(f"streamlit did not come up on {server.url}:\n{log.read_text()[-3000:]}")


@pytest.fixture
def streamlit_server(tmp_path: Path) -> Iterator[Callable[..., StreamlitServer]]:
    """Factory: `streamlit_server(db_path, app="app.py", watch=False, port=None,
    own_group=False)` -> a running server; all stop at teardown."""
    started: list[StreamlitServer] = []

    def start(db: Path, app: str = "app.py", *, watch: bool = False, port: int | None = None,
              own_group: bool = False) -> StreamlitServer:
        server = start_streamlit(db, app, log_dir=tmp_path, watch=watch, port=port,
                                 own_group=own_group)
        started.append(server)
        return server

    yield start
    for s in started:
        s.stop()


# Module scope, not session: a live sync_playwright keeps its event loop marked as running
# in the main thread, so a later test that starts its own sync_playwright would fail.
@pytest.fixture(scope="module")
def browser():
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: install Debian's chromium (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture
def browser_page(browser):
    """A fresh page (own context: no shared cookies or storage) with a wide viewport."""
    context = browser.new_context(viewport={"width": 1500, "height": 1000})
    page = context.new_page()
    page.set_default_timeout(60_000)
    yield page
    context.close()


def _wait_for_app(page, timeout_ms: int = 90_000) -> None:
    """Wait until Streamlit has finished running the script (no running indicator)."""
    page.wait_for_selector('[data-testid="stApp"]', timeout=timeout_ms)
    page.wait_for_timeout(300)  # let a rerun triggered by the last action start
    page.wait_for_function(
        "() => !document.querySelector('[data-testid=\"stStatusWidget\"]')",
        timeout=timeout_ms,
    )


@pytest.fixture
def wait_for_app() -> Callable[..., None]:
    """`wait_for_app(page)`: block until the script run the last action triggered is done."""
    return _wait_for_app


@pytest.fixture(autouse=True)
def patient_expect():
    """Pages are slow on a loaded machine: every browser assertion waits up to 60 s for the
    state the app exposes (Playwright's default is 5 s, which the Training page's first
    render alone exceeded in a run beside a CPU hog), then the default is restored."""
    from playwright.sync_api import expect

    expect.set_options(timeout=60_000)
    yield
    expect.set_options(timeout=5_000)
