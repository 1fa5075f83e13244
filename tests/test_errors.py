"""The one unknown-field check every config goes through (`errors.check_fields`,
`errors.config_from_dict`): the message names where, the unknown fields and the known."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from trace_lib.errors import UserInputError, check_fields, config_from_dict


@dataclass
class _Config:
    steps: int = 1
    lr: float = 0.1


def test_a_config_is_built_from_its_fields():
    assert config_from_dict(_Config, {"steps": 3}, "cfg.json") == _Config(steps=3)


def test_unknown_fields_name_the_place_the_fields_and_what_is_expected():
    with pytest.raises(UserInputError) as err:
        config_from_dict(_Config, {"steps": 3, "colour": 1, "bogus": 2}, "cfg.json: config")
    assert str(err.value) == ("cfg.json: config: unknown fields ['bogus', 'colour']; "
                              "expected ['lr', 'steps']")


def test_not_an_object_is_said():
    with pytest.raises(UserInputError, match="cfg: expected an object, got list"):
        config_from_dict(_Config, [1], "cfg")


def test_an_accepted_old_name_passes_and_is_not_offered():
    check_fields({"steps": 1, "old": 2}, ["steps"], "cfg", accepted={"old"})
    with pytest.raises(UserInputError, match=r"expected \['steps'\]$"):
        check_fields({"new": 1}, ["steps"], "cfg", accepted={"old"})
