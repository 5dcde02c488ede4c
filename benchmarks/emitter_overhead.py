"""Per-call cost of ``record_step_start_time``: this emitter against the reference recorder.

Both run on their real code paths, each in a process of its own: ours here, the reference's in
its own venv (``tools.reference_runner``), its calls timed there. The reference's recorder
(``ml_goodput_measurement.src.goodput.GoodputRecorder``) writes through its
``CloudLoggingHandler`` and ``BackgroundThreadTransport`` (batches of 100, a background thread)
to an offline Cloud Logging client (anonymous credentials, HTTP API) whose ``write_entries`` is
replaced by an in-memory counter; ours writes to a file in a temporary directory through its
background thread. Each call passes an explicit tz-aware time, as a training loop replaying or
backfilling would. After the run, every call's entry must have reached its sink (the reference's
counter; our recorder's count of sent events), or the benchmark fails.

Both recorders are built before anything is timed; each recorder's bursts, then each one's
single calls, run as a phase of their own that starts with a full garbage collection of its
process. A phase's figures thus include the full (generation 2) collections its own allocations
trigger; the table counts them, since one costs tens of milliseconds with the reference's
libraries loaded.

Bursts: 20,000 calls back to back while the background thread works; the mean per call, seven
times. Single calls: 20,000 calls timed one by one with ``perf_counter_ns``, in groups of 1,000
with a flush between groups so that the background thread runs between calls.

Publish throughput: a recorder with the emitter's default settings publishes to the local Pub/Sub
emulator (in this process, through the real client library) a job start and 200,000 step starts,
recorded as fast as the loop goes; events per second from the first call until ``flush()`` says
every event was delivered, three times. The baseline is the reference recorder's rate over its
bursts above, which delivers to an in-memory counter: no network at all.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import gc
import logging
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.common import percentile, summary
from tools.reference_runner import ReferenceRunner

BURST = 20_000
BURSTS = 7
SINGLES = 20_000
GROUP = 1_000
TARGET_MEAN_US = 5.0
TARGET_P99_US = 50.0
PUBLISHED = 200_000
PUBLISH_REPEATS = 3
TOPIC = "projects/goodput-bench/topics/events"

Record = Callable[[int, datetime.datetime], None]
#: (first step, count, time) -> the seconds of the whole loop of calls.
Burst = Callable[[int, int, datetime.datetime], float]
#: (first step, count, time) -> the seconds of each call.
Singles = Callable[[int, int, datetime.datetime], list[float]]


@dataclasses.dataclass
class _Subject:
    """One recorder under test, in this process or in the reference's worker, and what was
    measured of it."""

    burst: Burst
    each: Singles
    flush: Callable[[], Any]
    delivered: Callable[[], int]
    full_collections_so_far: Callable[[bool], int]  # in the recorder's process, after one if asked
    calls: int = 0
    bursts: list[float] = dataclasses.field(default_factory=list)  # mean seconds per call
    singles: list[float] = dataclasses.field(default_factory=list)  # seconds per call
    full_collections: int = 0  # generation-2 collections during the bursts

    def run_bursts(self, when: datetime.datetime) -> None:
        full_before = self.full_collections_so_far(True)
        for _ in range(BURSTS):
            self.bursts.append(self.burst(self.calls, BURST, when) / BURST)
            self.calls += BURST
            self.flush()
        self.full_collections = self.full_collections_so_far(False) - full_before

    def run_singles(self, when: datetime.datetime) -> None:
        self.full_collections_so_far(True)
        for _ in range(SINGLES // GROUP):
            self.singles += self.each(self.calls, GROUP, when)
            self.calls += GROUP
            self.flush()

    def check_delivered(self, name: str) -> None:
        delivered = self.delivered()
        if delivered != self.calls:
            raise RuntimeError(f"{name}: {delivered:,} of {self.calls:,} entries reached the sink")


def _burst(record: Record, first: int, count: int, when: datetime.datetime) -> float:
    started = time.perf_counter()
    for step in range(first, first + count):
        record(step, when)
    return time.perf_counter() - started


def _each(record: Record, first: int, count: int, when: datetime.datetime) -> list[float]:
    clock, singles = time.perf_counter_ns, []
    for step in range(first, first + count):
        started = clock()
        record(step, when)
        singles.append((clock() - started) / 1e9)
    return singles


def _full_collections_so_far(collect_first: bool) -> int:
    if collect_first:
        gc.collect()
    collections: int = gc.get_stats()[2]["collections"]
    return collections


def _ours(directory: Path) -> tuple[_Subject, Callable[[], Any]]:
    from emitter import EmitterSettings, GoodputRecorder

    recorder = GoodputRecorder("bench", logging_enabled=True, destination=f"file:{directory}/ours.jsonl",
                               settings=EmitterSettings(spool_dir=directory / "spool",
                                                        heartbeat_interval_s=None))
    record = recorder.record_step_start_time
    return _Subject(functools.partial(_burst, record), functools.partial(_each, record), recorder.flush,
                    lambda: recorder.stats.sent, _full_collections_so_far), recorder.close


def _reference(runner: ReferenceRunner) -> _Subject:
    """The reference's recorder in its worker, on its Cloud Logging path to a counting client
    (``worker.Worker.logging_client_recorder``); the same loops as ``_burst`` and ``_each``
    run there."""
    made = runner.request("logging_client_recorder", job_name="bench", logger_name="goodput_bench")
    recorder, api = made["recorder"], made["api"]

    def timed(first: int, count: int, when: datetime.datetime, each: bool) -> Any:
        return runner.request("time_calls", target=recorder, method="record_step_start_time", first=first,
                              count=count, args=[when], each=each)

    def full_collections_so_far(collect_first: bool) -> int:
        return int(runner.request("full_collections", collect_first=collect_first))

    return _Subject(functools.partial(timed, each=False), functools.partial(timed, each=True),
                    lambda: runner.call(recorder, "flush"), lambda: int(runner.call(api, "count")),
                    full_collections_so_far)


def _publish_rates(directory: Path) -> list[float]:
    """Events per second through the emitter to the local Pub/Sub emulator, per repeat."""
    import os

    from google.pubsub_v1.types import pubsub as types

    from emitter import EmitterSettings, GoodputRecorder
    from pipeline.emulators.pubsub import PubSubEmulator

    when = datetime.datetime.now(datetime.timezone.utc)
    rates = []
    with PubSubEmulator() as emulator:
        os.environ["PUBSUB_EMULATOR_HOST"] = emulator.host
        emulator.broker.create_topic(types.Topic(name=TOPIC))
        emulator.broker.create_subscription(types.Subscription(
            name=TOPIC.replace("/topics/", "/subscriptions/"), topic=TOPIC))
        for repeat in range(PUBLISH_REPEATS):
            recorder = GoodputRecorder(f"bench-publish-{repeat}", logging_enabled=True, destination=TOPIC,
                                       settings=EmitterSettings(spool_dir=directory / f"spool{repeat}",
                                                                heartbeat_interval_s=None,
                                                                collect_configs=False))
            started = time.perf_counter()
            recorder.record_job_start_time(when)
            for step in range(PUBLISHED):
                recorder.record_step_start_time(step, when)
            delivered = recorder.flush(timeout=300)
            elapsed = time.perf_counter() - started
            sent = recorder.stats.sent
            recorder.close()
            if not delivered or sent != PUBLISHED + 1:
                raise RuntimeError(f"publish throughput: {sent:,} of {PUBLISHED + 1:,} events delivered")
            rates.append((PUBLISHED + 1) / elapsed)
    return rates


def _verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def run() -> str:
    logging.getLogger().setLevel(logging.WARNING)
    when = datetime.datetime.now(datetime.timezone.utc)
    with tempfile.TemporaryDirectory() as directory, ReferenceRunner() as runner:
        ours, close_ours = _ours(Path(directory))
        reference = _reference(runner)
        started = time.perf_counter()
        gc.collect()
        full_gc_ms, tracked = (time.perf_counter() - started) * 1e3, len(gc.get_objects())
        for subject in (ours, reference):
            subject.run_bursts(when)
        for subject in (ours, reference):
            subject.run_singles(when)
        reference.check_delivered("reference recorder")
        ours.check_delivered("this emitter")
        close_ours()
        publish = _publish_rates(Path(directory))

    mean_ours, mean_ref = statistics.median(ours.bursts) * 1e6, statistics.median(reference.bursts) * 1e6
    all_ours, all_ref = statistics.fmean(ours.bursts) * 1e6, statistics.fmean(reference.bursts) * 1e6
    p50_ours, p50_ref = statistics.median(ours.singles) * 1e6, statistics.median(reference.singles) * 1e6
    p99_ours, p99_ref = percentile(ours.singles, 99) * 1e6, percentile(reference.singles, 99) * 1e6
    mean_ok, p99_ok = mean_ours < TARGET_MEAN_US, p99_ours < TARGET_P99_US
    print(f"emitter: burst mean per call {mean_ours:.2f} µs (target < {TARGET_MEAN_US:g}): "
          f"{_verdict(mean_ok)}; single-call p99 {p99_ours:.2f} µs (target < {TARGET_P99_US:g}): "
          f"{_verdict(p99_ok)}", file=sys.stderr)
    lines = [
        "## Emitter: cost of one `record_step_start_time` call",
        "",
        __doc__.split("\n\n", 1)[1].strip(),
        "",
        "| figure (µs per call) | reference recorder | this emitter | reference / ours |",
        "|---|---|---|---|",
        f"| mean over a {BURST:,}-call burst: median (min–max) of {BURSTS} | "
        f"{summary(reference.bursts, 1e6)} | {summary(ours.bursts, 1e6)} | {mean_ref / mean_ours:.1f}× |",
        f"| mean over all {BURSTS * BURST:,} burst calls | {all_ref:.2f} | {all_ours:.2f} | "
        f"{all_ref / all_ours:.1f}× |",
        f"| full collections during the bursts (count) | {reference.full_collections} | "
        f"{ours.full_collections} | |",
        f"| single call, median of {SINGLES:,} | {p50_ref:.2f} | {p50_ours:.2f} | "
        f"{p50_ref / p50_ours:.1f}× |",
        f"| single call, p99 | {p99_ref:.2f} | {p99_ours:.2f} | {p99_ref / p99_ours:.1f}× |",
        "",
        f"Every call's entry reached its sink: {ours.calls:,} for each recorder. One full collection "
        f"of this process's heap ({tracked:,} tracked objects) took {full_gc_ms:.0f} ms.",
        "",
        "| publish throughput (events/s) | reference recorder, in-memory sink | this emitter, to the "
        "local Pub/Sub emulator | ours / reference |",
        "|---|---|---|---|",
        f"| median (min–max) of {PUBLISH_REPEATS}; reference over its bursts | {1e6 / mean_ref:,.0f} | "
        f"{summary(publish, digits=0)} | {statistics.median(publish) * mean_ref / 1e6:.1f}× |",
        "",
        f"Targets: mean per call under {TARGET_MEAN_US:g} µs over {BURST:,}-call bursts — "
        f"{_verdict(mean_ok)} ({mean_ours:.2f} µs; worst burst {max(ours.bursts) * 1e6:.2f} µs); "
        f"p99 of single calls under {TARGET_P99_US:g} µs — {_verdict(p99_ok)} ({p99_ours:.2f} µs).",
    ]
    return "\n".join(lines)
