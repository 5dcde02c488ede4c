"""The pipeline's graph, top to bottom: messages in, each run's snapshots, every output out.

One graph for the batch replay and the stream; only where messages come from and how runs are
tracked differ. ``pipeline.beam.launcher`` runs it, and the tests build it as it does. Every step
has a stable label: Dataflow matches the steps of a running job by label when it is updated.
"""

from __future__ import annotations

from typing import Any

import apache_beam as beam
from apache_beam.options.pipeline_options import StandardOptions

from goodput_schemas import parse_dataset
from pipeline.beam.live import TrackRunsLive
from pipeline.beam.options import LOCAL_RUNNERS, GoodputOptions
from pipeline.beam.restore import UnreportedRuns
from pipeline.beam.transforms import (
    DeadLetterRows,
    ParseEvents,
    SnapshotRows,
    Stopping,
    TrackRuns,
    WriteToBigQuery,
    WriteToDuckDB,
    WriteToMonitoring,
)
from pipeline.core.detect import DetectionSettings
from pipeline.core.events import read_lines
from pipeline.core.rows import batch_rows
from pipeline.sinks.bigquery import create_tables, make_client
from pipeline.sinks.monitoring import MonitoringSettings
from pipeline.sinks.raw_events import BigQueryEvents, DuckDBEvents, EventsTables, backfill_messages
from pipeline.sinks.retries import never


def build_pipeline(pipeline: beam.Pipeline, options: GoodputOptions, stopping: Stopping = never) -> None:
    """The graph on ``pipeline``: a stream if the options say ``--streaming``, else a batch replay.
    ``stopping`` says when a local stream is stopping (``pipeline.beam.direct_runner``)."""
    streaming = options.view_as(StandardOptions).streaming

    # Messages in, as (source, message): a subscription, or emitter files and raw events tables.
    if streaming:
        messages = (pipeline
                    | "ReadPubSub" >> beam.io.ReadFromPubSub(subscription=options.subscription,
                                                             with_attributes=True)
                    | "WithSource" >> beam.Map(
                        lambda m: (m.attributes.get("message_id") or m.message_id or "", m.data)))
    else:
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
    detection = DetectionSettings(options.min_slowdown, hang_min_s=options.hang_min_s,
                                  hang_factor=options.hang_factor, host_bucket_s=options.host_bucket_s,
                                  host_settle_s=options.host_settle_s,
                                  straggler_min_s=options.straggler_min_s)

    # Each run's snapshots: on timers while streaming (restoring a run the raw events table holds
    # and this pipeline does not, and at the start those the table holds unreported), or one per
    # run as of one time (and, with --snapshot_every_s, a series of them before it).
    if streaming:
        events = parsed.events
        tables = restored_from(options)
        if tables is not None:
            events = ((events, pipeline | "Unreported" >> UnreportedRuns(tables))
                      | "WithUnreported" >> beam.Flatten().with_output_types(tuple[str, Any]))
        tracked = events | "TrackRuns" >> TrackRunsLive(
            options.windows, options.snapshot_interval_s, options.silence_s, options.gc_after_s,
            stopping=stopping, detection=detection, tables=tables,
            fail_work_items=fails_work_items(options))
    else:
        tracked = parsed.events | "TrackRuns" >> TrackRuns(options.as_of, options.windows,
                                                           tuple(options.exclude or ()), detection,
                                                           options.snapshot_every_s)

    # Rows out: the snapshots', the inputs' (raw events, run metadata) and the dead letters'.
    raw_events = not options.no_raw_events
    rows = {
        "Snapshots": tracked.snapshots | "SnapshotRows" >> SnapshotRows(),
        "Inputs": parsed.events | "InputRows" >> beam.FlatMap(lambda kv: batch_rows(kv[1], raw_events)),
        "DeadLetters": ((parsed.dead_letter, tracked.dead_letter)
                        | "DeadLetters" >> beam.Flatten()
                        | "DeadLetterRows" >> DeadLetterRows()),
    }
    if options.duckdb:  # each source apart: a batch runner holds a Flatten's input whole
        for name, source in rows.items():
            source | f"WriteToDuckDB{name}" >> WriteToDuckDB(options.duckdb)
    if options.bigquery_dataset:
        project, dataset = parse_dataset(options.bigquery_dataset)
        if options.bigquery_create_tables:
            create_tables(make_client(project, options.bigquery_endpoint), project, dataset)
        (tuple(rows.values())
         | "AllRows" >> beam.Flatten()
         | "WriteToBigQuery" >> WriteToBigQuery(project, dataset, options.bigquery_endpoint,
                                                stopping=stopping, fail_work_items=fails_work_items(options)))

    # Points out: the reference's Cloud Monitoring metrics of each snapshot. What the service did
    # not take is kept as dead letters in the same tables.
    if options.monitoring_project:
        settings = MonitoringSettings(
            options.monitoring_min_interval_s, options.monitoring_max_lag_s,
            options.monitoring_latest_now, options.monitoring_location, options.monitoring_cluster_name)
        refused = (tracked.snapshots
                   | "WriteToMonitoring" >> WriteToMonitoring(options.monitoring_project, settings, streaming,
                                                              options.monitoring_endpoint, stopping,
                                                              fails_work_items(options))
                   | "MonitoringDeadLetterRows" >> DeadLetterRows())
        if options.duckdb:
            refused | "MonitoringDeadLettersToDuckDB" >> WriteToDuckDB(options.duckdb)
        if options.bigquery_dataset:
            refused | "MonitoringDeadLettersToBigQuery" >> WriteToBigQuery(
                project, dataset, options.bigquery_endpoint, stopping=stopping,
                fail_work_items=fails_work_items(options))


def restored_from(options: GoodputOptions) -> EventsTables | None:
    """The raw events table a stream restores runs from: the one it writes, DuckDB's if it writes
    both; none with ``--no_restore`` or ``--no_raw_events``."""
    if options.no_restore or options.no_raw_events:
        return None
    if options.duckdb:
        return DuckDBEvents(options.duckdb)
    if options.bigquery_dataset:
        return BigQueryEvents(*parse_dataset(options.bigquery_dataset), options.bigquery_endpoint)
    return None


def fails_work_items(options: GoodputOptions) -> bool:
    """Whether the runner retries a work item that fails (Dataflow), rather than stopping the
    pipeline (the local DirectRunner family, whose ``stopping`` bounds a stop instead)."""
    def bare(runner: str) -> str:  # as Beam reads a runner's name: "direct", "DirectRunner"
        return runner.rsplit(".", 1)[-1].lower().removesuffix("runner")

    runner = str(options.view_as(StandardOptions).runner or "DirectRunner")
    return bare(runner) not in set(map(bare, LOCAL_RUNNERS))
