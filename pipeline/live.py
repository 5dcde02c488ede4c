"""Live tracking of runs in a streaming pipeline: one stateful DoFn per run, wrapping the engine.

Each run's state (``engine.RunState``, stored with its explicit coder) lives in Beam state keyed
by run id, so the pipeline scales out across workers. Snapshots are emitted

* every ``snapshot_interval_s`` of processing time while events arrive (SNAPSHOT_TIMER),
* at once when the run records its end,
* when the run falls silent for ``silence_s`` (SILENCE_TIMER): its elapsed time has kept
  growing with no step, so rolling goodput drops and an alert can fire;

and the state is cleared ``gc_after_s`` after the run ends (GC_TIMER). All timers run on
processing time, so events with old event times (a backfill or a replay through the stream) are
counted, never wiped by a timer that fires at once.

A snapshot is taken as of the run's own clock: its latest event time plus the processing time
since that event arrived. For a live job that is now; for a replay it is the replayed time.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import apache_beam as beam
from apache_beam.coders import BytesCoder, VarIntCoder
from apache_beam.metrics.metric import Metrics
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.transforms.userstate import ReadModifyWriteStateSpec, TimerSpec, on_timer
from apache_beam.utils.timestamp import Timestamp

from pipeline import engine
from pipeline.events import Batch
from pipeline.rows import Row, snapshot_rows

_US = 1_000_000


class TrackRunDoFn(beam.DoFn):
    """Keeps one run's state and emits its snapshot rows on the timers described above."""

    RUN_STATE = ReadModifyWriteStateSpec("run_state", BytesCoder())
    ARRIVED = ReadModifyWriteStateSpec("arrived_us", VarIntCoder())  # processing time, last event
    SNAPSHOT_DUE = ReadModifyWriteStateSpec("snapshot_due_us", VarIntCoder())  # pending timer
    SNAPSHOT_TIMER = TimerSpec("snapshot", TimeDomain.REAL_TIME)
    SILENCE_TIMER = TimerSpec("silence", TimeDomain.REAL_TIME)
    GC_TIMER = TimerSpec("gc", TimeDomain.REAL_TIME)

    def __init__(self, windows_s: tuple[int, ...], snapshot_interval_s: float, silence_s: float,
                 gc_after_s: float, clock: Callable[[], float] = time.time) -> None:
        self.windows_s = windows_s
        self.snapshot_interval_s = snapshot_interval_s
        self.silence_s = silence_s
        self.gc_after_s = gc_after_s
        self.clock = clock
        self.snapshots = Metrics.counter("goodput", "snapshots")
        self.stalled = Metrics.counter("goodput", "stalled_runs")

    def process(
        self,
        element: tuple[str, Batch],
        run_state: Any = beam.DoFn.StateParam(RUN_STATE),
        arrived: Any = beam.DoFn.StateParam(ARRIVED),
        snapshot_due: Any = beam.DoFn.StateParam(SNAPSHOT_DUE),
        snapshot_timer: Any = beam.DoFn.TimerParam(SNAPSHOT_TIMER),
        silence_timer: Any = beam.DoFn.TimerParam(SILENCE_TIMER),
        gc_timer: Any = beam.DoFn.TimerParam(GC_TIMER),
    ) -> Iterator[tuple[str, Row]]:
        run_id, batch = element
        encoded = run_state.read()
        state = engine.decode_state(encoded) if encoded else engine.RunState(run_id)
        was_ended = _ended(state)
        state.add_batch(batch)
        run_state.write(engine.encode_state(state))
        now_us = round(self.clock() * _US)
        arrived.write(now_us)
        due = snapshot_due.read()
        if due is None or due < now_us:  # set once per interval, not once per message
            interval_us = round(self.snapshot_interval_s * _US)
            due = (now_us // interval_us + 1) * interval_us
            snapshot_timer.set(Timestamp(micros=due))
            snapshot_due.write(due)
        silence_timer.set(Timestamp(micros=now_us + round(self.silence_s * _US)))
        if _ended(state) and not was_ended:
            yield from self._snapshot(state, now_us, now_us)
            gc_timer.set(Timestamp(micros=now_us + round(self.gc_after_s * _US)))

    # A timer callback knows when it fires without a clock: it fires when it was set for.

    @on_timer(SNAPSHOT_TIMER)
    def on_snapshot(self, run_state: Any = beam.DoFn.StateParam(RUN_STATE),
                    arrived: Any = beam.DoFn.StateParam(ARRIVED),
                    snapshot_due: Any = beam.DoFn.StateParam(SNAPSHOT_DUE)
                    ) -> Iterator[tuple[str, Row]]:
        encoded, arrived_us, due = run_state.read(), arrived.read(), snapshot_due.read()
        snapshot_due.clear()
        if encoded and arrived_us is not None and due is not None:
            yield from self._snapshot(engine.decode_state(encoded), arrived_us, due)

    @on_timer(SILENCE_TIMER)
    def on_silence(self, run_state: Any = beam.DoFn.StateParam(RUN_STATE),
                   arrived: Any = beam.DoFn.StateParam(ARRIVED)) -> Iterator[tuple[str, Row]]:
        encoded, arrived_us = run_state.read(), arrived.read()
        if encoded and arrived_us is not None:
            state = engine.decode_state(encoded)
            if not _ended(state):
                self.stalled.inc()
                yield from self._snapshot(state, arrived_us, arrived_us + round(self.silence_s * _US))

    @on_timer(GC_TIMER)
    def on_gc(self, run_state: Any = beam.DoFn.StateParam(RUN_STATE),
              arrived: Any = beam.DoFn.StateParam(ARRIVED)) -> None:
        encoded = run_state.read()
        if encoded and _ended(engine.decode_state(encoded)):  # not restarted since
            run_state.clear()
            arrived.clear()

    def _snapshot(self, state: engine.RunState, arrived_us: int,
                  now_us: int) -> Iterator[tuple[str, Row]]:
        latest = max((a.last_event_us for a in state.attempts.values()), default=0)
        as_of = latest + max(0, now_us - arrived_us)
        snapshot = state.snapshot(as_of, self.windows_s)
        if snapshot is not None:
            self.snapshots.inc()
            yield from snapshot_rows(snapshot)


def _ended(state: engine.RunState) -> bool:
    """Whether the run's latest attempt recorded its end."""
    started = [a for a in state.attempts.values() if a.start_us is not None]
    if not started:
        return False
    latest = max(started, key=lambda a: (a.start_us, a.attempt_id))
    return latest.end_us is not None


class TrackRunsLive(beam.PTransform):
    """(run_id, Batch) in, snapshot rows out, as described in this module's docstring."""

    def __init__(self, windows_s: tuple[int, ...], snapshot_interval_s: float = 30.0,
                 silence_s: float = 300.0, gc_after_s: float = 3600.0,
                 clock: Callable[[], float] = time.time) -> None:
        super().__init__()
        self.fn = TrackRunDoFn(windows_s, snapshot_interval_s, silence_s, gc_after_s, clock)

    def expand(self, keyed_batches: Any) -> Any:
        return keyed_batches | "TrackRun" >> beam.ParDo(self.fn)
