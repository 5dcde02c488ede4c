"""What a run costs over its life, and what a fleet costs: CPU and cloud API calls, against the reference.

The run is the replay section's: a job start, accelerator init, preparation, a data load,
100,000 steps of about 1.5 s (an eval every 5,000), the job end, through the reference's recorder
into an in-memory stand-in for Cloud Logging and through this project's emitter. Ours is sent as
a live job sends it: the emitter publishes a partial batch once its oldest event has waited
``max_latency_s`` (its default settings), so each message holds the events of that span. All
timings run in one thread pinned to one core; the reference's run in its own venv
(``tools.reference_runner``), that process pinned, and are timed there.

* Reference: the monitor's cumulative worker polls every 30 s (``upload_interval`` has no
  default; 30 s is our snapshot interval) and its step-deviation worker at its default interval;
  each is its own process with its own calculator. Their work per poll is measured at several
  history sizes on a warm cache: one new entry, then ``get_job_goodput(include_badput_breakdown=
  True)`` (cumulative) or ``get_step_deviation()`` (step deviation), 3 times. The run's total
  is the sum over its polls of the cost at the history each poll sees, read off a least-squares
  line through the timings (its fit is shown). The rolling-window worker is counted in reads,
  not in CPU.
* Ours, as the streaming pipeline (``pipeline.beam.live``) does it: every message is parsed and added
  to the run's state, which its worker keeps decoded (``parse_batch`` + ``RunState.add_batch``,
  measured over every message of the life, median of 3 passes), and appended to the run's Beam
  state as a log entry; every snapshot interval the timer snapshots the kept state with the
  default rolling windows (the engine's incremental path) and compacts the log into the whole
  state once the log is as large as it. The state writes are measured over the whole life
  (``benchmarks.state_io.state_writes``, the tracker's own code and byte counter). Snapshot and
  a whole-state encode (what every message cost before the log, and what a compaction costs)
  are measured at several history sizes (11 times) and summed over the life's snapshots and
  messages read off a line. A snapshot of a freshly decoded state (a worker that did not keep
  the run: after a restart, or past its memory budget; the state as the stream encodes it, after
  a snapshot one message earlier) is shown beside. Sinks (rows, points,
  requests) are not counted on either side of the run's life; the fleets count ours.
* Cloud Logging reads: one ``entries.list`` per poll of each worker; a read of more than 1,000
  entries takes one call per 1,000 (the API's page limit; the reference asks for pages of
  1,000,000). Rolling windows, if the reference is given ours, read once per window per cycle,
  and every window but the first re-reads its whole span.

The fleet figures are computed from measurements, not run at scale: every run steps every 1.5 s
and sends a step start and a model-metrics event (loss, step time, MFU) per step; runs are spread
evenly over a 100,000-step life, so the mean history is 50,000 steps. Per-event engine cost and
Pub/Sub bytes come from live-sized messages of such a run, encoded by the emitter and published
through the emitter's Pub/Sub transport to a client that records the call (run ids of 27
characters, the emitter's own attempt ids). Pub/Sub's data volume is the body, the attributes,
the ordering key, 20 bytes of timestamp and the message id; the emitter publishes one message per
request, and a request is billed at least 1,000 bytes; the pipeline's one subscription receives
the same volume again (streaming pull, many messages a response). A month is 30 days.
Monitoring series come from the pipeline's own point builder on a real snapshot; our requests
assume full 200-series requests. The sinks' CPU is this process's thread writing through the
pipeline's writers and the real client libraries to the local stand-ins of BigQuery and Cloud
Monitoring (serving on threads of their own, not counted): the events rows of the fleet run's
first messages, and its last snapshot as the snapshots of many runs, a bundle's worth of
messages or runs a write. The whole path is parse + add, state writes, snapshots,
rows and points. Worker counts divide that CPU by the vCPUs of the Terraform default machine
type: the per-core figures are bounds on this machine, not Dataflow's measured throughput
(Beam's per-element overhead comes on top). State writes are priced as Streaming Engine data
processed, at an example list price (the data-processed billing model bills bytes processed,
more of them for each stateful or shuffling stage; Google does not publish how state bytes
count, so this takes each byte written to state as a byte processed).
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import itertools
import math
import random
import re
import statistics
import tempfile
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from benchmarks.common import summary
from benchmarks.engine import _on_one_core
from benchmarks.replay import _write_run
from emitter.settings import EmitterSettings
from emitter.transports import PubSubTransport
from goodput_schemas.wire import Message, Record, encode_batch
from tools.reference_runner import ReferenceRunner

REPO = Path(__file__).resolve().parent.parent
STEPS = 100_000
STEP_S = 1.5  # the replay run's step time, and the fleet's
EVENTS_PER_STEP = 2  # the fleet: a step start and a model-metrics event
POLL_S = 30.0  # the reference's upload_interval (a required argument, no default)
REFERENCE_SIZES = (1_000, 10_000, 25_000, 50_000, 75_000, 100_000)  # log entries
STATE_SIZES = (1_000, 10_000, 25_000, 50_000, 75_000, 100_000)  # steps of history
REFERENCE_REPEATS = 3
STATE_REPEATS = 11
ENGINE_PASSES = 3
FLEET_SAMPLE_STEPS = 30_000
FLEETS = (100, 10_000, 100_000)
T0_US = 1_750_000_000 * 1_000_000  # 2025: event times must not be ahead of the clock
MONTH_S = 30 * 86_400
LIST_PAGE_MAX = 1_000  # ListLogEntriesRequest.page_size: "exceeds 1000, the request is rejected"
LOGGING_QUOTAS_PER_MIN = (60, 120)  # Cloud Logging entries.list calls per minute per project
PUBSUB_TIMESTAMP_BYTES = 20  # Pub/Sub pricing: "20 bytes for the timestamp"
PUBSUB_MESSAGE_ID_BYTES = 16  # Pub/Sub's server-assigned ids: decimal strings of about 16 digits
PUBSUB_MIN_REQUEST_BYTES = 1_000  # Pub/Sub pricing: "a minimum of 1000 bytes per publish ... request"
TOPIC = "projects/goodput-bench/topics/events"
FLEET_RUN_ID = "llm-pretrain-v5p-256-000001"
SINK_BUNDLE = 100  # messages, or runs' snapshots, a sink writes at once (a bundle's)
SINK_SNAPSHOTS = 1_000  # runs whose snapshots the sinks write
SINK_MESSAGES = 2_000  # of the fleet run's, whose events rows are written
SINK_PROJECT, SINK_DATASET = "goodput-bench", "goodput"
#: A price per GB of Streaming Engine data processed (its data-processed billing model): an example
#: rate, not checked against today's price list, to replace with your own as the accelerator
#: prices are.
STREAMING_ENGINE_USD_PER_GB = 0.018


def _records_of(path: Path) -> tuple[str, list[Record]]:
    """The attempt id and records of the one attempt in an emitter file."""
    from pipeline.core.events import parse_batch, read_lines

    records: list[Record] = []
    attempt_id = ""
    for _, line in read_lines(str(path)):
        batch, dead = parse_batch(line)
        assert batch is not None and not dead
        attempt_id = batch.attempt_id
        records += [(e.seq, e.time_us, e.kind, e.body) for e in batch.events()]
    return attempt_id, sorted(records, key=lambda r: r[0])


def _live_messages(run_id: str, attempt_id: str, records: list[Record]) -> list[Message]:
    """The messages a live job sends: a batch goes once its oldest event has waited
    ``max_latency_s`` (or it is full), so it holds the events recorded in that span."""
    settings = EmitterSettings()
    latency_us = round(settings.max_latency_s * 1e6)
    messages: list[Message] = []
    batch: list[Record] = []
    for record in records:
        if batch and (record[1] >= batch[0][1] + latency_us or len(batch) == settings.max_batch_events):
            messages.append(encode_batch(run_id, attempt_id, batch))
            batch = []
        batch.append(record)
    if batch:
        messages.append(encode_batch(run_id, attempt_id, batch))
    return messages


def _fleet_records(steps: int) -> list[Record]:
    """A fleet run's events: a job start with metadata, then a step start and its model metrics
    every step (the fields of pipeline.demo.simulated_job)."""
    rng = random.Random(1)
    records: list[Record] = [(0, T0_US, "job_start", {"chip_count": 256, "accelerator_type": "v5p",
                                                      "run_group": "llm"})]
    t = T0_US
    for step in range(steps):
        records.append((len(records), t, "step_start", {"step": step}))
        seconds = STEP_S * rng.lognormvariate(0, 0.03)
        t += round(seconds * 1e6)
        records.append((len(records), t, "model_metrics",
                        {"step": step, "loss": 3.0 * 0.9999**step + rng.uniform(0, 0.01),
                         "step_time_s": seconds, "mfu": 0.45}))
    return records


@dataclasses.dataclass(frozen=True)
class _Line:
    """A least-squares line through (size, seconds) timings; never below 0."""

    intercept: float
    slope: float
    r_squared: float

    @classmethod
    def fit(cls, xs: list[float], ys: list[float]) -> _Line:
        slope, intercept = statistics.linear_regression(xs, ys)
        mean = statistics.mean(ys)
        residual = sum((y - intercept - slope * x) ** 2 for x, y in zip(xs, ys, strict=True))
        return cls(intercept, slope, 1 - residual / sum((y - mean) ** 2 for y in ys))

    def __call__(self, x: float) -> float:
        return max(0.0, self.intercept + self.slope * x)

    def describe(self, unit: str) -> str:
        return (f"{self.intercept * 1e3:,.2f} ms + {self.slope * 1e6:,.3f} ms per 1,000 {unit} "
                f"(R² {self.r_squared:.2f})")


def _medians(sizes: list[int], seconds: list[float], repeats: int) -> list[tuple[float, float]]:
    return [(statistics.mean(sizes[i:i + repeats]), statistics.median(seconds[i:i + repeats]))
            for i in range(0, len(sizes), repeats)]


def _entry_time(entry: dict[str, Any]) -> float:
    return float(next(v for k, v in entry.items() if k.endswith("_time")))


def _reference_polls(entries: list[dict[str, Any]]) -> tuple[list[int], list[int]]:
    """The sizes of history the reference's measured calls saw: (cumulative, step deviation)."""
    cumulative, deviation = [], []
    for size in REFERENCE_SIZES:
        first = size - 2 * REFERENCE_REPEATS
        cumulative += [first + 2 * r + 1 for r in range(REFERENCE_REPEATS)]
        deviation += [first + 2 * r + 2 for r in range(REFERENCE_REPEATS)]
    assert max(deviation) <= len(entries)
    return cumulative, deviation


def _reference_seconds(reference: ReferenceRunner, entries: list[dict[str, Any]]) -> list[float]:
    """Per size: one new entry then the cumulative query, one more then the step deviation,
    each on its own warm calculator; cumulative timings first, then step deviation."""
    log = reference.log(job_name="bench-run")
    written = 0
    cumulative, deviation = [], []

    def write(until: int) -> None:
        nonlocal written
        reference.append(log, entries[written:until])
        written = until

    with tempfile.TemporaryDirectory() as cache:
        goodput_worker, deviation_worker = (
            reference.calculator(log, Path(cache) / name, job_name="bench-run", logger_name="goodput_bench")
            for name in ("cumulative", "deviation"))
        for size in REFERENCE_SIZES:
            write(size - 2 * REFERENCE_REPEATS)
            reference.call(goodput_worker, "get_job_goodput", include_badput_breakdown=True)  # catch up
            reference.call(deviation_worker, "get_step_deviation")
            for _ in range(REFERENCE_REPEATS):
                write(written + 1)
                cumulative.append(reference.call_timed(goodput_worker, "get_job_goodput",
                                                       include_badput_breakdown=True)[1])
                write(written + 1)
                deviation.append(reference.call_timed(deviation_worker, "get_step_deviation")[1])
        reference.release(log, goodput_worker, deviation_worker)
    return cumulative + deviation


def _engine_seconds(messages: list[Message]) -> list[float]:
    """Seconds to parse every message and add it to the run's state, per pass."""
    from pipeline.core import engine
    from pipeline.core.events import parse_batch

    passes = []
    for _ in range(ENGINE_PASSES):
        state = engine.RunState(messages[0].run_id)
        started = time.perf_counter()
        for message in messages:
            batch, dead = parse_batch(message.data)
            assert batch is not None and not dead
            state.add_batch(batch)
        passes.append(time.perf_counter() - started)
    return passes


def _parsed(messages: list[Message]) -> list[Any]:
    from pipeline.core.events import parse_batch

    return [parse_batch(message.data)[0] for message in messages]


def _checkpoints(messages: list[Message]) -> list[tuple[bytes, int]]:
    """The encoded state when the run first reaches each size of STATE_SIZES, and the index of
    the next message. As in the stream, the state was snapshotted before (as of the message
    before the last), so its detector has been fed the steps up to then."""
    from pipeline.core import engine, state_coder
    from pipeline.core.events import parse_batch

    state = engine.RunState(messages[0].run_id)
    found: list[tuple[bytes, int]] = []
    steps = 0
    for index, message in enumerate(messages):
        batch, _ = parse_batch(message.data)
        assert batch is not None
        state.add_batch(batch)
        steps += len(batch.steps)
        if len(found) < len(STATE_SIZES) and steps >= STATE_SIZES[len(found)]:
            state.snapshot(messages[index - 1].event_time_us)
            found.append((state_coder.encode_state(state), index + 1))
    assert len(found) == len(STATE_SIZES)
    return found


def _hot_bytes(data: bytes) -> int:
    """The size of the hot part of a state encoded whole, sealed as a compaction seals it."""
    from pipeline.core import state_coder

    state = state_coder.decode_state(data)
    state_coder.seal(state)
    return len(state_coder.encode_state(state))


def _state_seconds(checkpoints: list[tuple[bytes, int]], messages: list[Message],
                   windows_s: tuple[int, ...]) -> list[float]:
    """Per size and repeat: [encode, decode + snapshot, snapshot of the kept state]."""
    from pipeline.core import state_coder
    from pipeline.core.events import parse_batch

    timings = []
    for data, next_index in checkpoints:
        for _ in range(STATE_REPEATS):
            state = state_coder.decode_state(data)
            started = time.perf_counter()
            state_coder.encode_state(state)
            encode = time.perf_counter() - started
            started = time.perf_counter()
            state = state_coder.decode_state(data)
            as_of = max(a.last_event_us for a in state.attempts.values())
            state.snapshot(as_of, windows_s)
            cold = time.perf_counter() - started
            # The same state kept in memory: the next message, then the next snapshot.
            batch, _ = parse_batch(messages[next_index].data)
            assert batch is not None
            state.add_batch(batch)
            as_of = max(a.last_event_us for a in state.attempts.values())
            started = time.perf_counter()
            state.snapshot(as_of, windows_s)
            timings += [encode, cold, time.perf_counter() - started]
    return timings


def _write_seconds(write: Callable[[list[Any]], int], items: list[Any],
                   make: Callable[[Any], Iterable[Any]]) -> float:
    """This thread's CPU for writing what ``make`` makes of ``items``, ``SINK_BUNDLE`` items a
    write, none left unwritten (``write`` returns how many it could not write)."""
    started, unwritten = time.thread_time(), 0
    for k in range(0, len(items), SINK_BUNDLE):
        unwritten += write([made for item in items[k:k + SINK_BUNDLE] for made in make(item)])
    if unwritten:
        raise RuntimeError(f"the stand-ins refused {unwritten} rows or points")
    return time.thread_time() - started


def _sink_seconds(batches: list[Any], snapshot: Any) -> tuple[float, float, float]:
    """This thread's CPU (``time.thread_time``) for the sinks' writes through the real client
    libraries to the local stand-ins (each serving on threads of its own): an event's ``events``
    row (s per event), and a snapshot's rows and its Monitoring points (s per snapshot), written
    ``SINK_BUNDLE`` messages or runs at a time. The snapshot is written as ``SINK_SNAPSHOTS`` runs
    of its own, its points stamped now as the pipeline stamps them."""
    from pipeline.core.rows import EVENTS, by_table, event_rows, snapshot_rows
    from pipeline.emulators.bigquery import BigQueryEmulator
    from pipeline.emulators.monitoring import MonitoringEmulator
    from pipeline.sinks import bigquery, monitoring

    now_us = time.time_ns() // 1_000
    runs = [dataclasses.replace(snapshot, run_id=f"{FLEET_RUN_ID}-{k}") for k in range(SINK_SNAPSHOTS)]

    def stamped(run: Any) -> list[Any]:  # as the pipeline's gate stamps them, now
        return [dataclasses.replace(point, end_us=now_us) for point in monitoring.snapshot_points(run)]

    with BigQueryEmulator() as tables, MonitoringEmulator() as metrics:
        client = bigquery.make_client(SINK_PROJECT, tables.endpoint)
        bigquery.create_tables(client, SINK_PROJECT, SINK_DATASET)
        rows = bigquery.BigQueryWriter(client, SINK_PROJECT, SINK_DATASET)
        points = monitoring.MetricWriter(monitoring.make_client(metrics.host), SINK_PROJECT)

        event_s = _write_seconds(lambda made: rows.write({EVENTS: made}), batches, event_rows)
        snapshot_rows_s = _write_seconds(lambda made: rows.write(by_table(made)), runs, snapshot_rows)
        points_s = _write_seconds(points.write, runs, stamped)
    return event_s / sum(len(batch) for batch in batches), snapshot_rows_s / len(runs), points_s / len(runs)


def _published_volumes(messages: list[Message]) -> list[int]:
    """Pub/Sub data volume of each message as the emitter's transport publishes it."""
    volumes: list[int] = []

    class RecordingPublisher:
        def publish(self, topic: str, data: bytes, ordering_key: str = "", retry: object = None,
                    timeout: object = None, **attributes: str) -> Future[None]:
            volumes.append(len(data) + len(ordering_key.encode())
                           + sum(len(k.encode()) + len(v.encode()) for k, v in attributes.items())
                           + PUBSUB_TIMESTAMP_BYTES + PUBSUB_MESSAGE_ID_BYTES)
            done: Future[None] = Future()
            done.set_result(None)
            return done

    transport = PubSubTransport(TOPIC)
    transport._client = RecordingPublisher()  # the real send path, with a client that keeps the call
    for message in messages:
        transport.send(message)
    return volumes


def _terraform_default(name: str) -> str:
    text = (REPO / "terraform" / "variables.tf").read_text()
    block = re.search(rf'variable "{name}" {{(.*?)\n}}', text, re.S)
    assert block is not None, name
    value = re.search(r"^\s*default\s*=\s*(.+)$", block.group(1), re.M)
    assert value is not None, name
    return value.group(1).strip().strip('"')


def _size(n: float) -> str:
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:,.1f} {unit}"
    return f"{n:,.0f} B"


def _cores(n: float) -> str:
    return f"{n:,.1f}" if n >= 10 else f"{n:.2f}" if n >= 0.1 else f"{n:.3f}"


def _row(label: str, values: list[str]) -> str:
    return f"| {label} | " + " | ".join(values) + " |"


def run() -> str:
    with ReferenceRunner() as runner:
        return _run(runner)


def _run(runner: ReferenceRunner) -> str:
    from benchmarks.state_io import state_writes  # which takes this module's fleet run
    from pipeline.beam.options import GoodputOptions
    from pipeline.core import state_coder
    from pipeline.core.rows import snapshot_rows
    from pipeline.sinks.monitoring import MAX_SERIES_PER_REQUEST, snapshot_points

    options = GoodputOptions([])
    interval_s, windows_s = float(options.snapshot_interval_s), tuple(options.windows)
    deviation_s = float(next(p["default"] for p in runner.parameters("monitoring.GoodputMonitor.__init__")
                             if p["name"] == "step_deviation_interval_seconds"))
    machine_type = _terraform_default("machine_type")
    vcpus = int(machine_type.rsplit("-", 1)[1])  # predefined GCE types end in their vCPU count
    max_workers = int(_terraform_default("max_workers"))

    # Each side is measured with only its own data on the heap: full collections scan it all. The
    # reference's heap is its worker's; this process drops the entries before measuring ours.
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / "run.jsonl"
        log = _write_run(path, STEPS, runner)
        assert log is not None
        written = runner.entries(log)
        runner.release(log)
        entries = [e for e in written if "job_end_time" not in e]  # a job still running
        reference = _on_one_core(functools.partial(_reference_seconds, runner, entries), pid=runner.pid)
        running_entries, all_entries = len(entries), len(written)
        cumulative_sizes, deviation_sizes = _reference_polls(entries)
        entry_times = [_entry_time(e) for e in written]
        del written, entries
        attempt_id, records = _records_of(path)
    messages = _live_messages("bench-run", attempt_id, records)
    engine_passes = _on_one_core(lambda: _engine_seconds(messages))
    writes_s, writes_bytes = _on_one_core(lambda: state_writes(_parsed(messages)))
    checkpoints = _checkpoints(messages)
    state = _on_one_core(lambda: _state_seconds(checkpoints, messages, windows_s))
    fleet_records = _fleet_records(FLEET_SAMPLE_STEPS)
    fleet_messages = _live_messages(FLEET_RUN_ID, attempt_id, fleet_records)
    fleet_passes = _on_one_core(lambda: _engine_seconds(fleet_messages))
    fleet_writes_s, fleet_writes_bytes = _on_one_core(lambda: state_writes(_parsed(fleet_messages)))
    volumes = _published_volumes(fleet_messages)

    half = len(reference) // 2
    cumulative = _Line.fit([float(n) for n in cumulative_sizes], reference[:half])
    deviation = _Line.fit([float(n) for n in deviation_sizes], reference[half:])
    worst_miss, worst_of = max((abs(cumulative(n) - s), s) for n, s in
                               _medians(cumulative_sizes, reference[:half], REFERENCE_REPEATS))
    sizes = [float(s) for s in STATE_SIZES for _ in range(STATE_REPEATS)]
    encode = _Line.fit(sizes, state[0::3])
    cold = _Line.fit(sizes, state[1::3])
    warm = _Line.fit(sizes, state[2::3])
    state_bytes = [len(data) for data, _ in checkpoints]
    hot_bytes = [_hot_bytes(data) for data, _ in checkpoints]  # what a message reads, cache missing
    per_step_bytes = (state_bytes[-1] - state_bytes[0]) / (STATE_SIZES[-1] - STATE_SIZES[0])

    # -- part 1: the run's life --------------------------------------------------------------
    start_s, end_s = entry_times[0], entry_times[-1]
    life_s = end_s - start_s

    def history(at_s: float) -> int:
        return bisect.bisect_right(entry_times, at_s)

    polls = int(life_s // POLL_S)
    seen = [history(start_s + k * POLL_S) for k in range(polls + 1)]
    recomputes = [n for previous, n in itertools.pairwise(seen) if n > previous]
    reference_total = sum(cumulative(n) for n in recomputes)
    deviation_polls = int(life_s // deviation_s)
    deviation_seen = [history(start_s + k * deviation_s) for k in range(deviation_polls + 1)]
    deviation_total = sum(deviation(n) for previous, n in itertools.pairwise(deviation_seen)
                          if n > previous)

    step_times = [r[1] for r in records if r[2] == "step_start"]
    steps_after, steps = [], 0
    for message in messages:
        steps += message.data.count(b'"step_start"')
        steps_after.append(steps)
    whole_total = sum(encode(n) for n in steps_after)  # the whole state after every message
    whole_bytes = sum(state_bytes[0] + per_step_bytes * (n - STATE_SIZES[0]) for n in steps_after)
    snapshot_times = [records[0][1] + round(k * interval_s * 1e6)
                      for k in range(1, int(life_s // interval_s) + 1)] + [records[-1][1]]
    snapshot_steps = [bisect.bisect_right(step_times, t) for t in snapshot_times]
    snapshot_total = sum(warm(n) for n in snapshot_steps)
    cold_total = sum(cold(n) for n in snapshot_steps)
    engine_total = statistics.median(engine_passes)
    ours_total = engine_total + writes_s + snapshot_total
    events = len(records)

    # -- part 2: fleets ----------------------------------------------------------------------
    fleet_events = len(fleet_records)
    per_event_s = statistics.median(fleet_passes) / fleet_events
    events_per_message = fleet_events / len(fleet_messages)
    fleet_life_s = (fleet_messages[-1].event_time_us - T0_US) / 1e6
    messages_per_run_s = len(fleet_messages) / fleet_life_s
    volume = statistics.mean(volumes)
    billable = statistics.mean(max(PUBSUB_MIN_REQUEST_BYTES, v) for v in volumes)
    mean_steps = STEPS / 2
    writes_per_message_s = fleet_writes_s / len(fleet_messages)
    written_per_message = fleet_writes_bytes / len(fleet_messages)
    snapshot_mean = warm(mean_steps)
    state_mean_bytes = state_bytes[0] + per_step_bytes * (mean_steps - STATE_SIZES[0])
    hot_mean_bytes = statistics.mean(hot_bytes)  # the same at any history
    full = state_coder.decode_state(checkpoints[-1][0])
    snapshot = full.snapshot(max(a.last_event_us for a in full.attempts.values()), windows_s)
    assert snapshot is not None
    rows = list(snapshot_rows(snapshot))
    series = len(snapshot_points(snapshot))
    row_event_s, row_snapshot_s, points_snapshot_s = _sink_seconds(
        _parsed(fleet_messages[:SINK_MESSAGES]), snapshot)
    events_per_run_s = EVENTS_PER_STEP / STEP_S
    entries_per_s = running_entries / life_s
    rolling_reads = 1 + sum(math.ceil(w * entries_per_s / LIST_PAGE_MAX) for w in windows_s[1:])
    reads_per_run_min = {
        f"cumulative every {POLL_S:g} s": 60 / POLL_S,
        f"+ step deviation every {deviation_s:g} s": 60 / POLL_S + 60 / deviation_s,
        f"+ rolling windows {','.join(map(str, windows_s))} every {POLL_S:g} s":
            60 / POLL_S + 60 / deviation_s + rolling_reads * 60 / POLL_S,
    }
    reference_requests_min = 60 / POLL_S + 60 / deviation_s + len(windows_s) * 60 / POLL_S

    cores: dict[str, list[float]] = {"parse + add": [], "state writes": [], "snapshots": [],
                                     "BigQuery rows": [], "Monitoring points": []}
    fleet_rows: dict[str, list[str]] = {}

    def add(label: str, value: str) -> None:
        fleet_rows.setdefault(label, []).append(value)

    def monthly_usd(bytes_per_s: float) -> float:
        return bytes_per_s * MONTH_S / 1e9 * STREAMING_ENGINE_USD_PER_GB

    for runs in FLEETS:
        messages_s = runs * messages_per_run_s
        snapshots_s = runs / interval_s
        cores["parse + add"].append(runs * events_per_run_s * per_event_s)
        cores["state writes"].append(messages_s * writes_per_message_s)
        cores["snapshots"].append(snapshots_s * snapshot_mean)
        cores["BigQuery rows"].append(runs * events_per_run_s * row_event_s + snapshots_s * row_snapshot_s)
        cores["Monitoring points"].append(snapshots_s * points_snapshot_s)
        needed = sum(c[-1] for c in cores.values())
        add("events/s", f"{runs * events_per_run_s:,.0f}")
        add("Pub/Sub messages (publish requests)/s", f"{messages_s:,.0f}")
        add("Pub/Sub published volume/s", _size(messages_s * volume))
        add("Pub/Sub billable publish volume/s (≥ 1,000 B a request)", _size(messages_s * billable))
        add("Pub/Sub per month: published / billable publish / delivered to the pipeline",
            f"{_size(messages_s * volume * MONTH_S)} / {_size(messages_s * billable * MONTH_S)} / "
            f"{_size(messages_s * volume * MONTH_S)}")
        for label, values in cores.items():
            add(f"cores: {label}", _cores(values[-1]))
        add("**cores: the whole path** (CPU per event)",
            f"**{_cores(needed)}** ({needed / (runs * events_per_run_s) * 1e6:.1f} µs)")
        workers = math.ceil(needed / vcpus)
        add(f"Dataflow workers ({machine_type}, {vcpus} vCPUs)",
            f"{workers:,}" + (f" (over max_workers {max_workers})" if workers > max_workers else ""))
        add("Beam state written/s (a log entry per message, compaction included)",
            _size(messages_s * written_per_message))
        add("Beam state written/s had every message written the whole state",
            _size(messages_s * state_mean_bytes))
        add(f"state writes per month at an example ${STREAMING_ENGINE_USD_PER_GB} per GB processed: "
            "a log entry / the whole state",
            f"${monthly_usd(messages_s * written_per_message):,.2f} / "
            f"${monthly_usd(messages_s * state_mean_bytes):,.0f}")
        add("Beam state read/s with the cache missing every time (Dataflow: any SDK process gets "
            "a run's message, and reads its hot state, not the archive of its older steps)",
            _size(messages_s * hot_mean_bytes))
        add(f"state reads per month, cache missing, at ${STREAMING_ENGINE_USD_PER_GB} per GB processed",
            f"${monthly_usd(messages_s * hot_mean_bytes):,.0f}")
        add("cores: snapshots with the cache missing (decode + snapshot)",
            _cores(snapshots_s * cold(mean_steps)))
        add("ours: Cloud Monitoring create_time_series/min",
            f"{math.ceil(runs * series / MAX_SERIES_PER_REQUEST) * 60 / interval_s:,.0f}")
        add("BigQuery rows/s (raw events + snapshot rows)",
            f"{runs * (events_per_run_s + len(rows) / interval_s):,.0f}")
        for label, per_run in reads_per_run_min.items():
            add(f"reference: entries.list/min, {label}", f"{runs * per_run:,.0f}")
        add("reference: Cloud Monitoring create_time_series/min", f"{runs * reference_requests_min:,.0f}")

    # -- the section -------------------------------------------------------------------------
    lines = [
        "## Costs: a run's life and a fleet, against the reference",
        "",
        __doc__.split("\n\n", 1)[1].strip(),
        "",
        f"### One run: {STEPS:,} steps, {life_s / 3600:.1f} h, reference polling every {POLL_S:g} s",
        "",
        "| history (log entries) | reference: cumulative poll (s) | reference: step-deviation poll (s) |",
        "|---|---|---|",
    ]
    for size, i in zip(REFERENCE_SIZES, range(0, half, REFERENCE_REPEATS), strict=True):
        lines.append(f"| {size:,} | {summary(reference[i:i + REFERENCE_REPEATS], digits=3)} | "
                     f"{summary(reference[half + i:half + i + REFERENCE_REPEATS], digits=3)} |")
    lines += [
        "",
        f"Lines through every timing: cumulative poll {cumulative.describe('entries')}, step-deviation "
        f"poll {deviation.describe('entries')}. The cumulative line misses a size's median by at most "
        f"{worst_miss * 1e3:,.0f} ms ({worst_miss / worst_of:.0%} of it).",
        "",
        "| history (steps) | state (bytes) | encode whole (ms: a compaction) | "
        "snapshot of the kept state (ms) | decode + snapshot, a run not kept (ms) |",
        "|---|---|---|---|---|",
    ]
    for k, size in enumerate(STATE_SIZES):
        part = slice(k * STATE_REPEATS, (k + 1) * STATE_REPEATS)
        lines.append(f"| {size:,} | {state_bytes[k]:,} | {summary(state[0::3][part], 1e3, 3)} | "
                     f"{summary(state[2::3][part], 1e3, 3)} | {summary(state[1::3][part], 1e3, 3)} |")
    lines += [
        "",
        f"Lines through every timing: encode {encode.describe('steps')}, snapshot of the kept state "
        f"{warm.describe('steps')}, decode + snapshot {cold.describe('steps')}.",
        "",
        "| over the run's life | reference | ours |",
        "|---|---|---|",
        f"| events / log entries | {all_entries:,} | {events:,} |",
        f"| messages published | | {len(messages):,} ({events / len(messages):.2f} events each) |",
        f"| polls / snapshots | {polls:,} cumulative, {deviation_polls:,} step deviation | "
        f"{len(snapshot_times):,} |",
        f"| Cloud Logging entries.list calls: cumulative worker | {polls:,} | 0 |",
        f"| Cloud Logging entries.list calls: + step-deviation worker | {polls + deviation_polls:,} | 0 |",
        f"| Cloud Logging entries.list calls: + rolling windows {','.join(map(str, windows_s))} | "
        f"{polls + deviation_polls + polls * rolling_reads:,} | 0 |",
        f"| CPU: cumulative recompute per poll (s) | {reference_total:,.1f} | |",
        f"| CPU: parse + add every message (s) | | {engine_total:,.2f} |",
        f"| CPU: state writes: a log entry per message, compaction when due (s) | | {writes_s:,.2f} |",
        f"| CPU: snapshot of the kept state per snapshot (s) | | {snapshot_total:,.2f} |",
        f"| **CPU total (s)** | **{reference_total:,.1f}** | **{ours_total:,.2f}** |",
        f"| CPU: step-deviation worker, not in the total (s) | {deviation_total:,.1f} | |",
        f"| Beam state written (bytes) | | {writes_bytes:,} |",
        "",
        f"Over the life the reference's cumulative worker spends {reference_total / ours_total:,.0f}× "
        f"the CPU of our pipeline's per-run work ({(reference_total + deviation_total) / ours_total:,.0f}× "
        f"with its step-deviation worker). Of ours, the state writes are {writes_s / ours_total:.0%}; "
        f"writing the whole state after every message instead would have cost {whole_total:,.2f} s "
        f"and {whole_bytes:,.0f} bytes, growing with the history. A worker that had to decode "
        f"the run for every snapshot (none kept) would spend {cold_total:,.1f} s on snapshots instead "
        f"of {snapshot_total:,.2f} s.",
        "",
        f"### Fleets: {EVENTS_PER_STEP} events per {STEP_S:g} s step per run, mean history "
        f"{mean_steps:,.0f} steps",
        "",
        "| measured input | value |",
        "|---|---|",
        f"| parse + add, live messages of {events_per_message:.2f} events (µs per event) | "
        f"{summary([p / fleet_events for p in fleet_passes], 1e6)} |",
        f"| parse + add per message (µs) | "
        f"{statistics.median(fleet_passes) / len(fleet_messages) * 1e6:.1f} |",
        f"| events per core-second (engine bound) | {1 / per_event_s:,.0f} |",
        f"| Pub/Sub volume per message / per event (bytes) | {volume:,.0f} / "
        f"{volume / events_per_message:,.0f} |",
        f"| messages per run per second | {messages_per_run_s:.3f} |",
        f"| state writes per message over a {FLEET_SAMPLE_STEPS:,}-step life, compaction included "
        f"(µs / bytes) | {writes_per_message_s * 1e6:.1f} / {written_per_message:,.0f} |",
        f"| snapshot of the kept state at {mean_steps:,.0f} steps (ms) | {snapshot_mean * 1e3:.3f} |",
        f"| state at {mean_steps:,.0f} steps (bytes) | {state_mean_bytes:,.0f} |",
        f"| of it, the hot state a message reads, cache missing (bytes) | {hot_mean_bytes:,.0f} |",
        f"| Monitoring series per run per snapshot (pipeline's point builder) | {series} |",
        f"| BigQuery snapshot rows per run per snapshot | {len(rows)} |",
        f"| BigQuery: an event's events row, our writer + the client library (µs) | "
        f"{row_event_s * 1e6:.1f} |",
        f"| BigQuery: a snapshot's rows, our writer + the client library (ms) | {row_snapshot_s * 1e3:.3f} |",
        f"| Monitoring: a snapshot's points, our writer + the client library (ms) | "
        f"{points_snapshot_s * 1e3:.3f} |",
        f"| snapshot interval (pipeline default) | {interval_s:g} s |",
        "",
        "| figure | " + " | ".join(f"{runs:,} runs" for runs in FLEETS) + " |",
        "|---|" + "---|" * len(FLEETS),
        *(_row(label, values) for label, values in fleet_rows.items()),
        "",
        "The reference's ceiling: the runs one project's Cloud Logging read quota can monitor.",
        "",
        "| reference monitor | entries.list per run per minute | "
        + " | ".join(f"runs at {q}/min" for q in LOGGING_QUOTAS_PER_MIN) + " |",
        "|---|---|" + "---|" * len(LOGGING_QUOTAS_PER_MIN),
        *(_row(label, [f"{per_run:g}", *(f"{math.floor(q / per_run):,}" for q in LOGGING_QUOTAS_PER_MIN)])
          for label, per_run in reads_per_run_min.items()),
        "",
        f"The reference's Monitoring requests count one create_time_series per upload cycle per run: "
        f"cumulative every {POLL_S:g} s, step deviation every {deviation_s:g} s, one per rolling window "
        f"every {POLL_S:g} s ({reference_requests_min:g} a minute per run). Ours pack {series} series "
        f"per run into requests of {MAX_SERIES_PER_REQUEST} every snapshot. The reference's monitor "
        f"runs on each job's own host; ours needs the Dataflow workers above.",
    ]
    return "\n".join(lines)
