"""Streaming freshness under rising load on the DirectRunner, through the local Pub/Sub emulator.

The streaming pipeline runs as its own process (``--runner=BundleBasedDirectRunner``, a 5 s
snapshot interval, DuckDB output) reading a subscription of the local emulator; the emulator, the
publisher (the real Pub/Sub client) and the watcher run in the benchmark's process. The watcher
opens the DuckDB file read-only every 0.25 s (20 ms after a read that found it being written)
and reads each run's latest ``last_step``.

* Throughput, first: 100 runs publish ten 1,000-event messages each as fast as they can; events
  per second from the first publish until every run's snapshot shows its last step.
* Load levels: 1,000, 3,000, 10,000, 30,000, 100,000 step events/s, each for 20 s with new run
  ids, until one breaks: 100 runs stepping 10 times a second, 300 such runs, 1,000, then 1,000
  runs stepping 30 and 100 times a second. Each run sends what the emitter would with its
  defaults: a message when its oldest event has waited 2 s (``max_latency_s``) or 1,000 events
  are queued; the first also carries the job start. One publishing loop spreads the runs'
  messages evenly; a message it cannot issue within the 20 s is not issued. Every message is a
  probe: its freshness is the time from its publish call to the first read of the DuckDB file
  whose ``last_step`` for the run reaches the message's last step; a probe not seen 30 s after
  the last publish is never seen.
* Per level: offered events/s (the schedule) and messages/s; achieved events/s (events whose
  publish the emulator acknowledged, over the 20 s); read events/s (achieved less what was still
  in the subscription at the end of the load); freshness median and p99; probes never seen; the
  subscription's backlog (messages not yet pulled, at the end of the load and at its peak); the
  CPU the pipeline process and the benchmark process used during the load, in cores (1.00 is one
  core busy), and, for the pipeline's busiest thread, the share of the time it ran and the share
  it waited for a CPU (``/proc``: ``stat``, ``schedstat``).
* A level breaks when freshness p99 exceeds the snapshot interval + 5 s, a probe is never seen,
  or achieved falls under 90 % of offered. What broke is read from the figures: the publishing
  loop (it could not issue its schedule), the emulator (publishes acknowledged late or not at
  all), the pipeline (it read less than was published and the backlog grew: CPU-bound if its
  busiest thread ran or waited for a CPU 80 % of the time), or what follows the read (messages
  pulled as they came, snapshots late). For the DuckDB writes: the share of the watcher's
  scheduled reads that found the file held by a write (how much of the time the pipeline's
  writes held it), and, once the pipeline has stopped, the time of one write as the pipeline
  makes it (open the file, append a bundle of as many messages as the DirectRunner pulls at
  once, at most, and close it).
"""

from __future__ import annotations

import collections
import dataclasses
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import duckdb

from benchmarks.common import cpu_s, percentile, stop
from emitter.settings import EmitterSettings
from pipeline.beam.direct_runner import PULL_MAX_MESSAGES

REPO = Path(__file__).resolve().parent.parent
PROJECT = "projects/goodput-bench"
TOPIC = f"{PROJECT}/topics/events"
SUBSCRIPTION = f"{PROJECT}/subscriptions/pipeline"
INTERVAL_S = 5.0
TARGET_S = INTERVAL_S + 5
TARGET_RATE = 10_000  # step events/s at which the freshness target must hold
T0_US = 1_750_000_000 * 1_000_000  # 2025: event times must not be ahead of the clock
#: (step events per second, runs), in the order they are tried.
LEVELS = ((1_000, 100), (3_000, 300), (10_000, 1_000), (30_000, 1_000), (100_000, 1_000))
SEND_EVERY_S = EmitterSettings.max_latency_s
MAX_BATCH = EmitterSettings.max_batch_events
LOAD_S = 20.0
SEEN_WITHIN_S = 30.0
# A write that finds the file open retries 0.1 s later: a reader every 0.1 s held the file about
# a third of the time and slowed the pipeline it measured, so the watcher reads less often.
READ_EVERY_S = 0.25
RETRY_READ_S = 0.02
ACHIEVED_SHARE = 0.9
ACK_LATE_S = 1.0  # a publish acknowledged later than this is the emulator falling behind
ONE_CORE = 0.8  # a thread running or waiting for a CPU this share of the time is CPU-bound
WRITES_HELD = 0.8  # writes holding the file this share of the time are the bottleneck
WRITE_REPEATS = 7
BURST_RUNS, BURST_MESSAGES, BURST_EVENTS = 100, 10, 1_000
BURST_WITHIN_S = 120.0


def _threads(pid: int) -> dict[str, tuple[float, float]]:
    """Seconds each thread of process ``pid`` has run and waited for a CPU so far."""
    times = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            ran_ns, waited_ns, _ = (int(field) for field in (task / "schedstat").read_text().split())
        except (FileNotFoundError, ProcessLookupError):  # the thread ended meanwhile
            continue
        times[task.name] = (ran_ns / 1e9, waited_ns / 1e9)
    return times


def _message(run_id: str, first_seq: int, steps: range, step_us: int, start: bool) -> bytes:
    from goodput_schemas.wire import encode_batch

    records = []
    seq = first_seq
    if start:
        records.append((seq, T0_US, "job_start", {"chip_count": 8}))
        seq += 1
    for step in steps:
        records.append((seq, T0_US + (step + 1) * step_us, "step_start", {"step": step}))
        seq += 1
    return encode_batch(run_id, f"{run_id}-attempt", records).data


@dataclasses.dataclass
class Level:
    """One load level's schedule, its probes, and what was measured at it."""

    rate: int
    runs: int
    prefix: str  # of its run ids: "{prefix}{index}"
    offered: int = 0  # step events scheduled
    issued: int = 0  # step events the publishing loop handed to the client in time
    acknowledged: int = 0  # step events whose publish the emulator acknowledged
    publish_errors: int = 0
    ack_latencies: list[float] = dataclasses.field(default_factory=list)
    loop_cores: float = 0.0
    # Per run: (last step of a message, when it was published), oldest first, until seen.
    probes: list[collections.deque[tuple[int, float]]] = dataclasses.field(default_factory=list)
    freshness: list[float] = dataclasses.field(default_factory=list)
    unseen: int = 0
    backlog_start: int = 0
    backlog_end: int = 0
    backlog_peak: int = 0
    pipeline_cores: float = 0.0
    thread_ran: float = 0.0  # share of the time the pipeline's busiest thread ran
    thread_waited: float = 0.0  # and waited for a CPU
    bench_cores: float = 0.0
    reads: int = 0  # the watcher's scheduled reads during the load
    locked_reads: int = 0  # of those, the ones that found the file held by a write
    watcher_hold_s: float = 0.0  # time the watcher's own read-only opens held the file

    @property
    def per_message(self) -> int:
        return min(MAX_BATCH, round(self.rate / self.runs * SEND_EVERY_S))

    @property
    def every_s(self) -> float:
        """Seconds between a run's messages."""
        return self.per_message * self.runs / self.rate

    @property
    def messages_per_s(self) -> float:
        return self.runs / self.every_s

    @property
    def achieved(self) -> float:
        return self.acknowledged / LOAD_S

    @property
    def read(self) -> float:
        """Events/s the pipeline pulled: those acknowledged less those still in the backlog."""
        growth = max(0, self.backlog_end - self.backlog_start)
        return max(0, self.acknowledged - growth * self.per_message) / LOAD_S

    @property
    def median(self) -> float:
        return statistics.median(self.freshness) if self.freshness else float("nan")

    @property
    def p99(self) -> float:
        return percentile(self.freshness, 99) if self.freshness else float("inf")

    @property
    def ack_p99(self) -> float:
        return percentile(self.ack_latencies, 99) if self.ack_latencies else float("inf")

    @property
    def held_share(self) -> float:
        return self.locked_reads / max(1, self.reads)

    @property
    def broke(self) -> bool:
        return self.p99 > TARGET_S or self.unseen > 0 or self.achieved < ACHIEVED_SHARE * self.rate


class Watcher:
    """Reads each run's latest snapshot step from the DuckDB file, read-only, marking probes seen;
    samples the subscription's backlog while ``loading``."""

    def __init__(self, database: Path, broker: Any, level: Level) -> None:
        self.database, self.broker, self.level = database, broker, level
        self.loading = False
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="freshness-watcher", daemon=True)

    def __enter__(self) -> Watcher:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stopping.set()
        self._thread.join(timeout=30)

    def pending(self) -> int:
        return sum(len(queue) for queue in self.level.probes)

    def wait_until_seen(self, deadline: float) -> None:
        while self.pending() and time.monotonic() < deadline:
            time.sleep(0.05)

    def _watch(self) -> None:
        level = self.level
        retrying = False
        while not self._stopping.is_set():
            polled = time.monotonic()
            if self.loading and not retrying:
                backlog = self.broker.unacknowledged(SUBSCRIPTION)
                level.backlog_end, level.backlog_peak = backlog, max(level.backlog_peak, backlog)
            rows = None
            try:
                with duckdb.connect(str(self.database), read_only=True) as connection:
                    rows = connection.execute(
                        "SELECT run_id, max(last_step) FROM goodput_snapshots "
                        "WHERE starts_with(run_id, ?) GROUP BY run_id", [level.prefix]).fetchall()
            except (duckdb.IOException, duckdb.CatalogException):  # being written; not yet created
                pass
            if self.loading:
                level.reads += not retrying
                level.locked_reads += rows is None and not retrying
                level.watcher_hold_s += time.monotonic() - polled if rows is not None else 0.0
            for run_id, last in rows or ():
                queue = level.probes[int(run_id[len(level.prefix):])]
                while queue and last is not None and queue[0][0] <= last:
                    level.freshness.append(polled - queue.popleft()[1])
            retrying = rows is None
            pause = RETRY_READ_S if retrying else READ_EVERY_S - (time.monotonic() - polled)
            self._stopping.wait(max(0.0, pause))


def _publish(publisher: Any, level: Level) -> None:
    """Publishes the level's schedule for LOAD_S, then waits (bounded) for every answer."""
    runs, per_message, every_s = level.runs, level.per_message, level.every_s
    step_us = round(every_s * 1e6 / per_message)
    sends = int(LOAD_S / every_s)
    level.probes = [collections.deque() for _ in range(runs)]
    level.offered = sends * runs * per_message
    answered, lock = [0], threading.Lock()

    def done(future: Any, called: float) -> None:
        latency = time.monotonic() - called
        with lock:
            answered[0] += 1
            if future.exception() is None:
                level.acknowledged += per_message
                level.ack_latencies.append(latency)
            else:
                level.publish_errors += 1

    issued = 0
    started, cpu_started = time.monotonic(), time.thread_time()
    for message in range(sends * runs):
        send, index = divmod(message, runs)
        due, now = started + (send + index / runs) * every_s, time.monotonic()
        if now >= started + LOAD_S:
            break
        if due > now + 0.002:
            time.sleep(due - now)
            now = time.monotonic()
        run_id = f"{level.prefix}{index}"
        steps = range(send * per_message, (send + 1) * per_message)
        data = _message(run_id, 0 if send == 0 else steps.start + 1, steps, step_us, send == 0)
        level.probes[index].append((steps[-1], now))  # before publishing: the watcher may see it
        publisher.publish(TOPIC, data).add_done_callback(lambda f, called=now: done(f, called))
        issued += 1
    level.loop_cores = (time.thread_time() - cpu_started) / LOAD_S
    level.issued = issued * per_message
    time.sleep(max(0.0, started + LOAD_S - time.monotonic()))
    deadline = time.monotonic() + SEEN_WITHIN_S
    while answered[0] < issued and time.monotonic() < deadline:
        time.sleep(0.05)


def _run_level(publisher: Any, broker: Any, database: Path, stream: subprocess.Popen[bytes],
               level: Level) -> None:
    level.backlog_start = broker.unacknowledged(SUBSCRIPTION)
    with Watcher(database, broker, level) as watcher:
        threads_before = _threads(stream.pid)
        pipeline_cpu, bench_cpu, began = cpu_s(stream.pid), cpu_s("self"), time.monotonic()
        watcher.loading = True
        _publish(publisher, level)
        watcher.loading = False
        elapsed = time.monotonic() - began
        level.pipeline_cores = (cpu_s(stream.pid) - pipeline_cpu) / elapsed
        level.bench_cores = (cpu_s("self") - bench_cpu) / elapsed
        used = []
        for tid, (ran, waited) in _threads(stream.pid).items():
            ran_before, waited_before = threads_before.get(tid, (0.0, 0.0))
            used.append((ran - ran_before, waited - waited_before))
        ran, waited = max(used, default=(0.0, 0.0))
        level.thread_ran, level.thread_waited = ran / elapsed, waited / elapsed
        last_publish = max((queue[-1][1] for queue in level.probes if queue), default=time.monotonic())
        watcher.wait_until_seen(last_publish + SEEN_WITHIN_S)
    level.unseen = sum(len(queue) for queue in level.probes)


def _burst(publisher: Any, broker: Any, database: Path) -> float | None:
    """Events/s of the throughput burst, or None if it did not finish in BURST_WITHIN_S."""
    level = Level(BURST_RUNS * BURST_EVENTS, BURST_RUNS, "burst-")
    last = BURST_MESSAGES * BURST_EVENTS - 1
    with Watcher(database, broker, level) as watcher:
        started = time.monotonic()
        level.probes = [collections.deque([(last, started)]) for _ in range(BURST_RUNS)]
        futures = []
        for chunk in range(BURST_MESSAGES):
            for index in range(BURST_RUNS):
                steps = range(chunk * BURST_EVENTS, (chunk + 1) * BURST_EVENTS)
                data = _message(f"burst-{index}", 0 if chunk == 0 else steps.start + 1, steps,
                                1_000_000, chunk == 0)
                futures.append(publisher.publish(TOPIC, data))
        for future in futures:
            future.result(timeout=60)
        watcher.wait_until_seen(started + BURST_WITHIN_S)
    if watcher.pending():
        return None
    return BURST_RUNS * BURST_MESSAGES * BURST_EVENTS / max(level.freshness)


def _write_s(database: Path, per_message: int) -> float:
    """Median seconds of one DuckDB write of a read bundle as the pipeline makes it: open the
    file, append PULL_MAX_MESSAGES messages of ``per_message`` step events, close it."""
    from pipeline.core.events import parse_batch
    from pipeline.core.rows import Element, batch_rows
    from pipeline.sinks.duckdb import append

    times = []
    for repeat in range(WRITE_REPEATS):
        elements: list[Element] = []
        for index in range(PULL_MAX_MESSAGES):
            steps = range(repeat * per_message, (repeat + 1) * per_message)
            batch, _ = parse_batch(_message(f"write-{index}", steps.start + 1, steps, 100_000, False), "")
            assert batch is not None
            elements += batch_rows(batch)
        started = time.perf_counter()
        append(database, elements)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def _cause(level: Level, write_s: float) -> str:
    """What broke at ``level``, read from its figures."""
    if level.issued < ACHIEVED_SHARE * level.offered:
        return (f"the publisher: its loop issued only {level.issued / level.offered:.0%} of the schedule in "
                f"time, its thread busy {level.loop_cores:.2f} of a core, the benchmark process (publisher "
                f"and emulator) at {level.bench_cores:.2f} cores")
    if level.acknowledged < ACHIEVED_SHARE * level.issued or level.ack_p99 > ACK_LATE_S:
        return (f"the emulator: it acknowledged {level.acknowledged / max(1, level.issued):.0%} of the "
                f"events issued, publish p99 {level.ack_p99:.2f} s, {level.publish_errors} publishes "
                f"failed, the benchmark process at {level.bench_cores:.2f} cores")
    demand = level.thread_ran + level.thread_waited
    cpu = (f"{'' if demand >= ONE_CORE else 'not '}CPU-bound: its busiest thread wanted a CPU "
           f"{demand:.0%} of the time, ran {level.thread_ran:.0%} and waited for one "
           f"{level.thread_waited:.0%} (the pipeline process used {level.pipeline_cores:.2f} cores)")
    writes = (f"the pipeline's DuckDB writes held the file {level.held_share:.0%} of the time (one write of "
              f"a {PULL_MAX_MESSAGES}-message bundle: {1000 * write_s:.0f} ms)")
    if level.held_share >= WRITES_HELD:
        writes += ", the bottleneck"
    if level.read < ACHIEVED_SHARE * level.achieved:
        return (f"the pipeline: it read {level.read:,.0f} events/s ({level.read / level.per_message:,.0f} "
                f"messages/s) of the {level.achieved:,.0f} published ({level.messages_per_s:,.0f} "
                f"messages/s) and the subscription's backlog grew from {level.backlog_start:,} to "
                f"{level.backlog_end:,} messages; {cpu}; {writes}")
    return (f"the pipeline after its read: it pulled the messages as they came (backlog "
            f"{level.backlog_end:,} at the end of the load) but the snapshots showing them landed late; "
            f"{cpu}; {writes}")


def _verdict(levels: list[Level], stopped: bool, write_s: float) -> list[str]:
    target = next((level for level in levels if level.rate == TARGET_RATE), None)
    if target is None:
        how = "not measured"
    elif target.p99 <= TARGET_S and not target.unseen:
        how = f"met (p99 {target.p99:.2f} s)"
    elif target.unseen:
        how = f"MISSED ({target.unseen:,} probes never seen, p99 {target.p99:.2f} s)"
    else:
        how = f"MISSED by {target.p99 - TARGET_S:.2f} s (p99 {target.p99:.2f} s)"
    lines = [f"Targets: freshness p99 under {TARGET_S:g} s (snapshot interval + 5 s) at {TARGET_RATE:,} "
             f"events/s on the DirectRunner — {how}."]
    if stopped:
        lines.append(f"The pipeline process stopped during the {levels[-1].rate:,} events/s level.")
    broken = next((level for level in levels if level.broke), None)
    if broken is None:
        if levels:
            lines.append(f"Nothing broke up to {levels[-1].rate:,} events/s.")
        return lines
    failed = []
    if broken.p99 > TARGET_S:
        failed.append(f"freshness p99 {broken.p99:.2f} s over the {TARGET_S:g} s target")
    if broken.unseen:
        failed.append(f"{broken.unseen:,} of {broken.unseen + len(broken.freshness):,} probes never seen")
    if broken.achieved < ACHIEVED_SHARE * broken.rate:
        failed.append(f"achieved {broken.achieved:,.0f} events/s, {broken.achieved / broken.rate:.0%} of "
                      "offered")
    good = [level for level in levels if not level.broke]
    held = f"; {good[-1].rate:,} events/s held" if good else ""
    lines.append(f"First to break: {broken.rate:,} events/s ({broken.runs:,} runs, "
                 f"{broken.messages_per_s:,.0f} messages/s of {broken.per_message:,} events), with "
                 f"{' and '.join(failed)}{held}. What broke first: {_cause(broken, write_s)}.")
    for level in good:
        if level.backlog_end > level.messages_per_s:  # over a second of messages waiting at the end
            lines.append(f"At {level.rate:,} events/s the backlog was already {level.backlog_end:,} messages "
                         f"at the end of the load ({level.backlog_end / level.messages_per_s:.1f} s of "
                         "messages): the pipeline was reading at about its limit.")
    return lines


def run() -> str:
    from google.cloud import pubsub_v1
    from google.pubsub_v1.types import pubsub as types

    from pipeline.emulators.pubsub import PubSubEmulator

    levels: list[Level] = []
    stopped, throughput = False, None
    with PubSubEmulator() as emulator, tempfile.TemporaryDirectory() as scratch:
        broker = emulator.broker
        broker.create_topic(types.Topic(name=TOPIC))
        broker.create_subscription(types.Subscription(name=SUBSCRIPTION, topic=TOPIC))
        env = {**os.environ, "PYTHONPATH": str(REPO), "PUBSUB_EMULATOR_HOST": emulator.host}
        database = Path(scratch) / "live.duckdb"
        stream = subprocess.Popen(
            [sys.executable, "-m", "pipeline", "--streaming", "--runner=BundleBasedDirectRunner",
             f"--subscription={SUBSCRIPTION}", f"--duckdb={database}",
             f"--snapshot_interval_s={INTERVAL_S}"],
            cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.environ["PUBSUB_EMULATOR_HOST"] = emulator.host
        publisher = pubsub_v1.PublisherClient()
        try:
            # Warm-up: measure from the moment the pipeline is reading, not while it starts.
            warm = Level(1, 1, "warm-up-")
            warm.probes = [collections.deque([(0, time.monotonic())])]
            publisher.publish(TOPIC, _message("warm-up-0", 0, range(1), 1_000_000, True)).result(timeout=30)
            with Watcher(database, broker, warm) as watcher:
                watcher.wait_until_seen(time.monotonic() + 120)
            throughput = _burst(publisher, broker, database)
            for rate, runs in LEVELS:
                level = Level(rate, runs, f"load{rate}-")
                _run_level(publisher, broker, database, stream, level)
                levels.append(level)
                print(f"  {rate:,} events/s: freshness p99 {level.p99:.2f} s, {level.unseen:,} never seen, "
                      f"backlog {level.backlog_end:,}", file=sys.stderr, flush=True)
                if level.broke or stream.poll() is not None:
                    break
            stopped = stream.poll() is not None
        finally:
            publisher.stop()
            stop(stream)
        # With the pipeline stopped, the file is the benchmark's alone.
        write_s = _write_s(database, levels[-1].per_message if levels else 10)
    burst = (f"{throughput:,.0f} events/s" if throughput is not None
             else f"did not finish in {BURST_WITHIN_S:g} s")
    load_s = LOAD_S * max(1, len(levels))
    reads = sum(level.reads for level in levels)
    lines = [
        "## Streaming: freshness under rising load (DirectRunner, local Pub/Sub emulator)",
        "",
        __doc__.split("\n\n", 1)[1].strip(),
        "",
        f"Throughput: {BURST_RUNS * BURST_MESSAGES * BURST_EVENTS:,} events in "
        f"{BURST_RUNS * BURST_MESSAGES:,} messages of {BURST_EVENTS:,}: {burst}.",
        "",
        "| offered events/s (messages/s) | runs × events a message | achieved events/s | read events/s "
        "| freshness median (s) | freshness p99 (s) | never seen | backlog end / peak (messages) "
        "| pipeline CPU, cores (busiest thread: ran, waited) | benchmark CPU, cores |",
        "|---|---|---|---|---|---|---|---|---|---|",
        *(_row(level) for level in levels),
        "",
        f"During the load the watcher's own reads held the DuckDB file "
        f"{sum(level.watcher_hold_s for level in levels) / load_s:.0%} of the time; "
        f"{sum(level.locked_reads for level in levels) / max(1, reads):.0%} of its {reads:,} scheduled reads "
        "found a write under way.",
        "",
        *_verdict(levels, stopped, write_s),
    ]
    return "\n".join(lines)


def _row(level: Level) -> str:
    return (f"| {level.rate:,} ({level.messages_per_s:,.0f}) | {level.runs:,} × {level.per_message:,} "
            f"| {level.achieved:,.0f} | {level.read:,.0f} | {level.median:.2f} | {level.p99:.2f} "
            f"| {level.unseen:,} | {level.backlog_end:,} / {level.backlog_peak:,} "
            f"| {level.pipeline_cores:.2f} ({level.thread_ran:.0%}, {level.thread_waited:.0%}) "
            f"| {level.bench_cores:.2f} |")
