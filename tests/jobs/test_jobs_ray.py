"""The Ray backend against a real local Ray head (started and stopped by this test)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trace_lib import jobs

pytestmark = [pytest.mark.ray, pytest.mark.slow]
TOY = {
    "env": "trace_lib.train.smoke_envs:TargetLetterEnv", "model": "tiny", "group": 4, "groups_per_step": 1,
    "max_tokens": 3, "checkpoint_every": 0,
    "lora": {"rank": 4, "alpha": 8, "targets": ["q_proj", "v_proj"]},
}


def _free_port() -> int:
    from trace_lib.runtime.server_kinds import free_port

    return free_port()


def _stop_group(head: subprocess.Popen) -> None:
    for sig, wait_s in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
        try:
            os.killpg(head.pid, sig)
        except ProcessLookupError:
            break
        try:
            head.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            continue
    try:  # anything of that group still around (raylet workers) goes too
        os.killpg(head.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _start_head(ray_bin: str, temp_dir: Path, log_path: Path) -> tuple[subprocess.Popen, str]:
    """Start a head and wait until it says it is up and its job API answers; returns
    (process, dashboard URL). A head that exits first raises RuntimeError with its log."""
    port, dash = _free_port(), _free_port()
    # On a loaded 2-core box the dashboard takes longer than Ray's default 60 s to start.
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", RAY_DASHBOARD_STARTUP_TIMEOUT_S="600")
    cmd = [ray_bin, "start", "--head", "--block", "--node-ip-address", "127.0.0.1",
           "--port", str(port), "--dashboard-host", "127.0.0.1", "--dashboard-port", str(dash),
           "--include-dashboard", "true", "--num-cpus", "1",
           "--object-store-memory", str(100 * 1024 * 1024), "--temp-dir", str(temp_dir),
           "--disable-usage-stats"]
    with open(log_path, "w") as log:
        head = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    address = f"http://127.0.0.1:{dash}"
    from ray.job_submission import JobSubmissionClient

    deadline = time.monotonic() + 600
    while True:
        # `ray start --block` prints this once the node registered; the dashboard may answer
        # before that, and a node that misses Ray's fixed 30 s registration window exits.
        if "Ray runtime started" in log_path.read_text(errors="replace"):
            try:
                JobSubmissionClient(address).list_jobs()
                return head, address
            except Exception:  # noqa: BLE001 - not answering yet
                pass
        if head.poll() is not None or time.monotonic() > deadline:
            _stop_group(head)
            raise RuntimeError(log_path.read_text(errors="replace")[-3000:])
        time.sleep(1)


@pytest.fixture(scope="module")
def ray_head():
    """`ray start --head --block` in its own process group; stopped by that group's id only
    (never `ray stop`, which would stop every Ray on the machine)."""
    ray_bin = shutil.which("ray") or str(Path(sys.executable).parent / "ray")
    # A short temp dir: Ray's unix socket paths must stay under 108 characters.
    temp_dir = Path("/tmp") / f"ray_h6b_{os.getpid()}"
    log_path = temp_dir.with_suffix(".log")
    head = None
    try:
        problems = []
        # Ray gives a starting node a fixed 30 s to register with its GCS; on an overloaded
        # box that can run out, and the head exits saying so. Only that is retried.
        for _ in range(3):
            try:
                head, address = _start_head(ray_bin, temp_dir, log_path)
                break
            except RuntimeError as exc:
                problems.append(str(exc))
                if "timed out during startup" not in str(exc):
                    break
        if head is None:
            pytest.fail("ray head did not start: " + problems[-1])
        yield address
    finally:
        if head is not None:
            _stop_group(head)
        shutil.rmtree(temp_dir, ignore_errors=True)
        log_path.unlink(missing_ok=True)


def test_ray_job_runs_the_same_entrypoint_and_cancels(ray_head, tmp_path, monkeypatch):
    monkeypatch.setenv(jobs.RUNS_ENV, str(tmp_path / "runs"))
    spec = jobs.submit(jobs.JobSpec(kind="train_adapter", config={**TOY, "steps": 2},
                                    backend="ray", backend_options={"address": ray_head}))
    st = jobs.wait(spec.id, timeout_s=300)
    assert st.state == "succeeded", jobs.read_log(spec.path)
    assert len(jobs.read_metrics(spec.path)) == 2
    assert (spec.path / "adapter" / "adapter_model.safetensors").exists()
    deadline = time.monotonic() + 60  # Ray sees the entrypoint exit a moment later
    while jobs.RayBackend().ray_state(spec) != "SUCCEEDED":
        assert time.monotonic() < deadline, jobs.RayBackend().ray_state(spec)
        time.sleep(0.5)

    long = jobs.submit(jobs.JobSpec(kind="train_adapter", config={**TOY, "steps": 500},
                                    backend="ray", backend_options={"address": ray_head}))
    deadline = time.monotonic() + 180
    while not jobs.read_metrics(long.path):
        assert time.monotonic() < deadline, jobs.read_log(long.path)
        time.sleep(0.5)
    st = jobs.cancel(long.id, grace_s=20)
    assert st.state == "cancelled"
    assert jobs.RayBackend().ray_state(long) in ("STOPPED", "SUCCEEDED", "FAILED")
