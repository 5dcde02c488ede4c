"""Streaming state: the Beam state a message writes and reads, at any history and over a run's life.

The run is the costs section's fleet run: a job start, then a step start and a model-metrics
event every 1.5 s step, sent as live messages (the emitter's default latency). The streaming
tracker (``pipeline.beam.live``) counts the state bytes it writes, reads and compacts as Beam
metrics (``state_bytes_written``, ``state_bytes_read``, ``state_bytes_compacted``); every byte
figure here is those counters.

* At each history size the run comes with that history (a relaunch that restores it from the
  warehouse's raw events, written whole once; here a table in memory holds them), then
  ``MESSAGES`` live messages follow, through the tracker on
  the DirectRunner with its state in the runner. Per message: what a message writes on its own
  path (its log entry and the record of its state and times), over the messages after the first; compaction
  (``state_bytes_compacted``, on a timer, off that path) is shown apart. The message's own size
  is its Pub/Sub data. The whole state, which every message wrote before the state kept a log,
  is shown beside.
* The life: ``LIFE_STEPS`` steps, message after message, with the interval snapshot (and the
  compaction it may do) every 30 s of the run's time, through the tracker's own methods in this
  process, with its state in memory: a runner adds nothing to what the tracker counts. The
  counters are read every ``CHECKPOINT_STEPS`` steps; a least-squares line through them shows
  how the life's bytes and CPU grow with its length.
"""

from __future__ import annotations

import contextlib
import random
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

from benchmarks.costs import FLEET_RUN_ID, STEP_S, T0_US, _fleet_records, _Line, _live_messages
from pipeline.sinks.raw_events import EventsTables

HISTORIES = (1_000, 10_000, 100_000)  # steps before the measured messages
MESSAGES = 200
COLD_HISTORIES = (10_000, 100_000, 1_000_000)  # steps before a message on a cold worker
COLD_MESSAGES = 15  # each on a worker of its own: a tracker that never held the run
RESTART_HISTORY = 1_000_000  # steps before a restart
RESTART_RERUN = 1_500  # steps the restart runs again (from its last checkpoint)
WHOLE_STEPS = 5_000_000  # steps of the run whose whole stored state is measured
BATCH_STEPS = 1_000  # steps a message of those runs holds
COMPACT_EVERY_STEPS = 20_000  # their state compacted this often
LIFE_STEPS = 100_000
CHECKPOINT_STEPS = 10_000
SNAPSHOT_INTERVAL_S = 30.0
FLAT_MAX = 1.5  # the largest per-message figure over the smallest
MESSAGE_MARGIN_BYTES = 1_000  # a message writes at most its own size and this


def _messages(steps: int) -> list[Any]:
    """The fleet run's live messages up to ``steps`` steps: (Pub/Sub data, its batch)."""
    from pipeline.core.events import parse_batch

    parsed = []
    for message in _live_messages(FLEET_RUN_ID, "attempt-1", _fleet_records(steps)):
        batch, dead = parse_batch(message.data)
        assert batch is not None and not dead
        parsed.append((message.data, batch))
    return parsed


class _History(EventsTables):
    """Raw events tables in memory that hold one run's messages (the tracker restores it from
    them), and nothing unreported."""

    source = "memory"

    def __init__(self, messages: list[bytes]) -> None:
        self.messages = messages

    def run_ids(self) -> frozenset[str]:
        return frozenset({FLEET_RUN_ID})

    def run_history(self, run_id: str) -> tuple[list[tuple[str, bytes]], None]:
        return [(self.source, data) for data in self.messages], None

    def unreported_runs(self, since_us: int) -> list[str]:
        return []


def _counted(result: Any, name: str) -> int:
    from apache_beam.metrics.metric import MetricsFilter

    counters = result.metrics().query(MetricsFilter().with_name(name))["counters"]
    return sum(int(counter.committed) for counter in counters)


def _through_beam(history: list[bytes], later: list[Any]) -> tuple[int, ...]:
    """Bytes written (of them, by compaction) and read by the tracker on the DirectRunner: the
    run restored from ``history`` (messages) with the first of ``later``, then the rest."""
    import apache_beam as beam
    from apache_beam import coders
    from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions
    from apache_beam.testing.test_stream import TestStream

    from pipeline.beam import direct_runner
    from pipeline.beam.live import TrackRunsLive

    direct_runner.count_every_bundle()
    options = PipelineOptions(["--runner=BundleBasedDirectRunner"])
    options.view_as(StandardOptions).streaming = True
    stream = (TestStream(coder=coders.TupleCoder([coders.StrUtf8Coder(), coders.FastPrimitivesCoder()]))
              .add_elements([(FLEET_RUN_ID, later[0])])
              .add_elements([(FLEET_RUN_ID, batch) for batch in later[1:]])
              .advance_watermark_to_infinity())
    pipeline = beam.Pipeline(options=options)
    _ = pipeline | stream | TrackRunsLive((300,), clock=lambda: 0.0, tables=_History(history))
    result = pipeline.run()
    result.wait_until_finish()
    return tuple(_counted(result, f"state_bytes_{name}") for name in ("written", "compacted", "read"))


def _per_message() -> list[dict[str, float]]:
    from pipeline.core import engine, state_coder

    messages = _messages(max(HISTORIES) + 2 * MESSAGES)
    rows = []
    for history_steps in HISTORIES:
        first = next(i for i, (_, batch) in enumerate(messages)
                     if batch.steps and batch.steps[-1] >= history_steps)
        history = messages[:first]
        later = messages[first:first + MESSAGES]
        state = engine.RunState(FLEET_RUN_ID)
        for _, batch in [*history, later[0]]:
            state.add_batch(batch)
        restored = len(state_coder.encode_state(state))
        written, compacted, read = _through_beam([data for data, _ in history], [batch for _, batch in later])
        rows.append({"steps": history_steps, "message": statistics.median(len(data) for data, _ in later),
                     "whole": restored, "written": (written - restored - compacted) / (MESSAGES - 1),
                     "compacted": compacted, "read": read / (MESSAGES - 1)})
    return rows


class _Value:
    """A value state cell in memory, used as the tracker uses Beam's."""

    def __init__(self) -> None:
        self.value: Any = None

    def read(self) -> Any:
        return self.value

    def write(self, value: Any) -> None:
        self.value = value

    def clear(self) -> None:
        self.value = None


class _Bag:
    """A bag state cell in memory, used as the tracker uses Beam's."""

    def __init__(self) -> None:
        self.items: list[Any] = []

    def read(self) -> list[Any]:
        return list(self.items)

    def add(self, item: Any) -> None:
        self.items.append(item)

    def clear(self) -> None:
        self.items = []


class _Timer:
    def set(self, _: Any) -> None:
        pass

    def clear(self) -> None:
        pass


@contextlib.contextmanager
def _counting() -> Iterator[Callable[[str], int]]:
    """Beam metrics counted in this thread as a runner counts them (a metrics container in the
    thread's state sampler): yields the value so far of a counter, by name."""
    from apache_beam.metrics.execution import MetricsContainer

    from pipeline.beam.direct_runner import own_state_sampler

    container = MetricsContainer("bench")
    with own_state_sampler() as sampler, sampler.scoped_state("bench", "process",
                                                              metrics_container=container):
        yield lambda name: sum(value for key, value in container.get_cumulative().counters.items()
                               if key.metric.name == name)


def _tracker() -> Any:
    from pipeline.beam.live import TrackRunDoFn

    fn = TrackRunDoFn((300,), SNAPSHOT_INTERVAL_S, silence_s=300.0, gc_after_s=600.0, clock=lambda: 0.0)
    fn.setup()
    return fn


def state_writes(batches: list[Any]) -> tuple[float, int]:
    """CPU seconds and bytes of the Beam state writes of a run's life as the tracker makes them
    (``StoredRun``): each message appends its log entry and the record, once the engine has
    added it (not timed); every snapshot interval of the run's time the log is compacted if it
    is due. The bytes are the tracker's own counter."""
    from pipeline.beam.live import StoredRun
    from pipeline.core import engine

    fn, state = _tracker(), engine.RunState(batches[0].run_id)
    stored = StoredRun(fn.store, state.run_id, _Value(), _Bag(), _Value(), _Bag())
    interval_us = round(SNAPSHOT_INTERVAL_S * 1e6)
    next_snapshot_us, seconds = batches[0].max_time_us + interval_us, 0.0
    with _counting() as counted:
        for batch in batches:
            state.add_batch(batch)
            started = time.perf_counter()
            stored.append(batch, state)
            if batch.max_time_us >= next_snapshot_us:
                stored.compact(state)
                next_snapshot_us += interval_us
            stored.save()
            seconds += time.perf_counter() - started
        return seconds, counted("state_bytes_written")


def _cold_reads() -> list[dict[str, float]]:
    """At each history of ``COLD_HISTORIES``: the run's state encoded whole, then
    ``COLD_MESSAGES`` messages, each processed by a tracker of its own (a worker that never held
    the run, as Dataflow gives a work item to any SDK process): the state bytes each reads and
    its CPU, and the CPU of the interval snapshot that follows on another such tracker, medians."""
    from apache_beam.transforms.window import GlobalWindow
    from apache_beam.utils.timestamp import Timestamp

    from pipeline.beam.live import StoredRun
    from pipeline.core import engine, state_coder

    messages = _messages(max(COLD_HISTORIES) + COLD_MESSAGES * 2)
    rows = []
    state, added = engine.RunState(FLEET_RUN_ID), 0
    for history_steps in COLD_HISTORIES:
        first = next(i for i, (_, batch) in enumerate(messages)
                     if batch.steps and batch.steps[-1] >= history_steps)
        for _, batch in messages[added:first]:
            state.add_batch(batch)
        added = first
        state.snapshot(messages[first - 1][1].max_time_us, (300,))  # as a compacted state follows one
        cells: list[Any] = [_Value(), _Bag(), _Value(), _Value(), _Bag()]  # as the tracker's cells
        stored = StoredRun(_tracker().store, FLEET_RUN_ID, cells[0], cells[1], cells[2], cells[4])
        # As a compaction stores it: a copy sealed into these cells (the state goes on growing).
        stored.write_whole(state_coder.decode_state(state_coder.encode_state(state)), seal=True)
        stored.save()
        reads, cpus, snapshot_cpus, snapshot_reads = [], [], [], []
        due = Timestamp(micros=round(SNAPSHOT_INTERVAL_S * 1e6))  # the clock says 0: always this
        for _, batch in messages[first:first + COLD_MESSAGES]:
            fn = _tracker()
            with _counting() as counted:
                started = time.process_time()
                published = Timestamp(micros=batch.max_time_us)
                for _ in fn.process((FLEET_RUN_ID, batch), published, GlobalWindow(), *cells,
                                    *(_Timer() for _ in range(3))):
                    pass
                cpus.append(time.process_time() - started)
                reads.append(counted("state_bytes_read"))
            fn = _tracker()
            with _counting() as counted:
                started = time.process_time()
                for _ in fn.on_snapshot(FLEET_RUN_ID, due, *cells):
                    pass
                snapshot_cpus.append(time.process_time() - started)
                snapshot_reads.append(counted("state_bytes_read"))
        rows.append({"steps": history_steps, "whole": stored.record.whole_bytes if stored.record else 0,
                     "read": statistics.median(reads), "cpu_ms": statistics.median(cpus) * 1e3,
                     "snapshot_ms": statistics.median(snapshot_cpus) * 1e3,
                     "snapshot_read": statistics.median(snapshot_reads)})
    return rows


def _batches(attempt_id: str, first_step: int, steps: int, start_us: int, seed: int) -> Iterator[Any]:
    """An attempt of the fleet run as messages of ``BATCH_STEPS`` steps, each step with its
    model-metrics event (as ``benchmarks.costs._fleet_records`` times them): the first with the
    attempt's job start. Made as the engine takes them, without JSON, for runs of millions of
    steps."""
    from array import array

    from pipeline.core.events import Batch, Event

    rng = random.Random(seed)
    t, seq = start_us, 1
    starts: tuple[Any, ...] = (Event(FLEET_RUN_ID, attempt_id, 0, start_us, "job_start",
                                     {"chip_count": 256, "accelerator_type": "v5p"}),)
    t += 30_000_000  # initialization
    for first in range(first_step, first_step + steps, BATCH_STEPS):
        seqs, times, numbers, others = array("q"), array("q"), array("q"), list(starts)
        for step in range(first, min(first + BATCH_STEPS, first_step + steps)):
            seqs.append(seq)
            times.append(t)
            numbers.append(step)
            seconds = STEP_S * rng.lognormvariate(0, 0.03)
            t += round(seconds * 1e6)
            others.append(Event(FLEET_RUN_ID, attempt_id, seq + 1, t, "model_metrics",
                                {"step": step, "loss": 1.0, "step_time_s": seconds}))
            seq += 2
        starts = ()
        yield Batch(FLEET_RUN_ID, attempt_id, seqs, times, numbers, tuple(others))


def _stored(steps: int) -> tuple[Any, list[Any], int, int]:
    """The fleet run over ``steps`` steps, stored as the tracker stores it, its state compacted
    (sealed, then written whole) every ``COMPACT_EVERY_STEPS`` steps after a snapshot: the
    state, its cells, the largest single write and the bytes stored."""
    from pipeline.beam.live import StoredRun
    from pipeline.core import engine

    state = engine.RunState(FLEET_RUN_ID)
    cells: list[Any] = [_Value(), _Bag(), _Value(), _Value(), _Bag()]  # as the tracker's cells
    stored = StoredRun(_tracker().store, FLEET_RUN_ID, cells[0], cells[1], cells[2], cells[4])
    largest, due = 0, COMPACT_EVERY_STEPS
    with _counting() as counted:
        for batch in _batches("attempt-1", 0, steps, T0_US, seed=1):
            state.add_batch(batch)
            if batch.steps[-1] + 1 >= due:
                state.snapshot(batch.max_time_us, (300,))
                before = counted("state_bytes_written")
                stored.write_whole(state, seal=True)
                largest = max(largest, counted("state_bytes_written") - before)
                due += COMPACT_EVERY_STEPS
        stored.save()
    kept = len(cells[0].value) + sum(map(len, cells[4].items)) + len(cells[2].value)
    return state, cells, largest, kept


def _restart_and_whole() -> dict[str, float]:
    """A restart after ``RESTART_HISTORY`` steps, re-running the last ``RESTART_RERUN``, on a
    tracker that never held the run: the bytes its first message and the interval snapshot
    after it read, per step of the history. And the state of a ``WHOLE_STEPS`` run: the bytes
    stored, and the largest single write of its life."""
    from apache_beam.transforms.window import GlobalWindow
    from apache_beam.utils.timestamp import Timestamp

    state, cells, _, _ = _stored(RESTART_HISTORY)
    latest = max(attempt.last_event_us for attempt in state.attempts.values())
    restart = next(_batches("attempt-2", RESTART_HISTORY - RESTART_RERUN, BATCH_STEPS, latest + 120_000_000,
                            seed=2))
    fn = _tracker()
    due = Timestamp(micros=round(SNAPSHOT_INTERVAL_S * 1e6))
    with _counting() as counted:
        for _ in fn.process((FLEET_RUN_ID, restart), Timestamp(micros=restart.max_time_us), GlobalWindow(),
                            *cells, *(_Timer() for _ in range(3))):
            pass
        for _ in _tracker().on_snapshot(FLEET_RUN_ID, due, *cells):
            pass
        read = counted("state_bytes_read")
    _, _, largest, kept = _stored(WHOLE_STEPS)
    return {"restart_read": read, "restart_per_step": read / RESTART_HISTORY, "whole_kept": kept,
            "largest_write": largest}


def _life() -> list[tuple[int, int, int, int, float]]:
    """(steps, messages, bytes written, of them by compaction, CPU s) at every checkpoint."""
    from apache_beam.transforms.window import GlobalWindow
    from apache_beam.utils.timestamp import Timestamp

    fn = _tracker()
    due = Timestamp(micros=round(SNAPSHOT_INTERVAL_S * 1e6))  # the clock says 0: always this
    cells = [_Value(), _Bag(), _Value(), _Value(), _Bag()]  # as the tracker's cells
    timers = [_Timer() for _ in range(3)]  # snapshot, quiet, final
    points = []
    messages = _messages(LIFE_STEPS)
    interval_us = round(SNAPSHOT_INTERVAL_S * 1e6)
    next_snapshot_us = messages[0][1].max_time_us + interval_us
    next_checkpoint, cpu_s = CHECKPOINT_STEPS, 0.0

    def drain(outputs: Iterator[Any]) -> None:
        for _ in outputs:
            pass

    with _counting() as counted:
        for count, (_, batch) in enumerate(messages, 1):
            started = time.process_time()
            published = Timestamp(micros=batch.max_time_us)
            drain(fn.process((FLEET_RUN_ID, batch), published, GlobalWindow(), *cells, *timers))
            if batch.max_time_us >= next_snapshot_us:  # the interval timer, as of that time
                drain(fn.on_snapshot(FLEET_RUN_ID, due, *cells))
                next_snapshot_us += interval_us
            cpu_s += time.process_time() - started
            if batch.steps and batch.steps[-1] + 1 >= next_checkpoint:
                points.append((next_checkpoint, count, counted("state_bytes_written"),
                               counted("state_bytes_compacted"), cpu_s))
                next_checkpoint += CHECKPOINT_STEPS
    return points


def run() -> str:
    from pipeline.beam.live import COMPACT_MIN_BYTES, Record

    rows = _per_message()
    cold = _cold_reads()
    restart = _restart_and_whole()
    life = _life()
    cold_reads = [row["read"] for row in cold]
    written = [row["written"] for row in rows]
    flat = max(written) / min(written)
    bound_ok = all(row["written"] <= row["message"] + MESSAGE_MARGIN_BYTES for row in rows)
    steps = [float(p[0]) for p in life]
    bytes_line = _Line.fit(steps, [float(p[2]) for p in life])
    cpu_line = _Line.fit(steps, [p[4] for p in life])
    last_steps, last_messages, last_written, _, last_cpu = life[-1]
    lines = [
        "## Streaming state: bytes a message writes and reads, at any history",
        "",
        __doc__.split("\n\n", 1)[1].strip(),
        "",
        "| history (steps) | message (Pub/Sub data, bytes) | state written per message (bytes) "
        f"| state read per message (bytes) | compaction in these {MESSAGES} messages (bytes) "
        "| whole state, once written per message (bytes) |",
        "|---|---|---|---|---|---|",
        *(f"| {row['steps']:,} | {row['message']:,.0f} | {row['written']:,.1f} | {row['read']:,.1f} "
          f"| {row['compacted']:,} | {row['whole']:,} |" for row in rows),
        "",
        f"Written per message: largest / smallest = {flat:.2f} (target ≤ {FLAT_MAX}); every size "
        f"{'within' if bound_ok else 'NOT within'} the message's own size + {MESSAGE_MARGIN_BYTES:,} "
        f"bytes. A message reads only the {Record.SIZE}-byte record of the run's state when its "
        "worker keeps the run decoded.",
        "",
        "On a worker that does not hold the run decoded (on Dataflow, where any of a worker's SDK "
        "processes gets a work item, most messages), a message reads and decodes the run's hot "
        "state (the tails of its columns, its step statistics and detector: "
        "``pipeline.core.state_coder``), stored as a compaction leaves it; the archive of its older "
        f"steps is not read. Each of {COLD_MESSAGES} messages after the history on a tracker of its "
        "own, medians:",
        "",
        "| history (steps) | hot state (bytes) | state read per message, cold (bytes) "
        "| tracker CPU per message, cold (ms) | interval snapshot: state read, cold (bytes) "
        "| interval snapshot CPU, cold (ms) |",
        "|---|---|---|---|---|---|",
        *(f"| {row['steps']:,} | {row['whole']:,} | {row['read']:,.0f} | {row['cpu_ms']:,.1f} "
          f"| {row['snapshot_read']:,.0f} | {row['snapshot_ms']:,.1f} |" for row in cold),
        "",
        f"Read per cold message: largest / smallest = {max(cold_reads) / min(cold_reads):.2f} "
        f"(target ≤ 1.2), largest {max(cold_reads) / 1024:,.1f} kB (target ≤ 64 kB). Here the log "
        "holds the few messages since the state was stored; it is compacted once it holds "
        f"{COMPACT_MIN_BYTES // 1024} kB, so a cold message reads at most "
        f"{(max(row['whole'] for row in cold) + COMPACT_MIN_BYTES) / 1024:,.1f} kB.",
        "",
        f"A restart after {RESTART_HISTORY:,} steps that runs the last {RESTART_RERUN:,} again, on "
        f"a tracker that never held the run: its first message and the interval snapshot after it "
        f"read {restart['restart_read']:,.0f} bytes, {restart['restart_per_step']:.2f} bytes per "
        "step of the history (target ≤ 2): the archive of the attempt's steps, whole, for the "
        "durations the step statistics hold of the steps run again and the wasted progress. "
        f"A run of {WHOLE_STEPS:,} steps, compacted every {COMPACT_EVERY_STEPS:,} steps, stores "
        f"{restart['whole_kept'] / 2**20:,.1f} MiB (target < 16 MB); its largest single write is "
        f"{restart['largest_write']:,} bytes, as at any length (a compaction's new chunks and the "
        "hot state).",
        "",
        "| over the life (steps) | messages | state written (bytes) | of it, compaction (bytes) "
        "| tracker CPU (s) |",
        "|---|---|---|---|---|",
        *(f"| {p[0]:,} | {p[1]:,} | {p[2]:,} | {p[3]:,} | {p[4]:.2f} |" for p in life),
        "",
        f"Lines through the checkpoints: state written {bytes_line.intercept:,.0f} bytes + "
        f"{bytes_line.slope:,.1f} bytes per step (R² {bytes_line.r_squared:.4f}); tracker CPU "
        f"{cpu_line.intercept:.3f} s + {cpu_line.slope * 1e3:.3f} s per 1,000 steps "
        f"(R² {cpu_line.r_squared:.4f}). Over {last_steps:,} steps the tracker wrote "
        f"{last_written / last_messages:,.0f} bytes per message, compaction included, and spent "
        f"{last_cpu / last_messages * 1e6:,.0f} µs per message ({STEP_S} s steps).",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    print(run())
