"""Makes the wire-format server importable as `wire_server` for the tests in this folder."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
