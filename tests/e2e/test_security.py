"""Abuse: what a job sends cannot break or flood a sink, and no credential is committed.

Label and value limits are tested through the real client libraries against the local
stand-ins, which refuse what the services refuse (``pipeline.core.sanitize`` cites each limit)."""

from __future__ import annotations

import datetime
import hashlib
import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from google.api_core import exceptions

from goodput_schemas import table_schema
from pipeline.core import engine
from pipeline.core.events import parse_batch
from pipeline.core.sanitize import GCM_MAX_LABEL_VALUE_BYTES, MAX_ID_BYTES, MAX_TEXT_BYTES, truncate_utf8
from pipeline.emulators.bigquery import BigQueryEmulator
from pipeline.emulators.monitoring import MetricStore, MonitoringEmulator
from pipeline.sinks.bigquery import BigQueryWriter, create_tables
from pipeline.sinks.bigquery import make_client as bigquery_client
from pipeline.sinks.duckdb import DuckDBSink
from pipeline.sinks.monitoring import (
    CUSTOM,
    MAX_CUSTOM_BADPUT_SERIES,
    METRICS,
    OPTIONAL_LABEL,
    OTHER_CUSTOM_BADPUT,
    REFERENCE,
    MetricWriter,
    Point,
    snapshot_points,
)
from pipeline.sinks.monitoring import make_client as monitoring_client
from support import REPO
from support.runs import snapshot_at

PROJECT, DATASET = "goodput-local", "goodput"
UTC = datetime.timezone.utc


NOW = datetime.datetime.now(UTC).replace(microsecond=0)


DIGEST = re.compile(r"~[0-9a-f]{16}$")


@pytest.fixture
def monitoring() -> Iterator[MonitoringEmulator]:
    with MonitoringEmulator(store=MetricStore(min_interval_s=0.0)) as started:
        yield started


@pytest.fixture
def bigquery() -> Iterator[BigQueryEmulator]:
    with BigQueryEmulator() as started:
        create_tables(bigquery_client(PROJECT, started.endpoint), PROJECT, DATASET)
        yield started


def stamped(points: list[Point]) -> list[Point]:
    end_us = round(NOW.timestamp() * 1e6)
    return [Point(p.metric, p.labels, p.run_id, p.location, p.value, end_us) for p in points]


def written_labels(store: MetricStore) -> Iterator[tuple[str, dict[str, str], dict[str, str]]]:
    """(metric, metric labels, resource labels) of every point the stand-in accepted."""
    for metric in METRICS:
        for labels, resource, _, _ in store.points(metric):
            yield metric, labels, resource


def utf8_bytes(text: str) -> int:
    return len(text.encode("utf-8"))


def test_monitoring_stand_in_counts_label_values_in_utf8_bytes(monitoring):
    """1024 bytes pass; 513 two-byte characters (1026 bytes) are refused, on metric and resource labels."""
    from google.cloud import monitoring_v3

    client = monitoring_client(monitoring.host)

    def series(accelerator: str, job: str = "run-1") -> Any:
        ts = monitoring_v3.TimeSeries()
        ts.metric.type = CUSTOM + "goodput_pct"
        ts.metric.labels["accelerator_type"] = accelerator
        ts.resource.type = "generic_task"
        ts.resource.labels.update({"location": "global", "namespace": "n", "job": job, "task_id": "0"})
        ts.points = [monitoring_v3.Point(interval=monitoring_v3.TimeInterval(end_time=NOW),
                                         value=monitoring_v3.TypedValue(double_value=1.0))]
        return ts

    def write(ts: Any) -> None:
        client.create_time_series(name=f"projects/{PROJECT}", time_series=[ts], retry=None)

    write(series("é" * 512, job="é" * 512))
    refused = exceptions.InvalidArgument
    with pytest.raises(refused, match="metric label 'accelerator_type' is longer than 1024 bytes"):
        write(series("é" * 513))
    with pytest.raises(refused, match="resource generic_task label 'job' is longer than 1024 bytes"):
        write(series("v5p", job="é" * 513))
    assert len(monitoring.store.points(CUSTOM + "goodput_pct")) == 1


def test_long_ids_and_labels_are_cut_on_a_character_boundary_with_a_digest(monitoring):
    """Over-long run ids, locations and accelerators are written, each value cut to 1024 bytes of
    whole characters plus a digest, so that two runs sharing a long prefix stay two series."""
    prefix = "r" + "é" * 700  # 1401 bytes: longer than any label value may be
    points = stamped([point for suffix in ("-a", "-b") for point in snapshot_points(
        snapshot_at(NOW, prefix + suffix, location="東" * 400, accelerator_type="🚀" * 300))])
    assert MetricWriter(monitoring_client(monitoring.host), PROJECT).write(points) == 0
    jobs = set()
    for _, labels, resource in written_labels(monitoring.store):
        for value in [*labels.values(), *resource.values()]:
            assert utf8_bytes(value) <= GCM_MAX_LABEL_VALUE_BYTES
        run = resource.get("workload_id") or resource["job"]
        assert DIGEST.search(run) and run.startswith(truncate_utf8(prefix, 900))
        assert DIGEST.search(resource["location"])
        assert "accelerator_type" not in labels or DIGEST.search(labels["accelerator_type"])
        jobs.add(run)
    assert len(jobs) == 2


def test_control_characters_and_lone_surrogates_never_reach_a_label(monitoring):
    """Escape sequences, newlines, bidi overrides and lone surrogates become U+FFFD in label values."""
    snapshot = snapshot_at(NOW, "run\u202e\ud800-1", accelerator_type="v5p\x1b[2J\r\n", location="us\x00east")
    writer = MetricWriter(monitoring_client(monitoring.host), PROJECT)
    assert writer.write(stamped(snapshot_points(snapshot))) == 0
    seen = list(written_labels(monitoring.store))
    assert seen
    for _, labels, resource in seen:
        for value in [*labels.values(), *resource.values()]:
            assert value.isprintable(), value
    assert {resource.get("workload_id") or resource.get("job") for _, _, resource in seen} == {
        "run\ufffd\ufffd-1"}


def test_user_labels_and_names_never_become_label_keys(monitoring):
    """A job's labels, custom badput types and metadata reach Cloud Monitoring only as values of
    each metric's fixed label keys."""
    start_us = round(NOW.timestamp() * 1e6) - 600_000_000
    events: list[dict[str, Any]] = [{"seq": 0, "time_us": start_us, "job_start": {
        "accelerator_type": "v5p", "chip_count": 8, "location": "us-central2-b",
        "labels": {"team": "x", "badput_source": "forged", "goodput_source": "forged", "job": "other",
                   "Not A Key": "v"}}}]
    events += [{"seq": 1 + i, "time_us": start_us + (1 + i) * 10_000_000, "step_start": {"step": i}}
               for i in range(20)]
    events += [{"seq": 30, "time_us": start_us + 50_000_000, "custom_badput_start": {"badput_type": "team"}},
               {"seq": 31, "time_us": start_us + 60_000_000, "custom_badput_end": {"badput_type": "team"}}]
    message = json.dumps({"schema_version": 1, "run_id": "run-1", "attempt_id": "a", "events": events})
    batch, dead = parse_batch(message.encode())
    assert batch is not None and dead == []
    state = engine.RunState("run-1")
    state.add_batch(batch)
    snapshot = state.snapshot(start_us + 300_000_000, (300,))
    assert snapshot is not None
    points = stamped(snapshot_points(snapshot, cluster_name="c"))
    assert MetricWriter(monitoring_client(monitoring.host), PROJECT).write(points) == 0
    seen = list(written_labels(monitoring.store))
    assert any(labels.get("badput_source") == "CUSTOM_BADPUT_EVENTS.TEAM" for _, labels, _ in seen)
    for metric, labels, _ in seen:
        assert set(labels) <= METRICS[metric] | {OPTIONAL_LABEL}, (metric, labels)


def test_a_point_with_a_foreign_label_key_is_never_sent(monitoring):
    """The writer refuses, without a request, a label key its metric lacks and a metric it does not write."""
    end_us = round(NOW.timestamp() * 1e6)
    foreign = [Point(REFERENCE + "goodput_time", (("accelerator_type", "v5p"), ("team", "x")), "run-1",
                     "global", 1.0, end_us),
               Point(CUSTOM + "anything", (), "run-1", "global", 1.0, end_us)]
    failures: list[tuple[Point, str]] = []
    writer = MetricWriter(monitoring_client(monitoring.host), PROJECT)
    assert writer.write(foreign, lambda *failure: failures.append(failure)) == 2
    assert monitoring.store.requests == 0
    assert "label keys ['team']" in failures[0][1] and "not a metric this pipeline writes" in failures[1][1]


def test_custom_badput_types_are_capped_per_run(monitoring):
    """Thousands of custom badput types make at most MAX_CUSTOM_BADPUT_SERIES + 1 series, same total."""
    snapshot = snapshot_at(NOW, "run-1", {f"CUSTOM_BADPUT_EVENTS.T{i}": float(i) for i in range(2000)},
                                (300,), accelerator_type="v5p")
    points = stamped(snapshot_points(snapshot))
    badput = [p for p in points if p.metric == REFERENCE + "badput_time"]
    assert len(badput) == MAX_CUSTOM_BADPUT_SERIES + 1
    names = {dict(p.labels)["badput_source"] for p in badput}
    assert OTHER_CUSTOM_BADPUT in names and "CUSTOM_BADPUT_EVENTS.T1999" in names
    assert sum(p.value for p in badput) == pytest.approx(sum(range(2000)))
    interval = [p for p in points if p.metric == REFERENCE + "interval_badput"]
    assert len(interval) == MAX_CUSTOM_BADPUT_SERIES + 1
    assert MetricWriter(monitoring_client(monitoring.host), PROJECT).write(points) == 0


def hostile_rows() -> dict[str, list[dict[str, Any]]]:
    """Rows carrying what a job may send: a huge run id, control characters, a lone surrogate, a
    2 MB labels document, a 12 MB raw payload and a 1 MB run id in a dead letter."""
    return {
        "run_metadata": [{"run_id": "x" * 5000, "attempt_id": "a\x00\n\x1b", "start_time": NOW,
                          "accelerator_type": "\ud800v5p", "chip_count": 8,
                          "labels": json.dumps({"k": "v" * 2_000_000})}],
        "dead_letter": [{"received_time": NOW, "source": "pubsub:1", "run_id": "y" * 1_000_000,
                         "reason": "message is not valid JSON", "payload": "z" * 12_000_000}],
    }


def test_bigquery_stand_in_refuses_strings_that_are_not_utf8(bigquery):
    """A lone surrogate (half of a character, as a JSON escape) cannot be stored as UTF-8."""
    client = bigquery_client(PROJECT, bigquery.endpoint)
    errors = client.insert_rows_json(f"{PROJECT}.{DATASET}.dead_letter", [
        {"received_time": "2026-11-01T08:00:00Z", "reason": "r", "payload": "\ud800"}], retry=None)
    assert "Cannot convert value to string" in errors[0]["errors"][0]["message"]


def test_bigquery_values_are_made_storable_and_nothing_is_refused(bigquery):
    """Hostile rows are written to their tables: ids printable and at most 2048 bytes, free text
    valid UTF-8 and at most 512 KiB, and a cut payload says so in its reason."""
    writer = BigQueryWriter(bigquery_client(PROJECT, bigquery.endpoint), PROJECT, DATASET,
                            retry_deadline_s=5.0, initial_backoff_s=0.01, max_backoff_s=0.05)
    assert writer.write(hostile_rows()) == 0  # before: the 12 MB row failed the whole request
    (meta,) = bigquery.store.rows(PROJECT, DATASET, "run_metadata")
    assert utf8_bytes(meta["run_id"]) <= MAX_ID_BYTES and DIGEST.search(meta["run_id"])
    assert meta["attempt_id"] == "a\ufffd\ufffd\ufffd" and meta["accelerator_type"] == "\ufffdv5p"
    assert utf8_bytes(meta["labels"]) <= MAX_TEXT_BYTES
    (letter,) = bigquery.store.rows(PROJECT, DATASET, "dead_letter")
    assert utf8_bytes(letter["run_id"]) <= MAX_ID_BYTES
    assert utf8_bytes(letter["payload"]) <= MAX_TEXT_BYTES
    digest = hashlib.sha256(b"z" * 12_000_000).hexdigest()[:16]
    assert letter["payload"].endswith("~" + digest) and "payload of 12000000 bytes is cut" in letter["reason"]


def test_duckdb_stores_the_same_values_as_bigquery(bigquery, tmp_path):
    """The local stand-in of BigQuery makes the same values storable in the same way."""
    BigQueryWriter(bigquery_client(PROJECT, bigquery.endpoint), PROJECT, DATASET).write(hostile_rows())
    sink = DuckDBSink(tmp_path / "goodput.duckdb")
    try:
        for table, rows in hostile_rows().items():
            sink.write(table, rows)  # before: the lone surrogate made pyarrow raise
            columns = [field["name"] for field in table_schema(table) if field["name"] != "received_time"]
            local = sink.query(f'SELECT {", ".join(columns)} FROM "{table}"')
            remote = [tuple(row[name] for name in columns)
                      for row in bigquery.store.rows(PROJECT, DATASET, table)]
            naive = [tuple(v.replace(tzinfo=None) if isinstance(v, datetime.datetime) else v for v in row)
                     for row in remote]
            assert local == naive, table
    finally:
        sink.close()


#: Findings that are not secrets, as (path, detect-secrets type, line): none so far. Each entry
#: needs a comment saying what the string is.
ALLOWED_FINDINGS: frozenset[tuple[str, str, int]] = frozenset()


#: Inline ``pragma: allowlist`` comments are not honoured: the list above is the only way.
INLINE_ALLOWLIST = "detect_secrets.filters.allowlist.is_line_allowlisted"


def secret_findings(paths: list[Path]) -> set[tuple[str, str, int]]:
    """(path relative to the repository, type, line) of what detect-secrets finds in ``paths``,
    with all its plugins."""
    from detect_secrets import SecretsCollection
    from detect_secrets.settings import default_settings

    found: set[tuple[str, str, int]] = set()
    with default_settings() as settings:
        settings.disable_filters(INLINE_ALLOWLIST)
        secrets = SecretsCollection()
        for path in paths:
            secrets.scan_file(str(path))  # one process: forking beside gRPC threads is not safe
        for filename, secret in secrets:
            path = Path(filename)
            shown = path.relative_to(REPO).as_posix() if path.is_relative_to(REPO) else filename
            found.add((shown, secret.type, secret.line_number))
    return found


def test_no_credentials_in_the_repository():
    """detect-secrets finds nothing in the files git tracks (and new ones it does not ignore); about
    10 s on two busy cores."""
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            cwd=REPO, capture_output=True, check=True, timeout=60).stdout.decode()
    paths = sorted({REPO / name for name in listed.split("\0") if name and (REPO / name).is_file()})
    assert len(paths) > 100  # the listing worked
    assert sorted(secret_findings(paths) - ALLOWED_FINDINGS) == []


def test_the_secret_scanner_finds_planted_keys(tmp_path):
    """A planted AWS key and private key are found, even with an inline allow-list comment."""
    planted = tmp_path / "leak.py"
    aws, header = "AKIA" + "Z7QK3MFT2XWA5NRB", "-----BEGIN RSA " + "PRIVATE KEY-----"
    pragma = "pragma: " + "allowlist"
    planted.write_text(f'KEY = "{aws}"  # {pragma} secret\n{header}\n')
    assert {kind for _, kind, _ in secret_findings([planted])} >= {"AWS Access Key", "Private Key"}
