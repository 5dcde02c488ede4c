"""The reference's ``goodput_utils``: its enums, result types, ``GCPOptions`` and pure helpers.

Names, members and values are the reference's, so code that imports them, compares them or keys
dicts by them keeps working. The helpers are written here from the reference's documented
behaviour (``docs/differences.md`` on the ideal step time says where the pipeline improves on it):

* ``compute_percentile``: linear interpolation between the closest ranks.
* ``compute_ideal_step_time``: the mean of the step times of 1 s or more that lie at or below
  median + 3 MAD (unscaled), or None when no step time is 1 s or more.
* ``compute_step_deviation_from_baseline``: the reference's spike-sensitive summary of
  ``{step: deviation}``.
* ``get_anomalous_and_normal_step_times``, ``get_extra_time_from_anomalous_steps`` and
  ``get_timestamp_from_log_entry``: kept for code that calls them.

Where the reference answers an argument out of range with an IndexError, an AttributeError or a
figure of the wrong steps (a percentile over 100 or under 0, a window of 0 steps, a list for a
mapping), these raise a clear ValueError or TypeError.

Left out, because they only make sense against the GCE metadata server: ``get_gcp_metadata``,
``get_gcp_project_id``, ``get_node_zone``, ``get_accelerator_type``, ``get_cluster_name`` (and the
machine-type table behind the accelerator lookup). The pipeline takes the location and the
accelerator type from the recorder's metadata instead.
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
import math
import numbers
import statistics
from collections.abc import Mapping, Sequence
from typing import Any, TypedDict

UTC = datetime.timezone.utc


@dataclasses.dataclass
class GCPOptions:
    """The reference's Cloud Monitoring options: accepted, not used (the pipeline writes the
    ``workload/*`` metrics for every run)."""

    project_id: str | None = None
    location: str | None = None
    replica_id: str = "0"
    acc_type: str | None = None
    cluster_name: str | None = None
    enable_gcp_goodput_metrics: bool = True
    enable_gcp_step_deviation_metrics: bool = True


class MetricType(enum.Enum):
    """Keys of the cumulative details (``WorkloadMetricDetails``)."""

    GOODPUT_TIME = "goodput_time"
    BADPUT_TIME = "badput_time"
    MAX_PRODUCTIVE_STEP = "max_productive_step"
    TOTAL_ELAPSED_TIME = "total_elapsed_time"
    DISRUPTION_COUNT = "disruption_count"
    STEP_TIME_DEVIATION = "step_time_deviation"
    IDEAL_STEP_TIME = "ideal_step_time"
    TOTAL_EXCLUDED_TIME = "total_excluded_time"


class IntervalMetricType(enum.Enum):
    """Keys of the interval details (``IntervalWorkloadMetricDetails``)."""

    INTERVAL_GOODPUT = "interval_goodput"
    INTERVAL_BADPUT = "interval_badput"
    INTERVAL_SIZE = "interval_size"


class GoodputType(enum.Enum):
    """Productive time is not broken down: one type."""

    TOTAL = 1


class BadputType(enum.Enum):
    """The badput buckets."""

    TPU_INITIALIZATION = 1
    TRAINING_PREP = 2
    PROGRAM_STARTUP = 3
    DATA_LOADING_SYNC = 4
    DATA_LOADING_ASYNC = 5
    UNPRODUCTIVE_CHECKPOINT_SAVE_TIME = 6
    UNPRODUCTIVE_CHECKPOINT_RESTORE_TIME = 7
    WASTED_PROGRESS_FROM_DISRUPTION = 8
    INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION = 9
    CUSTOM_BADPUT_EVENTS = 10
    OTHER = 11
    ELASTIC_SLICE_DOWN = 12
    ELASTIC_SCALE_UP = 13
    ELASTIC_REINITIALIZATION = 14


class MonitoringWindowType(enum.Enum):
    """Whether a step-deviation summary compares against the run's history or not."""

    CUMULATIVE = "cumulative"
    INTERVAL = "interval"


class WorkloadMetricDetails(TypedDict):
    """``get_job_goodput_details()``: seconds, keyed by ``MetricType`` values."""

    goodput_time: dict[GoodputType, float]
    badput_time: dict[BadputType, float | dict[str, float]]
    max_productive_step: int
    total_elapsed_time: float
    disruption_count: int
    step_time_deviation: dict[int, float]
    ideal_step_time: float
    total_excluded_time: float


class IntervalWorkloadMetricDetails(TypedDict):
    """``get_interval_metric_details()``: percentages, keyed by ``IntervalMetricType`` values."""

    interval_goodput: dict[GoodputType, float]
    interval_badput: dict[BadputType, float | dict[str, float]]
    interval_size: int  # seconds


class ElasticWorkloadMetricDetails(WorkloadMetricDetails, total=False):
    """The cumulative details of an elastic run: plus its slice efficiencies (fractions)."""

    stepping_slice_efficiency: float
    available_slice_efficiency: float


class ElasticIntervalWorkloadMetricDetails(IntervalWorkloadMetricDetails, total=False):
    """The interval details of an elastic run: plus its slice efficiencies (fractions)."""

    stepping_slice_efficiency: float
    available_slice_efficiency: float


#: Buckets reported but not counted as badput: asynchronous data loading overlaps training.
ACTIVITY_EXCLUSION_LIST = ["DATA_LOADING_ASYNC"]

_RECENT_STEPS = 100
_BASELINE_STEPS = 1000
_SPIKE_PERCENTILE = 90


def compute_percentile(values: Sequence[float], percentile: float) -> float:
    """The ``percentile`` (0 to 100) of ``values``, interpolated linearly; 0.0 for no values.

    Raises:
        TypeError: ``percentile`` is not a number (as the reference's).
        ValueError: ``percentile`` is not from 0 to 100 (the reference raises IndexError above 100
            and answers the largest value below 0).
    """
    if isinstance(percentile, bool) or not isinstance(percentile, numbers.Real):
        raise TypeError(f"percentile must be a number from 0 to 100, got {type(percentile).__name__}")
    if not 0 <= percentile <= 100:
        raise ValueError(f"percentile must be a number from 0 to 100, got {percentile!r}")
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = (len(ordered) - 1) * percentile / 100.0
    below = int(rank)
    above = min(below + 1, len(ordered) - 1)
    return ordered[below] + (ordered[above] - ordered[below]) * (rank - below)


def compute_step_deviation_from_baseline(
    step_time_deviation: Mapping[int, float],
    mode: MonitoringWindowType = MonitoringWindowType.CUMULATIVE,
    recent_window_size: int = _RECENT_STEPS,
    baseline_window_size: int = _BASELINE_STEPS,
    spike_percentile: int = _SPIKE_PERCENTILE,
) -> float:
    """One figure for ``{step: deviation}`` (in step order), sensitive to recent spikes.

    Below 100 steps, the mean absolute deviation. Otherwise the ``spike_percentile`` of the last
    ``recent_window_size`` absolute deviations; in CUMULATIVE mode, once there are enough steps,
    less the median of the ``baseline_window_size`` before those (so it can be negative).

    Raises:
        ValueError: ``mode`` is not a ``MonitoringWindowType``; a window size is not a positive
            whole number (the reference reads the wrong steps for one that is not).
        TypeError: ``step_time_deviation`` is not a mapping (the reference's is an AttributeError).
    """
    for name, size in (("recent_window_size", recent_window_size),
                       ("baseline_window_size", baseline_window_size)):
        if isinstance(size, bool) or not isinstance(size, numbers.Integral) or size < 1:
            raise ValueError(f"{name} must be a positive whole number of steps, got {size!r}")
    if step_time_deviation is not None and not isinstance(step_time_deviation, Mapping):
        raise TypeError("step_time_deviation must be a mapping of step to deviation, got "
                        f"{type(step_time_deviation).__name__}")
    if not step_time_deviation:
        return 0.0
    deviations = [abs(value) for value in step_time_deviation.values()]
    if len(deviations) < _RECENT_STEPS:
        return statistics.fmean(deviations)
    recent = deviations[-recent_window_size:]
    if mode is MonitoringWindowType.INTERVAL:
        return compute_percentile(recent, spike_percentile)
    if mode is not MonitoringWindowType.CUMULATIVE:
        raise ValueError(f"Unsupported MonitoringWindowType mode: {mode}")
    baseline = deviations[-(recent_window_size + baseline_window_size):-recent_window_size]
    spike = compute_percentile(recent, spike_percentile)
    if len(deviations) < recent_window_size + baseline_window_size or not baseline:
        return spike
    return spike - statistics.median(baseline)


def _median_and_mad(values: Sequence[float]) -> tuple[float, float]:
    median = statistics.median(values)
    return median, statistics.median(abs(value - median) for value in values)


def compute_ideal_step_time(step_times: Sequence[float]) -> float | None:
    """The ideal step time: the mean of the step times of 1 s or more, high outliers (above
    median + 3 MAD) left out; None when no step time is 1 s or more."""
    kept = [step_time for step_time in step_times if step_time >= 1.0]
    if not kept:
        return None
    median, mad = _median_and_mad(kept)
    normal = [step_time for step_time in kept if step_time <= median + 3 * mad]
    return statistics.fmean(normal) if normal else None


def get_anomalous_and_normal_step_times(step_times: Sequence[Any]) -> tuple[list[Any], list[Any]]:
    """The step times above median + 3 MAD, and the others; none of either for none."""
    if not step_times:
        return [], []
    median, mad = _median_and_mad(step_times)
    anomalous = [step_time for step_time in step_times if step_time > median + 3 * mad]
    normal = [step_time for step_time in step_times if step_time <= median + 3 * mad]
    return anomalous, normal


def get_extra_time_from_anomalous_steps(step_times: Sequence[Any]) -> float:
    """The time anomalous steps took beyond the mean of the normal ones (NaN for no steps, as the
    reference's)."""
    anomalous, normal = get_anomalous_and_normal_step_times(step_times)
    mean = statistics.fmean(normal) if normal else math.nan
    return float(sum(anomalous) - len(anomalous) * mean)


def get_timestamp_from_log_entry(entry: Mapping[str, Any]) -> datetime.datetime | None:
    """The time of a reference log payload: its first field whose name contains ``time``.

    Raises:
        TypeError: ``entry`` is not a mapping (the reference's is an AttributeError), or that
            field is not a number.
    """
    if not isinstance(entry, Mapping):
        raise TypeError(f"entry must be a log payload (a mapping), got {type(entry).__name__}")
    for name, value in entry.items():
        if "time" in name:
            return datetime.datetime.fromtimestamp(value, UTC)
    return None


__all__ = [
    "ACTIVITY_EXCLUSION_LIST",
    "BadputType",
    "ElasticIntervalWorkloadMetricDetails",
    "ElasticWorkloadMetricDetails",
    "GCPOptions",
    "GoodputType",
    "IntervalMetricType",
    "IntervalWorkloadMetricDetails",
    "MetricType",
    "MonitoringWindowType",
    "WorkloadMetricDetails",
    "compute_ideal_step_time",
    "compute_percentile",
    "compute_step_deviation_from_baseline",
    "get_anomalous_and_normal_step_times",
    "get_extra_time_from_anomalous_steps",
    "get_timestamp_from_log_entry",
]
