"""The training-run alert policies of ``terraform/monitoring.tf``, replayed on a snapshot history.

Cloud Monitoring evaluates the policies on the points the pipeline writes; this module evaluates
the same conditions on the snapshots in a DuckDB file (``goodput_snapshots``, and ``run_anomalies``
for the anomaly policies), so a replay, a demo or a post-mortem can tell which alerts would have
fired, for which run, and when::

    from pipeline.app.alerts import AlertThresholds, evaluate_file
    for alert in evaluate_file("goodput.duckdb", AlertThresholds()):
        print(alert.policy, alert.run_id, alert.fired_at)

The thresholds are the Terraform variables, with their defaults (a test reads
``terraform/variables.tf`` so the two cannot drift); the other numbers are written in the
policies themselves and are constants here. The conditions, per run (``workload_id``):

``low_goodput``
    PromQL ``100 * goodput_time / total_elapsed_time < goodput_threshold_pct`` for
    ``goodput_window_s``: the cumulative row's ``productive_time_s / total_time_s`` (no value while
    ``total_time_s`` is 0, as PromQL's NaN compares false).
``disruption``
    PromQL ``delta(disruptions[10m]) > 0``, for 0 s: the cumulative ``disruptions`` count of the
    run's latest snapshot in the 10 minutes before is above that of its earliest there. ``delta``
    needs two samples in its range, so a run's first snapshot never fires it; and a range vector
    has no lookback, so the condition holds, one incident, for as long as the range holds the
    rise, whatever the gaps between points.
``step_deviation``
    ``step_time_deviation`` above ``step_deviation_threshold_s`` for 600 s, each point the mean of
    the run's values in the 300 s before (``ALIGN_MEAN`` over a 300 s alignment period).
``stalled``
    ``interval_goodput`` of the shortest rolling window below 0.001 % for ``stall_after_s``, each
    point the maximum of the run's values in the alignment period before (``ALIGN_MAX``): two
    intervals between a run's points (``snapshot_interval_s``, and no less than
    ``monitoring_min_interval_s``) in whole minutes and a minute more, 120 s by default, so that a
    point lost or late does not start the duration again; a window that holds nothing of the run
    (``goodput_pct`` NULL) writes no point. A history whose snapshots are
    further apart in its own time than the deployed stream's (the demo's fleet runs on a clock
    faster than the wall clock's, its stream snapshots on the wall clock's) is evaluated with its
    own ``snapshot_interval_s``.
``anomaly_slowdown``, ``anomaly_hang``, ``anomaly_straggler``
    The ``anomaly`` policy of each kind in ``anomaly_alert_kinds``: PromQL ``max by (job)
    (open_anomalies{kind=KIND}) > 0``, for 0 s. A run's count of open anomalies of the kind is read
    from ``run_anomalies``: an anomaly (``run_id``, ``kind``, ``host``, ``started_at``) is open from
    its ``detected_at`` until the ``changed_at`` of its row with an ``ended_at``. The alert fires at
    the detection that takes the count from 0, once per run while any anomaly of the kind stays
    open (one incident, as Cloud Monitoring keeps it); its value is the count then. A file written
    before ``run_anomalies`` existed fires none of these.

Approximations, all from evaluating at snapshot times rather than Cloud Monitoring's continuous
evaluation (every 60 s for the PromQL conditions):

* A condition is evaluated at each of the run's snapshot times. It holds from the first snapshot
  where it is true; the alert fires at the first snapshot at least the policy's duration later,
  provided it was true at every snapshot in between. One alert per such stretch (Cloud Monitoring
  keeps one incident open while the condition holds).
* A gap between two snapshots longer than a point stays visible ends the stretch, as missing data
  does in Cloud Monitoring: the alignment period for the threshold conditions, the 5-minute
  lookback of PromQL for the low goodput one (the disruption condition is evaluated exactly).
  The stall policy needs points all the time a run is stalled, which is why the streaming
  pipeline keeps snapshotting a silent run every snapshot interval (``pipeline.beam.live``).
* Points are taken at snapshot times; the pipeline stamps them when it writes them (at most every
  ``monitoring_min_interval_s``), which is the snapshot time for a live run.
* The anomaly counts are taken at each detection and end, as if a snapshot were written then: an
  anomaly found and ended between two points the pipeline writes fires here, though Cloud
  Monitoring never sees its count above 0.
"""

from __future__ import annotations

import bisect
import dataclasses
import datetime
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from pipeline.core.detect import ANOMALY_KINDS, HANG, SLOWDOWN, STRAGGLER, DetectionSettings

#: The policy of each kind of anomaly: ``google_monitoring_alert_policy.anomaly[KIND]``.
ANOMALY_POLICIES: dict[str, str] = {kind: f"anomaly_{kind}" for kind in ANOMALY_KINDS}
_DETECTION = DetectionSettings()  # the pipeline's defaults, which the hang's description states
#: The policies replayed, by their Terraform resource names, with what each means.
POLICIES: dict[str, str] = {
    "low_goodput": "cumulative goodput below the threshold",
    "disruption": "disruption count went up",
    "step_deviation": "step-time deviation above the threshold",
    "stalled": "no productive time in the shortest rolling window",
    ANOMALY_POLICIES[SLOWDOWN]: "a slowdown found: steps slower than the run's own baseline",
    ANOMALY_POLICIES[HANG]: f"a hang found: no step for max({_DETECTION.hang_min_s:g} s, "
                            f"{_DETECTION.hang_factor:g} x the median step time)",
    ANOMALY_POLICIES[STRAGGLER]: "a straggler found: one host slower than the run's other hosts",
}

# Numbers written in the policies of terraform/monitoring.tf (a test reads them from there).
#: ``delta(disruptions[10m])``: the range of the disruption condition.
DISRUPTION_RANGE_S = 600
#: The step-time deviation condition's duration and its ALIGN_MEAN alignment period.
STEP_DEVIATION_DURATION_S = 600
STEP_DEVIATION_ALIGNMENT_S = 300
#: The stall condition's threshold on ``interval_goodput`` (a percentage).
STALL_BELOW_PCT = 0.001
#: How long Managed Service for Prometheus sees a sample (PromQL's default lookback delta).
PROMQL_LOOKBACK_S = 300


@dataclasses.dataclass(frozen=True)
class AlertThresholds:
    """The alert variables of ``terraform/variables.tf``, with the same names and defaults."""

    goodput_threshold_pct: float = 80
    goodput_window_s: float = 1800
    step_deviation_threshold_s: float = 1
    stall_after_s: float = 600
    rolling_windows_s: tuple[int, ...] = (60, 300, 900, 3600)
    anomaly_alert_kinds: tuple[str, ...] = ANOMALY_KINDS
    snapshot_interval_s: float = 30
    monitoring_min_interval_s: float = 10

    def __post_init__(self) -> None:
        if not self.rolling_windows_s:
            raise ValueError("rolling_windows_s needs at least one window")
        unknown = sorted(set(self.anomaly_alert_kinds) - set(ANOMALY_KINDS))
        if unknown:
            raise ValueError(f"anomaly_alert_kinds {unknown} are not kinds of anomaly {ANOMALY_KINDS}")
        if min(self.goodput_window_s, self.stall_after_s) < 0:
            raise ValueError("durations must not be negative")
        if min(self.snapshot_interval_s, self.monitoring_min_interval_s) <= 0:
            raise ValueError("snapshot_interval_s and monitoring_min_interval_s must be positive")

    @property
    def stall_window_s(self) -> int:
        """The rolling window the stall condition watches: the shortest one."""
        return min(self.rolling_windows_s)

    @property
    def stall_alignment_s(self) -> int:
        """The stall condition's alignment period: two intervals between a run's points in whole
        minutes, and a minute more (``local.stall_alignment_s`` of ``terraform/monitoring.tf``)."""
        every = max(self.snapshot_interval_s, self.monitoring_min_interval_s)
        return 60 + 60 * math.ceil(2 * every / 60)


@dataclasses.dataclass(frozen=True)
class Alert:
    """One alert that would have fired: its policy, the run, and when.

    ``since`` is the first snapshot at which the condition held, ``fired_at`` the snapshot at which
    it had held for the policy's duration, ``value`` the value the condition saw then.
    """

    policy: str
    run_id: str
    since: datetime.datetime
    fired_at: datetime.datetime
    value: float

    @property
    def description(self) -> str:
        return POLICIES[self.policy]


@dataclasses.dataclass(frozen=True)
class _Point:
    time: datetime.datetime
    value: float | None


def _seconds(later: datetime.datetime, earlier: datetime.datetime) -> float:
    return (later - earlier).total_seconds()


def _aligned(points: Sequence[_Point], period_s: float,
             reduce: Callable[[list[float]], float]) -> list[_Point]:
    """Each point's time with the reduction of the values in the ``period_s`` before it."""
    aligned, first = [], 0
    for index, point in enumerate(points):
        while _seconds(point.time, points[first].time) >= period_s:
            first += 1
        values = [p.value for p in points[first:index + 1] if p.value is not None]
        aligned.append(_Point(point.time, reduce(values) if values else None))
    return aligned


def _stretches(points: Sequence[_Point], holds: Callable[[float], bool], duration_s: float,
               max_gap_s: float) -> list[tuple[datetime.datetime, _Point]]:
    """(start, firing point) of each stretch in which ``holds`` was true for ``duration_s``."""
    fired: list[tuple[datetime.datetime, _Point]] = []
    start: datetime.datetime | None = None
    previous: datetime.datetime | None = None
    done = False
    for point in points:
        true = point.value is not None and holds(point.value)
        if previous is not None and _seconds(point.time, previous) > max_gap_s:
            start, done = None, False
        previous = point.time
        if not true:
            start, done = None, False
            continue
        if start is None:
            start = point.time
        if not done and _seconds(point.time, start) >= duration_s:
            fired.append((start, point))
            done = True
    return fired


def _disruption_stretches(points: Sequence[_Point]) -> list[tuple[datetime.datetime, _Point]]:
    """(start, firing point) of each stretch in which ``delta(disruptions[10m]) > 0`` held: at
    each time the range holds the points of the 10 minutes before (left-open, as in PromQL), and
    the condition is true while it holds two whose counts differ. It changes only when a point
    enters the range (which is when it can become true) or leaves it, so those are the times it
    is evaluated at; a gap between points does not end a stretch while the range still holds the
    rise (a range vector has no lookback)."""
    times = [point.time for point in points if point.value is not None]
    counts = [point.value for point in points if point.value is not None]
    span = datetime.timedelta(seconds=DISRUPTION_RANGE_S)
    fired: list[tuple[datetime.datetime, _Point]] = []
    holding = False
    for time in sorted({*times, *(t + span for t in times)}):
        first, last = bisect.bisect_right(times, time - span), bisect.bisect_right(times, time) - 1
        delta = counts[last] - counts[first] if last > first else 0.0
        if delta > 0 and not holding:
            fired.append((time, _Point(time, delta)))
        holding = delta > 0
    return fired


def _anomaly_alerts(anomaly_rows: Iterable[Mapping[str, Any]], kinds: Sequence[str]) -> list[Alert]:
    """The alerts of the anomaly policies of ``kinds`` on these ``run_anomalies`` rows."""
    detected: dict[tuple[Any, ...], datetime.datetime] = {}
    ended: dict[tuple[Any, ...], datetime.datetime] = {}
    for row in anomaly_rows:
        if row["kind"] not in kinds:
            continue
        # A replay as of a later time writes the same rows of an anomaly again.
        key = (row["run_id"], row["kind"], row["host"], row["started_at"])
        detected.setdefault(key, row["detected_at"])
        if row["ended_at"] is not None:
            ended.setdefault(key, row["changed_at"])
    spans: dict[tuple[str, str], list[tuple[datetime.datetime, datetime.datetime | None]]] = {}
    for key, found in detected.items():
        spans.setdefault((key[0], key[1]), []).append((found, ended.get(key)))
    alerts = []
    for (run_id, kind), run_spans in sorted(spans.items()):
        for time in sorted({found for found, _ in run_spans}):
            # A new incident only where the count rises from 0 (an end found at this very time
            # leaves no gap); none for an anomaly whose end was found as it was.
            already = any(found < time and (end is None or end >= time) for found, end in run_spans)
            count = sum(found <= time and (end is None or end > time) for found, end in run_spans)
            if count and not already:
                alerts.append(Alert(ANOMALY_POLICIES[kind], run_id, time, time, float(count)))
    return alerts


def evaluate(goodput_rows: Iterable[Mapping[str, Any]], thresholds: AlertThresholds | None = None,
             anomaly_rows: Iterable[Mapping[str, Any]] = ()) -> list[Alert]:
    """The alerts that would have fired on these ``goodput_snapshots`` and ``run_anomalies`` rows,
    in firing order.

    Each goodput row needs ``run_id``, ``snapshot_time``, ``window_s``, ``productive_time_s``,
    ``total_time_s``, ``disruptions``, ``step_time_deviation_s`` and ``goodput_pct``; each
    anomaly row ``run_id``, ``kind``, ``host``, ``started_at``, ``detected_at``, ``ended_at`` and
    ``changed_at``.
    """
    thresholds = thresholds or AlertThresholds()
    cumulative: dict[str, list[Mapping[str, Any]]] = {}
    stall: dict[str, list[Mapping[str, Any]]] = {}
    for row in goodput_rows:
        if row["window_s"] == 0:
            cumulative.setdefault(row["run_id"], []).append(row)
        elif row["window_s"] == thresholds.stall_window_s:
            stall.setdefault(row["run_id"], []).append(row)
    alerts: list[Alert] = []

    def add(policy: str, run_id: str, fired: list[tuple[datetime.datetime, _Point]]) -> None:
        alerts.extend(Alert(policy, run_id, start, point.time, float(point.value or 0.0))
                      for start, point in fired)

    for run_id, rows in sorted(cumulative.items()):
        rows = sorted(rows, key=lambda row: row["snapshot_time"])
        goodput = [_Point(row["snapshot_time"], 100 * row["productive_time_s"] / row["total_time_s"]
                          if row["total_time_s"] else None) for row in rows]
        add("low_goodput", run_id, _stretches(goodput, lambda v: v < thresholds.goodput_threshold_pct,
                                              thresholds.goodput_window_s, PROMQL_LOOKBACK_S))
        counts = [_Point(row["snapshot_time"], row["disruptions"]) for row in rows]
        add("disruption", run_id, _disruption_stretches(counts))
        deviation = _aligned([_Point(row["snapshot_time"], row["step_time_deviation_s"]) for row in rows],
                             STEP_DEVIATION_ALIGNMENT_S, lambda values: sum(values) / len(values))
        add("step_deviation", run_id, _stretches(
            deviation, lambda v: v > thresholds.step_deviation_threshold_s, STEP_DEVIATION_DURATION_S,
            STEP_DEVIATION_ALIGNMENT_S))
    for run_id, rows in sorted(stall.items()):
        rows = sorted(rows, key=lambda row: row["snapshot_time"])
        interval = _aligned([_Point(row["snapshot_time"], row["goodput_pct"]) for row in rows],
                            thresholds.stall_alignment_s, max)
        add("stalled", run_id, _stretches(interval, lambda v: v < STALL_BELOW_PCT, thresholds.stall_after_s,
                                          thresholds.stall_alignment_s))
    alerts += _anomaly_alerts(anomaly_rows, thresholds.anomaly_alert_kinds)
    return sorted(alerts, key=lambda alert: (alert.fired_at, alert.run_id, alert.policy))


_COLUMNS = ("run_id", "snapshot_time", "window_s", "productive_time_s", "total_time_s", "disruptions",
            "step_time_deviation_s", "goodput_pct")


def _has_table(connection: Any, name: str) -> bool:
    present = connection.execute("SELECT count(*) FROM information_schema.tables WHERE table_name = ?",
                                 [name]).fetchone()
    return bool(present and present[0])


def evaluate_connection(connection: Any, thresholds: AlertThresholds | None = None) -> list[Alert]:
    """``evaluate`` on the ``goodput_snapshots`` and ``run_anomalies`` tables of an open DuckDB
    connection (a missing table holds no rows)."""
    thresholds = thresholds or AlertThresholds()
    goodput: list[dict[str, Any]] = []
    anomalies: list[dict[str, Any]] = []
    if _has_table(connection, "goodput_snapshots"):
        cursor = connection.execute(
            f"SELECT {', '.join(_COLUMNS)} FROM goodput_snapshots WHERE window_s IN (0, ?) "
            "ORDER BY run_id, snapshot_time", [thresholds.stall_window_s])
        goodput = [dict(zip(_COLUMNS, row, strict=True)) for row in cursor.fetchall()]
    if _has_table(connection, "run_anomalies"):
        cursor = connection.execute(
            "SELECT run_id, kind, host, started_at, detected_at, ended_at, changed_at FROM run_anomalies")
        names = [column[0] for column in cursor.description]
        anomalies = [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
    return evaluate(goodput, thresholds, anomalies)


def evaluate_file(duckdb_path: str | Path, thresholds: AlertThresholds | None = None) -> list[Alert]:
    """``evaluate`` on the snapshot history of a DuckDB file written by the pipeline (a file it
    did not write is a ``ValueError``, ``pipeline.sinks.duckdb.NotOurs``)."""
    from pipeline.sinks.duckdb import open_reader

    path = Path(duckdb_path)
    if not path.exists():
        raise FileNotFoundError(path)
    connection = open_reader(path)
    try:
        return evaluate_connection(connection, thresholds)
    finally:
        connection.close()
