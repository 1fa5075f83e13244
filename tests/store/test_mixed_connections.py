"""One process, two sessions: a read-only connection open while another session opens the
store read-write (and the reverse). DuckDB refuses the second ("a different configuration
than existing connections"); the open waits for the first to close, as for another
process's lock, then fails with the lock message. Found by issue 33's reliability test: a
Labels page that failed to open the store this way lost the edit it was saving."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from trace_lib import store


@pytest.mark.parametrize("first_read_only", [True, False])
def test_the_second_mode_waits_for_the_first_to_close(db_path: Path,
                                                      first_read_only: bool) -> None:
    with store.connect(db_path):
        pass
    first = store.open_connection(db_path, read_only=first_read_only)
    closer = threading.Timer(0.5, first.close)
    closer.start()
    t0 = time.monotonic()
    try:
        with store.connect(db_path, read_only=not first_read_only, timeout_s=30) as con:
            assert con.execute("SELECT count(*) FROM schema_version").fetchall()[0][0] > 0
    finally:
        closer.join()
    assert 0.3 < time.monotonic() - t0 < 30


def test_a_mode_held_too_long_is_the_lock_message(db_path: Path) -> None:
    with store.connect(db_path):
        pass
    held = store.open_connection(db_path, read_only=True)
    try:
        with pytest.raises(store.StoreLockedError, match="another connection of this "
                                                          "process"):
            store.open_connection(db_path, timeout_s=0.3)
    finally:
        held.close()
