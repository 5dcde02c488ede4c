"""Shared fixtures: isolated spool directories, file destinations and quick emitter settings."""

from __future__ import annotations

import datetime
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from emitter import EmitterSettings, GoodputRecorder

T0 = datetime.datetime(2026, 11, 1, 8, 0, tzinfo=datetime.timezone.utc)


def at(seconds: float) -> datetime.datetime:
    """The simulated time ``seconds`` after T0."""
    return T0 + datetime.timedelta(seconds=seconds)


@pytest.fixture
def spool_dir(tmp_path: Path) -> Path:
    return tmp_path / "spool"


@pytest.fixture
def events_file(tmp_path: Path) -> Path:
    return tmp_path / "events.jsonl"


@pytest.fixture
def make_settings(spool_dir: Path) -> Callable[..., EmitterSettings]:
    """EmitterSettings with an isolated spool, no heartbeats and short waits, overridable."""

    def make(**overrides: Any) -> EmitterSettings:
        values: dict[str, Any] = dict(spool_dir=spool_dir, heartbeat_interval_s=None,
                                      max_latency_s=0.05, retry_initial_backoff_s=0.01,
                                      retry_max_backoff_s=0.05, close_timeout_s=5.0)
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
        recorder.close(timeout=5)


def read_events(path: Path) -> list[dict[str, Any]]:
    """Every event in an emitter file, each with its batch's run_id and attempt_id added."""
    import json

    events = []
    for line in path.read_text().splitlines():
        batch = json.loads(line)
        for event in batch["events"]:
            events.append({"run_id": batch["run_id"], "attempt_id": batch["attempt_id"], **event})
    return events


def keyed_stream() -> Any:
    """A TestStream of (run id, message) pairs, with a deterministic key coder for keyed state."""
    from apache_beam import coders
    from apache_beam.testing.test_stream import TestStream

    return TestStream(coder=coders.TupleCoder([coders.StrUtf8Coder(), coders.FastPrimitivesCoder()]))


def streaming_options() -> Any:
    """Pipeline options for a streaming Beam test on the DirectRunner (with TestStream)."""
    from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions

    options = PipelineOptions(["--runner=BundleBasedDirectRunner"])
    options.view_as(StandardOptions).streaming = True
    return options
