"""Configs and named metrics: rows of their own tables (``run_configs``, ``model_metrics``), made per
message, and nothing of a run's state or figures."""

from __future__ import annotations

import datetime
import math

import duckdb
import pytest

from goodput_schemas import table_schema
from goodput_schemas.wire import encode_batch, workload_run_id
from pipeline.core import engine
from pipeline.core.rows import (
    MODEL_METRICS,
    RUN_CONFIGS,
    RUN_METADATA,
    WORKLOAD_FIELDS,
    batch_rows,
    timestamp,
)
from pipeline.emulators.bigquery import check_row
from pipeline.sinks.bigquery import to_json
from pipeline.sinks.duckdb import DuckDBSink
from support.runs import batch_of, messages, recorded, state_of, with_configs_and_metrics

T = 1_793_000_000_000_000  # 2026-10-25, in microseconds
CONFIGS = {"model.layers": "4", "optimizer.learning_rate": "0.01", "seed": "7"}


def rows_of(data: bytes, table: str) -> list[dict[str, object]]:
    return [row for name, row in batch_rows(batch_of(data)) if name == table]


def test_configs_and_metrics_change_no_figure_and_leave_only_their_seqs_in_the_state():
    """A run with configs and metrics has the snapshot of the run without them, and its state holds
    the same steps, observations and events: of theirs, only the sequence numbers."""
    events, as_of = recorded("restarted")
    mixed = with_configs_and_metrics(events, CONFIGS)
    plain = state_of(map(batch_of, messages(events, 100)))
    full = state_of(map(batch_of, messages(mixed, 100)))
    assert full.snapshot(as_of) == plain.snapshot(as_of)
    for attempt_id, attempt in full.attempts.items():
        other = plain.attempts[attempt_id]
        assert attempt.records == other.records and list(attempt.obs_seqs) == list(other.obs_seqs)
        assert attempt.last_event_us == other.last_event_us
        assert attempt.watermark == max(e.seq for e in mixed if e.attempt_id == attempt_id) + 1
    one_by_one = engine.RunState("run")
    one_by_one.add_all(reversed(mixed))
    assert one_by_one.snapshot(as_of) == plain.snapshot(as_of)


def test_a_configs_event_is_one_row_per_key():
    """Each key of a configs event is a row, with its source and the event's time."""
    data = encode_batch("run-1", "a1", [(0, T, "configs", {"source": "software", "values": {
        "python.version": "3.11.9", "jax.version": "0.4.35"}})]).data
    at = timestamp(T)
    assert rows_of(data, RUN_CONFIGS) == [
        {"run_id": "run-1", "attempt_id": "a1", "recorded_at": at, "source": "software", "key": key,
         "value": value} for key, value in (("jax.version", "0.4.35"), ("python.version", "3.11.9"))]


def test_metrics_and_model_metrics_are_rows_by_name_non_finite_values_kept():
    """A metrics event is a row per name, at its step or none; a model_metrics event's fields are
    rows under ML Diagnostics' names; NaN and infinities are values like any other."""
    data = encode_batch("run-1", "a1", [
        (0, T, "metrics", {"step": 3, "values": {"LOSS": "NaN", "GRADIENT_NORM": 1.5}}),
        (1, T + 1, "metrics", {"values": {"LATENCY": "-Infinity"}}),
        (2, T + 2, "model_metrics", (4, 2.5, 0.5, 1e6, 300.0, 0.41, 190.0)),
    ]).data
    rows = [(r["metric_time"], r["step"], r["name"], r["value"]) for r in rows_of(data, MODEL_METRICS)]
    at = [timestamp(T + i) for i in range(3)]
    assert rows[0][:3] == (at[0], 3, "GRADIENT_NORM") and rows[0][3] == 1.5
    assert rows[1][:3] == (at[0], 3, "LOSS") and math.isnan(rows[1][3])  # type: ignore[arg-type]
    assert rows[2:] == [
        (at[1], None, "LATENCY", -math.inf),
        (at[2], 4, "LOSS", 2.5), (at[2], 4, "MFU", 0.41), (at[2], 4, "SAMPLE_THROUGHPUT", 300.0),
        (at[2], 4, "STEP_TIME", 0.5), (at[2], 4, "TFLOPS", 190.0), (at[2], 4, "THROUGHPUT", 1e6)]


def test_run_metadata_names_the_run_and_where_it_runs():
    """run_metadata holds the name the job gave, the workload uid, and each workload field (NULL
    where the emitter saw none)."""
    workload = {"platform": "gke", "cluster": "c1", "namespace": "ml", "jobset_name": "llama",
                "jobset_uid": "3f2a9c1e-5b1d"}
    start = (0, T, "job_start", {"run_group": "llama", "workload": workload})
    (row,) = rows_of(encode_batch("llama-7b", "a1", [start], workload_uid="3f2a9c1e-5b1d").data, RUN_METADATA)
    assert (row["run_id"], row["run_name"], row["workload_uid"]) == (
        workload_run_id("llama-7b", "3f2a9c1e-5b1d"), "llama-7b", "3f2a9c1e-5b1d")
    assert {field: row[field] for field in WORKLOAD_FIELDS} == {field: workload.get(field) for field in
                                                                WORKLOAD_FIELDS}
    (plain,) = rows_of(encode_batch("llama-7b", "a1", [(0, T, "job_start", {})]).data, RUN_METADATA)
    assert (plain["run_id"], plain["run_name"], plain["workload_uid"]) == ("llama-7b", "llama-7b", None)


@pytest.mark.parametrize("table", [RUN_CONFIGS, MODEL_METRICS, RUN_METADATA])
def test_rows_have_exactly_the_columns_of_their_table(table):
    """Every row batch_rows makes has its table's columns, and BigQuery's schema check takes it."""
    events, _ = recorded("restarted")
    data = messages(with_configs_and_metrics(events, CONFIGS), 100_000)
    made = [row for message in data for name, row in batch_rows(batch_of(message)) if name == table]
    schema = table_schema(table)
    assert made
    for row in made:
        assert set(row) == {field["name"] for field in schema}
        assert check_row(schema, to_json(row), ignore_unknown=False)[1] == []


def test_non_finite_metric_values_are_stored_as_they_came(tmp_path):
    """DuckDB keeps NaN and the infinities; BigQuery's insertAll gets them as its JSON names them."""
    data = encode_batch("run-1", "a1", [(0, T, "metrics", {"values": {
        "a": "NaN", "b": "Infinity", "c": "-Infinity", "d": 0.25}})]).data
    made = rows_of(data, MODEL_METRICS)
    assert [to_json(row)["value"] for row in made] == ["NaN", "Infinity", "-Infinity", 0.25]
    sink = DuckDBSink(tmp_path / "metrics.duckdb")
    try:
        sink.write(MODEL_METRICS, made)
    finally:
        sink.close()
    with duckdb.connect(str(tmp_path / "metrics.duckdb"), read_only=True) as connection:
        stored = dict(connection.execute("SELECT name, value FROM model_metrics").fetchall())
    assert math.isnan(stored["a"]) and (stored["b"], stored["c"], stored["d"]) == (math.inf, -math.inf, 0.25)


def test_a_config_value_is_stored_whole():
    """A config value is free text: a newline or a long value is stored as it came, not as an id."""
    value = "line one\nline two " + "é" * 1000
    body = {"source": "user", "values": {"note": value}}
    data = encode_batch("run-1", "a1", [(0, T, "configs", body)]).data
    (row,) = rows_of(data, RUN_CONFIGS)
    assert to_json(row)["value"] == value
    assert datetime.datetime.fromisoformat(to_json(row)["recorded_at"]) == timestamp(T)
