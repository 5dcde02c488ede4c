"""One hostile message of each kind that once reached past its own run, mixed into a clean fleet:
in the batch replay and in the stream, every clean run's rows are those without them, each hostile
value is a dead letter with its reason, and no write fails."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import apache_beam as beam
import pytest
from apache_beam.testing.test_pipeline import TestPipeline as BeamTestPipeline

from goodput_schemas.limits import MAX_CHIP_COUNT, MAX_COUNT
from pipeline.beam.live import TrackRunsLive
from pipeline.beam.transforms import DeadLetterRows, ParseEvents, SnapshotRows, WriteToDuckDB
from support.bad_input import T, message
from support.beam import SNAPSHOT_TABLES, keyed_stream, query, replay, streaming_options, table
from support.runs import FLEET, S

WINDOWS = (300,)
CLEAN = "run_id IN (" + ", ".join(f"'{run_id}'" for run_id in FLEET) + ")"
YEAR_2199 = 7_226_582_400 * S


def start(seq: int = 0, **body: Any) -> dict[str, Any]:
    return {"seq": seq, "time_us": T, "job_start": body}


#: (what, message, the reason of its dead letter or None): each once broke another run's numbers
#: or every run's write.
HOSTILE: list[tuple[str, bytes, str | None]] = [
    *((f"seq 2**63-1 in attempt {a}",
       message(start(), {"seq": 2**63 - 1, "time_us": T + S, "heartbeat": {}}, run_id="run-seq",
               attempt_id=a),
       "seq must be at most MAX_COUNT") for a in ("a1", "a2")),
    *((f"seq MAX_COUNT in attempt {a}",  # kept: the events missing below it are counted, capped
       message(start(), {"seq": MAX_COUNT, "time_us": T + S, "heartbeat": {}}, run_id="run-seq",
               attempt_id=a),
       None) for a in ("b1", "b2")),
    ("a run's first copy",
     message(start(), *({"seq": i, "time_us": T + i * S, "step_start": {"step": i}} for i in range(1, 4)),
             run_id="run-conflict", attempt_id="c"), None),
    ("a conflicting copy of (c, 2)",
     message({"seq": 2, "time_us": T + 2 * S + 1, "step_start": {"step": 40}}, run_id="run-conflict",
             attempt_id="c"),  # a microsecond later than the first copy: that one is kept
     "conflicting duplicate of (attempt 'c', seq 2)"),
    ("an event dated 2199",
     message(start(), {"seq": 1, "time_us": YEAR_2199, "heartbeat": {}}, run_id="run-future", attempt_id="f"),
     "ahead of the pipeline's clock"),
    ("more active slices than slices",
     message(start(), {"seq": 1, "time_us": T + S, "elastic_slice_counts": {
         "active_slices": 9, "total_slices": 2, "available_slices": 2}}, run_id="run-slices", attempt_id="s"),
     "active_slices (9) must be at most total_slices (2)"),
    ("a chip count past MAX_CHIP_COUNT",
     message(start(chip_count=MAX_CHIP_COUNT + 1), run_id="run-chips", attempt_id="h"), "MAX_CHIP_COUNT"),
    ("a run id of 512 characters but over 1,024 bytes (a Pub/Sub attribute's limit)",
     message(start(), run_id="é" * 257 + "€" * 171, attempt_id="i"), "MAX_ID_BYTES"),
    ("a step of 2**63-1",
     message(start(), {"seq": 1, "time_us": T + S, "step_start": {"step": 2**63 - 1}}, run_id="run-steps",
             attempt_id="t"), "step_start.step must be at most MAX_COUNT"),
]


def mixed(clean_lines: list[bytes], hostile: list[bytes]) -> list[bytes]:
    """The hostile lines spread among the clean ones, in the order given."""
    lines = list(clean_lines)
    for index, line in enumerate(hostile):
        lines.insert(index * len(lines) // len(hostile) + index, line)
    return lines


def reasons(database: Path) -> list[str]:
    return [row[0] for row in query(database, "SELECT reason FROM dead_letter")]  # type: ignore[misc]


def assert_dead_letters(database: Path) -> None:
    found = reasons(database)
    for what, _, reason in HOSTILE:
        if reason is not None:
            assert [r for r in found if reason in r], (what, found)
    assert len(found) == sum(1 for case in HOSTILE if case[2] is not None), found


def test_hostile_messages_change_no_clean_row_of_a_replay(clean_lines, clean_replay, tmp_path):
    """The batch replay with one hostile message of each kind among the fleet's lines writes every
    table (no INT64 overflow), dead-letters each hostile value, and the clean runs' rows (and the
    snapshot time) are those of the clean replay."""
    database = replay(mixed(clean_lines, [line for _, line, _ in HOSTILE]), tmp_path)
    for name in (*SNAPSHOT_TABLES, "events", "run_metadata"):
        assert table(database, name, CLEAN) == table(clean_replay, name), name
    assert_dead_letters(database)
    assert query(database, "SELECT DISTINCT missing_events FROM goodput_snapshots "
                           "WHERE run_id = 'run-seq'") == [(MAX_COUNT,)]
    assert query(database, "SELECT DISTINCT max_productive_step, last_step FROM goodput_snapshots "
                           "WHERE run_id = 'run-conflict'") == [(2, 3)]


def stream(lines: list[bytes], database: Path) -> None:
    """The stream's parse and live tracker on ``lines`` (all at processing time 0), then 31 s on
    (SNAPSHOT_TIMER fires at 30 s); its snapshots and dead letters in ``database``."""
    elements = [(f"message-{index}", line) for index, line in enumerate(lines)]
    test_stream = keyed_stream().add_elements(elements).advance_processing_time(31)
    with BeamTestPipeline(options=streaming_options()) as pipeline:
        parsed = pipeline | test_stream.advance_watermark_to_infinity() | ParseEvents()
        tracked = parsed.events | TrackRunsLive(WINDOWS, 30.0, 10_000.0, 600.0, clock=lambda: 0.0)
        tracked.snapshots | "SnapshotRows" >> SnapshotRows() | "Snapshots" >> WriteToDuckDB(str(database))
        ((parsed.dead_letter, tracked.dead_letter) | beam.Flatten() | DeadLetterRows()
         | "DeadLetters" >> WriteToDuckDB(str(database)))


@pytest.mark.parametrize("conflict_first", [False, True], ids=["copy-last", "copy-first"])
def test_hostile_messages_change_no_clean_row_of_the_stream(clean_lines, tmp_path, conflict_first):
    """Live, with one hostile message of each kind among the fleet's messages (the conflicting
    copy before or after the first one), every clean run's snapshots are those of the stream
    without them, each hostile value is a dead letter, and the conflicting run's numbers do not
    depend on which copy came first."""
    hostile = [line for _, line, _ in HOSTILE]
    if conflict_first:
        at = next(i for i, case in enumerate(HOSTILE) if case[0] == "a run's first copy")
        hostile[at], hostile[at + 1] = hostile[at + 1], hostile[at]
    stream(mixed(clean_lines, hostile), tmp_path / "mixed.duckdb")
    stream(clean_lines, tmp_path / "clean.duckdb")
    for name in SNAPSHOT_TABLES:
        assert table(tmp_path / "mixed.duckdb", name, CLEAN) == table(tmp_path / "clean.duckdb", name), name
    assert_dead_letters(tmp_path / "mixed.duckdb")
    assert query(tmp_path / "mixed.duckdb", "SELECT missing_events FROM goodput_snapshots "
                                            "WHERE run_id = 'run-seq' AND window_s = 0 "
                                            "ORDER BY snapshot_time DESC LIMIT 1") == [(MAX_COUNT,)]
    assert query(tmp_path / "mixed.duckdb", "SELECT max(max_productive_step), max(last_step) FROM "
                                            "goodput_snapshots WHERE run_id = 'run-conflict'") == [(2, 3)]
