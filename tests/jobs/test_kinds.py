"""The job-kind table: explicit, lazily imported, no registration by import side effect."""

from __future__ import annotations

import subprocess
import sys

import pytest

from trace_lib import jobs
from trace_lib.errors import UserInputError
from trace_lib.jobs import kinds


def test_the_table_lists_every_kind_without_importing_them():
    # A fresh process: knowing the kinds imports none of the stages that run them.
    code = ("import sys; from trace_lib.jobs.kinds import JOB_KINDS; "
            "print(','.join(JOB_KINDS.names())); "
            "print(sorted(m for m in sys.modules if m.startswith(('trace_lib.compose', "
            "'trace_lib.train', 'trace_lib.evaluate', 'trace_lib.cli', 'torch'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.splitlines()
    assert {"train_adapter", "train_gates"} <= set(out[0].split(","))
    assert out[1] == "[]"


@pytest.mark.parametrize("kind", ["train_adapter", "train_gates", "routing_demo"])
def test_each_kind_resolves_to_its_stage_function(kind):
    fn = kinds.job_function(kind)
    assert callable(fn)
    target = kinds.JOB_KINDS.target(kind)
    assert target is not None and target.split(":")[0] == fn.__module__


def test_unknown_kind_lists_the_known_ones():
    with pytest.raises(UserInputError, match=r"unknown job kind 'paint'; expected one of: .*"
                                             r"train_adapter, train_gates"):
        kinds.job_function("paint")


def test_side_effect_registration_is_gone():
    assert not hasattr(jobs, "register_job_kind") and not hasattr(jobs, "register_backend")
    import trace_lib.compose.gate_training as gate_training

    assert not hasattr(gate_training, "register_job_kind")
