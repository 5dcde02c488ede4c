"""Who a run is, through the batch replay on Beam: one name given by two workloads is two runs in
every table, even where their uids share their first characters, and a job that gives a
workload's derived run id as its own is a third; the restarts of one workload are one run, with
its disruption; the name the job gave stays in run_metadata, through a backfill of the raw events
table too; configs and metrics land in their tables, and what is invalid of them in dead_letter
with its reason."""

from __future__ import annotations

import dataclasses
import math
import shutil
from pathlib import Path

import duckdb
import pytest

from goodput_schemas.wire import encode_batch, workload_run_id
from ml_goodput_measurement import goodput
from support.beam import SNAPSHOT_TABLES, query, replay, run_batch, table
from support.runs import (
    FIRST_UID,
    SECOND_UID,
    as_run,
    messages,
    recorded,
    reused_name,
    with_configs_and_metrics,
    workload_messages,
)

FIRST, SECOND = workload_run_id("llama", FIRST_UID), workload_run_id("llama", SECOND_UID)
#: Two JobSets' uids that share their first 11 characters, and the runs of the name "train" they give.
ALIKE_UIDS = ("team-a-run-1", "team-a-run-2")
ALIKE = tuple(workload_run_id("train", uid) for uid in ALIKE_UIDS)
T = 1_793_000_000_000_000  # 2026-10-25, in microseconds


@pytest.fixture(scope="module")
def lines() -> list[bytes]:
    """Two workloads' messages under the name "llama", each with its user configs and metrics; a
    message naming an invalid workload uid; a message with an invalid metrics event."""
    first, second, _ = reused_name()
    workload = {"platform": "gke", "cluster": "c1", "namespace": "ml", "jobset_name": "llama"}
    first, second = ([dataclasses.replace(e, body={**e.body, "workload": workload}) if e.kind == "job_start"
                      else e for e in events] for events in (first, second))
    bad_metrics = [(0, T, "metrics", {"values": {}})]
    return [
        *workload_messages(with_configs_and_metrics(first, {"optimizer.lr": "0.01", "seed": "1"}), "llama",
                           FIRST_UID, 400),
        *workload_messages(with_configs_and_metrics(second, {"optimizer.lr": "0.02", "seed": "1"}), "llama",
                           SECOND_UID, 400),
        encode_batch("llama", "bad-uid", [(0, T, "step_start", {"step": 0})], workload_uid="u" * 200).data,
        encode_batch("llama", "bad-metrics", bad_metrics, workload_uid=FIRST_UID).data,
    ]


@pytest.fixture(scope="module")
def database(lines: list[bytes], tmp_path_factory: pytest.TempPathFactory) -> Path:
    return replay(lines, tmp_path_factory.mktemp("reused"))


@pytest.mark.parametrize("name", [*SNAPSHOT_TABLES, "events", "run_metadata", "run_configs", "model_metrics"])
def test_a_name_reused_by_a_new_workload_is_two_runs_in_every_table(database, name):
    """Every table's rows are of the two derived runs, and none of the name alone; of the two,
    only the first workload, which restarted, has disruptions."""
    runs = {row[0] for row in query(database, f"SELECT DISTINCT run_id FROM {name}")}
    assert runs == ({FIRST} if name == "disruptions" else {FIRST, SECOND})


def test_a_restart_in_the_same_workload_is_one_run_with_a_disruption(database):
    """The first workload's two attempts are one run: its latest cumulative snapshot counts one
    disruption, and its metadata has a row per attempt, each naming the run and the workload."""
    ((disruptions,),) = query(database, "SELECT disruptions FROM latest_goodput WHERE window_s = 0 "
                                        f"AND run_id = '{FIRST}'")
    assert disruptions == 1
    assert sorted(query(database, "SELECT run_id, run_name, workload_uid FROM run_metadata")) == sorted([
        (FIRST, "llama", FIRST_UID), (FIRST, "llama", FIRST_UID), (SECOND, "llama", SECOND_UID)])


def test_configs_and_metrics_land_in_their_tables(database):
    """Each run's user configs are its own; its metrics are there at their steps, a NaN loss too."""
    configs = query(database, "SELECT DISTINCT run_id, key, value FROM run_configs ORDER BY ALL")
    assert configs == sorted([(FIRST, "optimizer.lr", "0.01"), (FIRST, "seed", "1"),
                              (SECOND, "optimizer.lr", "0.02"), (SECOND, "seed", "1")])
    losses: dict[object, list[object]] = {}
    for step, value in query(database, "SELECT step, value FROM model_metrics WHERE name = 'LOSS' "
                                       f"AND run_id = '{SECOND}'"):
        losses.setdefault(step, []).append(value)  # a step started twice has a row of each start
    assert any(math.isnan(value) for value in losses[5]) and losses[10] == [pytest.approx(4.0 / 11)]


def test_invalid_workload_uids_and_metrics_are_dead_letters_with_their_reasons(database):
    """A message naming an invalid uid is one dead letter of the name; an invalid metrics event is
    one of the run its message belongs to."""
    letters = sorted(query(database, "SELECT run_id, reason FROM dead_letter"))
    assert [run for run, _ in letters] == ["llama", FIRST]
    assert "workload_uid must be at most 128 printable characters" in letters[0][1]
    assert "metrics.values must name at least one metric" in letters[1][1]


def test_a_backfill_of_the_raw_events_table_keeps_who_each_run_is(database, tmp_path: Path):
    """Replaying the raw events table (goodput replay --from_duckdb) gives the same runs, their
    names and workloads in run_metadata, and every snapshot table."""
    backfilled = tmp_path / "backfill.duckdb"
    run_batch(f"--from_duckdb={database}", f"--duckdb={backfilled}")
    for name in (*SNAPSHOT_TABLES, "run_metadata", "run_configs"):
        assert table(backfilled, name) == table(database, name), name
    count = "SELECT count(*), count(DISTINCT run_id) FROM model_metrics"
    assert query(backfilled, count) == query(database, count)


def test_run_metadata_says_where_each_run_ran(database):
    """The workload each job_start carried is in run_metadata's columns, NULL where it is not known."""
    rows = query(database, "SELECT DISTINCT run_id, platform, cluster, namespace, jobset_name, pod "
                           "FROM run_metadata ORDER BY ALL")
    assert rows == sorted([(FIRST, "gke", "c1", "ml", "llama", None),
                           (SECOND, "gke", "c1", "ml", "llama", None)])


def cumulative(database: Path, run_id: str) -> tuple[object, ...]:
    """A run's latest cumulative goodput, elapsed time and disruptions."""
    [row] = query(database, "SELECT goodput_pct, total_time_s, disruptions FROM latest_goodput "
                            f"WHERE window_s = 0 AND run_id = '{run_id}'")
    return row


@pytest.fixture(scope="module")
def alike(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A replay of two workloads whose uids share their first characters, under the name "train",
    and of a job of no workload that records the second's events under the first's derived run id."""
    first, second, _ = reused_name()
    return replay([*workload_messages(first, "train", ALIKE_UIDS[0], 400),
                   *workload_messages(second, "train", ALIKE_UIDS[1], 400),
                   *messages(as_run(second, ALIKE[0]), 400)], tmp_path_factory.mktemp("alike"))


def test_runs_a_prefix_of_their_ids_would_merge_are_three_runs_in_every_table(alike):
    """The two workloads and the job that gave the first's derived id are three runs, each named
    as its job named it, each with its own figures: the job's are the second's, whose events it
    recorded, and not the first's."""
    own = workload_run_id(ALIKE[0], "")
    assert sorted(query(alike, "SELECT DISTINCT run_id, run_name, workload_uid FROM run_metadata")) == sorted(
        [(ALIKE[0], "train", ALIKE_UIDS[0]), (ALIKE[1], "train", ALIKE_UIDS[1]), (own, ALIKE[0], None)])
    for name in (*SNAPSHOT_TABLES, "events"):
        runs = {row[0] for row in query(alike, f"SELECT DISTINCT run_id FROM {name}")}
        assert runs == ({ALIKE[0]} if name == "disruptions" else {*ALIKE, own}), name
    assert cumulative(alike, own) == cumulative(alike, ALIKE[1]) != cumulative(alike, ALIKE[0])


def test_a_job_name_given_as_a_derived_id_reads_its_own_run(alike):
    """The reference's calculator of the run id a job of no workload gave reads that job's run,
    though it is the first workload's derived id."""
    own_pct, first_pct = (cumulative(alike, run)[0] for run in (workload_run_id(ALIKE[0], ""), ALIKE[0]))
    assert own_pct != first_pct
    calculator = goodput.GoodputCalculator(ALIKE[0], duckdb_path=alike)
    assert calculator.get_job_goodput()[0] == pytest.approx(own_pct)


def test_a_backfill_keeps_runs_a_prefix_of_their_ids_would_merge_apart(alike, tmp_path: Path):
    """Replaying the raw events table gives the same three runs, names and figures."""
    backfilled = tmp_path / "backfill.duckdb"
    run_batch(f"--from_duckdb={alike}", f"--duckdb={backfilled}")
    for name in (*SNAPSHOT_TABLES, "run_metadata"):
        assert table(backfilled, name) == table(alike, name), name


def test_a_backfill_keeps_an_attempt_without_its_job_start_in_its_workloads_run(tmp_path: Path):
    """An attempt of a workload's run whose job start was never received (so not in run_metadata)
    is replayed from the raw events table into the same run."""
    events, _ = recorded("restarted")
    events = tuple(e for e in events if not (e.kind == "job_start" and e.attempt_id == "attempt-1"))
    database = replay(workload_messages(events, "llama", FIRST_UID, 300), tmp_path / "lost")
    backfilled = tmp_path / "backfill.duckdb"
    run_batch(f"--from_duckdb={database}", f"--duckdb={backfilled}")
    assert query(database, "SELECT DISTINCT run_id FROM events") == [(FIRST,)]
    for name in (*SNAPSHOT_TABLES, "events"):
        assert table(backfilled, name) == table(database, name), name


def test_a_backfill_derives_again_the_ids_an_earlier_version_derived(database, tmp_path: Path):
    """Runs an earlier version named by the uid's first 8 characters are replayed from the raw
    events table under the ids derived now, with the same figures."""
    earlier = tmp_path / "earlier.duckdb"
    shutil.copy(database, earlier)
    with duckdb.connect(str(earlier)) as connection:
        for name in (*SNAPSHOT_TABLES, "events", "run_metadata", "run_configs", "model_metrics"):
            for run_id, uid in ((FIRST, FIRST_UID), (SECOND, SECOND_UID)):
                connection.execute(f"UPDATE {name} SET run_id = ? WHERE run_id = ?",
                                   [f"llama~{uid[:8]}", run_id])
    backfilled = tmp_path / "backfill.duckdb"
    run_batch(f"--from_duckdb={earlier}", f"--duckdb={backfilled}")
    for name in (*SNAPSHOT_TABLES, "run_metadata", "run_configs"):
        assert table(backfilled, name) == table(database, name), name
