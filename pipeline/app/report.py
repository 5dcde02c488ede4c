"""A self-contained HTML report of a DuckDB file written by the pipeline.

One file to open in a browser or attach to a post-mortem. It opens on the runs losing the most
chip-hours (elapsed chip-hours that were not productive, from each run's latest cumulative
snapshot) and what they cost at the ``accelerator_prices`` of their accelerator type, then every
run that needs attention now (the saved query ``stalled_or_regressed``, never cut). Then the
fleet's chip-weighted goodput over time by run group and accelerator type, the costliest runs'
own pages (``pipeline.app.run_page``), goodput over time per run (cumulative and rolling windows),
the badput breakdown per run and for the fleet (each bucket in its fixed colour; hung time, from
the hang anomalies, apart from OTHER), each run's ML Productivity Goodput and its factors (a run
lacking a factor other runs have is shown apart, the factor "missing" and its MPG an upper bound), the
fleet's goodput over the capacity paid for (where ``goodput import capacity`` filled the
``capacity`` table), disruptions on a timeline, step-time deviation, the anomalies the pipeline
found (slowdowns, hangs and stragglers, ``pipeline.core.detect``) on a timeline (what one still
going on has lost so far, "≥", up to its run's latest snapshot for a hang), the runs of each
run group side by side (the user configs that differ between them, their metrics' last values,
and each metric over steps), the alerts the Terraform policies would have fired
(``pipeline.app.alerts``), and the result of every saved fleet query (``goodput_schemas/sql/``).
The plots are drawn with matplotlib and embedded as inline SVG; the tables sort and filter with
an inline script; the file loads nothing from the network::

    from pipeline.app.report import write_report
    write_report(Path("goodput.duckdb"), Path("report.html"))

Every section is an element with a stable id (``summary`` with its tables ``top-runs`` and
``attention``, ``fleet-trend``, ``worst-runs`` with ``run-page-1``…, ``goodput``, ``badput``,
``productivity`` with its tables ``productivity-runs``, ``productivity-missing`` and
``capacity-goodput``, ``disruptions``,
``step-deviation``, ``anomalies``, ``run-groups``, ``alerts``, ``fleet-queries``,
``group-NAME`` for each run group compared and ``query-NAME`` for each saved query), as are the
summary's figures (``run-count``,
``fleet-goodput``, ``chip-hours``, ``disruption-count``, ``anomaly-count``, ``alert-count``).
Legends, panels, bars, timeline rows and tables are capped for large fleets, keeping the runs
losing the most chip-hours and saying what the others lose, and long histories are thinned, so
the page stays readable and light. A file written before anomalies were detected (no
``run_anomalies`` table), or before configs and metrics were recorded (no ``run_configs`` and
``model_metrics`` tables), or before MPG and capacity (no ``accelerator_peaks``, ``jobset_metrics``
or ``capacity`` table), still gives the whole report. The DuckDB file is opened as every reader
opens one (``pipeline.sinks.duckdb.open_reader``): read-only, reaching no other file, with the
pipeline's own views, never the file's. matplotlib is imported only when a report is written.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import html
import io
import math
import re
import zlib
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pipeline.app.run_page import RunPage

from pipeline.app.alerts import ANOMALY_POLICIES, POLICIES, Alert, AlertThresholds, evaluate_connection
from pipeline.core.detect import HANG as HANG_KIND
from pipeline.core.detect import SLOWDOWN, STRAGGLER
from pipeline.core.snapshot import (
    CHECKPOINT_RESTORE,
    CHECKPOINT_SAVE,
    DATA_LOADING_SYNC,
    ELASTIC_REINITIALIZATION,
    ELASTIC_SCALE_UP,
    ELASTIC_SLICE_DOWN,
    INFRASTRUCTURE_RECOVERY,
    OTHER,
    PROGRAM_STARTUP,
    TPU_INITIALIZATION,
    TRAINING_PREP,
    WASTED_PROGRESS,
)

#: The sections of the report: (element id, heading).
SECTIONS = (("fleet-trend", "Fleet over time"), ("worst-runs", "Costliest runs"),
            ("goodput", "Goodput per run"), ("badput", "Badput breakdown"),
            ("productivity", "ML Productivity Goodput and capacity"), ("disruptions", "Disruptions"),
            ("step-deviation", "Step-time deviation"), ("anomalies", "Anomalies"),
            ("run-groups", "Run groups compared"), ("alerts", "Alerts that would have fired"),
            ("fleet-queries", "Fleet queries"))
#: Runs named in a plot's legend; the others are drawn in grey as one entry.
MAX_LEGEND_RUNS = 10
#: Runs drawn in grey after them; the others are left out of a plot of lines, and its note says so.
MAX_GREY_RUNS = 50
#: Runs given their own panel, bar or timeline row (those with the most chip-hours).
MAX_PANELS = 12
MAX_BARS = 30
MAX_TIMELINE_ROWS = 40
MAX_TABLE_ROWS = 200
#: Runs given their own page in the report (those losing the most chip-hours); any run's page is
#: ``goodput report --run RUN``.
MAX_RUN_PAGES = 3
#: Points drawn of one series; a longer history is thinned evenly.
MAX_POINTS = 600
#: Run groups compared (those whose latest run started last), the runs of each (its latest), and
#: the metrics drawn for each, one panel each.
MAX_GROUPS = 10
MAX_GROUP_RUNS = 8
MAX_METRIC_PANELS = 6
INFORMATIONAL = "DATA_LOADING_ASYNC"  # overlaps steps: not lost time

_GOODPUT_COLUMNS = ("run_id", "snapshot_time", "window_s", "window_start", "window_end", "goodput_pct",
                    "productive_time_s", "total_time_s", "disruptions", "step_time_deviation_s", "chip_count",
                    "productive_chip_s", "total_chip_s", "run_group", "accelerator_type", "ended")
_DISRUPTION_COLUMNS = ("run_id", "disruption_index", "restart_time", "last_step_before", "resume_step",
                       "wasted_progress_s", "recovery_s", "in_process")
_GOOD = "#2e9d5b"
_BAD = "#c8463d"
#: Hung time: what the hang anomalies (``run_anomalies``) found with no step, shown apart from the
#: OTHER bucket the engine counts it in (the engine's buckets, and ``badput_snapshots``, keep it there).
HANG = "HANG"
#: Each badput bucket's colour, the same whatever its rank or the runs shown; none is green, the
#: colour of productive time. A custom badput type has one of ``_CUSTOM_COLORS``, chosen by its name.
BUCKET_COLORS = {
    TPU_INITIALIZATION: "#4e79a7", TRAINING_PREP: "#a0cbe8", PROGRAM_STARTUP: "#b07aa1",
    DATA_LOADING_SYNC: "#9c755f", CHECKPOINT_SAVE: "#edc948", CHECKPOINT_RESTORE: "#d4a6c8",
    WASTED_PROGRESS: "#e15759", INFRASTRUCTURE_RECOVERY: "#ff9da7", HANG: "#7d1d2c", OTHER: "#bab0ac",
    ELASTIC_SLICE_DOWN: "#f28e2b", ELASTIC_SCALE_UP: "#ffbe7d", ELASTIC_REINITIALIZATION: "#d37295",
}
_CUSTOM_COLORS = ("#8f6cc2", "#5b6f99", "#c27c4e", "#6d5a8f", "#a36b8a", "#4f5d75")
_KIND_COLORS = {SLOWDOWN: "#f28e2b", HANG_KIND: "#7d1d2c", STRAGGLER: "#17becf"}
_POLICY_STYLE = {"low_goodput": ("v", "#c8463d"), "disruption": ("X", "#7b3fb5"),
                 "step_deviation": ("D", "#d98a1c"), "stalled": ("s", "#3a6fb0"),
                 **{ANOMALY_POLICIES[kind]: ("^", color) for kind, color in _KIND_COLORS.items()}}


def bucket_color(bucket: str) -> str:
    """The colour of badput bucket ``bucket`` (``BUCKET_COLORS``; a custom or newer one by its name)."""
    if bucket in BUCKET_COLORS:
        return BUCKET_COLORS[bucket]
    return _CUSTOM_COLORS[zlib.crc32(bucket.encode()) % len(_CUSTOM_COLORS)]


@dataclasses.dataclass
class _Fleet:
    """What the report shows, read from the file once."""

    goodput: list[dict[str, Any]]
    badput: list[dict[str, Any]]  # the latest cumulative snapshot of each run
    disruptions: list[dict[str, Any]]  # each disruption as its run's latest snapshot reports it
    anomalies: list[dict[str, Any]] | None  # each anomaly's latest row; None: the file has no such table
    queries: list[tuple[str, str, list[str], list[tuple[Any, ...]], str | None]]
    alerts: list[Alert]
    groups: list[_Group] | None = None  # the run groups of several runs; None: no configs or metrics tables
    #: accelerator type -> USD per chip-hour (accelerator_prices)
    prices: dict[str, float] = dataclasses.field(default_factory=dict)
    run_pages: list[RunPage] = dataclasses.field(default_factory=list)  # the costliest runs' own pages
    groups_left_out: list[str] = dataclasses.field(default_factory=list)  # runs of the groups not compared

    @functools.cached_property
    def _latest(self) -> dict[str, dict[str, Any]]:
        latest: dict[str, dict[str, Any]] = {}
        for row in self.goodput:
            if row["window_s"] == 0 and (row["run_id"] not in latest
                                         or row["snapshot_time"] >= latest[row["run_id"]]["snapshot_time"]):
                latest[row["run_id"]] = row
        return latest

    def latest(self) -> dict[str, dict[str, Any]]:
        """Each run's latest cumulative row."""
        return self._latest

    @functools.cached_property
    def _ranked(self) -> list[str]:
        latest = self.latest()
        return sorted(latest, key=lambda run: (-lost_chip_s(latest[run]), -lost_s(latest[run]), run))

    def ranked_runs(self) -> list[str]:
        """Run ids, those losing the most chip-hours (then the most elapsed time) first."""
        return self._ranked

    @functools.cached_property
    def rank(self) -> dict[str, int]:
        """Each run's place in ``ranked_runs``; a run with no snapshot comes after them all."""
        return {run: index for index, run in enumerate(self.ranked_runs())}

    def rank_of(self, run: object) -> int:
        return self.rank.get(run, len(self.rank)) if isinstance(run, str) else len(self.rank)

    def lost_usd(self, row: dict[str, Any]) -> float | None:
        """What a run's lost chip-hours cost (``row``: its latest cumulative row), where its
        accelerator type has a price in ``accelerator_prices``."""
        price = self.prices.get(row["accelerator_type"]) if row["accelerator_type"] else None
        return None if price is None else lost_chip_s(row) / 3600 * price

    def cost(self, runs: Iterable[str]) -> str:
        """What ``runs`` lose: "N chip-hours" and its price where some are priced, "$X" (or "≥ $X"
        where some of them have no price)."""
        latest = self.latest()
        rows = [latest[run] for run in set(runs) if run in latest]
        text = f"{_fmt(sum(map(lost_chip_s, rows)) / 3600, 1)} chip-hours"
        usd = [self.lost_usd(row) for row in rows if lost_chip_s(row) > 0]
        priced = [value for value in usd if value is not None]
        if priced:
            text += f" ({'≥ ' if len(priced) < len(usd) else ''}${sum(priced):,.0f})"
        return text

    def left_out(self, runs: Iterable[str]) -> str:
        """What a cut list says of the runs it leaves out: "and N more runs losing X chip-hours"."""
        runs = set(runs)
        return f"and {len(runs):,} more run{'' if len(runs) == 1 else 's'} losing {self.cost(runs)}"

    @functools.cached_property
    def hang_s(self) -> dict[str, float]:
        """Each run's hung time: the time with no step of its hang anomalies, an ongoing one's up
        to its run's latest snapshot (not only up to when it was found)."""
        hung: dict[str, float] = {}
        latest = self.latest()
        for row in self.anomalies or ():
            if row["kind"] == HANG_KIND:
                hung[row["run_id"]] = hung.get(row["run_id"], 0.0) + anomaly_lost_s(row, latest)[0]
        return hung

    @functools.cached_property
    def buckets(self) -> dict[str, dict[str, float]]:
        """Each run's badput seconds by bucket, as its latest cumulative snapshot has them, with its
        hung time (``hang_s``) taken out of OTHER as HANG (at most all of OTHER); informational
        DATA_LOADING_ASYNC left out."""
        seconds: dict[str, dict[str, float]] = {}
        for row in self.badput:
            if row["badput_source"] != INFORMATIONAL and row["seconds"]:
                seconds.setdefault(row["run_id"], {})[row["badput_source"]] = row["seconds"]
        for run, hung in self.hang_s.items():
            own = seconds.get(run, {})
            hang = min(hung, own.get(OTHER, 0.0))
            if hang > 0:
                own[HANG] = hang
                own[OTHER] -= hang
        return seconds


def anomaly_lost_s(row: dict[str, Any], latest: dict[str, dict[str, Any]]) -> tuple[float, bool]:
    """What an anomaly (``row``: its latest state) has lost, and whether that is only a lower bound
    because it goes on. An ongoing hang's is its time with no step up to its run's latest snapshot
    (``latest``: each run's latest cumulative row), not only up to when it was found; an ongoing
    slowdown's or straggler's, what its last state measured."""
    seconds: float = row["lost_s"] or 0.0
    if row["ended_at"] is not None:
        return seconds, False
    run = latest.get(row["run_id"])
    if row["kind"] == HANG_KIND and run is not None:
        so_far = (run["snapshot_time"] - row["started_at"]).total_seconds()
        seconds = max(seconds, so_far - (row["baseline_step_s"] or 0.0))
    return seconds, True


def lost_cell(row: dict[str, Any], latest: dict[str, dict[str, Any]]) -> float | Cell:
    """An anomaly's lost seconds as a table cell: "≥ X" while it goes on (``anomaly_lost_s``)."""
    seconds, so_far = anomaly_lost_s(row, latest)
    return Cell(f"≥ {_fmt(seconds)}", seconds) if so_far else seconds


def lost_s(row: dict[str, Any]) -> float:
    """A run's elapsed seconds that were not productive (``row``: a cumulative snapshot row)."""
    return max(0.0, (row["total_time_s"] or 0.0) - (row["productive_time_s"] or 0.0))


def lost_chip_s(row: dict[str, Any]) -> float:
    """A run's lost chip-seconds: its badput seconds times its chips (0 where chips are unknown)."""
    return max(0.0, (row["total_chip_s"] or 0.0) - (row["productive_chip_s"] or 0.0))


@dataclasses.dataclass
class _Group:
    """A run group of several runs, as the comparison shows it."""

    name: str
    runs: list[str]  # in start order: its latest MAX_GROUP_RUNS runs
    more_runs: int  # its other runs, not shown
    configs: dict[str, dict[str, str]]  # key -> run -> value: each user config's latest value
    last: dict[str, dict[str, tuple[float, int | None]]]  # metric -> run -> (last value, its step)
    series: dict[str, dict[str, list[tuple[int, float]]]]  # metric -> run -> (step, value), thinned
    earlier_runs: list[str] = dataclasses.field(default_factory=list)  # the runs not shown

    def differing(self) -> list[str]:
        """The config keys whose values differ between the runs (a run without the key differs too)."""
        return [key for key, values in sorted(self.configs.items())
                if len({values.get(run) for run in self.runs}) > 1]


def write_report(duckdb_path: Path, output: Path, thresholds: AlertThresholds | None = None) -> None:
    """Writes the HTML report of the DuckDB file ``duckdb_path`` to ``output``.

    ``thresholds`` are those of the alert policies (default: the Terraform defaults). A file this
    pipeline did not write is a ``ValueError`` (``pipeline.sinks.duckdb.NotOurs``).
    """
    from pipeline.sinks.duckdb import open_reader

    duckdb_path, output = Path(duckdb_path), Path(output)
    if not duckdb_path.exists():
        raise FileNotFoundError(duckdb_path)
    thresholds = thresholds or AlertThresholds()
    connection = open_reader(duckdb_path)
    try:
        fleet = _read(connection, thresholds)
    finally:
        connection.close()
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(_page(duckdb_path.name, fleet, thresholds), encoding="utf-8")


# -- Reading ------------------------------------------------------------------------------------

def _read(connection: Any, thresholds: AlertThresholds) -> _Fleet:
    import duckdb

    from goodput_schemas import saved_queries
    from pipeline.app.fleet_sql import DUCKDB_DATASET, run_saved

    tables = table_names(connection)

    def rows(table: str, columns: Sequence[str], sql: str) -> list[dict[str, Any]]:
        if table not in tables:
            return []
        return [dict(zip(columns, row, strict=True)) for row in connection.execute(sql).fetchall()]

    goodput = rows("goodput_snapshots", _GOODPUT_COLUMNS,
                   f"SELECT {', '.join(_GOODPUT_COLUMNS)} FROM goodput_snapshots "
                   "ORDER BY run_id, snapshot_time")
    badput = rows("badput_snapshots", ("run_id", "badput_source", "seconds"),
                  "SELECT run_id, badput_source, seconds FROM badput_snapshots WHERE window_s = 0 "
                  "QUALIFY snapshot_time = max(snapshot_time) OVER (PARTITION BY run_id)")
    disruptions = rows("disruptions", _DISRUPTION_COLUMNS,
                       f"SELECT {', '.join(_DISRUPTION_COLUMNS)} FROM disruptions QUALIFY row_number() OVER "
                       "(PARTITION BY run_id, disruption_index ORDER BY snapshot_time DESC) = 1 "
                       "ORDER BY restart_time, run_id")
    anomalies = None  # a file written before anomalies were detected has neither the view nor its table
    if "latest_anomalies" in tables:
        cursor = connection.execute("SELECT * FROM latest_anomalies ORDER BY started_at, run_id, kind, host")
        names = [column[0] for column in cursor.description]
        anomalies = [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
    queries: list[tuple[str, str, list[str], list[tuple[Any, ...]], str | None]] = []
    for name, sql in saved_queries(DUCKDB_DATASET).items():
        about = " ".join(line.removeprefix("--").strip() for line in sql.splitlines()
                         if line.startswith("--"))
        try:
            columns, result = run_saved(name, connection)
            queries.append((name, about, columns, result, None))
        except duckdb.Error as error:  # an older file may lack a table the query reads
            queries.append((name, about, [], [], str(error).splitlines()[0]))
    fleet = _Fleet(goodput=goodput, badput=badput, disruptions=disruptions, anomalies=anomalies,
                   queries=queries, alerts=evaluate_connection(connection, thresholds),
                   prices=read_prices(connection, tables))
    fleet.groups = _read_groups(connection, tables, fleet)
    from pipeline.app.run_page import read_run

    fleet.run_pages = [read_run(connection, tables, run) for run in fleet.ranked_runs()[:MAX_RUN_PAGES]]
    return fleet


def table_names(connection: Any) -> set[str]:
    """The tables and views of an open reader of the file."""
    query = "SELECT table_name FROM information_schema.tables"
    return {name for name, in connection.execute(query).fetchall()}


def read_prices(connection: Any, tables: set[str]) -> dict[str, float]:
    """Each accelerator type's price per chip-hour (``accelerator_prices``); none in an older file."""
    if "accelerator_prices" not in tables:
        return {}
    return dict(connection.execute("SELECT accelerator_type, usd_per_chip_hour FROM accelerator_prices "
                                   "WHERE usd_per_chip_hour IS NOT NULL").fetchall())


# A run's user configs: the value it recorded last for each key.
_CONFIGS_SQL = """
SELECT run_id, key, value FROM run_configs WHERE source = 'user' AND list_contains($runs, run_id)
QUALIFY row_number() OVER (PARTITION BY run_id, key ORDER BY recorded_at DESC, value DESC) = 1
"""
# Each metric's last value of a run: at its highest step, else its latest time.
_LAST_METRICS_SQL = """
SELECT run_id, name, value, step FROM model_metrics WHERE list_contains($runs, run_id)
QUALIFY row_number() OVER (PARTITION BY run_id, name ORDER BY step DESC NULLS LAST, metric_time DESC,
                                                              value) = 1
"""
# Each metric of a run over steps: a step's latest value (a restart may run it again), at most about
# MAX_POINTS of them, evenly spaced, with the last.
_SERIES_SQL = """
WITH points AS (
  SELECT run_id, name, step, value FROM model_metrics WHERE step IS NOT NULL AND list_contains($runs, run_id)
  QUALIFY row_number() OVER (PARTITION BY run_id, name, step ORDER BY metric_time DESC, value) = 1
), numbered AS (
  SELECT *, row_number() OVER (PARTITION BY run_id, name ORDER BY step) AS n,
    count(*) OVER (PARTITION BY run_id, name) AS total
  FROM points
)
SELECT run_id, name, step, value FROM numbered
WHERE (n - 1) % ((total + $points - 1) // $points) = 0 OR n = total
ORDER BY run_id, name, step
"""


def _read_groups(connection: Any, tables: set[str], fleet: _Fleet) -> list[_Group] | None:
    """The run groups of several runs with what the comparison shows of them, those whose runs lose
    the most chip-hours first (up to MAX_GROUPS; the others' runs go to ``fleet.groups_left_out``);
    None for a file written before configs and metrics were recorded."""
    if not {"run_configs", "model_metrics"} <= tables:
        return None
    starts: dict[str, list[tuple[datetime.datetime, str]]] = {}
    for group, run, started in connection.execute(
            "SELECT run_group, run_id, min(start_time) AS started FROM run_metadata "
            "WHERE run_group IS NOT NULL GROUP BY ALL ORDER BY run_group, started, run_id").fetchall():
        starts.setdefault(group, []).append((started, run))
    latest = fleet.latest()
    lost = {group: sum(lost_chip_s(latest[run]) for _, run in runs if run in latest)
            for group, runs in starts.items()}
    several = sorted((group for group, runs in starts.items() if len(runs) > 1),
                     key=lambda group: (-lost[group], group))
    fleet.groups_left_out = [run for group in several[MAX_GROUPS:] for _, run in starts[group]]
    groups = [_Group(group, [run for _, run in starts[group][-MAX_GROUP_RUNS:]],
                     max(0, len(starts[group]) - MAX_GROUP_RUNS), {}, {}, {},
                     [run for _, run in starts[group][:-MAX_GROUP_RUNS]]) for group in several[:MAX_GROUPS]]
    runs = sorted({run for group in groups for run in group.runs})
    configs: dict[str, dict[str, str]] = {}
    for run, key, value in connection.execute(_CONFIGS_SQL, {"runs": runs}).fetchall():
        configs.setdefault(run, {})[key] = value
    last: dict[str, dict[str, tuple[float, int | None]]] = {}
    for run, name, value, step in connection.execute(_LAST_METRICS_SQL, {"runs": runs}).fetchall():
        last.setdefault(run, {})[name] = (value, step)
    series: dict[str, dict[str, list[tuple[int, float]]]] = {}
    for run, name, step, value in connection.execute(_SERIES_SQL, {"runs": runs, "points": MAX_POINTS}
                                                     ).fetchall():
        series.setdefault(run, {}).setdefault(name, []).append((step, value))
    for group in groups:
        for run in group.runs:
            for key, value in configs.get(run, {}).items():
                group.configs.setdefault(key, {})[run] = value
            for name, value_step in last.get(run, {}).items():
                group.last.setdefault(name, {})[run] = value_step
            for name, points in series.get(run, {}).items():
                group.series.setdefault(name, {})[run] = points
    return groups


# -- Formatting ---------------------------------------------------------------------------------

def _esc(value: object) -> str:
    return html.escape(str(value), quote=True)


def _fmt(value: object, digits: int = 3) -> str:
    """A cell's text: NULL as an em dash, floats rounded, times to the second (UTC)."""
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:,.{digits}f}".rstrip("0").rstrip(".") if value == value else "NaN"
    if isinstance(value, datetime.datetime):
        return value.strftime("%Y-%m-%d %H:%M:%S")
    return str(value)


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    seconds = round(seconds)
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def _window_name(window_s: int) -> str:
    if window_s % 3600 == 0:
        return f"{window_s // 3600} h"
    if window_s % 60 == 0:
        return f"{window_s // 60} min"
    return f"{window_s} s"


def _label(run_id: str) -> str:
    """A run id as matplotlib text: no mathtext, and shown in a legend even if it starts with _."""
    text = run_id.replace("$", r"\$")
    return "\u200b" + text if text.startswith("_") else text


@dataclasses.dataclass(frozen=True)
class Cell:
    """A table cell shown as ``text`` and sorted by ``value``; a ``value`` of None sorts last
    whichever way the table is sorted, as an empty cell does."""

    text: str
    value: float | None


def _cell(value: object, numeric: bool) -> str:
    css = " class=num" if numeric else ""
    if isinstance(value, Cell):
        key = "none" if value.value is None else f"{value.value:.6f}"
        return f'<td{css} data-v="{key}">{_esc(value.text)}</td>'
    return f"<td{css}>{_esc(_fmt(value))}</td>"


def _table(columns: Sequence[str], rows: Sequence[Sequence[object]], numeric: Sequence[bool] | None = None,
           limit: int | None = MAX_TABLE_ROWS, fleet: _Fleet | None = None,
           run_column: int | None = None) -> str:
    """A table of ``rows`` (sortable and filterable in the page), its first ``limit`` rows (None:
    all) and a note of the rest: how many, and (with ``fleet`` and the ``run_column`` of each row's
    run) what their runs lose. A caller that cuts puts the rows of the costliest runs first."""
    if numeric is None:
        numeric = [all(isinstance(row[i], int | float | Cell) and not isinstance(row[i], bool) for row in rows
                       if row[i] is not None) and any(row[i] is not None for row in rows)
                   for i in range(len(columns))]
    shown = rows if limit is None else rows[:limit]
    head = "".join(f'<th{" class=num" if num else ""}>{_esc(c)}</th>' for c, num in zip(columns, numeric,
                                                                                        strict=True))
    body = "".join("<tr>" + "".join(_cell(v, num) for v, num in zip(row, numeric, strict=True)) + "</tr>"
                   for row in shown)
    more = ""
    if len(rows) > len(shown):
        more = f"{len(rows) - len(shown):,} more rows not shown"
        if fleet is not None and run_column is not None:
            runs = {str(row[run_column]) for row in rows[len(shown):]}
            more += f", of {len(runs):,} runs losing {fleet.cost(runs)} in all"
        more = f'<p class="note">{more}.</p>'
    return (f'<div class="table-wrap"><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'
            f"</div>{more}")


def _note(text: str) -> str:
    return f'<p class="empty">{_esc(text)}</p>'


# -- Plots --------------------------------------------------------------------------------------

class _Plots:
    """Draws figures with matplotlib (no pyplot, so no global backend) and returns inline SVG."""

    def __init__(self) -> None:
        import matplotlib
        from matplotlib import dates

        self.matplotlib: Any = matplotlib
        self.dates: Any = dates
        self.count = 0
        self.style: dict[str, Any] = {
            "svg.fonttype": "none", "font.family": "sans-serif", "font.size": 9,
            "axes.spines.top": False, "axes.spines.right": False, "axes.edgecolor": "#888888",
            "axes.grid": True, "grid.color": "#e4e4e4", "grid.linewidth": 0.6, "axes.axisbelow": True,
            "axes.titlesize": 10, "axes.titleweight": "bold", "axes.titlelocation": "left",
            "legend.frameon": False, "legend.fontsize": 8, "xtick.color": "#555555", "ytick.color": "#555555",
            "axes.labelcolor": "#444444", "svg.hashsalt": None,
        }

    def figure(self, width: float, height: float) -> Any:
        from matplotlib.figure import Figure

        return Figure(figsize=(width, height), layout="constrained")

    def context(self) -> Any:
        self.count += 1
        # A distinct salt per figure keeps the ids of clip paths unique across the inline SVGs.
        return self.matplotlib.rc_context({**self.style, "svg.hashsalt": f"figure-{self.count}"})

    def svg(self, figure: Any, title: str) -> str:
        buffer = io.StringIO()
        figure.savefig(buffer, format="svg", metadata={"Date": None, "Creator": None})
        text = buffer.getvalue()
        text = text[text.index("<svg"):]
        text = re.sub(r'<svg([^>]*?) width="[\d.]+pt" height="[\d.]+pt"', r'<svg\1', text, count=1)
        text = re.sub(r"<metadata>.*?</metadata>", "", text, count=1, flags=re.S)
        return (f'<figure class="plot"><div class="svg" role="img" aria-label="{_esc(title)}">{text}</div>'
                "</figure>")

    def time_axis(self, axis: Any) -> None:
        low, high = axis.dataLim.intervalx
        if math.isfinite(low) and math.isfinite(high) and high - low < 1 / 86400:
            # One instant: show five minutes around it.
            axis.set_xlim(low - 2.5 / 1440, high + 2.5 / 1440)
        locator = self.dates.AutoDateLocator(minticks=3, maxticks=8)
        axis.xaxis.set_major_locator(locator)
        axis.xaxis.set_major_formatter(self.dates.ConciseDateFormatter(locator, show_offset=True))


def _thin(points: Sequence[tuple[datetime.datetime, float]]) -> Sequence[tuple[datetime.datetime, float]]:
    """At most about MAX_POINTS of a series, evenly spaced, with its last point: a long history must
    not make the page heavy."""
    step = -(-len(points) // MAX_POINTS)
    return points if step <= 1 else [*points[:-1:step], points[-1]]


def _run_colors(runs: Sequence[str]) -> dict[str, str]:
    palette = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7",
               "#9c755f", "#17becf"]
    return {run: palette[i % len(palette)] for i, run in enumerate(runs[:MAX_LEGEND_RUNS])}


def _lines_by_run(plots: _Plots, axis: Any, series: dict[str, list[tuple[datetime.datetime, float]]],
                  ranked: Sequence[str]) -> list[str]:
    """One line per run, the costliest first: the top MAX_LEGEND_RUNS in colour and in the legend,
    the next MAX_GREY_RUNS in grey as one entry; returns the runs left out (for the caller's note)."""
    drawn = [run for run in ranked if series.get(run)]
    colors = _run_colors(drawn)
    grey = drawn[len(colors):len(colors) + MAX_GREY_RUNS]
    for run in reversed([*drawn[:len(colors)], *grey]):  # the top runs drawn last, on top
        times, values = zip(*_thin(series[run]), strict=True)
        if run in colors:
            axis.plot(times, values, color=colors[run], linewidth=1.6, marker="o", markersize=2.5,
                      label=_label(run))
        else:
            axis.plot(times, values, color="#bbbbbb", linewidth=0.8, marker="o", markersize=1.5,
                      label=f"{len(grey)} other runs" if run == grey[0] else None)
    handles, labels = axis.get_legend_handles_labels()
    if handles:
        order = sorted(range(len(labels)), key=lambda i: (labels[i].endswith("other runs"), labels[i]))
        axis.legend([handles[i] for i in order], [labels[i] for i in order], loc="center left",
                    bbox_to_anchor=(1.01, 0.5))
    plots.time_axis(axis)
    return drawn[len(colors) + len(grey):]


def _lines_left_out(fleet: _Fleet, left_out: Sequence[str]) -> str:
    if not left_out:
        return ""
    return (f'<p class="note">Lines for the {MAX_LEGEND_RUNS + MAX_GREY_RUNS} runs losing the most '
            f"chip-hours, {_esc(fleet.left_out(left_out))}.</p>")


def _goodput_section(plots: _Plots, fleet: _Fleet, thresholds: AlertThresholds) -> str:
    ranked = fleet.ranked_runs()
    if not ranked:
        return _note("No goodput snapshots in this file.")
    cumulative: dict[str, list[tuple[datetime.datetime, float]]] = {}
    rolling: dict[str, dict[int, list[tuple[datetime.datetime, float]]]] = {}
    for row in fleet.goodput:
        if row["goodput_pct"] is None:
            continue
        point = (row["snapshot_time"], row["goodput_pct"])
        if row["window_s"] == 0:
            cumulative.setdefault(row["run_id"], []).append(point)
        else:
            rolling.setdefault(row["run_id"], {}).setdefault(row["window_s"], []).append(point)
    parts = []
    with plots.context():
        figure = plots.figure(10, 3.4)
        axis = figure.add_subplot()
        axis.set_title("Cumulative goodput of each run")
        axis.axhline(thresholds.goodput_threshold_pct, color=_BAD, linestyle="--", linewidth=1)
        axis.annotate(f"alert below {thresholds.goodput_threshold_pct:g} %",
                      (0, thresholds.goodput_threshold_pct), xycoords=("axes fraction", "data"),
                      xytext=(4, 3), textcoords="offset points", color=_BAD, fontsize=8)
        left_out = _lines_by_run(plots, axis, cumulative, ranked)
        axis.set_ylim(0, 105)
        axis.set_ylabel("goodput %")
        parts.append(plots.svg(figure, "Cumulative goodput of each run over time"))
    parts.append(_lines_left_out(fleet, left_out))
    shown = ranked[:MAX_PANELS]
    windows = sorted({w for run in shown for w in rolling.get(run, {})})
    window_colors = dict(zip(windows, ["#f28e2b", "#4e79a7", "#b07aa1", "#76b7b2", "#9c755f", "#edc948"] * 4,
                             strict=False))
    columns = min(3, len(shown))
    panel_rows = -(-len(shown) // columns)
    with plots.context():
        figure = plots.figure(10, 2.3 * panel_rows + 0.4)
        axes = figure.subplots(panel_rows, columns, squeeze=False, sharey=True)
        for index, axis in enumerate(axes.flat):
            if index >= len(shown):
                axis.set_visible(False)
                continue
            run = shown[index]
            axis.set_title(_label(run), fontsize=9)
            for window in windows:
                points = rolling.get(run, {}).get(window)
                if points:
                    times, values = zip(*_thin(points), strict=True)
                    axis.plot(times, values, color=window_colors[window], linewidth=1, marker="o",
                              markersize=1.8, label=f"last {_window_name(window)}")
            if cumulative.get(run):
                times, values = zip(*_thin(cumulative[run]), strict=True)
                axis.plot(times, values, color="#222222", linewidth=2, marker="o", markersize=2.5,
                          label="cumulative")
            if not cumulative.get(run) and not rolling.get(run):
                axis.text(0.5, 0.5, "no elapsed time yet", transform=axis.transAxes, ha="center",
                          color="#888888", fontsize=8)
                axis.set_xticks([])
            elif not rolling.get(run):
                axis.text(0.5, 0.08, "no rolling windows", transform=axis.transAxes, ha="center",
                          color="#888888", fontsize=8)
            axis.axhline(thresholds.goodput_threshold_pct, color=_BAD, linestyle="--", linewidth=0.8)
            axis.set_ylim(0, 105)
            if cumulative.get(run) or rolling.get(run):
                plots.time_axis(axis)
        handles: dict[str, Any] = {}
        for axis in axes.flat:
            for handle, label in zip(*axis.get_legend_handles_labels(), strict=True):
                handles.setdefault(label, handle)
        if handles:
            figure.legend(list(handles.values()), list(handles), loc="outside upper right",
                          ncols=len(handles))
        figure.suptitle("Cumulative and rolling goodput %, per run", x=0.01, ha="left", fontsize=10,
                        fontweight="bold")
        parts.append(plots.svg(figure, "Cumulative and rolling goodput per run"))
    if len(ranked) > len(shown):
        parts.append(f'<p class="note">Panels for the {len(shown)} runs losing the most chip-hours, '
                     f"{_esc(fleet.left_out(ranked[len(shown):]))}.</p>")
    return "".join(parts)


def _worst_runs_section(fleet: _Fleet) -> str:
    from pipeline.app.run_page import run_section

    if not fleet.run_pages:
        return _note("No runs in this file yet.")
    parts = [f'<p class="note">The {len(fleet.run_pages)} runs losing the most chip-hours, each as its own '
             "page shows it: goodput report --duckdb FILE --run RUN --output run.html writes any run's.</p>"]
    for index, page in enumerate(fleet.run_pages, start=1):
        parts.append(f'<div class="run-page" id="run-page-{index}"><h3 class="run-title">{index}. '
                     f"<code>{_esc(page.run_id)}</code></h3>{run_section(page)}</div>")
    return "".join(parts)


#: Times the fleet's goodput is drawn at, at most: a long history is sampled evenly.
MAX_TREND_TIMES = 300


def fleet_trend(fleet: _Fleet) -> tuple[list[datetime.datetime], dict[str, list[float | None]], bool]:
    """The fleet's cumulative goodput over time: at each of up to MAX_TREND_TIMES snapshot times, the
    productive over elapsed chip-seconds of every run's latest cumulative row at or before it (its
    seconds where no run's chips are known), for the fleet (key ``""``), each run group
    (``"group:NAME"``) and each accelerator type (``"accelerator:TYPE"``); and whether it is
    chip-weighted."""
    rows = sorted((row for row in fleet.goodput if row["window_s"] == 0),
                  key=lambda row: row["snapshot_time"])
    chip_weighted = any((row["total_chip_s"] or 0) > 0 for row in rows)
    times = sorted({row["snapshot_time"] for row in rows})
    step = -(-len(times) // MAX_TREND_TIMES)
    sampled = times if step <= 1 else [*times[:-1:step], times[-1]]
    sums: dict[str, list[float]] = {}  # key -> [productive, total]
    current: dict[str, tuple[float, float, tuple[str, ...]]] = {}
    series: dict[str, list[float | None]] = {}
    index = 0
    for moment_index, moment in enumerate(sampled):
        while index < len(rows) and rows[index]["snapshot_time"] <= moment:
            row = rows[index]
            index += 1
            productive, total = ((row["productive_chip_s"] or 0.0, row["total_chip_s"] or 0.0)
                                 if chip_weighted else
                                 (row["productive_time_s"] or 0.0, row["total_time_s"] or 0.0))
            keys = ("", f"group:{row['run_group'] or 'none'}",
                    f"accelerator:{row['accelerator_type'] or 'unknown'}")
            old_productive, old_total, old_keys = current.get(row["run_id"], (0.0, 0.0, keys))
            for key in old_keys:
                sums.setdefault(key, [0.0, 0.0])
                sums[key][0] -= old_productive
                sums[key][1] -= old_total
            for key in keys:
                sums.setdefault(key, [0.0, 0.0])
                sums[key][0] += productive
                sums[key][1] += total
            current[row["run_id"]] = (productive, total, keys)
        for key, (productive, total) in sums.items():
            series.setdefault(key, [None] * moment_index).append(
                100 * productive / total if total > 0 else None)
    return sampled, series, chip_weighted


def _fleet_trend_section(plots: _Plots, fleet: _Fleet) -> str:
    times, series, chip_weighted = fleet_trend(fleet)
    if not times:
        return _note("No goodput snapshots in this file.")
    latest = fleet.latest()
    parts = []
    with plots.context():
        figure = plots.figure(10, 5.6)
        axes = figure.subplots(2, 1, sharex=True)
        for axis, kind, noun in zip(axes, ("group", "accelerator"), ("run group", "accelerator type"),
                                    strict=True):
            lost: dict[str, float] = {}
            for row in latest.values():
                name = row["run_group" if kind == "group" else "accelerator_type"] or (
                    "none" if kind == "group" else "unknown")
                lost[name] = lost.get(name, 0.0) + lost_chip_s(row)
            names = sorted(lost, key=lambda name: (-lost[name], name))
            shown = names[:MAX_LEGEND_RUNS]
            colors = _run_colors(shown)
            marker = "o" if len(times) < 30 else None  # a few snapshot times: a line would hide them
            for name in reversed(shown):
                values = series.get(f"{kind}:{name}", [])
                axis.plot(times, [math.nan if value is None else value for value in values], marker=marker,
                          markersize=4, color=colors[name], linewidth=1.2, label=_label(name))
            axis.plot(times, [math.nan if value is None else value for value in series[""]], marker=marker,
                      markersize=7, color="#1f2430", linewidth=2.4, label="fleet")
            title = f"By {noun}" + (f" (the {len(shown)} of {len(names)} losing the most chip-hours; the "
                                    "others count in the fleet's)" if len(names) > len(shown) else "")
            axis.set_title(title)
            axis.set_ylim(0, 105)
            axis.set_ylabel("goodput %")
            axis.legend(loc="center left", bbox_to_anchor=(1.01, 0.5))
        plots.time_axis(axes[1])
        parts.append(plots.svg(figure, "Fleet goodput over time, by run group and by accelerator type"))
    weighting = ("chip-weighted: productive over elapsed chip-seconds, runs of unknown chips left out"
                 if chip_weighted else "time-weighted: no run's chips are known")
    parts.append(f'<p class="note">Cumulative goodput of the fleet (black) and of each run group and '
                 f"accelerator type at each snapshot time, from every run's latest snapshot at that time; "
                 f"{weighting}. A batch replay snapshots every run once, at --as_of (by default its last "
                 "event): replays as of several times draw a history.</p>")
    return "".join(parts)


def _badput_section(plots: _Plots, fleet: _Fleet) -> str:
    latest = fleet.latest()
    ranked = [run for run in fleet.ranked_runs() if (latest[run]["total_time_s"] or 0) > 0]
    if not ranked:
        return _note("No elapsed time in this file yet.")
    seconds = fleet.buckets
    chip_weighted = any((latest[run]["total_chip_s"] or 0) > 0 for run in ranked)

    def weight(run: str) -> float:
        row = latest[run]
        return (row["total_chip_s"] or 0) / row["total_time_s"] if chip_weighted else 1.0

    fleet_totals: dict[str, float] = {}
    for run in ranked:
        for source, value in seconds.get(run, {}).items():
            fleet_totals[source] = fleet_totals.get(source, 0.0) + value * weight(run)
    sources = sorted(fleet_totals, key=lambda source: (-fleet_totals[source], source))
    colors = {source: bucket_color(source) for source in sources}
    productive = sum((latest[run]["productive_time_s"] or 0) * weight(run) for run in ranked)
    total = sum(latest[run]["total_time_s"] * weight(run) for run in ranked)
    unit = "chip-hours" if chip_weighted else "hours"
    shown = ranked[:MAX_BARS]
    bars: list[tuple[str, float, dict[str, float], float]] = [
        ("fleet", 100 * productive / total, {s: 100 * v / total for s, v in fleet_totals.items()},
         total / 3600)]
    bars += [(run, 100 * (latest[run]["productive_time_s"] or 0) / latest[run]["total_time_s"],
              {s: 100 * v / latest[run]["total_time_s"] for s, v in seconds.get(run, {}).items()},
              latest[run]["total_time_s"] * weight(run) / 3600) for run in shown]
    with plots.context():
        figure = plots.figure(10, 0.9 + 0.32 * len(bars))
        axis = figure.add_subplot()
        axis.set_title(f"Where the time went: the fleet (weighted by {unit}) and each run's latest snapshot")
        labels = [f"fleet ({_fmt(hours, 1)} {unit})" if i == 0 else _label(run)
                  for i, (run, _, _, hours) in enumerate(bars)]
        positions = list(range(len(bars)))[::-1]
        axis.barh(positions, [bar[1] for bar in bars], color=_GOOD, label="productive", height=0.7)
        left = [bar[1] for bar in bars]
        for source in sources:
            widths = [bar[2].get(source, 0.0) for bar in bars]
            axis.barh(positions, widths, left=left, color=colors[source], label=source, height=0.7)
            left = [a + b for a, b in zip(left, widths, strict=True)]
        for position, bar in zip(positions, bars, strict=True):
            axis.text(1, position, f"{bar[1]:.1f} %", va="center", ha="left", color="white", fontsize=7.5,
                      fontweight="bold")
        axis.set_yticks(positions, labels)
        axis.get_yticklabels()[0].set_fontweight("bold")
        axis.set_xlim(0, 100)
        axis.set_ylim(-0.6, len(bars) - 0.4)
        axis.set_xlabel("% of elapsed time")
        axis.grid(axis="y", visible=False)
        parts = [plots.svg(figure, "Badput breakdown of the fleet and of each run"),
                 '<ul class="legend">' + "".join(
                     f'<li><span class="swatch" style="background:{color}"></span>{_esc(name)}</li>'
                     for name, color in [("productive", _GOOD), *colors.items()]) + "</ul>"]
    if len(ranked) > len(shown):
        parts.append(f'<p class="note">Bars for the {len(shown)} runs losing the most chip-hours, '
                     f"{_esc(fleet.left_out(ranked[len(shown):]))}, who count in the fleet bar.</p>")
    if HANG in fleet_totals:
        parts.append(f'<p class="note">{HANG}: the time with no step of the hangs found (run_anomalies), '
                     "taken out of OTHER, where the goodput engine (and badput_snapshots) counts it.</p>")
    parts.append('<p class="note">Informational DATA_LOADING_ASYNC overlaps steps and is left out. '
                 f"The fleet bar weighs each run by its {'chips' if chip_weighted else 'elapsed time'}"
                 f"{' (runs with unknown chips count zero)' if chip_weighted else ''}.</p>")
    return "".join(parts)


def _saved(fleet: _Fleet, name: str) -> list[dict[str, Any]] | None:
    """The rows of saved query ``name`` as the report ran it; None where it could not run on the
    file (an older file lacks a table it reads)."""
    for query, _, columns, rows, error in fleet.queries:
        if query == name:
            return None if error else [dict(zip(columns, row, strict=True)) for row in rows]
    return None


def _share(value: float | None) -> str:
    """A fraction as a percentage, an em dash where it is unknown."""
    return "—" if value is None else f"{100 * value:.2f} %"


#: MPG's factors, as run_productivity names them (``{factor}_goodput``).
MPG_FACTORS = ("scheduling", "runtime", "program")
_MISSING = Cell("missing", None)  # a factor the run lacks and others have
_UNMEASURED = Cell("n/a", None)  # a factor no run of the file has


def _productivity_section(plots: _Plots, fleet: _Fleet) -> str:
    runs = _saved(fleet, "run_productivity")
    if runs is None:
        return _note("No productivity data in this file: it was written before model metrics, GKE's "
                     "JobSet metrics and accelerator peaks were kept (run_productivity cannot run on it).")
    parts = ['<p class="note">ML Productivity Goodput (MPG) = scheduling goodput (GKE: all the JobSet\'s '
             "pods ready) × runtime goodput (the run's own cumulative goodput) × program goodput (its mean "
             "MFU, else its mean TFLOPS over its chips' peak). The runs losing the most chip-hours "
             "first.</p>"]
    if not runs:
        parts.append(_note("No runs in this file yet."))
        return "".join(parts) + _capacity_part(plots, _saved(fleet, "capacity_goodput"))
    measured = [factor for factor in MPG_FACTORS if any(row[f"{factor}_goodput"] is not None for row in runs)]
    unmeasured = [factor for factor in MPG_FACTORS if factor not in measured]
    if unmeasured:
        how = {"scheduling": "GKE's JobSet metrics: goodput import gke-metrics",
               "program": "an MFU or TFLOPS metric: record_model_metrics",
               "runtime": "a cumulative snapshot"}
        parts.append('<p class="note">No run in this file has a '
                     + " or ".join(f"{factor} goodput ({how[factor]})" for factor in unmeasured)
                     + f" (n/a below): MPG here is {' × '.join(measured) or 'unknown'}, the "
                     + ("factor" if len(measured) == 1 else "factors") + " measured in this file.</p>")
    runs = sorted(runs, key=lambda row: (fleet.rank_of(row["run_id"]), row["run_id"]))
    complete = [row for row in runs if all(row[f"{factor}_goodput"] is not None for factor in measured)]
    incomplete = [row for row in runs if row not in complete]

    def cells(row: dict[str, Any], mpg: object) -> tuple[object, ...]:
        return (row["run_id"], _fmt(row["accelerator_type"]), _fmt(row["chip_count"] or None),
                *(_share(row[f"{factor}_goodput"]) if row[f"{factor}_goodput"] is not None
                  else _MISSING if factor in measured else _UNMEASURED for factor in MPG_FACTORS),
                _fmt(row["program_from"]), mpg)

    columns = ("run", "accelerator", "chips", "scheduling", "runtime", "program", "program from", "MPG")
    numeric = [False, False, True, True, True, True, False, True]
    if complete:
        parts.append('<div id="productivity-runs">' + _table(
            columns, [cells(row, _share(row["ml_productivity_goodput"])) for row in complete],
            numeric=numeric, fleet=fleet, run_column=0) + "</div>")
    else:
        parts.append(_note(f"No run has every factor measured in this file ({', '.join(measured)})."))
    if incomplete:
        parts.append('<h3>Runs missing a factor</h3><p class="note">These runs lack a factor that other runs '
                     "here have, so their MPG is not comparable with the runs above: what is shown is the "
                     "product of the factors they have, an upper bound (≤; a missing factor is at most 1), "
                     "ranked apart from theirs.</p>")

        def bound(row: dict[str, Any]) -> Cell:
            mpg = row["ml_productivity_goodput"]
            return _MISSING if mpg is None else Cell(f"≤ {_share(mpg)}", mpg)

        parts.append('<div id="productivity-missing">' + _table(
            columns, [cells(row, bound(row)) for row in incomplete], numeric=numeric, fleet=fleet,
            run_column=0) + "</div>")
    return "".join(parts) + _capacity_part(plots, _saved(fleet, "capacity_goodput"))


def _capacity_part(plots: _Plots, days: list[dict[str, Any]] | None) -> str:
    """Goodput over the capacity paid for and its idle share, per day and accelerator type."""
    parts = ["<h3>Capacity paid for</h3>"]
    if days is None:
        return "".join(parts) + _note("No capacity table in this file: it was written before capacity "
                                      "could be imported.")
    if not days:
        return "".join(parts) + _note("No capacity imported: goodput import capacity --csv FILE sets the "
                                      "runs' chip-hours against the chips paid for.")
    shown = days[-MAX_BARS:]
    with plots.context():
        figure = plots.figure(10, 0.9 + 0.32 * len(shown))
        axis = figure.add_subplot()
        axis.set_title("Chip-hours paid for: productive, used but not productive, and idle")
        positions = list(range(len(shown)))[::-1]
        productive = [100 * (row["goodput_over_paid"] or 0) for row in shown]
        used = [100 * (1 - row["idle_share"]) if row["idle_share"] is not None else 0.0 for row in shown]
        idle = [100 * max(0.0, row["idle_share"] or 0) for row in shown]
        axis.barh(positions, productive, color=_GOOD, height=0.7, label="productive")
        axis.barh(positions, [u - p for u, p in zip(used, productive, strict=True)], left=productive,
                  color="#f28e2b", height=0.7, label="used, not productive")
        axis.barh(positions, idle, left=used, color="#c9ced6", height=0.7, label="idle")
        axis.set_yticks(positions, [f"{row['day']} {_label(row['accelerator_type'])}" for row in shown])
        axis.set_xlabel("% of the chip-hours paid for")
        axis.grid(axis="y", visible=False)
        axis.legend(loc="center left", bbox_to_anchor=(1.01, 0.5))
        parts.append(plots.svg(figure, "Capacity paid for: productive, used and idle shares per day"))
    if len(days) > len(shown):
        parts.append(f'<p class="note">Bars for the latest {len(shown)} days and accelerator types; all '
                     f"{len(days)} are in the table.</p>")
    rows = [(row["day"], row["accelerator_type"], row["paid_chip_hours"], row["used_chip_hours"],
             row["productive_chip_hours"], _share(row["goodput_over_paid"]), _share(row["idle_share"]))
            for row in days]
    parts.append('<p class="note">Per day (UTC) and accelerator type: goodput over paid capacity is '
                 "productive over paid chip-hours; the idle share is what no run used (below 0 where runs "
                 "used more than was paid for).</p>")
    parts.append('<div id="capacity-goodput">' + _table(
        ("day", "accelerator", "paid chip-hours", "used chip-hours", "productive chip-hours",
         "goodput over paid", "idle share"), rows,
        numeric=[False, False, True, True, True, True, True]) + "</div>")
    return "".join(parts)


def _spans(fleet: _Fleet) -> dict[str, tuple[datetime.datetime, datetime.datetime]]:
    spans: dict[str, tuple[datetime.datetime, datetime.datetime]] = {}
    for row in fleet.goodput:
        if row["window_s"] == 0:
            start, end = spans.get(row["run_id"], (row["window_start"], row["window_end"]))
            spans[row["run_id"]] = (min(start, row["window_start"]), max(end, row["window_end"]))
    return spans


def _timeline(plots: _Plots, title: str, runs: Sequence[str], fleet: _Fleet, draw: Any,
              row_height: float = 0.3) -> str:
    spans = _spans(fleet)
    with plots.context():
        figure = plots.figure(10, 1.1 + row_height * len(runs))
        axis = figure.add_subplot()
        axis.set_title(title)
        positions = {run: len(runs) - 1 - i for i, run in enumerate(runs)}
        for run, position in positions.items():
            if run in spans:
                start, end = spans[run]
                axis.plot([start, end], [position, position], color="#d5dde6", linewidth=7,
                          solid_capstyle="butt", zorder=1)
        draw(axis, positions)
        axis.set_yticks(list(positions.values()), [_label(run) for run in positions])
        axis.set_ylim(-0.7, len(runs) - 0.3)
        axis.grid(axis="y", visible=False)
        plots.time_axis(axis)
        if axis.get_legend_handles_labels()[0]:
            axis.legend(loc="center left", bbox_to_anchor=(1.01, 0.5))
        return plots.svg(figure, title)


def _disruptions_section(plots: _Plots, fleet: _Fleet) -> str:
    if not fleet.disruptions:
        return _note("No disruptions recorded.")
    counts: dict[str, int] = {}
    for row in fleet.disruptions:
        counts[row["run_id"]] = counts.get(row["run_id"], 0) + 1
    disrupted = sorted(counts, key=lambda run: (fleet.rank_of(run), run))
    runs = disrupted[:MAX_TIMELINE_ROWS]

    def draw(axis: Any, positions: dict[str, int]) -> None:
        first = True
        for row in fleet.disruptions:
            if row["run_id"] not in positions:
                continue
            y = positions[row["run_id"]]
            restart = row["restart_time"]
            failed = restart - datetime.timedelta(seconds=row["recovery_s"] or 0)
            axis.plot([failed, restart], [y, y], color="#f2a541", linewidth=7, solid_capstyle="butt",
                      zorder=2, label="recovery (last step to restart)" if first else None)
            axis.scatter([restart], [y], marker="X", s=60, color="#7b3fb5", zorder=3, edgecolors="white",
                         linewidths=0.6, label=("restart (in-process rollback: hollow)" if first else None))
            if row["in_process"]:
                axis.scatter([restart], [y], marker="o", s=14, color="white", zorder=4)
            first = False

    parts = [_timeline(plots, "Disruptions: each run's span, recovery and restart", runs, fleet, draw)]
    if len(disrupted) > len(runs):
        parts.append(f'<p class="note">Rows for the {len(runs)} disrupted runs losing the most chip-hours, '
                     f"{_esc(fleet.left_out(disrupted[len(runs):]))}, in the table.</p>")
    ordered = sorted(fleet.disruptions, key=lambda row: (fleet.rank_of(row["run_id"]), row["restart_time"]))
    table_rows = [(row["run_id"], row["disruption_index"], row["restart_time"], row["last_step_before"],
                   row["resume_step"], row["wasted_progress_s"], row["recovery_s"], row["in_process"])
                  for row in ordered]
    parts.append('<p class="note">The disruptions of the runs losing the most chip-hours first.</p>')
    parts.append(_table(("run", "#", "restart (UTC)", "last step before", "resumed at step",
                         "wasted progress s", "recovery s", "in-process"), table_rows, fleet=fleet,
                        run_column=0))
    return "".join(parts)


def _step_deviation_section(plots: _Plots, fleet: _Fleet, thresholds: AlertThresholds) -> str:
    series: dict[str, list[tuple[datetime.datetime, float]]] = {}
    for row in fleet.goodput:
        if row["window_s"] == 0 and row["step_time_deviation_s"] is not None:
            series.setdefault(row["run_id"], []).append((row["snapshot_time"], row["step_time_deviation_s"]))
    if not series:
        return _note("No step-time deviation in this file (no run has measured steps yet).")
    with plots.context():
        figure = plots.figure(10, 3.2)
        axis = figure.add_subplot()
        axis.set_title("Cumulative step-time deviation from the ideal step time")
        axis.axhline(thresholds.step_deviation_threshold_s, color=_BAD, linestyle="--", linewidth=1)
        axis.annotate(f"alert above {thresholds.step_deviation_threshold_s:g} s for 10 min",
                      (0, thresholds.step_deviation_threshold_s), xycoords=("axes fraction", "data"),
                      xytext=(4, 3), textcoords="offset points", color=_BAD, fontsize=8)
        left_out = _lines_by_run(plots, axis, series, fleet.ranked_runs())
        top = max(value for points in series.values() for _, value in points)
        axis.set_ylim(0, max(top, thresholds.step_deviation_threshold_s) * 1.15 or 1)
        axis.set_ylabel("seconds")
        svg = plots.svg(figure, "Step-time deviation of each run over time")
    return svg + _lines_left_out(fleet, left_out)


def _anomaly_end(row: dict[str, Any], latest: dict[str, dict[str, Any]]) -> datetime.datetime:
    """Where an anomaly's span ends: at its end, or while it goes on at its run's latest snapshot
    (``latest``: each run's latest cumulative row), or when its state was reached if that is later."""
    run = latest.get(row["run_id"])
    end: datetime.datetime = (row["ended_at"] if row["ended_at"] is not None else row["changed_at"]
                              if run is None else max(run["snapshot_time"], row["changed_at"]))
    return end


def _anomalies_section(plots: _Plots, fleet: _Fleet) -> str:
    if fleet.anomalies is None:
        return _note("No anomaly data in this file: it was written before anomalies were detected "
                     "(it has no run_anomalies table).")
    if not fleet.anomalies:
        return _note("No anomalies found.")
    anomalies = fleet.anomalies
    latest = fleet.latest()
    counts: dict[str, tuple[int, int]] = {}  # each run's open anomalies and all of them
    for row in anomalies:
        open_, total = counts.get(row["run_id"], (0, 0))
        counts[row["run_id"]] = (open_ + (row["ended_at"] is None), total + 1)
    runs = sorted(counts, key=lambda run: (fleet.rank_of(run), run))
    shown = runs[:MAX_TIMELINE_ROWS]
    known = {kind: index for index, kind in enumerate(_KIND_COLORS)}
    kinds = sorted({row["kind"] for row in anomalies}, key=lambda kind: (known.get(kind, len(known)), kind))
    colors = {kind: _KIND_COLORS.get(kind, "#888888") for kind in kinds}  # grey: a kind newer than this
    # Each kind on its own line within the run's row, so that a hang inside a slowdown shows.
    offsets = {kind: 0.2 * ((len(kinds) - 1) / 2 - index) for index, kind in enumerate(kinds)}

    def draw(axis: Any, positions: dict[str, int]) -> None:
        for row in anomalies:
            if row["run_id"] not in positions:
                continue
            y = positions[row["run_id"]] + offsets[row["kind"]]
            color = colors[row["kind"]]
            ongoing = row["ended_at"] is None
            end = _anomaly_end(row, latest)
            axis.plot([row["started_at"], end], [y, y], color=color, linewidth=6, solid_capstyle="butt",
                      alpha=0.5 if ongoing else 1.0, zorder=2)
            if ongoing:
                axis.scatter([end], [y], marker=">", s=45, color=color, zorder=3)
            axis.scatter([row["detected_at"]], [y], marker="|", s=90, color="#1f2430", linewidths=1.5,
                         zorder=4)
            if row["host"] is not None:
                axis.annotate(_label(row["host"]), (row["started_at"], y), xytext=(0, -5),
                              textcoords="offset points", color=color, fontsize=7, va="top")
        # Legend entries drawn apart from the data, so that each looks like the kind whatever came first.
        for kind, color in colors.items():
            axis.plot([], [], color=color, linewidth=6, solid_capstyle="butt", label=kind)
        axis.plot([], [], marker="|", markersize=9, markeredgewidth=1.5, color="#1f2430", linestyle="none",
                  label="detected")
        if any(row["ended_at"] is None for row in anomalies):
            axis.plot([], [], marker=">", color="#888888", linestyle="none",
                      label="ongoing (to the run's latest snapshot)")

    parts = [_timeline(plots, "Anomalies: each from its onset to its end", shown, fleet, draw,
                       row_height=0.5)]
    if len(runs) > len(shown):
        parts.append(f'<p class="note">Rows for the {len(shown)} runs with anomalies losing the most '
                     f"chip-hours, {_esc(fleet.left_out(runs[len(shown):]))}, in the table.</p>")
    parts.append('<p class="note">The latest state of each anomaly, ongoing ones first, then those that '
                 "lost the most chip-hours: the time its steps took beyond the run's baseline step time (a "
                 "hang: the time with no step), up to its end. An ongoing one has lost at least what is "
                 "shown (≥): a hang up to its run's latest snapshot, a slowdown or straggler up to its last "
                 "measure.</p>")

    def lost_chip_s_of(row: dict[str, Any]) -> float:
        run = latest.get(row["run_id"])
        return anomaly_lost_s(row, latest)[0] * max(1, int(run["chip_count"] or 0) if run else 0)

    ordered = sorted(anomalies, key=lambda row: (row["ended_at"] is not None, -lost_chip_s_of(row),
                                                 row["started_at"], row["run_id"]))
    table_rows = [(row["run_id"], row["kind"], row["host"], row["started_at"], row["detected_at"],
                   "ongoing" if row["ended_at"] is None else row["ended_at"], row["baseline_step_s"],
                   row["observed_step_s"], lost_cell(row, latest)) for row in ordered]
    parts.append(_table(("run", "kind", "host", "started (UTC)", "detected (UTC)", "ended (UTC)",
                         "baseline step s", "observed step s", "lost s"), table_rows, fleet=fleet,
                        run_column=0))
    return "".join(parts)


def _groups_section(plots: _Plots, fleet: _Fleet) -> str:
    if fleet.groups is None:
        return _note("No configs or metrics in this file: it was written before they were recorded "
                     "(it has no run_configs and model_metrics tables).")
    if not fleet.groups:
        return _note("No run group has several runs.")
    latest = fleet.latest()
    parts = ['<p class="note">The runs of each run group side by side, in the order they started: '
             "cumulative goodput, the user configs whose values differ between them, and each metric's "
             "last value (at the highest step, else the latest time); then each metric over steps. The "
             "groups whose runs lose the most chip-hours first.</p>"]
    if fleet.groups_left_out:
        parts.append(f'<p class="note">The {len(fleet.groups)} run groups losing the most chip-hours; '
                     f"the others' {len(fleet.groups_left_out):,} runs, losing "
                     f"{_esc(fleet.cost(fleet.groups_left_out))}, are not compared.</p>")
    for group in fleet.groups:
        count = f"{len(group.runs) + group.more_runs} runs"
        parts.append(f'<div class="group" id="group-{_esc(group.name)}"><h3>{_esc(group.name)}'
                     f'<span class="count">{count}</span></h3>')
        if group.more_runs:
            parts.append(f'<p class="note">Its latest {len(group.runs)} runs; {group.more_runs} earlier '
                         f"runs are not shown (they lose {_esc(fleet.cost(group.earlier_runs))}).</p>")
        rows: list[list[object]] = [["goodput % (cumulative)",
                                     *(latest.get(run, {}).get("goodput_pct") for run in group.runs)]]
        rows += [[f"config {key}", *(group.configs[key].get(run) for run in group.runs)]
                 for key in group.differing()]
        rows += [[f"{name} (last)", *(_last_metric(group.last[name].get(run)) for run in group.runs)]
                 for name in sorted(group.last)]
        if not group.differing():
            parts.append('<p class="note">Their user configs are the same, or none were recorded.</p>')
        parts.append(_table(("", *group.runs), rows, numeric=[False] * (len(group.runs) + 1)))
        parts.append(_metric_panels(plots, group))
        parts.append("</div>")
    return "".join(parts)


def _last_metric(value_step: tuple[float, int | None] | None) -> str | None:
    """A metric's last value as a cell: the value, and the step it was measured at if it has one."""
    if value_step is None:
        return None
    value, step = value_step
    return _fmt(value, 4) if step is None else f"{_fmt(value, 4)} @ step {step}"


def _metric_panels(plots: _Plots, group: _Group) -> str:
    """Each metric a run group recorded by step, over steps, a line per run: a panel each, up to
    MAX_METRIC_PANELS; non-finite values are left out of the lines (the table shows them)."""
    names = sorted(group.series)
    if not names:
        return _note("No metrics recorded by step.")
    shown = names[:MAX_METRIC_PANELS]
    colors = _run_colors(group.runs)
    columns = min(3, len(shown))
    rows = -(-len(shown) // columns)
    with plots.context():
        figure = plots.figure(10, 0.6 + 2.1 * rows)
        axes = list(figure.subplots(rows, columns, squeeze=False).flat)
        for axis, name in zip(axes, shown, strict=False):
            axis.set_title(_label(name))
            for run in group.runs:
                points = [(step, value) for step, value in group.series[name].get(run, ())
                          if math.isfinite(value)]
                if points:
                    steps, values = zip(*points, strict=True)
                    axis.plot(steps, values, color=colors[run], linewidth=1.4, label=_label(run))
            axis.set_xlabel("step")
        for axis in axes[len(shown):]:
            axis.set_visible(False)
        labels = {label: handle for axis in axes for handle, label in zip(*axis.get_legend_handles_labels(),
                                                                           strict=True)}
        if labels:
            figure.legend(list(labels.values()), list(labels), loc="outside right upper")
        svg = plots.svg(figure, f"Each metric of the runs of {group.name} over steps")
    more = (f'<p class="note">{len(names) - len(shown)} more metrics are in the table only.</p>'
            if len(names) > len(shown) else "")
    return svg + more


def _alerts_section(plots: _Plots, fleet: _Fleet, thresholds: AlertThresholds) -> str:
    rules = [("goodput below",
              f"{thresholds.goodput_threshold_pct:g} % for {_duration(thresholds.goodput_window_s)}"),
             ("new disruption", "count up within 10 min"),
             ("step-time deviation above", f"{thresholds.step_deviation_threshold_s:g} s for 10 min"),
             ("stalled", f"no productive time in the last {_window_name(thresholds.stall_window_s)} "
                         f"for {_duration(thresholds.stall_after_s)}")]
    if thresholds.anomaly_alert_kinds:
        rules.append(("anomaly found", f"{', '.join(thresholds.anomaly_alert_kinds)}: at once"))
    parts = ['<ul class="rules">'
             + "".join(f"<li><b>{_esc(name)}</b> {_esc(rule)}</li>" for name, rule in rules) + "</ul>"]
    if not fleet.alerts:
        parts.append(_note("No alert would have fired on this snapshot history."))
        return "".join(parts)
    alerted = sorted({alert.run_id for alert in fleet.alerts}, key=lambda run: (fleet.rank_of(run), run))
    runs = alerted[:MAX_TIMELINE_ROWS]

    fired = {alert.policy for alert in fleet.alerts}
    order = [policy for policy in POLICIES if policy in fired]
    # Each policy that fired on its own line within the run's row, so stretches and markers do not overlap.
    spacing = min(0.2, 0.8 / max(1, len(order) - 1))
    offsets = {policy: spacing * ((len(order) - 1) / 2 - index) for index, policy in enumerate(order)}

    def draw(axis: Any, positions: dict[str, int]) -> None:
        seen: set[str] = set()
        for alert in sorted(fleet.alerts, key=lambda alert: order.index(alert.policy)):
            if alert.run_id not in positions:
                continue
            y = positions[alert.run_id] + offsets[alert.policy]
            marker, color = _POLICY_STYLE[alert.policy]
            if alert.since < alert.fired_at:
                axis.plot([alert.since, alert.fired_at], [y, y], color=color, linewidth=2, alpha=0.5,
                          zorder=2)
            axis.scatter([alert.fired_at], [y], marker=marker, s=55, color=color, zorder=3,
                         edgecolors="white", linewidths=0.6,
                         label=None if alert.policy in seen else alert.policy)
            seen.add(alert.policy)

    parts.append(_timeline(plots, "When each alert would have fired (line: while its condition held)", runs,
                           fleet, draw, row_height=0.5))
    if len(alerted) > len(runs):
        parts.append(f'<p class="note">Rows for the {len(runs)} alerted runs losing the most chip-hours, '
                     f"{_esc(fleet.left_out(alerted[len(runs):]))}, in the table.</p>")
    ordered = sorted(fleet.alerts, key=lambda alert: (fleet.rank_of(alert.run_id), alert.fired_at))
    rows = [(alert.policy, POLICIES[alert.policy], alert.run_id, alert.since, alert.fired_at, alert.value)
            for alert in ordered]
    parts.append('<p class="note">The alerts of the runs losing the most chip-hours first.</p>')
    parts.append(_table(("policy", "condition", "run", "held since (UTC)", "fired at (UTC)", "value"), rows,
                        fleet=fleet, run_column=2))
    return "".join(parts)


def _queries_section(fleet: _Fleet) -> str:
    parts = []
    for name, about, columns, rows, error in fleet.queries:
        count = f'{len(rows)} row{"" if len(rows) == 1 else "s"}'
        parts.append(f'<div class="query" id="query-{_esc(name)}"><h3><code>{_esc(name)}</code>'
                     f'<span class="count">{count}</span></h3><p class="about">{_esc(about)}</p>')
        if error:
            parts.append(f'<p class="error">Could not run on this file: {_esc(error)}</p>')
        elif rows:
            parts.append(_query_table(fleet, name, columns, rows))
        else:
            parts.append(_note("No rows."))
        parts.append("</div>")
    return "".join(parts)


#: The saved query whose list is never cut: every run that needs attention now.
NEVER_CUT = "stalled_or_regressed"


def _query_table(fleet: _Fleet, name: str, columns: list[str], rows: list[tuple[Any, ...]]) -> str:
    """A saved query's result: the whole of NEVER_CUT's; another's, where it has more than
    MAX_TABLE_ROWS rows and a run_id column, the rows of the runs losing the most chip-hours (a
    note says so, and what the rest lose); else its first rows in its own order."""
    run_column = columns.index("run_id") if "run_id" in columns else None
    if run_column is None:
        return _table(columns, rows, limit=None if name == NEVER_CUT else MAX_TABLE_ROWS)
    if name == NEVER_CUT or len(rows) > MAX_TABLE_ROWS:
        rows = sorted(rows, key=lambda row: fleet.rank_of(row[run_column]))  # stable: the query's order next
    note = ""
    if name != NEVER_CUT and len(rows) > MAX_TABLE_ROWS:
        note = ('<p class="note">More rows than the page shows: those of the runs losing the most '
                "chip-hours.</p>")
    elif name == NEVER_CUT:
        note = '<p class="note">Every row, the runs losing the most chip-hours first.</p>'
    return note + _table(columns, rows, limit=None if name == NEVER_CUT else MAX_TABLE_ROWS, fleet=fleet,
                         run_column=run_column)


# -- The page -----------------------------------------------------------------------------------

def fleet_goodput(latest: dict[str, dict[str, Any]]) -> tuple[float | None, bool]:
    """The fleet's goodput % from each run's latest cumulative row, and whether it is chip-weighted:
    productive over elapsed chip-seconds of the runs whose chips are known; else over seconds."""
    known = [row for row in latest.values() if (row["total_chip_s"] or 0) > 0]
    if known:
        productive_chip_s = sum(row["productive_chip_s"] for row in known)
        return 100 * productive_chip_s / sum(row["total_chip_s"] for row in known), True
    total = sum(row["total_time_s"] or 0 for row in latest.values())
    productive = sum(row["productive_time_s"] or 0 for row in latest.values())
    return (100 * productive / total if total else None), False


def _anomaly_card(anomalies: list[dict[str, Any]] | None) -> tuple[str, str, str, str]:
    """The summary's anomaly figure: (id, open / all, what it says, its style)."""
    if anomalies is None:
        return "anomaly-count", "—", "no anomaly data in this file", ""
    open_ = sum(1 for row in anomalies if row["ended_at"] is None)
    return "anomaly-count", f"{open_} / {len(anomalies)}", "ongoing / all found", "bad" if open_ else "good"


def _summary(fleet: _Fleet, source: str) -> str:
    latest = fleet.latest()
    goodput, chip_weighted = fleet_goodput(latest)
    ended = sum(1 for row in latest.values() if row["ended"])
    chip_s = sum(row["total_chip_s"] or 0 for row in latest.values())
    disruptions = sum(row["disruptions"] or 0 for row in latest.values())
    times = [row["snapshot_time"] for row in fleet.goodput]
    span = f"snapshots {_fmt(min(times))} to {_fmt(max(times))} UTC" if times else "no snapshots yet"
    known = sum(1 for row in latest.values() if (row["total_chip_s"] or 0) > 0)
    goodput_class = "" if goodput is None else "good" if goodput >= 80 else "bad"
    cards = [
        ("run-count", f"{len(latest)}", f"{len(latest) - ended} running, {ended} ended", ""),
        ("fleet-goodput", "—" if goodput is None else f"{goodput:.2f} %",
         "no elapsed time yet" if goodput is None else f"chip-weighted over {known} of {len(latest)} runs"
         if chip_weighted else "time-weighted (no chip counts)", goodput_class),
        ("chip-hours", _fmt(chip_s / 3600, 1 if chip_s < 36_000_000 else 0),  # 10,000 chip-hours: no decimal
         f"{fleet.cost(latest)} lost", ""),
        ("disruption-count", str(disruptions), "across all runs", "bad" if disruptions else ""),
        _anomaly_card(fleet.anomalies),
        ("alert-count", str(len(fleet.alerts)), "would have fired", "bad" if fleet.alerts else "good"),
    ]
    names = {"run-count": "Runs", "fleet-goodput": "Fleet goodput", "chip-hours": "Chip-hours",
             "disruption-count": "Disruptions", "anomaly-count": "Anomalies", "alert-count": "Alerts"}
    card_html = "".join(
        f'<div class="card {css}"><div class="label">{names[key]}</div>'
        f'<div class="value{" long" if len(value) > 8 else ""}" id="{key}">{_esc(value)}</div>'
        f'<div class="sub">{_esc(sub)}</div></div>'
        for key, value, sub, css in cards)
    now = datetime.datetime.now(datetime.timezone.utc).replace(tzinfo=None)
    return (f'<header id="summary"><h1>Fleet goodput report</h1>'
            f'<p class="meta">{_esc(source)} · {_esc(span)} · generated {_esc(_fmt(now))} UTC</p>'
            f'<div class="cards">{card_html}</div>{_top_runs(fleet)}{_attention(fleet)}</header>')


def _goodput_meter(pct: float | None) -> str:
    return ("—" if pct is None else
            f'<span class="meter"><span style="width:{max(0.0, min(100.0, pct)):.1f}%"></span></span>'
            f"{pct:.2f} %")


def _top_bucket(fleet: _Fleet, run: str) -> str:
    """The bucket a run lost the most time to, with its colour, as a cell's HTML."""
    own = fleet.buckets.get(run, {})
    if not own:
        return "—"
    bucket = max(own, key=lambda name: (own[name], name))
    return (f'<span class="swatch" style="background:{bucket_color(bucket)}"></span>{_esc(bucket)} '
            f"({_esc(_duration(own[bucket]))})")


def _top_runs(fleet: _Fleet) -> str:
    """The runs losing the most chip-hours, costliest first: the first thing the page shows after
    the figures, so a fleet of thousands opens on the runs that matter."""
    latest = fleet.latest()
    if not latest:
        return ""
    ranked = fleet.ranked_runs()
    rows = []
    for place, run in enumerate(ranked[:MAX_TABLE_ROWS], start=1):
        row = latest[run]
        lost = lost_chip_s(row) / 3600
        usd = fleet.lost_usd(row)
        rows.append(
            f'<tr><td class="num">{place}</td><td class="run">{_esc(run)}</td>'
            f'<td class="num" data-v="{lost:.6f}">{_esc(_fmt(lost, 1))}</td>'
            f'<td class="num">{"—" if usd is None else f"${usd:,.0f}"}</td>'
            f'<td class="goodput" data-v="{row["goodput_pct"] if row["goodput_pct"] is not None else ""}">'
            f'{_goodput_meter(row["goodput_pct"])}</td><td class="bucket">{_top_bucket(fleet, run)}</td>'
            f'<td>{_esc(_fmt(row["run_group"]))}</td><td>{_esc(_fmt(row["accelerator_type"]))}</td>'
            f'<td class="num">{_esc(row["chip_count"] or "—")}</td>'
            f'<td class="num" data-v="{row["total_time_s"] or 0}">{_esc(_duration(row["total_time_s"]))}</td>'
            f'<td class="num">{row["disruptions"]}</td>'
            f'<td>{"ended" if row["ended"] else "running"}</td></tr>')
    more = ""
    if len(ranked) > len(rows):
        more = f'<p class="note" id="top-runs-more">{_esc(fleet.left_out(ranked[len(rows):]))}.</p>'
    priced = "" if fleet.prices else " (no accelerator_prices in this file: no money figures)"
    return ('<h2 id="top-runs-title">Runs losing the most chip-hours</h2>'
            f'<p class="note">Lost chip-hours: elapsed chip-hours that were not productive (badput seconds '
            "× chips), from each run's latest snapshot; lost $: at the accelerator_prices of its "
            f"accelerator type{priced}. goodput report --run RUN writes any run's own page.</p>"
            '<div class="table-wrap tall"><table class="runs" id="top-runs"><thead><tr><th class="num">#</th>'
            '<th>run</th><th class="num">lost chip-hours</th><th class="num">lost $</th>'
            '<th>goodput (cumulative)</th><th>most lost to</th><th>group</th><th>accelerator</th>'
            '<th class="num">chips</th><th class="num">elapsed</th><th class="num">disruptions</th>'
            f'<th>state</th></tr></thead><tbody>{"".join(rows)}</tbody>'
            f"</table></div>{more}")


def _attention(fleet: _Fleet) -> str:
    """Every run that needs attention now (the saved query ``stalled_or_regressed``), costliest
    first, never cut."""
    flagged = _saved(fleet, "stalled_or_regressed")
    title = "<h2 id=\"attention-title\">Runs that need attention now</h2>"
    if flagged is None:
        return title + _note("stalled_or_regressed cannot run on this file (it was written before the "
                             "tables it reads).")
    if not flagged:
        return title + _note("No run is stalled or has regressed.")
    latest = fleet.latest()
    flagged = sorted(flagged, key=lambda row: (fleet.rank_of(row["run_id"]), str(row["run_id"])))
    rows = []
    for row in flagged:
        run = latest.get(row["run_id"])
        why = [*(["stalled"] if row["stalled"] else []),
               *([f"step time ×{_fmt(row['step_time_ratio'], 2)}"] if row["regressed"] else [])]
        usd = fleet.lost_usd(run) if run else None
        lost = lost_chip_s(run) / 3600 if run else 0.0
        since = row["since_last_step_s"]
        rows.append(
            f'<tr><td class="run">{_esc(row["run_id"])}</td><td>{_esc(", ".join(why))}</td>'
            f'<td class="num" data-v="{"" if since is None else since}">{_esc(_duration(since))}</td>'
            f'<td class="num" data-v="{lost:.6f}">{_esc(_fmt(lost, 1))}</td>'
            f'<td class="num">{"—" if usd is None else f"${usd:,.0f}"}</td>'
            f'<td>{_esc(_fmt(run["run_group"] if run else None))}</td>'
            f'<td>{_esc(_fmt(run["accelerator_type"] if run else None))}</td>'
            f'<td class="num">{_esc((run["chip_count"] if run else None) or "—")}</td></tr>')
    stalled = sum(1 for row in flagged if row["stalled"])
    return (f'{title}<p class="note">All {len(flagged):,} of them ({stalled:,} stalled: not ended, no '
            "productive time in their shortest rolling window; the others' recent step time regressed), "
            "costliest first.</p>"
            '<div class="table-wrap tall"><table class="runs" id="attention"><thead><tr><th>run</th>'
            '<th>why</th><th class="num">since last step</th><th class="num">lost chip-hours</th>'
            '<th class="num">lost $</th><th>group</th><th>accelerator</th><th class="num">chips</th>'
            "</tr></thead>"
            f'<tbody>{"".join(rows)}</tbody></table></div>')


_CSS = """
:root { --ink: #1f2430; --muted: #667085; --line: #e3e6eb; --bg: #f6f7f9; --good: #2e9d5b; --bad: #c8463d; }
* { box-sizing: border-box; }
body { margin: 0; background: var(--bg); color: var(--ink);
  font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif; }
nav { position: sticky; top: 0; z-index: 2; background: #1f2430; padding: 0 24px; display: flex; gap: 4px;
  flex-wrap: wrap; }
nav a { color: #d0d5dd; text-decoration: none; padding: 10px 10px; font-size: 13px; }
nav a:hover { color: #fff; background: #2c3342; }
main { max-width: 1180px; margin: 0 auto; padding: 20px 24px 60px; }
header, section { background: #fff; border: 1px solid var(--line); border-radius: 10px; padding: 18px 22px;
  margin-bottom: 20px; }
h1 { margin: 0 0 4px; font-size: 24px; }
h2 { margin: 0 0 12px; font-size: 18px; }
h3 { margin: 18px 0 4px; font-size: 14px; display: flex; gap: 10px; align-items: baseline; }
h3 .count { color: var(--muted); font-weight: normal; font-size: 12px; }
.meta, .note, .about { color: var(--muted); font-size: 12.5px; margin: 4px 0 10px; }
.empty { color: var(--muted); font-style: italic; padding: 12px 0; }
.error { color: var(--bad); }
.cards { display: grid; grid-template-columns: repeat(auto-fit, minmax(170px, 1fr)); gap: 12px;
  margin: 16px 0; }
.card { border: 1px solid var(--line); border-radius: 8px; padding: 12px 14px;
  border-top: 4px solid #98a2b3; }
.card.good { border-top-color: var(--good); } .card.bad { border-top-color: var(--bad); }
.card .label { color: var(--muted); font-size: 12px; text-transform: uppercase; letter-spacing: .04em; }
.card .value { font-size: 26px; font-weight: 650; margin: 2px 0; font-variant-numeric: tabular-nums; }
.card .value.long { font-size: 21px; }
.table-wrap > table.runs .meter { width: 70px; }
.card .sub { color: var(--muted); font-size: 12px; }
.table-wrap { overflow-x: auto; margin: 8px 0; }
table { border-collapse: collapse; width: 100%; font-size: 12.5px; }
th, td { padding: 5px 10px; border-bottom: 1px solid var(--line); text-align: left; white-space: nowrap; }
th { background: #f2f4f7; color: #475467; font-weight: 600; position: sticky; top: 0; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
tbody tr:hover { background: #f9fafb; }
td.run { font-weight: 600; }
.meter { display: inline-block; width: 110px; height: 9px; background: #f1d5d3; border-radius: 5px;
  margin-right: 8px; vertical-align: middle; overflow: hidden; }
.meter span { display: block; height: 100%; background: var(--good); }
figure.plot { margin: 6px 0 12px; }
figure.plot svg { width: 100%; height: auto; display: block; }
ul.rules { display: flex; flex-wrap: wrap; gap: 8px; padding: 0; margin: 0 0 12px; list-style: none; }
ul.rules li { background: #f2f4f7; border-radius: 14px; padding: 3px 12px; font-size: 12.5px; }
ul.legend { display: flex; flex-wrap: wrap; gap: 4px 16px; padding: 0; margin: 0 0 8px 0; list-style: none;
  font-size: 12px; color: #344054; }
ul.legend .swatch { display: inline-block; width: 11px; height: 11px; border-radius: 2px; margin-right: 6px;
  vertical-align: -1px; }
code { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; }
.table-wrap.tall { max-height: 430px; overflow-y: auto; }
td .swatch { display: inline-block; width: 10px; height: 10px; border-radius: 2px; margin-right: 5px;
  vertical-align: -1px; }
td.bucket { white-space: normal; min-width: 150px; font-size: 12px; }
table.runs th, table.runs td { padding: 5px 7px; }
th.sortable { cursor: pointer; user-select: none; }
th.sortable:hover { color: var(--ink); }
th[data-dir="asc"]::after { content: " ▲"; } th[data-dir="desc"]::after { content: " ▼"; }
svg.gantt, svg.goodput-line { width: 100%; height: auto; display: block; font-size: 11px; }
svg .track { fill: #f6f7f9; } svg .grid { stroke: #e4e4e4; stroke-width: 1; }
svg text { fill: #475467; }
svg .lane:hover .track { fill: #eef1f5; }
.stack { display: flex; height: 18px; border-radius: 4px; overflow: hidden; margin: 6px 0; background: #eee; }
.stack span { display: block; height: 100%; }
dl.figures { display: grid; grid-template-columns: repeat(auto-fit, minmax(150px, 1fr)); gap: 8px 16px;
  margin: 8px 0 4px; }
dl.figures dt { color: var(--muted); font-size: 11.5px; text-transform: uppercase; letter-spacing: .04em; }
dl.figures dd { margin: 0; font-weight: 600; }
.metrics { display: grid; grid-template-columns: repeat(auto-fill, minmax(300px, 1fr)); gap: 10px; }
figure.metric { margin: 0; border: 1px solid var(--line); border-radius: 6px; padding: 6px 8px; }
figure.metric figcaption { font-size: 12px; font-weight: 600; }
figure.metric figcaption span { color: var(--muted); font-weight: normal; }
.run-page + .run-page { border-top: 1px solid var(--line); margin-top: 18px; }
input.filter { margin: 6px 0 2px; padding: 4px 8px; width: 280px; border: 1px solid var(--line);
  border-radius: 6px; font: inherit; font-size: 12.5px; }
"""

#: What makes every table of the page sortable (a click on a column's heading; again, the other way)
#: and filterable (a box above a table of more than a few rows keeps the rows holding its text).
#: Inline and plain: the page loads nothing.
_SCRIPT = """
(function () {
  function key(cell) {
    if (!cell) return "";
    if (cell.dataset.v === "none") return null;
    if (cell.dataset.v !== undefined && cell.dataset.v !== "") return parseFloat(cell.dataset.v);
    var text = cell.textContent.trim();
    if (text === "" || text === "\u2014") return null;
    if (/^[-+$]?[\\d,]*\\.?\\d+( ?%)?$/.test(text)) return parseFloat(text.replace(/[,$% ]/g, ""));
    return text.toLowerCase();
  }
  function compare(a, b) {
    if (a === null) return 0;
    var an = typeof a === "number", bn = typeof b === "number";
    if (an && bn) return a - b;
    if (an !== bn) return an ? -1 : 1;
    return a < b ? -1 : a > b ? 1 : 0;
  }
  document.querySelectorAll(".table-wrap > table").forEach(function (table) {
    var body = table.tBodies[0];
    if (!body || !table.tHead) return;
    var rows = Array.prototype.slice.call(body.rows);
    var heads = table.tHead.rows[0].cells;
    Array.prototype.forEach.call(heads, function (th, column) {
      th.classList.add("sortable");
      th.title = "Sort by this column";
      th.addEventListener("click", function () {
        var dir = th.dataset.dir === "desc" ? "asc" : "desc";
        Array.prototype.forEach.call(heads, function (other) { delete other.dataset.dir; });
        th.dataset.dir = dir;
        var keyed = rows.map(function (row, index) { return [key(row.cells[column]), index, row]; });
        keyed.sort(function (a, b) {  // an empty cell (or a dash) last either way
          if ((a[0] === null) !== (b[0] === null)) return a[0] === null ? 1 : -1;
          return (dir === "asc" ? compare(a[0], b[0]) : compare(b[0], a[0])) || a[1] - b[1];
        });
        keyed.forEach(function (item) { body.appendChild(item[2]); });
      });
    });
    if (rows.length > 8) {
      var box = document.createElement("input");
      box.type = "search";
      box.className = "filter";
      box.placeholder = "Filter these " + rows.length + " rows";
      box.setAttribute("aria-label", box.placeholder);
      if (table.id) box.id = table.id + "-filter";
      box.addEventListener("input", function () {
        var words = box.value.toLowerCase().split(/\\s+/).filter(Boolean);
        rows.forEach(function (row) {
          var text = row.textContent.toLowerCase();
          row.hidden = !words.every(function (word) { return text.indexOf(word) >= 0; });
        });
      });
      table.parentNode.parentNode.insertBefore(box, table.parentNode);
    }
  });
})();
"""


def _page(source: str, fleet: _Fleet, thresholds: AlertThresholds) -> str:
    plots = _Plots()
    bodies = {
        "fleet-trend": lambda: _fleet_trend_section(plots, fleet),
        "worst-runs": lambda: _worst_runs_section(fleet),
        "goodput": lambda: _goodput_section(plots, fleet, thresholds),
        "badput": lambda: _badput_section(plots, fleet),
        "productivity": lambda: _productivity_section(plots, fleet),
        "disruptions": lambda: _disruptions_section(plots, fleet),
        "step-deviation": lambda: _step_deviation_section(plots, fleet, thresholds),
        "anomalies": lambda: _anomalies_section(plots, fleet),
        "run-groups": lambda: _groups_section(plots, fleet),
        "alerts": lambda: _alerts_section(plots, fleet, thresholds),
        "fleet-queries": lambda: _queries_section(fleet),
    }

    def sections() -> Iterator[str]:
        for key, title in SECTIONS:
            yield f'<section id="{key}"><h2>{_esc(title)}</h2>{bodies[key]()}</section>'

    nav = "".join(f'<a href="#{key}">{_esc(title)}</a>' for key, title in (("summary", "Summary"), *SECTIONS))
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>Fleet goodput report · {_esc(source)}</title><style>{_CSS}</style></head>"
            f"<body><nav>{nav}</nav><main>{_summary(fleet, source)}{''.join(sections())}</main>"
            f"<script>{_SCRIPT}</script></body></html>\n")
