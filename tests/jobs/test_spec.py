"""JobSpec: what every job shares is checked with an error naming the file and the field."""

from __future__ import annotations

import json

import pytest

from trace_lib import jobs
from trace_lib.errors import UserInputError
from trace_lib.jobs.spec import JobSpec, new_job_id, runs_dir


def test_defaults_fill_id_run_dir_and_time(tmp_path, monkeypatch):
    monkeypatch.setenv(jobs.RUNS_ENV, str(tmp_path / "runs"))
    spec = JobSpec(kind="train_adapter", config={"env": "x"})
    assert spec.id.startswith("train_adapter-") and spec.backend == "local"
    assert spec.path == tmp_path / "runs" / spec.id and runs_dir() == tmp_path / "runs"
    again = JobSpec.from_dict(json.loads(json.dumps(spec.to_dict())), "round trip")
    assert again == spec


def test_ids_sort_by_time_and_are_unique():
    ids = [new_job_id("k") for _ in range(50)]
    assert len(set(ids)) == 50 and all(i.startswith("k-") for i in ids)


@pytest.mark.parametrize(("data", "match"), [
    ([1, 2], "expected a JSON object"),
    ({"kind": "paint", "config": {}}, r"field `kind` is 'paint'; expected one of \['evaluate'"),
    ({"kind": "train_adapter", "config": []}, "field `config` must be an object"),
    ({"kind": "train_adapter", "config": {}, "backend": "slurm"},
     r"field `backend` is 'slurm'; expected one of \['local', 'ray'\]"),
    ({"kind": "train_adapter", "config": {}, "backend_options": 3},
     "`backend_options` must be an object"),
    ({"kind": "train_adapter", "config": {}, "colour": "red"}, r"unknown fields \['colour'\]"),
])
def test_bad_specs_name_the_field(data, match):
    with pytest.raises(UserInputError, match=match) as info:
        JobSpec.from_dict(data, "where.json")
    assert str(info.value).startswith("where.json: ")


def test_load_reports_missing_and_malformed_files(tmp_path):
    with pytest.raises(UserInputError, match="no job spec file here"):
        JobSpec.load(tmp_path / "none.json")
    bad = tmp_path / "spec.json"
    bad.write_text("{not json")
    with pytest.raises(UserInputError, match="not valid JSON"):
        JobSpec.load(bad)
    bad.write_text(json.dumps({"kind": "paint", "config": {}}))
    with pytest.raises(UserInputError, match="kind"):
        JobSpec.load(bad)
