"""The reference's ``monitoring`` module, for code that starts a ``GoodputMonitor`` in each job.

Switching from ``ml-goodput-measurement`` is one import::

    from ml_goodput_measurement import monitoring   # before
    from emitter import monitoring                  # after

The reference's monitor starts up to three processes per job that poll Cloud Logging, recompute
and upload to Cloud Monitoring and TensorBoard. Here the pipeline computes and uploads for every
run at once, so the monitor accepts the same arguments and its ``start_*`` and ``stop_*`` methods
start nothing: the first call logs (once per monitor, through ``logging``) that monitoring is
central, and every call returns at once.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import threading

_LOG = logging.getLogger(__name__)


@dataclasses.dataclass
class GCPOptions:
    """The reference's ``GCPOptions``: accepted, not used (the pipeline writes the metrics)."""

    project_id: str | None = None
    location: str | None = None
    replica_id: str = "0"
    acc_type: str | None = None
    cluster_name: str | None = None
    enable_gcp_goodput_metrics: bool = True
    enable_gcp_step_deviation_metrics: bool = True


class GoodputMonitor:
    """The reference's ``GoodputMonitor``, with the same arguments; it uploads nothing itself.

    Goodput, badput, rolling-window goodput and step-time deviation reach Cloud Monitoring (the
    reference's ``compute.googleapis.com/workload/*`` metrics) and BigQuery from the pipeline,
    for every run, from the events the recorder sends. Every argument is kept as an attribute.
    """

    def __init__(
        self,
        job_name: str,
        logger_name: str,
        tensorboard_dir: str,
        upload_interval: int,
        monitoring_enabled: bool = False,
        pathway_enabled: bool = False,
        include_badput_breakdown: bool = False,
        include_step_deviation: bool = False,
        configured_ideal_step_time: float | None = None,
        step_deviation_interval_seconds: int = 10,
        gcp_options: GCPOptions | None = None,
        skip_final_flush: bool = False,
        final_flush_timeout_seconds: float | None = 10.0,
        gcs_sync_interval_seconds: int = 3600,
        cache_dir: str = "/tmp",
        max_logs_retention_period: datetime.timedelta | None = None,
    ) -> None:
        self.job_name = job_name
        self.logger_name = logger_name
        self.tensorboard_dir = tensorboard_dir
        self.upload_interval = upload_interval
        self.monitoring_enabled = monitoring_enabled
        self.pathway_enabled = pathway_enabled
        self.include_badput_breakdown = include_badput_breakdown
        self.include_step_deviation = include_step_deviation
        self.configured_ideal_step_time = configured_ideal_step_time
        self.step_deviation_interval_seconds = step_deviation_interval_seconds
        self.gcp_options = gcp_options if gcp_options is not None else GCPOptions()
        self.skip_final_flush = skip_final_flush
        self.final_flush_timeout_seconds = final_flush_timeout_seconds
        self.gcs_sync_interval_seconds = gcs_sync_interval_seconds
        self.cache_dir = cache_dir
        self.max_logs_retention_period = max_logs_retention_period
        self._told = False
        self._lock = threading.Lock()

    def _tell_once(self) -> None:
        with self._lock:
            if self._told:
                return
            self._told = True
        _LOG.info(
            "goodput monitoring of %r is central: the fleet goodput pipeline computes and uploads "
            "goodput, badput, rolling windows and step deviation from the recorder's events, so this "
            "GoodputMonitor starts no uploader (query the figures with emitter.goodput.GoodputCalculator)",
            self.job_name)

    def start_goodput_uploader(self) -> None:
        """Starts nothing: the pipeline uploads cumulative goodput and badput."""
        self._tell_once()

    def stop_goodput_uploader(self, skip_final_flush: bool | None = None) -> None:
        """Stops nothing; returns at once."""
        self._tell_once()

    def start_step_deviation_uploader(self) -> None:
        """Starts nothing: the pipeline uploads step-time deviation."""
        self._tell_once()

    def stop_step_deviation_uploader(self, skip_final_flush: bool | None = None) -> None:
        """Stops nothing; returns at once."""
        self._tell_once()

    def start_rolling_window_goodput_uploader(self, rolling_windows_seconds: list[int]) -> None:
        """Starts nothing: the pipeline uploads rolling-window goodput (its ``--windows``)."""
        self._tell_once()

    def stop_rolling_window_goodput_uploader(self, skip_final_flush: bool | None = None) -> None:
        """Stops nothing; returns at once."""
        self._tell_once()


class ElasticGoodputMonitor(GoodputMonitor):
    """The reference's ``ElasticGoodputMonitor`` (``monitoring_elastic``); it uploads nothing itself."""

    def __init__(
        self,
        job_name: str,
        logger_name: str,
        tensorboard_dir: str,
        upload_interval: int,
        monitoring_enabled: bool = False,
        include_badput_breakdown: bool = False,
        include_step_deviation: bool = False,
        include_slice_efficiency: bool = False,
        configured_ideal_step_time: float | None = None,
        step_deviation_interval_seconds: int = 10,
        gcp_options: GCPOptions | None = None,
        skip_final_flush: bool = False,
        final_flush_timeout_seconds: float | None = 10.0,
        gcs_sync_interval_seconds: int = 3600,
        cache_dir: str = "/tmp",
        max_logs_retention_period: datetime.timedelta | None = None,
    ) -> None:
        super().__init__(
            job_name, logger_name, tensorboard_dir, upload_interval, monitoring_enabled,
            pathway_enabled=True, include_badput_breakdown=include_badput_breakdown,
            include_step_deviation=include_step_deviation,
            configured_ideal_step_time=configured_ideal_step_time,
            step_deviation_interval_seconds=step_deviation_interval_seconds, gcp_options=gcp_options,
            skip_final_flush=skip_final_flush, final_flush_timeout_seconds=final_flush_timeout_seconds,
            gcs_sync_interval_seconds=gcs_sync_interval_seconds, cache_dir=cache_dir,
            max_logs_retention_period=max_logs_retention_period)
        self.include_slice_efficiency = include_slice_efficiency


__all__ = ["ElasticGoodputMonitor", "GCPOptions", "GoodputMonitor"]
