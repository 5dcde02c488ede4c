"""Importing the reference's Cloud Logging history (``pipeline.app.importer``).

The reference recorder (ml-goodput-measurement 0.2.3), driven through its ``cloud_logger`` test
hook, writes the payloads; they are wrapped as ``gcloud logging read --format=json`` would
export them, imported, and replayed through the batch pipeline. Where the reference is right,
the goodput must equal what the reference computes on those same entries.
"""

from __future__ import annotations

import datetime
import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from ml_goodput_measurement.src import goodput as reference_goodput
from ml_goodput_measurement.src import goodput_elastic
from reference_harness import ORBAX, Call, _orbax_entry
from test_compat import assert_same_as_reference, clean_run, replay, restarted_run
from test_pubsub_transport import TOPIC, open_emulator, pull_all
from test_reference_replay import FIELD, TIME_KEY, CapturingCloudLogger, reference_trace

from benchmarks.common import InMemoryCloudLogging
from emitter import goodput
from pipeline.app import importer
from pipeline.beam.graph import read_lines
from pipeline.core.events import Event, parse_message

REPO = Path(__file__).resolve().parent.parent
LOG_NAME = "projects/my-project/logs/goodput_run"


def reference_payloads(attempts: Sequence[Sequence[Call]], job_name: str = "run") -> list[dict[str, Any]]:
    """The jsonPayloads the reference recorder (and Orbax) write for the calls, in order."""
    sink = CapturingCloudLogger()
    for calls in attempts:
        recorder = goodput_elastic.ElasticGoodputRecorder(job_name, "log", True, cloud_logger=sink)
        for method, args in calls:
            if method in ORBAX:
                sink.write_cloud_logging_entry({**_orbax_entry(method, *args), "job_name": job_name})
            else:
                getattr(recorder, method)(*args)
    return sink.entries


def reference_goodput_of(payloads: list[dict[str, Any]], cache_dir: Path) -> tuple[Any, ...]:
    """The reference's own get_job_goodput(include_badput_breakdown=True) on the payloads."""
    log = InMemoryCloudLogging()
    log.entries = list(payloads)
    calculator = reference_goodput.GoodputCalculator("run", "log", cloud_logger=log, cache_dir=str(cache_dir))
    return calculator.get_job_goodput(include_badput_breakdown=True)


def payload_time(payload: dict[str, Any]) -> float:
    """The first field whose name says it is a time, as the reference reads it."""
    return next(value for key, value in payload.items() if "time" in key and value is not None)


def as_struct(value: Any) -> Any:
    """A value as Cloud Logging returns it from a protobuf Struct: every number a double."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return float(value)
    if isinstance(value, dict):
        return {k: as_struct(v) for k, v in value.items()}
    return value


def log_entries(payloads: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The payloads as exported LogEntry objects, newest first, as ``gcloud logging read`` lists."""
    entries = []
    for index, payload in enumerate(payloads):
        written = datetime.datetime.fromtimestamp(payload_time(payload), datetime.timezone.utc)
        entries.append({
            "insertId": f"{index:012x}", "jsonPayload": as_struct(payload), "logName": LOG_NAME,
            "receiveTimestamp": written.isoformat().replace("+00:00", "Z"),
            "resource": {"type": "global", "labels": {"project_id": "my-project"}}, "severity": "INFO",
            "timestamp": written.strftime("%Y-%m-%dT%H:%M:%S.%f") + "123Z",  # nanoseconds, as Cloud Logging
        })
    return entries[::-1]


def imported_events(result: importer.ImportResult) -> list[Event]:
    events: list[Event] = []
    for message in result.messages:
        parsed, dead = parse_message(message.data)
        assert not dead, dead
        events.extend(parsed)
    return events


@pytest.mark.parametrize("build", [clean_run, restarted_run], ids=["clean", "restarted"])
def test_imported_history_gives_the_reference_numbers(build: Any, tmp_path: Path):
    """A gcloud export, imported and replayed: the reference's goodput and buckets, within 0.01 pp."""
    payloads = reference_payloads(build().attempts)
    export = tmp_path / "history.json"
    export.write_text(json.dumps(log_entries(payloads), indent=2))
    result = importer.import_files([export])
    assert not result.rejected and result.events == len(payloads)
    importer.write_messages(result.messages, tmp_path / "events.jsonl")
    replay(tmp_path / "events.jsonl", tmp_path / "goodput.duckdb")
    ours = goodput.GoodputCalculator("run", duckdb_path=tmp_path / "goodput.duckdb").get_job_goodput(True)
    assert_same_as_reference(ours, reference_goodput_of(payloads, tmp_path))


def test_importing_twice_gives_the_same_events_and_numbers(tmp_path: Path):
    """The same export imported twice has the same event ids: the replay counts each event once."""
    export = tmp_path / "history.json"
    export.write_text(json.dumps(log_entries(reference_payloads(restarted_run().attempts))))
    first, second = importer.import_files([export]), importer.import_files([export])
    assert [m.data for m in first.messages] == [m.data for m in second.messages]
    importer.write_messages(first.messages, tmp_path / "once.jsonl")
    importer.write_messages(second.messages, tmp_path / "again.jsonl")
    replay(tmp_path / "once.jsonl", tmp_path / "once.duckdb")
    replay(tmp_path / "once.jsonl", tmp_path / "twice.duckdb", f"--events={tmp_path / 'again.jsonl'}")
    once = goodput.GoodputCalculator("run", duckdb_path=tmp_path / "once.duckdb").get_job_goodput(True)
    twice = goodput.GoodputCalculator("run", duckdb_path=tmp_path / "twice.duckdb").get_job_goodput(True)
    assert twice == once


@pytest.mark.parametrize("seed", [1, 2])
def test_every_reference_payload_becomes_the_matching_event(seed: int):
    """Each payload of every recorder method becomes one valid event of the same kind, time and values."""
    attempts = list(reference_trace(seed))
    payloads = reference_payloads(attempts, job_name="run-7")
    result = importer.import_entries(
        (f"line{n}", entry) for n, entry in enumerate(log_entries(payloads)))
    events = imported_events(result)
    assert not result.rejected and len(events) == len(payloads)
    assert result.attempts == {"run-7": 2}
    for event, payload in zip(events, payloads, strict=True):
        assert event.run_id == payload["job_name"]
        assert payload[TIME_KEY[event.kind]] == pytest.approx(event.time_us / 1e6, abs=1e-6)
        for ours, theirs in FIELD.items():
            if ours in event.body:
                assert payload[theirs] == event.body[ours]


def test_attempts_start_at_each_job_start_with_seqs_in_order():
    """A new attempt at each job_start entry; entries before the first form their own; seqs 0, 1, 2..."""
    t = datetime.datetime(2026, 11, 1, 8, tzinfo=datetime.timezone.utc).timestamp()
    payloads = [{"job_name": "run", "step_count": 7, "step_start_time": t},
                {"job_name": "run", "job_start_time": t + 10},
                {"job_name": "run", "step_count": 0, "step_start_time": t + 20},
                {"job_name": "run", "step_count": 1, "step_start_time": t + 22},
                {"job_name": "run", "job_start_time": t + 60},
                {"job_name": "run", "step_count": 1, "step_start_time": t + 70}]
    events = imported_events(importer.import_entries(("x", p) for p in payloads))
    attempts = list(dict.fromkeys(e.attempt_id for e in events))
    assert len(attempts) == 3
    assert [(attempts.index(e.attempt_id), e.seq, e.kind) for e in events] == [
        (0, 0, "step_start"), (1, 0, "job_start"), (1, 1, "step_start"), (1, 2, "step_start"),
        (2, 0, "job_start"), (2, 1, "step_start")]


def test_json_lines_of_entries_and_of_bare_payloads_give_the_same_events():
    """LogEntry lines and bare jsonPayload lines import to the same kinds, times and values."""
    payloads = reference_payloads(clean_run().attempts)
    entries = "\n".join(json.dumps(e) for e in log_entries(payloads))
    bare = "\n".join(json.dumps(p) for p in payloads)
    from_entries = imported_events(importer.import_entries(importer.read_entries(entries, "e.jsonl")))
    from_bare = imported_events(importer.import_entries(importer.read_entries(bare, "p.jsonl")))
    assert [(e.seq, e.time_us, e.kind, e.body) for e in from_entries] == [
        (e.seq, e.time_us, e.kind, e.body) for e in from_bare]


def test_bad_entries_are_counted_with_their_reasons():
    """Nothing is dropped unseen: each bad entry is rejected with a reason, duplicates and other
    jobs are counted, and the good entries are still imported."""
    t = 1_793_520_000.0
    good = {"job_name": "run", "job_start_time": t}
    lines = [
        json.dumps({"logName": LOG_NAME, "insertId": "a", "timestamp": "2026-11-01T08:00:00Z",
                    "jsonPayload": good}),
        json.dumps({"logName": LOG_NAME, "insertId": "a", "timestamp": "2026-11-01T08:00:00Z",
                    "jsonPayload": good}),  # the same entry again
        json.dumps({"logName": LOG_NAME, "insertId": "b", "timestamp": "2026-11-01T08:00:01Z",
                    "textPayload": "hello"}),
        "{not json",
        "42",
        json.dumps({"step_count": 1.0, "step_start_time": t + 1}),
        json.dumps({"job_name": "run", "something_else": 1}),
        json.dumps({"job_name": "run", "step_count": 1.5, "step_start_time": t + 2}),
        json.dumps({"job_name": "run", "step_count": 2.0, "step_start_time": "yesterday"}),
        json.dumps({"job_name": "run", "event_type": "save", "step": 2.0, "directory": "gs://b",
                    "wait_for_prev_start_time": t + 3}),
        json.dumps({"job_name": "other", "job_start_time": t}),
        json.dumps({"job_name": "run", "step_count": 0.0, "step_start_time": t + 4}),
    ]
    result = importer.import_entries(importer.read_entries("\n".join(lines), "h.jsonl"), job_name="run")
    assert result.entries == len(lines)
    assert (result.events, result.duplicates, result.other_jobs) == (2, 1, 1)
    assert result.reasons == {"no jsonPayload": 1, "invalid JSON": 1, "not a JSON object": 1,
                              "no job_name": 1, "unknown payload": 1, "bad field": 1, "bad time": 1,
                              "incomplete checkpoint entry": 1}
    assert {r.source for r in result.rejected} == {f"h.jsonl:{n}" for n in (3, 4, 5, 6, 7, 8, 9, 10)}
    assert result.entries == (result.events + result.duplicates + result.other_jobs + len(result.rejected))
    assert "rejected 1: bad time" in result.summary()
    assert next(r for r in result.rejected if r.reason == "invalid JSON").payload == "{not json"


def test_a_bad_log_entry_timestamp_is_rejected():
    """A LogEntry whose timestamp is not RFC 3339 is rejected, not guessed."""
    entry = {"logName": LOG_NAME, "insertId": "a", "timestamp": "Sunday",
             "jsonPayload": {"job_name": "run", "job_start_time": 1_793_520_000.0}}
    result = importer.import_entries([("h.json#0", entry)])
    assert result.reasons == {"bad timestamp": 1} and result.events == 0


def test_command_writes_events_and_rejections(tmp_path: Path):
    """goodput import FILE --output --job-name --rejected: events the replay reads, a summary."""
    payloads = reference_payloads(clean_run().attempts)
    export = tmp_path / "history.json"
    export.write_text(json.dumps([*log_entries(payloads), {"jsonPayload": {"job_name": "run"}}]))
    done = subprocess.run([sys.executable, "-m", "pipeline.app.cli", "import", str(export), "--output",
                           str(tmp_path / "events.jsonl"), "--job-name", "run", "--rejected",
                           str(tmp_path / "rejected.jsonl")], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert f"{len(payloads) + 1} entries read: {len(payloads)} events" in done.stdout
    assert "rejected 1: unknown payload" in done.stdout
    (rejected,) = [json.loads(line) for line in (tmp_path / "rejected.jsonl").read_text().splitlines()]
    assert rejected["reason"] == "unknown payload" and rejected["source"].endswith(f"#{len(payloads)}")
    lines = list(read_lines(str(tmp_path / "events.jsonl")))
    assert sum(len(parse_message(line, source)[0]) for source, line in lines) == len(payloads)


def test_help_names_the_inputs_and_outputs(capsys: pytest.CaptureFixture[str]):
    """--help explains the export, the input formats and both outputs."""
    from pipeline.app.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["import", "--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    for words in ("gcloud logging read", "--output", "--destination", "--job-name", "jsonPayload"):
        assert words in text


def test_publishes_to_a_pubsub_topic(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]):
    """--destination publishes every message through the emitter's transport."""
    emulator = open_emulator(monkeypatch)
    try:
        payloads = reference_payloads(restarted_run().attempts)
        export = tmp_path / "history.json"
        export.write_text(json.dumps(log_entries(payloads)))
        assert importer.main([str(export), "--destination", TOPIC]) == 0
        received = pull_all(emulator)
    finally:
        emulator.stop()
    events = [e for m in received for e in parse_message(m.message.data)[0]]
    assert len(events) == len(payloads)
    assert {m.message.attributes["run_id"] for m in received} == {"run"}
    assert "messages written to projects/" in capsys.readouterr().out
