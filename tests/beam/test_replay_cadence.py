"""A batch replay with ``--snapshot_every_s``: a time series of each run's snapshots, each what a
replay ``--as_of`` its time writes, that leaves every view and saved query of the latest state
as it is without the option; and the option's place among the others."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

from goodput_schemas import saved_queries
from pipeline.app.fleet_sql import run_saved
from pipeline.beam.options import UsageError, help_parser, parse_command_line
from pipeline.demo.simulated_job import JobProfile
from support.beam import SNAPSHOT_TABLES, query, run_batch, table
from support.dataflow import translated
from support.history import SlowStretch, simulate_profile

EVERY_S = 300
#: Saved queries that read snapshots before the latest: the series is what they are for.
READS_HISTORY = {"interval_goodput"}
LATEST_VIEWS = ("latest_goodput", "latest_badput", "latest_anomalies", "run_productivity_factors")


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Three simulated runs: crashes, checkpoints, evals, a slowdown that ends, a hang."""
    directory = tmp_path_factory.mktemp("fleet")
    return [
        simulate_profile(directory, "hung", 2000, 7, JobProfile(
            crashes_at=(0.3,), slowdown=1.6, slowdown_from=0.4, hang_at=0.8, hang_for_s=1800)),
        simulate_profile(directory, "slowed", 1500, 8, SlowStretch(
            crashes_at=(0.5,), slow_from=300, slow_until=700, slow_factor=2.0, chip_count=16,
            accelerator_type="h100")),
        simulate_profile(directory, "restarted", 1200, 9, JobProfile(crashes_at=(0.2, 0.7),
                                                                     restore_checkpoint=False)),
    ]


@pytest.fixture(scope="module")
def plain(fleet: list[Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    database = tmp_path_factory.mktemp("plain") / "goodput.duckdb"
    run_batch(*(f"--events={path}" for path in fleet), f"--duckdb={database}")
    return database


@pytest.fixture(scope="module")
def series(fleet: list[Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    database = tmp_path_factory.mktemp("series") / "goodput.duckdb"
    run_batch(*(f"--events={path}" for path in fleet), f"--duckdb={database}",
              f"--snapshot_every_s={EVERY_S}")
    return database


def rounded(rows: list[tuple[object, ...]]) -> list[tuple[object, ...]]:
    """Rows with floats to 9 significant digits: an average over many rows may differ in its
    last bits from one query to the next."""
    return sorted((tuple(float(f"{v:.9g}") if isinstance(v, float) else v for v in row) for row in rows),
                  key=repr)


def test_each_run_is_snapshotted_at_the_cadence_up_to_its_last_event(plain: Path, series: Path):
    """Every multiple of the cadence after a run's first event and up to its last is a snapshot
    time of it, and so is the replay's one time, which is the latest."""
    ((final,),) = query(plain, "SELECT DISTINCT epoch_us(snapshot_time) FROM goodput_snapshots")
    spans = query(series, "SELECT run_id, epoch_us(min(event_time)), epoch_us(max(event_time)) FROM events "
                          "GROUP BY run_id")
    assert len(spans) == 3
    every_us = EVERY_S * 1_000_000
    for run_id, first, last in spans:
        times = [t for t, in query(series, "SELECT DISTINCT epoch_us(snapshot_time) FROM goodput_snapshots "
                                           f"WHERE run_id = '{run_id}' ORDER BY 1")]
        expected = list(range((first // every_us + 1) * every_us, min(last, final - 1) + 1, every_us))
        assert len(expected) > 10 and times == [*expected, final], run_id


def test_a_snapshot_of_the_series_is_what_a_replay_as_of_its_time_writes(fleet: list[Path], series: Path,
                                                                         tmp_path: Path):
    """The rows of every snapshot table at a time of the series are those of a replay --as_of it."""
    times = [t for t, in query(series, "SELECT DISTINCT snapshot_time FROM goodput_snapshots "
                                       "WHERE run_id = 'hung' ORDER BY 1")]
    for index, moment in enumerate((times[len(times) // 3], times[-3])):
        database = tmp_path / f"as_of_{index}.duckdb"
        run_batch(*(f"--events={path}" for path in fleet), f"--duckdb={database}",
                  f"--as_of={moment.isoformat()}")
        runs = "('" + "','".join(r for r, in query(
            series, f"SELECT DISTINCT run_id FROM goodput_snapshots WHERE snapshot_time = '{moment}'")) + "')"
        for name in SNAPSHOT_TABLES:
            where = f"snapshot_time = '{moment}' AND run_id IN {runs}"
            assert table(series, name, where) == table(database, name, where), (name, moment)
            assert table(series, name, where), name


def test_each_anomaly_row_is_written_once_and_every_one_is(plain: Path, series: Path):
    """The anomaly rows are the replay's, each once, as the stream writes them."""
    rows = table(series, "run_anomalies")
    assert len(rows) == len(set(rows)) and set(rows) == set(table(plain, "run_anomalies"))
    assert {kind for kind, in query(series, "SELECT kind FROM run_anomalies")} >= {"hang", "slowdown"}


def test_views_and_saved_queries_of_the_latest_state_answer_as_without_the_series(plain: Path, series: Path):
    """Every view of the latest state, and every saved query that reads no history, gives the
    answer of the replay without --snapshot_every_s."""
    with duckdb.connect(str(plain), read_only=True) as without, \
            duckdb.connect(str(series), read_only=True) as with_series:
        for view in LATEST_VIEWS:
            sql = f"SELECT * FROM {view}"
            expected = without.execute(sql).fetchall()
            assert expected and rounded(with_series.execute(sql).fetchall()) == rounded(expected), view
        for name in saved_queries("main"):
            if name not in READS_HISTORY:
                assert rounded(run_saved(name, with_series)[1]) == rounded(run_saved(name, without)[1]), name
    assert query(series, "SELECT count(DISTINCT snapshot_time) FROM goodput_snapshots")[0][0] > 10


def test_the_cadence_is_a_batch_option_of_at_least_a_second():
    """The stream refuses it, a cadence under a second is refused, and --help says it."""
    with pytest.raises(UsageError, match="--snapshot_every_s has no effect in the stream"):
        parse_command_line(["--streaming", "--subscription=projects/p/subscriptions/s", "--duckdb=x.duckdb",
                            "--snapshot_every_s=300"])
    with pytest.raises(UsageError, match="at least 1 second"):
        parse_command_line(["--events=e.jsonl", "--duckdb=x.duckdb", "--snapshot_every_s=0.5"])
    assert "--snapshot_every_s" in help_parser("goodput replay").format_help()


def test_the_replay_with_a_cadence_translates_for_dataflow_with_the_same_steps():
    """The batch graph with the option translates for Dataflow, its steps named as without it."""
    batch = ["--runner=DataflowRunner", "--dry_run=True", "--no_auth", "--project=goodput-test",
             "--region=us-central1", "--temp_location=gs://goodput-test/tmp",
             "--events=gs://goodput-test/events.jsonl", "--bigquery_dataset=goodput-test:fleet_goodput"]
    with_cadence = translated([*batch, f"--snapshot_every_s={EVERY_S}"])
    steps = {t.unique_name for t in with_cadence.components.transforms.values()}
    assert "TrackRuns/Snapshot" in steps
    assert steps == {t.unique_name for t in translated(batch).components.transforms.values()}
