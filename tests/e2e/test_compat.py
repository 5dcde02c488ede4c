"""The reference's read API over the pipeline's tables (``emitter.goodput``, ``emitter.monitoring``)
after batch replays of simulated runs, in fresh interpreters.

``GoodputCalculator`` must answer from the tables exactly what ``latest_goodput``/``latest_badput``
hold, in the reference's shapes and types, and on events where the reference is right, the same
numbers as the reference's own ``GoodputCalculator`` within 0.01 percentage points."""

from __future__ import annotations

import datetime
import functools
import subprocess
import sys
from pathlib import Path
from typing import Any

import duckdb
import pytest

from ml_goodput_measurement import goodput
from ml_goodput_measurement.src.goodput_utils import BadputType
from support import REPO
from support.history import replay
from support.reference import assert_same_as_reference, reference_result
from support.runs import record_ours, shape, write_events


@pytest.fixture(scope="module")
def simulated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The DuckDB file of a simulated job (a crash, a restart, evals, saves), replayed by the pipeline."""
    folder = tmp_path_factory.mktemp("simulated")
    events = folder / "events.jsonl"
    done = subprocess.run([sys.executable, "-m", "pipeline.demo.simulated_job", "--output", str(events),
                           "--run-id", "sim", "--steps", "600", "--seed", "5"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    replay([events], folder / "goodput.duckdb")
    return folder / "goodput.duckdb"


def test_goodput_equals_the_latest_tables(simulated: Path):
    """get_job_goodput returns latest_goodput's goodput and latest_badput's percentages."""
    calculator = goodput.GoodputCalculator("sim", "goodput_sim", duckdb_path=simulated)
    goodput_pct, breakdown, max_step = calculator.get_job_goodput(include_badput_breakdown=True)
    with duckdb.connect(str(simulated), read_only=True) as connection:
        pct, step = connection.execute("SELECT goodput_pct, max_productive_step FROM latest_goodput "
                                       "WHERE run_id = 'sim' AND window_s = 0").fetchone() or (None, None)
        buckets = dict(connection.execute("SELECT badput_source, pct FROM latest_badput "
                                          "WHERE run_id = 'sim' AND window_s = 0").fetchall())
    assert isinstance(goodput_pct, float) and goodput_pct == pytest.approx(pct, abs=1e-9)
    assert isinstance(max_step, int) and max_step == step
    custom = breakdown[BadputType.CUSTOM_BADPUT_EVENTS]
    assert isinstance(custom, dict) and custom["EVAL_STEP"] > 0
    for source, value in buckets.items():
        if source.startswith("CUSTOM_BADPUT_EVENTS."):
            assert custom[source.split(".", 1)[1]] == pytest.approx(value, abs=1e-9)
        else:
            assert breakdown[BadputType[source]] == pytest.approx(value, abs=1e-9), source
    assert breakdown[BadputType.WASTED_PROGRESS_FROM_DISRUPTION] > 0


def test_breakdown_is_empty_unless_asked_for(simulated: Path):
    """As the reference: without include_badput_breakdown the breakdown is {}."""
    goodput_pct, breakdown, _ = goodput.GoodputCalculator("sim", duckdb_path=simulated).get_job_goodput()
    assert breakdown == {} and 0 < goodput_pct < 100


def test_details_are_seconds_in_the_reference_shape(simulated: Path):
    """get_job_goodput_details holds the latest snapshot's seconds under the reference's keys."""
    calculator = goodput.GoodputCalculator("sim", duckdb_path=simulated)
    details = calculator.get_job_goodput_details()
    goodput_pct, _, max_step = calculator.get_job_goodput()
    total = details["total_elapsed_time"]
    assert 100 * details["goodput_time"][goodput.GoodputType.TOTAL] / total == pytest.approx(goodput_pct)
    flat = [v for k, v in details["badput_time"].items()
            if k not in (BadputType.DATA_LOADING_ASYNC, BadputType.CUSTOM_BADPUT_EVENTS)]
    custom = sum(details["badput_time"][BadputType.CUSTOM_BADPUT_EVENTS].values())
    assert details["goodput_time"][goodput.GoodputType.TOTAL] + sum(flat) + custom == pytest.approx(total)
    assert details["max_productive_step"] == max_step and details["disruption_count"] == 1
    assert details["ideal_step_time"] > 0


def test_step_deviation_summarizes_to_the_snapshots(simulated: Path):
    """get_step_deviation has a value for every step step_stats measured, and the reference's
    summary of them is the snapshot's step_time_deviation_s."""
    from ml_goodput_measurement import goodput_utils

    deviations = goodput.GoodputCalculator("sim", duckdb_path=simulated).get_step_deviation()
    with duckdb.connect(str(simulated), read_only=True) as connection:
        (summary, measured), = connection.execute(
            "SELECT g.step_time_deviation_s, s.steps_measured FROM latest_goodput g JOIN step_stats s "
            "ON s.run_id = g.run_id AND s.snapshot_time = g.snapshot_time "
            "WHERE g.run_id = 'sim' AND g.window_s = 0").fetchall()
    assert len(deviations) == measured
    assert goodput_utils.compute_step_deviation_from_baseline(deviations) == pytest.approx(summary, rel=1e-9)


@pytest.mark.parametrize("build", [functools.partial(shape, "long_clean", 21),
                                   functools.partial(shape, "outage", 22)], ids=["clean", "restarted"])
def test_goodput_matches_the_reference_calculator(build: Any, tmp_path: Path):
    """Through the emitter file and the batch pipeline, the reference's own numbers, within 0.01 pp."""
    run = build()
    write_events(record_ours(run.attempts), tmp_path / "events.jsonl")
    replay([tmp_path / "events.jsonl"], tmp_path / "goodput.duckdb")
    ours = goodput.GoodputCalculator("run", "log", duckdb_path=tmp_path / "goodput.duckdb").get_job_goodput(
        include_badput_breakdown=True)
    assert_same_as_reference(ours, reference_result(run.attempts, tmp_path))


def test_exclusions_equal_a_replay_with_exclude(simulated: Path, tmp_path: Path):
    """After a batch replay (one snapshot per run), exclusions give the figures a replay of the same
    events with --exclude writes, not those of the whole run or of nothing."""
    with duckdb.connect(str(simulated), read_only=True) as connection:
        (started, ended), = connection.execute("SELECT window_start, window_end FROM latest_goodput "
                                               "WHERE run_id = 'sim' AND window_s = 0").fetchall()
    quarter = (ended - started).total_seconds() // 4
    start, end = (started.replace(tzinfo=datetime.timezone.utc, microsecond=0)
                  + datetime.timedelta(seconds=quarter * n) for n in (1, 2))
    replay([simulated.parent / "events.jsonl"], tmp_path / "excluded.duckdb",
           f"--exclude={start.isoformat()}/{end.isoformat()}")
    calculator = goodput.GoodputCalculator("sim", duckdb_path=simulated)
    goodput_pct, breakdown, max_step, excluded_s = calculator.get_job_goodput_with_exclusions(
        [(start, end)], include_badput_breakdown=True)
    replayed = goodput.GoodputCalculator("sim", duckdb_path=tmp_path / "excluded.duckdb")
    assert (goodput_pct, breakdown, max_step) == replayed.get_job_goodput(include_badput_breakdown=True)
    assert excluded_s == pytest.approx(quarter)
    assert goodput_pct != calculator.get_job_goodput()[0]


def test_unknown_run_raises_value_error(simulated: Path):
    """As the reference with no entries: a ValueError, not zeros."""
    with pytest.raises(ValueError, match="no goodput snapshot"):
        goodput.GoodputCalculator("no-such-run", duckdb_path=simulated).get_job_goodput()


def test_the_source_comes_from_the_environment(simulated: Path, monkeypatch: pytest.MonkeyPatch):
    """The reference's constructor call, unchanged, reads the file named by $GOODPUT_DUCKDB."""
    monkeypatch.delenv(goodput.BIGQUERY_DATASET_ENV, raising=False)
    monkeypatch.setenv(goodput.DUCKDB_ENV, str(simulated))
    calculator = goodput.GoodputCalculator(job_name="sim", logger_name="goodput_sim", cache_dir="/tmp")
    assert calculator.get_job_goodput()[0] > 0
    monkeypatch.delenv(goodput.DUCKDB_ENV)
    with pytest.raises(ValueError, match="exactly one"):
        goodput.GoodputCalculator("sim", "goodput_sim")


def test_importing_the_api_pulls_no_heavy_dependency():
    """A training image imports goodput and monitoring without duckdb, BigQuery or Beam."""
    code = ("import sys; from ml_goodput_measurement import goodput, monitoring; "
            "heavy = [m for m in ('duckdb', 'apache_beam', 'google.cloud.bigquery', 'pipeline') "
            "if m in sys.modules]; assert not heavy, heavy")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_interval_over_two_replays_of_a_run(tmp_path: Path):
    """Two replays, as of mid-run and at the end: the interval between is the later stretch."""
    run = shape("outage", 22)
    write_events(record_ours(run.attempts), tmp_path / "events.jsonl")
    middle = run.now() - datetime.timedelta(seconds=200)
    replay([tmp_path / "events.jsonl"], tmp_path / "goodput.duckdb", f"--as_of={middle.isoformat()}")
    replay([tmp_path / "events.jsonl"], tmp_path / "goodput.duckdb")
    calculator = goodput.GoodputCalculator("run", duckdb_path=tmp_path / "goodput.duckdb")
    goodput_pct, breakdown, max_step, total_s, disruptions = calculator.get_job_goodput_interval(
        middle, run.now())
    assert total_s == pytest.approx(200.0, abs=1e-3)
    assert disruptions == 0 and max_step == calculator.get_job_goodput()[2]
    flat = sum(v for k, v in breakdown.items()
               if isinstance(v, float) and k is not BadputType.DATA_LOADING_ASYNC)
    custom = breakdown[BadputType.CUSTOM_BADPUT_EVENTS]
    assert isinstance(custom, dict)
    # The step running at the first snapshot was OTHER then and is productive now; the shrunken
    # OTHER counts 0, so the figures may exceed 100 % by up to that step's share (about 1 %).
    assert 100.0 - 1e-6 <= goodput_pct + flat + sum(custom.values()) <= 101.5
    whole = calculator.get_job_goodput_interval(run.now() - datetime.timedelta(days=1), run.now())
    assert whole[0] == pytest.approx(calculator.get_job_goodput()[0], abs=1e-9)


def test_elastic_calculator_always_reports_the_elastic_buckets(simulated: Path):
    """As the reference's elastic calculator: ELASTIC_* are in the breakdown, 0 when unused."""
    from ml_goodput_measurement import goodput_elastic

    _, breakdown, _ = goodput_elastic.ElasticGoodputCalculator("sim", duckdb_path=simulated).get_job_goodput(
        include_badput_breakdown=True)
    for bucket in (BadputType.ELASTIC_SLICE_DOWN, BadputType.ELASTIC_SCALE_UP,
                   BadputType.ELASTIC_REINITIALIZATION):
        assert breakdown[bucket] == 0.0
