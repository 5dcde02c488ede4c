"""Fixtures of the Beam tier."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.beam import direct_runner
from support.beam import replay


@pytest.fixture(scope="session", autouse=True)
def direct_runner_as_the_stream_runs_it() -> None:
    """The DirectRunner fitted as the launcher runs a local stream (its per-bundle costs cut,
    timers delivered once): every test of this tier runs on the same runner (the patches are for
    the whole process)."""
    assert direct_runner.install()


@pytest.fixture(scope="session")
def clean_replay(clean_lines: list[bytes], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The DuckDB file of the clean file's batch replay."""
    return replay(clean_lines, tmp_path_factory.mktemp("clean"))
