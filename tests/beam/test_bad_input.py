"""Bad input through the batch replay: each bad line lands in the ``dead_letter`` table with its
reason, its valid events are kept, and the good runs' tables are the clean ones."""

from __future__ import annotations

from pathlib import Path

import pytest

from support.bad_input import CASES, T, message
from support.beam import SNAPSHOT_TABLES, query, replay, table
from support.runs import (
    FLEET,
    S,
    fleet_events,
)

_EXTRA = {  # valid lines of other runs with something odd about them (see the tests above)
    "rollback": message(*[{"seq": i, "time_us": T + i * S, "step_start": {"step": step}}
                          for i, step in enumerate([0, 1, 2, 3, 4, 2, 3])], run_id="run-rollback"),
    "unstarted": message(*[{"seq": i, "time_us": T + i * S, "step_start": {"step": i}} for i in range(5)],
                         run_id="run-unstarted"),
    "heartbeats only": message({"seq": 0, "time_us": T, "heartbeat": {}}, run_id="run-heartbeats"),
    # A run starting at the replay's snapshot time, which is the fleet's latest event's.
    "starting": message({"seq": 0, "time_us": max(e.time_us for e in fleet_events()), "job_start": {}},
                        run_id="run-starting"),
}


@pytest.fixture(scope="module")
def mixed_replay(clean_lines: list[bytes], tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The batch replay of the clean file with every bad line and the odd runs' lines among its lines."""
    bad = [line for _, line, _, _ in CASES] + list(_EXTRA.values())
    lines = list(clean_lines)
    for index, line in enumerate(bad):
        lines.insert(index * len(lines) // len(bad), line)
    directory = tmp_path_factory.mktemp("mixed")
    return replay(lines, directory), directory / "events.jsonl"


def _line_numbers(events_file: Path) -> dict[bytes, int]:
    return {line: number for number, line in enumerate(events_file.read_bytes().split(b"\n"), start=1)}


def test_each_bad_line_of_a_replay_is_in_the_dead_letter_table_with_its_reason(mixed_replay):
    """Every bad line's dead letter is in the table, from its line, with its reason."""
    database, events_file = mixed_replay
    numbers = _line_numbers(events_file)
    rows = query(database, "SELECT source, reason, payload, run_id FROM dead_letter")
    for case, line, reason, _ in CASES:
        source = f"{events_file}:{numbers[line]}"
        found = [r for r in rows if r[0] == source or r[0].startswith(source + "#")]
        if reason is None:
            assert found == [], case
        else:
            assert [r[1] for r in found if reason in r[1]], (case, found)
    assert len(rows) == sum(1 for case in CASES if case[2] is not None)


def test_the_good_runs_of_a_replay_with_bad_lines_are_the_clean_ones(mixed_replay, clean_replay):
    """Bad lines among the good runs' lines change no row of the good runs."""
    database, _ = mixed_replay
    where = "run_id IN (" + ", ".join(f"'{run_id}'" for run_id in FLEET) + ")"
    for name in (*SNAPSHOT_TABLES, "events", "run_metadata"):
        assert table(database, name, where) == table(clean_replay, name), name


def test_the_valid_events_of_bad_lines_are_kept(mixed_replay):
    """The valid neighbours of bad events are in the raw events table, and the odd runs have their
    figures: a rollback is a disruption; a run without a start starts at its first step; a run of
    heartbeats alone has none; a run that starts at the snapshot time has no elapsed time yet."""
    database, _ = mixed_replay
    kept = sum(case[3] for case in CASES if case[0] != "a run id in other scripts (kept)")
    (rows,) = query(database, "SELECT count(*) FROM events WHERE run_id = 'run-bad'")[0]
    assert rows == kept
    assert query(database, "SELECT in_process, last_step_before, resume_step FROM disruptions "
                           "WHERE run_id = 'run-rollback'") == [(True, 4, 2)]
    (started,) = query(database, "SELECT epoch_us(window_start) FROM goodput_snapshots "
                                 "WHERE run_id = 'run-unstarted' AND window_s = 0")[0]
    assert started == T
    assert query(database, "SELECT count(*) FROM goodput_snapshots WHERE run_id = 'run-heartbeats'") == [(0,)]
    assert query(database, "SELECT total_time_s, goodput_pct FROM goodput_snapshots "
                           "WHERE run_id = 'run-starting' AND window_s = 0") == [(0.0, None)]
    assert query(database, "SELECT count(*) FROM events WHERE run_id = 'run-heartbeats'") == [(1,)]
