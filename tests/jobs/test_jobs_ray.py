"""The Ray backend against a real local Ray head (started and stopped by this test)."""

from __future__ import annotations

import os
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


@pytest.fixture(scope="module")
def ray_head():
    """A local head with 1 worker CPU (`start_local_head`: its own process group, stopped
    by that group only, never `ray stop`)."""
    from trace_lib.jobs.ray import start_local_head

    # A short temp dir: Ray's unix socket paths must stay under 108 characters.
    temp_dir = Path("/tmp") / f"ray_h6b_{os.getpid()}"
    log_path = temp_dir.with_suffix(".log")
    try:
        head = start_local_head(temp_dir, log_path, num_cpus=1)
    except RuntimeError as exc:
        log_path.unlink(missing_ok=True)
        pytest.fail(str(exc))
    try:
        yield head.address
    finally:
        head.stop()
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
