"""Configs and metrics by name: what ``record_configs`` and ``record_metrics`` record, what the
limits make them leave out (counted, logged once, raised only when strict), and the configs the
emitter's thread collects itself, dated at the job start and never initializing a JAX backend."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from typing import Any

import numpy
import pytest
from google.protobuf import json_format

import emitter.collect
from emitter import EmitterSettings, GoodputRecorder, metrics
from emitter.configs import MAX_DEPTH, config_text, fit_configs
from emitter.testing import CapturedEvent, capture_events
from goodput_schemas.goodput_event_pb2 import EventBatch
from goodput_schemas.limits import (
    MAX_CONFIG_ENTRIES,
    MAX_CONFIG_VALUE_LENGTH,
    MAX_METRIC_NAMES,
    MAX_METRICS_PER_EVENT,
)
from support import REPO
from support.runs import S, at

HAS_JAX = subprocess.run([sys.executable, "-c", "import jax"], capture_output=True).returncode == 0


def recorded(make_settings: Callable[..., EmitterSettings], record: Callable[[GoodputRecorder], None],
             **settings: Any) -> tuple[list[CapturedEvent], GoodputRecorder]:
    """The events one recorder delivers, each of its messages checked against the schema."""
    with capture_events() as captured:
        recorder = GoodputRecorder("run-1", logging_enabled=True, settings=make_settings(**settings))
        record(recorder)
        assert recorder.close()
    for message in captured.messages:
        json_format.Parse(message.data, EventBatch())  # strict: unknown fields are errors
    return captured.events, recorder


def of_kind(events: list[CapturedEvent], kind: str) -> list[CapturedEvent]:
    return [event for event in events if event.kind == kind]


class Opaque:
    def __str__(self) -> str:
        return "opaque!"


# -- the job's own configs ------------------------------------------------------------------------


def test_nested_configs_become_dotted_keys_and_their_values_text(make_settings):
    """Mappings, lists and tuples are flattened to dotted keys; every leaf is text in its
    documented form, recorded as one user configs event at the given time."""
    configs = {"model": {"layers": 32, "dims": [512, 2048], "dtype": "bfloat16", "tied": True},
               "optimizer": {"learning_rate": 3e-4, "betas": (0.9, 0.95), "eps": 1e-8, "clip": None},
               "empty": {}, "none_yet": [], 7: "a key that is a number", "float32": numpy.float32(0.1),
               "int64": numpy.int64(5), "flag": numpy.bool_(False), "big": 2**70, "inf": float("inf"),
               "other": Opaque(), "nan": float("nan")}
    events, _ = recorded(make_settings, lambda r: r.record_configs(configs, time_=at(3)))
    (event,) = events
    assert (event.kind, event.body["source"]) == ("configs", "user")
    assert event.time_us == round(at(3).timestamp() * S)
    assert event.body["values"] == {
        "model.layers": "32", "model.dims.0": "512", "model.dims.1": "2048", "model.dtype": "bfloat16",
        "model.tied": "true", "optimizer.learning_rate": "0.0003", "optimizer.betas.0": "0.9",
        "optimizer.betas.1": "0.95", "optimizer.eps": "1e-08", "optimizer.clip": "null", "empty": "{}",
        "none_yet": "[]", "7": "a key that is a number", "float32": "0.1", "int64": "5", "flag": "false",
        "big": str(2**70), "inf": "inf", "other": "opaque!", "nan": "nan"}


def test_configs_past_the_entry_limit_keep_the_first_entries_and_count_the_rest(make_settings, caplog):
    """Past MAX_CONFIG_ENTRIES, the first entries in the mapping's order are kept; the rest,
    and entries the limits refuse, are counted in dropped_config_entries and logged once."""
    many = {f"k{i:05d}": i for i in range(MAX_CONFIG_ENTRIES + 150)}
    refused = {"a\nkey": 1, "long": "x" * (MAX_CONFIG_VALUE_LENGTH + 1),
               "fits": "x" * MAX_CONFIG_VALUE_LENGTH}

    def record(recorder: GoodputRecorder) -> None:
        recorder.record_configs({**refused, **many})
        recorder.record_configs({**refused, **many})

    with caplog.at_level(logging.WARNING, logger="emitter"):
        events, recorder = recorded(make_settings, record)
    first, second = events
    assert first.body == second.body
    assert list(first.body["values"]) == ["fits", *list(many)[:MAX_CONFIG_ENTRIES - 1]]
    assert recorder.stats.dropped_config_entries == 2 * (2 + 151)
    assert recorder.stats.invalid_calls == 0
    warnings = [r.getMessage() for r in caplog.records if "record_configs" in r.getMessage()]
    assert len(warnings) == 1 and "dropped_config_entries" in warnings[0]


def test_a_strict_recorder_raises_for_a_config_entry_it_would_leave_out(make_settings):
    """strict=True turns an entry left out into a ValueError naming the limit, and records nothing."""
    with capture_events() as captured:
        recorder = GoodputRecorder("run-1", logging_enabled=True, settings=make_settings(), strict=True)
        with pytest.raises(ValueError, match="MAX_CONFIG_VALUE_LENGTH"):
            recorder.record_configs({"long": "x" * (MAX_CONFIG_VALUE_LENGTH + 1)})
        assert recorder.close()
    assert captured.events == []


def test_a_container_that_holds_itself_drops_the_entry_that_repeats_it():
    """A cycle's repeating entry is dropped, counted and named; everything else is kept."""
    loop: dict[str, Any] = {"name": "loop"}
    loop["self"] = loop
    fitted = fit_configs(loop)
    assert fitted.values == {"name": "loop"}
    assert fitted.dropped == 1 and "'self' is a container holding itself" in fitted.reason


def test_a_list_holding_itself_twice_returns_at_once():
    """A list holding itself twice (2**32 paths to the depth limit) is two dropped entries, at
    once."""
    twice: list[Any] = []
    twice += [twice, twice]
    started = time.monotonic()
    fitted = fit_configs({"x": twice, "after": 1})
    assert time.monotonic() - started < 1.0
    assert fitted.values == {"after": "1"} and fitted.dropped == 2


def test_a_configuration_too_large_to_walk_is_counted_not_walked():
    """Lists holding one list twice, 40 deep (2**40 entries), cost a bounded walk; every entry
    left out is counted."""
    shared: list[Any] = [1]
    for _ in range(40):
        shared = [shared, shared]
    started = time.monotonic()
    fitted = fit_configs({"first": 0, "x": shared})
    assert time.monotonic() - started < 1.0
    assert fitted.values == {"first": "0"}
    assert fitted.dropped == 2**40


def test_entries_past_the_depth_limit_are_counted_each():
    """A container past MAX_DEPTH drops every entry it holds, counted."""
    deep: Any = {"a": 1, "b": [2, 3]}
    for _ in range(MAX_DEPTH + 1):
        deep = {"d": deep}
    fitted = fit_configs(deep)
    assert fitted.values == {} and fitted.dropped == 3 and "MAX_DEPTH" in fitted.reason


def test_flattened_keys_that_collide_keep_the_first_and_count_the_rest(make_settings, caplog):
    """{"a.b": 1, "a": {"b": 2}} flattens to "a.b" twice: the first is kept, the other counted in
    dropped_config_entries and logged."""
    with caplog.at_level(logging.WARNING, logger="emitter"):
        events, recorder = recorded(make_settings, lambda r: r.record_configs({"a.b": 1, "a": {"b": 2}}))
    assert events[0].body["values"] == {"a.b": "1"}
    assert recorder.stats.dropped_config_entries == 1
    assert any("'a.b' is given twice" in r.getMessage() for r in caplog.records)


def test_a_key_without_text_drops_its_entries_and_keeps_the_rest():
    """A key whose str() raises drops what it holds, counted; its neighbours are kept."""

    class NoText:
        def __str__(self) -> str:
            raise RuntimeError("no text")

    fitted = fit_configs({NoText(): {"a": 1, "b": 2}, "c": 3})
    assert fitted.values == {"c": "3"} and fitted.dropped == 2


@pytest.mark.parametrize("configs", [None, "lr=0.1", [("lr", 0.1)], 3])
def test_configs_that_are_not_a_mapping_record_nothing_and_are_counted(make_settings, configs):
    """Anything but a mapping is an invalid call: nothing recorded, counted, never raised."""
    events, recorder = recorded(make_settings, lambda r: r.record_configs(configs))
    assert events == [] and recorder.stats.invalid_calls == 1


def test_config_text_forms():
    """Each value's text, as the module documents it."""
    assert [config_text(v) for v in (True, None, 0.1, 1e22, -0.0, "text", b"raw", numpy.float64(2.5))] == [
        "true", "null", "0.1", "1e+22", "-0.0", "text", "b'raw'", "2.5"]


# -- metrics by name ------------------------------------------------------------------------------


def test_metrics_are_recorded_by_name_at_a_step_or_at_a_time(make_settings):
    """Named values at a step, or dated only; ML Diagnostics' names and the job's own; a
    diverged loss as proto3 JSON writes it."""

    def record(recorder: GoodputRecorder) -> None:
        recorder.record_metrics({metrics.LOSS: float("nan"), metrics.LEARNING_RATE: numpy.float32(0.5),
                                 "my_metric": 3}, step=10, time_=at(1))
        recorder.record_metrics({metrics.THROUGHPUT: 1e6}, time_=at(2))
        recorder.record_metrics({metrics.LOSS: float("-inf")}, step=numpy.int64(11))

    events, _ = recorded(make_settings, record)
    assert [(e.kind, e.body) for e in events] == [
        ("metrics", {"step": 10, "values": {"LOSS": "NaN", "LEARNING_RATE": 0.5, "my_metric": 3.0}}),
        ("metrics", {"values": {"THROUGHPUT": 1e6}}),
        ("metrics", {"step": 11, "values": {"LOSS": "-Infinity"}}),
    ]
    assert events[1].time_us - events[0].time_us == S
    assert set(metrics.ML_DIAGNOSTICS) == {"LEARNING_RATE", "LOSS", "GRADIENT_NORM", "TOTAL_WEIGHTS",
                                           "STEP_TIME", "THROUGHPUT", "LATENCY", "TFLOPS", "MFU"}


def test_more_values_than_one_event_holds_make_several_events(make_settings):
    """A call with more than MAX_METRICS_PER_EVENT values records them all, in several events."""
    values = {f"m{i}": float(i) for i in range(MAX_METRICS_PER_EVENT + 10)}
    events, _ = recorded(make_settings, lambda r: r.record_metrics(values, step=1))
    assert [len(e.body["values"]) for e in events] == [MAX_METRICS_PER_EVENT, 10]
    assert {name: value for e in events for name, value in e.body["values"].items()} == values


def test_metric_names_past_the_attempts_limit_are_left_out_counted_and_logged_once(make_settings, caplog):
    """An attempt records at most MAX_METRIC_NAMES names: values of further names are left out
    (counted, logged once), known names still record, and a new attempt starts afresh."""

    def record(recorder: GoodputRecorder) -> None:
        recorder.record_job_start_time(at(0))
        for step in range(3):
            recorder.record_metrics({f"per_step_{step}_{i}": 1.0 for i in range(100)}, step=step)
        recorder.record_metrics({"per_step_0_0": 2.0, "one_too_many": 2.0}, step=3)
        recorder.record_job_start_time(at(10))  # a new attempt
        recorder.record_metrics({"one_too_many": 3.0}, step=4)

    with caplog.at_level(logging.WARNING, logger="emitter"):
        events, recorder = recorded(make_settings, record)
    first = {name for e in of_kind(events, "metrics") if e.attempt_id != recorder.attempt_id
             for name in e.body["values"]}
    assert len(first) == MAX_METRIC_NAMES and "one_too_many" not in first
    assert [e.body for e in of_kind(events, "metrics") if e.attempt_id == recorder.attempt_id] == [
        {"step": 4, "values": {"one_too_many": 3.0}}]
    assert recorder.stats.dropped_metric_values == 300 - MAX_METRIC_NAMES + 1
    assert len([r for r in caplog.records if "dropped_metric_values" in r.getMessage()]) == 1


@pytest.mark.parametrize(("values", "step", "message"), [
    ({}, None, "non-empty mapping"), ([("LOSS", 1.0)], None, "non-empty mapping"),
    ({"": 1.0}, None, "printable"), ({"a\nb": 1.0}, None, "printable"), ({"x" * 129: 1.0}, None, "printable"),
    ({7: 1.0}, None, "must be a str"), ({"LOSS": "high"}, None, "must be a number"),
    ({"LOSS": 1.0}, -1, "step must be >= 0"),
], ids=["empty", "not a mapping", "empty name", "newline", "long name", "int name", "text value", "step"])
def test_metrics_the_pipeline_would_refuse_record_nothing(make_recorder, values, step, message):
    """A call with a value the pipeline would refuse records nothing and is counted; a strict
    recorder raises ValueError naming the problem."""
    recorder = make_recorder()
    recorder.record_metrics(values, step=step)
    assert (recorder.stats.recorded, recorder.stats.invalid_calls) == (0, 1)
    with pytest.raises(ValueError, match=message):
        make_recorder(strict=True).record_metrics(values, step=step)


def test_a_strict_recorder_raises_past_the_metric_name_limit(make_recorder):
    """strict=True turns values left out past MAX_METRIC_NAMES into a ValueError."""
    recorder = make_recorder(strict=True)
    recorder.record_metrics({f"m{i}": 1.0 for i in range(MAX_METRIC_NAMES)})
    with pytest.raises(ValueError, match="MAX_METRIC_NAMES"):
        recorder.record_metrics({"one_more": 1.0})


# -- what the emitter collects itself -------------------------------------------------------------


def test_collected_configs_are_recorded_once_per_attempt_dated_at_its_job_start(make_settings, monkeypatch):
    """Without JAX, each attempt gets one software and one system configs event, at its job start."""
    monkeypatch.setattr(emitter.collect, "jax_backends_up", lambda: None)
    monkeypatch.setenv("XLA_FLAGS", "--xla_dump_to=/tmp/dump --xla_enable_fast_math")
    monkeypatch.setenv("SECRET_TOKEN", "never read")

    def record(recorder: GoodputRecorder) -> None:
        for attempt in range(2):
            recorder.record_job_start_time(at(100 * attempt))
            for step in range(5):
                recorder.record_step_start_time(step, at(100 * attempt + step + 1))

    events, recorder = recorded(make_settings, record, collect_configs=True)
    configs = of_kind(events, "configs")
    starts = {e.attempt_id: e.time_us for e in of_kind(events, "job_start")}
    assert sorted((e.attempt_id, e.body["source"]) for e in configs) == sorted(
        (attempt, source) for attempt in starts for source in ("software", "system"))
    assert all(e.time_us == starts[e.attempt_id] for e in configs)
    software = next(e.body["values"] for e in configs if e.body["source"] == "software")
    assert software["emitter.version"] == emitter.__version__
    assert software["python.version"] == "{}.{}.{}".format(*sys.version_info[:3])
    assert ("packages.jax" in software) == HAS_JAX
    system = next(e.body["values"] for e in configs if e.body["source"] == "system")
    assert system["XLA_FLAGS.xla_dump_to"] == "/tmp/dump"
    assert system["XLA_FLAGS.xla_enable_fast_math"] == "true"
    assert system["host.cpu_count"] == str(os.cpu_count())
    assert "never read" not in json.dumps(system) and not any(key.startswith("device.") for key in system)
    assert recorder.stats.recorded == recorder.stats.sent == 2 * 6 + 4


def test_a_recorder_closed_right_after_its_job_start_still_delivers_the_collected_configs(make_settings):
    """close() waits for the configs the thread derives from the job start, within its timeout."""
    events, recorder = recorded(make_settings, lambda r: r.record_job_start_time(at(0)), collect_configs=True)
    assert {e.body["source"] for e in of_kind(events, "configs")} >= {"software"}
    assert recorder.stats.sent == recorder.stats.recorded == len(events)


@pytest.mark.parametrize(("environment", "keyword", "expected"), [
    ({}, {}, True), ({"GOODPUT_COLLECT_CONFIGS": "0"}, {}, False),
    ({"GOODPUT_COLLECT_CONFIGS": "off"}, {}, False),
    ({"GOODPUT_COLLECT_CONFIGS": "0"}, {"collect_configs": True}, True),
    ({}, {"collect_configs": False}, False), ({"GOODPUT_COLLECT_CONFIGS": "maybe"}, {}, True),
], ids=["default", "env 0", "env off", "setting over env", "setting", "unreadable env"])
def test_collected_configs_are_turned_off_by_a_setting_or_the_environment(monkeypatch, tmp_path, environment,
                                                                         keyword, expected):
    """EmitterSettings.collect_configs, defaulting to $GOODPUT_COLLECT_CONFIGS, turns them off."""
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    settings = EmitterSettings(spool_dir=tmp_path, heartbeat_interval_s=None, discover_workload=False,
                               **keyword)
    assert settings.collect_configs is expected
    with capture_events() as captured:
        recorder = GoodputRecorder("run-1", logging_enabled=True, settings=settings)
        recorder.record_job_start_time(at(0))
        assert recorder.close()
    assert bool(of_kind(captured.events, "configs")) is expected


def test_collected_entries_the_limits_refuse_are_counted(make_settings, monkeypatch):
    """A flag value over MAX_CONFIG_VALUE_LENGTH is left out of the system configs and counted."""
    monkeypatch.setattr(emitter.collect, "jax_backends_up", lambda: None)
    monkeypatch.setenv("LIBTPU_INIT_ARGS", f"--xla_ok=1 --xla_huge={'x' * (MAX_CONFIG_VALUE_LENGTH + 1)}")
    events, recorder = recorded(make_settings, lambda r: r.record_job_start_time(at(0)), collect_configs=True)
    (system,) = [e.body["values"] for e in of_kind(events, "configs") if e.body["source"] == "system"]
    assert system["LIBTPU_INIT_ARGS.xla_ok"] == "1" and "LIBTPU_INIT_ARGS.xla_huge" not in system
    assert recorder.stats.dropped_config_entries == 1


NEVER_INITIALIZES = textwrap.dedent('''
    import datetime, json, sys
    import jax
    from jax._src import xla_bridge
    from emitter import EmitterSettings, GoodputRecorder

    T0 = datetime.datetime(2026, 11, 1, tzinfo=datetime.timezone.utc)

    def at(seconds):
        return T0 + datetime.timedelta(seconds=seconds)

    settings = EmitterSettings(spool_dir=sys.argv[2], heartbeat_interval_s=None, max_latency_s=0.05)
    recorder = GoodputRecorder("run", logging_enabled=True, destination="file:" + sys.argv[1],
                               settings=settings)
    recorder.record_job_start_time(at(0))          # JAX imported, its backends not up
    assert recorder.flush(30)
    recorder.record_step_start_time(0, at(1))
    recorder.record_step_start_time(1, at(2))
    assert recorder.flush(30)
    assert not xla_bridge.backends_are_initialized(), "the emitter initialized a JAX backend"
    jax.numpy.zeros(()).block_until_ready()       # the job brings its backends up
    recorder.record_job_start_time(at(10))         # a new attempt
    assert recorder.close(30)
''')


@pytest.mark.skipif(not HAS_JAX, reason="JAX is not installed")
def test_the_emitter_never_initializes_a_jax_backend_and_names_the_devices_once_they_are_up(tmp_path):
    """With JAX imported but not initialized, the system configs wait for the first later batch
    holding a step start, are dated at its last one and name no device; once the job brings the
    backends up, an attempt's system configs name its devices, dated at its job start."""
    events_file = tmp_path / "events.jsonl"
    environment = {**os.environ, "JAX_PLATFORMS": "cpu", "GOODPUT_DISCOVER_WORKLOAD": "0",
                   "PYTHONPATH": str(REPO)}
    subprocess.run([sys.executable, "-c", NEVER_INITIALIZES, str(events_file), str(tmp_path / "spool")],
                   env=environment, check=True, timeout=120)
    batches = [json.loads(line) for line in events_file.read_text().splitlines()]
    for line in events_file.read_text().splitlines():
        json_format.Parse(line, EventBatch())
    events = [(batch["attempt_id"], event) for batch in batches for event in batch["events"]]
    first, second = list(dict.fromkeys(attempt for attempt, _ in events))
    systems = {attempt: event for attempt, event in events
               if event.get("configs", {}).get("source") == "system"}
    starts = {attempt: event["time_us"] for attempt, event in events if "job_start" in event}
    steps = [event["time_us"] for attempt, event in events if "step_start" in event]
    assert systems[first]["time_us"] == steps[-1]
    assert not any(key.startswith("device.") for key in systems[first]["configs"]["values"])
    assert systems[second]["time_us"] == starts[second]
    devices = systems[second]["configs"]["values"]
    assert devices["device.platform"] == "cpu" and int(devices["device.count"]) >= 1
    assert (devices["process.count"], devices["process.index"]) == ("1", "0")
    software = next(event["configs"]["values"] for attempt, event in events
                    if attempt == first and event.get("configs", {}).get("source") == "software")
    assert software["framework"] == "jax" and software["framework.version"] == software["packages.jax"]
