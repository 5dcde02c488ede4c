"""Training code that uses ``ml_goodput_measurement`` the way MaxText and AXLearn do.

Written here from how their goodput modules call the library (MaxText's
``maxtext/common/goodput.py`` and ``utils/elastic_utils.py``, AXLearn's
``axlearn/cloud/gcp/measurement.py``): the same imports, constructors, keywords and call order,
with ``jax.process_index()`` passed in. Nothing here knows it runs against this project, so the
file also runs as it is in a virtual environment that has only the installed distributions.
"""

from __future__ import annotations

import contextlib
import enum
import logging
import os
from collections.abc import Iterator, Sequence
from types import SimpleNamespace
from typing import Any

from ml_goodput_measurement import (
    goodput,
    goodput_elastic,
    goodput_utils,  # noqa: F401 - imported as the clients do
    monitoring,
    monitoring_elastic,
)

# -- MaxText ---------------------------------------------------------------------------------------

class GoodputEvent(enum.Enum):
    JOB = "job"
    TPU_INIT = "tpu_init"
    TRAINING_PREPARATION = "training_preparation"
    DATA_LOADING = "data_loading"
    STEP = "step"


def maxtext_config(run_name: str, tensorboard_dir: str, **overrides: Any) -> SimpleNamespace:
    """The config fields MaxText's goodput code reads."""
    fields = dict(run_name=run_name, tensorboard_dir=tensorboard_dir, enable_goodput_recording=True,
                  monitor_goodput=True, goodput_upload_interval_seconds=1,
                  enable_pathways_goodput=False, monitor_step_time_deviation=True,
                  step_deviation_interval_seconds=1, enable_gcp_goodput_metrics=True,
                  enable_gcp_step_deviation_metrics=True,
                  report_performance_metric_for_gcp_monitoring=False, elastic_enabled=False)
    fields.update(overrides)
    return SimpleNamespace(**fields)


def maxtext_create_goodput_recorder(config: SimpleNamespace, process_index: int = 0) -> Any:
    if not config.enable_goodput_recording:
        return None
    logger_name = f"goodput_{config.run_name}"
    if config.elastic_enabled:
        return goodput_elastic.ElasticGoodputRecorder(config.run_name, logger_name, process_index == 0)
    return goodput.GoodputRecorder(config.run_name, logger_name, process_index == 0)


def maxtext_record_goodput(recorder: Any, event_name: str, *args: Any) -> None:
    if recorder:
        record = getattr(recorder, event_name, None)
        if record:
            record(*args)


@contextlib.contextmanager
def maxtext_maybe_record_goodput(recorder: Any, event: GoodputEvent, *args: Any) -> Iterator[None]:
    """The end is recorded only when the block succeeds (MaxText's ``else`` branch)."""
    maxtext_record_goodput(recorder, f"record_{event.value}_start_time", *args)
    yield
    maxtext_record_goodput(recorder, f"record_{event.value}_end_time", *args)


@contextlib.contextmanager
def maxtext_maybe_monitor_goodput(config: SimpleNamespace, process_index: int = 0) -> Iterator[Any]:
    if not config.monitor_goodput or process_index != 0:
        yield None
        return
    goodput_monitor = None
    try:
        if config.report_performance_metric_for_gcp_monitoring:
            config.enable_gcp_step_deviation_metrics = False
        gcp_options = monitoring.GCPOptions(
            enable_gcp_goodput_metrics=config.enable_gcp_goodput_metrics,
            enable_gcp_step_deviation_metrics=config.enable_gcp_step_deviation_metrics,
        )
        monitor_class = (monitoring_elastic.ElasticGoodputMonitor if config.elastic_enabled
                         else monitoring.GoodputMonitor)
        keywords = {} if config.elastic_enabled else {"pathway_enabled": config.enable_pathways_goodput}
        goodput_monitor = monitor_class(
            job_name=config.run_name,
            logger_name=f"goodput_{config.run_name}",
            tensorboard_dir=config.tensorboard_dir,
            upload_interval=config.goodput_upload_interval_seconds,
            monitoring_enabled=True,
            include_badput_breakdown=True,
            include_step_deviation=config.monitor_step_time_deviation,
            step_deviation_interval_seconds=config.step_deviation_interval_seconds,
            gcp_options=gcp_options,
            **keywords,
        )
        goodput_monitor.start_goodput_uploader()
        if config.monitor_step_time_deviation:
            goodput_monitor.start_step_deviation_uploader()
        yield goodput_monitor
    finally:
        if goodput_monitor:
            goodput_monitor.stop_goodput_uploader()
            if config.monitor_step_time_deviation:
                goodput_monitor.stop_step_deviation_uploader()


# MaxText's elastic utilities: a slice goes away, the job waits for slices, re-initializes and
# resumes from its last checkpoint in the same process.
def maxtext_record_elastic_event_start(recorder: Any, scale_up: bool, slices: tuple[int, int]) -> None:
    available, total = slices
    event_type = "elastic_scale_up" if scale_up else "elastic_slice_down"
    recorder.record_elastic_wait_start_time(event_type=event_type)
    recorder.record_elastic_slice_counts(available_slices=available, active_slices=0,
                                         total_slices=total)


def maxtext_record_elastic_wait_end_and_reinit_start(recorder: Any, event_type: str,
                                                     slices: tuple[int, int]) -> None:
    available, total = slices
    recorder.record_elastic_wait_end_time(event_type=event_type)
    recorder.record_elastic_reinit_start_time()
    recorder.record_elastic_slice_counts(available_slices=available, active_slices=available,
                                         total_slices=total)


def maxtext_record_elastic_reinit_end(recorder: Any, slices: tuple[int, int]) -> None:
    available, total = slices
    recorder.record_elastic_reinit_end_time()
    recorder.record_elastic_slice_counts(available_slices=available, active_slices=available,
                                         total_slices=total)


# -- AXLearn ---------------------------------------------------------------------------------------

class Event(enum.Enum):
    """AXLearn's measurement events, by the name of the recorder method they map to."""

    JOB = "job"
    STEP = "step"
    ACCELERATOR_INIT = "tpu_init"
    TRAINING_PREPARATION = "training_preparation"
    DATA_LOADING = "data_loading"
    CUSTOM_BADPUT_EVENT = "custom_badput_event"


class AXLearnGoodputRecorder:
    """AXLearn's GCP goodput recorder: a lazily made recorder, events as context managers whose
    end runs in a ``finally``, and monitors for cumulative and rolling-window goodput."""

    def __init__(self, name: str, upload_dir: str, upload_interval: int,
                 rolling_window_size: Sequence[int] = (), jax_backend: str | None = None,
                 process_index: int = 0) -> None:
        self.config = SimpleNamespace(name=name, upload_dir=upload_dir, upload_interval=upload_interval,
                                      rolling_window_size=list(rolling_window_size),
                                      jax_backend=jax_backend)
        self._process_index = process_index
        self._recorder: Any = None
        self._monitor: Any = None
        self._rolling_window_monitor: Any = None
        self._job_name = name
        self._logger_name = f"goodput_logger_{name}"

    @contextlib.contextmanager
    def record_event(self, event: Event, *args: Any, **kwargs: Any) -> Iterator[None]:
        if self._recorder is None:
            self._recorder = goodput.GoodputRecorder(
                job_name=self._job_name,
                logger_name=self._logger_name,
                logging_enabled=(self._process_index == 0),
            )
        start = getattr(self._recorder, f"record_{event.value}_start_time", None)
        end = getattr(self._recorder, f"record_{event.value}_end_time", None)
        try:
            if start:
                start(*args, **kwargs)
        except RuntimeError as error:
            logging.warning("Failed to record start of event %s. Error: %s", event.value, error)
        try:
            yield
        finally:
            try:
                if end:
                    end(*args, **kwargs)
            except RuntimeError as error:
                logging.warning("Failed to record end of event %s. Error: %s", event.value, error)

    @contextlib.contextmanager
    def maybe_monitor_goodput(self, *args: Any, **kwargs: Any) -> Iterator[None]:
        if self._process_index != 0:
            yield
            return
        try:
            if self._monitor is None:
                self._monitor = monitoring.GoodputMonitor(
                    job_name=self._job_name,
                    logger_name=self._logger_name,
                    tensorboard_dir=self.config.upload_dir,
                    upload_interval=self.config.upload_interval,
                    monitoring_enabled=True,
                    pathway_enabled=self.config.jax_backend == "proxy",
                    include_badput_breakdown=True,
                )
            self._monitor.start_goodput_uploader(*args, **kwargs)
            yield
        finally:
            if self._monitor:
                self._monitor.stop_goodput_uploader()

    @contextlib.contextmanager
    def maybe_monitor_rolling_window_goodput(self) -> Iterator[None]:
        if not self.config.rolling_window_size or self._process_index != 0:
            yield
            return
        try:
            if self._rolling_window_monitor is None:
                self._rolling_window_monitor = monitoring.GoodputMonitor(
                    job_name=self._job_name,
                    logger_name=self._logger_name,
                    tensorboard_dir=os.path.join(self.config.upload_dir,
                                                 f"rolling_window_{self.config.name}"),
                    upload_interval=self.config.upload_interval,
                    monitoring_enabled=True,
                    pathway_enabled=self.config.jax_backend == "proxy",
                    include_badput_breakdown=True,
                )
            self._rolling_window_monitor.start_rolling_window_goodput_uploader(
                self.config.rolling_window_size)
            yield
        finally:
            if self._rolling_window_monitor:
                self._rolling_window_monitor.stop_rolling_window_goodput_uploader()
