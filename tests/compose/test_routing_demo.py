"""The routing demo build (issue 36) with `tiny`, for real: two SFT adapters, the
composition, the warm-started gates, the per-request router, every policy's episodes on
held-out requests; then what a second build does (nothing) and what an interrupted one
does (continues from its files)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from trace_lib.errors import UserInputError
from trace_lib.workbench import composition, routing_demo


@pytest.fixture(autouse=True)
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("TRACE_ROUTING_DEMO_DIR", raising=False)  # under the models folder
    monkeypatch.setenv("TRACE_MODELS_DIR", str(tmp_path / "models"))
    monkeypatch.setenv("TRACE_RUNS_DIR", str(tmp_path / "runs"))
    previous = torch.get_num_threads()
    yield
    torch.set_num_threads(previous)


def test_the_demo_builds_once_and_a_second_build_finds_it(tmp_path: Path):
    db = tmp_path / "trace.duckdb"
    assert routing_demo.find() is None
    report = routing_demo.build(db, "tiny", progress=False)
    assert report["state"] == "built" and not report["skipped"]
    folder = routing_demo.demo_dir("tiny")
    assert Path(report["path"]) == folder.resolve()
    for part in ("adapters/tool_calling_precision/adapter_model.safetensors",
                 "adapters/precondition_verification/adapter_model.safetensors",
                 "moe/gates.safetensors", "per_request/router.json", "episodes.jsonl",
                 "demo.json"):
        assert (folder / part).is_file(), part

    demo = routing_demo.find()
    assert demo is not None and demo["model"] == "tiny"
    caps = ["tool_calling_precision", "precondition_verification"]
    assert demo["capabilities"] == caps
    assert demo["policies"] == ["base", *[f"adapter:{c}" for c in caps], "linear merge",
                                "composed"]
    assert len(demo["examples"]) == 2  # the tiny preset: one held-out request per env
    for ex in demo["examples"]:
        assert ex["seed"] >= 20_000  # held out: SFT, warm and gate seeds are elsewhere
        assert ex["routed_to"] in caps and ex["right"] == (ex["routed_to"] == ex["capability"])
        assert len(ex["choice"]) == demo["layers"]
        assert set(ex["replies"]) == set(demo["policies"])
        for reply in ex["replies"].values():
            assert {"reward", "passed", "reasons", "messages"} <= set(reply)
            assert reply["messages"][0]["role"] == "system"
        trace = routing_demo.load_trace(demo, ex)
        assert trace.slots == ["base", *caps] and trace.n_tokens > 0
    # the text quotes the build's own figures
    right = sum(ex["right"] for ex in demo["examples"])
    assert demo["routing"] == {"right": right, "total": 2}
    assert demo["what_you_see"].startswith(f"The router sent {right} of 2 held-out requests")
    assert "linear merge: passed" in demo["what_you_see"]
    # the warm start fitted a table of every slot's reward on the warm seeds
    assert set(demo["warm"]["rewards"]) == set(caps)
    assert all(len(row) == 3 for rows in demo["warm"]["rewards"].values()
               for row in rows.values())
    # one warm seed per environment, the next only while its seeds show no preference
    from trace_lib.compose.demo import _no_preference

    for cap, rows in demo["warm"]["rewards"].items():
        seeds = sorted(rows, key=int)
        assert demo["warm"]["seeds"][cap] == [int(x) for x in seeds] and seeds[0] == "0"
        for i in range(1, len(seeds)):
            assert _no_preference({x: rows[x] for x in seeds[:i]})
        assert len(seeds) == 3 or not _no_preference(rows)  # warm_seeds_max is 3
    # its composed model is in the store (the Routing page's picker)
    assert [m["path"] for m in composition.list_moe_models(db)] == [
        str((folder / "moe").resolve())]

    again = routing_demo.build(db, "tiny", progress=False)
    assert again["state"] == "built" and again["skipped"]
    assert again["what_you_see"] == demo["what_you_see"]
    assert len(composition.list_moe_models(db)) == 1


def test_an_interrupted_build_continues_from_its_files(tmp_path: Path, capsys):
    db = tmp_path / "trace.duckdb"
    routing_demo.build(db, "tiny", progress=False)
    folder = routing_demo.demo_dir("tiny")
    adapter = folder / "adapters" / "tool_calling_precision" / "adapter_model.safetensors"
    stamp = adapter.stat().st_mtime_ns
    first = json.loads((folder / "demo.json").read_text())
    # as if the job stopped during the examples: no demo.json, the last episodes lost
    (folder / "demo.json").unlink()
    lines = (folder / "episodes.jsonl").read_text().splitlines()
    (folder / "episodes.jsonl").write_text("\n".join(lines[:-3]) + "\n")
    assert routing_demo.find("tiny") is None
    report = routing_demo.build(db, "tiny", progress=True)
    assert report["state"] == "built" and not report["skipped"]
    err = capsys.readouterr().err
    assert "tool_calling_precision: kept from the last build" in err
    assert "warm start: kept from the last build" in err
    assert adapter.stat().st_mtime_ns == stamp  # not retrained
    again = json.loads((folder / "demo.json").read_text())
    # greedy and deterministic: the re-run episodes equal the lost ones
    assert again["passes"] == first["passes"] and again["routing"] == first["routing"]
    assert len((folder / "episodes.jsonl").read_text().splitlines()) == len(lines)


def test_a_folder_built_with_other_settings_is_not_mixed_in(tmp_path: Path):
    out = tmp_path / "demo"
    cfg = routing_demo.demo_config("tiny", out=out)
    out.mkdir()
    (out / "recipe.json").write_text(json.dumps({**cfg.recipe(), "sft_steps": 99}))
    with pytest.raises(UserInputError, match="other settings"):
        routing_demo.build(tmp_path / "t.duckdb", "tiny", out=out, progress=False)


def test_settings_are_checked_before_anything_starts():
    with pytest.raises(UserInputError, match="two different capabilities"):
        routing_demo.demo_config("tiny", capabilities=["tool_calling_precision"])
    with pytest.raises(UserInputError, match="unknown fields"):
        routing_demo.demo_config("tiny", steps=3)
