"""Fixtures of the fault tests: the clean replay every faulty one is compared with."""

from __future__ import annotations

from pathlib import Path

import pytest

from .support import fleet_events, messages, replay


@pytest.fixture(scope="session")
def clean_lines() -> list[bytes]:
    """The fleet's messages as the emitter sends them: in order, each once."""
    return messages(fleet_events(), 100)


@pytest.fixture(scope="session")
def clean_replay(clean_lines: list[bytes], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The DuckDB file of the clean file's batch replay."""
    return replay(clean_lines, tmp_path_factory.mktemp("clean"))
