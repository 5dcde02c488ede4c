"""The engine's costs grow linearly with a run's attempts, disruptions and events.

Work is measured without a clock: as the Python lines the engine executes (every loop iteration,
comprehensions' included), counted by a trace function. The count is the same on every machine
and every run, so these tests cannot be flaky; the seconds are ``benchmarks/restarts.py``'s.
A snapshot of a run four times as long should cost about four times as much (n log n: under
five times), not sixteen.

Work done inside one C call (an array insert that moves a long history) shows as no lines: where
the engine avoids it by merging in bulk, the tests check that the one-at-a-time path is not taken,
and that the bulk path leaves the state the one-at-a-time path leaves.
"""

from __future__ import annotations

import random
import sys
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.core import engine
from pipeline.core.events import Event, encode_events, parse_batch
from pipeline.core.stepstats import StepStatistics
from pipeline.core.timeline import _intersections

S = 1_000_000
T0 = 1_750_000_000 * S  # in the past: no clock check refuses it
#: Sizes compared: a shape's size and four times that.
SMALL, LARGE = 250, 1_000
#: Most a 4× longer run may cost, as a multiple of the shorter one's cost (quadratic is 16×).
MAX_GROWTH = 6.0


class _Run:
    """Events of one run, attempt by attempt, on a clock that only goes forward."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.attempt = ""
        self.seq = 0
        self.t = T0

    def start(self, attempt: str) -> None:
        self.attempt, self.seq = attempt, 0

    def add(self, kind: str, body: dict[str, Any] | None = None, after_s: float = 0.0) -> None:
        self.t += round(after_s * S)
        self.events.append(Event("run", self.attempt, self.seq, self.t, kind, body or {}))
        self.seq += 1

    def span(self, name: str, seconds: float, body: dict[str, Any] | None = None,
             after_s: float = 0.0) -> None:
        self.add(f"{name}_start", body, after_s)
        self.add(f"{name}_end", body, seconds)


def restarts(n: int, skew: bool = False) -> tuple[list[Event], int]:
    """``n`` attempts, each a process start: TPU init, a data load, a few steps (the first
    compiling) that re-run some steps of the one before, an eval, a checkpoint save, and mostly a
    job_end (failed, planned or silent); with ``skew``, some hosts' clocks run seconds behind."""
    rng = random.Random(n)
    run, step = _Run(), 0
    for index in range(n):
        run.start(f"attempt-{index:06d}")
        if skew and index % 5 == 3:
            run.t -= 3 * S
        run.add("job_start", {"chip_count": rng.choice((8, 16))}, rng.uniform(1, 5))
        run.span("tpu_init", rng.uniform(0.5, 2))
        run.span("data_loading", rng.uniform(0.1, 1))
        step = max(0, step - rng.randint(0, 2))
        for k in range(rng.randint(0, 6)):
            run.add("step_start", {"step": step}, rng.uniform(0.5, 1.5) * (3 if k == 1 else 1))
            step += 1
            if rng.random() < 0.2:
                run.span("custom_badput", rng.uniform(0.1, 0.5), {"badput_type": "EVAL_STEP"})
            if rng.random() < 0.2:
                run.add("checkpoint_save", {"step": step, "blocking_s": 0.25, "persistent": True})
        if rng.random() < 0.7:
            run.add("job_end", {"failed": True} if rng.random() < 0.5 else {}, 0.5)
    return run.events, run.t + 60 * S


def rollbacks(n: int) -> tuple[list[Event], int]:
    """One attempt that rolls back in process ``n`` times: steps, an elastic re-initialization,
    and steps again from two before the last."""
    rng = random.Random(n)
    run, step = _Run(), 0
    run.start("attempt")
    run.add("job_start", {"chip_count": 8})
    for _ in range(n):
        for _ in range(4):
            run.add("step_start", {"step": step}, rng.uniform(0.5, 1.5))
            step += 1
        run.span("elastic_reinit", 0.5)
        step -= 2
    return run.events, run.t + 60 * S


def spans(n: int) -> tuple[list[Event], int]:
    """One attempt with ``n`` steps, each followed by an eval (a custom badput span), a checkpoint
    save and a data load."""
    run = _Run()
    run.start("attempt")
    run.add("job_start", {"chip_count": 8})
    for step in range(n):
        run.add("step_start", {"step": step}, 1.0)
        run.span("custom_badput", 0.25, {"badput_type": "EVAL_STEP"})
        run.add("checkpoint_save", {"step": step, "blocking_s": 0.25, "persistent": True})
        run.span("data_loading", 0.125, after_s=0.5)
    return run.events, run.t + 60 * S


SHAPES: dict[str, Callable[[int], tuple[list[Event], int]]] = {
    "restarts": restarts,
    "restarts_with_skewed_clocks": lambda n: restarts(n, skew=True),
    "rollbacks": rollbacks,
    "spans": spans,
}


def traced(action: Callable[[], object], trace: Any) -> None:
    """Runs ``action()`` under the trace function ``trace``."""
    previous = sys.gettrace()
    sys.settrace(trace)
    try:
        action()
    finally:
        sys.settrace(previous)


def lines_executed(action: Callable[[], object]) -> int:
    """How many Python lines ``action()`` executes, counting every pass of a loop."""
    count = 0

    def trace(frame: Any, event: str, arg: Any) -> Any:
        nonlocal count
        count += 1
        return trace

    traced(action, trace)
    return count


def state_of(events: list[Event]) -> engine.RunState:
    state = engine.RunState("run")
    state.add_all(events)
    return state


def snapshot_cost(shape: str, n: int) -> int:
    events, as_of_us = SHAPES[shape](n)
    state = state_of(events)
    return lines_executed(lambda: state.snapshot(as_of_us))


@pytest.mark.parametrize("shape", SHAPES)
def test_a_snapshot_costs_linearly_more_for_a_longer_run(shape: str):
    """A snapshot of a run four times as long costs about four times as much, not sixteen."""
    small, large = snapshot_cost(shape, SMALL), snapshot_cost(shape, LARGE)
    assert large / small < MAX_GROWTH, (small, large)


@pytest.mark.parametrize("shape", SHAPES)
def test_adding_every_event_costs_linearly_more_for_a_longer_run(shape: str):
    """Adding all of a run four times as long costs about four times as much, not sixteen."""
    small_events, _ = SHAPES[shape](SMALL)
    large_events, _ = SHAPES[shape](LARGE)
    small = lines_executed(lambda: state_of(small_events))
    large = lines_executed(lambda: state_of(large_events))
    assert large / small < MAX_GROWTH, (small, large)


def test_a_message_costs_the_same_whatever_the_run_has_recorded():
    """Adding the next attempt's message costs as much after 1,000 attempts as after 250."""
    costs = []
    for n in (SMALL, LARGE):
        events, _ = restarts(n)
        state = state_of(events)
        t = max(e.time_us for e in events) + S
        message = [Event("run", "next", 0, t, "job_start", {"chip_count": 8})]
        message += [Event("run", "next", 1 + k, t + (1 + k) * S, "step_start", {"step": k})
                    for k in range(50)]
        batch, dead = parse_batch(encode_events(message))
        assert batch is not None and not dead
        costs.append(lines_executed(lambda batch=batch, state=state: state.add_batch(batch)))
    assert costs[1] / costs[0] < 1.25, costs


#: No deadline: a loaded machine must not fail a test that times nothing.
UNTIMED = settings(deadline=None)


@UNTIMED
@given(st.lists(st.tuples(st.integers(0, 50), st.integers(0, 20)), max_size=12),
       st.lists(st.tuples(st.integers(0, 50), st.integers(0, 20)), max_size=12))
def test_intersections_equal_a_nested_loop(first, second):
    """The sweep finds the overlaps a loop over every pair finds, in the same order."""
    intervals = [(s, s + w) for s, w in first]
    others = [(s, s + w) for s, w in second]
    assert _intersections(intervals, others) == [
        (max(s, os), min(e, oe)) for s, e in intervals for os, oe in others if min(e, oe) > max(s, os)]


def _attempt_messages(steps: int, per_message: int) -> list[list[Event]]:
    """One attempt's events in messages as the emitter sends them: a job start, then step starts
    with a model-metrics observation after every other step and an eval now and then."""
    run = _Run()
    run.start("attempt")
    run.add("job_start", {"chip_count": 8})
    for step in range(steps):
        run.add("step_start", {"step": step}, 1.0)
        if step % 2:
            run.add("model_metrics", {"step": step, "loss": 2.0}, 0.1)
        if step % 50 == 49:
            run.span("custom_badput", 0.5, {"badput_type": "EVAL_STEP"})
    return [run.events[i:i + per_message] for i in range(0, len(run.events), per_message)]


def _batch(events: list[Event]) -> Any:
    batch, dead = parse_batch(encode_events(events))
    assert batch is not None and not dead
    return batch


def calls_of(action: Callable[[], object], names: set[str]) -> int:
    """How many calls of functions named one of ``names`` ``action()`` makes."""
    count = 0

    def trace(frame: Any, event: str, arg: Any) -> None:
        nonlocal count
        count += event == "call" and frame.f_code.co_name in names

    traced(action, trace)
    return count


def test_a_late_message_is_merged_into_its_attempt_at_once():
    """A message that arrives after later ones is merged whole, not inserted event by event (each
    insert moves every later step of the attempt: n·k for a message of k)."""
    messages = _attempt_messages(steps=20_000, per_message=1_000)
    late = messages.pop(len(messages) // 2)
    state = state_of([event for message in messages for event in message])
    batch = _batch(late)
    assert calls_of(lambda: state.add_batch(batch), {"add", "add_step", "observe"}) == 0
    assert state.attempts["attempt"].missing() == 0


@UNTIMED
@given(st.randoms(use_true_random=False), st.integers(1, 40))
def test_messages_in_any_order_keep_what_their_events_one_by_one_keep(rng: random.Random, per_message: int):
    """Messages added whole, in any order, keep each attempt as adding their events one by one does."""
    messages = _attempt_messages(steps=120, per_message=per_message)
    rng.shuffle(messages)
    whole, one_by_one = engine.RunState("run"), engine.RunState("run")
    for message in messages:
        batch = _batch(message)
        assert whole.add_batch(batch) == sum(one_by_one.add(e) for e in batch.events())
    a, b = whole.attempts["attempt"], one_by_one.attempts["attempt"]
    for name in ("steps", "step_times", "step_seqs", "obs_seqs", "obs_times", "obs_prints", "obs_kinds",
                 "records", "markers", "last_event_us", "start_us"):
        assert getattr(a, name) == getattr(b, name), name
    assert (a.missing(), whole.events) == (b.missing(), one_by_one.events)
    as_of_us = max(e.time_us for message in messages for e in message) + S
    assert whole.snapshot(as_of_us) == one_by_one.snapshot(as_of_us)


def _stats_state(stats: StepStatistics) -> tuple[Any, ...]:
    return (list(stats.durations.items()), list(stats._sorted), stats._total, list(stats._window),
            stats._recent, stats._baseline)


@UNTIMED
@given(st.lists(st.floats(0.01, 100), min_size=1, max_size=400),
       st.lists(st.tuples(st.integers(0, 1_000), st.floats(0.01, 100)), max_size=60))
def test_new_steps_merged_into_a_history_leave_what_setting_them_one_by_one_leaves(history, pairs):
    """New step durations merged into a long history leave every figure as ``set`` one by one."""
    merged, single = StepStatistics(), StepStatistics()
    for stats in (merged, single):
        stats.set_many(list(enumerate(history, start=2_000)))
    merged.set_many(pairs)
    for step, duration in pairs:
        single.set(step, duration)
    assert _stats_state(merged) == _stats_state(single)


def test_a_few_new_steps_are_merged_into_a_long_history_at_once():
    """300 new steps against 100,000 are merged in one pass, not inserted one at a time (each
    insert would move the history: n·k per snapshot of a live run)."""
    stats = StepStatistics("q")
    stats.set_many([(step, 1_000_000 + step % 977) for step in range(100_000)])
    new = [(step, 1_000_000 + step % 991) for step in range(100_000, 100_300)]
    assert calls_of(lambda: stats.set_many(new), {"set", "_insert"}) == 0
    assert len(stats._sorted) == 100_300
