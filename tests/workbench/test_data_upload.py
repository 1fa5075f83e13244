"""Upload refusals and JSON errors are whole sentences a person can act on."""

from __future__ import annotations

import pytest

from trace_lib.errors import UserInputError
from trace_lib.workbench import data


def test_refused_types_say_why_and_accepted_ones_pass() -> None:
    assert data.upload_refusal("runs.jsonl") is None
    assert data.upload_refusal("RUNS.JSON.GZ") is None
    assert data.upload_refusal("notes.pdf") == (
        "File notes.pdf was not imported: a .pdf file is not a trajectory file. Upload .json, "
        ".jsonl, .traj, .eval or .gz (gzip of those) files.")
    assert "a file without an extension" in data.upload_refusal("README")


def test_a_json_error_is_a_whole_sentence(tmp_path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"a": "unterminated')
    with pytest.raises(UserInputError) as err:
        data.import_files([data.Upload("bad.json", bad.read_bytes())], db=tmp_path / "t.db")
    assert str(err.value).endswith(
        "bad.json: truncated JSON (the file ends mid-document, so it is not valid JSON) at "
        "line 1 column 7: unterminated string.")
    broken = tmp_path / "broken.json"
    broken.write_text('{"a": 1,, "b": 2}')
    with pytest.raises(UserInputError, match=r"malformed JSON \(the file is not valid "
                                             r"JSON\) at line 1 column 9: expecting property "
                                             r"name enclosed in double quotes\.$"):
        data.import_files([broken], db=tmp_path / "t.db")
