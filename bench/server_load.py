"""The policy server under load and abuse: latency of small requests while a long one runs,
an abandoned request, an oversized body, a wrong content type, a port in use. Run against
this tree ("after") and, for comparison, a named commit of the server ("before", default
816ce85, the code before issue 16's fixes) extracted into a temp folder.

    nice -n 10 python bench/server_load.py                 # tiny model, both sides
    python bench/server_load.py --sides after --small 20

Design decisions
- Bounded and local: servers listen on 127.0.0.1 only, every side sends a fixed number of
  requests, and every request has a timeout (`--timeout`); a side that would block longer
  is reported as such, not waited out.
- Each side is a separate server process started the same way (`serve(ServerConfig(...))`
  from that side's `trace_lib`, one torch thread), on the same model folder, so the figures
  differ only by the server's code. RSS is read from /proc for the body-size probe.
- The long request asks for most of the context with a fixed seed (and `ignore_eos`, which
  the old server ignores), so both sides face the same work; its generated length is
  reported because the old server may stop at an EOS.
- Latency figures are wall-clock per request (p50 / p99 / max over the small requests);
  the ratio printed is before / after (> 1: the new server is faster under that load).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

SERVE = ("import sys; from trace_lib.runtime.policy_server import ServerConfig, serve; "
         "serve(ServerConfig(model=sys.argv[1], port=int(sys.argv[2]), torch_threads=1, "
         "served_model_name='m'))")
SMALL = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8,
         "temperature": 1.0}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rss_peak_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


class Side:
    """One server process on its own port, from the `trace_lib` under `root`."""

    def __init__(self, name: str, root: Path, folder: str):
        self.name, self.root, self.folder = name, root, folder
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float) -> None:
        env = {**os.environ, "PYTHONPATH": str(self.root), "OMP_NUM_THREADS": "1",
               "HF_HUB_OFFLINE": "1"}
        self.proc = subprocess.Popen([sys.executable, "-c", SERVE, self.folder, str(self.port)],
                                     cwd=self.root, env=env, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name}: server exited with {self.proc.returncode}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"{self.name}: server did not start in {timeout}s")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _post(url: str, body: dict, timeout: float) -> tuple[float, int, dict | None]:
    t0 = time.perf_counter()
    try:
        resp = httpx.post(url + "/v1/chat/completions", json=body, timeout=timeout)
        data = resp.json() if resp.headers.get("content-type", "").startswith(
            "application/json") else None
        return time.perf_counter() - t0, resp.status_code, data
    except httpx.TimeoutException:
        return float("inf"), 0, None


def _stats(lat: list[float]) -> dict:
    done = sorted(x for x in lat if x != float("inf"))
    out = {"n": len(lat), "timed_out": len(lat) - len(done)}
    if done:
        out |= {"p50_s": statistics.median(done),
                "p99_s": done[min(len(done) - 1, int(round(0.99 * (len(done) - 1))))],
                "max_s": done[-1]}
    return out


def latency_under_long(side: Side, small: int, clients: int, long_tokens: int,
                       timeout: float) -> dict:
    """Small requests alone, then the same while one long request decodes."""
    idle = [_post(side.url, SMALL, timeout)[0] for _ in range(small)]
    long_body = {**SMALL, "messages": [{"role": "user", "content": "tell me everything"}],
                 "max_tokens": long_tokens, "seed": 1, "ignore_eos": True}
    result: dict = {}

    def run_long() -> None:
        t, status, data = _post(side.url, long_body, timeout)
        result["long_s"], result["long_status"] = t, status
        if data and "usage" in data:
            result["long_tokens"] = data["usage"]["completion_tokens"]

    worker = threading.Thread(target=run_long)
    worker.start()
    time.sleep(0.5)  # let the long one start decoding (a bench, not a test)
    with ThreadPoolExecutor(clients) as pool:
        loaded = list(pool.map(lambda _: _post(side.url, SMALL, timeout)[0], range(small)))
    worker.join(timeout + 5)
    return {"idle": _stats(idle), "under_long": _stats(loaded), **result}


def abandoned(side: Side, long_tokens: int, timeout: float) -> dict:
    """A long request whose client hangs up after 1 s, then one small request."""
    body = json.dumps({**SMALL, "max_tokens": long_tokens, "seed": 1,
                       "ignore_eos": True}).encode()
    sock = socket.create_connection(("127.0.0.1", side.port))
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                 b"application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    time.sleep(1.0)
    sock.close()
    t, status, _ = _post(side.url, SMALL, timeout)
    return {"small_after_hangup_s": t, "status": status}


def abuse(side: Side, timeout: float) -> dict:
    out: dict = {}
    assert side.proc is not None
    rss0 = _rss_peak_mb(side.proc.pid)
    big = json.dumps({**SMALL, "max_tokens": 1, "junk": "x" * 50_000_000}).encode()
    try:
        resp = httpx.post(side.url + "/v1/chat/completions", content=big, timeout=timeout,
                          headers={"content-type": "application/json"})
        out["body_50mb_status"] = resp.status_code
    except httpx.HTTPError as exc:
        out["body_50mb_status"] = type(exc).__name__
    out["body_50mb_peak_rss_growth_mb"] = round(_rss_peak_mb(side.proc.pid) - rss0)
    for path, body in (("/v1/chat/completions", {**SMALL, "max_tokens": 1}),
                       ("/v1/load_lora_adapter", {"lora_name": "x", "lora_path": "/nowhere"})):
        resp = httpx.post(side.url + path, content=json.dumps(body).encode(),
                          headers={"content-type": "text/plain"}, timeout=timeout)
        out[f"text_plain_{path.rsplit('/', 1)[1]}"] = resp.status_code
    _, status, _ = _post(side.url, {**SMALL, "max_tokens": 2 ** 20}, timeout)
    out["max_tokens_2^20_status"] = status or "timeout"
    _, status, _ = _post(side.url, {**SMALL, "n": 1000, "max_tokens": 1}, timeout)
    out["n_1000_status"] = status or "timeout"
    return out


def port_in_use(side: Side) -> dict:
    """`serve` (the CLI) on a port that already has a listener: this side's server."""
    env = {**os.environ, "PYTHONPATH": str(side.root), "OMP_NUM_THREADS": "1",
           "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-m", "trace_lib", "serve", "--model", side.folder,
                           "--port", str(side.port), "--threads", "1"],
                          cwd=side.root, env=env, capture_output=True, text=True, timeout=300)
    return {"exit": proc.returncode, "said_serving": "serving" in proc.stdout,
            "traceback": "Traceback" in proc.stderr}


def extract(commit: str, dest: Path) -> Path:
    archive = subprocess.run(["git", "-C", str(REPO), "archive", commit, "trace_lib"],
                             check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return dest


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--before", default="816ce85", help="commit of the 'before' server")
    ap.add_argument("--sides", default="before,after")
    ap.add_argument("--small", type=int, default=40, help="small requests per measurement")
    ap.add_argument("--clients", type=int, default=4, help="concurrent small clients")
    ap.add_argument("--long-tokens", type=int, default=3000)
    ap.add_argument("--timeout", type=float, default=240.0, help="per request, seconds")
    ap.add_argument("--json", default=None, help="also write the results here")
    args = ap.parse_args()

    from trace_lib.runtime.base_models import ensure_model_dir

    folder = str(ensure_model_dir(args.model))
    results: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        roots = {"after": REPO, "before": extract(args.before, Path(tmp))}
        for name in args.sides.split(","):
            side = Side(name, roots[name], folder)
            side.start(timeout=300)
            try:
                res = latency_under_long(side, args.small, args.clients, args.long_tokens,
                                         args.timeout)
                res["abandoned"] = abandoned(side, args.long_tokens, args.timeout)
                res["abuse"] = abuse(side, args.timeout)
                res["port_in_use"] = port_in_use(side)
            finally:
                side.stop()
            results[name] = res
            print(name, json.dumps(res, indent=1), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    print(f"\nmodel {args.model}, {args.small} small requests (max_tokens 8) from "
          f"{args.clients} clients, long request max_tokens {args.long_tokens}")
    print(f"{'side':<8} {'idle p50':>9} {'idle p99':>9} {'long p50':>9} {'long p99':>9} "
          f"{'long max':>9} {'long s':>7} {'after hang-up':>14}")
    for name, res in results.items():
        i, u = res["idle"], res["under_long"]
        print(f"{name:<8} {i.get('p50_s', 0):>9.3f} {i.get('p99_s', 0):>9.3f} "
              f"{u.get('p50_s', float('inf')):>9.3f} {u.get('p99_s', float('inf')):>9.3f} "
              f"{u.get('max_s', float('inf')):>9.3f} {res.get('long_s', float('nan')):>7.1f} "
              f"{res['abandoned']['small_after_hangup_s']:>14.3f}")
    if {"before", "after"} <= results.keys():
        b, a = results["before"]["under_long"], results["after"]["under_long"]
        if "p99_s" in a and "p99_s" in b:
            print(f"p99 under a long request, before/after: {b['p99_s'] / a['p99_s']:.1f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
