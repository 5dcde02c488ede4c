"""The engine on one core: events per second as messages arrive, and the state a run keeps.

Messages are what the emitter sends: 1,000 events of one attempt each, encoded by the emitter's
own encoder. Each is parsed and validated (``pipeline.core.events.parse_batch``) and added to the run's
state (``engine.RunState.add_batch``), in one thread pinned to one core; the time is the median of
seven passes over 200 messages.

* Step events: messages of step starts only, the bulk of a training run's events.
* Mixed events: a step start and its model metrics (loss, step time, MFU) for every step, a
  checkpoint save every 100 steps and an eval (a custom badput span) every 500.
* State: the bytes of the encoded run state (what Beam stores per run) of a run with a job
  start, metadata and no steps, and of the same run after 100,000 steps; per step is the
  difference over 100,000.

The baseline is the reference's own computation measured in the same run: a fresh
``GoodputCalculator`` reading the same 200,000 steps' log entries from an in-memory stand-in for
Cloud Logging and computing goodput with the badput breakdown; its rate is entries per second of
that one computation (which the reference repeats from scratch on every poll). It runs in the
reference's own venv (``tools.reference_runner``), that process pinned to one core, and is timed
there.
"""

from __future__ import annotations

import datetime
import os
import statistics
import tempfile
import time
from collections.abc import Callable

from benchmarks.common import summary
from tools.reference_runner import ReferenceRunner

MESSAGES = 200
PER_MESSAGE = 1_000
REPEATS = 7
T0_US = 1_750_000_000 * 1_000_000  # 2025: event times must not be ahead of the clock
STEP_US = 1_500_000
TARGET_EVENTS_PER_S = 1_000_000
TARGET_STATE_BYTES = 16 * 1024


def _step_messages(count: int = MESSAGES, first_seq: int = 0) -> list[bytes]:
    from goodput_schemas.wire import encode_batch

    messages = []
    for m in range(count):
        first = first_seq + m * PER_MESSAGE
        records = [(seq, T0_US + seq * STEP_US, "step_start", {"step": seq})
                   for seq in range(first, first + PER_MESSAGE)]
        messages.append(encode_batch("run", "attempt-1", records).data)
    return messages


def _mixed_messages() -> list[bytes]:
    from goodput_schemas.wire import encode_batch

    records: list[tuple[int, int, str, dict[str, object]]] = []
    step, t = 0, T0_US
    while len(records) < MESSAGES * PER_MESSAGE:
        records.append((len(records), t, "step_start", {"step": step}))
        t += STEP_US
        records.append((len(records), t, "model_metrics",
                        {"step": step, "loss": 2.5, "step_time_s": 1.5, "mfu": 0.45}))
        if step % 100 == 99:
            records.append((len(records), t, "checkpoint_save",
                            {"step": step, "blocking_s": 2.0, "persistent": True}))
            t += 2_000_000
        if step % 500 == 499:
            records.append((len(records), t, "custom_badput_start", {"badput_type": "EVAL_STEP"}))
            t += 10_000_000
            records.append((len(records), t, "custom_badput_end", {"badput_type": "EVAL_STEP"}))
        step += 1
    records = records[:MESSAGES * PER_MESSAGE]
    return [encode_batch("run", "attempt-1", records[i:i + PER_MESSAGE]).data
            for i in range(0, len(records), PER_MESSAGE)]


def _events_per_second(messages: list[bytes]) -> list[float]:
    from pipeline.core import engine
    from pipeline.core.events import parse_batch

    rates = []
    for _ in range(REPEATS):
        state = engine.RunState("run")
        started = time.perf_counter()
        for data in messages:
            batch, dead = parse_batch(data)
            assert batch is not None and not dead
            state.add_batch(batch)
        elapsed = time.perf_counter() - started
        assert state.events == MESSAGES * PER_MESSAGE
        rates.append(state.events / elapsed)
    return rates


def _state_bytes() -> tuple[int, float]:
    from pipeline.core import engine, state_coder
    from pipeline.core.events import Event, parse_batch

    state = engine.RunState("run")
    state.add(Event("run", "attempt-1", 0, T0_US, "job_start",
                    {"chip_count": 256, "accelerator_type": "v5p", "run_group": "llm",
                     "labels": {"team": "pretraining", "cluster": "us-east5"}}))
    empty = len(state_coder.encode_state(state))
    for data in _step_messages(count=100, first_seq=1):
        batch, _ = parse_batch(data)
        assert batch is not None
        state.add_batch(batch)
    steps = sum(len(a.steps) for a in state.attempts.values())
    assert steps == 100 * PER_MESSAGE
    return empty, (len(state_coder.encode_state(state)) - empty) / steps


def _reference_log(reference: ReferenceRunner, steps: int) -> tuple[str, int]:
    """A job start and ``steps`` step starts through the reference's recorder into a log of its
    worker: the log's handle and its entries."""
    t = datetime.datetime(2026, 11, 1, tzinfo=datetime.timezone.utc)
    calls = [("record_job_start_time", (t,))]
    calls += [("record_step_start_time", (step, t + datetime.timedelta(seconds=1.5 * step)))
              for step in range(steps)]
    log = reference.log(job_name="bench-run")
    entries = reference.record(log, [calls], recorder="goodput.GoodputRecorder", job_name="bench-run",
                               logger_name="goodput_bench")
    return log, entries


def _reference_entries_per_second(reference: ReferenceRunner, log: str, entries: int) -> float:
    """Entries per second of one computation by a fresh calculator (empty cache) over ``log``."""
    with tempfile.TemporaryDirectory() as cache:
        calculator = reference.calculator(log, cache, job_name="bench-run", logger_name="goodput_bench")
        _, seconds = reference.call_timed(calculator, "get_job_goodput", include_badput_breakdown=True)
        reference.release(calculator)
    return entries / seconds


def _on_one_core(measure: Callable[[], list[float]], pid: int = 0) -> list[float]:
    """``measure()`` with process ``pid`` (0: this one; the reference's worker, say) on one core."""
    allowed = os.sched_getaffinity(pid)
    os.sched_setaffinity(pid, {max(allowed)})
    try:
        return measure()
    finally:
        os.sched_setaffinity(pid, allowed)


def run() -> str:
    steps = _on_one_core(lambda: _events_per_second(_step_messages()))
    mixed = _on_one_core(lambda: _events_per_second(_mixed_messages()))
    with ReferenceRunner() as runner:
        log, entries = _reference_log(runner, MESSAGES * PER_MESSAGE)
        reference = _on_one_core(lambda: [_reference_entries_per_second(runner, log, entries)
                                          for _ in range(3)], pid=runner.pid)
    empty, per_step = _state_bytes()
    best = statistics.median(steps)
    lines = [
        "## Engine: events per second on one core, and state per run",
        "",
        __doc__.split("\n\n", 1)[1].strip(),
        "",
        "| figure | median (min–max) | against the reference |",
        "|---|---|---|",
        f"| step events, parsed and added (events/s) | {summary(steps, digits=0)} | "
        f"{best / statistics.median(reference):.1f}× |",
        f"| mixed events, parsed and added (events/s) | {summary(mixed, digits=0)} | "
        f"{statistics.median(mixed) / statistics.median(reference):.1f}× |",
        f"| reference: one full computation (log entries/s) | {summary(reference, digits=0)} | 1× |",
        f"| state of a run with metadata and no steps (bytes) | {empty:,} | |",
        f"| state per step of history (bytes) | {per_step:.1f} | |",
        "",
        f"Targets: at least {TARGET_EVENTS_PER_S:,} step events/s on one core — "
        f"{'met' if best >= TARGET_EVENTS_PER_S else 'MISSED'} ({best:,.0f}); state at most "
        f"{TARGET_STATE_BYTES:,} bytes per run plus the bytes per step — "
        f"{'met' if empty <= TARGET_STATE_BYTES else 'MISSED'} ({empty:,} + {per_step:.0f} per step).",
    ]
    return "\n".join(lines)
