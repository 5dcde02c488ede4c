"""The reference's read API over hand-made tables: ``ml_goodput_measurement``'s ``goodput``,
``goodput_utils`` and ``monitoring``.

The interval and exclusion queries are differences of cumulative snapshots at the bounds; step
deviation comes from the raw step starts; ``GoodputMonitor`` writes the reference's TensorBoard
scalars from the tables, or starts nothing; the signatures and enums are the reference's."""

from __future__ import annotations

import contextlib
import datetime
import inspect
import json
import logging
import math
import multiprocessing
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import duckdb
import pytest
import sqlglot

from ml_goodput_measurement import goodput, goodput_elastic, goodput_utils, monitoring, monitoring_elastic
from ml_goodput_measurement.src.goodput_utils import BadputType
from pipeline.core import engine
from pipeline.core.events import Batch
from pipeline.core.rows import batch_rows, snapshot_rows
from pipeline.sinks.duckdb import DuckDBSink, append
from support.runs import batch_of, messages, micros, recorded

UTC = datetime.timezone.utc
T = datetime.datetime(2026, 11, 1, 8, tzinfo=UTC)


# -- the interval query ---------------------------------------------------------------------------


def snapshot(database: DuckDBSink, seconds: float, productive_s: float, total_s: float, disruptions: int,
             max_step: int, badput_s: dict[str, float], run_id: str = "hand", **columns: Any) -> None:
    """Writes one cumulative snapshot of a run (by default "hand") at T + seconds."""
    at = T + datetime.timedelta(seconds=seconds)
    database.write("goodput_snapshots", [{
        "run_id": run_id, "snapshot_time": at, "window_s": 0, "window_start": T, "window_end": at,
        "goodput_pct": 100 * productive_s / total_s, "productive_time_s": productive_s,
        "total_time_s": total_s, "disruptions": disruptions, "max_productive_step": max_step,
        "last_step": max_step, "chip_count": 0, "productive_chip_s": 0.0, "total_chip_s": 0.0,
        "ended": False, **columns}])
    database.write("badput_snapshots", [
        {"run_id": run_id, "snapshot_time": at, "window_s": 0, "badput_source": source, "seconds": value,
         "pct": 100 * value / total_s} for source, value in badput_s.items()])


@pytest.fixture
def hand(tmp_path: Path) -> Path:
    """Snapshots at T+100 s, T+200 s and T+300 s of a run that started at T."""
    path = tmp_path / "hand.duckdb"
    database = DuckDBSink(path)
    snapshot(database, 100, 50, 100, 0, 40, {"TPU_INITIALIZATION": 30, "OTHER": 20})
    snapshot(database, 200, 120, 200, 1, 90,
             {"TPU_INITIALIZATION": 30, "OTHER": 10, "CUSTOM_BADPUT_EVENTS.EVAL": 15,
              "INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION": 25})
    snapshot(database, 300, 200, 300, 1, 130,
             {"TPU_INITIALIZATION": 30, "OTHER": 20, "CUSTOM_BADPUT_EVENTS.EVAL": 25,
              "INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION": 25})
    database.close()
    return path


def at(seconds: float) -> datetime.datetime:
    return T + datetime.timedelta(seconds=seconds)


def test_interval_is_the_difference_of_the_snapshots_at_the_bounds(hand: Path):
    """[T+150, T+250] uses the snapshots at T+100 and T+200: 70 of 100 s productive."""
    calculator = goodput.GoodputCalculator("hand", duckdb_path=hand)
    goodput_pct, breakdown, max_step, total_s, disruptions = calculator.get_job_goodput_interval(
        at(150), at(250))
    assert (goodput_pct, max_step, total_s, disruptions) == (pytest.approx(70.0), 90, 100.0, 1)
    assert breakdown[BadputType.CUSTOM_BADPUT_EVENTS] == {"EVAL": pytest.approx(15.0)}
    assert breakdown[BadputType.INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION] == pytest.approx(25.0)
    assert breakdown[BadputType.TPU_INITIALIZATION] == 0.0
    assert breakdown[BadputType.OTHER] == 0.0  # shrank from 20 to 10 s: clamped, as the reference does


def test_interval_bounds_on_snapshots_are_exact(hand: Path):
    """A bound at a snapshot time uses that snapshot: [T+200, T+300] is 80 of 100 s."""
    calculator = goodput.GoodputCalculator("hand", duckdb_path=hand)
    goodput_pct, breakdown, max_step, total_s, disruptions = calculator.get_job_goodput_interval(
        at(200), at(300))
    assert (goodput_pct, max_step, total_s, disruptions) == (pytest.approx(80.0), 130, 100.0, 0)
    assert breakdown[BadputType.OTHER] == pytest.approx(10.0)
    assert breakdown[BadputType.CUSTOM_BADPUT_EVENTS] == {"EVAL": pytest.approx(10.0)}


def test_interval_from_before_the_run_counts_from_its_start(hand: Path):
    """With no snapshot before the interval, the run counts from its start: 120 of 200 s."""
    calculator = goodput.GoodputCalculator("hand", duckdb_path=hand)
    goodput_pct, _, _, total_s, disruptions = calculator.get_job_goodput_interval(at(-50), at(250))
    assert (goodput_pct, total_s, disruptions) == (pytest.approx(60.0), 200.0, 1)


def test_interval_without_data_raises_value_error(hand: Path):
    """As the reference: an interval with nothing to measure raises ValueError."""
    calculator = goodput.GoodputCalculator("hand", duckdb_path=hand)
    with pytest.raises(ValueError, match="no goodput snapshot"):
        calculator.get_job_goodput_interval(at(-50), at(0))  # before the run
    with pytest.raises(ValueError, match="no elapsed time"):
        calculator.get_job_goodput_interval(at(210), at(250))  # one snapshot for both bounds


def test_interval_metric_details_have_the_reference_shape(hand: Path):
    """get_interval_metric_details: goodput under TOTAL, the breakdown, the interval's whole seconds."""
    calculator = goodput.GoodputCalculator("hand", duckdb_path=hand)
    details = calculator.get_interval_metric_details(at(150), at(250.5))
    assert details == {"interval_goodput": {goodput_utils.GoodputType.TOTAL: pytest.approx(70.0)},
                       "interval_badput": calculator.get_job_goodput_interval(at(150), at(250.5))[1],
                       "interval_size": 100}


def test_interval_metric_details_of_an_empty_interval_are_empty(hand: Path,
                                                                caplog: pytest.LogCaptureFixture):
    """As the reference: nothing to measure gives empty dicts and the size, and a warning."""
    details = goodput.GoodputCalculator("hand", duckdb_path=hand).get_interval_metric_details(at(-100), at(0))
    assert details == {"interval_goodput": {}, "interval_badput": {}, "interval_size": 100}
    assert any("no goodput snapshot" in r.getMessage() for r in caplog.records if r.levelname == "WARNING")


NAIVE = T.replace(tzinfo=None)
#: Bounds that are not timezone-aware datetimes. The reference raises TypeError for each: a naive
#: one fails its comparison with its log's aware times, the others fail inside it.
NOT_AWARE = {"text": ("2026-11-01T08:00:00Z", "2026-11-01T09:00:00Z"),
             "dates": (T.date(), T.date() + datetime.timedelta(days=1)),
             "naive": (NAIVE, NAIVE + datetime.timedelta(hours=1)), "naive end": (at(150), NAIVE),
             "numbers": (0, 3600)}
INTERVAL_METHODS = ["get_job_goodput_interval", "get_interval_metric_details"]


CALCULATORS = {"base": goodput.GoodputCalculator, "elastic": goodput_elastic.ElasticGoodputCalculator}


@pytest.mark.parametrize("calculator_class", CALCULATORS.values(), ids=list(CALCULATORS))
@pytest.mark.parametrize("method", INTERVAL_METHODS)
@pytest.mark.parametrize("bounds", NOT_AWARE.values(), ids=list(NOT_AWARE))
def test_interval_bounds_that_are_not_aware_datetimes_raise_type_error(
        hand: Path, calculator_class: type[goodput.GoodputCalculator], method: str, bounds: tuple[Any, Any]):
    """A bound that is not a timezone-aware datetime raises the reference's TypeError, naming it."""
    calculator = calculator_class("hand", duckdb_path=hand)
    with pytest.raises(TypeError, match=r"^interval_(start|end) must be (a )?timezone-aware"):
        getattr(calculator, method)(*bounds)


@pytest.mark.parametrize("calculator_class", CALCULATORS.values(), ids=list(CALCULATORS))
@pytest.mark.parametrize("method", INTERVAL_METHODS)
@pytest.mark.parametrize("bounds", [(at(250), at(150)), (at(150), at(150))], ids=["reversed", "empty"])
def test_interval_not_in_order_raises_value_error(
        hand: Path, calculator_class: type[goodput.GoodputCalculator], method: str,
        bounds: tuple[datetime.datetime, datetime.datetime]):
    """An interval that ends before or where it starts raises ValueError, never a size of 0 or less."""
    calculator = calculator_class("hand", duckdb_path=hand)
    with pytest.raises(ValueError, match="must be before interval_end"):
        getattr(calculator, method)(*bounds)


def test_interval_without_a_bound_raises_the_references_errors(hand: Path):
    """A bound of None: the reference's ValueError from the interval, its TypeError from the details."""
    calculator = goodput.GoodputCalculator("hand", duckdb_path=hand)
    with pytest.raises(ValueError, match="Start and end times are required"):
        calculator.get_job_goodput_interval(None, at(250))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"^interval_end must be a timezone-aware datetime, got NoneType"):
        calculator.get_interval_metric_details(at(150), None)  # type: ignore[arg-type]


def test_exclusions_take_the_excluded_snapshots_figures_out(hand: Path):
    """Excluding [T+150, T+250] takes out what the snapshots at T+100 and T+200 differ by: 100 s."""
    calculator = goodput.GoodputCalculator("hand", duckdb_path=hand)
    goodput_pct, breakdown, max_step, excluded_s = calculator.get_job_goodput_with_exclusions(
        [(at(150), at(250))], include_badput_breakdown=True)
    # Left: 130 of 200 s productive; TPU init 30 s, OTHER 20 - (10 - 20) = 30 s, EVAL 25 - 15 = 10 s.
    assert (goodput_pct, max_step, excluded_s) == (pytest.approx(65.0), 130, 100.0)
    assert breakdown[BadputType.TPU_INITIALIZATION] == pytest.approx(15.0)
    assert breakdown[BadputType.OTHER] == pytest.approx(15.0)
    assert breakdown[BadputType.CUSTOM_BADPUT_EVENTS] == {"EVAL": pytest.approx(5.0)}
    assert breakdown[BadputType.INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION] == 0.0


def test_exclusions_are_merged_and_invalid_ones_skipped(hand: Path):
    """Overlapping intervals count once; naive, reversed and future ones change nothing."""
    calculator = goodput.GoodputCalculator("hand", duckdb_path=hand)
    merged = calculator.get_job_goodput_with_exclusions(
        [(at(150), at(200)), (at(180), at(250)), (at(260), at(240)), (at(400), at(500)),
         (at(0).replace(tzinfo=None), at(300).replace(tzinfo=None))])
    assert merged == (pytest.approx(65.0), {}, 130, 100.0)
    assert calculator.get_job_goodput_with_exclusions([]) == (
        pytest.approx(calculator.get_job_goodput()[0]), {}, 130, 0.0)


def test_excluding_everything_gives_zero_goodput(hand: Path):
    """As the reference: nothing left gives (0.0, {}, max productive step, excluded seconds)."""
    calculator = goodput.GoodputCalculator("hand", duckdb_path=hand)
    assert calculator.get_job_goodput_with_exclusions([(at(-10), at(400))], True) == (0.0, {}, 130, 300.0)


@pytest.mark.parametrize("intervals", [[("2026-11-01T08:00:00Z", "2026-11-01T09:00:00Z")], [at(150)],
                                       [(at(150),)], "ab", 150],
                         ids=["text", "not-a-pair", "one-bound", "text-of-two", "a-number"])
def test_exclusions_that_are_not_pairs_of_datetimes_raise_type_error(hand: Path, intervals: Any):
    """Anything but (datetime, datetime) pairs raises a clear TypeError (the reference's is an
    AttributeError from inside it)."""
    calculator = goodput.GoodputCalculator("hand", duckdb_path=hand)
    with pytest.raises(TypeError, match=r"^(each )?exclusion.* pairs? of timezone-aware datetimes, got"):
        calculator.get_job_goodput_with_exclusions(intervals)


def test_exclusions_of_none_exclude_nothing(hand: Path):
    """As the reference: None for the exclusion intervals is none."""
    calculator = goodput.GoodputCalculator("hand", duckdb_path=hand)
    assert calculator.get_job_goodput_with_exclusions(None) == (  # type: ignore[arg-type]
        pytest.approx(200 / 3), {}, 130, 0.0)


# -- after a batch replay: one snapshot per run, and its raw events ----------------------------------


def replay_to(path: Path, batches: list[Batch], as_of_us: int,
              exclusions: tuple[tuple[int, int], ...] = ()) -> Path:
    """Writes what a batch replay of ``batches`` (``python -m pipeline --as_of --exclude``) writes:
    the run's one snapshot as of ``as_of_us``, ``exclusions`` left out, and its raw events."""
    state = engine.RunState("run")
    for batch in batches:
        state.add_batch(batch)
    snapshot = state.snapshot(as_of_us, exclusions=exclusions)
    assert snapshot is not None
    append(path, [*snapshot_rows(snapshot), *(element for batch in batches for element in batch_rows(batch))])
    return path


@pytest.fixture(scope="module")
def restarted() -> tuple[list[Batch], int]:
    """The messages of a run that crashed at T+309 s and restarted at T+369 s, and its end's time."""
    events, as_of_us = recorded("restarted")
    return [batch_of(message) for message in messages(events, 1000)], as_of_us


#: Intervals of the restarted run: one inside the first attempt, one over the outage and restart.
EXCLUDED = ((at(100), at(200)), (at(330), at(400)))


def test_exclusions_after_a_replay_are_exact(restarted: tuple[list[Batch], int], tmp_path: Path):
    """With one snapshot per run, exclusions give the figures a replay with --exclude writes."""
    batches, as_of_us = restarted
    replayed = replay_to(tmp_path / "replayed.duckdb", batches, as_of_us)
    excluded = replay_to(tmp_path / "excluded.duckdb", batches, as_of_us,
                         tuple((micros(start), micros(end)) for start, end in EXCLUDED))
    ours = goodput.GoodputCalculator("run", duckdb_path=replayed)
    theirs = goodput.GoodputCalculator("run", duckdb_path=excluded)
    goodput_pct, breakdown, max_step, excluded_s = ours.get_job_goodput_with_exclusions(EXCLUDED, True)
    assert (goodput_pct, breakdown, max_step) == theirs.get_job_goodput(True)
    assert excluded_s == pytest.approx(ours.get_job_goodput_details()["total_elapsed_time"]
                                       - theirs.get_job_goodput_details()["total_elapsed_time"])
    assert excluded_s == pytest.approx(170.0)  # both lie inside the run


def test_interval_after_a_replay_is_the_difference_at_its_bounds(restarted: tuple[list[Batch], int],
                                                                  tmp_path: Path):
    """With one snapshot per run, an interval is the difference of the run's figures exactly at its bounds."""
    batches, as_of_us = restarted
    replayed = replay_to(tmp_path / "replayed.duckdb", batches, as_of_us)
    calculator = goodput.GoodputCalculator("run", duckdb_path=replayed)
    at_bounds = []
    for bound in (at(100), at(400)):
        state = engine.RunState("run")
        for batch in batches:
            state.add_batch(batch)
        snapshot = state.snapshot(micros(bound))
        assert snapshot is not None
        at_bounds.append(snapshot.cumulative)
    first, last = at_bounds
    goodput_pct, _, _, total_s, disruptions = calculator.get_job_goodput_interval(at(100), at(400))
    assert total_s == pytest.approx(last.total_s - first.total_s) and disruptions == 1
    assert goodput_pct == pytest.approx(100 * (last.productive_s - first.productive_s) / total_s)


def test_exclusions_the_snapshots_do_not_bound_need_the_raw_events(hand: Path):
    """Without raw events, an exclusion no snapshot is close to raises ValueError saying how to
    have it exactly; never a figure of the whole run or of nothing."""
    calculator = goodput.GoodputCalculator("hand", duckdb_path=hand)
    with pytest.raises(ValueError, match=r"--no_raw_events.*--exclude=START/END"):
        calculator.get_job_goodput_with_exclusions([(at(20), at(50))])


def test_exact_exclusions_without_the_pipeline_name_the_replay(
        restarted: tuple[list[Batch], int], tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Where the pipeline's engine is not installed, ValueError says how to have the exact figures."""
    batches, as_of_us = restarted
    replayed = replay_to(tmp_path / "replayed.duckdb", batches, as_of_us)
    calculator = goodput.GoodputCalculator("run", duckdb_path=replayed)
    monkeypatch.setitem(sys.modules, "pipeline.core.engine", None)  # not importable
    with pytest.raises(ValueError, match=r"pip install fleet-goodput.*python -m pipeline .*--exclude=START/"):
        calculator.get_job_goodput_with_exclusions(EXCLUDED)


def step_start(attempt: str, seq: int, seconds: float, step: int) -> dict[str, Any]:
    return {"run_id": "hand", "attempt_id": attempt, "seq": seq, "event_time": at(seconds),
            "kind": "step_start", "step": step, "body": None}


@pytest.fixture
def stepped(hand: Path) -> Path:
    """The hand-made run with raw step starts: steps 0-4 (0 takes 5 s, then 2 s each), and a restart
    that runs step 3 again in 3 s and step 4 in 2 s; one message delivered twice."""
    database = DuckDBSink(hand)
    database.write("events", [
        step_start("a", 0, 10, 0), step_start("a", 1, 15, 1), step_start("a", 1, 15, 1),
        step_start("a", 2, 17, 2), step_start("a", 3, 19, 3), step_start("a", 4, 21, 4),
        {"run_id": "hand", "attempt_id": "b", "seq": 0, "event_time": at(30), "kind": "job_start",
         "step": None, "body": "{}"},
        step_start("b", 1, 40, 3), step_start("b", 2, 43, 4), step_start("b", 3, 45, 5)])
    database.close()
    return hand


def test_step_deviation_is_per_step_against_the_ideal(stepped: Path):
    """{step: |step time - ideal|}: the restart's step 3 replaces the first one's, in its place."""
    calculator = goodput.GoodputCalculator("hand", duckdb_path=stepped)
    deviations = calculator.get_step_deviation(configured_ideal_step_time=2.0)
    assert deviations == {0: 3.0, 1: 0.0, 2: 0.0, 3: 1.0, 4: 0.0} and list(deviations) == [0, 1, 2, 3, 4]
    # No configured one and none in the snapshots: computed as the reference does (2 s here).
    assert calculator.get_step_deviation() == deviations


def test_step_deviation_uses_the_snapshots_ideal_step_time(stepped: Path):
    """Without a configured ideal, the latest snapshot's (the pipeline's) is the baseline; the
    details carry the same deviations."""
    database = DuckDBSink(stepped)
    snapshot(database, 400, 300, 400, 1, 140, {"OTHER": 100}, ideal_step_time_s=2.5)
    database.close()
    calculator = goodput.GoodputCalculator("hand", duckdb_path=stepped)
    expected = {0: 2.5, 1: 0.5, 2: 0.5, 3: 0.5, 4: 0.5}
    assert calculator.get_step_deviation() == expected
    details = calculator.get_job_goodput_details()
    assert details["step_time_deviation"] == expected and details["ideal_step_time"] == 2.5


def test_step_deviation_without_step_starts_raises_value_error(hand: Path):
    """As the reference: no step times is a ValueError."""
    with pytest.raises(ValueError, match="No step times"):
        goodput.GoodputCalculator("hand", duckdb_path=hand).get_step_deviation()


@pytest.mark.parametrize(("ideal", "error"), [
    ("2.0", TypeError), (True, TypeError), (0, ValueError), (-2.0, ValueError), (math.nan, ValueError),
    (math.inf, ValueError)])
def test_step_deviation_takes_only_a_positive_ideal_step_time(stepped: Path, ideal: Any,
                                                              error: type[Exception]):
    """A configured ideal step time that is not a positive number of seconds raises a clear error
    (the reference answers deviations from a negative one)."""
    calculator = goodput.GoodputCalculator("hand", duckdb_path=stepped)
    with pytest.raises(error, match=r"^configured_ideal_step_time must be a (positive )?number of seconds"):
        calculator.get_step_deviation(ideal)


@pytest.fixture
def elastic(tmp_path: Path) -> Path:
    """An elastic run's snapshots at T+100 s and T+200 s, with slice efficiencies."""
    path = tmp_path / "elastic.duckdb"
    database = DuckDBSink(path)
    snapshot(database, 100, 50, 100, 0, 40, {"ELASTIC_SLICE_DOWN": 50}, run_id="elastic",
             stepping_slice_efficiency=0.5, available_slice_efficiency=0.8)
    snapshot(database, 200, 120, 200, 0, 90, {"ELASTIC_SLICE_DOWN": 80}, run_id="elastic",
             stepping_slice_efficiency=0.6, available_slice_efficiency=0.9)
    database.close()
    return path


def test_elastic_interval_details_weigh_the_slice_efficiencies(elastic: Path):
    """Over [T+150, T+250] (really T+100 to T+200): stepping (0.6·200 - 0.5·100) / 100 = 0.7."""
    calculator = goodput_elastic.ElasticGoodputCalculator("elastic", duckdb_path=elastic)
    details = calculator.get_interval_metric_details(at(150), at(250))
    assert details["interval_goodput"] == {goodput_utils.GoodputType.TOTAL: pytest.approx(70.0)}
    assert details["interval_badput"][BadputType.ELASTIC_SLICE_DOWN] == pytest.approx(30.0)
    assert details["stepping_slice_efficiency"] == pytest.approx(0.7)
    assert details["available_slice_efficiency"] == pytest.approx(1.0)
    cumulative = calculator.get_job_goodput_details()
    assert (cumulative["stepping_slice_efficiency"], cumulative["available_slice_efficiency"]) == (0.6, 0.9)


# -- goodput_utils ----------------------------------------------------------------------------------


def test_goodput_utils_has_the_references_public_names():
    """The reference's enums (names and values), result types and helpers are all there."""
    members = {
        goodput_utils.MetricType: [
            ("GOODPUT_TIME", "goodput_time"), ("BADPUT_TIME", "badput_time"),
            ("MAX_PRODUCTIVE_STEP", "max_productive_step"), ("TOTAL_ELAPSED_TIME", "total_elapsed_time"),
            ("DISRUPTION_COUNT", "disruption_count"), ("STEP_TIME_DEVIATION", "step_time_deviation"),
            ("IDEAL_STEP_TIME", "ideal_step_time"), ("TOTAL_EXCLUDED_TIME", "total_excluded_time")],
        goodput_utils.IntervalMetricType: [("INTERVAL_GOODPUT", "interval_goodput"),
                                           ("INTERVAL_BADPUT", "interval_badput"),
                                           ("INTERVAL_SIZE", "interval_size")],
        goodput_utils.GoodputType: [("TOTAL", 1)],
        goodput_utils.BadputType: list(zip(
            ["TPU_INITIALIZATION", "TRAINING_PREP", "PROGRAM_STARTUP", "DATA_LOADING_SYNC",
             "DATA_LOADING_ASYNC", "UNPRODUCTIVE_CHECKPOINT_SAVE_TIME",
             "UNPRODUCTIVE_CHECKPOINT_RESTORE_TIME",
             "WASTED_PROGRESS_FROM_DISRUPTION", "INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION",
             "CUSTOM_BADPUT_EVENTS", "OTHER", "ELASTIC_SLICE_DOWN", "ELASTIC_SCALE_UP",
             "ELASTIC_REINITIALIZATION"], range(1, 15), strict=True)),
        goodput_utils.MonitoringWindowType: [("CUMULATIVE", "cumulative"), ("INTERVAL", "interval")],
    }
    for enum_type, expected in members.items():
        assert [(m.name, m.value) for m in enum_type] == expected
    cumulative = [m.value for m in goodput_utils.MetricType]
    interval = [m.value for m in goodput_utils.IntervalMetricType]
    efficiencies = ["stepping_slice_efficiency", "available_slice_efficiency"]
    keys = {
        goodput_utils.WorkloadMetricDetails: cumulative,
        goodput_utils.IntervalWorkloadMetricDetails: interval,
        goodput_utils.ElasticWorkloadMetricDetails: cumulative + efficiencies,
        goodput_utils.ElasticIntervalWorkloadMetricDetails: interval + efficiencies,
    }
    for typed_dict, names in keys.items():
        assert list(typed_dict.__annotations__) == names
    assert goodput_utils.GCPOptions() == goodput_utils.GCPOptions(None, None, "0", None, None, True, True)
    assert goodput_utils.ACTIVITY_EXCLUSION_LIST == ["DATA_LOADING_ASYNC"]
    assert monitoring.GCPOptions is goodput_utils.GCPOptions
    assert goodput.BadputType is goodput_utils.BadputType and goodput.GoodputType is goodput_utils.GoodputType
    for helper in ("compute_ideal_step_time", "compute_step_deviation_from_baseline", "compute_percentile",
                   "get_anomalous_and_normal_step_times", "get_extra_time_from_anomalous_steps",
                   "get_timestamp_from_log_entry"):
        assert callable(getattr(goodput_utils, helper))


def test_percentile_interpolates_between_ranks():
    """The reference's percentile: linear between the closest ranks, 0.0 for nothing."""
    assert goodput_utils.compute_percentile([4.0, 1.0, 3.0, 2.0], 90) == pytest.approx(3.7)
    assert goodput_utils.compute_percentile([5.0], 50) == 5.0
    assert goodput_utils.compute_percentile([], 90) == 0.0


def test_ideal_step_time_drops_short_steps_and_high_outliers():
    """Steps under 1 s are ignored; those above median + 3 MAD are left out of the mean."""
    # Kept: 2, 2, 3, 2, 20; median 2, MAD 0, so 3 and 20 are outliers: the mean of 2, 2, 2.
    assert goodput_utils.compute_ideal_step_time([0.5, 2.0, 2.0, 3.0, 2.0, 20.0]) == 2.0
    assert goodput_utils.compute_ideal_step_time([1.0, 2.0, 3.0]) == 2.0  # MAD 1: nothing dropped
    assert goodput_utils.compute_ideal_step_time([0.2, 0.3]) is None


def test_step_deviation_from_baseline_follows_the_references_windows():
    """Mean below 100 steps; p90 of the last 100; less the median of the 1,000 before, once there."""
    few = {step: float(step % 3) for step in range(10)}
    assert goodput_utils.compute_step_deviation_from_baseline(few) == pytest.approx(0.9)
    recent = {step: float(step) for step in range(100)}  # p90 of 0..99 is 89.1
    assert goodput_utils.compute_step_deviation_from_baseline(recent) == pytest.approx(89.1)
    history = {step: 1.0 for step in range(1000)} | {1000 + step: float(step) for step in range(100)}
    assert goodput_utils.compute_step_deviation_from_baseline(history) == pytest.approx(88.1)
    assert goodput_utils.compute_step_deviation_from_baseline(
        history, goodput_utils.MonitoringWindowType.INTERVAL) == pytest.approx(89.1)
    assert goodput_utils.compute_step_deviation_from_baseline({}) == 0.0


@pytest.mark.parametrize(("call", "error", "message"), [
    (lambda: goodput_utils.compute_percentile([1.0, 2.0], 150), ValueError, "from 0 to 100, got 150"),
    (lambda: goodput_utils.compute_percentile([1.0, 2.0], -50), ValueError, "from 0 to 100, got -50"),
    (lambda: goodput_utils.compute_percentile([1.0, 2.0], "90"), TypeError, "number from 0 to 100, got str"),
    (lambda: goodput_utils.compute_step_deviation_from_baseline([1.0, 2.0]), TypeError, "mapping"),
    (lambda: goodput_utils.compute_step_deviation_from_baseline({1: 1.0}, recent_window_size=0), ValueError,
     "recent_window_size must be a positive whole number"),
    (lambda: goodput_utils.compute_step_deviation_from_baseline({1: 1.0}, baseline_window_size=-5),
     ValueError, "baseline_window_size must be a positive whole number"),
    (lambda: goodput_utils.get_timestamp_from_log_entry(None), TypeError, "log payload"),
], ids=["percentile-above", "percentile-below", "percentile-text", "deviations-list", "recent-window-0",
        "baseline-window-negative", "entry-none"])
def test_goodput_utils_refuse_arguments_out_of_range_clearly(call: Callable[[], Any], error: type[Exception],
                                                             message: str):
    """An argument out of range or of the wrong type raises a clear ValueError or TypeError, never
    an IndexError, AttributeError or a figure of the wrong steps."""
    with pytest.raises(error, match=message):
        call()


def test_anomalous_steps_of_no_steps_are_none():
    """As the reference: no step times have no anomalous or normal ones, and NaN extra time."""
    assert goodput_utils.get_anomalous_and_normal_step_times([]) == ([], [])
    assert math.isnan(goodput_utils.get_extra_time_from_anomalous_steps([]))


# -- BigQuery ---------------------------------------------------------------------------------------


# DuckDB's column types as the BigQuery API names them in a query response's schema.
BIGQUERY_TYPES = {"VARCHAR": "STRING", "BIGINT": "INTEGER", "DOUBLE": "FLOAT", "BOOLEAN": "BOOLEAN",
                  "TIMESTAMP": "TIMESTAMP"}


class QueryStandIn(BaseHTTPRequestHandler):
    """Serves BigQuery's ``jobs.query`` over a DuckDB file, for the real client.

    The project's BigQuery stand-in serves tables and insertAll, not queries, so this one answers
    the one request ``Client.query_and_wait`` sends: the SQL must parse as BigQuery's dialect
    (sqlglot transpiles it), every value must arrive as a typed query parameter, and the rows go
    back in the API's format for the client to convert.
    """

    database: Path
    requests: list[dict[str, Any]]
    def log_message(self, format: str, *args: Any) -> None:
        """Quiet."""

    def do_POST(self) -> None:
        request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.requests.append(request)
        parameters = {p["name"]: self._value(p["parameterType"]["type"], p["parameterValue"]["value"])
                      for p in request.get("queryParameters", [])}
        sql = re.sub(r"`[a-z0-9-]+\.[a-z0-9_]+\.([a-z_]+)`", r"\1", request["query"])
        with duckdb.connect(str(self.database), read_only=True) as connection:
            local = sqlglot.transpile(sql, read="bigquery", write="duckdb")[0]
            try:
                cursor = connection.execute(local, parameters)
            except duckdb.CatalogException as error:  # as BigQuery answers for a missing table
                message = f"Not found: {str(error).splitlines()[0]}"
                self._reply(404, {"error": {"code": 404, "message": message, "status": "NOT_FOUND",
                                            "errors": [{"message": message, "reason": "notFound"}]}})
                return
            fields = [{"name": d[0], "type": BIGQUERY_TYPES[str(d[1])], "mode": "NULLABLE"}
                      for d in cursor.description]
            rows = [{"f": [{"v": self._cell(v)} for v in row]} for row in cursor.fetchall()]
        self._reply(200, {"kind": "bigquery#queryResponse", "jobComplete": True, "rows": rows,
                          "totalRows": str(len(rows)), "schema": {"fields": fields}})

    def _reply(self, status: int, answer: dict[str, Any]) -> None:
        body = json.dumps(answer).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    @staticmethod
    def _value(kind: str, text: str) -> Any:
        if kind == "TIMESTAMP":
            return datetime.datetime.fromisoformat(text).astimezone(UTC).replace(tzinfo=None)
        return {"INT64": int, "FLOAT64": float, "STRING": str}[kind](text)

    @staticmethod
    def _cell(value: Any) -> str | None:
        if value is None:
            return None
        if isinstance(value, datetime.datetime):  # useInt64Timestamp: microseconds
            return str((value.replace(tzinfo=UTC) - datetime.datetime(1970, 1, 1, tzinfo=UTC))
                       // datetime.timedelta(microseconds=1))
        return str(value).lower() if isinstance(value, bool) else str(value)


@pytest.fixture
def bigquery_client(hand: Path) -> Iterator[tuple[Any, list[dict[str, Any]]]]:
    """The real BigQuery client, pointed at a jobs.query stand-in over the hand-written snapshots."""
    with query_stand_in(hand) as client_and_requests:
        yield client_and_requests


@contextlib.contextmanager
def query_stand_in(database: Path) -> Iterator[tuple[Any, list[dict[str, Any]]]]:
    """The real BigQuery client, pointed at a jobs.query stand-in over ``database``; and the
    requests it sent."""
    from google.api_core.client_options import ClientOptions
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import bigquery

    requests: list[dict[str, Any]] = []
    handler = type("Handler", (QueryStandIn,), {"database": database, "requests": requests})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield bigquery.Client(project="goodput-local", credentials=AnonymousCredentials(),
                              client_options=ClientOptions(
                                  api_endpoint=f"http://127.0.0.1:{server.server_address[1]}")), requests
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def test_bigquery_dataset_is_read_with_parameterized_queries(hand: Path, bigquery_client: Any):
    """Through the real client, the same answers from BigQuery as from DuckDB, every value a parameter."""
    client, requests = bigquery_client
    calculator = goodput.GoodputCalculator("hand", bigquery_dataset="goodput-local.goodput",
                                           bigquery_client=client)
    local = goodput.GoodputCalculator("hand", duckdb_path=hand)
    assert calculator.get_job_goodput(True) == local.get_job_goodput(True)
    assert calculator.get_job_goodput_interval(at(150), at(250)) == local.get_job_goodput_interval(
        at(150), at(250))
    assert calculator.get_job_goodput_details() == local.get_job_goodput_details()
    for request in requests:
        assert "`goodput-local.goodput." in request["query"] and "hand" not in request["query"]
        assert request["useLegacySql"] is False
        assert {"name": "run_id", "parameterType": {"type": "STRING"},
                "parameterValue": {"value": "hand"}} in request["queryParameters"]
    hostile = goodput.GoodputCalculator("x' OR '1'='1", bigquery_dataset="goodput-local:goodput",
                                        bigquery_client=client)
    with pytest.raises(ValueError, match="no goodput snapshot"):
        hostile.get_job_goodput()
    with pytest.raises(ValueError, match=r"PROJECT\.DATASET"):
        goodput.GoodputCalculator("hand", bigquery_dataset="p.d`; DROP TABLE x; --")


def test_bigquery_answers_the_new_methods_as_duckdb(stepped: Path, bigquery_client: Any):
    """Step deviation, interval details and exclusions: the same from BigQuery as from DuckDB."""
    client, requests = bigquery_client
    remote = goodput.GoodputCalculator("hand", bigquery_dataset="goodput-local.goodput",
                                       bigquery_client=client)
    local = goodput.GoodputCalculator("hand", duckdb_path=stepped)
    expected = {0: 3.0, 1: 0.0, 2: 0.0, 3: 1.0, 4: 0.0}
    assert remote.get_step_deviation() == local.get_step_deviation() == expected
    assert remote.get_interval_metric_details(at(150), at(250)) == local.get_interval_metric_details(
        at(150), at(250))
    exclusions = [(at(150), at(250))]
    assert remote.get_job_goodput_with_exclusions(exclusions, True) == local.get_job_goodput_with_exclusions(
        exclusions, True)
    assert all("hand" not in request["query"] and request["queryParameters"] for request in requests)


def test_a_bigquery_client_that_is_not_one_is_a_type_error():
    """A bigquery_client without the client's query method raises TypeError at construction, not
    an AttributeError from the first query."""
    with pytest.raises(TypeError, match=r"^bigquery_client must be a google\.cloud\.bigquery\.Client, got"):
        goodput.GoodputCalculator("hand", bigquery_dataset="goodput-local.goodput", bigquery_client="client")


def test_a_dataset_without_the_pipelines_tables_is_a_value_error(tmp_path: Path):
    """A BigQuery dataset that lacks the pipeline's tables (BigQuery's 404) raises a clear ValueError."""
    empty = tmp_path / "empty.duckdb"
    duckdb.connect(str(empty)).close()
    with query_stand_in(empty) as (client, _):
        calculator = goodput.GoodputCalculator("hand", bigquery_dataset="goodput-local.goodput",
                                               bigquery_client=client)
        with pytest.raises(ValueError, match=r"^BigQuery dataset goodput-local\.goodput does not hold the "
                                             r"pipeline's tables.*goodput_snapshots"):
            calculator.get_job_goodput()


# -- the DuckDB file ----------------------------------------------------------------------------------


def test_a_missing_duckdb_file_is_a_value_error_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A DuckDB file that does not exist, given or in $GOODPUT_DUCKDB, raises ValueError without
    waiting, and is not created."""
    monkeypatch.setenv(goodput.DUCKDB_ENV, str(tmp_path / "from-env.duckdb"))
    for calculator in (goodput.GoodputCalculator("hand", duckdb_path=tmp_path / "nope.duckdb"),
                       goodput.GoodputCalculator("hand")):
        started = time.monotonic()
        with pytest.raises(ValueError, match=r"^no DuckDB file .*duckdb'"):
            calculator.get_job_goodput()
        assert time.monotonic() - started < 2.5  # the wait for a lock is 5 s
    assert list(tmp_path.iterdir()) == []


def other_tables(path: Path) -> None:
    duckdb.connect(str(path)).execute("CREATE TABLE other (a INTEGER)").close()


@pytest.mark.parametrize(("make", "why"), [
    (other_tables, "does not hold the pipeline's tables"),
    (lambda path: path.write_text("not a database"), "cannot read .* as the pipeline's DuckDB file"),
    (lambda path: path.write_bytes(b""), "cannot read .* as the pipeline's DuckDB file"),
    (lambda path: path.mkdir(), "no DuckDB file"),
], ids=["other-tables", "text", "empty", "directory"])
def test_a_file_that_is_not_the_pipelines_is_a_value_error_at_once(tmp_path: Path,
                                                                   make: Callable[[Path], Any], why: str):
    """A path that is not a DuckDB file the pipeline wrote raises a one-line ValueError without waiting."""
    path = tmp_path / "goodput.duckdb"
    make(path)
    started = time.monotonic()
    with pytest.raises(ValueError, match=why) as raised:
        goodput.GoodputCalculator("hand", duckdb_path=path).get_job_goodput()
    assert time.monotonic() - started < 2.5 and "\n" not in str(raised.value)


def test_a_file_another_process_holds_is_waited_for(hand: Path):
    """While another process holds the file's lock (the pipeline appending), a query waits, then answers."""
    holder = subprocess.Popen(
        [sys.executable, "-c", "import duckdb, sys, time\nconnection = duckdb.connect(sys.argv[1])\n"
         "print('held', flush=True)\ntime.sleep(1.0)\nconnection.close()", str(hand)],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        goodput_pct, _, max_step = goodput.GoodputCalculator("hand", duckdb_path=hand).get_job_goodput()
    finally:
        assert holder.wait(timeout=30) == 0
    assert (goodput_pct, max_step) == (pytest.approx(200 / 3), 130)


# -- the monitor ------------------------------------------------------------------------------------


MONITOR_LOGGER = "ml_goodput_measurement.src.monitoring"
#: The reference's TensorBoard tags for the hand-made run's breakdown (every bucket, custom nested).
BADPUT_TAGS = [f"badput/{name}" for name in (
    "tpu_initialization", "training_prep", "data_loading_sync", "data_loading_async",
    "unproductive_checkpoint_save_time", "unproductive_checkpoint_restore_time", "program_startup",
    "wasted_progress_from_disruption", "infrastructure_recovery_from_disruption",
    "custom_badput_events/eval", "other")]


def scalars(logdir: Path) -> dict[str, list[tuple[int, float]]]:
    """The scalars TensorBoard reads from a directory: {tag: [(step, value)]}."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(logdir))
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def uploader_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("goodput-")]


def wait_until(condition: Callable[[], bool], timeout_s: float = 10.0) -> bool:
    """Polls ``condition`` until it holds, for at most ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_monitor_writes_the_references_scalars_and_stops_promptly(stepped: Path, tmp_path: Path):
    """Stopping both uploaders flushes goodput, every badput bucket and step deviation to
    <tensorboard_dir>/goodput at once, and leaves no thread."""
    monitor = monitoring.GoodputMonitor(
        "hand", "goodput_hand", str(tmp_path / "tb"), 3600, monitoring_enabled=True,
        include_badput_breakdown=True, include_step_deviation=True, step_deviation_interval_seconds=3600,
        duckdb_path=stepped)
    monitor.start_goodput_uploader()
    monitor.start_step_deviation_uploader()
    assert len(uploader_threads()) == 2 and all(t.daemon for t in uploader_threads())
    started = time.monotonic()
    monitor.stop_step_deviation_uploader()
    monitor.stop_goodput_uploader()
    assert time.monotonic() - started < 5 and uploader_threads() == []
    written = scalars(tmp_path / "tb" / "goodput")
    assert sorted(written) == sorted(["goodput/goodput", *BADPUT_TAGS, "step_deviation"])
    assert written["goodput/goodput"] == [(130, pytest.approx(200 / 3))]
    assert written["badput/custom_badput_events/eval"] == [(130, pytest.approx(25 / 3))]
    assert written["badput/tpu_initialization"] == [(130, pytest.approx(10.0))]
    assert written["step_deviation"] == [(0, 3.0), (1, 0.0), (2, 0.0), (3, 1.0), (4, 0.0)]


def test_monitor_uploads_every_interval(stepped: Path, tmp_path: Path):
    """A running uploader writes on its interval, without a stop; a stop that skips the final
    flush returns at once."""
    monitor = monitoring.GoodputMonitor("hand", "goodput_hand", str(tmp_path / "tb"), 0.05,
                                        monitoring_enabled=True, duckdb_path=stepped)
    monitor.start_goodput_uploader()
    try:
        assert wait_until(lambda: (tmp_path / "tb" / "goodput").is_dir()
                          and "goodput/goodput" in scalars(tmp_path / "tb" / "goodput"))
    finally:
        started = time.monotonic()
        monitor.stop_goodput_uploader(skip_final_flush=True)
    assert time.monotonic() - started < 5 and uploader_threads() == []
    assert scalars(tmp_path / "tb" / "goodput") == {"goodput/goodput": [(130, pytest.approx(200 / 3))]}


def test_monitor_waits_quietly_for_a_runs_first_snapshot(hand: Path, tmp_path: Path,
                                                         caplog: pytest.LogCaptureFixture,
                                                         monkeypatch: pytest.MonkeyPatch):
    """A run with no snapshot yet is polled on: one INFO line, no error, nothing written."""
    polled = threading.Semaphore(0)
    original = goodput.GoodputCalculator.get_job_goodput

    def counted(self: goodput.GoodputCalculator, *args: Any, **kwargs: Any) -> Any:
        polled.release()
        return original(self, *args, **kwargs)

    monkeypatch.setattr(goodput.GoodputCalculator, "get_job_goodput", counted)
    monitor = monitoring.GoodputMonitor("not-yet", "goodput_not_yet", str(tmp_path / "tb"), 1,
                                        monitoring_enabled=True, duckdb_path=hand)
    with caplog.at_level(logging.DEBUG, logger=MONITOR_LOGGER):
        monitor.start_goodput_uploader()
        try:
            assert all(polled.acquire(timeout=10) for _ in range(3))
        finally:
            monitor.stop_goodput_uploader(skip_final_flush=True)
    records = [r for r in caplog.records
               if r.name == MONITOR_LOGGER and "no goodput snapshot" in r.getMessage()]
    assert len(records) >= 3 and [r.levelname for r in records if r.levelno > logging.DEBUG] == ["INFO"]
    assert not (tmp_path / "tb").exists() and uploader_threads() == []


def test_monitor_stop_without_start_writes_once(hand: Path, tmp_path: Path):
    """As the reference: stopping an uploader that never ran does one bounded final write."""
    monitor = monitoring.GoodputMonitor("hand", "goodput_hand", str(tmp_path / "tb"), 30,
                                        monitoring_enabled=True, duckdb_path=hand)
    monitor.stop_goodput_uploader()
    assert scalars(tmp_path / "tb" / "goodput") == {"goodput/goodput": [(130, pytest.approx(200 / 3))]}
    monitor.stop_step_deviation_uploader()  # include_step_deviation is off: nothing
    assert uploader_threads() == []


@pytest.mark.parametrize(("arguments", "why"), [
    ({"tensorboard_dir": "", "monitoring_enabled": True}, "central"),
    ({"tensorboard_dir": "/nonexistent/tb", "monitoring_enabled": False}, "disabled"),
], ids=["no-tensorboard-dir", "disabled"])
def test_monitor_without_tensorboard_dir_starts_nothing_and_logs_once(
        arguments: dict[str, Any], why: str, caplog: pytest.LogCaptureFixture, capsys: Any):
    """Every start and stop returns at once, starts no process or thread, and one INFO line says why."""
    threads = set(threading.enumerate())  # other tests' threads may end meanwhile: only new ones count
    monitor = monitoring.GoodputMonitor(
        job_name="run", logger_name="goodput_run", upload_interval=30, include_badput_breakdown=True,
        include_step_deviation=True, configured_ideal_step_time=1.5,
        gcp_options=monitoring.GCPOptions(project_id="p"), **arguments)
    with caplog.at_level(logging.INFO, logger=MONITOR_LOGGER):
        monitor.start_goodput_uploader()
        monitor.start_step_deviation_uploader()
        monitor.start_rolling_window_goodput_uploader([60, 300])
        monitor.stop_rolling_window_goodput_uploader()
        monitor.stop_step_deviation_uploader(skip_final_flush=True)
        monitor.stop_goodput_uploader()
    assert set(threading.enumerate()) <= threads and multiprocessing.active_children() == []
    messages = [r for r in caplog.records if r.name == MONITOR_LOGGER]
    assert len(messages) == 1 and messages[0].levelname == "INFO" and why in messages[0].getMessage()
    assert capsys.readouterr() == ("", "")
    assert not Path("/nonexistent/tb").exists()


def test_monitor_without_tables_warns_once(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                           monkeypatch: pytest.MonkeyPatch):
    """With a tensorboard_dir but no tables to read, one WARNING says so and nothing starts."""
    monkeypatch.delenv(goodput.DUCKDB_ENV, raising=False)
    monkeypatch.delenv(goodput.BIGQUERY_DATASET_ENV, raising=False)
    monitor = monitoring.GoodputMonitor("run", "goodput_run", str(tmp_path / "tb"), 30,
                                        monitoring_enabled=True)
    with caplog.at_level(logging.INFO, logger=MONITOR_LOGGER):
        monitor.start_goodput_uploader()
        monitor.stop_goodput_uploader()
    messages = [r for r in caplog.records if r.name == MONITOR_LOGGER]
    assert [r.levelname for r in messages] == ["WARNING"] and "duckdb_path" in messages[0].getMessage()
    assert uploader_threads() == [] and not (tmp_path / "tb").exists()


def test_rolling_window_uploader_writes_nothing_to_tensorboard(hand: Path, tmp_path: Path,
                                                               caplog: pytest.LogCaptureFixture):
    """As the reference, rolling windows go to Cloud Monitoring only (the pipeline's): no thread."""
    monitor = monitoring.GoodputMonitor("hand", "goodput_hand", str(tmp_path / "tb"), 30,
                                        monitoring_enabled=True, duckdb_path=hand)
    with caplog.at_level(logging.INFO, logger=MONITOR_LOGGER):
        monitor.start_rolling_window_goodput_uploader([60, 300])
        monitor.stop_rolling_window_goodput_uploader()
    assert uploader_threads() == [] and not (tmp_path / "tb").exists()
    assert monitor.rolling_windows_seconds == [60, 300]
    assert any("Cloud Monitoring" in r.getMessage() for r in caplog.records if r.name == MONITOR_LOGGER)


def test_elastic_monitor_writes_the_elastic_buckets(elastic: Path, tmp_path: Path):
    """The elastic monitor reads through the elastic calculator: its buckets become badput scalars."""
    monitor = monitoring_elastic.ElasticGoodputMonitor(
        "elastic", "goodput_elastic", str(tmp_path / "tb"), 3600, monitoring_enabled=True,
        include_badput_breakdown=True, include_slice_efficiency=True, duckdb_path=elastic)
    assert monitor.pathway_enabled and monitor.include_slice_efficiency
    monitor.start_goodput_uploader()
    monitor.stop_goodput_uploader()
    written = scalars(tmp_path / "tb" / "goodput")
    assert written["badput/elastic_slice_down"] == [(90, pytest.approx(40.0))]
    assert {"badput/elastic_scale_up", "badput/elastic_reinitialization"} <= set(written)


@pytest.fixture
def polls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The calculator methods the monitor's uploaders call, by name, as they call them."""
    made: list[str] = []
    for name in ("get_job_goodput", "get_step_deviation"):
        original = getattr(goodput.GoodputCalculator, name)

        def counted(self: goodput.GoodputCalculator, *args: Any, _original: Any = original, _name: str = name,
                    **kwargs: Any) -> Any:
            made.append(_name)
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(goodput.GoodputCalculator, name, counted)
    return made


#: Intervals the reference's monitor takes, and its worker then fails on or spins with.
ODD_INTERVALS = {"zero": 0, "negative": -5, "NaN": math.nan, "text": "often", "infinite": math.inf,
                 "list": [60]}
#: Each interval argument: the uploader's start and stop, and the calculator method it polls.
UPLOADERS = {"upload_interval": ("start_goodput_uploader", "stop_goodput_uploader", "get_job_goodput"),
             "step_deviation_interval_seconds": ("start_step_deviation_uploader",
                                                 "stop_step_deviation_uploader", "get_step_deviation")}


MONITORS = {"monitor": monitoring.GoodputMonitor, "elastic": monitoring_elastic.ElasticGoodputMonitor}


@pytest.mark.parametrize("monitor_class", MONITORS.values(), ids=list(MONITORS))
@pytest.mark.parametrize("argument", list(UPLOADERS))
@pytest.mark.parametrize("interval", ODD_INTERVALS.values(), ids=list(ODD_INTERVALS))
def test_monitor_neither_dies_nor_spins_on_an_odd_interval(
        stepped: Path, tmp_path: Path, polls: list[str], monitor_class: type[monitoring.GoodputMonitor],
        argument: str, interval: Any):
    """An interval the reference takes but cannot wait on keeps the uploader alive, polling at most
    once a second, and its stop still writes once."""
    start, stop, method = UPLOADERS[argument]
    intervals = {"upload_interval": 3600, "step_deviation_interval_seconds": 3600, argument: interval}
    monitor = monitor_class("hand", "goodput_hand", str(tmp_path / "tb"), monitoring_enabled=True,
                            include_step_deviation=True, duckdb_path=stepped, **intervals)
    getattr(monitor, start)()
    try:
        time.sleep(0.3)  # a bounded look at the uploader: the polls it makes meanwhile are its rate
        alive = [thread.is_alive() for thread in uploader_threads()]
        polled = polls.count(method)
    finally:
        getattr(monitor, stop)()
    assert alive == [True] and polled <= 1
    assert polls.count(method) == polled + 1 and uploader_threads() == []


def test_monitor_takes_an_interval_given_as_text_as_its_number(hand: Path, tmp_path: Path, polls: list[str],
                                                                caplog: pytest.LogCaptureFixture):
    """upload_interval="1" polls every second, as 1 does, and says so once."""
    monitor = monitoring.GoodputMonitor("hand", "goodput_hand", str(tmp_path / "tb"), "1",  # type: ignore[arg-type]
                                        monitoring_enabled=True, duckdb_path=hand)
    with caplog.at_level(logging.INFO, logger=MONITOR_LOGGER):
        monitor.start_goodput_uploader()
        try:
            assert wait_until(lambda: polls.count("get_job_goodput") >= 2)
            assert [thread.is_alive() for thread in uploader_threads()] == [True]
        finally:
            monitor.stop_goodput_uploader(skip_final_flush=True)
    said = [r for r in caplog.records if r.name == MONITOR_LOGGER and "upload_interval='1'" in r.getMessage()]
    assert [r.levelname for r in said] == ["INFO"] and "every 1 s" in said[0].getMessage()


@pytest.mark.parametrize("timeout", ["5", "soon"])
def test_monitor_stop_takes_a_final_flush_timeout_the_reference_takes(hand: Path, tmp_path: Path,
                                                                      timeout: str):
    """A final_flush_timeout_seconds given as text (a number, or not one: the default) bounds the
    final write; the stop writes and raises nothing."""
    monitor = monitoring.GoodputMonitor("hand", "goodput_hand", str(tmp_path / "tb"), 3600,
                                        monitoring_enabled=True, final_flush_timeout_seconds=timeout,  # type: ignore[arg-type]
                                        duckdb_path=hand)
    monitor.start_goodput_uploader()
    monitor.stop_goodput_uploader()
    assert scalars(tmp_path / "tb" / "goodput") == {"goodput/goodput": [(130, pytest.approx(200 / 3))]}
    assert uploader_threads() == []


@pytest.mark.parametrize(("ideal", "expected"), [
    ("2.5", {0: 2.5, 1: 0.5, 2: 0.5, 3: 0.5, 4: 0.5}),  # its number
    ("fast", {0: 3.0, 1: 0.0, 2: 0.0, 3: 1.0, 4: 0.0}),  # not one: the run's own, 2 s
], ids=["number", "not-a-number"])
def test_monitor_takes_an_ideal_step_time_given_as_text(stepped: Path, tmp_path: Path, ideal: str,
                                                       expected: dict[int, float]):
    """A configured_ideal_step_time given as text is its number, or, if it is none, the run's own."""
    monitor = monitoring.GoodputMonitor("hand", "goodput_hand", str(tmp_path / "tb"), 3600,
                                        monitoring_enabled=True, include_step_deviation=True,
                                        configured_ideal_step_time=ideal, duckdb_path=stepped)  # type: ignore[arg-type]
    monitor.stop_step_deviation_uploader()  # none ran: one final write
    assert scalars(tmp_path / "tb" / "goodput") == {
        "step_deviation": [(step, pytest.approx(value)) for step, value in expected.items()]}


def test_monitor_raises_nothing_for_what_the_references_takes(hand: Path, tmp_path: Path):
    """As the reference's: a disabled monitor takes a tensorboard_dir that is not a path, and rolling
    windows that are not a list start nothing."""
    disabled = monitoring.GoodputMonitor("run", "goodput_run", 123, 30)  # type: ignore[arg-type]
    disabled.start_goodput_uploader()
    disabled.stop_goodput_uploader()
    monitor = monitoring.GoodputMonitor("hand", "goodput_hand", str(tmp_path / "tb"), 30,
                                        monitoring_enabled=True, duckdb_path=hand)
    monitor.start_rolling_window_goodput_uploader(None)  # type: ignore[arg-type]
    monitor.stop_rolling_window_goodput_uploader()
    assert monitor.rolling_windows_seconds == [] and uploader_threads() == []


# -- the swap is one import -------------------------------------------------------------------------


def parameters(function: Any) -> list[str]:
    """The parameters a reference call can pass: ours may add keyword-only ones after them (where
    to read the tables), which no reference call names, and take what it does not (logged)."""
    return [name for name, parameter in inspect.signature(function).parameters.items()
            if name != "self" and parameter.kind not in (
                inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.VAR_POSITIONAL,
                inspect.Parameter.VAR_KEYWORD)]


@pytest.mark.parametrize("dotted", [
    "goodput.GoodputCalculator.get_job_goodput",
    "goodput.GoodputCalculator.get_job_goodput_interval",
    "goodput.GoodputCalculator.get_job_goodput_details",
    "goodput.GoodputCalculator.get_step_deviation",
    "goodput.GoodputCalculator.get_interval_metric_details",
    "goodput.GoodputCalculator.get_job_goodput_with_exclusions",
    "goodput.GoodputRecorder.__init__",
    "goodput.GoodputRecorder.record_job_start_time",
    "goodput.GoodputRecorder.record_job_end_time",
    "goodput.GoodputRecorder.record_step_start_time",
    "goodput.GoodputRecorder.record_custom_badput_event_start_time",
    "goodput_elastic.ElasticGoodputRecorder.record_elastic_slice_counts",
    "monitoring.GoodputMonitor.__init__",
    "monitoring.GoodputMonitor.start_rolling_window_goodput_uploader",
    "monitoring.GoodputMonitor.stop_goodput_uploader",
    "monitoring.GoodputMonitor.start_step_deviation_uploader",
    "monitoring.GoodputMonitor.stop_step_deviation_uploader",
    "monitoring_elastic.ElasticGoodputMonitor.__init__",
    "goodput_utils.GCPOptions.__init__",
])
def test_signatures_are_the_references(dotted: str):
    """The entry points a user calls take the reference's parameters, in its order."""
    import importlib

    from support.reference import reference

    module, *attributes = dotted.split(".")
    ours: Any = importlib.import_module(f"ml_goodput_measurement.src.{module}")
    for attribute in attributes:
        ours = getattr(ours, attribute)
    signature = [p for p in reference().parameters(dotted) if p["name"] != "self"]
    assert parameters(ours) == [p["name"] for p in signature if p["kind"] != "KEYWORD_ONLY"]
    keywords = {name for name, p in inspect.signature(ours).parameters.items()
                if p.kind is inspect.Parameter.KEYWORD_ONLY}
    assert keywords >= {p["name"] for p in signature if p["kind"] == "KEYWORD_ONLY"}


def test_calculator_takes_the_reference_constructor_arguments_first():
    """GoodputCalculator's positional parameters are the reference's; where to read comes after."""
    from support.reference import reference

    theirs = [p["name"] for p in reference().parameters("goodput.GoodputCalculator.__init__")
              if p["name"] != "self"]
    assert parameters(goodput.GoodputCalculator.__init__)[:len(theirs)] == theirs


@pytest.mark.parametrize("name", ["BadputType", "GoodputType", "MetricType", "IntervalMetricType",
                                  "MonitoringWindowType"])
def test_enums_have_the_references_names_and_values(name: str):
    """goodput_utils' enums: the same members with the same values."""
    from support.reference import reference

    ours = getattr(goodput_utils, name)
    theirs = reference().members(f"goodput_utils.{name}")
    assert [(m.name, m.value) for m in ours] == [(member, value) for member, value in theirs]


def test_reads_a_file_this_process_is_writing(tmp_path: Path):
    """A calculator in the process that holds the DuckDB file open (a sink) still reads it."""
    sink = DuckDBSink(tmp_path / "open.duckdb")
    try:
        snapshot(sink, 100, 50, 100, 0, 40, {"OTHER": 50})
        goodput_pct, _, max_step = goodput.GoodputCalculator(
            "hand", duckdb_path=tmp_path / "open.duckdb").get_job_goodput()
    finally:
        sink.close()
    assert (goodput_pct, max_step) == (pytest.approx(50.0), 40)
