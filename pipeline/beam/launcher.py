"""Builds and runs the pipeline: the batch replay of emitter files, or the live stream.

Batch replay (Beam's DirectRunner)::

    python -m pipeline --events=events.jsonl [--events=more.jsonl] --duckdb=goodput.duckdb \\
        [--as_of=2026-11-01T12:00:00Z] [--windows=60,300,900,3600] \\
        [--exclude=2026-11-01T09:00:00Z/2026-11-01T09:30:00Z]

A malformed line never stops the run: it lands in the ``dead_letter`` table, exit code 0.

Backfill: every table rebuilt from the raw events table of a DuckDB file the pipeline wrote
(after a fix to the engine, say, or with other --windows)::

    python -m pipeline --from_duckdb=goodput.duckdb --duckdb=backfill.duckdb

Streaming, from a Pub/Sub subscription (locally: ``PUBSUB_EMULATOR_HOST`` set)::

    python -m pipeline --streaming --runner=BundleBasedDirectRunner \\
        --subscription=projects/P/subscriptions/S --duckdb=goodput.duckdb [--snapshot_interval_s=30]

On Dataflow: ``--runner=DataflowRunner --project=P --region=R --temp_location=gs://B/tmp``.
SIGINT or SIGTERM stops the stream cleanly: within one snapshot interval, every message read
is in a snapshot; a second signal stops it at once.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import apache_beam as beam
from apache_beam.options.pipeline_options import StandardOptions
from apache_beam.runners.portability.fn_api_runner.fn_runner import FnApiRunner
from apache_beam.runners.runner import PipelineRunner

from pipeline.beam import direct_runner
from pipeline.beam.live import DRAINING, TrackRunsLive, next_snapshot_due
from pipeline.beam.options import GoodputOptions
from pipeline.beam.transforms import (
    ParseEvents,
    TrackRuns,
    WriteToBigQuery,
    WriteToDuckDB,
    WriteToMonitoring,
)
from pipeline.core.rows import batch_rows
from pipeline.sinks.bigquery import create_tables, make_client, parse_dataset
from pipeline.sinks.monitoring import MonitoringSettings
from pipeline.sinks.raw_events import backfill_messages


def read_lines(path: str) -> Iterator[tuple[str, bytes]]:
    """("file:line", line) for every non-empty line of an emitter file."""
    with open(path, "rb") as handle:
        for number, line in enumerate(handle, start=1):
            line = line.rstrip(b"\r\n")
            if line.strip():
                yield f"{path}:{number}", line


def build_streaming_pipeline(pipeline: beam.Pipeline, options: GoodputOptions) -> Any:
    """The streaming graph on ``pipeline``; returns what ``_write`` returns."""
    parsed = (pipeline
              | "ReadPubSub" >> beam.io.ReadFromPubSub(subscription=options.subscription,
                                                       with_attributes=True)
              | "WithSource" >> beam.Map(
                  lambda m: (m.attributes.get("message_id") or m.message_id or "", m.data))
              | "ParseEvents" >> ParseEvents())
    snapshots = (parsed.events
                 | "Keyed" >> beam.Map(lambda kv: kv).with_output_types(tuple[str, Any])
                 | "TrackRuns" >> TrackRunsLive(
                     options.windows, options.snapshot_interval_s, options.silence_s, options.gc_after_s,
                     restore_from=None if options.no_raw_events else options.duckdb))
    return _write(parsed, snapshots, options, streaming=True)


def build_pipeline(pipeline: beam.Pipeline, options: GoodputOptions) -> Any:
    """The batch graph on ``pipeline``; returns what ``_write`` returns."""
    inputs = []
    if options.events:
        inputs.append(pipeline
                      | "Files" >> beam.Create(list(options.events))
                      | "ReadLines" >> beam.FlatMap(read_lines))
    if options.from_duckdb:
        inputs.append(pipeline
                      | "EventsTables" >> beam.Create(list(options.from_duckdb))
                      | "ReadEventsTable" >> beam.FlatMap(backfill_messages))
    messages = inputs[0] if len(inputs) == 1 else tuple(inputs) | "AllInputs" >> beam.Flatten()
    parsed = messages | "ParseEvents" >> ParseEvents()
    snapshots = parsed.events | "TrackRuns" >> TrackRuns(options.as_of, options.windows,
                                                         tuple(options.exclude or ()))
    return _write(parsed, snapshots, options, streaming=False)


def _write(parsed: Any, snapshots: Any, options: GoodputOptions, streaming: bool) -> Any:
    """Every output row (snapshots, raw events and run metadata, dead letters) to the sinks;
    returns the PCollection of them all that the cloud sinks take (None if there are none)."""
    raw_events = not options.no_raw_events
    inputs = parsed.events | "InputRows" >> beam.FlatMap(lambda kv: batch_rows(kv[1], raw_events))
    sources = {"Snapshots": snapshots, "Inputs": inputs, "DeadLetters": parsed.dead_letter}
    if options.duckdb:  # each source apart: a batch runner holds a Flatten's input whole
        for name, source in sources.items():
            source | f"WriteToDuckDB{name}" >> WriteToDuckDB(options.duckdb)
    if not (options.bigquery_dataset or options.monitoring_project):
        return None
    rows = tuple(sources.values()) | "AllRows" >> beam.Flatten()
    if options.bigquery_dataset:
        project, dataset = parse_dataset(options.bigquery_dataset)
        if options.bigquery_create_tables:
            create_tables(make_client(project, options.bigquery_endpoint), project, dataset)
        rows | "WriteToBigQuery" >> WriteToBigQuery(project, dataset, options.bigquery_endpoint)
    if options.monitoring_project:
        settings = MonitoringSettings(
            options.monitoring_min_interval_s, options.monitoring_max_lag_s,
            options.monitoring_latest_now, options.monitoring_location, options.monitoring_cluster_name)
        refused = rows | "WriteToMonitoring" >> WriteToMonitoring(options.monitoring_project, settings,
                                                                  streaming, options.monitoring_endpoint)
        # Points Cloud Monitoring did not take are kept as dead letters in the same tables.
        if options.duckdb:
            refused | "MonitoringDeadLettersToDuckDB" >> WriteToDuckDB(options.duckdb)
        if options.bigquery_dataset:
            refused | "MonitoringDeadLettersToBigQuery" >> WriteToBigQuery(project, dataset,
                                                                           options.bigquery_endpoint)
    return rows


DRAIN_GRACE_S = 2.0  # after the reading stops: time for what was read to be written


def run_streaming(options: GoodputOptions) -> int:
    """Runs the stream until SIGINT or SIGTERM, then stops it cleanly: every message read so far
    is in a snapshot before the pipeline is cancelled. A second signal cancels at once. On a
    runner that runs jobs on its own (Dataflow), submits the job and returns."""
    goodput = options.view_as(GoodputOptions)
    if not goodput.subscription:
        print("python -m pipeline: --streaming needs --subscription=projects/P/subscriptions/S",
              file=sys.stderr)
        return 2
    runner = options.view_as(StandardOptions).runner or "DirectRunner"
    stop, force = threading.Event(), threading.Event()

    def on_signal(*_: object) -> None:
        (force if stop.is_set() else stop).set()

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, on_signal)
    direct = "Direct" in runner
    if direct:
        direct_runner.install()
    pipeline = beam.Pipeline(options=options)
    build_streaming_pipeline(pipeline, goodput)
    result = pipeline.run()
    if not direct:  # e.g. Dataflow, which runs the job on its own: submitted is done
        print(f"submitted the streaming job to {runner}", file=sys.stderr)
        return 0
    errors: list[BaseException] = []

    def failed() -> bool:
        """Whether the pipeline has failed (its runner reports it once)."""
        if not errors:
            error = direct_runner.failure(result)
            if error is not None:
                errors.append(error)
        return bool(errors)

    print(f"streaming from {goodput.subscription}; SIGINT or SIGTERM stops", file=sys.stderr,
          flush=True)
    while not stop.wait(1.0) and not failed():
        pass
    if not failed():
        # The DirectRunner cannot drain (see pipeline.beam.live): report each new message at once,
        # read on until the interval snapshots pending for the others are due, then read no
        # more, and cancel once what was read is written: every message read is in the tables.
        DRAINING.set()
        due_s = next_snapshot_due(round(time.time() * 1e6), goodput.snapshot_interval_s) / 1e6
        if goodput.monitoring_project:  # the last snapshots' points wait for their series' turn
            due_s += goodput.monitoring_min_interval_s
        print(f"stopping: final snapshots within {due_s + DRAIN_GRACE_S - time.time():.0f} s "
              "(signal again to stop at once)", file=sys.stderr, flush=True)
        _wait_until(due_s, force, failed)
        direct_runner.stop_reading()
        _wait_until(time.time() + DRAIN_GRACE_S, force, failed)
    if failed():  # its threads are daemons, and may be stuck: they end with the process
        print(f"python -m pipeline: the streaming pipeline failed: {errors[0]!r} (see the log above)",
              file=sys.stderr)
        return 1
    result.cancel()
    print("stopped", file=sys.stderr, flush=True)
    return 0


def _wait_until(time_s: float, force: threading.Event, failed: Callable[[], bool]) -> None:
    """Waits until ``time_s`` (the epoch), a second signal, or the pipeline's failure."""
    while time.time() < time_s and not force.wait(0.1) and not failed():
        pass


def _batch_runner(options: GoodputOptions) -> PipelineRunner | None:
    """The runner of a batch replay: for the DirectRunner (the default), the FnApiRunner it ends
    up on anyway; it first tries Prism, whose binary it downloads at run time (a fifth of a
    second offline, and a network fetch online). Any other runner as the options say."""
    if options.view_as(StandardOptions).runner in (None, "DirectRunner"):
        return FnApiRunner()
    return None


def run(argv: Sequence[str] | None = None) -> int:
    options = GoodputOptions(list(sys.argv[1:] if argv is None else argv))
    goodput = options.view_as(GoodputOptions)
    if options.view_as(StandardOptions).streaming:
        return run_streaming(goodput)
    if not (goodput.events or goodput.from_duckdb):
        print("python -m pipeline: --events=FILE or --from_duckdb=FILE is required (see --help)",
              file=sys.stderr)
        return 2
    inputs = (goodput.events or []) + (goodput.from_duckdb or [])
    missing = [path for path in inputs if not Path(path).is_file()]
    if missing:
        print(f"python -m pipeline: no such file: {', '.join(missing)}", file=sys.stderr)
        return 2
    if goodput.duckdb and any(Path(path).resolve() == Path(goodput.duckdb).resolve()
                              for path in goodput.from_duckdb or []):
        print(f"python -m pipeline: --from_duckdb={goodput.duckdb} is also the output: write the backfill "
              "to another --duckdb file", file=sys.stderr)
        return 2
    with beam.Pipeline(runner=_batch_runner(options), options=options) as pipeline:
        build_pipeline(pipeline, goodput)
    if goodput.duckdb:
        from pipeline.app.summary import print_summary

        print_summary(goodput.duckdb, sys.stdout)
    return 0
