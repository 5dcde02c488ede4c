"""``emitter.testing`` and ``emitter.jax``: the helpers a training job's own tests use."""

from __future__ import annotations

import sys
import types

import pytest

from emitter import GoodputRecorder
from emitter.jax import is_process_zero
from emitter.testing import capture_events
from support.runs import at


def test_capture_events_collects_events_without_a_destination():
    """Inside capture_events() a recorder needs no destination and its events are readable."""
    with capture_events() as captured:
        recorder = GoodputRecorder("run-1", logging_enabled=True)
        recorder.record_job_start_time(at(0))
        recorder.record_step_start_time(0, at(1))
        recorder.record_step_start_time(1, at(2))
        assert [(e.kind, e.body.get("step")) for e in captured.events if e.kind != "configs"] == [
            ("job_start", None), ("step_start", 0), ("step_start", 1)]
        recorder.close()
    assert {e.attempt_id for e in captured.events} == {recorder.attempt_id}


def test_capture_events_is_not_reentrant():
    """Nested captures would split events unpredictably, so they are refused."""
    with capture_events(), pytest.raises(RuntimeError), capture_events():
        pass


def test_is_process_zero_in_a_single_process():
    """A single process records, whether JAX is installed (index 0) or absent."""
    assert is_process_zero() is True


@pytest.mark.parametrize(("index", "expected"), [(0, True), (3, False)])
def test_is_process_zero_asks_jax_when_it_is_loaded(monkeypatch, index, expected):
    """With JAX loaded, only process 0 records."""
    fake_jax = types.ModuleType("jax")
    fake_jax.process_index = lambda: index  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "jax", fake_jax)
    assert is_process_zero() is expected
