"""A fleet of 10,000 concurrent runs of 100 steps: batch replay and streaming on the DirectRunner.

Each of 10,000 runs records a job start (its chip count), 100 step starts about 1.5 s apart and a
job end: 1,020,000 events, encoded by the emitter's own encoder (``goodput_schemas.wire``).

* Batch replay: one message per run, one JSON line each, as the emitter's file destination
  writes them, replayed by ``python -m pipeline --events=FILE --duckdb=OUT`` (raw events
  included) as a child process: its wall time from start to exit, events/s over that time, and
  its peak resident memory (``ru_maxrss`` of that one child, from ``wait4``). Every repeat's
  output must hold, for every run, a latest snapshot that shows its last step and its end, and
  every event in the raw events table, or the benchmark fails. Median of 3 repeats (min–max).
* Streaming: the streaming pipeline as its own process (``--runner=BundleBasedDirectRunner``, a
  5 s snapshot interval, DuckDB output) reads a subscription of the local Pub/Sub emulator, which
  runs in the benchmark's process. Each run sends 3 messages (its job start and first 33 steps,
  the next 33 steps, the last 34 and its end), interleaved across runs as a fleet's emitters
  would send them: every run's first message, then every run's second, then every run's third.
  The real Pub/Sub client publishes them as fast as it takes them, with the emitter's attributes
  but not its ordering key, so that one client batches many runs' messages in one request.
  Measured from the first publish until every run's snapshot in DuckDB shows its last step
  (polled read-only every 2 s), for at most 300 s: runs complete, events/s (events in the
  raw events table over the time to the last poll, and over its first and second halves), the
  pipeline's peak resident memory (``VmHWM`` before it is stopped), the CPU it and the
  benchmark's process used (in cores: 1.00 is one core busy), and the messages it had not yet
  pulled when the measurement ended.
* State per run: the bytes of one run's state as Beam stores it (``state_coder.encode_state``, in a
  ``BytesCoder``) after all its events.

Targets on this machine: the batch replay of 10,000 runs × 100 steps in under 60 s and under 2 GB
(2 × 10⁹ bytes) of peak memory; the stream completes every run (its snapshot shows its last
step) within the 300 s.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import duckdb

from benchmarks.common import cpu_s, stop, summary

REPO = Path(__file__).resolve().parent.parent
RUNS = 10_000
STEPS = 100
EVENTS = RUNS * (STEPS + 2)
MESSAGES_PER_RUN = 3
REPEATS = 3
T0_US = 1_750_000_000 * 1_000_000  # 2025: event times must not be ahead of the clock
STEP_US = 1_500_000
CHIP_COUNTS = (8, 16, 64, 256)
PREFIX = "fleet-"
PROJECT = "projects/goodput-bench"
TOPIC = f"{PROJECT}/topics/events"
SUBSCRIPTION = f"{PROJECT}/subscriptions/pipeline"
INTERVAL_S = 5.0
STREAM_LIMIT_S = 300.0
POLL_S = 2.0
TARGET_WALL_S = 60.0
TARGET_PEAK_BYTES = 2 * 10**9

Record = tuple[int, int, str, dict[str, Any]]


def _run_id(index: int) -> str:
    return f"{PREFIX}{index:05d}"


def _records(index: int) -> list[Record]:
    """One run's events: its job start, 100 step starts about 1.5 s apart, its end."""
    rng = random.Random(index)
    t = T0_US + index * 10_000  # the fleet's jobs start within 100 s of one another
    records: list[Record] = [(0, t, "job_start", {"chip_count": CHIP_COUNTS[index % len(CHIP_COUNTS)]})]
    t += 20_000_000
    for step in range(STEPS):
        records.append((step + 1, t, "step_start", {"step": step}))
        t += round(STEP_US * (1 + rng.uniform(-0.05, 0.05)))
    records.append((STEPS + 1, t, "job_end", {}))
    return records


def _messages(index: int, parts: int) -> list[Any]:
    """The run's events as ``parts`` emitter messages (``emitter.transports.Message``)."""
    from goodput_schemas.wire import encode_batch

    records = _records(index)
    bounds = [round(len(records) * part / parts) for part in range(parts + 1)]
    return [encode_batch(_run_id(index), f"{_run_id(index)}-attempt-1", records[lo:hi])
            for lo, hi in itertools.pairwise(bounds)]


def _write_events_file(path: Path) -> None:
    with open(path, "wb") as handle:
        for index in range(RUNS):
            (message,) = _messages(index, 1)
            handle.write(message.data + b"\n")


def _check_output(database: Path) -> None:
    """Fails unless every run's latest snapshot shows its last step and its end, and every event
    is in the raw events table."""
    with duckdb.connect(str(database), read_only=True) as connection:
        complete = connection.execute(
            "SELECT count(*) FROM latest_goodput WHERE window_s = 0 AND ended AND last_step = ?",
            [STEPS - 1]).fetchone()
        events = connection.execute("SELECT count(*) FROM events").fetchone()
        dead = connection.execute("SELECT count(*) FROM dead_letter").fetchone()
    if complete != (RUNS,) or events != (EVENTS,) or dead != (0,):
        raise RuntimeError(f"batch replay output incomplete: {complete} of {RUNS} runs complete, "
                           f"{events} of {EVENTS} events, {dead} dead letters")


def _replay(events: Path, database: Path, log: Path) -> tuple[float, int]:
    """Wall seconds and peak resident bytes of one batch replay in a child process."""
    database.unlink(missing_ok=True)
    with open(log, "wb") as output:
        started = time.perf_counter()
        child = subprocess.Popen(
            [sys.executable, "-m", "pipeline", f"--events={events}", f"--duckdb={database}"],
            cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=output,
            stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(child.pid, 0)  # the rusage of this child alone
        wall = time.perf_counter() - started
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode != 0:
        tail = log.read_text(errors="replace")[-2000:]
        raise RuntimeError(f"batch replay exited with {child.returncode}:\n{tail}")
    _check_output(database)
    return wall, usage.ru_maxrss * 1024  # ru_maxrss is in KiB on Linux


def _state_bytes() -> int:
    from pipeline.core import engine, state_coder
    from pipeline.core.events import parse_batch

    state = engine.RunState(_run_id(0))
    for message in _messages(0, 1):
        batch, dead = parse_batch(message.data)
        assert batch is not None and not dead
        state.add_batch(batch)
    assert state.events == STEPS + 2
    return len(state_coder.encode_state(state))


def _peak_bytes(pid: int) -> int:
    """The process's peak resident memory so far (``VmHWM``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmHWM for process {pid}")


def _progress(database: Path, last_step: int) -> tuple[int, int, int] | None:
    """(runs with a snapshot, runs whose snapshots show ``last_step``, raw events written), or None
    while the pipeline holds the file (DuckDB has one writer per file) or has not created it."""
    try:
        with duckdb.connect(str(database), read_only=True) as connection:
            runs = connection.execute(
                "SELECT count(*), count(*) FILTER (WHERE last >= ?) FROM (SELECT max(last_step) AS last "
                "FROM goodput_snapshots WHERE starts_with(run_id, ?) GROUP BY run_id)",
                [last_step, PREFIX]).fetchone()
            events = connection.execute("SELECT count(*) FROM events WHERE starts_with(run_id, ?)",
                                        [PREFIX]).fetchone()
    except duckdb.Error:
        return None
    assert runs is not None and events is not None
    return runs[0], runs[1], events[0]


@dataclasses.dataclass
class Streamed:
    """What the streaming measurement saw."""

    runs_seen: int = 0  # runs with a snapshot
    runs_complete: int = 0  # runs whose snapshot shows their last step
    events_written: int = 0
    elapsed_s: float = 0.0  # from the first publish to the last poll that read the file
    publish_s: float = 0.0  # until every publish was acknowledged
    publish_errors: int = 0
    peak_bytes: int = 0
    pipeline_cores: float = 0.0
    bench_cores: float = 0.0
    backlog: int = 0  # messages the pipeline had not pulled when the measurement ended
    samples: list[tuple[float, int]] = dataclasses.field(default_factory=list)  # (elapsed, events)

    @property
    def complete(self) -> bool:
        return self.runs_complete == RUNS

    def rate(self, first: float = 0.0, last: float = 1.0) -> float:
        """Events written per second between two fractions of the measured time."""
        def at(fraction: float) -> tuple[float, int]:
            if fraction == 0:
                return 0.0, 0
            return min(self.samples, key=lambda sample: abs(sample[0] - fraction * self.elapsed_s))

        (t0, e0), (t1, e1) = at(first), at(last)
        return (e1 - e0) / (t1 - t0) if t1 > t0 else 0.0


def _stream() -> Streamed:
    from google.api_core.exceptions import GoogleAPIError
    from google.cloud import pubsub_v1
    from google.pubsub_v1.types import pubsub as types

    from goodput_schemas.wire import encode_batch
    from pipeline.emulators.pubsub import PubSubEmulator

    per_run = [_messages(index, MESSAGES_PER_RUN) for index in range(RUNS)]
    rounds = [[messages[part] for messages in per_run] for part in range(MESSAGES_PER_RUN)]
    result = Streamed()
    with PubSubEmulator() as emulator, tempfile.TemporaryDirectory() as scratch:
        emulator.broker.create_topic(types.Topic(name=TOPIC))
        emulator.broker.create_subscription(types.Subscription(name=SUBSCRIPTION, topic=TOPIC))
        database, log = Path(scratch) / "live.duckdb", Path(scratch) / "stream.log"
        with open(log, "wb") as output:
            stream = subprocess.Popen(
                [sys.executable, "-m", "pipeline", "--streaming", "--runner=BundleBasedDirectRunner",
                 f"--subscription={SUBSCRIPTION}", f"--duckdb={database}",
                 f"--snapshot_interval_s={INTERVAL_S}"],
                cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO), "PUBSUB_EMULATOR_HOST": emulator.host},
                stdout=output, stderr=subprocess.STDOUT)
        previous_host = os.environ.get("PUBSUB_EMULATOR_HOST")
        os.environ["PUBSUB_EMULATOR_HOST"] = emulator.host
        publisher = pubsub_v1.PublisherClient()
        try:
            # Warm-up: measure from the moment the pipeline is reading, not while it starts.
            warm = encode_batch("warm-up", "warm-up-attempt-1", _records(0)[:2])
            publisher.publish(TOPIC, warm.data).result(timeout=30)
            deadline = time.monotonic() + 120
            while not _warmed_up(database):
                if time.monotonic() > deadline or stream.poll() is not None:
                    raise RuntimeError("the streaming pipeline showed no warm-up snapshot within 120 s:\n"
                                       + log.read_text(errors="replace")[-2000:])
                time.sleep(0.1)

            pipeline_cpu, bench_cpu = cpu_s(stream.pid), cpu_s(os.getpid())
            started = time.monotonic()
            futures = [publisher.publish(TOPIC, message.data, run_id=message.run_id,
                                         message_id=message.message_id,
                                         event_time=str(message.event_time_us // 1000))
                       for messages in rounds for message in messages]
            for future in futures:
                try:
                    future.result(timeout=max(1.0, started + STREAM_LIMIT_S - time.monotonic()))
                except (GoogleAPIError, TimeoutError):  # reported: a lost message leaves its run incomplete
                    result.publish_errors += 1
            result.publish_s = time.monotonic() - started
            while not result.complete and time.monotonic() - started < STREAM_LIMIT_S:
                time.sleep(POLL_S)
                if stream.poll() is not None:
                    tail = log.read_text(errors="replace")[-2000:]
                    raise RuntimeError(f"the streaming pipeline exited:\n{tail}")
                polled = time.monotonic() - started
                progress = _progress(database, STEPS - 1)
                if progress is not None:
                    result.runs_seen, result.runs_complete, result.events_written = progress
                    result.elapsed_s = polled
                    result.samples.append((polled, result.events_written))
            elapsed = time.monotonic() - started
            result.peak_bytes = _peak_bytes(stream.pid)
            result.pipeline_cores = (cpu_s(stream.pid) - pipeline_cpu) / elapsed
            result.bench_cores = (cpu_s(os.getpid()) - bench_cpu) / elapsed
            result.backlog = emulator.broker.unacknowledged(SUBSCRIPTION)
        finally:
            publisher.stop()
            if previous_host is None:
                del os.environ["PUBSUB_EMULATOR_HOST"]
            else:
                os.environ["PUBSUB_EMULATOR_HOST"] = previous_host
            stop(stream)
    return result


def _warmed_up(database: Path) -> bool:
    try:
        with duckdb.connect(str(database), read_only=True) as connection:
            return connection.execute("SELECT count(*) FROM goodput_snapshots").fetchone() != (0,)
    except duckdb.Error:  # not created yet, or being written
        return False


def run() -> str:
    with tempfile.TemporaryDirectory() as scratch:
        directory = Path(scratch)
        events = directory / "fleet.jsonl"
        _write_events_file(events)
        walls: list[float] = []
        peaks: list[float] = []
        for attempt in range(REPEATS):
            wall, peak = _replay(events, directory / "fleet.duckdb", directory / "replay.log")
            walls.append(wall)
            peaks.append(peak)
            print(f"  batch replay {attempt + 1}: {wall:.1f} s, peak {peak / 1e9:.2f} GB", file=sys.stderr,
                  flush=True)
    streamed = _stream()
    print(f"  streaming: {streamed.runs_complete:,} runs complete, {streamed.events_written:,} events "
          f"in {streamed.elapsed_s:.0f} s", file=sys.stderr, flush=True)
    state = _state_bytes()

    rates = [EVENTS / wall for wall in walls]
    messages = RUNS * MESSAGES_PER_RUN
    lines = [
        "## A fleet: 10,000 concurrent runs of 100 steps (batch replay and streaming, DirectRunner)",
        "",
        __doc__.split("\n\n", 1)[1].strip(),
        "",
        "| figure | value |",
        "|---|---|",
        f"| batch replay: wall time, whole process (s) | {summary(walls, digits=1)} |",
        f"| batch replay: events/s | {summary(rates, digits=0)} |",
        f"| batch replay: peak resident memory (GB) | {summary(peaks, scale=1e-9)} |",
        f"| streaming: runs whose snapshot shows their last step, of {RUNS:,} | "
        f"{streamed.runs_complete:,} (after {streamed.elapsed_s:.0f} s) |",
        f"| streaming: runs with a snapshot | {streamed.runs_seen:,} |",
        f"| streaming: events written, of {EVENTS:,} | {streamed.events_written:,} |",
        f"| streaming: events/s, whole time (first half / second half) | {streamed.rate():,.0f} "
        f"({streamed.rate(0, 0.5):,.0f} / {streamed.rate(0.5, 1):,.0f}) |",
        f"| streaming: publishing {messages:,} messages until all acknowledged (s) | "
        f"{streamed.publish_s:.1f} ({streamed.publish_errors:,} errors) |",
        f"| streaming: messages the pipeline had not pulled at the end | {streamed.backlog:,} |",
        f"| streaming: peak resident memory of the pipeline (GB) | {streamed.peak_bytes / 1e9:.2f} |",
        f"| streaming: CPU, pipeline / benchmark process (cores) | {streamed.pipeline_cores:.2f} / "
        f"{streamed.bench_cores:.2f} |",
        f"| state of one 100-step run (bytes) | {state:,} |",
        "",
        _targets(statistics.median(walls), statistics.median(peaks)),
        "",
        _streaming_verdict(streamed),
    ]
    return "\n".join(lines)


def _targets(wall: float, peak: float) -> str:
    def verdict(value: float, limit: float, shown: str) -> str:
        return "met" if value < limit else f"MISSED by {shown}"

    return (f"Targets (batch replay, medians): under {TARGET_WALL_S:.0f} s — "
            f"{verdict(wall, TARGET_WALL_S, f'{wall - TARGET_WALL_S:.1f} s')} ({wall:.1f} s); under "
            f"{TARGET_PEAK_BYTES / 1e9:.0f} GB peak memory — "
            f"{verdict(peak, TARGET_PEAK_BYTES, f'{(peak - TARGET_PEAK_BYTES) / 1e9:.2f} GB')} "
            f"({peak / 1e9:.2f} GB).")


def _streaming_verdict(streamed: Streamed) -> str:
    """What the streaming figures say, from the figures themselves."""
    if streamed.complete:
        return (f"Target (streaming): every run complete within {STREAM_LIMIT_S:.0f} s — met: all {RUNS:,} "
                f"runs complete {streamed.elapsed_s:.0f} s after the first publish, "
                f"{EVENTS / streamed.elapsed_s:,.0f} events/s.")
    rate = streamed.rate()
    projected = f"{EVENTS / rate / 60:,.0f} minutes" if rate else "never"
    return (f"Target (streaming): every run complete within {STREAM_LIMIT_S:.0f} s — MISSED: stopped after "
            f"{streamed.elapsed_s:.0f} s with "
            f"{streamed.runs_complete:,} of {RUNS:,} runs complete and {streamed.events_written:,} of "
            f"{EVENTS:,} events written; at {rate:,.0f} events/s all of them would take about {projected}. "
            f"Every message was published within {streamed.publish_s:.0f} s and "
            f"{streamed.backlog:,} of {RUNS * MESSAGES_PER_RUN:,} were still waiting to be pulled: the "
            f"pipeline process is the limit, at {streamed.pipeline_cores:.2f} cores.")
