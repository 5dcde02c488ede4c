"""Shared fixtures: isolated spool directories, file destinations, quick emitter settings, and the
replayed fleet the fault suites compare with."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from emitter import EmitterSettings, GoodputRecorder
from support.runs import fleet_events, messages


@pytest.fixture
def spool_dir(tmp_path: Path) -> Path:
    return tmp_path / "spool"


@pytest.fixture
def events_file(tmp_path: Path) -> Path:
    return tmp_path / "events.jsonl"


@pytest.fixture
def make_settings(spool_dir: Path) -> Callable[..., EmitterSettings]:
    """EmitterSettings with an isolated spool, short waits, and none of the events the emitter adds
    on its own (heartbeats, collected configs, the workload found where the tests run), overridable."""

    def make(**overrides: Any) -> EmitterSettings:
        values: dict[str, Any] = dict(spool_dir=spool_dir, heartbeat_interval_s=None,
                                      max_latency_s=0.05, retry_initial_backoff_s=0.01,
                                      retry_max_backoff_s=0.05, close_timeout_s=5.0,
                                      collect_configs=False, discover_workload=False)
        values.update(overrides)
        return EmitterSettings(**values)

    return make


@pytest.fixture
def make_recorder(
    events_file: Path, make_settings: Callable[..., EmitterSettings]
) -> Iterator[Callable[..., GoodputRecorder]]:
    """Builds enabled recorders writing to ``events_file``; closes them after the test."""
    made: list[GoodputRecorder] = []

    def make(job_name: str = "run-1", **kwargs: Any) -> GoodputRecorder:
        kwargs.setdefault("destination", f"file:{events_file}")
        kwargs.setdefault("settings", make_settings())
        recorder = GoodputRecorder(job_name, logging_enabled=True, **kwargs)
        made.append(recorder)
        return recorder

    yield make
    for recorder in made:
        recorder.close(timeout=1)  # cleanup only: a test that needs delivery flushes itself


@pytest.fixture(scope="session")
def clean_lines() -> list[bytes]:
    """The fleet's messages as the emitter sends them: in order, each once."""
    return messages(fleet_events(), 100)


@pytest.fixture
def nothing_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    """The demo fails the test if it gets as far as starting anything."""
    from pipeline.demo import demo

    def started(*args: object, **kwargs: object) -> None:
        raise AssertionError("the demo started where it should have refused to")

    monkeypatch.setattr(demo, "Demo", started)
