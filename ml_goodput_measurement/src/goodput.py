"""The reference's ``goodput`` module, answered from the pipeline's tables instead of Cloud Logging.

Training code keeps the reference's import and calls::

    from ml_goodput_measurement import goodput

    recorder = goodput.GoodputRecorder(job_name, logger_name, logging_enabled=True)
    calculator = goodput.GoodputCalculator(job_name, logger_name, duckdb_path="goodput.duckdb")
    goodput_pct, badput, last_step = calculator.get_job_goodput(include_badput_breakdown=True)

``GoodputCalculator`` reads the latest snapshot the pipeline wrote for the run (``job_name`` is
the run id the job gave; where new workloads reused it, each a run of its own, the latest of them
to start) from a DuckDB file or a BigQuery dataset, chosen by a constructor argument or, so an
unchanged constructor call works, by ``$GOODPUT_DUCKDB`` or ``$GOODPUT_BIGQUERY_DATASET``. It
never reads Cloud Logging and recomputes only where the snapshots cannot answer (below): a few
small parameterized queries per call, each bounded to one run. ``duckdb`` and
``google-cloud-bigquery`` are imported only when a calculator first queries, so a training image
that only records pulls neither (a reader installs the one it uses).

Return values have the reference's shapes and types. Badput breakdowns are keyed by
``BadputType`` (the reference's enum: same names, same values), custom events nested under
``BadputType.CUSTOM_BADPUT_EVENTS`` by their upper-cased type. The numbers are the pipeline's,
which match the reference wherever it is right (``docs/differences.md`` lists where it is not);
in particular goodput plus every bucket but ``DATA_LOADING_ASYNC`` is 100 %. A bucket the
reference has no member for is added to ``OTHER`` in the breakdown; the tables keep it by name.

What each method reads:

* ``get_job_goodput``, ``get_job_goodput_details``: the run's latest cumulative snapshot
  (``goodput_snapshots``, ``badput_snapshots``; tables only: a view in a DuckDB file is the
  file's to define, so none is read).
* ``get_job_goodput_interval``, ``get_interval_metric_details``: the cumulative snapshots at or
  before the interval's bounds (``goodput_snapshots``, ``badput_snapshots``), subtracted.
* ``get_job_goodput_with_exclusions``: the latest snapshot less the figures of the snapshots at
  the exclusion intervals' bounds, subtracted likewise.
* Where no snapshot lies within ``CLOSE_S`` before a bound (after a batch replay, one snapshot per
  run), those two compute the figures at the bound from the run's raw events (``events``) with
  the pipeline's engine, as a replay would: a read of every event of the run. That needs the
  pipeline installed (``fleet-goodput``); without it, or without raw events, they raise ValueError
  saying which replay gives the figures.
* ``get_step_deviation`` (and the details' ``step_time_deviation``): the run's raw ``step_start``
  events (``events``), against the latest snapshot's ideal step time.
"""

from __future__ import annotations

import dataclasses
import datetime
import itertools
import logging
import math
import numbers
import os
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol, cast

from emitter.recorder import ElasticGoodputRecorder, GoodputRecorder
from goodput_schemas import parse_dataset
from ml_goodput_measurement.src.goodput_utils import (
    BadputType,
    ElasticIntervalWorkloadMetricDetails,
    ElasticWorkloadMetricDetails,
    GoodputType,
    IntervalMetricType,
    IntervalWorkloadMetricDetails,
    MetricType,
    WorkloadMetricDetails,
    compute_ideal_step_time,
)

_LOG = logging.getLogger(__name__)
UTC = datetime.timezone.utc
_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=UTC)

#: A bound of an interval or exclusion is taken from the run's last snapshot at or before it when
#: that snapshot is at most this many seconds earlier (two of the stream's default snapshot
#: intervals); else, as after a batch replay (one snapshot per run, at ``--as_of``) or a silence,
#: the figures at the bound are computed from the run's raw events.
CLOSE_S = 60.0

#: Environment variables naming where a calculator reads when its constructor does not say.
DUCKDB_ENV = "GOODPUT_DUCKDB"
BIGQUERY_DATASET_ENV = "GOODPUT_BIGQUERY_DATASET"


#: A badput breakdown: a value per bucket; custom events as {TYPE: value}.
BadputBreakdown = dict[BadputType, "float | dict[str, float]"]
#: The reference's name for a breakdown.
UnproductiveTimeDict = BadputBreakdown

_CUSTOM_PREFIX = "CUSTOM_BADPUT_EVENTS."
# The buckets the reference's base calculator always reports, in its order.
_BASE_BUCKETS = (
    BadputType.TPU_INITIALIZATION, BadputType.TRAINING_PREP, BadputType.DATA_LOADING_SYNC,
    BadputType.DATA_LOADING_ASYNC, BadputType.UNPRODUCTIVE_CHECKPOINT_SAVE_TIME,
    BadputType.UNPRODUCTIVE_CHECKPOINT_RESTORE_TIME, BadputType.PROGRAM_STARTUP,
    BadputType.WASTED_PROGRESS_FROM_DISRUPTION, BadputType.INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION,
)
_ELASTIC_BUCKETS = (BadputType.ELASTIC_SLICE_DOWN, BadputType.ELASTIC_SCALE_UP,
                    BadputType.ELASTIC_REINITIALIZATION)
_BY_NAME = {member.name: member for member in BadputType}


# -- queries ---------------------------------------------------------------------------------------
# Written once for both BigQuery and DuckDB. Values are always query parameters (@name); the only
# text put into the SQL is a table reference, checked against a strict pattern first.

# The run ``{run}`` that the run id a job gave (@run_id, the reference's job_name) names: the latest
# to start of the runs given that name (a name reused by another workload, e.g. a new JobSet, is a
# run of its own, its name in ``run_metadata.run_name``), else the run of that id.
_RUN_OF_NAME = """COALESCE((
  SELECT run_id FROM {run_metadata} WHERE run_name = @run_id ORDER BY start_time DESC, run_id DESC LIMIT 1
), @run_id)"""
_LATEST_CUMULATIVE = """
SELECT snapshot_time, window_start, window_end, goodput_pct, productive_time_s, total_time_s,
       disruptions, max_productive_step, last_step, ideal_step_time_s, stepping_slice_efficiency,
       available_slice_efficiency
FROM {goodput_snapshots}
WHERE run_id = {run} AND window_s = 0
ORDER BY snapshot_time DESC
LIMIT 1
"""
_CUMULATIVE_AT_OR_BEFORE = """
SELECT snapshot_time, window_start, window_end, goodput_pct, productive_time_s, total_time_s,
       disruptions, max_productive_step, last_step, ideal_step_time_s, stepping_slice_efficiency,
       available_slice_efficiency
FROM {goodput_snapshots}
WHERE run_id = {run} AND window_s = 0 AND snapshot_time <= @bound
ORDER BY snapshot_time DESC
LIMIT 1
"""
_BADPUT_OF_SNAPSHOT = """
SELECT badput_source, seconds
FROM {badput_snapshots}
WHERE run_id = {run} AND window_s = 0 AND snapshot_time = @snapshot_time
"""
_LATEST_IDEAL_STEP_TIME = """
SELECT ideal_step_time_s
FROM {goodput_snapshots}
WHERE run_id = {run} AND window_s = 0
ORDER BY snapshot_time DESC
LIMIT 1
"""
# Every step start of the run: a redelivered message repeats its rows, which DISTINCT drops.
_STEP_STARTS = """
SELECT DISTINCT attempt_id, seq, step, event_time
FROM {events}
WHERE run_id = {run} AND kind = @kind
"""
# Every event of the run, in the order a replay of the table reads them (pipeline.sinks.raw_events).
_RUN_EVENTS = """
SELECT run_id, attempt_id, seq, event_time, kind, step, body
FROM {events}
WHERE run_id = {run}
ORDER BY attempt_id, seq
"""
_NAMES_RUNS = "SELECT 1 FROM duckdb_columns() WHERE table_name = 'run_metadata' AND column_name = 'run_name'"
_TABLES = ("goodput_snapshots", "badput_snapshots", "events", "run_metadata")
_PARAMETER = re.compile(r"@([a-z_]+)")


class _Source(Protocol):
    def rows(self, sql: str, parameters: Mapping[str, Any]) -> list[dict[str, Any]]:
        """Rows of a query whose ``{table}`` fields are already filled in."""

    def table(self, name: str) -> str:
        """The SQL reference to output table or view ``name``."""

    def names_runs(self) -> bool:
        """Whether ``run_metadata`` says which name each run was given (``run_name``)."""


class _DuckDBSource:
    """A DuckDB file the pipeline writes (``--duckdb``), opened read-only for each query.

    A query waits (``attempts`` tries, 0.1 s apart) only while another process holds the file's
    lock; a file that is missing, is not DuckDB's, or lacks the pipeline's tables is a ValueError
    at once (the reference's error for "nothing to measure": a monitor polls on).
    """

    def __init__(self, path: str | os.PathLike[str], attempts: int = 50) -> None:
        if not isinstance(path, str | os.PathLike):
            raise TypeError(f"duckdb_path must be a path, got {type(path).__name__}")
        self.path = os.fspath(path)
        self.attempts = attempts
        self._names_runs = False

    def table(self, name: str) -> str:
        return f'"{name}"'

    def names_runs(self) -> bool:
        # A file an older pipeline wrote, and none has written since, lacks the column.
        if not self._names_runs:
            self._names_runs = bool(self.rows(_NAMES_RUNS, {}))
        return self._names_runs

    def rows(self, sql: str, parameters: Mapping[str, Any]) -> list[dict[str, Any]]:
        try:
            import duckdb
        except ImportError as error:  # the emitter does not depend on it: only readers need it
            raise ImportError("GoodputCalculator(duckdb_path=...) needs duckdb: "
                              "pip install fleet-goodput-measurement") from error

        values = {name: _naive_utc(value) for name, value in parameters.items()}
        sql = _PARAMETER.sub(r"$\1", sql)
        if not os.path.isfile(self.path):  # else the read-write fallback below would create it
            raise ValueError(f"no DuckDB file {self.path!r}: the pipeline writes it (--duckdb={self.path}) "
                             "once it runs; check duckdb_path or $" + DUCKDB_ENV)
        for attempt in range(self.attempts):
            try:
                try:
                    # A file brings SQL of its own (its views): the connection reaches no other
                    # file, and no query can change that (pipeline.sinks.duckdb.READER_CONFIG).
                    connection = duckdb.connect(self.path, read_only=True, config={
                        "enable_external_access": False, "lock_configuration": True})
                except duckdb.ConnectionException:
                    # This process already holds the file open for writing (a sink, a live demo):
                    # DuckDB then shares only a connection with the same configuration.
                    connection = duckdb.connect(self.path)
            except duckdb.IOException as error:
                # The pipeline holds the file while it appends a bundle; it lets go within moments.
                # Nothing else that DuckDB cannot open gets better by waiting.
                if "lock" not in str(error):
                    raise ValueError(f"cannot read {self.path!r} as the pipeline's DuckDB file: "
                                     f"{_first_line(error)}") from None
                if attempt == self.attempts - 1:
                    raise TimeoutError(f"{self.path!r} stayed locked by another process for "
                                       f"{self.attempts * 0.1:g} s: {_first_line(error)}") from None
                time.sleep(0.1)
                continue
            try:
                cursor = connection.execute(sql, values)
                names = [column[0] for column in cursor.description or ()]
                return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
            except (duckdb.CatalogException, duckdb.BinderException) as error:
                raise ValueError(f"{self.path!r} does not hold the pipeline's tables (is it a file the "
                                 f"pipeline wrote with --duckdb?): {_first_line(error)}") from None
            finally:
                connection.close()
        raise AssertionError("unreachable")


class _BigQuerySource:
    """A BigQuery dataset the pipeline writes (``--bigquery_dataset``), through the real client."""

    def __init__(self, dataset: str, client: Any = None) -> None:
        self.project, self.dataset = parse_dataset(dataset)
        if client is not None and not callable(getattr(client, "query_and_wait", None)):
            raise TypeError("bigquery_client must be a google.cloud.bigquery.Client, got "
                            f"{type(client).__name__}")
        self._client = client

    def table(self, name: str) -> str:
        return f"`{self.project}.{self.dataset}.{name}`"

    def names_runs(self) -> bool:
        return True  # the tables have the schemas of goodput_schemas/tables/ (Terraform keeps them so)

    def rows(self, sql: str, parameters: Mapping[str, Any]) -> list[dict[str, Any]]:
        try:
            from google.cloud import bigquery
        except ImportError as error:  # the emitter does not depend on it: only readers need it
            raise ImportError("GoodputCalculator(bigquery_dataset=...) needs google-cloud-bigquery: "
                              "pip install fleet-goodput-measurement") from error

        from google.api_core.exceptions import NotFound

        if self._client is None:
            self._client = bigquery.Client(project=self.project)
        query_parameters = [bigquery.ScalarQueryParameter(name, _bigquery_type(value), value)
                            for name, value in parameters.items()]
        try:
            rows = self._client.query_and_wait(
                sql, job_config=bigquery.QueryJobConfig(query_parameters=query_parameters))
        except NotFound as error:  # as a DuckDB file that is missing or lacks the tables
            raise ValueError(f"BigQuery dataset {self.project}.{self.dataset} does not hold the pipeline's "
                             f"tables (is it the pipeline's --bigquery_dataset?): {error.message}") from None
        return [dict(row.items()) for row in rows]


def _first_line(error: Exception) -> str:
    return next(iter(str(error).splitlines()), "")


def _bigquery_type(value: object) -> str:
    if isinstance(value, datetime.datetime):
        return "TIMESTAMP"
    if isinstance(value, bool):
        return "BOOL"
    if isinstance(value, int):
        return "INT64"
    if isinstance(value, float):
        return "FLOAT64"
    return "STRING"


def _naive_utc(value: object) -> object:
    if isinstance(value, datetime.datetime) and value.tzinfo is not None:
        return value.astimezone(UTC).replace(tzinfo=None)
    return value


def _aware_utc(value: datetime.datetime) -> datetime.datetime:
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def _ideal_step_time(value: object) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"configured_ideal_step_time must be a number of seconds, got {type(value).__name__}")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"configured_ideal_step_time must be a positive number of seconds, got {value!r}")
    return float(value)


def _micros(moment: datetime.datetime) -> int:
    return (moment - _EPOCH) // datetime.timedelta(microseconds=1)


def _from_micros(micros: int) -> datetime.datetime:
    return _EPOCH + datetime.timedelta(microseconds=micros)


def _optional(value: object) -> float | None:
    return None if value is None else float(value)  # type: ignore[arg-type]


def _moment(value: object, name: str) -> datetime.datetime:
    """A bound given as a timezone-aware datetime, in UTC. The reference's error for anything else
    is a TypeError (it compares the bound with the aware times of its log), said clearly here."""
    if not isinstance(value, datetime.datetime):
        raise TypeError(f"{name} must be a timezone-aware datetime, got {type(value).__name__}")
    if value.tzinfo is None or value.utcoffset() is None:
        raise TypeError(f"{name} must be timezone-aware (UTC), got the naive {value!r}")
    return value.astimezone(UTC)


def _ordered(start: datetime.datetime, end: datetime.datetime) -> None:
    if start >= end:
        raise ValueError(f"interval_start {start} must be before interval_end {end}")


@dataclasses.dataclass(frozen=True)
class _Snapshot:
    """One cumulative snapshot of a run: its goodput row and its badput seconds by source."""

    time: datetime.datetime
    productive_s: float
    total_s: float  # elapsed, less excluded time
    disruptions: int
    max_productive_step: int
    last_step: int | None
    ideal_step_time_s: float | None
    badput_s: dict[str, float]
    stepping_slice_efficiency: float | None = None
    available_slice_efficiency: float | None = None
    span_s: float = 0.0  # window_end - window_start: what the slice efficiencies are weighted over
    started: datetime.datetime | None = None  # window_start: when the run began

    @classmethod
    def before_run(cls, at: datetime.datetime) -> _Snapshot:
        """The figures before the run's first snapshot: nothing measured yet."""
        return cls(at, 0.0, 0.0, 0, 0, None, None, {})


@dataclasses.dataclass(frozen=True)
class _Interval:
    """Goodput and badput between two cumulative snapshots (``first`` may be ``before_run``)."""

    first: _Snapshot
    last: _Snapshot
    goodput_pct: float
    breakdown: BadputBreakdown
    total_s: float
    disruptions: int


class _Replay:
    """A run's events as the pipeline's engine reads them: its figures as of any time, each
    computed by a state of its own, as a batch replay (``python -m pipeline --as_of``) does."""

    def __init__(self, new_state: Callable[[], Any], batches: list[Any]) -> None:
        self._new_state = new_state
        self._batches = batches

    def figures(self, as_of: datetime.datetime,
                exclusions: Sequence[tuple[datetime.datetime, datetime.datetime]] = ()) -> _Snapshot:
        """The run's cumulative figures as of ``as_of``, ``exclusions`` left out."""
        state = self._new_state()
        for batch in self._batches:
            state.add_batch(batch)
        snapshot = state.snapshot(_micros(as_of), windows_s=(),
                                  exclusions=[(_micros(start), _micros(end)) for start, end in exclusions])
        if snapshot is None:
            return _Snapshot.before_run(as_of)
        window = snapshot.cumulative
        return _Snapshot(
            time=as_of, productive_s=window.productive_s, total_s=window.total_s,
            disruptions=window.disruptions, max_productive_step=snapshot.max_productive_step,
            last_step=snapshot.last_step, ideal_step_time_s=snapshot.ideal_step_time_s,
            badput_s=dict(window.badput_s), stepping_slice_efficiency=snapshot.stepping_slice_efficiency,
            available_slice_efficiency=snapshot.available_slice_efficiency,
            span_s=(window.end_us - window.start_us) / 1e6, started=_from_micros(window.start_us))


class GoodputCalculator:
    """The reference's ``GoodputCalculator``, reading the pipeline's snapshots of one run.

    Args:
        job_name: The run (the recorder's ``job_name``); of the runs of new workloads that reused
            it, the latest to start.
        logger_name: Accepted for the reference's signature; not used (nothing reads a log), so
            unlike the reference's it may be left out.
        cloud_logger: Accepted for the reference's signature; not used.
        using_pathways: Accepted for the reference's signature; it has no effect there either.
        max_logs_retention_period: Accepted for the reference's signature; not used.
        gcs_path: Accepted for the reference's signature; there is no cache to sync.
        cache_dir: Accepted for the reference's signature; there is no cache.
        duckdb_path: Read this DuckDB file (the pipeline's ``--duckdb``). Defaults to
            ``$GOODPUT_DUCKDB``.
        bigquery_dataset: Read this BigQuery dataset, ``PROJECT.DATASET`` (the pipeline's
            ``--bigquery_dataset``). Defaults to ``$GOODPUT_BIGQUERY_DATASET``.
        bigquery_client: A ``google.cloud.bigquery.Client`` to query with; by default one is
            made for the dataset's project with the application default credentials.

    Raises:
        ValueError: Neither or both of a DuckDB file and a BigQuery dataset are given. (A query
            raises ValueError at once for a DuckDB file that is missing or not the pipeline's, or a
            BigQuery dataset without its tables; it waits up to 5 s for a file another process
            holds, then raises TimeoutError.)
    """

    #: Whether the breakdown always holds the elastic buckets (the reference's elastic calculator).
    _ELASTIC = False

    def __init__(
        self,
        job_name: str,
        logger_name: str | None = None,
        cloud_logger: object = None,
        using_pathways: bool = False,
        max_logs_retention_period: datetime.timedelta | None = None,
        gcs_path: str | None = None,
        cache_dir: str = "/tmp",
        *,
        duckdb_path: str | os.PathLike[str] | None = None,
        bigquery_dataset: str | None = None,
        bigquery_client: Any = None,
    ) -> None:
        if not isinstance(job_name, str) or not job_name:
            raise ValueError(f"job_name must be a non-empty string, got {job_name!r}")
        self.job_name = job_name
        self.logger_name = logger_name
        self.using_pathways = using_pathways
        if duckdb_path is None and bigquery_dataset is None:
            duckdb_path = os.environ.get(DUCKDB_ENV, "").strip() or None
            bigquery_dataset = os.environ.get(BIGQUERY_DATASET_ENV, "").strip() or None
        if (duckdb_path is None) == (bigquery_dataset is None):
            raise ValueError(
                "say where the pipeline's tables are: duckdb_path=... or bigquery_dataset='PROJECT.DATASET' "
                f"(or ${DUCKDB_ENV} / ${BIGQUERY_DATASET_ENV}), exactly one of them; on a workstation, "
                "with no cloud: record with GOODPUT_DESTINATION=file:events.jsonl, run goodput replay "
                f"--events=events.jsonl --duckdb=goodput.duckdb, set {DUCKDB_ENV}=goodput.duckdb "
                "(docs/migrating.md, \"See your numbers on a workstation\")")
        self._source: _Source = (_DuckDBSource(duckdb_path) if duckdb_path is not None
                                 else _BigQuerySource(str(bigquery_dataset), bigquery_client))
        self._tables = {name: self._source.table(name) for name in _TABLES}
        self._last: _Snapshot | None = None

    # -- the reference's API ---------------------------------------------------------------------

    def sync_to_gcs(self) -> None:
        """Does nothing: there is no cache to sync (the tables are the record)."""

    def get_job_goodput(
        self,
        include_badput_breakdown: bool = False,
        configured_ideal_step_time: float | None = None,
    ) -> tuple[float, BadputBreakdown, int]:
        """The run's cumulative goodput as of its latest snapshot.

        Args:
            include_badput_breakdown: Whether to return the badput breakdown; ``{}`` otherwise.
            configured_ideal_step_time: Accepted for the reference's signature. It does not change
                goodput there either; the pipeline takes the configured ideal step time from the
                recorder (``GoodputRecorder(configured_ideal_step_time=...)``).

        Returns:
            (goodput %, badput % by ``BadputType``, max productive step), as the reference.

        Raises:
            ValueError: The tables hold no snapshot of the run, or its elapsed time is zero.
        """
        del configured_ideal_step_time
        snapshot = self._latest()
        breakdown = self._breakdown(snapshot.badput_s, snapshot.total_s, percent=True) \
            if include_badput_breakdown else {}
        return 100.0 * snapshot.productive_s / snapshot.total_s, breakdown, snapshot.max_productive_step

    def get_job_goodput_interval(
        self, interval_start: datetime.datetime, interval_end: datetime.datetime
    ) -> tuple[float, BadputBreakdown, int, float, int]:
        """Goodput and badput within ``[interval_start, interval_end]``, from cumulative snapshots.

        The figures are the difference between the run's last cumulative snapshot at or before
        ``interval_end`` and its last one at or before ``interval_start`` (none: the run started
        inside the interval, and counts from its start). So the interval measured really runs
        from the first of those snapshots to the second: each bound is early by at most one
        snapshot interval (the streaming pipeline's ``--snapshot_interval_s``, 30 s by default;
        a batch replay writes one snapshot per run and ``--as_of``). A bucket that shrank between
        the two snapshots (time first counted as OTHER, later explained) counts 0, as the
        reference's sanitizing does.

        Returns:
            (goodput %, badput % by ``BadputType``, max productive step, elapsed seconds,
            disruptions), as the reference.

        Raises:
            ValueError: A bound is None (the reference's error), ``interval_start`` is not before
                ``interval_end``, no snapshot at or before ``interval_end``, or no elapsed time
                between the two snapshots.
            TypeError: A bound is not a timezone-aware datetime (as the reference's).
        """
        if interval_start is None or interval_end is None:
            raise ValueError("Start and end times are required to get log entries from an interval "
                             f"window: got interval_start={interval_start!r}, interval_end={interval_end!r}")
        start, end = _moment(interval_start, "interval_start"), _moment(interval_end, "interval_end")
        _ordered(start, end)
        interval = self._interval(start, end)
        return (interval.goodput_pct, interval.breakdown, interval.last.max_productive_step,
                interval.total_s, interval.disruptions)

    def get_interval_metric_details(
        self, interval_start: datetime.datetime, interval_end: datetime.datetime
    ) -> IntervalWorkloadMetricDetails:
        """The reference's ``IntervalWorkloadMetricDetails`` of an interval, in percent.

        ``get_job_goodput_interval``'s goodput (under ``GoodputType.TOTAL``) and breakdown, and the
        interval's length in whole seconds. As the reference: an interval with nothing to
        measure gives empty goodput and badput (logged), not an error.

        Raises:
            TypeError: A bound is not a timezone-aware datetime (None included), as the
                reference's.
            ValueError: ``interval_start`` is not before ``interval_end`` (the reference answers
                a negative or zero size).
        """
        return self._interval_details(interval_start, interval_end)[0]

    def get_job_goodput_with_exclusions(
        self,
        exclusion_intervals: Sequence[tuple[datetime.datetime, datetime.datetime]],
        include_badput_breakdown: bool = False,
        configured_ideal_step_time: float | None = None,
    ) -> tuple[float, BadputBreakdown, int, float]:
        """The run's cumulative goodput with the time of ``exclusion_intervals`` left out.

        The intervals are merged; one that is empty, reversed or not timezone-aware is skipped
        with a warning, as the reference skips it (the reference also skips an aware one that is
        not in UTC; here it is converted). Where a snapshot of the run lies at most ``CLOSE_S``
        before every bound (a stream's, every 30 s), what an interval held is the difference of
        the run's cumulative snapshots at or before its bounds, as in ``get_job_goodput_interval``;
        it is taken out of the elapsed time, of productive time and of every bucket, so each bound
        is early by at most that much. Otherwise (a batch replay writes one snapshot per run, at
        ``--as_of``) the figures are computed from the run's raw events by the pipeline's engine,
        exactly as a replay with ``--exclude=START/END`` computes them; that needs the pipeline
        (``pip install fleet-goodput``) and the raw ``events`` table, and costs a read of every
        event of the run.

        Args:
            exclusion_intervals: ``(start, end)`` pairs of timezone-aware datetimes.
            include_badput_breakdown: Whether to return the badput breakdown; ``{}`` otherwise.
            configured_ideal_step_time: Accepted for the reference's signature (there it only
                updates its cached step information).

        Returns:
            (goodput %, badput % by ``BadputType``, max productive step, excluded seconds), as
            the reference; (0.0, {}, max productive step, excluded seconds) when everything is
            excluded.

        Raises:
            ValueError: The tables hold no snapshot of the run, or its elapsed time is zero; a
                bound needs the raw events, and they or the pipeline are missing (the message
                says how to get the exact figures).
            TypeError: ``exclusion_intervals`` is not a list of pairs of datetimes.
        """
        del configured_ideal_step_time
        intervals = _merged(exclusion_intervals)
        latest = self._latest()
        measured = [interval for interval in intervals if interval[0] < latest.time]  # none after it
        bounds = sorted({min(bound, latest.time) for interval in measured for bound in interval})
        near = {bound: self._near(bound, latest) for bound in bounds}
        max_step = latest.max_productive_step
        if all(figures is not None for figures in near.values()):
            excluded = 0.0
            productive = latest.productive_s
            badput = dict(latest.badput_s)
            for start, end in measured:
                first, last = near[start], near[min(end, latest.time)]
                assert first is not None and last is not None
                excluded += max(0.0, last.total_s - first.total_s)
                productive -= last.productive_s - first.productive_s
                for source in last.badput_s.keys() | first.badput_s.keys():
                    badput[source] = badput.get(source, 0.0) - (
                        last.badput_s.get(source, 0.0) - first.badput_s.get(source, 0.0))
            total = max(0.0, latest.total_s - excluded)
        else:
            exact = self._replay(
                "replay the run's events with `python -m pipeline --from_duckdb=FILE --duckdb=OUT "
                f"--as_of={latest.time.isoformat()} --exclude=START/END`").figures(latest.time, measured)
            productive, badput, total, max_step = exact.productive_s, exact.badput_s, exact.total_s, \
                exact.max_productive_step
            excluded = max(0.0, latest.total_s - total)
        if total == 0.0:
            return 0.0, {}, max_step, excluded
        productive = min(max(0.0, productive), total)
        badput = {source: seconds if 0.0 <= seconds <= total else 0.0 for source, seconds in badput.items()}
        breakdown = self._breakdown(badput, total, percent=True) if include_badput_breakdown else {}
        return 100.0 * productive / total, breakdown, max_step, excluded

    def get_step_deviation(self, configured_ideal_step_time: float | None = None) -> dict[int, float]:
        """``{step: |step time - ideal step time|}`` in seconds, for every measured step.

        A step's time runs from its start to the next step's start in the same attempt, for
        consecutive step numbers; where a restarted attempt runs a step again, its time replaces
        the earlier one (in the earlier one's place), as the reference's. The step starts come
        from the raw ``events`` table (the pipeline leaves it empty with ``--no_raw_events``;
        the snapshots keep only the summary, ``step_time_deviation_s``). One query returns every
        step start of the run, so the cost grows with the run's length, as the reference's
        re-read of its log does.

        Args:
            configured_ideal_step_time: The ideal step time to compare with. Without it, the
                latest snapshot's (the recorder's configured one, else the pipeline's estimate),
                else ``goodput_utils.compute_ideal_step_time`` over these step times.

        Raises:
            ValueError: No step times, or no ideal step time; ``configured_ideal_step_time`` is
                not a positive number of seconds (the reference takes 0 for none and answers a
                negative one).
            TypeError: ``configured_ideal_step_time`` is not a number.
        """
        ideal = _ideal_step_time(configured_ideal_step_time)
        step_times = self._step_times()
        if not step_times:
            raise ValueError(f"No step times available for run {self.job_name!r}: no consecutive step "
                             "starts in the events table (is the pipeline run with --no_raw_events?)")
        if ideal is None:
            rows = self._query(_LATEST_IDEAL_STEP_TIME, {"run_id": self.job_name})
            ideal = _optional(rows[0]["ideal_step_time_s"]) if rows else None
        if ideal is None:
            ideal = compute_ideal_step_time(list(step_times.values()))
        if not ideal:
            raise ValueError(f"No ideal step time available for run {self.job_name!r}")
        return {step: abs(seconds - ideal) for step, seconds in step_times.items()}

    def get_job_goodput_details(self) -> WorkloadMetricDetails:
        """The reference's ``WorkloadMetricDetails`` of the latest snapshot, in seconds.

        ``step_time_deviation`` is ``get_step_deviation()`` against the snapshot's ideal step time
        (``{}`` when it cannot be had, as the reference's). ``total_excluded_time`` is 0.0, as the
        reference hard-codes it.
        """
        snapshot = self._latest()
        deviations: dict[int, float] = {}
        if snapshot.ideal_step_time_s:
            try:
                deviations = self.get_step_deviation(snapshot.ideal_step_time_s)
            except ValueError as error:  # as the reference: the rest without step information
                _LOG.info("no step time deviation for run %r: %s", self.job_name, error)
        return {
            MetricType.GOODPUT_TIME.value: {GoodputType.TOTAL: snapshot.productive_s},
            MetricType.BADPUT_TIME.value: self._breakdown(snapshot.badput_s, snapshot.total_s, percent=False),
            MetricType.MAX_PRODUCTIVE_STEP.value: snapshot.max_productive_step,
            MetricType.TOTAL_ELAPSED_TIME.value: snapshot.total_s,
            MetricType.DISRUPTION_COUNT.value: snapshot.disruptions,
            MetricType.STEP_TIME_DEVIATION.value: deviations,
            MetricType.IDEAL_STEP_TIME.value: snapshot.ideal_step_time_s or 0.0,
            MetricType.TOTAL_EXCLUDED_TIME.value: 0.0,
        }

    # -- plumbing --------------------------------------------------------------------------------

    def _latest(self) -> _Snapshot:
        rows = self._query(_LATEST_CUMULATIVE, {"run_id": self.job_name})
        if not rows:
            raise ValueError(f"no goodput snapshot of run {self.job_name!r}: "
                             "has the pipeline seen its events?")
        snapshot = self._snapshot(rows[0])
        if snapshot.total_s <= 0:
            raise ValueError(f"total job time of run {self.job_name!r} is zero; goodput cannot be calculated")
        self._last = snapshot
        return snapshot

    def _at_or_before(self, bound: datetime.datetime) -> _Snapshot | None:
        rows = self._query(_CUMULATIVE_AT_OR_BEFORE, {"run_id": self.job_name, "bound": bound})
        return self._snapshot(rows[0]) if rows else None

    def _near(self, bound: datetime.datetime, latest: _Snapshot) -> _Snapshot | None:
        """The run's cumulative figures at ``bound`` as the tables hold them: its latest snapshot
        from that snapshot on (nothing later is measured yet), nothing before the run began, else
        its last snapshot at or before ``bound`` if at most ``CLOSE_S`` before it; None if none is."""
        if bound >= latest.time:
            return latest
        snapshot = self._at_or_before(bound)
        if snapshot is None:
            return _Snapshot.before_run(bound) if latest.started is None or bound <= latest.started else None
        return snapshot if (bound - snapshot.time).total_seconds() <= CLOSE_S else None

    def _replay(self, exactly: str) -> _Replay:
        """The run's raw events, read for the pipeline's engine; ``exactly`` tells, for the errors,
        how a replay (``python -m pipeline``) has the same figures."""
        hint = (f"the snapshots of run {self.job_name!r} do not bound these times within {CLOSE_S:g} s, "
                "and computing the figures from its raw events needs")
        try:
            from pipeline.core.engine import RunState
            from pipeline.core.events import parse_batch
            from pipeline.sinks.raw_events import messages
        except ImportError:
            raise ValueError(f"{hint} the pipeline (pip install fleet-goodput); or {exactly}") from None
        rows = self._query(_RUN_EVENTS, {"run_id": self.job_name})
        if not rows:
            raise ValueError(f"{hint} them in the events table, which holds none (is the pipeline run "
                             f"with --no_raw_events?); or {exactly}")
        columns = ((row["run_id"], row["attempt_id"], row["seq"], _micros(_aware_utc(row["event_time"])),
                    row["kind"], row["step"], row["body"]) for row in rows)
        # The pipeline accepted every one of them: parsed again, none is left out.
        batches = [batch for _, data in messages(columns, "events")
                   if (batch := parse_batch(data)[0]) is not None]
        return _Replay(lambda: RunState(str(rows[0]["run_id"])), batches)

    def _interval(self, start: datetime.datetime, end: datetime.datetime) -> _Interval:
        """The figures of [start, end], bounds in UTC and in order."""
        latest = self._latest()
        if latest.started is not None and end <= latest.started:
            raise ValueError(f"no goodput snapshot of run {self.job_name!r} at or before {end}: it "
                             f"started at {latest.started}")
        replay: _Replay | None = None
        figures = []
        for bound in (start, end):
            near = self._near(bound, latest)
            if near is None:
                replay = replay or self._replay(
                    f"replay the run's events with `python -m pipeline --from_duckdb=FILE --duckdb=OUT` "
                    f"and --as_of={bound.isoformat()}")
                near = replay.figures(bound)
            figures.append(near)
        first, last = figures  # first is before_run if the run began inside: it counts from its start
        total = last.total_s - first.total_s
        if total <= 0:
            raise ValueError(f"run {self.job_name!r} has no elapsed time between its snapshots at "
                             f"{first.time} and {last.time}")
        productive = min(max(0.0, last.productive_s - first.productive_s), total)
        badput = {source: last.badput_s.get(source, 0.0) - first.badput_s.get(source, 0.0)
                  for source in last.badput_s.keys() | first.badput_s.keys()}
        badput = {source: seconds if 0.0 <= seconds <= total else 0.0 for source, seconds in badput.items()}
        return _Interval(first, last, 100.0 * productive / total,
                         self._breakdown(badput, total, percent=True), total,
                         max(0, last.disruptions - first.disruptions))

    def _interval_details(
        self, interval_start: datetime.datetime, interval_end: datetime.datetime
    ) -> tuple[IntervalWorkloadMetricDetails, _Interval | None]:
        start, end = _moment(interval_start, "interval_start"), _moment(interval_end, "interval_end")
        _ordered(start, end)
        size = int((end - start).total_seconds())
        try:
            interval = self._interval(start, end)
        except ValueError as error:
            _LOG.warning("Failed to get interval metric details: %s", error)
            return {IntervalMetricType.INTERVAL_GOODPUT.value: {},
                    IntervalMetricType.INTERVAL_BADPUT.value: {},
                    IntervalMetricType.INTERVAL_SIZE.value: size}, None
        return {IntervalMetricType.INTERVAL_GOODPUT.value: {GoodputType.TOTAL: interval.goodput_pct},
                IntervalMetricType.INTERVAL_BADPUT.value: interval.breakdown,
                IntervalMetricType.INTERVAL_SIZE.value: size}, interval

    def _step_times(self) -> dict[int, float]:
        """Seconds per step, from the run's step starts (see ``get_step_deviation``)."""
        attempts: dict[str, list[tuple[datetime.datetime, int]]] = {}
        for row in self._query(_STEP_STARTS, {"run_id": self.job_name, "kind": "step_start"}):
            if row["step"] is not None:
                attempts.setdefault(str(row["attempt_id"]), []).append(
                    (_aware_utc(row["event_time"]), int(row["step"])))
        step_times: dict[int, float] = {}
        # Attempts in the order they started; each one's steps in time order, as the pipeline's.
        for steps in sorted((sorted(steps) for steps in attempts.values()), key=lambda steps: steps[0]):
            for (start, step), (following, next_step) in itertools.pairwise(steps):
                if next_step == step + 1:
                    step_times[step] = (following - start).total_seconds()
        return step_times

    def _snapshot(self, row: Mapping[str, Any]) -> _Snapshot:
        at = _aware_utc(row["snapshot_time"])
        badput: dict[str, float] = {}
        for bucket in self._query(_BADPUT_OF_SNAPSHOT, {"run_id": self.job_name, "snapshot_time": at}):
            badput[str(bucket["badput_source"])] = float(bucket["seconds"])  # a re-run's rows repeat
        started = None if row.get("window_start") is None else _aware_utc(row["window_start"])
        span = (_aware_utc(row["window_end"]) - started).total_seconds() \
            if started is not None and row.get("window_end") is not None else 0.0
        return _Snapshot(
            time=at, productive_s=float(row["productive_time_s"]), total_s=float(row["total_time_s"]),
            disruptions=int(row["disruptions"]), max_productive_step=int(row["max_productive_step"]),
            last_step=None if row["last_step"] is None else int(row["last_step"]),
            ideal_step_time_s=_optional(row["ideal_step_time_s"]),
            badput_s=badput, stepping_slice_efficiency=_optional(row.get("stepping_slice_efficiency")),
            available_slice_efficiency=_optional(row.get("available_slice_efficiency")), span_s=span,
            started=started)

    def _query(self, sql: str, parameters: Mapping[str, Any]) -> list[dict[str, Any]]:
        """Rows of one of the queries above, for the run that the name in ``@run_id`` names."""
        run = _RUN_OF_NAME.format(**self._tables) if self._source.names_runs() else "@run_id"
        return self._source.rows(sql.format(**self._tables, run=run), parameters)

    def _breakdown(self, badput_s: Mapping[str, float], total_s: float, percent: bool) -> BadputBreakdown:
        scale = 100.0 / total_s if percent else 1.0
        breakdown: BadputBreakdown = dict.fromkeys(_BASE_BUCKETS, 0.0)
        if self._ELASTIC:
            breakdown.update(dict.fromkeys(_ELASTIC_BUCKETS, 0.0))
        custom: dict[str, float] = {}
        other = 0.0
        for source, seconds in sorted(badput_s.items()):
            if source.startswith(_CUSTOM_PREFIX):
                sub = source[len(_CUSTOM_PREFIX):]
                custom[sub] = custom.get(sub, 0.0) + seconds * scale
            elif source in _BY_NAME and source != BadputType.CUSTOM_BADPUT_EVENTS.name:
                member = _BY_NAME[source]
                if member is BadputType.OTHER:
                    other += seconds * scale
                else:
                    breakdown[member] = seconds * scale
            else:
                _LOG.debug("badput bucket %r has no BadputType; reported in OTHER", source)
                other += seconds * scale
        breakdown[BadputType.CUSTOM_BADPUT_EVENTS] = custom
        breakdown[BadputType.OTHER] = other
        return breakdown


def _merged(
    intervals: Iterable[tuple[datetime.datetime, datetime.datetime]] | None,
) -> list[tuple[datetime.datetime, datetime.datetime]]:
    """Exclusion intervals in UTC, sorted and merged. As the reference's: None is no interval, and
    one that is naive or not in order is skipped with a warning; anything but (datetime, datetime)
    pairs is a TypeError (the reference's is an AttributeError from inside)."""
    if intervals is None:
        return []
    if isinstance(intervals, str | bytes) or not isinstance(intervals, Iterable):
        raise TypeError("exclusion_intervals must be a list of (start, end) pairs of timezone-aware "
                        f"datetimes, got {type(intervals).__name__}")
    valid = []
    for interval in intervals:
        try:
            start, end = interval
        except (TypeError, ValueError):
            raise TypeError("each exclusion interval must be a (start, end) pair of timezone-aware "
                            f"datetimes, got {type(interval).__name__}") from None
        if not isinstance(start, datetime.datetime) or not isinstance(end, datetime.datetime):
            raise TypeError("each exclusion interval must be a (start, end) pair of timezone-aware "
                            f"datetimes, got ({type(start).__name__}, {type(end).__name__})")
        if start.tzinfo is None or end.tzinfo is None:
            _LOG.warning("Skipping interval [%s, %s]: not timezone-aware (UTC)", start, end)
        elif start >= end:
            _LOG.warning("Skipping interval [%s, %s]: start is not before end", start, end)
        else:
            valid.append((start.astimezone(UTC), end.astimezone(UTC)))
    merged: list[tuple[datetime.datetime, datetime.datetime]] = []
    for start, end in sorted(valid):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def _efficiency_between(first: _Snapshot, last: _Snapshot, name: str) -> float | None:
    """A slice efficiency over the stretch between two cumulative snapshots: each is weighted
    over its run so far, so the stretch's is the difference of the weighted sums."""
    value: float | None = getattr(last, name)
    span = last.span_s - first.span_s
    if value is None or span <= 0:
        return None
    before: float = getattr(first, name) or 0.0
    return min(1.0, max(0.0, (value * last.span_s - before * first.span_s) / span))


class ElasticGoodputCalculator(GoodputCalculator):
    """The reference's ``ElasticGoodputCalculator``: the breakdown always holds the elastic buckets,
    and the details the time-weighted slice efficiencies (fractions) when the run recorded slice
    counts."""

    _ELASTIC = True

    def get_job_goodput_details(self) -> ElasticWorkloadMetricDetails:
        # The same dict, which may gain the elastic keys.
        details = cast(ElasticWorkloadMetricDetails, super().get_job_goodput_details())
        snapshot = self._last
        if snapshot is not None and snapshot.stepping_slice_efficiency is not None:
            details["stepping_slice_efficiency"] = snapshot.stepping_slice_efficiency
            if snapshot.available_slice_efficiency is not None:
                details["available_slice_efficiency"] = snapshot.available_slice_efficiency
        return details

    def get_interval_metric_details(
        self, interval_start: datetime.datetime, interval_end: datetime.datetime
    ) -> ElasticIntervalWorkloadMetricDetails:
        """As the base calculator's, plus the slice efficiencies over the interval when the run
        recorded slice counts: the difference of the cumulative ones at the two snapshots."""
        base, interval = self._interval_details(interval_start, interval_end)
        details = cast(ElasticIntervalWorkloadMetricDetails, base)
        if interval is not None:
            for name in ("stepping_slice_efficiency", "available_slice_efficiency"):
                value = _efficiency_between(interval.first, interval.last, name)
                if value is not None:
                    details[name] = value
        return details


__all__ = [
    "BadputType",
    "ElasticGoodputCalculator",
    "ElasticGoodputRecorder",
    "GoodputCalculator",
    "GoodputRecorder",
    "GoodputType",
    "IntervalMetricType",
    "IntervalWorkloadMetricDetails",
    "MetricType",
    "UnproductiveTimeDict",
    "WorkloadMetricDetails",
]
