"""One run's page: every attempt and span of the run on one timeline, with its goodput over time,
where its time went, its configs and metrics, its disruptions and anomalies.

``goodput report --run RUN`` writes it as a page of its own; the fleet report
(``pipeline.app.report``) has the same section for the runs losing the most chip-hours. The
timeline (a Gantt chart) is drawn from the raw events table (each attempt's init, training
preparation, data loading, steps, checkpoint saves and restores, evals and other custom badput,
elastic waits), the ``disruptions`` table (each crash, the progress it wasted and the recovery
until the restart) and the anomalies found (hangs, slowdowns, stragglers). Everything is inline
SVG and HTML: the page loads nothing::

    from pipeline.app.run_page import write_run_report
    write_run_report(Path("goodput.duckdb"), "run-1", Path("run-1.html"))
"""

from __future__ import annotations

import dataclasses
import datetime
import itertools
import json
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pipeline.app import report as fleet_report
from pipeline.app.report import (
    _CSS,
    _DISRUPTION_COLUMNS,
    _GOOD,
    _GOODPUT_COLUMNS,
    _LAST_METRICS_SQL,
    _SCRIPT,
    _SERIES_SQL,
    HANG,
    MAX_POINTS,
    _duration,
    _esc,
    _Fleet,
    _fmt,
    _goodput_meter,
    _note,
    _table,
    _window_name,
    bucket_color,
)
from pipeline.core.detect import HANG as HANG_KIND
from pipeline.core.detect import SLOWDOWN, STRAGGLER
from pipeline.core.snapshot import (
    CHECKPOINT_RESTORE,
    CHECKPOINT_SAVE,
    CUSTOM_PREFIX,
    DATA_LOADING_SYNC,
    ELASTIC_REINITIALIZATION,
    ELASTIC_SCALE_UP,
    ELASTIC_SLICE_DOWN,
    INFRASTRUCTURE_RECOVERY,
    TPU_INITIALIZATION,
    TRAINING_PREP,
    WASTED_PROGRESS,
)

#: What the timeline draws, and in which colour: a span's colour is its badput bucket's.
SPAN_COLORS = {
    "init": bucket_color(TPU_INITIALIZATION), "prep": bucket_color(TRAINING_PREP),
    "data loading": bucket_color(DATA_LOADING_SYNC), "steps": _GOOD,
    "checkpoint save": bucket_color(CHECKPOINT_SAVE), "checkpoint restore": bucket_color(CHECKPOINT_RESTORE),
    "slice down wait": bucket_color(ELASTIC_SLICE_DOWN), "scale-up wait": bucket_color(ELASTIC_SCALE_UP),
    "elastic reinit": bucket_color(ELASTIC_REINITIALIZATION),
    "wasted progress": bucket_color(WASTED_PROGRESS), "crash": "#1f2430",
    "recovery": bucket_color(INFRASTRUCTURE_RECOVERY),
    HANG_KIND: bucket_color(HANG), SLOWDOWN: "#f28e2b", STRAGGLER: "#17becf",
}
#: Paired start/end events and the span each pair is.
_PAIRED = {"tpu_init": "init", "training_prep": "prep", "data_loading": "data loading",
           "elastic_reinit": "elastic reinit"}
#: Steps further apart than this many times the attempt's median step time (and at least
#: _MIN_GAP_S) are drawn as two stretches of steps: the gap between them shows.
_GAP_FACTOR = 10
_MIN_GAP_S = 60.0
#: Attempts given a lane, at most: a run of thousands of restarts shows its latest ones.
MAX_ATTEMPT_LANES = 40
#: Metrics drawn over steps on a run's page, at most.
MAX_METRICS = 6
#: The chart's geometry, in SVG units: the lane names' gutter, the plot's width, one lane's height.
_LEFT, _WIDTH, _LANE = 170, 880, 22


@dataclasses.dataclass
class Span:
    """One bar of the timeline: ``kind`` (a key of SPAN_COLORS, or a custom badput type) from
    ``start`` to ``end``, with what its tooltip says."""

    kind: str
    start: datetime.datetime
    end: datetime.datetime
    about: str

    @property
    def color(self) -> str:
        return SPAN_COLORS.get(self.kind) or bucket_color(CUSTOM_PREFIX + self.kind.upper())


@dataclasses.dataclass
class RunPage:
    """What one run's page shows, read from the file."""

    run_id: str
    fleet: _Fleet  # the run alone, as the fleet report reads it (its snapshots, badput, anomalies)
    attempts: list[dict[str, Any]]  # run_metadata rows, in start order
    lanes: list[tuple[str, str, list[Span]]]  # (name, tooltip, spans), top to bottom
    configs: list[tuple[str, str, str]]  # (source, key, latest value)
    last_metrics: list[tuple[str, float, int | None]]  # (name, last value, its step)
    metric_series: dict[str, list[tuple[int, float]]]  # name -> (step, value), thinned

    @property
    def latest(self) -> dict[str, Any] | None:
        return self.fleet.latest().get(self.run_id)


def write_run_report(duckdb_path: Path, run_id: str, output: Path) -> None:
    """Writes the page of run ``run_id`` of the DuckDB file ``duckdb_path`` to ``output``; a run the
    file does not know is a ``LookupError`` naming a few it does."""
    from pipeline.sinks.duckdb import open_reader

    duckdb_path, output = Path(duckdb_path), Path(output)
    if not duckdb_path.exists():
        raise FileNotFoundError(duckdb_path)
    connection = open_reader(duckdb_path)
    try:
        tables = fleet_report.table_names(connection)
        page = read_run(connection, tables, run_id)
    finally:
        connection.close()
    output.parent.mkdir(parents=True, exist_ok=True)
    title = f"Run {run_id} · {duckdb_path.name}"
    output.write_text(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>Fleet goodput report · {_esc(title)}</title><style>{_CSS}</style></head>"
        f'<body><main><section class="run-page" id="run-page"><h1>Run {_esc(run_id)}</h1>'
        f'<p class="meta">{_esc(duckdb_path.name)}</p>{run_section(page)}</section></main>'
        f"<script>{_SCRIPT}</script></body></html>\n", encoding="utf-8")


# -- Reading ------------------------------------------------------------------------------------

def read_run(connection: Any, tables: set[str], run_id: str) -> RunPage:
    """The page of ``run_id`` from an open reader of the file (``tables``: the file's tables)."""

    def rows(table: str, columns: Sequence[str], sql: str) -> list[dict[str, Any]]:
        if table not in tables:
            return []
        return [dict(zip(columns, row, strict=True))
                for row in connection.execute(sql, {"run": run_id}).fetchall()]

    goodput = rows("goodput_snapshots", _GOODPUT_COLUMNS,
                   f"SELECT {', '.join(_GOODPUT_COLUMNS)} FROM goodput_snapshots WHERE run_id = $run "
                   "ORDER BY snapshot_time, window_s")
    attempts = rows("run_metadata", ("attempt_id", "start_time", "accelerator_type", "chip_count", "location",
                                     "platform", "labels"),
                    "SELECT attempt_id, start_time, accelerator_type, chip_count, location, platform, labels "
                    "FROM run_metadata WHERE run_id = $run QUALIFY row_number() OVER "
                    "(PARTITION BY attempt_id ORDER BY start_time) = 1 ORDER BY start_time, attempt_id")
    events = rows("events", ("attempt_id", "seq", "event_time", "kind", "step", "body"),
                  "SELECT attempt_id, seq, event_time, kind, step, body FROM events WHERE run_id = $run "
                  "AND kind NOT IN ('heartbeat', 'model_metrics', 'metrics', 'host_steps', 'configs') "
                  "QUALIFY row_number() OVER (PARTITION BY attempt_id, seq) = 1 "
                  "ORDER BY event_time, attempt_id, seq")
    if not goodput and not events:
        known = ([run for run, in connection.execute(
            "SELECT DISTINCT run_id FROM goodput_snapshots ORDER BY run_id LIMIT 3").fetchall()]
            if "goodput_snapshots" in tables else [])
        raise LookupError(f"no run {run_id!r} in this file" + (f"; it has {', '.join(known)}, …" if known
                                                               else ": it has no runs"))
    badput = rows("badput_snapshots", ("run_id", "badput_source", "seconds"),
                  "SELECT run_id, badput_source, seconds FROM badput_snapshots WHERE window_s = 0 "
                  "AND run_id = $run QUALIFY snapshot_time = max(snapshot_time) OVER ()")
    disruptions = rows("disruptions", _DISRUPTION_COLUMNS,
                       f"SELECT {', '.join(_DISRUPTION_COLUMNS)} FROM disruptions WHERE run_id = $run "
                       "QUALIFY row_number() OVER (PARTITION BY disruption_index "
                       "ORDER BY snapshot_time DESC) = 1 ORDER BY restart_time")
    anomalies = None
    if "latest_anomalies" in tables:
        cursor = connection.execute("SELECT * FROM latest_anomalies WHERE run_id = $run "
                                    "ORDER BY started_at, kind, host", {"run": run_id})
        names = [column[0] for column in cursor.description]
        anomalies = [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
    fleet = _Fleet(goodput=goodput, badput=badput, disruptions=disruptions, anomalies=anomalies, queries=[],
                   alerts=[], prices=fleet_report.read_prices(connection, tables))
    configs: list[tuple[str, str, str]] = []
    last_metrics: list[tuple[str, float, int | None]] = []
    series: dict[str, list[tuple[int, float]]] = {}
    if "run_configs" in tables:
        configs = connection.execute(
            "SELECT source, key, value FROM run_configs WHERE run_id = $run QUALIFY row_number() OVER "
            "(PARTITION BY source, key ORDER BY recorded_at DESC, value DESC) = 1 ORDER BY source, key",
            {"run": run_id}).fetchall()
    if "model_metrics" in tables:
        last_metrics = sorted((name, value, step) for _, name, value, step in connection.execute(
            _LAST_METRICS_SQL, {"runs": [run_id]}).fetchall())
        for _, name, step, value in connection.execute(_SERIES_SQL, {"runs": [run_id],
                                                                     "points": MAX_POINTS}).fetchall():
            series.setdefault(name, []).append((step, value))
    steps = connection.execute(
        "SELECT attempt_id, event_time, step FROM events WHERE run_id = $run AND kind = 'step_start' "
        "QUALIFY row_number() OVER (PARTITION BY attempt_id, seq) = 1 ORDER BY attempt_id, event_time",
        {"run": run_id}).fetchall() if "events" in tables else []
    page = RunPage(run_id, fleet, attempts, [], configs, last_metrics, series)
    page.lanes = _lanes(page, events, steps)
    return page


def _lanes(page: RunPage, events: list[dict[str, Any]],
           steps: list[tuple[str, datetime.datetime, int]]) -> list[tuple[str, str, list[Span]]]:
    """The timeline's lanes: one per attempt (in start order), then the disruptions, then one per
    kind of anomaly found."""
    by_attempt: dict[str, list[Span]] = {}
    first_seen: dict[str, datetime.datetime] = {}
    last_seen: dict[str, datetime.datetime] = {}
    ends: dict[str, dict[str, Any]] = {}
    pending: dict[tuple[str, str], tuple[datetime.datetime, dict[str, Any]]] = {}
    for event in events:
        attempt, kind, moment = event["attempt_id"], event["kind"], event["event_time"]
        first_seen.setdefault(attempt, moment)
        last_seen[attempt] = moment
        body = json.loads(event["body"]) if event["body"] else {}
        own = by_attempt.setdefault(attempt, [])
        name, _, edge = kind.rpartition("_")
        if kind == "job_end":
            ends[attempt] = {"time": moment, "failed": body.get("failed")}
        elif kind in ("checkpoint_save", "checkpoint_restore"):
            blocking = float(body.get("blocking_s") or 0.0)
            label = "checkpoint save" if kind == "checkpoint_save" else "checkpoint restore"
            own.append(Span(label, moment, moment + datetime.timedelta(seconds=blocking),
                            f"{label} of step {body.get('step')}: {_duration(blocking)} blocked"))
        elif edge in ("start", "end") and (name in _PAIRED or name in ("custom_badput", "elastic_wait")):
            if name == "custom_badput":
                label = str(body.get("badput_type") or "unknown")
            elif name == "elastic_wait":
                scale_up = "scale_up" in str(body.get("event_type", "")).lower()
                label = "scale-up wait" if scale_up else "slice down wait"
            else:
                label = _PAIRED[name]
            if edge == "start":
                pending[(attempt, label)] = (moment, body)
            elif (attempt, label) in pending:
                started, _ = pending.pop((attempt, label))
                seconds = (moment - started).total_seconds()
                own.append(Span(label, started, moment, f"{label}: {_duration(seconds)}"))
    step_times: dict[str, list[tuple[datetime.datetime, int]]] = {}
    for attempt, moment, step in steps:
        step_times.setdefault(attempt, []).append((moment, step))
        first_seen[attempt] = min(first_seen.get(attempt, moment), moment)
        last_seen[attempt] = max(last_seen.get(attempt, moment), moment)
    for attempt, points in step_times.items():
        by_attempt.setdefault(attempt, []).extend(_step_stretches(points, ends.get(attempt, {}).get("time")))
    order = [row["attempt_id"] for row in page.attempts if row["attempt_id"] in first_seen]
    order += sorted((attempt for attempt in first_seen if attempt not in order), key=lambda a: first_seen[a])
    metadata = {row["attempt_id"]: row for row in page.attempts}
    lanes: list[tuple[str, str, list[Span]]] = []
    if len(order) > MAX_ATTEMPT_LANES:
        earlier = len(order) - MAX_ATTEMPT_LANES
        lanes.append((f"{earlier:,} earlier attempts",
                      "not drawn: their disruptions are on the disruptions lane", []))
    for index, attempt in enumerate(order, start=1):
        if index <= len(order) - MAX_ATTEMPT_LANES:
            continue
        end = ends.get(attempt)
        how = ("ended (failed)" if end and end["failed"] else "ended" if end
               else f"last event {_fmt(last_seen[attempt])} UTC")
        row = metadata.get(attempt, {})
        about = (f"attempt {attempt}: from {_fmt(first_seen[attempt])} UTC, {how}"
                 + (f"; {row['chip_count']} × {row['accelerator_type']}" if row.get("chip_count") else ""))
        lanes.append((f"attempt {index}", about, sorted(by_attempt.get(attempt, []), key=lambda s: s.start)))
    disrupted: list[Span] = []
    for row in page.fleet.disruptions:
        restart = row["restart_time"]
        failed = restart - datetime.timedelta(seconds=row["recovery_s"] or 0.0)
        wasted = row["wasted_progress_s"] or 0.0
        if wasted > 0:
            disrupted.append(Span("wasted progress", failed - datetime.timedelta(seconds=wasted), failed,
                                  f"wasted progress: steps after {row['resume_step']} run again "
                                  f"({_duration(wasted)})"))
        disrupted.append(Span("crash", failed, failed, f"crash #{row['disruption_index']} after step "
                                                         f"{row['last_step_before']}"
                              + (" (in-process rollback)" if row["in_process"] else "")))
        disrupted.append(Span("recovery", failed, restart, f"recovery to the restart at {_fmt(restart)} UTC "
                                                           f"({_duration(row['recovery_s'])})"))
    if disrupted:
        lanes.append(("disruptions", "each crash, the progress it wasted and the recovery to its restart",
                      disrupted))
    latest = page.fleet.latest()
    found: dict[str, list[Span]] = {}
    for row in page.fleet.anomalies or ():
        lost, ongoing = fleet_report.anomaly_lost_s(row, latest)
        where = f" on {row['host']}" if row["host"] else ""
        found.setdefault(row["kind"], []).append(Span(
            row["kind"], row["started_at"], fleet_report._anomaly_end(row, latest),
            f"{row['kind']}{where}: {'ongoing, ' if ongoing else ''}lost {'≥ ' if ongoing else ''}"
            f"{_duration(lost)}{' so far' if ongoing else ''}; steps of {_fmt(row['observed_step_s'])} s "
            f"against {_fmt(row['baseline_step_s'])} s"))
    for kind in sorted(found, key=lambda kind: (kind != HANG_KIND, kind)):
        lanes.append((f"{kind}s", f"the {kind}s found", found[kind]))
    return lanes


def _step_stretches(points: list[tuple[datetime.datetime, int]], end: datetime.datetime | None) -> list[Span]:
    """An attempt's step starts as stretches of steps: a gap of more than _GAP_FACTOR median steps
    (and _MIN_GAP_S) begins a new one; the last runs a median step past its last start, up to the
    attempt's end."""
    gaps = [(b - a).total_seconds() for (a, _), (b, _) in itertools.pairwise(points)]
    median = statistics.median(gaps) if gaps else 0.0
    limit = max(_MIN_GAP_S, _GAP_FACTOR * median)
    stretches: list[Span] = []
    first = 0
    for index in range(1, len(points) + 1):
        if index < len(points) and gaps[index - 1] <= limit:
            continue
        start, first_step = points[first]
        last_time, last_step = points[index - 1]
        stop = last_time + datetime.timedelta(seconds=median)
        if end is not None and index == len(points):
            stop = min(stop, max(end, last_time))
        count = index - first
        stretches.append(Span("steps", start, stop, f"steps {first_step}–{last_step}: {count:,} recorded, "
                                                    f"median step {_fmt(median)} s"))
        first = index
    return stretches


# -- Drawing ------------------------------------------------------------------------------------

class _Axis:
    """Times to x positions on the chart, and its tick marks."""

    def __init__(self, start: datetime.datetime, end: datetime.datetime) -> None:
        if end <= start:
            end = start + datetime.timedelta(minutes=5)
        self.start, self.end = start, end
        self.seconds = (end - start).total_seconds()

    def x(self, moment: datetime.datetime) -> float:
        return _LEFT + _WIDTH * min(1.0, max(0.0, (moment - self.start).total_seconds() / self.seconds))

    def ticks(self, y: float) -> str:
        parts = []
        for index in range(6):
            moment = self.start + datetime.timedelta(seconds=self.seconds * index / 5)
            x = self.x(moment)
            anchor = "start" if index == 0 else "end" if index == 5 else "middle"
            parts.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="0" y2="{y:.1f}" class="grid"/>'
                         f'<text x="{x:.1f}" y="{y + 13:.1f}" text-anchor="{anchor}">'
                         f"{moment:%m-%d %H:%M}</text>")
        return "".join(parts)


def _axis_of(page: RunPage) -> _Axis:
    moments = [moment for _, _, spans in page.lanes for span in spans for moment in (span.start, span.end)]
    moments += [row["snapshot_time"] for row in page.fleet.goodput]
    moments += [row["window_start"] for row in page.fleet.goodput if row["window_s"] == 0]
    return _Axis(min(moments), max(moments))


def gantt(page: RunPage, axis: _Axis) -> str:
    """The run's timeline as inline SVG: a lane per attempt, the disruptions and each kind of
    anomaly; each bar has a tooltip; bars of one kind closer than a unit are drawn as one."""
    height = _LANE * len(page.lanes) + 22
    parts = [f'<svg class="gantt" viewBox="0 0 {_LEFT + _WIDTH + 10} {height}" role="img" '
             f'aria-label="Timeline of run {_esc(page.run_id)}">', axis.ticks(_LANE * len(page.lanes))]
    for index, (name, about, spans) in enumerate(page.lanes):
        y = index * _LANE
        parts.append(f'<g class="lane"><title>{_esc(about)}</title><rect x="0" y="{y + 2}" '
                     f'width="{_LEFT + _WIDTH}" height="{_LANE - 4}" class="track"/>'
                     f'<text x="{_LEFT - 8}" y="{y + _LANE / 2 + 4}" '
                     f'text-anchor="end">{_esc(name)}</text></g>')
        for span, count in _merged(spans, axis):
            x0, x1 = axis.x(span.start), axis.x(span.end)
            title = span.about if count == 1 else f"{count} × {span.kind} (the first: {span.about})"
            if span.kind == "crash":
                cross = f"M{x0 - 5:.1f},{y + 4} l10,{_LANE - 8} m0,-{_LANE - 8} l-10,{_LANE - 8}"
                parts.append(f'<path d="{cross}" stroke="{span.color}" stroke-width="2.2" class="crash">'
                             f"<title>{_esc(title)}</title></path>")
                continue
            inset = 3 if span.kind == "steps" else 5
            parts.append(f'<rect x="{x0:.1f}" y="{y + inset}" width="{max(1.0, x1 - x0):.1f}" '
                         f'height="{_LANE - 2 * inset}" fill="{span.color}" data-kind="{_esc(span.kind)}">'
                         f"<title>{_esc(title)}</title></rect>")
    parts.append("</svg>")
    kinds = {span.kind: span.color for _, _, spans in page.lanes for span in spans}
    legend = "".join(f'<li><span class="swatch" style="background:{color}"></span>{_esc(kind)}</li>'
                     for kind, color in kinds.items())
    return f'<figure class="plot run-chart">{"".join(parts)}</figure><ul class="legend">{legend}</ul>'


def _merged(spans: list[Span], axis: _Axis) -> list[tuple[Span, int]]:
    """The spans, those of one kind that start within a unit of the previous one's end merged, so
    that thousands of short checkpoints stay a light page."""
    merged: list[tuple[Span, int]] = []
    last: dict[str, int] = {}
    for span in sorted(spans, key=lambda span: span.start):
        index = last.get(span.kind)
        if index is not None and span.kind != "crash":
            kept, count = merged[index]
            if axis.x(span.start) <= axis.x(kept.end) + 1:
                merged[index] = (dataclasses.replace(kept, end=max(kept.end, span.end)), count + 1)
                continue
        last[span.kind] = len(merged)
        merged.append((span, 1))
    return merged


def goodput_chart(page: RunPage, axis: _Axis) -> str:
    """The run's goodput over time on the timeline's time axis: cumulative (black) and each rolling
    window, thinned to MAX_POINTS points a line."""
    lines: dict[int, list[tuple[datetime.datetime, float]]] = {}
    for row in page.fleet.goodput:
        if row["goodput_pct"] is not None:
            lines.setdefault(row["window_s"], []).append((row["snapshot_time"], row["goodput_pct"]))
    if not lines:
        return _note("No goodput snapshots of this run.")
    height, top = 150, 8
    palette = ["#f28e2b", "#4e79a7", "#b07aa1", "#76b7b2", "#9c755f", "#edc948"]
    parts = [f'<svg class="goodput-line" viewBox="0 0 {_LEFT + _WIDTH + 10} {top + height + 22}" role="img" '
             f'aria-label="Goodput of run {_esc(page.run_id)} over time">', axis.ticks(top + height)]
    for pct in (0, 50, 100):
        y = top + height - height * pct / 100
        parts.append(f'<text x="{_LEFT - 8}" y="{y + 4:.1f}" text-anchor="end">{pct} %</text>'
                     f'<line x1="{_LEFT}" x2="{_LEFT + _WIDTH}" y1="{y:.1f}" y2="{y:.1f}" class="grid"/>')
    legend = []
    for index, window in enumerate(sorted(lines, key=lambda window: (window == 0, window))):
        points = fleet_report._thin(lines[window])
        color = "#1f2430" if window == 0 else palette[index % len(palette)]
        label = "cumulative" if window == 0 else f"last {_window_name(window)}"
        coords = " ".join(f"{axis.x(moment):.1f},{top + height * (1 - min(100.0, max(0.0, pct)) / 100):.1f}"
                          for moment, pct in points)
        parts.append(f'<polyline points="{coords}" fill="none" stroke="{color}" '
                     f'stroke-width="{2.2 if window == 0 else 1.2}"><title>{_esc(label)}</title></polyline>')
        if len(points) == 1:
            cx, cy = coords.split(",")
            parts.append(f'<circle cx="{cx}" cy="{cy}" r="3" fill="{color}"><title>{_esc(label)}</title>'
                         "</circle>")
        legend.append(f'<li><span class="swatch" style="background:{color}"></span>{_esc(label)}</li>')
    parts.append("</svg>")
    return (f'<figure class="plot run-chart">{"".join(parts)}</figure>'
            f'<ul class="legend">{"".join(legend)}</ul>')


def _breakdown(page: RunPage) -> str:
    """Where the run's time went, as one stacked bar: productive, then each bucket (hung time apart)."""
    latest = page.latest
    if latest is None or not latest["total_time_s"]:
        return _note("No elapsed time yet.")
    total = latest["total_time_s"]
    parts = [("productive", latest["productive_time_s"] or 0.0, _GOOD)]
    own = page.fleet.buckets.get(page.run_id, {})
    parts += [(bucket, seconds, bucket_color(bucket))
              for bucket, seconds in sorted(own.items(), key=lambda item: (-item[1], item[0]))]
    bar = "".join(f'<span style="width:{100 * seconds / total:.3f}%;background:{color}" '
                  f'title="{_esc(name)}: {_esc(_duration(seconds))} ({100 * seconds / total:.1f} %)"></span>'
                  for name, seconds, color in parts if seconds > 0)
    legend = "".join(f'<li><span class="swatch" style="background:{color}"></span>{_esc(name)} '
                     f"{_esc(_duration(seconds))} ({100 * seconds / total:.1f} %)</li>"
                     for name, seconds, color in parts if seconds > 0)
    return f'<div class="stack">{bar}</div><ul class="legend">{legend}</ul>'


def _metric_charts(page: RunPage) -> str:
    """Each metric recorded by step (up to MAX_METRICS) over steps, a small chart each."""
    charts = []
    for name in sorted(page.metric_series)[:MAX_METRICS]:
        points = [(step, value) for step, value in page.metric_series[name] if value == value
                  and abs(value) != float("inf")]
        if not points:
            continue
        low_step, high_step = points[0][0], points[-1][0]
        low, high = min(value for _, value in points), max(value for _, value in points)
        span_steps, span_values = max(1, high_step - low_step), (high - low) or 1.0
        coords = " ".join(f"{4 + 292 * (step - low_step) / span_steps:.1f},"
                          f"{84 - 76 * (value - low) / span_values:.1f}" for step, value in points)
        charts.append(f'<figure class="metric"><figcaption>{_esc(name)} <span>steps {low_step}–{high_step}, '
                      f"{_esc(_fmt(low, 4))} to {_esc(_fmt(high, 4))}</span></figcaption>"
                      f'<svg viewBox="0 0 300 90" role="img" aria-label="{_esc(name)} over steps">'
                      f'<polyline points="{coords}" fill="none" stroke="#4e79a7" stroke-width="1.4"/>'
                      "</svg></figure>")
    more = len(page.metric_series) - MAX_METRICS
    note = f'<p class="note">{more} more metrics are in the table only.</p>' if more > 0 else ""
    return f'<div class="metrics">{"".join(charts)}</div>{note}' if charts else ""


def run_section(page: RunPage) -> str:
    """The body of a run's page: its figures, its timeline and goodput over time on one time axis,
    where its time went, its attempts, configs, metrics, disruptions and anomalies."""
    latest = page.latest
    parts = []
    if latest is not None:
        usd = page.fleet.lost_usd(latest)
        figures = [("goodput (cumulative)", _goodput_meter(latest["goodput_pct"])),
                   ("lost", _esc(page.fleet.cost([page.run_id]))),
                   ("elapsed", _esc(_duration(latest["total_time_s"]))),
                   ("chips", _esc(f"{latest['chip_count'] or '—'} × {_fmt(latest['accelerator_type'])}")),
                   ("group", _esc(_fmt(latest["run_group"]))),
                   ("disruptions", _esc(latest["disruptions"])),
                   ("state", "ended" if latest["ended"] else "running"),
                   ("latest snapshot", _esc(f"{_fmt(latest['snapshot_time'])} UTC"))]
        if usd is None and latest["accelerator_type"]:
            figures.append(("price", f"no price for {_esc(latest['accelerator_type'])}"))
        parts.append('<dl class="figures">' + "".join(f"<div><dt>{name}</dt><dd>{value}</dd></div>"
                                                    for name, value in figures) + "</dl>")
    axis = _axis_of(page)
    parts.append("<h3>Every attempt and span</h3>")
    parts.append(gantt(page, axis) if page.lanes else _note("No raw events of this run (a replay with "
                                                            "--no_raw_events keeps none)."))
    parts.append("<h3>Goodput over time</h3>" + goodput_chart(page, axis))
    parts.append("<h3>Where the time went</h3>" + _breakdown(page))
    if page.attempts:
        parts.append("<h3>Attempts</h3>" + _table(
            ("attempt", "started (UTC)", "accelerator", "chips", "location", "platform", "labels"),
            [(row["attempt_id"], row["start_time"], row["accelerator_type"], row["chip_count"],
              row["location"], row["platform"], row["labels"]) for row in page.attempts], limit=None))
    parts.append("<h3>Configs</h3>" + (_table(("source", "key", "value"), page.configs, limit=None)
                                       if page.configs else _note("No configs recorded.")))
    parts.append("<h3>Metrics</h3>")
    if page.last_metrics:
        parts.append(_table(("metric", "last value", "at step"), page.last_metrics, limit=None))
        parts.append(_metric_charts(page))
    else:
        parts.append(_note("No metrics recorded."))
    disruptions = page.fleet.disruptions
    if disruptions:
        parts.append("<h3>Disruptions</h3>" + _table(
            ("#", "restart (UTC)", "last step before", "resumed at step", "wasted progress s", "recovery s",
             "in-process"),
            [(row["disruption_index"], row["restart_time"], row["last_step_before"], row["resume_step"],
              row["wasted_progress_s"], row["recovery_s"], row["in_process"]) for row in disruptions],
            limit=None))
    if page.fleet.anomalies:
        parts.append("<h3>Anomalies</h3>" + _table(
            ("kind", "host", "started (UTC)", "detected (UTC)", "ended (UTC)", "baseline step s",
             "observed step s", "lost s"),
            [(row["kind"], row["host"], row["started_at"], row["detected_at"],
              "ongoing" if row["ended_at"] is None else row["ended_at"], row["baseline_step_s"],
              row["observed_step_s"], fleet_report.lost_cell(row, page.fleet.latest()))
             for row in page.fleet.anomalies], limit=None))
    return "".join(parts)

