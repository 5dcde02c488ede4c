"""Pipeline faults: a bug in the engine for one run, a stream stopped and started again, a run
forgotten after its end that speaks again, events a killed process lost, and a backfill.

An engine bug cannot be provoked by input (every input that crashed it is fixed at its cause),
so it is injected: ``RunState.add_batch`` or ``RunState.snapshot`` raises for one message or
one run, in this process, where Beam's DirectRunner runs the DoFns.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import apache_beam as beam
import duckdb
import pytest
from apache_beam.testing.test_pipeline import TestPipeline as BeamTestPipeline

from goodput_schemas.wire import workload_run_id
from pipeline.beam.live import TrackRunsLive
from pipeline.beam.restore import RunHistory, UnreportedRuns
from pipeline.beam.transforms import DeadLetterRows, SnapshotRows, WriteToDuckDB
from pipeline.core import engine
from pipeline.core.events import Batch, parse_batch
from pipeline.emulators.bigquery import BigQueryEmulator
from pipeline.sinks.raw_events import BigQueryEvents, DuckDBEvents, EventsTables
from support.beam import SNAPSHOT_TABLES, keyed_stream, query, replay, run_batch, streaming_options, table
from support.clock import ManualClock
from support.runs import FIRST_UID, FLEET, batch_of, reused_name, workload_messages

WINDOWS = (300,)
POISONED = "run-b"


@pytest.fixture
def poisoned_message(monkeypatch: pytest.MonkeyPatch, clean_lines: list[bytes]) -> bytes:
    """The third message of run-b, on which the engine raises from now on."""
    chosen = [line for line in clean_lines if batch_of(line).run_id == POISONED][2]
    poison = batch_of(chosen)
    add_batch = engine.RunState.add_batch

    def failing(self: engine.RunState, batch: Batch, *rest: Any) -> int:
        if (batch.run_id, batch.attempt_id, tuple(batch.step_seqs)) == (
                poison.run_id, poison.attempt_id, tuple(poison.step_seqs)):
            add_batch(self, batch, *rest)  # half applied, then the bug
            raise ZeroDivisionError("injected")
        return add_batch(self, batch, *rest)

    monkeypatch.setattr(engine.RunState, "add_batch", failing)
    return chosen


def without(lines: list[bytes], line: bytes) -> list[bytes]:
    return [other for other in lines if other != line]


def engine_dead_letters(database: Path) -> list[tuple[Any, ...]]:
    return query(database, "SELECT source, run_id, reason, payload FROM dead_letter ORDER BY ALL")


def test_an_engine_failure_in_a_replay_dead_letters_the_message_and_nothing_else(
        poisoned_message, clean_lines, tmp_path):
    """The message the engine fails on is a dead letter with the error and the message; the
    run's numbers are those of its other messages, and every other run's are the clean ones."""
    database = replay(clean_lines, tmp_path / "poisoned")
    expected = replay(without(clean_lines, poisoned_message), tmp_path / "without")
    [(source, run_id, reason, payload)] = engine_dead_letters(database)
    assert (source, run_id) == ("engine", POISONED)
    assert reason == "the engine failed on this message: ZeroDivisionError: injected"
    assert parse_batch(payload) == parse_batch(poisoned_message)  # kept whole, to replay once fixed
    for name in SNAPSHOT_TABLES:
        assert table(database, name) == table(expected, name), name


def test_a_failing_snapshot_is_a_dead_letter_and_the_other_runs_are_written(
        monkeypatch, clean_lines, clean_replay, tmp_path):
    """A run whose snapshot raises has a dead letter instead of rows; the others are unchanged."""
    snapshot = engine.RunState.snapshot

    def failing(self: engine.RunState, *args: Any, **kwargs: Any) -> Any:
        if self.run_id == POISONED:
            raise RuntimeError("injected")
        return snapshot(self, *args, **kwargs)

    monkeypatch.setattr(engine.RunState, "snapshot", failing)
    database = replay(clean_lines, tmp_path)
    assert engine_dead_letters(database) == [
        ("engine", POISONED, "the engine failed on the run's snapshot: RuntimeError: injected", "")]
    for name in SNAPSHOT_TABLES:
        assert table(database, name) == table(clean_replay, name, f"run_id <> '{POISONED}'"), name


def stream(elements: list[tuple[str, Batch]], database: Path, restore_from: EventsTables | None = None,
           then: Callable[[Any], Any] = lambda s: s, clock_s: float = 0.0) -> None:
    """The live tracker on ``elements`` (all published at 0 and read at processing time 0, when
    the clock says ``clock_s``), then ``then``, then 31 s on (SNAPSHOT_TIMER fires at 30 s if the
    clock said 0), then the end of the input; its rows in ``database``."""
    test_stream = then(keyed_stream().add_elements(elements)).advance_processing_time(31)
    test_stream = test_stream.advance_watermark_to_infinity()
    with BeamTestPipeline(options=streaming_options()) as pipeline:
        events = pipeline | test_stream
        if restore_from is not None:
            events = (events, pipeline | UnreportedRuns(restore_from, clock=lambda: clock_s)) | beam.Flatten()
        tracked = events | TrackRunsLive(WINDOWS, 30.0, 10_000.0, 600.0, clock=lambda: clock_s,
                                         tables=restore_from)
        tracked.snapshots | "SnapshotRows" >> SnapshotRows() | "Snapshots" >> WriteToDuckDB(str(database))
        (tracked.dead_letter | DeadLetterRows()
         | "DeadLetters" >> WriteToDuckDB(str(database)))


def keyed(lines: list[bytes]) -> list[tuple[str, Batch]]:
    return [(batch.run_id, batch) for batch in map(batch_of, lines)]


def final_rows(database: Path) -> dict[str, tuple[Any, ...]]:
    """Each run's latest cumulative (snapshot time, goodput, total, disruptions, max step, ended)."""
    rows = query(database, "SELECT DISTINCT run_id, snapshot_time, goodput_pct, total_time_s, disruptions, "
                           "max_productive_step, ended FROM latest_goodput WHERE window_s = 0")
    assert len(rows) == len({row[0] for row in rows}), rows
    return {row[0]: row[1:] for row in rows}


def test_an_engine_failure_in_the_stream_dead_letters_the_message_and_the_run_goes_on(
        poisoned_message, clean_lines, tmp_path):
    """Live, the message the engine fails on is a dead letter; the run keeps the state it had
    before it, and every run's snapshot is that of the stream without the message."""
    stream(keyed(clean_lines), tmp_path / "poisoned.duckdb")
    stream(keyed(without(clean_lines, poisoned_message)), tmp_path / "without.duckdb")
    [(source, run_id, _, payload)] = engine_dead_letters(tmp_path / "poisoned.duckdb")
    assert (source, run_id, parse_batch(payload)) == ("engine", POISONED, parse_batch(poisoned_message))
    assert final_rows(tmp_path / "poisoned.duckdb") == final_rows(tmp_path / "without.duckdb")


def test_a_restarted_stream_restores_its_runs_from_the_raw_events_and_catches_up(clean_lines, tmp_path,
                                                                                 caplog):
    """A stream stopped after half the messages and started again on its file restores each run
    from the events table when the run speaks again: its numbers equal those of a stream that
    never stopped, a redelivered message of the first half included. Without the restore, the
    runs would start again from their second half. Each restore is logged (INFO) with the seqs
    it read."""
    half = len(clean_lines) // 2
    before = replay(clean_lines[:half], tmp_path / "before")  # the raw events of the first half
    redelivered = keyed(clean_lines[half - 1:])  # the last message read before the stop comes again
    with caplog.at_level(logging.INFO, logger="pipeline.beam.live"):
        stream(redelivered, tmp_path / "restarted.duckdb", restore_from=DuckDBEvents(str(before)))
    held = query(before, "SELECT run_id, attempt_id, min(seq), max(seq), count(*) FROM events GROUP BY ALL")
    logged = " ".join(record.getMessage() for record in caplog.records
                      if record.getMessage().startswith("restored run"))
    assert held and all(f"'{run_id}'" in logged and f"{attempt_id}: {low}-{high} ({count})" in logged
                        for run_id, attempt_id, low, high, count in held), logged
    stream(redelivered, tmp_path / "forgetful.duckdb")
    stream(keyed(clean_lines), tmp_path / "never-stopped.duckdb")
    never_stopped = final_rows(tmp_path / "never-stopped.duckdb")
    assert set(never_stopped) == set(FLEET)
    assert final_rows(tmp_path / "restarted.duckdb") == never_stopped
    forgetful = final_rows(tmp_path / "forgetful.duckdb")
    split = {batch_of(line).run_id for line in clean_lines[:half]} & {run for run, _ in redelivered}
    assert split and all(forgetful[run][2] < never_stopped[run][2] for run in split)  # time lost: wrong


def test_a_restarted_stream_restores_a_workloads_run_under_the_id_its_messages_derive(tmp_path):
    """The raw events of a run of a workload hold the id derived from its name and uid: a stream
    started again restores the run from them when the workload speaks again, and catches up."""
    events, _, _ = reused_name()
    lines = workload_messages(events, "llama", FIRST_UID, 50)
    half = len(lines) // 2
    before = replay(lines[:half], tmp_path / "before")
    stream(keyed(lines[half - 1:]), tmp_path / "restarted.duckdb", restore_from=DuckDBEvents(str(before)))
    stream(keyed(lines[half - 1:]), tmp_path / "forgetful.duckdb")
    stream(keyed(lines), tmp_path / "never-stopped.duckdb")
    never_stopped = final_rows(tmp_path / "never-stopped.duckdb")
    run_id = workload_run_id("llama", FIRST_UID)
    assert list(never_stopped) == [run_id]
    assert final_rows(tmp_path / "restarted.duckdb") == never_stopped
    assert final_rows(tmp_path / "forgetful.duckdb")[run_id][2] < never_stopped[run_id][2]


def test_a_stream_restores_at_its_start_the_runs_whose_latest_events_no_snapshot_counts(
        clean_lines, tmp_path):
    """A stream that stopped before it reported its last messages (a local stop that gave up, a
    cancelled job) left two runs' events ahead of their snapshots: one with no snapshot, one whose
    latest snapshot is older than its latest event. Started again on the file, a stream reports
    both at once, with no message from them, with the numbers of a stream that never stopped;
    the runs that were reported wait for their next message, as before."""
    before = replay(clean_lines, tmp_path / "before")
    unreported = sorted(FLEET)[:2]
    with duckdb.connect(str(before)) as connection:
        connection.execute("DELETE FROM goodput_snapshots WHERE run_id = ?", [unreported[0]])
        connection.execute("UPDATE goodput_snapshots SET snapshot_time = (SELECT min(event_time) FROM events "
                           "WHERE run_id = ?) WHERE run_id = ?", [unreported[1], unreported[1]])
        [(latest_us,)] = connection.execute("SELECT epoch_us(max(event_time)) FROM events").fetchall()
    tables = DuckDBEvents(str(before))
    assert tables.unreported_runs(0) == unreported
    assert tables.unreported_runs(latest_us + 1) == []  # none of its events that recent
    stream([], tmp_path / "restarted.duckdb", restore_from=tables)
    stream(keyed(clean_lines), tmp_path / "never-stopped.duckdb")
    never_stopped = final_rows(tmp_path / "never-stopped.duckdb")
    assert final_rows(tmp_path / "restarted.duckdb") == {run: never_stopped[run] for run in unreported}


class RunsTables(DuckDBEvents):
    """The tables' runs, as a set the test fills, and how many times they were read."""

    def __init__(self) -> None:
        super().__init__("unused.duckdb")
        self.runs: set[str] = set()
        self.reads = 0

    def run_ids(self) -> frozenset[str]:
        self.reads += 1
        return frozenset(self.runs)


def test_a_message_that_follows_earlier_ones_looks_for_its_run_in_the_tables_again():
    """The runs the tables hold are read at most every ``refresh_after_s``: a run whose first
    messages were written since is not among them. A message that follows earlier ones of its
    attempt has the tables asked again, rather than beginning the run anew without its history
    (the soak: a run forgotten behind a late backlog, within that time of its first message)."""
    tables, clock = RunsTables(), ManualClock(0.0)
    history = RunHistory(tables, refresh_after_s=10.0, clock=clock)
    assert not history.holds("run") and tables.reads == 1  # its first message: a new run
    tables.runs.add("run")  # which the tables then hold
    clock.now = 5.0
    assert not history.holds("run") and tables.reads == 1  # a run's first message again: trusted
    assert history.holds("run", ask_again=True) and tables.reads == 2
    assert history.holds("run", ask_again=True) and tables.reads == 2  # held: not asked again


def test_a_run_whose_history_cannot_be_read_goes_on_from_its_message(clean_lines, tmp_path, caplog):
    """The warehouse refuses the restore's queries (a BigQuery dataset without the tables): each
    run is logged and goes on from its message, as with no restore, and the stream goes on."""
    with BigQueryEmulator() as bigquery:
        refused = BigQueryEvents("goodput-local", "missing", bigquery.endpoint, timeout_s=5.0)
        stream(keyed(clean_lines), tmp_path / "refused.duckdb", restore_from=refused)
    stream(keyed(clean_lines), tmp_path / "plain.duckdb")
    assert final_rows(tmp_path / "refused.duckdb") == final_rows(tmp_path / "plain.duckdb")
    failed = {record.args[0] for record in caplog.records if record.msg.startswith("could not restore run")}
    assert failed == set(FLEET)


def test_a_run_forgotten_after_its_end_is_restored_when_it_speaks_again(clean_lines, tmp_path):
    """A run silent for 600 s of publish time after its last message (gc_after_s, the clock past
    it) is forgotten, ended or not. Its end, arriving later, is added to its whole history from
    the events table the stream writes, not to an empty state: the run's numbers are those of a
    stream that had the end in time, reported after its silent snapshots. Without the restore,
    the run would be the end's message alone."""
    run = [line for line in clean_lines if batch_of(line).run_id == "run-a"]  # shape 1 ends
    [late] = [line for line in run if any(e.kind == "job_end" for e in batch_of(line).others)]
    run.remove(late)
    live = replay(run, tmp_path / "live")  # the table as the stream wrote it before it forgot the run
    for database, tables in ((live, DuckDBEvents(str(live))), (tmp_path / "forgetful.duckdb", None)):
        stream(keyed(run), database, restore_from=tables, clock_s=1_000.0,
               then=lambda s: s.advance_watermark_to(700).add_elements(keyed([late])))
    stream(keyed([*run, late]), tmp_path / "whole.duckdb")
    restored, forgetful, whole = (final_rows(database)["run-a"] for database in (
        live, tmp_path / "forgetful.duckdb", tmp_path / "whole.duckdb"))
    assert restored[1:] == whole[1:] and restored[-1]
    assert forgetful[1:] != whole[1:]
    cumulative = "SELECT count(*) FROM goodput_snapshots WHERE run_id = 'run-a' AND window_s = 0 AND "
    [(earlier,)] = query(live, cumulative + f"snapshot_time >= '{restored[0]}'")
    assert earlier == 1  # the restored run's snapshot is its latest
    [(silent,)] = query(live, cumulative + "NOT ended")
    assert silent > 10  # from its hang threshold on, every 30 s, up to 600 s


def test_an_end_that_arrives_after_a_later_snapshot_is_the_runs_latest(clean_lines, tmp_path):
    """The job end comes after an interval snapshot that ran the unended run on past it (its
    message was held up): the end is reported as of the later time, never before a snapshot
    already written, so the run's latest snapshot shows it ended, with the whole run's figures."""
    lines = [line for line in clean_lines if batch_of(line).run_id == "run-a"]
    [end] = [line for line in lines if any(e.kind == "job_end" for e in batch_of(line).others)]
    stream(keyed(without(lines, end)), tmp_path / "held-up.duckdb",
           then=lambda s: s.advance_processing_time(31).add_elements(keyed([end])))
    stream(keyed(lines), tmp_path / "on-time.duckdb")
    held_up, on_time = (final_rows(tmp_path / name)["run-a"] for name in ("held-up.duckdb", "on-time.duckdb"))
    assert held_up[-1] and held_up[1:] == on_time[1:]
    history = query(tmp_path / "held-up.duckdb", "SELECT snapshot_time, ended FROM goodput_snapshots "
                                                 "WHERE window_s = 0 ORDER BY snapshot_time")
    assert [ended for _, ended in history] == [False, True] and history[-1][0] == held_up[0]


def test_events_a_killed_process_lost_are_counted_in_every_snapshot(clean_lines, tmp_path):
    """Ten events missing inside an attempt (a killed process's memory) show as missing_events
    in each of the run's goodput rows; once they arrive the count is 0."""
    line = next(line for line in clean_lines if batch_of(line).run_id == "run-c" and len(batch_of(line)) > 20)
    document = json.loads(line)
    lost, kept = document["events"][5:15], document["events"][:5] + document["events"][15:]
    gapped = [other if other != line else json.dumps({**document, "events": kept}).encode()
              for other in clean_lines]
    database = replay(gapped, tmp_path / "gapped")
    counts = dict(query(database, "SELECT run_id, max(missing_events) FROM goodput_snapshots "
                                  "GROUP BY run_id"))
    assert counts == {"run-a": 0, "run-b": 0, "run-c": 10}
    assert query(database, "SELECT count(DISTINCT missing_events) FROM goodput_snapshots "
                           "WHERE run_id = 'run-c'") == [(1,)]
    late = json.dumps({**document, "events": lost}).encode()
    whole = replay([*gapped, late], tmp_path / "whole")
    assert query(whole, "SELECT max(missing_events) FROM goodput_snapshots") == [(0,)]


def test_a_backfill_reproduces_every_table(clean_lines, clean_replay, tmp_path):
    """goodput replay --from_duckdb rebuilds every snapshot table, the raw events and the run
    metadata of the file it reads, row for row."""
    backfill = tmp_path / "backfill.duckdb"
    run_batch(f"--from_duckdb={clean_replay}", f"--duckdb={backfill}")
    for name in (*SNAPSHOT_TABLES, "events", "run_metadata"):
        assert table(backfill, name) == table(clean_replay, name), name
    assert query(backfill, "SELECT count(*) FROM dead_letter") == [(0,)]


def test_a_backfill_refuses_to_write_into_the_file_it_reads(clean_replay, capsys):
    """--from_duckdb and --duckdb naming one file is refused with a clear error, exit code 2."""
    from pipeline.beam.launcher import run

    assert run([f"--from_duckdb={clean_replay}", f"--duckdb={clean_replay}"]) == 2
    assert "write the backfill to another --duckdb file" in capsys.readouterr().err
