"""The batch replay: emitter files through Beam's DirectRunner into DuckDB tables."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from pipeline.beam.options import parse_as_of
from pipeline.core import engine
from pipeline.core.events import parse_message, read_lines
from support import REPO


def run(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=300,
                          env=env, cwd=REPO, check=False)


@pytest.fixture(scope="module")
def replayed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, subprocess.CompletedProcess[str]]:
    """Two simulated runs and a malformed line, replayed once into DuckDB."""
    directory = tmp_path_factory.mktemp("replay")
    events = directory / "events.jsonl"
    for run_id, seed in (("run-a", 1), ("run-b", 2)):
        job = run("-m", "pipeline.demo.simulated_job", "--output", str(directory / f"{run_id}.jsonl"),
                  "--steps", "400", "--run-id", run_id, "--seed", str(seed))
        assert job.returncode == 0, job.stderr
    with events.open("w") as out:
        for run_id in ("run-a", "run-b"):
            out.write((directory / f"{run_id}.jsonl").read_text())
        out.write('{"schema_version": 1, "run_id": "run-a", "attempt_id": \n')  # truncated
    database = directory / "goodput.duckdb"
    result = run("-m", "pipeline", f"--events={events}", f"--duckdb={database}")
    return events, database, result


def query(database: Path, sql: str) -> list[tuple]:
    with duckdb.connect(str(database), read_only=True) as connection:
        return connection.execute(sql).fetchall()


def test_replay_exits_zero_and_prints_each_run(replayed):
    """A malformed line does not stop the replay; the summary names every run."""
    _, _, result = replayed
    assert result.returncode == 0, result.stderr
    assert "run-a" in result.stdout and "run-b" in result.stdout
    assert "1 rejected inputs" in result.stdout


def test_malformed_line_lands_in_dead_letter(replayed):
    """The truncated line is in dead_letter with its source line, payload and reason."""
    events, database, _ = replayed
    rows = query(database, "SELECT source, reason, payload FROM dead_letter")
    assert len(rows) == 1
    source, reason, payload = rows[0]
    line_count = len(events.read_text().splitlines())
    assert source == f"{events}:{line_count}"
    assert "not valid JSON" in reason and payload.startswith('{"schema_version"')


def test_tables_hold_the_engines_numbers(replayed):
    """Every cumulative and rolling row equals the engine's snapshot of the same events."""
    events_file, database, _ = replayed
    states: dict[str, engine.RunState] = {}
    latest = 0
    for source, line in read_lines(str(events_file)):
        events, _ = parse_message(line, source)
        for event in events:
            states.setdefault(event.run_id, engine.RunState(event.run_id)).add(event)
            latest = max(latest, event.time_us)
    for run_id, state in states.items():
        snapshot = state.snapshot(latest)
        assert snapshot is not None
        rows = query(database, f"SELECT window_s, goodput_pct, total_time_s, disruptions, "
                               f"max_productive_step FROM goodput_snapshots WHERE run_id = '{run_id}' "
                               f"ORDER BY window_s")
        windows = sorted(zip(snapshot.window_sizes_s, snapshot.windows, strict=True), key=lambda w: w[0])
        expected = [(0, snapshot.cumulative), *windows]
        assert [row[0] for row in rows] == [w for w, _ in expected]
        for (_, goodput, total, disruptions, max_step), (_, figures) in zip(rows, expected, strict=True):
            if figures is None:
                assert goodput is None and total == 0
                continue
            assert goodput == pytest.approx(figures.goodput_pct, abs=1e-9)
            assert total == pytest.approx(figures.total_s, abs=1e-6)
            assert disruptions == figures.disruptions
            assert max_step == snapshot.max_productive_step
        (count,) = query(database, f"SELECT count(*) FROM disruptions WHERE run_id = '{run_id}'")[0]
        assert count == len(snapshot.disruptions) == 1


def test_raw_events_run_metadata_and_step_statistics(replayed):
    """Every valid event is a row of ``events``; every job_start a row of ``run_metadata``; the
    step statistics are those of the run's step durations."""
    events_file, database, _ = replayed
    parsed = [e for source, line in read_lines(str(events_file)) for e in parse_message(line, source)[0]]
    rows = query(database, "SELECT run_id, attempt_id, seq, kind, step FROM events")
    assert sorted(rows) == sorted((e.run_id, e.attempt_id, e.seq, e.kind, e.body.get("step")
                                   if e.kind == "step_start" else None) for e in parsed)
    starts = sorted((e.run_id, e.attempt_id, e.body.get("chip_count")) for e in parsed
                    if e.kind == "job_start")
    assert sorted(query(database, "SELECT run_id, attempt_id, chip_count FROM run_metadata")) == starts
    for run_id in ("run-a", "run-b"):
        state = engine.RunState(run_id)
        for event in parsed:
            if event.run_id == run_id:
                state.add(event)
        summary = state.snapshot(max(e.time_us for e in parsed)).step_summary
        assert summary is not None and summary.steps > 300
        (row,) = query(database, "SELECT steps_measured, step_time_p50_s, step_time_max_s, "
                                 f"recent_step_time_p50_s FROM step_stats WHERE run_id = '{run_id}'")
        assert row == (summary.steps, summary.p50_s, summary.max_s, summary.recent_p50_s)
        assert summary.p50_s <= summary.p90_s <= summary.p99_s <= summary.max_s


def test_every_row_of_a_snapshot_shares_its_time(replayed):
    """Goodput, badput and disruption rows of one replay carry one snapshot_time: the latest event."""
    events_file, database, _ = replayed
    times = set()
    for table in ("goodput_snapshots", "badput_snapshots", "disruptions"):
        times |= {row[0] for row in query(database, f"SELECT DISTINCT snapshot_time FROM {table}")}
    latest = max(json.loads(line)["events"][-1]["time_us"]
                 for line in events_file.read_text().splitlines()[:-1])
    assert len(times) == 1
    (only,) = times
    assert parse_as_of(only.isoformat()) == latest


def test_badput_rows_add_up_to_elapsed_time(replayed):
    """Per run and window, productive plus badput (except async loading) is the elapsed time."""
    _, database, _ = replayed
    rows = query(database, """
        SELECT g.run_id, g.window_s, any_value(g.total_time_s),
               any_value(g.productive_time_s) + sum(b.seconds)
        FROM goodput_snapshots g JOIN badput_snapshots b USING (run_id, snapshot_time, window_s)
        WHERE b.badput_source <> 'DATA_LOADING_ASYNC'
        GROUP BY g.run_id, g.window_s""")
    assert len(rows) >= 2
    for run_id, window_s, total, accounted in rows:
        assert accounted == pytest.approx(total, abs=1e-6), (run_id, window_s)


def test_as_of_and_windows_options(tmp_path: Path, replayed):
    """--as_of sets the snapshot time and --windows the rolling windows."""
    events_file, _, _ = replayed
    database = tmp_path / "early.duckdb"
    result = run("-m", "pipeline", f"--events={events_file}", f"--duckdb={database}",
                 "--as_of=2026-11-01T08:10:00Z", "--windows=120")
    assert result.returncode == 0, result.stderr
    rows = query(database, "SELECT DISTINCT snapshot_time, window_s FROM goodput_snapshots ORDER BY 2")
    assert [(t.isoformat(), w) for t, w in rows] == [("2026-11-01T08:10:00", 0),
                                                     ("2026-11-01T08:10:00", 120)]


def test_missing_input_is_a_clear_error(tmp_path: Path):
    """A missing file is named, with a non-zero exit, before Beam starts."""
    missing, output = tmp_path / "nope.jsonl", tmp_path / "out.duckdb"
    result = run("-m", "pipeline", f"--events={missing}", f"--duckdb={output}")
    assert result.returncode == 2
    assert result.stderr == f"python -m pipeline: no such file: --events={missing}\n"
    assert not output.exists()


def test_a_mistake_is_one_line_on_stderr_from_either_command(tmp_path: Path):
    """python -m pipeline and goodput replay answer a mistake with one line and exit code 2, with
    no usage, warning or traceback around it."""
    events = tmp_path / "events.jsonl"
    events.write_text("{}\n")
    for command in (("-m", "pipeline"), ("-m", "pipeline.app.cli", "replay")):
        for mistake in ("--windows=1e20", "--snapshot_interval_s=nan", "--duckbd=x.duckdb"):
            result = run(*command, f"--events={events}", f"--duckdb={tmp_path / 'out.duckdb'}", mistake)
            assert result.returncode == 2 and len(result.stderr.splitlines()) == 1, result.stderr
            name = "python -m pipeline" if command[-1] == "pipeline" else "goodput replay"
            assert result.stderr.startswith(f"{name}: ") and mistake.split("=")[0] in result.stderr
        result = run(*command, f"--events={events}")
        assert result.returncode == 2 and "no output" in result.stderr
    assert sorted(path.name for path in tmp_path.iterdir()) == ["events.jsonl"]


def test_exclude_option_removes_time(tmp_path: Path, replayed):
    """--exclude leaves the interval out of every run's elapsed time."""
    events_file, database, _ = replayed
    excluded = tmp_path / "excluded.duckdb"
    result = run("-m", "pipeline", f"--events={events_file}", f"--duckdb={excluded}",
                 "--exclude=2026-11-01T08:00:10Z/2026-11-01T08:00:30Z")
    assert result.returncode == 0, result.stderr
    sql = "SELECT run_id, total_time_s FROM goodput_snapshots WHERE window_s = 0 ORDER BY run_id"
    before, after = query(database, sql), query(excluded, sql)
    assert [r for r, _ in before] == [r for r, _ in after]
    for (_, total), (_, less) in zip(before, after, strict=True):
        assert less == pytest.approx(total - 20)


def test_the_summary_of_a_large_fleet_lists_its_lowest_goodput_runs(replayed):
    """Past max_runs, the summary lists the runs with the lowest goodput and counts them all."""
    from io import StringIO

    from pipeline.app.summary import print_summary

    _, database, _ = replayed
    (lowest,), = query(database, "SELECT run_id FROM latest_goodput WHERE window_s = 0 "
                                 "ORDER BY goodput_pct LIMIT 1")
    out = StringIO()
    print_summary(str(database), out, max_runs=1)
    text = out.getvalue()
    assert "the 1 of 2 runs with the lowest goodput" in text and "2 runs;" in text
    assert lowest in text and ({"run-a", "run-b"} - {lowest}).pop() not in text


def test_a_duckdb_file_replaced_under_the_same_name_gets_its_tables_again(tmp_path: Path):
    """The tables are made once per file, and again for a new file at the same path."""
    from pipeline.sinks.duckdb import DuckDBSink

    path = tmp_path / "out.duckdb"
    for _ in range(2):
        DuckDBSink(path).close()  # the second open skips making what is there
        path.unlink()
        sink = DuckDBSink(path)
        assert sink.query("SELECT count(*) FROM accelerator_prices")[0][0] > 0
        assert sink.query("SELECT count(*) FROM accelerator_peaks")[0][0] > 0
        assert sink.query("SELECT count(*) FROM goodput_snapshots") == [(0,)]
        sink.close()
        path.unlink()
