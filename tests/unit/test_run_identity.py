"""Who a run is: a run id reused by a new workload (a new JobSet) is a new run; a restart in the
same workload is the same run, with a disruption; the reference-compatible readers find a job
name's latest run."""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
from pathlib import Path

import duckdb
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from goodput_schemas.limits import MAX_ID_BYTES, MAX_ID_LENGTH, MAX_UID_LENGTH, id_problem
from goodput_schemas.wire import workload_run_id
from ml_goodput_measurement import goodput
from pipeline.core import engine
from pipeline.core.events import Event
from pipeline.core.sanitize import identifier, label_value
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

FIRST, SECOND = workload_run_id("llama", FIRST_UID), workload_run_id("llama", SECOND_UID)


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
    assert sorted(runs) == sorted([FIRST, SECOND])
    assert runs[FIRST] == alone(first, FIRST, as_of)
    assert runs[SECOND] == alone(second, SECOND, as_of)
    assert [len(runs[run].disruptions) for run in (FIRST, SECOND)] == [1, 0]
    merged = runs_of(messages(as_run([*first, *second], "llama"), 500), as_of)
    assert list(merged) == ["llama"] and len(merged["llama"].disruptions) == 2


def test_a_restart_in_the_same_workload_is_the_same_run():
    """Both attempts of a workload, a crash between them, are one run with one disruption, as the
    run without a workload is."""
    events, as_of = recorded("restarted")
    assert len({e.attempt_id for e in events}) == 2
    runs = runs_of(workload_messages(events, "llama", FIRST_UID, 300), as_of)
    assert list(runs) == [FIRST]
    assert len(runs[FIRST].disruptions) == 1
    assert dataclasses.replace(runs[FIRST], run_id="run") == alone(events, "run", as_of)


def named(events: list[Event], name: str, uid: str) -> list[bytes]:
    """The messages of ``events`` under the run id ``name``, naming the workload ``uid`` if any."""
    return workload_messages(events, name, uid, 500) if uid else messages(as_run(events, name), 500)


def test_two_workloads_whose_uids_share_their_first_characters_are_two_runs():
    """Two JobSets whose uids differ only after their first 8 characters are two runs, each with
    the figures it has alone."""
    first, second, as_of = reused_name()
    ids = [workload_run_id("train", uid) for uid in ("team-a-run-1", "team-a-run-2")]
    runs = runs_of(named(first, "train", "team-a-run-1") + named(second, "train", "team-a-run-2"), as_of)
    assert len(runs) == 2 and sorted(runs) == sorted(ids)
    assert runs[ids[0]] == alone(first, ids[0], as_of) and runs[ids[1]] == alone(second, ids[1], as_of)


def test_a_run_id_given_as_another_runs_derived_id_is_a_run_of_its_own():
    """A job without a workload that gives as its run id the id derived for a workload's run is
    another run, each with the figures it has alone."""
    first, second, as_of = reused_name()
    runs = runs_of(named(first, "train", FIRST_UID) + named(second, workload_run_id("train", FIRST_UID), ""),
                   as_of)
    taken = workload_run_id("train", FIRST_UID)
    assert len(runs) == 2 and taken in runs
    (own,) = set(runs) - {taken}
    assert runs[taken] == alone(first, taken, as_of) and runs[own] == alone(second, own, as_of)


@pytest.mark.parametrize("uid", [FIRST_UID, ""])
def test_long_run_ids_that_share_their_first_characters_are_two_runs(uid):
    """Two run ids of MAX_ID_LENGTH characters that differ only in their last are two runs, with a
    workload or without."""
    first, second, as_of = reused_name()
    names = ["r" * (MAX_ID_LENGTH - 1) + end for end in "12"]
    runs = runs_of(named(first, names[0], uid) + named(second, names[1], uid), as_of)
    assert len(runs) == 2 and sorted(runs) == sorted(workload_run_id(name, uid) for name in names)


def test_a_derived_id_is_the_name_a_digest_of_the_name_and_uid():
    """The run of a workload is its name, ``~`` and the first 32 hex digits of the SHA-256 of the
    name and the uid joined by a newline, as the schema's README says."""
    digest = hashlib.sha256(b"llama-7b\n3f2a9c1e-5b1d").hexdigest()[:32]
    assert workload_run_id("llama-7b", "3f2a9c1e-5b1d") == f"llama-7b~{digest}"


@st.composite
def runs_and_uids(draw: st.DrawFn) -> tuple[str, str]:
    """A (run id, workload uid) pair of a message, much alike to others: long ids sharing their
    first characters, the separator and hex digits, characters of 1 to 4 bytes, and ids derived
    for other runs given as run ids."""
    prefix = draw(st.sampled_from(["", "r" * 480, "r" * (MAX_ID_LENGTH - 1), "𝔵" * 250]))
    name = prefix + draw(st.text("ab~0fé𝔵", min_size=1, max_size=40))
    name = name.encode()[:MAX_ID_BYTES].decode("utf-8", "ignore")[:MAX_ID_LENGTH]
    uids = st.sampled_from(["", "team-a-run-1", "team-a-run-2"]) | st.text("ab~0f-é", max_size=MAX_UID_LENGTH)
    if draw(st.booleans()):  # the id derived for another run, given as a run id
        name = workload_run_id(name, draw(uids))
    return name, draw(uids)


_LONG = "r" * (MAX_ID_LENGTH - 1)


@example(first=("train", "team-a-run-1"), second=("train", "team-a-run-2"))
@example(first=(_LONG + "1", "u"), second=(_LONG + "2", "u"))
@example(first=(workload_run_id("train", "team-a-run-1"), ""), second=("train", "team-a-run-1"))
@given(first=runs_and_uids(), second=runs_and_uids())
def test_distinct_run_ids_and_uids_never_give_one_run(first, second):
    """No two distinct (run id, workload uid) pairs give the same run id."""
    if first != second:
        assert workload_run_id(*first) != workload_run_id(*second)


@example(pair=("𝔵" * (MAX_ID_BYTES // 4), "u"))
@given(pair=runs_and_uids())
def test_every_run_a_message_gives_has_a_valid_run_id(pair):
    """A derived run id is a valid run id: at most MAX_ID_LENGTH characters and MAX_ID_BYTES bytes."""
    assert id_problem("run_id", workload_run_id(*pair)) is None


def test_a_derived_run_id_is_the_same_in_cloud_monitoring_as_in_the_tables():
    """A workload's run of a name of MAX_ID_BYTES bytes has an id that every sink stores as it is,
    a Cloud Monitoring label too."""
    run_id = workload_run_id("𝔵" * (MAX_ID_BYTES // 4), FIRST_UID)
    assert label_value(run_id) == identifier(run_id) == run_id


@given(name=st.text(st.characters(codec="utf-8", exclude_characters="~"), min_size=1, max_size=MAX_ID_LENGTH))
def test_a_run_id_without_a_workload_or_the_separator_is_the_run(name):
    """A message of no workload whose run id has no ``~`` is of the run its run id names, as
    before workloads were known."""
    if id_problem("run_id", name) is None:
        assert workload_run_id(name, "") == name


# -- the reference-compatible readers -----------------------------------------------------------------

T = datetime.datetime(2026, 11, 1, 8, tzinfo=datetime.timezone.utc)


def write_run(sink: DuckDBSink, run_id: str, started_s: float, productive_s: float,
              run_name: str | None = None, uid: str | None = None) -> None:
    """A run that started ``started_s`` after T, with one cumulative snapshot 100 s later."""
    start, at = T + datetime.timedelta(seconds=started_s), T + datetime.timedelta(seconds=started_s + 100)
    if run_name is not None:
        sink.write("run_metadata", [{"run_id": run_id, "attempt_id": f"{run_id}-a", "start_time": start,
                                     "run_name": run_name, "workload_uid": uid}])
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
    for uid, started_s, productive_s in (("aaaaaaaa-1", 0, 50.0), ("cccccccc-3", 7200, 90.0),
                                         ("bbbbbbbb-2", 3600, 70.0)):
        write_run(sink, workload_run_id("llama", uid), started_s, productive_s, "llama", uid)
    write_run(sink, "solo", 0, 60.0)
    sink.close()
    return path


def test_a_job_name_reads_its_latest_run(reused: Path):
    """The calculator of a name that several workloads reused reads the run that started last; a run
    without a workload is read by its id."""
    goodput_pct, _, _ = goodput.GoodputCalculator("llama", duckdb_path=reused).get_job_goodput()
    assert goodput_pct == pytest.approx(90.0)
    assert goodput.GoodputCalculator("solo", duckdb_path=reused).get_job_goodput()[0] == pytest.approx(60.0)
    older = goodput.GoodputCalculator(workload_run_id("llama", "bbbbbbbb-2"), duckdb_path=reused)
    assert older.get_job_goodput()[0] == pytest.approx(70.0)  # a derived id still names its own run


def test_a_file_written_before_runs_had_names_is_read_by_id(reused: Path):
    """A file an older pipeline wrote (run_metadata without run_name) is read as before: by run id."""
    with duckdb.connect(str(reused)) as connection:
        connection.execute("ALTER TABLE run_metadata DROP COLUMN run_name")
    assert goodput.GoodputCalculator("solo", duckdb_path=reused).get_job_goodput()[0] == pytest.approx(60.0)
    with pytest.raises(ValueError, match="no goodput snapshot"):
        goodput.GoodputCalculator("llama", duckdb_path=reused).get_job_goodput()
