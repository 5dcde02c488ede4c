"""Fixtures of the Beam tier."""

from __future__ import annotations

from pathlib import Path

import apache_beam
import pytest

from pipeline.beam import direct_runner
from support.beam import replay


def pytest_report_header() -> str:
    """Says which DirectRunner the tier runs on (shown where pytest is run on this folder or a
    file in it)."""
    how = (f"as shipped ({direct_runner.AS_SHIPPED_VARIABLE}=1)" if direct_runner.as_shipped()
           else "with the local stream's patches")
    return f"local runner: Beam {apache_beam.__version__} {how}"


@pytest.fixture(scope="session", autouse=True)
def direct_runner_as_the_stream_runs_it() -> None:
    """The DirectRunner fitted as the launcher runs a local stream (its patches, speed-ups
    included; none with GOODPUT_BEAM_AS_SHIPPED=1): every test of this tier runs on the same
    runner (the patches are for the whole process)."""
    direct_runner.install()


@pytest.fixture(scope="session")
def clean_replay(clean_lines: list[bytes], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The DuckDB file of the clean file's batch replay."""
    return replay(clean_lines, tmp_path_factory.mktemp("clean"))
