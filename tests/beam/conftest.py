"""Fixtures of the Beam tier."""

from __future__ import annotations

from pathlib import Path

import pytest

from support.beam import replay


@pytest.fixture(scope="session")
def clean_replay(clean_lines: list[bytes], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The DuckDB file of the clean file's batch replay."""
    return replay(clean_lines, tmp_path_factory.mktemp("clean"))
