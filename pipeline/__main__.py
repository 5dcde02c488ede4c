"""Entry point: ``python -m pipeline --events=FILE --duckdb=OUT.duckdb`` (see pipeline.launcher)."""

import sys

from pipeline.launcher import run

sys.exit(run())
