"""Errors a user can act on: they carry a message that says what was wrong and where.

Design decisions
- A config read from a file, a form, a notebook's dict or a job spec is checked for unknown
  fields in one place (`check_fields`, `config_from_dict`), so every front end words the
  mistake the same way: where it was, the unknown fields and the ones expected.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any, TypeVar

T = TypeVar("T")


class UserInputError(ValueError):
    """Bad input from a user or a file. The message names the file, record, field and
    what was expected, so the CLI and the app can show it as it is."""


def check_fields(data: Any, known: Iterable[str], where: str, *,
                 accepted: Iterable[str] = ()) -> None:
    """Raise a UserInputError unless `data` is an object whose keys are all `known` (or
    `accepted`: an old name still read, not offered); `where` names the file or field."""
    if not isinstance(data, dict):
        raise UserInputError(f"{where}: expected an object, got {type(data).__name__}")
    known = sorted(known)
    extra = sorted(set(data) - set(known) - set(accepted))
    if extra:
        raise UserInputError(f"{where}: unknown fields {extra}; expected {known}")


def config_from_dict(cls: type[T], data: Any, where: str) -> T:
    """The dataclass `cls` built from `data`, whose keys must be its fields."""
    check_fields(data, (f.name for f in dataclasses.fields(cls)), where)  # type: ignore[arg-type]
    return cls(**data)
