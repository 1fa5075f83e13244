"""`demo build` (placeholder until the demo domain lands)."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """Add the `demo` verb to the CLI."""
