"""Per-call cost of ``record_step_start_time``: this emitter against the reference recorder.

Both run here, in one process, on their real code paths. The reference's recorder writes through
its ``CloudLoggingHandler`` and ``BackgroundThreadTransport`` (batches of 100, a background
thread) to a Cloud Logging client whose API call is replaced by an in-memory counter (no network
here); ours writes to a file through its background thread. Each call passes an explicit
tz-aware time, as a training loop replaying or backfilling would.

Bursts: 20,000 calls back to back while the background thread works; the mean per call, seven
times. Single calls: 20,000 calls timed one by one with ``perf_counter_ns``, in groups of 1,000
with a flush between groups so that the background thread runs between calls.
"""

from __future__ import annotations

import datetime
import logging
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from unittest import mock

from benchmarks.common import percentile, summary

BURST = 20_000
BURSTS = 7
SINGLES = 20_000
TARGET_MEAN_US = 5.0
TARGET_P99_US = 50.0


def _ours(directory: Path) -> tuple[Callable[[int, datetime.datetime], None], Callable[[], Any]]:
    from emitter import EmitterSettings, GoodputRecorder

    recorder = GoodputRecorder("bench", logging_enabled=True, destination=f"file:{directory}/ours.jsonl",
                               settings=EmitterSettings(spool_dir=directory / "spool",
                                                        heartbeat_interval_s=None))
    return recorder.record_step_start_time, recorder.flush


def _reference() -> tuple[Callable[[int, datetime.datetime], None], Callable[[], Any], Any]:
    import google.cloud.logging
    from google.auth.credentials import AnonymousCredentials
    from ml_goodput_measurement.src import goodput

    class CountingLoggingAPI:
        def __init__(self) -> None:
            self.entries = 0

        def write_entries(self, entries: list[Any], **_: Any) -> None:
            self.entries += len(entries)

    client = google.cloud.logging.Client(project="bench", credentials=AnonymousCredentials(),
                                         _use_grpc=False)
    api = CountingLoggingAPI()
    client._logging_api = api
    with mock.patch("google.cloud.logging.Client", return_value=client):
        recorder = goodput.GoodputRecorder("bench", "goodput_bench", True)
    return recorder.record_step_start_time, recorder.flush, api


def _measure(record: Callable[[int, datetime.datetime], None], flush: Callable[[], Any]) -> dict[str, Any]:
    when = datetime.datetime.now(datetime.timezone.utc)
    bursts = []
    step = 0
    for _ in range(BURSTS):
        started = time.perf_counter()
        for _ in range(BURST):
            record(step, when)
            step += 1
        bursts.append((time.perf_counter() - started) / BURST)
        flush()
    singles = []
    clock = time.perf_counter_ns
    while len(singles) < SINGLES:
        for _ in range(1000):
            started = clock()
            record(step, when)
            singles.append((clock() - started) / 1e9)
            step += 1
        flush()
    return {"bursts": bursts, "p50": statistics.median(singles), "p99": percentile(singles, 99),
            "calls": step}


def run() -> str:
    logging.getLogger().setLevel(logging.WARNING)
    with tempfile.TemporaryDirectory() as directory:
        record, flush = _ours(Path(directory))
        ours = _measure(record, flush)
    ref_record, ref_flush, api = _reference()
    reference = _measure(ref_record, ref_flush)
    assert api.entries == reference["calls"], "the reference's entries did not all arrive"
    mean_ours = statistics.median(ours["bursts"]) * 1e6
    mean_ref = statistics.median(reference["bursts"]) * 1e6
    lines = [
        "## Emitter: cost of one `record_step_start_time` call",
        "",
        __doc__.split("\n\n", 1)[1].strip(),
        "",
        "| figure (µs per call) | reference recorder | this emitter | reference / ours |",
        "|---|---|---|---|",
        f"| mean over a 20,000-call burst: median (min–max) of {BURSTS} | "
        f"{summary(reference['bursts'], 1e6)} | {summary(ours['bursts'], 1e6)} | "
        f"{mean_ref / mean_ours:.1f}× |",
        f"| single call, median | {reference['p50'] * 1e6:.2f} | {ours['p50'] * 1e6:.2f} | "
        f"{reference['p50'] / ours['p50']:.1f}× |",
        f"| single call, p99 | {reference['p99'] * 1e6:.2f} | {ours['p99'] * 1e6:.2f} | "
        f"{reference['p99'] / ours['p99']:.1f}× |",
        "",
        f"Targets: mean per call under {TARGET_MEAN_US:g} µs over 20,000-call bursts — "
        f"{'met' if mean_ours < TARGET_MEAN_US else 'MISSED'} ({mean_ours:.2f} µs); "
        f"p99 of single calls under {TARGET_P99_US:g} µs — "
        f"{'met' if ours['p99'] * 1e6 < TARGET_P99_US else 'MISSED'} ({ours['p99'] * 1e6:.2f} µs).",
    ]
    return "\n".join(lines)
