"""ingest_paths / ingest_bytes / store_stats: detection, idempotence, atomicity, progress."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trace_lib import store
from trace_lib.data_model import Trajectory
from trace_lib.errors import UserInputError
from trace_lib.ingest import IngestLimits, format_names, ingest_bytes, ingest_paths, store_stats

TAU = "tau-bench/historical_trajectories/gpt-4o-airline.json"
TAU2 = "tau2-bench/results/feature-gym/gpt-4.1_airline_default_gpt-4.1_1trials.json"


def counts(db: Path) -> dict[str, int]:
    with store.connect(db, read_only=True) as con:
        return store.table_counts(con)


def test_auto_detection_names_each_format(tmp_path: Path, db_path: Path, shared_data: Path) -> None:
    jsonl = tmp_path / "runs.txt"  # no telling suffix: sniffed from the first line
    jsonl.write_text(
        json.dumps({"id": "a", "success": True, "messages": [{"role": "user", "content": "x"}]})
        + "\n"
    )
    swe = tmp_path / "inst-1.json"
    swe.write_text(
        json.dumps(
            {
                "history": [
                    {"role": "user", "content": "fix"},
                    {"role": "assistant", "content": "ok"},
                ],
                "trajectory": [],
                "info": {"exit_status": "submitted"},
            }
        )
    )
    report = ingest_paths([shared_data / TAU, shared_data / TAU2, jsonl, swe], db=db_path)
    assert list(report.formats.values()) == ["tau_bench", "tau2", "openai_jsonl", "swe_agent"]
    assert sorted(format_names()) == ["inspect", "openai_jsonl", "otel", "otel_session", "swe_agent",
                                      "tau2", "tau_bench"]
    assert report.trajectories == 200 + 20 + 1 + 1


def test_jsonl_with_a_long_first_line_is_still_detected(tmp_path: Path, db_path: Path) -> None:
    long_first = {
        "id": "a",
        "reward": 1,
        "messages": [{"role": "user", "content": "x" * (2 << 20)}],
    }
    path = tmp_path / "runs.log"  # too long to sniff from the head, no telling suffix
    path.write_text(json.dumps(long_first) + "\n" + json.dumps({**long_first, "id": "b"}) + "\n")
    report = ingest_paths([path], db=db_path)
    assert report.formats == {str(path): "openai_jsonl"} and report.trajectories == 2


def test_second_import_is_all_duplicates(db_path: Path, shared_data: Path) -> None:
    first = ingest_paths([shared_data / TAU], db=db_path)
    before = counts(db_path)
    second = ingest_paths([shared_data / TAU], db=db_path)
    assert first.trajectories == 200 and first.duplicates == 0
    assert second.to_json() | {"datasets": None, "formats": None, "notes": None} == {
        "trajectories": 0,
        "successes": 0,
        "failures": 0,
        "unknown": 0,
        "errors": 0,
        "duplicates": 200,
        "skipped": [],
        "datasets": None,
        "formats": None,
        "notes": None,
        "warnings": [],
    }
    assert (
        second.datasets[0]["id"] == first.datasets[0]["id"]
        and not second.datasets[0]["new_dataset"]
    )
    assert counts(db_path) == before
    # The same bytes uploaded through the page are the same dataset and the same trajectories.
    upload = ingest_bytes("gpt-4o-airline.json", (shared_data / TAU).read_bytes(), db=db_path)
    assert upload.trajectories == 0 and upload.duplicates == 200
    assert upload.datasets[0]["id"] == first.datasets[0]["id"]
    assert counts(db_path) == before


def test_a_bare_path_is_one_path(db_path: Path, shared_data: Path) -> None:
    assert ingest_paths(str(shared_data / TAU2), db=db_path).trajectories == 20  # type: ignore[arg-type]


def test_ids_are_content_hashes(db_path: Path, shared_data: Path) -> None:
    ingest_paths([shared_data / TAU2], db=db_path)
    with store.connect(db_path, read_only=True) as con:
        rows = con.execute("SELECT id, content_sha256 FROM trajectories").fetchall()
    assert all(tid == Trajectory.id_from_sha(sha) for tid, sha in rows) and len(rows) == 20


def test_duplicates_inside_one_file(tmp_path: Path, db_path: Path) -> None:
    line = json.dumps({"id": "a", "reward": 0.5, "messages": [{"role": "user", "content": "x"}]})
    path = tmp_path / "d.jsonl"
    path.write_text(line + "\n" + line + "\n")
    report = ingest_paths([path], db=db_path)
    assert (report.trajectories, report.duplicates, report.failures) == (1, 1, 1)


def test_multiple_paths_are_all_or_nothing(
    tmp_path: Path, db_path: Path, shared_data: Path
) -> None:
    ingest_paths([shared_data / TAU], db=db_path)
    before = counts(db_path)
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"id": "x", "messages": [{"role": "bot", "content": "x"}]}) + "\n")
    with pytest.raises(
        UserInputError, match=r"bad.jsonl: record 0 \(line 1\): field 'messages\[0\].role'"
    ):
        ingest_paths([shared_data / TAU2, bad], db=db_path)
    assert counts(db_path) == before  # the good tau2 file was not imported either
    with pytest.raises(UserInputError, match="is a directory"):
        ingest_paths([shared_data / TAU2, tmp_path], db=db_path)
    assert counts(db_path) == before


def test_failed_import_into_a_new_store_creates_nothing(tmp_path: Path, db_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("[{")
    with pytest.raises(UserInputError, match="bad.json: truncated JSON"):
        ingest_paths([bad], db=db_path)
    assert not db_path.exists()


def test_document_size_limit(db_path: Path, shared_data: Path) -> None:
    with pytest.raises(
        UserInputError, match=r"3.9 MiB is over the 1.0 MiB limit for a whole-document JSON file"
    ):
        ingest_paths(
            [shared_data / TAU], db=db_path, limits=IngestLimits(max_document_bytes=1 << 20)
        )


def test_progress_callback_and_stats(db_path: Path, shared_data: Path) -> None:
    seen: list[tuple[float, str]] = []
    ingest_paths(
        [shared_data / TAU, shared_data / TAU2],
        db=db_path,
        progress=lambda f, t: seen.append((f, t)),
    )
    fractions = [f for f, _ in seen]
    assert fractions == sorted(fractions) and fractions[-1] == 1.0 and len(seen) > 3
    stats = store_stats(db_path)
    assert (stats["trajectories"], stats["successes"], stats["failures"], stats["unknown"]) == (
        220,
        94,
        126,
        0,
    )
    assert stats["formats"] == {"tau2": 20, "tau_bench": 200}
    assert {d["name"]: d["trajectories"] for d in stats["datasets"]} == {
        Path(TAU).name: 200,
        Path(TAU2).name: 20,
    }
    assert store_stats(db_path.with_name("absent.duckdb"))["trajectories"] == 0


def test_dataset_rows_record_name_format_and_origin(db_path: Path, shared_data: Path) -> None:
    ingest_paths([shared_data / TAU], db=db_path)
    data = (shared_data / TAU2).read_bytes()
    report = ingest_bytes("upload.json", data, db=db_path)
    assert (
        report.datasets[0]["name"] == "upload.json"
        and report.datasets[0]["source"] == "upload.json"
    )
    with store.connect(db_path, read_only=True) as con:
        rows = con.execute(
            "SELECT name, format, source, n_records FROM datasets ORDER BY name"
        ).fetchall()
    assert rows == [
        ("gpt-4o-airline.json", "tau_bench", str((shared_data / TAU).resolve()), 200),
        ("upload.json", "tau2", "upload:upload.json", 20),
    ]
