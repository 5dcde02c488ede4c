"""The reference's ``monitoring_elastic`` module: ``ElasticGoodputMonitor``. See
``ml_goodput_measurement.src.monitoring``."""

from __future__ import annotations

import datetime
import os
from typing import Any

from ml_goodput_measurement.src.goodput import ElasticGoodputCalculator, GoodputCalculator
from ml_goodput_measurement.src.goodput_utils import GCPOptions
from ml_goodput_measurement.src.monitoring import (
    _DEFAULT_GCP_OPTIONS,
    _TERMINATION_TIMEOUT_S,
    GoodputMonitor,
)


class ElasticGoodputMonitor(GoodputMonitor):
    """The reference's ``ElasticGoodputMonitor``: a ``GoodputMonitor`` reading through
    ``ElasticGoodputCalculator``, so the badput scalars include the elastic buckets.

    ``pathway_enabled`` is always True, as the reference's. ``include_slice_efficiency`` is kept:
    the reference sends slice efficiency to Cloud Monitoring only, which the pipeline does.
    """

    _calculator_class: type[GoodputCalculator] = ElasticGoodputCalculator

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
        gcp_options: GCPOptions = _DEFAULT_GCP_OPTIONS,
        skip_final_flush: bool = False,
        final_flush_timeout_seconds: float | None = _TERMINATION_TIMEOUT_S,
        gcs_sync_interval_seconds: int = 3600,
        cache_dir: str = "/tmp",
        max_logs_retention_period: datetime.timedelta | None = None,
        *,
        duckdb_path: str | os.PathLike[str] | None = None,
        bigquery_dataset: str | None = None,
        bigquery_client: Any = None,
    ) -> None:
        super().__init__(
            job_name, logger_name, tensorboard_dir, upload_interval, monitoring_enabled,
            pathway_enabled=True, include_badput_breakdown=include_badput_breakdown,
            include_step_deviation=include_step_deviation,
            configured_ideal_step_time=configured_ideal_step_time,
            step_deviation_interval_seconds=step_deviation_interval_seconds, gcp_options=gcp_options,
            skip_final_flush=skip_final_flush, final_flush_timeout_seconds=final_flush_timeout_seconds,
            gcs_sync_interval_seconds=gcs_sync_interval_seconds, cache_dir=cache_dir,
            max_logs_retention_period=max_logs_retention_period, duckdb_path=duckdb_path,
            bigquery_dataset=bigquery_dataset, bigquery_client=bigquery_client)
        self.include_slice_efficiency = include_slice_efficiency


__all__ = ["ElasticGoodputMonitor", "GCPOptions"]
