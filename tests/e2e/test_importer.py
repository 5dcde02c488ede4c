"""Importing the reference's Cloud Logging history (``pipeline.app.importer``).

The reference recorder (ml-goodput-measurement 0.2.3, in its own venv through
``support.reference``), driven through its ``cloud_logger`` test hook, writes the payloads; they
are wrapped as ``gcloud logging read --format=json`` would export them, imported, and replayed
through the batch pipeline. Where the reference is right, the goodput must equal what the
reference computes on those same entries."""

from __future__ import annotations

import functools
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ml_goodput_measurement import goodput
from pipeline.app import importer
from pipeline.core.events import parse_message, read_lines
from support import REPO
from support.history import replay
from support.pubsub import TOPIC, open_emulator, pull_all
from support.reference import (
    assert_same_as_reference,
    log_entries,
    reference_payloads,
    reference_result_of,
)
from support.runs import shape


@pytest.mark.parametrize("build", [functools.partial(shape, "long_clean", 21),
                                   functools.partial(shape, "outage", 22)], ids=["clean", "restarted"])
def test_imported_history_gives_the_reference_numbers(build: Any, tmp_path: Path):
    """A gcloud export, imported and replayed: the reference's goodput and buckets, within 0.01 pp."""
    payloads = reference_payloads(build().attempts)
    export = tmp_path / "history.json"
    export.write_text(json.dumps(log_entries(payloads), indent=2))
    result = importer.import_files([export])
    assert not result.rejected and result.events == len(payloads)
    importer.write_messages(result.messages, tmp_path / "events.jsonl")
    replay([tmp_path / "events.jsonl"], tmp_path / "goodput.duckdb")
    ours = goodput.GoodputCalculator("run", duckdb_path=tmp_path / "goodput.duckdb").get_job_goodput(True)
    assert_same_as_reference(ours, reference_result_of(payloads, tmp_path))


def test_importing_twice_gives_the_same_events_and_numbers(tmp_path: Path):
    """The same export imported twice has the same event ids: the replay counts each event once."""
    export = tmp_path / "history.json"
    export.write_text(json.dumps(log_entries(reference_payloads(shape("outage", 22).attempts))))
    first, second = importer.import_files([export]), importer.import_files([export])
    assert [m.data for m in first.messages] == [m.data for m in second.messages]
    importer.write_messages(first.messages, tmp_path / "once.jsonl")
    importer.write_messages(second.messages, tmp_path / "again.jsonl")
    replay([tmp_path / "once.jsonl"], tmp_path / "once.duckdb")
    replay([tmp_path / "once.jsonl"], tmp_path / "twice.duckdb", f"--events={tmp_path / 'again.jsonl'}")
    once = goodput.GoodputCalculator("run", duckdb_path=tmp_path / "once.duckdb").get_job_goodput(True)
    twice = goodput.GoodputCalculator("run", duckdb_path=tmp_path / "twice.duckdb").get_job_goodput(True)
    assert twice == once


def test_command_writes_events_and_rejections(tmp_path: Path):
    """goodput import FILE --output --job-name --rejected: events the replay reads, a summary."""
    payloads = reference_payloads(shape("long_clean", 21).attempts)
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


def test_publishes_to_a_pubsub_topic(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]):
    """--destination publishes every message through the emitter's transport."""
    emulator = open_emulator(monkeypatch)
    try:
        payloads = reference_payloads(shape("outage", 22).attempts)
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
