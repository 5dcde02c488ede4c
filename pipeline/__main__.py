"""Entry point: ``python -m pipeline --events=FILE --duckdb=OUT.duckdb`` (see pipeline.beam.launcher)."""

import sys

from pipeline.beam.launcher import run

sys.exit(run())
