"""Errors a user can act on: they carry a message that says what was wrong and where."""

from __future__ import annotations


class UserInputError(ValueError):
    """Bad input from a user or a file. The message names the file, record, field and
    what was expected, so the CLI and the app can show it as it is."""
