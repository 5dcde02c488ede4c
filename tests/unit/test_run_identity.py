"""Who a run is: a run id reused by a new workload (a new JobSet) is a new run; a restart in the
same workload is the same run, with a disruption; the reference-compatible readers find a job
name's latest run."""

from __future__ import annotations

import dataclasses
import datetime
from pathlib import Path

import duckdb
import pytest

from ml_goodput_measurement import goodput
from pipeline.core import engine
from pipeline.core.events import Event
from pipeline.core.snapshot import Snapshot
from pipeline.sinks.duckdb import DuckDBSink
from support.runs import (
    FIRST_UID,
    SECOND_UID,
    as_run,
    batch_of,
    messages,
    recorded,
    reused_name,
    workload_messages,
)


def runs_of(data: list[bytes], as_of_us: int) -> dict[str, Snapshot]:
    """Each run's snapshot, its messages routed by the run they belong to, as the pipeline keys them."""
    states: dict[str, engine.RunState] = {}
    for message in data:
        batch = batch_of(message)
        states.setdefault(batch.run_id, engine.RunState(batch.run_id)).add_batch(batch)
    snapshots = {run_id: state.snapshot(as_of_us) for run_id, state in states.items()}
    assert None not in snapshots.values()
    return snapshots  # type: ignore[return-value]


def alone(events: list[Event], run_id: str, as_of_us: int) -> Snapshot:
    state = engine.RunState(run_id)
    state.add_all(dataclasses.replace(e, run_id=run_id) for e in events)
    snapshot = state.snapshot(as_of_us)
    assert snapshot is not None
    return snapshot


def test_a_name_reused_by_a_new_workload_is_a_new_run():
    """Two workloads that give their runs one name are two runs, each with the figures it has alone;
    told apart by name only (as the reference does), they would be one run with a disruption more."""
    first, second, as_of = reused_name()
    runs = runs_of(workload_messages(first, "llama", FIRST_UID, 500)
                   + workload_messages(second, "llama", SECOND_UID, 500), as_of)
    assert sorted(runs) == ["llama~3f2a9c1e", "llama~8d04b7aa"]
    assert runs["llama~3f2a9c1e"] == alone(first, "llama~3f2a9c1e", as_of)
    assert runs["llama~8d04b7aa"] == alone(second, "llama~8d04b7aa", as_of)
    assert [len(runs[run].disruptions) for run in sorted(runs)] == [1, 0]
    merged = runs_of(messages(as_run([*first, *second], "llama"), 500), as_of)
    assert list(merged) == ["llama"] and len(merged["llama"].disruptions) == 2


def test_a_restart_in_the_same_workload_is_the_same_run():
    """Both attempts of a workload, a crash between them, are one run with one disruption, as the
    run without a workload is."""
    events, as_of = recorded("restarted")
    assert len({e.attempt_id for e in events}) == 2
    runs = runs_of(workload_messages(events, "llama", FIRST_UID, 300), as_of)
    assert list(runs) == ["llama~3f2a9c1e"]
    assert len(runs["llama~3f2a9c1e"].disruptions) == 1
    assert dataclasses.replace(runs["llama~3f2a9c1e"], run_id="run") == alone(events, "run", as_of)


# -- the reference-compatible readers -----------------------------------------------------------------

T = datetime.datetime(2026, 11, 1, 8, tzinfo=datetime.timezone.utc)


def write_run(sink: DuckDBSink, run_id: str, started_s: float, productive_s: float,
              run_name: str | None = None) -> None:
    """A run that started ``started_s`` after T, with one cumulative snapshot 100 s later."""
    start, at = T + datetime.timedelta(seconds=started_s), T + datetime.timedelta(seconds=started_s + 100)
    if run_name is not None:
        sink.write("run_metadata", [{"run_id": run_id, "attempt_id": f"{run_id}-a", "start_time": start,
                                     "run_name": run_name, "workload_uid": run_id[-8:]}])
    sink.write("goodput_snapshots", [{
        "run_id": run_id, "snapshot_time": at, "window_s": 0, "window_start": start, "window_end": at,
        "goodput_pct": productive_s, "productive_time_s": productive_s, "total_time_s": 100.0,
        "disruptions": 0, "max_productive_step": 10, "last_step": 10, "chip_count": 8,
        "productive_chip_s": 0.0, "total_chip_s": 0.0, "ended": False}])


@pytest.fixture
def reused(tmp_path: Path) -> Path:
    """The name "llama" given to three runs of three workloads (the latest started at T+2 h), and
    "solo", a run recorded without a workload."""
    path = tmp_path / "reused.duckdb"
    sink = DuckDBSink(path)
    write_run(sink, "llama~aaaaaaaa", 0, 50.0, "llama")
    write_run(sink, "llama~cccccccc", 7200, 90.0, "llama")
    write_run(sink, "llama~bbbbbbbb", 3600, 70.0, "llama")
    write_run(sink, "solo", 0, 60.0)
    sink.close()
    return path


def test_a_job_name_reads_its_latest_run(reused: Path):
    """The calculator of a name that several workloads reused reads the run that started last; a run
    without a workload is read by its id."""
    goodput_pct, _, _ = goodput.GoodputCalculator("llama", duckdb_path=reused).get_job_goodput()
    assert goodput_pct == pytest.approx(90.0)
    assert goodput.GoodputCalculator("solo", duckdb_path=reused).get_job_goodput()[0] == pytest.approx(60.0)
    older = goodput.GoodputCalculator("llama~bbbbbbbb", duckdb_path=reused).get_job_goodput()[0]
    assert older == pytest.approx(70.0)  # a derived id still names its own run


def test_a_file_written_before_runs_had_names_is_read_by_id(reused: Path):
    """A file an older pipeline wrote (run_metadata without run_name) is read as before: by run id."""
    with duckdb.connect(str(reused)) as connection:
        connection.execute("ALTER TABLE run_metadata DROP COLUMN run_name")
    assert goodput.GoodputCalculator("solo", duckdb_path=reused).get_job_goodput()[0] == pytest.approx(60.0)
    with pytest.raises(ValueError, match="no goodput snapshot"):
        goodput.GoodputCalculator("llama", duckdb_path=reused).get_job_goodput()
