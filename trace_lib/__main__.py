"""`python -m trace_lib <verb>`."""

from trace_lib.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
