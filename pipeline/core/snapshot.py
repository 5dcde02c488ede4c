"""What the engine computes: a run's snapshot (its figures as of a time), and the names of the
badput buckets, as the reference labels them in Cloud Monitoring.

Rows for the tables (``pipeline.core.rows``) and points for Cloud Monitoring
(``pipeline.sinks.monitoring``) are each made from a ``Snapshot``.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from pipeline.core.detect import AnomalyChange

PRODUCTIVE = "PRODUCTIVE"
TPU_INITIALIZATION = "TPU_INITIALIZATION"
TRAINING_PREP = "TRAINING_PREP"
PROGRAM_STARTUP = "PROGRAM_STARTUP"
DATA_LOADING_SYNC = "DATA_LOADING_SYNC"
DATA_LOADING_ASYNC = "DATA_LOADING_ASYNC"
CHECKPOINT_SAVE = "UNPRODUCTIVE_CHECKPOINT_SAVE_TIME"
CHECKPOINT_RESTORE = "UNPRODUCTIVE_CHECKPOINT_RESTORE_TIME"
WASTED_PROGRESS = "WASTED_PROGRESS_FROM_DISRUPTION"
INFRASTRUCTURE_RECOVERY = "INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION"
CUSTOM_PREFIX = "CUSTOM_BADPUT_EVENTS."
OTHER = "OTHER"
ELASTIC_SLICE_DOWN = "ELASTIC_SLICE_DOWN"
ELASTIC_SCALE_UP = "ELASTIC_SCALE_UP"
ELASTIC_REINITIALIZATION = "ELASTIC_REINITIALIZATION"
EXCLUDED = "EXCLUDED"

#: Badput buckets always reported (others appear when they occur).
STANDARD_BUCKETS: tuple[str, ...] = (
    TPU_INITIALIZATION, TRAINING_PREP, PROGRAM_STARTUP, DATA_LOADING_SYNC, DATA_LOADING_ASYNC,
    CHECKPOINT_SAVE, CHECKPOINT_RESTORE, WASTED_PROGRESS, INFRASTRUCTURE_RECOVERY, OTHER,
)
#: Default rolling windows, seconds.
DEFAULT_WINDOWS_S: tuple[int, ...] = (60, 300, 900, 3600)


@dataclasses.dataclass(frozen=True)
class Disruption:
    """One restart or in-process rollback, with what it cost."""

    restart_us: int  # the new attempt's job_start (rollback: its first step)
    last_step_before: int | None
    resume_step: int | None
    wasted_progress_s: float
    recovery_s: float  # from the last step start before the failure to the restart
    in_process: bool


@dataclasses.dataclass(frozen=True)
class WindowFigures:
    """Goodput and badput over one stretch of time."""

    window_s: int  # 0 for cumulative
    start_us: int
    end_us: int
    total_s: float
    productive_s: float
    badput_s: dict[str, float]
    disruptions: int
    chip_seconds_total: float
    chip_seconds_productive: float

    @property
    def goodput_pct(self) -> float | None:
        return None if self.total_s <= 0 else 100.0 * self.productive_s / self.total_s

    def badput_pct(self, bucket: str) -> float | None:
        return None if self.total_s <= 0 else 100.0 * self.badput_s[bucket] / self.total_s

    @property
    def unaccounted_s(self) -> float:
        """Elapsed time that neither productive time nor a badput bucket holds: 0 when the books
        balance. Every bucket counts but the informational ``DATA_LOADING_ASYNC``, which overlaps
        the others by definition. Summed exactly, then rounded to the microsecond (the engine's
        unit of time), so that no float rounding of the figures shows as unaccounted time."""
        counted = (bucket_s for bucket, bucket_s in self.badput_s.items() if bucket != DATA_LOADING_ASYNC)
        left = math.fsum((self.total_s, -self.productive_s, *(-seconds for seconds in counted)))
        return round(left, 6) + 0.0  # + 0.0 turns a rounded -0.0 into 0.0


@dataclasses.dataclass(frozen=True)
class StepSummary:
    """The distribution of a run's step times (seconds), over every measured step."""

    steps: int
    mean_s: float
    p50_s: float
    p90_s: float
    p99_s: float
    max_s: float
    recent_p50_s: float  # the median of the last 100 steps


@dataclasses.dataclass(frozen=True)
class Snapshot:
    """A run's figures as of ``as_of_us``."""

    run_id: str
    as_of_us: int
    started_us: int
    ended: bool
    cumulative: WindowFigures
    window_sizes_s: tuple[int, ...]
    windows: tuple[WindowFigures | None, ...]  # one per window size; None when empty
    disruptions: tuple[Disruption, ...]
    max_productive_step: int
    last_step: int | None
    ideal_step_time_s: float | None
    reference_ideal_step_time_s: float | None
    step_time_deviation_s: float | None
    chip_count: int
    metadata: dict[str, Any]
    stepping_slice_efficiency: float | None
    available_slice_efficiency: float | None
    step_summary: StepSummary | None = None
    missing_events: int = 0  # of every attempt, as ``Attempt.missing`` counts them
    anomalies: tuple[AnomalyChange, ...] = ()  # the rows found since the previous snapshot
    slow_step_time_s: float | None = None  # measured step time beyond the ideal step time
    #: How many anomalies of each kind (``ANOMALY_KINDS``) are open as of the snapshot.
    open_anomalies: dict[str, int] = dataclasses.field(default_factory=dict)
