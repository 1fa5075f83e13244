"""The errors a front end shows as a message rather than a traceback.

Design decisions
- A page catches `ActionError` (a tuple for `except`) around an action: bad input
  (`UserInputError`, message names file, record, field and what was expected) and store
  trouble (`StoreError`: no database, a held lock), and a full device (`DiskFullError`,
  naming what could not be written). The CLI prints the same three and exits 1.
- `LLMError` (a provider that failed or is not configured) is re-exported for the actions
  that call an LLM. `DatabaseError` (any error DuckDB raised) is re-exported for the front
  ends' last line of defence: `store_admin.explain_error` says whether it means a damaged
  store file, and what to do.
"""

from __future__ import annotations

from trace_lib.errors import DiskFullError, UserInputError
from trace_lib.llm.protocol import LLMError
from trace_lib.store import DatabaseError, StoreError

ActionError = (UserInputError, StoreError, DiskFullError)

__all__ = ["ActionError", "DatabaseError", "DiskFullError", "LLMError", "StoreError",
           "UserInputError"]
