"""The event contract: Pub/Sub's rules for the schema, generated code, and emitter round trips."""

from __future__ import annotations

import json
from pathlib import Path

from google.protobuf import json_format

from emitter import GoodputRecorder
from emitter.testing import capture_events
from goodput_schemas import DIRECTORY, EVENT_PROTO
from goodput_schemas.goodput_event_pb2 import DESCRIPTOR, EventBatch
from pipeline.core.events import EVENT_KINDS, parse_message
from support.runs import at


def record_every_kind(recorder: GoodputRecorder) -> None:
    """Calls every recorder method once, with explicit times."""
    recorder.record_job_start_time(at(0))
    recorder.record_tpu_init_start_time(at(1))
    recorder.record_tpu_init_end_time(at(2))
    recorder.record_training_preparation_start_time(at(3))
    recorder.record_checkpoint_restore(100, at(3.5), at(4.5))
    recorder.record_training_preparation_end_time(at(5))
    recorder.record_data_loading_start_time(at(6))
    recorder.record_data_loading_end_time(at(7))
    recorder.record_step_start_time(100, at(8))
    recorder.record_model_metrics(100, loss=float("nan"), step_time_s=1.5, tokens_per_s=1e6,
                                  samples_per_s=512, mfu=0.41, tflops_per_device=180.5, time_=at(9.5))
    recorder.record_custom_badput_event_start_time(at(9.6), "EVAL_STEP")
    recorder.record_custom_badput_event_end_time(at(9.9), "EVAL_STEP")
    recorder.record_checkpoint_save(100, at(10), at(12), persistent=False)
    recorder.record_elastic_slice_counts(3, 4, 3, at(13))
    recorder.record_elastic_wait_start_time("slice_down", at(14))
    recorder.record_elastic_wait_end_time("slice_down", at(15))
    recorder.record_elastic_reinit_start_time(at(16))
    recorder.record_elastic_reinit_end_time(at(17))
    recorder.record_heartbeat(at(18))
    recorder.record_host_steps("worker-1", 60, 0.25, 0.5, at(18.5))
    recorder.record_configs({"model": {"layers": 4, "dtype": "bfloat16"}, "seed": 0}, at(18.6))
    recorder.record_metrics({"LOSS": float("inf"), "LEARNING_RATE": 3e-4}, step=100, time_=at(18.7))
    recorder.record_job_end_time(at(19))


def test_schema_has_one_top_level_message_and_no_imports():
    """Pub/Sub accepts a protobuf schema only with one top-level message and no imports."""
    assert list(DESCRIPTOR.message_types_by_name) == ["EventBatch"]
    assert not DESCRIPTOR.dependencies
    assert "import " not in EVENT_PROTO.read_text()


def test_generated_code_matches_the_proto(tmp_path: Path):
    """goodput_event_pb2.py and .pyi are exactly what protoc generates from the .proto now."""
    from grpc_tools import protoc

    assert protoc.main(["protoc", f"-I{DIRECTORY}", f"--python_out={tmp_path}", f"--pyi_out={tmp_path}",
                        str(EVENT_PROTO)]) == 0
    for name in ("goodput_event_pb2.py", "goodput_event_pb2.pyi"):
        assert (tmp_path / name).read_text() == (DIRECTORY / name).read_text(), (
            f"goodput_schemas/{name} is stale: regenerate it (see goodput_schemas/__init__.py)")


def test_every_event_kind_has_a_recorder_method_and_validates():
    """The emitter can write every kind in the schema, and every message it writes is valid."""
    with capture_events() as captured:
        recorder = GoodputRecorder("run-1", logging_enabled=True, chip_count=8,
                                   labels={"team": "llm"}, configured_ideal_step_time=1.5)
        record_every_kind(recorder)
        recorder.close()
    assert {event.kind for event in captured.events} == set(EVENT_KINDS)
    for message in captured.messages:
        json_format.Parse(message.data, EventBatch())  # strict: unknown fields are errors
        events, dead = parse_message(message.data)
        assert not dead
        assert [e.seq for e in events] == list(range(message.first_seq, message.last_seq + 1))


def test_message_round_trips_through_protobuf():
    """JSON -> protobuf -> JSON -> parse gives the same events as parsing the original."""
    with capture_events() as captured:
        recorder = GoodputRecorder("run-1", logging_enabled=True, accelerator_type="v5p")
        record_every_kind(recorder)
        recorder.close()
    for message in captured.messages:
        proto = json_format.Parse(message.data, EventBatch())
        again = json_format.MessageToJson(proto, preserving_proto_field_name=True)
        original_events, _ = parse_message(message.data)
        round_tripped, dead = parse_message(again)
        assert not dead
        assert [(e.seq, e.time_us, e.kind) for e in round_tripped] == [
            (e.seq, e.time_us, e.kind) for e in original_events]
        for before, after in zip(original_events, round_tripped, strict=True):
            assert json.dumps(before.body, sort_keys=True) == json.dumps(after.body, sort_keys=True)


def test_job_start_carries_the_run_metadata(make_settings):
    """Run metadata rides on the job_start event, exactly as given."""
    with capture_events() as captured:
        recorder = GoodputRecorder("run-1", logging_enabled=True, run_group="llama", chip_count=512,
                                   accelerator_type="v5p", labels={"team": "llm", "tier": "prod"},
                                   location="us-east5-a", configured_ideal_step_time=2.25,
                                   settings=make_settings())
        recorder.record_job_start_time(at(0))
        recorder.close()
    (event,) = captured.events
    assert event.kind == "job_start"
    body = dict(event.body)
    assert body.pop("emitter_version")
    assert body == {"run_group": "llama", "chip_count": 512, "accelerator_type": "v5p",
                    "labels": {"team": "llm", "tier": "prod"}, "location": "us-east5-a",
                    "configured_ideal_step_time_s": 2.25}
