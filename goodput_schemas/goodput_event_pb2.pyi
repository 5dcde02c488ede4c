from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class EventBatch(_message.Message):
    __slots__ = ("schema_version", "run_id", "attempt_id", "events", "workload_uid")
    class Event(_message.Message):
        __slots__ = ("seq", "time_us", "job_start", "job_end", "step_start", "tpu_init_start", "tpu_init_end", "training_prep_start", "training_prep_end", "data_loading_start", "data_loading_end", "custom_badput_start", "custom_badput_end", "elastic_slice_counts", "elastic_wait_start", "elastic_wait_end", "elastic_reinit_start", "elastic_reinit_end", "checkpoint_save", "checkpoint_restore", "heartbeat", "model_metrics", "host_steps", "configs", "metrics")
        SEQ_FIELD_NUMBER: _ClassVar[int]
        TIME_US_FIELD_NUMBER: _ClassVar[int]
        JOB_START_FIELD_NUMBER: _ClassVar[int]
        JOB_END_FIELD_NUMBER: _ClassVar[int]
        STEP_START_FIELD_NUMBER: _ClassVar[int]
        TPU_INIT_START_FIELD_NUMBER: _ClassVar[int]
        TPU_INIT_END_FIELD_NUMBER: _ClassVar[int]
        TRAINING_PREP_START_FIELD_NUMBER: _ClassVar[int]
        TRAINING_PREP_END_FIELD_NUMBER: _ClassVar[int]
        DATA_LOADING_START_FIELD_NUMBER: _ClassVar[int]
        DATA_LOADING_END_FIELD_NUMBER: _ClassVar[int]
        CUSTOM_BADPUT_START_FIELD_NUMBER: _ClassVar[int]
        CUSTOM_BADPUT_END_FIELD_NUMBER: _ClassVar[int]
        ELASTIC_SLICE_COUNTS_FIELD_NUMBER: _ClassVar[int]
        ELASTIC_WAIT_START_FIELD_NUMBER: _ClassVar[int]
        ELASTIC_WAIT_END_FIELD_NUMBER: _ClassVar[int]
        ELASTIC_REINIT_START_FIELD_NUMBER: _ClassVar[int]
        ELASTIC_REINIT_END_FIELD_NUMBER: _ClassVar[int]
        CHECKPOINT_SAVE_FIELD_NUMBER: _ClassVar[int]
        CHECKPOINT_RESTORE_FIELD_NUMBER: _ClassVar[int]
        HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
        MODEL_METRICS_FIELD_NUMBER: _ClassVar[int]
        HOST_STEPS_FIELD_NUMBER: _ClassVar[int]
        CONFIGS_FIELD_NUMBER: _ClassVar[int]
        METRICS_FIELD_NUMBER: _ClassVar[int]
        seq: int
        time_us: int
        job_start: EventBatch.JobStart
        job_end: EventBatch.JobEnd
        step_start: EventBatch.StepStart
        tpu_init_start: EventBatch.Empty
        tpu_init_end: EventBatch.Empty
        training_prep_start: EventBatch.Empty
        training_prep_end: EventBatch.Empty
        data_loading_start: EventBatch.Empty
        data_loading_end: EventBatch.Empty
        custom_badput_start: EventBatch.CustomBadput
        custom_badput_end: EventBatch.CustomBadput
        elastic_slice_counts: EventBatch.ElasticSliceCounts
        elastic_wait_start: EventBatch.ElasticWait
        elastic_wait_end: EventBatch.ElasticWait
        elastic_reinit_start: EventBatch.Empty
        elastic_reinit_end: EventBatch.Empty
        checkpoint_save: EventBatch.CheckpointSave
        checkpoint_restore: EventBatch.CheckpointRestore
        heartbeat: EventBatch.Empty
        model_metrics: EventBatch.ModelMetrics
        host_steps: EventBatch.HostSteps
        configs: EventBatch.Configs
        metrics: EventBatch.Metrics
        def __init__(self, seq: _Optional[int] = ..., time_us: _Optional[int] = ..., job_start: _Optional[_Union[EventBatch.JobStart, _Mapping]] = ..., job_end: _Optional[_Union[EventBatch.JobEnd, _Mapping]] = ..., step_start: _Optional[_Union[EventBatch.StepStart, _Mapping]] = ..., tpu_init_start: _Optional[_Union[EventBatch.Empty, _Mapping]] = ..., tpu_init_end: _Optional[_Union[EventBatch.Empty, _Mapping]] = ..., training_prep_start: _Optional[_Union[EventBatch.Empty, _Mapping]] = ..., training_prep_end: _Optional[_Union[EventBatch.Empty, _Mapping]] = ..., data_loading_start: _Optional[_Union[EventBatch.Empty, _Mapping]] = ..., data_loading_end: _Optional[_Union[EventBatch.Empty, _Mapping]] = ..., custom_badput_start: _Optional[_Union[EventBatch.CustomBadput, _Mapping]] = ..., custom_badput_end: _Optional[_Union[EventBatch.CustomBadput, _Mapping]] = ..., elastic_slice_counts: _Optional[_Union[EventBatch.ElasticSliceCounts, _Mapping]] = ..., elastic_wait_start: _Optional[_Union[EventBatch.ElasticWait, _Mapping]] = ..., elastic_wait_end: _Optional[_Union[EventBatch.ElasticWait, _Mapping]] = ..., elastic_reinit_start: _Optional[_Union[EventBatch.Empty, _Mapping]] = ..., elastic_reinit_end: _Optional[_Union[EventBatch.Empty, _Mapping]] = ..., checkpoint_save: _Optional[_Union[EventBatch.CheckpointSave, _Mapping]] = ..., checkpoint_restore: _Optional[_Union[EventBatch.CheckpointRestore, _Mapping]] = ..., heartbeat: _Optional[_Union[EventBatch.Empty, _Mapping]] = ..., model_metrics: _Optional[_Union[EventBatch.ModelMetrics, _Mapping]] = ..., host_steps: _Optional[_Union[EventBatch.HostSteps, _Mapping]] = ..., configs: _Optional[_Union[EventBatch.Configs, _Mapping]] = ..., metrics: _Optional[_Union[EventBatch.Metrics, _Mapping]] = ...) -> None: ...
    class Empty(_message.Message):
        __slots__ = ()
        def __init__(self) -> None: ...
    class JobStart(_message.Message):
        __slots__ = ("run_group", "accelerator_type", "chip_count", "labels", "configured_ideal_step_time_s", "location", "emitter_version", "workload")
        class LabelsEntry(_message.Message):
            __slots__ = ("key", "value")
            KEY_FIELD_NUMBER: _ClassVar[int]
            VALUE_FIELD_NUMBER: _ClassVar[int]
            key: str
            value: str
            def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
        RUN_GROUP_FIELD_NUMBER: _ClassVar[int]
        ACCELERATOR_TYPE_FIELD_NUMBER: _ClassVar[int]
        CHIP_COUNT_FIELD_NUMBER: _ClassVar[int]
        LABELS_FIELD_NUMBER: _ClassVar[int]
        CONFIGURED_IDEAL_STEP_TIME_S_FIELD_NUMBER: _ClassVar[int]
        LOCATION_FIELD_NUMBER: _ClassVar[int]
        EMITTER_VERSION_FIELD_NUMBER: _ClassVar[int]
        WORKLOAD_FIELD_NUMBER: _ClassVar[int]
        run_group: str
        accelerator_type: str
        chip_count: int
        labels: _containers.ScalarMap[str, str]
        configured_ideal_step_time_s: float
        location: str
        emitter_version: str
        workload: EventBatch.Workload
        def __init__(self, run_group: _Optional[str] = ..., accelerator_type: _Optional[str] = ..., chip_count: _Optional[int] = ..., labels: _Optional[_Mapping[str, str]] = ..., configured_ideal_step_time_s: _Optional[float] = ..., location: _Optional[str] = ..., emitter_version: _Optional[str] = ..., workload: _Optional[_Union[EventBatch.Workload, _Mapping]] = ...) -> None: ...
    class Workload(_message.Message):
        __slots__ = ("platform", "project", "cluster", "namespace", "jobset_name", "jobset_uid", "job_name", "job_uid", "pod", "node_pool", "instance", "zone")
        PLATFORM_FIELD_NUMBER: _ClassVar[int]
        PROJECT_FIELD_NUMBER: _ClassVar[int]
        CLUSTER_FIELD_NUMBER: _ClassVar[int]
        NAMESPACE_FIELD_NUMBER: _ClassVar[int]
        JOBSET_NAME_FIELD_NUMBER: _ClassVar[int]
        JOBSET_UID_FIELD_NUMBER: _ClassVar[int]
        JOB_NAME_FIELD_NUMBER: _ClassVar[int]
        JOB_UID_FIELD_NUMBER: _ClassVar[int]
        POD_FIELD_NUMBER: _ClassVar[int]
        NODE_POOL_FIELD_NUMBER: _ClassVar[int]
        INSTANCE_FIELD_NUMBER: _ClassVar[int]
        ZONE_FIELD_NUMBER: _ClassVar[int]
        platform: str
        project: str
        cluster: str
        namespace: str
        jobset_name: str
        jobset_uid: str
        job_name: str
        job_uid: str
        pod: str
        node_pool: str
        instance: str
        zone: str
        def __init__(self, platform: _Optional[str] = ..., project: _Optional[str] = ..., cluster: _Optional[str] = ..., namespace: _Optional[str] = ..., jobset_name: _Optional[str] = ..., jobset_uid: _Optional[str] = ..., job_name: _Optional[str] = ..., job_uid: _Optional[str] = ..., pod: _Optional[str] = ..., node_pool: _Optional[str] = ..., instance: _Optional[str] = ..., zone: _Optional[str] = ...) -> None: ...
    class JobEnd(_message.Message):
        __slots__ = ("failed",)
        FAILED_FIELD_NUMBER: _ClassVar[int]
        failed: bool
        def __init__(self, failed: _Optional[bool] = ...) -> None: ...
    class StepStart(_message.Message):
        __slots__ = ("step",)
        STEP_FIELD_NUMBER: _ClassVar[int]
        step: int
        def __init__(self, step: _Optional[int] = ...) -> None: ...
    class CustomBadput(_message.Message):
        __slots__ = ("badput_type",)
        BADPUT_TYPE_FIELD_NUMBER: _ClassVar[int]
        badput_type: str
        def __init__(self, badput_type: _Optional[str] = ...) -> None: ...
    class ElasticSliceCounts(_message.Message):
        __slots__ = ("active_slices", "total_slices", "available_slices")
        ACTIVE_SLICES_FIELD_NUMBER: _ClassVar[int]
        TOTAL_SLICES_FIELD_NUMBER: _ClassVar[int]
        AVAILABLE_SLICES_FIELD_NUMBER: _ClassVar[int]
        active_slices: int
        total_slices: int
        available_slices: int
        def __init__(self, active_slices: _Optional[int] = ..., total_slices: _Optional[int] = ..., available_slices: _Optional[int] = ...) -> None: ...
    class ElasticWait(_message.Message):
        __slots__ = ("event_type",)
        EVENT_TYPE_FIELD_NUMBER: _ClassVar[int]
        event_type: str
        def __init__(self, event_type: _Optional[str] = ...) -> None: ...
    class CheckpointSave(_message.Message):
        __slots__ = ("step", "blocking_s", "persistent")
        STEP_FIELD_NUMBER: _ClassVar[int]
        BLOCKING_S_FIELD_NUMBER: _ClassVar[int]
        PERSISTENT_FIELD_NUMBER: _ClassVar[int]
        step: int
        blocking_s: float
        persistent: bool
        def __init__(self, step: _Optional[int] = ..., blocking_s: _Optional[float] = ..., persistent: _Optional[bool] = ...) -> None: ...
    class CheckpointRestore(_message.Message):
        __slots__ = ("step", "blocking_s")
        STEP_FIELD_NUMBER: _ClassVar[int]
        BLOCKING_S_FIELD_NUMBER: _ClassVar[int]
        step: int
        blocking_s: float
        def __init__(self, step: _Optional[int] = ..., blocking_s: _Optional[float] = ...) -> None: ...
    class ModelMetrics(_message.Message):
        __slots__ = ("step", "loss", "step_time_s", "tokens_per_s", "samples_per_s", "mfu", "tflops_per_device")
        STEP_FIELD_NUMBER: _ClassVar[int]
        LOSS_FIELD_NUMBER: _ClassVar[int]
        STEP_TIME_S_FIELD_NUMBER: _ClassVar[int]
        TOKENS_PER_S_FIELD_NUMBER: _ClassVar[int]
        SAMPLES_PER_S_FIELD_NUMBER: _ClassVar[int]
        MFU_FIELD_NUMBER: _ClassVar[int]
        TFLOPS_PER_DEVICE_FIELD_NUMBER: _ClassVar[int]
        step: int
        loss: float
        step_time_s: float
        tokens_per_s: float
        samples_per_s: float
        mfu: float
        tflops_per_device: float
        def __init__(self, step: _Optional[int] = ..., loss: _Optional[float] = ..., step_time_s: _Optional[float] = ..., tokens_per_s: _Optional[float] = ..., samples_per_s: _Optional[float] = ..., mfu: _Optional[float] = ..., tflops_per_device: _Optional[float] = ...) -> None: ...
    class HostSteps(_message.Message):
        __slots__ = ("host", "count", "mean_s", "max_s")
        HOST_FIELD_NUMBER: _ClassVar[int]
        COUNT_FIELD_NUMBER: _ClassVar[int]
        MEAN_S_FIELD_NUMBER: _ClassVar[int]
        MAX_S_FIELD_NUMBER: _ClassVar[int]
        host: str
        count: int
        mean_s: float
        max_s: float
        def __init__(self, host: _Optional[str] = ..., count: _Optional[int] = ..., mean_s: _Optional[float] = ..., max_s: _Optional[float] = ...) -> None: ...
    class Configs(_message.Message):
        __slots__ = ("source", "values")
        class ValuesEntry(_message.Message):
            __slots__ = ("key", "value")
            KEY_FIELD_NUMBER: _ClassVar[int]
            VALUE_FIELD_NUMBER: _ClassVar[int]
            key: str
            value: str
            def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
        SOURCE_FIELD_NUMBER: _ClassVar[int]
        VALUES_FIELD_NUMBER: _ClassVar[int]
        source: str
        values: _containers.ScalarMap[str, str]
        def __init__(self, source: _Optional[str] = ..., values: _Optional[_Mapping[str, str]] = ...) -> None: ...
    class Metrics(_message.Message):
        __slots__ = ("step", "values")
        class ValuesEntry(_message.Message):
            __slots__ = ("key", "value")
            KEY_FIELD_NUMBER: _ClassVar[int]
            VALUE_FIELD_NUMBER: _ClassVar[int]
            key: str
            value: float
            def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
        STEP_FIELD_NUMBER: _ClassVar[int]
        VALUES_FIELD_NUMBER: _ClassVar[int]
        step: int
        values: _containers.ScalarMap[str, float]
        def __init__(self, step: _Optional[int] = ..., values: _Optional[_Mapping[str, float]] = ...) -> None: ...
    SCHEMA_VERSION_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_ID_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    WORKLOAD_UID_FIELD_NUMBER: _ClassVar[int]
    schema_version: int
    run_id: str
    attempt_id: str
    events: _containers.RepeatedCompositeFieldContainer[EventBatch.Event]
    workload_uid: str
    def __init__(self, schema_version: _Optional[int] = ..., run_id: _Optional[str] = ..., attempt_id: _Optional[str] = ..., events: _Optional[_Iterable[_Union[EventBatch.Event, _Mapping]]] = ..., workload_uid: _Optional[str] = ...) -> None: ...
