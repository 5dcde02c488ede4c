"""Output rows: snapshots, step statistics, disruptions, raw events, run metadata, configs, model
metrics and dead letters as rows of the output tables.

The tables' schemas are the JSON files in ``goodput_schemas/tables/`` (BigQuery's format); every
sink writes these rows. Times are timezone-aware ``datetime`` values. Each snapshot's rows are made
from the ``Snapshot`` (``snapshot_rows``), as its Cloud Monitoring points are
(``pipeline.sinks.monitoring.snapshot_points``); every dead letter, whatever rejected it, becomes
its row in ``dead_letter_row``.

An output element is ``(table, row)``, or ``(EVENTS, batch)`` for the raw events of one message:
a message stays one element through the pipeline, never one per event, and its rows are made
only by the sink (``by_table``).
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Iterable, Iterator
from typing import Any

from pipeline.core.events import Batch, DeadLetter, Event, encode_events
from pipeline.core.sanitize import free_text
from pipeline.core.snapshot import Snapshot, WindowFigures

Row = dict[str, Any]
#: An output element: (table, row), or (EVENTS, batch) for the raw events of one message.
Element = tuple[str, "Row | Batch"]
GOODPUT, BADPUT, STEP_STATS, DISRUPTIONS, RUN_ANOMALIES, DEAD_LETTER, EVENTS, RUN_METADATA = (
    "goodput_snapshots", "badput_snapshots", "step_stats", "disruptions", "run_anomalies",
    "dead_letter", "events", "run_metadata")
RUN_CONFIGS, MODEL_METRICS = "run_configs", "model_metrics"
#: The fields of a ``model_metrics`` event as ``model_metrics`` rows name them: ML Diagnostics'
#: names, and SAMPLE_THROUGHPUT for samples per second, which it has no name for.
MODEL_METRIC_NAMES = {"loss": "LOSS", "step_time_s": "STEP_TIME", "tokens_per_s": "THROUGHPUT",
                      "samples_per_s": "SAMPLE_THROUGHPUT", "mfu": "MFU", "tflops_per_device": "TFLOPS"}
#: Where an attempt runs (``JobStart.workload``): each field a column of ``run_metadata``.
WORKLOAD_FIELDS = ("platform", "project", "cluster", "namespace", "jobset_name", "jobset_uid", "job_name",
                   "job_uid", "pod", "node_pool", "instance", "zone")


def by_table(elements: Iterable[Element]) -> dict[str, list[Row]]:
    """The rows of output elements, gathered by table."""
    gathered: dict[str, list[Row]] = {}
    for table, value in elements:
        if isinstance(value, Batch):
            gathered.setdefault(table, []).extend(event_rows(value))
        else:
            gathered.setdefault(table, []).append(value)
    return gathered


def timestamp(time_us: int | float) -> datetime.datetime:
    """A UTC datetime from microseconds since the epoch."""
    return datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc) + datetime.timedelta(
        microseconds=round(time_us))


def snapshot_rows(snapshot: Snapshot) -> Iterator[tuple[str, Row]]:
    """(table, row) for every row of one snapshot: goodput and badput per window, step
    statistics, disruptions, and the anomalies found since the run's previous snapshot."""
    at = timestamp(snapshot.as_of_us)
    windows = zip((0, *snapshot.window_sizes_s), (snapshot.cumulative, *snapshot.windows), strict=True)
    for window_s, window in windows:
        yield GOODPUT, _goodput_row(snapshot, at, window_s, window)
        if window is None:
            continue
        for source, seconds in sorted(window.badput_s.items()):
            yield BADPUT, {"run_id": snapshot.run_id, "snapshot_time": at, "window_s": window_s,
                           "badput_source": source, "seconds": seconds,
                           "pct": window.badput_pct(source)}
    summary = snapshot.step_summary
    if summary is not None:
        yield STEP_STATS, {
            "run_id": snapshot.run_id, "snapshot_time": at, "steps_measured": summary.steps,
            "step_time_mean_s": summary.mean_s, "step_time_p50_s": summary.p50_s,
            "step_time_p90_s": summary.p90_s, "step_time_p99_s": summary.p99_s,
            "step_time_max_s": summary.max_s, "recent_step_time_p50_s": summary.recent_p50_s,
            "ideal_step_time_s": snapshot.ideal_step_time_s,
            "step_time_deviation_s": snapshot.step_time_deviation_s,
        }
    for index, disruption in enumerate(snapshot.disruptions):
        yield DISRUPTIONS, {
            "run_id": snapshot.run_id, "snapshot_time": at, "disruption_index": index,
            "restart_time": timestamp(disruption.restart_us),
            "last_step_before": disruption.last_step_before, "resume_step": disruption.resume_step,
            "wasted_progress_s": disruption.wasted_progress_s, "recovery_s": disruption.recovery_s,
            "in_process": disruption.in_process,
        }
    for change in snapshot.anomalies:
        yield RUN_ANOMALIES, {
            "run_id": snapshot.run_id, "kind": change.kind, "host": change.host,
            "started_at": timestamp(change.started_us), "detected_at": timestamp(change.detected_us),
            "ended_at": None if change.ended_us is None else timestamp(change.ended_us),
            "changed_at": timestamp(change.changed_us), "baseline_step_s": change.baseline_s,
            "observed_step_s": change.observed_s, "lost_s": change.lost_s,
        }


def _goodput_row(snapshot: Snapshot, at: datetime.datetime, window_s: int,
                 window: WindowFigures | None) -> Row:
    metadata = snapshot.metadata
    row: Row = {
        "run_id": snapshot.run_id, "snapshot_time": at, "window_s": window_s,
        "window_start": at, "window_end": at, "goodput_pct": None, "productive_time_s": 0.0,
        "total_time_s": 0.0, "disruptions": 0, "productive_chip_s": 0.0, "total_chip_s": 0.0,
        "max_productive_step": snapshot.max_productive_step, "last_step": snapshot.last_step,
        "ideal_step_time_s": snapshot.ideal_step_time_s,
        "step_time_deviation_s": snapshot.step_time_deviation_s,
        "chip_count": snapshot.chip_count, "run_group": metadata.get("run_group") or None,
        "accelerator_type": metadata.get("accelerator_type") or None,
        "location": metadata.get("location") or None, "ended": snapshot.ended,
        "stepping_slice_efficiency": snapshot.stepping_slice_efficiency,
        "available_slice_efficiency": snapshot.available_slice_efficiency,
        "missing_events": snapshot.missing_events,
        "slow_step_time_s": snapshot.slow_step_time_s if window_s == 0 else None,
        "unaccounted_s": None,
    }
    if window is not None:
        row.update(window_start=timestamp(window.start_us), window_end=timestamp(window.end_us),
                   goodput_pct=window.goodput_pct, productive_time_s=window.productive_s,
                   total_time_s=window.total_s, disruptions=window.disruptions,
                   productive_chip_s=window.chip_seconds_productive,
                   total_chip_s=window.chip_seconds_total, unaccounted_s=window.unaccounted_s)
    return row


def dead_letter_row(letter: DeadLetter, received: datetime.datetime | None = None) -> Row:
    """The ``dead_letter`` row of a rejected input (a message, an event, a row a sink refused, a
    point Cloud Monitoring did not take), received now unless told."""
    return {"received_time": received or datetime.datetime.now(datetime.timezone.utc),
            "source": letter.source or None, "run_id": letter.run_id or None,
            "reason": free_text(letter.reason), "payload": letter.payload}


def engine_failure_letter(run_id: str, error: Exception, batch: Batch | None = None) -> DeadLetter:
    """The dead letter of a message the engine failed on (with the message as its payload), or
    of a snapshot it failed to take (``batch`` None): a bug, kept for replay once it is fixed."""
    what = "this message" if batch is not None else "the run's snapshot"
    payload = "" if batch is None else encode_events(batch.events(), batch.run_name,
                                                     batch.workload_uid).decode()
    return DeadLetter(payload, f"the engine failed on {what}: {type(error).__name__}: {error}", "engine",
                      run_id)


def event_rows(batch: Batch, step_columns: bool = True) -> list[Row]:
    """The ``events`` rows of a message's events; without its step columns (``batch.steps``,
    which a columnar sink writes as they are) if not ``step_columns``."""
    rows = [{"run_id": batch.run_id, "attempt_id": batch.attempt_id, "seq": seq,
             "event_time": timestamp(time_us), "kind": "step_start", "step": step, "body": None}
            for seq, time_us, step in zip(batch.step_seqs, batch.step_times, batch.steps, strict=True)
            ] if step_columns else []
    return rows + [{"run_id": batch.run_id, "attempt_id": batch.attempt_id, "seq": event.seq,
                    "event_time": timestamp(event.time_us), "kind": event.kind,
                    "step": event.body.get("step") if event.kind == "step_start" else None,
                    "body": json.dumps(event.body, sort_keys=True, default=str)}
                   for event in batch.others]


def batch_rows(batch: Batch, raw_events: bool = True) -> Iterator[Element]:
    """(EVENTS, batch) for a message's events, if ``raw_events``; (RUN_METADATA, row) for each
    attempt start it carries, (RUN_CONFIGS, row) for each config entry and (MODEL_METRICS, row)
    for each metric value (of ``metrics`` and ``model_metrics`` events), non-finite ones too."""
    if raw_events:
        yield EVENTS, batch
    for event in batch.others:
        body = event.body
        if event.kind == "job_start":
            yield RUN_METADATA, _metadata_row(batch, event)
        elif event.kind == "configs":
            recorded = timestamp(event.time_us)
            for key, value in sorted(body["values"].items()):
                yield RUN_CONFIGS, {"run_id": batch.run_id, "attempt_id": batch.attempt_id,
                                    "recorded_at": recorded, "source": body["source"], "key": key,
                                    "value": value}
        elif event.kind in ("metrics", "model_metrics"):
            values = body["values"] if event.kind == "metrics" else {
                MODEL_METRIC_NAMES[field]: value for field, value in body.items() if field != "step"}
            at, step = timestamp(event.time_us), body.get("step")
            for name, value in sorted(values.items()):
                yield MODEL_METRICS, {"run_id": batch.run_id, "attempt_id": batch.attempt_id,
                                      "metric_time": at, "step": step, "name": name, "value": value}


def _metadata_row(batch: Batch, start: Event) -> Row:
    """The ``run_metadata`` row of an attempt's start: what the job said of itself, the name it
    gave the run and the workload it runs in."""
    body = start.body
    workload = body.get("workload", {})
    return {
        "run_id": batch.run_id, "attempt_id": batch.attempt_id,
        "start_time": timestamp(start.time_us), "run_group": body.get("run_group") or None,
        "accelerator_type": body.get("accelerator_type") or None,
        "chip_count": body.get("chip_count") or None,
        "configured_ideal_step_time_s": body.get("configured_ideal_step_time_s"),
        "location": body.get("location") or None,
        "emitter_version": body.get("emitter_version") or None,
        "labels": json.dumps(body["labels"], sort_keys=True) if body.get("labels") else None,
        "run_name": batch.run_name or batch.run_id, "workload_uid": batch.workload_uid or None,
        **{field: workload.get(field) or None for field in WORKLOAD_FIELDS},
    }
