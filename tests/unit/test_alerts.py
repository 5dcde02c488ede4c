"""The alert policies of terraform/monitoring.tf replayed on snapshot histories (pipeline.app.alerts)."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import duckdb
import pytest

from pipeline.app import alerts
from pipeline.app.alerts import ANOMALY_POLICIES, POLICIES, Alert, AlertThresholds, evaluate, evaluate_file
from pipeline.core.detect import ANOMALY_KINDS, HANG, SLOWDOWN, STRAGGLER
from support.history import REPO, at, goodput_row, write_rows

TERRAFORM = REPO / "terraform"


def terraform_defaults() -> dict[str, Any]:
    """Every variable's default in terraform/variables.tf that is a number or a list of numbers or
    of plain strings."""
    defaults = {}
    for name, body in re.findall(r'^variable "(\w+)" \{\n(.*?)^\}', (TERRAFORM / "variables.tf").read_text(),
                                 re.M | re.S):
        match = re.search(r"^\s*default\s*=\s*(.+?)\s*$", body, re.M)
        if match and re.fullmatch(r'[\d.]+|\[[\d., ]*\]|\[[\w", ]*\]', match.group(1)):
            defaults[name] = json.loads(match.group(1))
    return defaults


def policy(resource: str) -> str:
    """The body of one google_monitoring_alert_policy in terraform/monitoring.tf."""
    text = (TERRAFORM / "monitoring.tf").read_text()
    pattern = rf'^resource "google_monitoring_alert_policy" "{resource}" \{{\n(.*?)^\}}'
    match = re.search(pattern, text, re.M | re.S)
    assert match, resource
    return match.group(1)


def fired(history: list[dict[str, Any]], thresholds: AlertThresholds | None = None,
          anomaly_rows: list[dict[str, Any]] | None = None) -> list[tuple[str, str, float]]:
    """(policy, run, seconds after T0) of each alert the history fires."""
    return [(alert.policy, alert.run_id, (alert.fired_at - at(0)).total_seconds())
            for alert in evaluate(history, thresholds, anomaly_rows or [])]


def test_thresholds_are_the_terraform_defaults():
    """AlertThresholds() holds the defaults of the Terraform variables of the same names."""
    defaults = terraform_defaults()
    thresholds = AlertThresholds()
    for field in dataclasses.fields(AlertThresholds):
        expected = defaults[field.name]
        expected = tuple(expected) if isinstance(expected, list) else expected
        assert getattr(thresholds, field.name) == expected, field.name
    assert thresholds.stall_window_s == min(defaults["rolling_windows_s"])


def test_policy_constants_are_those_written_in_terraform():
    """The durations, ranges, alignments and thresholds fixed in the policies match monitoring.tf."""
    assert f"[{alerts.DISRUPTION_RANGE_S // 60}m]" in policy("disruption")
    assert 'duration            = "0s"' in policy("disruption")
    step = policy("step_deviation")
    assert f'duration        = "{alerts.STEP_DEVIATION_DURATION_S}s"' in step
    assert f'alignment_period     = "{alerts.STEP_DEVIATION_ALIGNMENT_S}s"' in step
    assert '"ALIGN_MEAN"' in step and "COMPARISON_GT" in step
    stalled = policy("stalled")
    assert f"threshold_value = {alerts.STALL_BELOW_PCT}" in stalled
    assert 'alignment_period     = "${local.stall_alignment_s}s"' in stalled
    assert '"ALIGN_MAX"' in stalled and "COMPARISON_LT" in stalled and "interval_goodput" in stalled
    assert 'duration            = "${var.goodput_window_s}s"' in policy("low_goodput")
    locals_block = (TERRAFORM / "monitoring.tf").read_text()
    assert "stall_window_s = tostring(min(var.rolling_windows_s...))" in locals_block
    assert ("stall_alignment_s = 60 + 60 * ceil(2 * max(var.snapshot_interval_s, "
            "var.monitoring_min_interval_s) / 60)") in locals_block


def test_anomaly_policies_are_the_terraform_policy_of_each_kind():
    """One ``anomaly`` policy per kind of monitoring.tf's locals, named anomaly_KIND here; it fires
    at once on the run's count of open anomalies of its kind, by run."""
    text = (TERRAFORM / "monitoring.tf").read_text()
    kinds = re.search(r"^  anomaly_kinds = \{\n(.*?)^  \}", text, re.M | re.S)
    assert kinds
    assert re.findall(r"^\s*(\w+)\s*=", kinds.group(1), re.M) == list(ANOMALY_KINDS)
    assert set(ANOMALY_POLICIES.values()) == {f"anomaly_{kind}" for kind in ANOMALY_KINDS} <= set(POLICIES)
    anomaly = policy("anomaly")
    assert "for kind in toset(var.anomaly_alert_kinds) : kind => local.anomaly_kinds[kind]" in anomaly
    assert ('max by (job) ({\\"__name__\\"=\\"custom.googleapis.com/fleet_goodput/open_anomalies\\", '
            '\\"monitored_resource\\"=\\"generic_task\\", \\"kind\\"=\\"${each.key}\\"}) > 0"') in anomaly
    assert 'duration            = "0s"' in anomaly and "latest_anomalies" in anomaly


def anomaly(run_id: str, kind: str, started: float, detected: float, ended: float | None = None,
            changed: float | None = None, host: str | None = None) -> dict[str, Any]:
    """A ``run_anomalies`` row (times in seconds after T0): the row of the anomaly found, or with
    ``ended``, the row of its end, found at ``changed`` (``ended`` unless told)."""
    return {"run_id": run_id, "kind": kind, "host": host, "started_at": at(started),
            "detected_at": at(detected), "ended_at": None if ended is None else at(ended),
            "changed_at": at(detected if ended is None else ended if changed is None else changed),
            "baseline_step_s": 1.0, "observed_step_s": 1.5, "lost_s": 10.0}


def found_and_ended(run_id: str, kind: str, started: float, detected: float, ended: float,
                    host: str | None = None) -> list[dict[str, Any]]:
    """The two rows of an anomaly that was found and then ended."""
    return [anomaly(run_id, kind, started, detected, host=host),
            anomaly(run_id, kind, started, detected, ended, host=host)]


def test_an_anomaly_fires_its_kinds_policy_once_at_its_detection():
    """A slowdown found at 600 s and ended at 900 s fires anomaly_slowdown at 600 s, its value the
    count of open slowdowns then; its end fires nothing."""
    alert, = evaluate([], anomaly_rows=found_and_ended("r", SLOWDOWN, 500, 600, 900))
    assert alert == Alert("anomaly_slowdown", "r", at(600), at(600), 1.0)


def test_each_kind_and_each_run_has_its_own_incidents():
    """A hang and a slowdown of one run, and a hang of another, fire three alerts."""
    rows = [*found_and_ended("a", SLOWDOWN, 100, 200, 400), anomaly("a", HANG, 250, 310),
            anomaly("b", HANG, 50, 110)]
    assert fired([], anomaly_rows=rows) == [("anomaly_hang", "b", 110.0), ("anomaly_slowdown", "a", 200.0),
                                            ("anomaly_hang", "a", 310.0)]


def test_anomalies_open_together_are_one_incident():
    """While one straggler is open, a second one (another host) keeps the same incident, as
    max by (job) stays above 0; once both have ended, the next straggler fires again."""
    rows = [*found_and_ended("r", STRAGGLER, 0, 100, 500, host="h1"),
            *found_and_ended("r", STRAGGLER, 200, 300, 700, host="h2"),
            *found_and_ended("r", STRAGGLER, 650, 700, 800, host="h3"),  # found as h2's end is
            *found_and_ended("r", STRAGGLER, 850, 900, 950, host="h1")]
    assert fired([], anomaly_rows=rows) == [("anomaly_straggler", "r", 100.0),
                                            ("anomaly_straggler", "r", 900.0)]


def test_an_anomaly_is_open_until_its_end_is_found():
    """An anomaly counts until the row of its end was written (changed_at), not from the end it
    estimates (ended_at): one found in between is the same incident."""
    rows = [anomaly("r", STRAGGLER, 0, 100, host="h1"), anomaly("r", STRAGGLER, 0, 100, 400, 500, host="h1"),
            anomaly("r", STRAGGLER, 420, 450, host="h2")]
    assert fired([], anomaly_rows=rows) == [("anomaly_straggler", "r", 100.0)]


def test_an_anomaly_ended_as_it_was_found_fires_nothing():
    """A hang whose end is found at the time it is found never makes a count above 0."""
    assert fired([], anomaly_rows=found_and_ended("r", HANG, 100, 160, 160)) == []


def test_the_value_is_the_count_open_at_the_detection():
    """Two anomalies of a kind found at once fire one alert, with value 2."""
    rows = [anomaly("r", STRAGGLER, 0, 100, host="h1"), anomaly("r", STRAGGLER, 0, 100, host="h2")]
    assert [alert.value for alert in evaluate([], anomaly_rows=rows)] == [2.0]


def test_an_anomaly_written_again_by_a_later_replay_fires_once():
    """A replay as of a later time writes an anomaly's rows again: it is still one anomaly."""
    rows = found_and_ended("r", HANG, 100, 160, 400)
    again = [*rows, anomaly("r", HANG, 100, 160), *rows]
    assert fired([], anomaly_rows=again) == [("anomaly_hang", "r", 160.0)]


def test_only_the_kinds_that_alert_fire():
    """anomaly_alert_kinds leaves the policies of the other kinds out; an unknown kind is refused."""
    rows = [anomaly("r", SLOWDOWN, 0, 100), anomaly("r", HANG, 0, 200)]
    assert fired([], AlertThresholds(anomaly_alert_kinds=(HANG,)), anomaly_rows=rows) == [
        ("anomaly_hang", "r", 200.0)]
    assert fired([], AlertThresholds(anomaly_alert_kinds=()), anomaly_rows=rows) == []
    with pytest.raises(ValueError, match="stall"):
        AlertThresholds(anomaly_alert_kinds=("stall",))


def test_low_goodput_fires_once_it_has_held_for_the_window():
    """Goodput below 80 % at every snapshot fires at the first snapshot 1800 s after it began."""
    history = [goodput_row("r", t, goodput_pct=50.0) for t in range(60, 2500, 60)]
    assert fired(history) == [("low_goodput", "r", 1860.0)]
    assert evaluate(history)[0].since == at(60)
    assert evaluate(history)[0].value == pytest.approx(50.0)


def test_low_goodput_restarts_its_window_after_a_good_snapshot():
    """One snapshot at or above the threshold ends the stretch; the window starts again after it."""
    history = [goodput_row("r", t, goodput_pct=80.0 if t == 1200 else 50.0) for t in range(60, 3200, 60)]
    assert fired(history) == [("low_goodput", "r", 1260.0 + 1800)]


def test_low_goodput_needs_points_throughout():
    """A gap longer than PromQL's 5-minute lookback ends the stretch."""
    times = [*range(60, 1000, 60), *range(1400, 3300, 60)]
    history = [goodput_row("r", t, goodput_pct=50.0) for t in times]
    assert fired(history) == [("low_goodput", "r", 1400.0 + 1800)]


def test_low_goodput_threshold_and_window_are_configurable():
    """Other thresholds change when, and whether, the alert fires."""
    history = [goodput_row("r", t, goodput_pct=50.0) for t in range(60, 1300, 60)]
    assert fired(history) == []
    assert fired(history, AlertThresholds(goodput_window_s=600)) == [("low_goodput", "r", 660.0)]
    assert fired(history, AlertThresholds(goodput_threshold_pct=40, goodput_window_s=600)) == []


def test_an_empty_run_does_not_count_as_low_goodput():
    """No elapsed time is no value (PromQL's NaN), not 0 % goodput."""
    history = [goodput_row("r", t, total_time_s=0.0, goodput_pct=None) for t in range(60, 2500, 60)]
    assert fired(history) == []


def test_a_new_disruption_fires_at_the_snapshot_that_shows_it():
    """The count going up fires once; it stays one incident while the rise is in the 10-minute range."""
    counts = {t: (0 if t < 600 else 1 if t < 900 else 2) for t in range(60, 3000, 60)}
    history = [goodput_row("r", t, disruptions=n) for t, n in counts.items()]
    assert fired(history) == [("disruption", "r", 600.0)]
    later = {t: (n if t < 2400 else 3) for t, n in counts.items()}
    history = [goodput_row("r", t, disruptions=n) for t, n in later.items()]
    assert fired(history) == [("disruption", "r", 600.0), ("disruption", "r", 2400.0)]


def test_a_disruption_before_the_first_snapshot_does_not_fire():
    """delta() needs two samples in its range: a run's first snapshot cannot fire it."""
    history = [goodput_row("r", t, disruptions=1) for t in range(60, 1200, 60)]
    assert fired(history) == []


def test_a_disruption_after_a_long_silence_does_not_fire():
    """The previous sample must be within the 10-minute range for delta() to see the rise."""
    history = [goodput_row("r", 60, disruptions=0), goodput_row("r", 60 + 700, disruptions=1)]
    assert fired(history) == []



def test_a_gap_between_points_does_not_open_a_second_incident_while_the_range_holds_the_rise():
    """A range vector has no lookback: points 400 s apart after a rise keep the one incident
    open while the 10-minute range still holds the point before the rise, and it closes once
    the range holds the new count alone (the next rise fires again)."""
    history = [goodput_row("r", t, disruptions=n)
               for t, n in ((0, 0), (100, 1), (500, 1), (900, 1), (1000, 2), (1100, 2))]
    assert fired(history) == [("disruption", "r", 100.0), ("disruption", "r", 1000.0)]

def test_step_deviation_fires_after_600_s_of_the_5_minute_mean_above_threshold():
    """Deviation above 1 s, averaged over 300 s, for 600 s fires the step_deviation alert."""
    history = [goodput_row("r", t, step_time_deviation_s=0.2 if t < 600 else 1.5)
               for t in range(60, 2000, 60)]
    alert = evaluate(history)[0]
    # The 300 s mean first exceeds 1 s at 780 s, over the points at 540 to 780 s:
    # (0.2 + 4 x 1.5) / 5 = 1.24. It has held for 600 s at 1380 s.
    assert (alert.policy, alert.since, alert.fired_at) == ("step_deviation", at(780), at(1380))
    assert alert.value == pytest.approx(1.5)


def test_a_short_step_deviation_spike_does_not_fire():
    """A spike the 300 s mean keeps below the threshold, or shorter than 600 s, fires nothing."""
    spike = [goodput_row("r", t, step_time_deviation_s=3.0 if t == 600 else 0.1) for t in range(60, 2000, 60)]
    assert fired(spike) == []
    short = [goodput_row("r", t, step_time_deviation_s=3.0 if 600 <= t < 1000 else 0.1)
             for t in range(60, 2000, 60)]
    assert fired(short) == []


def test_null_step_deviation_is_no_data():
    """Snapshots without a step-time deviation neither fire nor keep a stretch alive."""
    history = [goodput_row("r", t, step_time_deviation_s=None) for t in range(60, 2000, 60)]
    assert fired(history) == []


def stall_history(stalled_from: float, until: float, every: float = 30) -> list[dict[str, Any]]:
    rows = []
    t = every
    while t <= until:
        pct = 0.0 if t >= stalled_from else 95.0
        rows.append(goodput_row("r", t))
        rows.append(goodput_row("r", t, window_s=60, goodput_pct=pct))
        t += every
    return rows


def test_stall_fires_after_stall_after_s_without_productive_time():
    """No productive time in the 60 s window at every snapshot for 600 s fires the stalled alert."""
    alert, = evaluate(stall_history(stalled_from=300, until=1500))
    # ALIGN_MAX over 120 s: the point at 360 s still sees 95 % at 270 s, so the stretch starts at 390 s.
    assert (alert.policy, alert.since, alert.fired_at, alert.value) == ("stalled", at(390), at(990), 0.0)


def test_stall_watches_the_shortest_window_only():
    """The stall condition reads the shortest rolling window; other windows do not fire it."""
    history = [dict(row, window_s=300) if row["window_s"] == 60 else row
               for row in stall_history(stalled_from=300, until=1500)]
    assert fired(history) == []
    assert fired(history, AlertThresholds(rolling_windows_s=(300, 900))) == [("stalled", "r", 990.0)]


def test_the_stall_alignment_holds_two_intervals_between_points_and_a_minute():
    """120 s for the default 30 s snapshots; longer for a stream that snapshots less often, or a
    Monitoring interval longer than its snapshots'."""
    assert AlertThresholds().stall_alignment_s == 120
    assert AlertThresholds(snapshot_interval_s=45).stall_alignment_s == 180
    assert AlertThresholds(snapshot_interval_s=240).stall_alignment_s == 540
    assert AlertThresholds(snapshot_interval_s=5, monitoring_min_interval_s=90).stall_alignment_s == 240
    with pytest.raises(ValueError, match="snapshot_interval_s"):
        AlertThresholds(snapshot_interval_s=0)


def test_a_stall_snapshotted_less_often_than_every_minute_fires_with_its_interval():
    """Snapshots 240 s apart (the demo's fleet time between its stream's snapshots) leave the
    default alignment periods without data, which end the stall's duration at every point: no
    alert. Aligned for their interval, the stall fires 600 s after the periods hold only zeros."""
    history = stall_history(stalled_from=960, until=4800, every=240)
    assert fired(history) == []
    alert, = evaluate(history, AlertThresholds(snapshot_interval_s=240))
    # ALIGN_MAX over 540 s: the point at 1200 s still sees 95 % at 720 s; the one at 1440 s sees
    # only zeros, and the first point 600 s later, at 2160 s, fires.
    assert (alert.policy, alert.since, alert.fired_at) == ("stalled", at(1440), at(2160))


def test_a_silent_run_gets_no_stall_alert_from_one_snapshot():
    """A run that falls silent and gets one more snapshot has no points for 600 s, so no alert."""
    history = stall_history(stalled_from=10_000, until=600)
    history += [goodput_row("r", 900), goodput_row("r", 900, window_s=60, goodput_pct=0.0)]
    assert fired(history) == []


def test_an_empty_window_is_not_a_stall():
    """A window that holds nothing of the run (goodput_pct NULL) writes no point."""
    history = [goodput_row("r", t, window_s=60, goodput_pct=None, total_time_s=0.0)
               for t in range(30, 1500, 30)]
    assert fired(history) == []


def test_alerts_are_per_run_and_in_firing_order():
    """Each run is evaluated on its own; the alerts come sorted by firing time."""
    history = [goodput_row("late", t, goodput_pct=10.0) for t in range(300, 2500, 60)]
    history += [goodput_row("early", t, disruptions=int(t >= 240)) for t in range(60, 2500, 60)]
    history += [goodput_row("fine", t) for t in range(60, 2500, 60)]
    assert fired(history) == [("disruption", "early", 240.0), ("low_goodput", "late", 2100.0)]


def test_evaluate_file_reads_a_duckdb_history(tmp_path: Path):
    """evaluate_file replays the goodput_snapshots table of a DuckDB file."""
    history = [goodput_row("r", t, goodput_pct=50.0) for t in range(60, 2500, 60)]
    database = write_rows(tmp_path / "goodput.duckdb", {"goodput_snapshots": history})
    assert evaluate_file(database) == evaluate(history)
    assert evaluate_file(database)[0] == Alert("low_goodput", "r", at(60), at(1860), pytest.approx(50.0))


def test_evaluate_file_reads_the_anomalies_of_a_duckdb_history(tmp_path: Path):
    """evaluate_file replays run_anomalies beside goodput_snapshots; a file with only one of the two
    tables (one written before run_anomalies existed) is replayed on what it has."""
    history = [goodput_row("r", t, goodput_pct=50.0) for t in range(60, 2500, 60)]
    anomalies = found_and_ended("r", SLOWDOWN, 500, 600, 900)
    both = write_rows(tmp_path / "both.duckdb", {"goodput_snapshots": history, "run_anomalies": anomalies})
    assert evaluate_file(both) == evaluate(history, anomaly_rows=anomalies)
    assert [alert.policy for alert in evaluate_file(both)] == ["anomaly_slowdown", "low_goodput"]
    only_anomalies = write_rows(tmp_path / "anomalies.duckdb", {"run_anomalies": anomalies})
    assert fired_in(only_anomalies) == ["anomaly_slowdown"]
    only_goodput = write_rows(tmp_path / "goodput.duckdb", {"goodput_snapshots": history})
    assert fired_in(only_goodput) == ["low_goodput"]


def fired_in(database: Path) -> list[str]:
    return [alert.policy for alert in evaluate_file(database)]


def test_evaluate_file_of_an_empty_or_missing_file(tmp_path: Path):
    """An empty history fires nothing; a missing file is an error, not an empty history."""
    assert evaluate_file(write_rows(tmp_path / "empty.duckdb", {})) == []
    bare = tmp_path / "bare.duckdb"
    duckdb.connect(str(bare)).close()
    assert evaluate_file(bare) == []
    with pytest.raises(FileNotFoundError):
        evaluate_file(tmp_path / "missing.duckdb")


