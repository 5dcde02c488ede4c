"""Validation of messages by the pipeline: valid events kept, everything else dead-lettered."""

from __future__ import annotations

import json
import math
import time
from typing import Any
from unittest import mock

import pytest
from google.protobuf import json_format
from hypothesis import example, given, settings
from hypothesis import strategies as st

from goodput_schemas.goodput_event_pb2 import EventBatch
from goodput_schemas.wire import encode_batch, workload_run_id
from pipeline.core import events as events_module
from pipeline.core.events import (
    EVENT_KINDS,
    MAX_TIME_US,
    MIN_TIME_US,
    _columnar,
    _fast_event,
    _plain,
    parse_batch,
    parse_message,
)

T = 1_793_000_000_000_000  # 2026-10-25, in microseconds


def batch(*events: dict[str, Any], **header: Any) -> str:
    document = {"schema_version": 1, "run_id": "run-1", "attempt_id": "a1", "events": list(events)}
    document.update(header)
    return json.dumps(document)


def test_valid_message_becomes_events():
    """A valid batch yields one Event per event, with ids, times and plain bodies."""
    events, dead = parse_message(batch(
        {"seq": 0, "time_us": T, "job_start": {"chip_count": "256", "labels": {"a": "b"}}},
        {"seq": 1, "time_us": str(T + 5), "step_start": {"step": 0}},
        {"seq": 2, "time_us": T + 9, "job_end": {}},
    ))
    assert not dead
    assert [(e.event_id, e.time_us, e.kind) for e in events] == [
        ("a1:0", T, "job_start"), ("a1:1", T + 5, "step_start"), ("a1:2", T + 9, "job_end")]
    assert events[0].body == {"chip_count": 256, "labels": {"a": "b"}, "run_group": "",
                              "accelerator_type": "", "location": "", "emitter_version": ""}
    assert events[1].body == {"step": 0}  # proto3 defaults are values: step 0 is a step


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (b"\xff\xfe", "not UTF-8"),
        ('{"schema_version": 1, "run_id": ', "not valid JSON"),
        ("[1, 2]", "JSON object"),
        (batch({"seq": 0, "time_us": T, "job_end": {}}, schema_version=2), "unsupported schema_version"),
        (json.dumps({"run_id": "r", "attempt_id": "a", "events": []}), "unsupported schema_version"),
        (batch({"seq": 0, "time_us": T, "job_end": {}}, colour="red"), "does not match the schema"),
        (batch({"seq": 0, "time_us": T, "job_end": {}}, run_id=""), "run_id"),
        (batch({"seq": 0, "time_us": T, "job_end": {}}, attempt_id="a\x00b"), "attempt_id"),
        (batch(), "no events"),
    ],
)
def test_unreadable_message_is_one_dead_letter(payload, reason):
    """A message that cannot be read as a whole becomes one dead letter with the raw payload."""
    events, dead = parse_message(payload, "events.jsonl:3")
    assert events == []
    assert len(dead) == 1
    assert reason in dead[0].reason
    assert dead[0].source == "events.jsonl:3"
    assert dead[0].payload


@pytest.mark.parametrize(
    ("event", "reason"),
    [
        ({"seq": 1, "time_us": T}, "no kind"),
        ({"seq": 1, "time_us": T, "step_start": {"step": 1}, "job_end": {}}, "does not match"),
        ({"seq": 1, "time_us": T, "warp_drive": {}}, "does not match"),
        ({"seq": 1, "time_us": T, "step_start": {"step": -4}}, "step must be >= 0"),
        ({"seq": 1, "time_us": T, "step_start": {"step": "four"}}, "does not match"),
        ({"seq": -1, "time_us": T, "job_end": {}}, "seq must be >= 0"),
        ({"seq": 1, "time_us": 12, "job_end": {}}, "outside"),
        ({"seq": 1, "time_us": T, "checkpoint_save": {"step": 1, "blocking_s": "NaN"}}, "finite"),
        ({"seq": 1, "time_us": T, "checkpoint_restore": {"step": 1, "blocking_s": -2.0}}, ">= 0"),
        ({"seq": 1, "time_us": T, "job_start": {"configured_ideal_step_time_s": 0}}, "> 0"),
        ({"seq": 1, "time_us": T, "job_end": {"failed": "yes"}}, "does not match"),
        ({"seq": 1, "time_us": T, "job_end": {"failed": 1}}, "does not match"),
        ({"seq": 1, "time_us": T, "host_steps": {"count": 3, "mean_s": 1.0, "max_s": 2.0}}, "host must not"),
        ({"seq": 1, "time_us": T, "host_steps": {"host": "h", "mean_s": 1.0, "max_s": 2.0}},
         "count must be >= 1"),
        ({"seq": 1, "time_us": T, "host_steps": {"host": "h", "count": 3, "mean_s": 3.0, "max_s": 2.0}},
         "at most max_s"),
        ({"seq": 1, "time_us": T, "configs": {"source": "mine", "values": {"a": "1"}}},
         "configs.source must be one of user, software, system"),
        ({"seq": 1, "time_us": T, "configs": {"values": {"a": "1"}}}, "configs.source must be one of"),
        ({"seq": 1, "time_us": T, "configs": {"source": "user", "values": {"": "1"}}},
         "a configs key is empty"),
        ({"seq": 1, "time_us": T, "configs": {"source": "user", "values": {"a\nb": "1"}}},
         "a configs key must be printable"),
        ({"seq": 1, "time_us": T, "configs": {"source": "user", "values": {"a": "x" * 1025}}},
         "more than MAX_CONFIG_VALUE_LENGTH"),
        ({"seq": 1, "time_us": T, "configs": {"source": "user", "values": dict.fromkeys(map(str, range(1001)),
                                                                                         "1")}},
         "more than MAX_CONFIG_ENTRIES"),
        ({"seq": 1, "time_us": T, "configs": {"source": "user", "values": {"a": 1}}}, "does not match"),
        ({"seq": 1, "time_us": T, "metrics": {"step": 2}}, "must name at least one metric"),
        ({"seq": 1, "time_us": T, "metrics": {"step": -2, "values": {"LOSS": 1.0}}}, "step must be >= 0"),
        ({"seq": 1, "time_us": T, "metrics": {"values": {"x" * 129: 1.0}}}, "a metric name must be"),
        ({"seq": 1, "time_us": T, "metrics": {"values": {"LOSS\x1b": 1.0}}}, "a metric name must be"),
        ({"seq": 1, "time_us": T, "metrics": {"values": {f"m{i}": 1.0 for i in range(65)}}},
         "more than MAX_METRICS_PER_EVENT"),
        ({"seq": 1, "time_us": T, "metrics": {"values": {"LOSS": "high"}}}, "does not match"),
        ({"seq": 1, "time_us": T, "job_start": {"workload": {"cluster": "c\n1"}}},
         "job_start.workload.cluster must be printable"),
        ({"seq": 1, "time_us": T, "job_start": {"workload": {"pod": "p" * 257}}},
         "more than MAX_TEXT_LENGTH"),
        ({"seq": 1, "time_us": T, "job_start": {"workload": {"rack": "r1"}}}, "does not match"),
    ],
)
def test_invalid_event_is_dead_lettered_and_its_neighbours_kept(event, reason):
    """One bad event costs only itself: the valid events of the same message are kept."""
    good = {"seq": 0, "time_us": T, "step_start": {"step": 0}}
    events, dead = parse_message(batch(good, event))
    assert [e.seq for e in events] == [0]
    assert len(dead) == 1
    assert reason in dead[0].reason
    assert dead[0].run_id == "run-1"
    assert json.loads(dead[0].payload) == event


@pytest.mark.parametrize(("given", "body"), [({}, {}), ({"failed": None}, {}),
                                            ({"failed": True}, {"failed": True}),
                                            ({"failed": False}, {"failed": False})])
def test_job_end_says_whether_the_attempt_failed_when_known(given, body):
    """``job_end.failed`` is optional: set, it is kept as given; unset (or null), the body has none."""
    for data in (batch({"seq": 0, "time_us": T, "job_end": given}),
                 encode_batch("run-1", "a1", [(0, T, "job_end", body)]).data):
        events, dead = parse_message(data)
        assert not dead
        assert events[0].body == body


def test_model_metrics_may_be_non_finite():
    """A diverged loss is an observation, not corrupt input."""
    events, dead = parse_message(batch(
        {"seq": 0, "time_us": T, "model_metrics": {"step": 3, "loss": "NaN", "mfu": 0.4}}))
    assert not dead
    assert events[0].body["mfu"] == 0.4
    assert events[0].body["loss"] != events[0].body["loss"]  # NaN


def test_configs_and_metrics_become_events():
    """Config values of any text up to MAX_CONFIG_VALUE_LENGTH and metric values of any double
    (non-finite ones too) are read as given; a metric's step is there only when set."""
    value = "é\n" * 500
    events, dead = parse_message(batch(
        {"seq": 0, "time_us": T, "configs": {"source": "user",
                                             "values": {"model.layers": "4", "note": value}}},
        {"seq": 1, "time_us": T, "metrics": {"step": 7, "values": {"LOSS": "Infinity", "mine": -2}}},
        {"seq": 2, "time_us": T, "metrics": {"values": {"LATENCY": 0.5}}}))
    assert not dead
    assert events[0].body == {"source": "user", "values": {"model.layers": "4", "note": value}}
    assert events[1].body == {"step": 7, "values": {"LOSS": math.inf, "mine": -2.0}}
    assert events[2].body == {"values": {"LATENCY": 0.5}}


def test_a_workloads_message_belongs_to_the_run_of_its_name_and_uid():
    """A message naming its workload is of the run ``workload_run_id(run_id, uid)``: its events, its
    dead letters and its batch, read in columns or in general; the name it gave stays with the batch."""
    records = [(0, T, "job_start", {"workload": {"cluster": "c1", "jobset_name": "js"}}),
               (1, T + 1, "step_start", {"step": 0}), (2, T + 2, "step_start", {"step": -1})]
    data = encode_batch("run-1", "a1", records, workload_uid="3f2a9c1e-5b1d-4a7e").data
    columnar, general = parse_batch(data, now_us=T), parse_batch(data.decode(), now_us=T)
    assert repr(columnar) == repr(general)
    batch, dead = general
    run_id = workload_run_id("run-1", "3f2a9c1e-5b1d-4a7e")
    assert batch is not None and (batch.run_id, batch.run_name, batch.workload_uid) == (
        run_id, "run-1", "3f2a9c1e-5b1d-4a7e")
    assert {e.run_id for e in batch.events()} == {run_id}
    assert batch.others[0].body["workload"] == {"cluster": "c1", "jobset_name": "js"}
    assert [d.run_id for d in dead] == [run_id]
    plain, _ = parse_batch(encode_batch("run-1", "a1", records[:2]).data, now_us=T)
    assert plain is not None and (plain.run_id, plain.run_name, plain.workload_uid) == ("run-1", "", "")


def test_events_encoded_again_under_their_name_and_uid_come_back_to_their_run():
    """``encode_events`` with the name and uid a batch was read with gives a message of the same run."""
    data = encode_batch("run-1", "a1", [(0, T, "metrics", {"values": {"LOSS": "NaN"}})], "uid-1").data
    batch, _ = parse_batch(data, now_us=T)
    assert batch is not None
    again, _ = parse_batch(events_module.encode_events(batch.events(), batch.run_name, batch.workload_uid),
                           now_us=T)
    assert again is not None and repr(again) == repr(batch)


#: The run id derived for a workload's run, given by a job of no workload as its own run id.
TAKEN = workload_run_id("run-1", "3f2a9c1e-5b1d-4a7e")


def test_a_run_id_given_as_a_workloads_derived_id_is_read_as_a_run_of_its_own():
    """A message of no workload whose run id is a workload's derived run id is of another run,
    read in columns or in general, its dead letters too; the id it gave stays with the batch."""
    records = [(0, T, "step_start", {"step": 0}), (1, T + 1, "step_start", {"step": -1})]
    data = encode_batch(TAKEN, "a1", records).data
    columnar, general = parse_batch(data, now_us=T), parse_batch(data.decode(), now_us=T)
    assert repr(columnar) == repr(general)
    batch, dead = general
    assert batch is not None and batch.run_id != TAKEN and (batch.run_name, batch.workload_uid) == (TAKEN, "")
    assert {e.run_id for e in batch.events()} == {d.run_id for d in dead} == {batch.run_id}


def test_events_encoded_again_under_a_run_id_given_as_a_derived_id_come_back_to_their_run():
    """``encode_events`` with the name a batch of no workload was read with gives a message of
    the same run."""
    batch, _ = parse_batch(encode_batch(TAKEN, "a1", [(0, T, "step_start", {"step": 0})]).data, now_us=T)
    assert batch is not None
    again, _ = parse_batch(events_module.encode_events(batch.events(), batch.run_name, batch.workload_uid),
                           now_us=T)
    assert again is not None and repr(again) == repr(batch)


def test_a_rejected_message_of_a_run_id_given_as_a_derived_id_names_its_own_run():
    """The dead letter of a message whose run id is a workload's derived id, and whose uid is
    invalid, names the run that run id is of without a workload, not the workload's run."""
    step = {"seq": 0, "time_us": T, "step_start": {"step": 0}}
    valid, _ = parse_batch(batch(step, run_id=TAKEN), now_us=T)
    _, dead = parse_batch(batch(step, run_id=TAKEN, workload_uid="u" * 129), now_us=T)
    assert valid is not None and valid.run_id != TAKEN and [d.run_id for d in dead] == [valid.run_id]


@pytest.mark.parametrize(("header", "reason", "run_id"), [
    ({"workload_uid": "u" * 129}, "workload_uid must be at most 128 printable characters", "run-1"),
    ({"workload_uid": "a\tb"}, "workload_uid must be at most 128 printable characters", "run-1"),
    ({"workload_uid": 7}, "does not match the schema", "run-1"),
    ({"workloadUid": "3f2a9c1e"}, 'the header names "workloadUid"', "run-1"),
    ({"workload_uid": "3f2a9c1e-77", "schema_version": 9}, "unsupported schema_version",
     workload_run_id("run-1", "3f2a9c1e-77")),
])
def test_a_message_with_a_bad_workload_uid_is_one_dead_letter(header, reason, run_id):
    """A workload uid that is not valid (or not read) would make a run of the wrong workload: the
    whole message is a dead letter, naming the run as far as it can be known."""
    batch_, dead = parse_batch(batch({"seq": 0, "time_us": T, "step_start": {"step": 0}}, **header), now_us=T)
    assert batch_ is None and len(dead) == 1
    assert reason in dead[0].reason and dead[0].run_id == run_id


_scalars = st.one_of(st.integers(-(2**64), 2**64), st.floats(allow_nan=True), st.booleans(),
                     st.text(max_size=5), st.sampled_from(["NaN", "Infinity", "-Infinity", "12"]),
                     st.none(), st.dictionaries(st.text(max_size=3), st.text(max_size=3), max_size=2))
_field_names = st.sampled_from(sorted({f.name for kind in EVENT_KINDS for f in
                                       EventBatch.Event.DESCRIPTOR.fields_by_name[kind].message_type.fields}
                                      | {"stepCount", "bogus"}))


@settings(max_examples=400, deadline=None)
@example(kind="step_start", seq=1, time_us=5, body={"step": 3})
@example(kind="checkpoint_save", seq=1, time_us=5, body={"blocking_s": 2, "persistent": True})
@example(kind="job_start", seq=0, time_us=5, body={"labels": {"a": "b"}, "chip_count": 8})
@example(kind="model_metrics", seq=2, time_us=5, body={"loss": "NaN", "mfu": 0.5})
@given(kind=st.sampled_from([*EVENT_KINDS, "warp_drive"]), seq=_scalars, time_us=_scalars,
       body=st.dictionaries(_field_names, _scalars, max_size=4))
def test_fast_path_agrees_with_the_protobuf_parser(kind, seq, time_us, body):
    """Wherever the fast path accepts an event, the protobuf JSON parser reads the same values."""
    raw = {"seq": seq, "time_us": time_us, kind: body}
    fast = _fast_event(raw)
    if fast is None:
        return
    parsed = EventBatch.Event()
    json_format.ParseDict(raw, parsed)  # must not raise where the fast path accepted
    assert (parsed.seq, parsed.time_us, parsed.WhichOneof("kind")) == fast[:3]
    slow_body = _plain(getattr(parsed, kind))
    assert slow_body.keys() == fast[3].keys()
    for name, value in slow_body.items():
        assert value == fast[3][name] or (value != value and fast[3][name] != fast[3][name])


_numbers = st.one_of(st.integers(0, 10**18 + 10),
                     st.sampled_from([MIN_TIME_US - 1, MIN_TIME_US, MAX_TIME_US - 1, MAX_TIME_US, 10**18 - 1,
                                      2**63 - 1]))


@settings(max_examples=300, deadline=None)
@example(run_id="run", attempt_id="a", triples=[(0, MIN_TIME_US, 0)], spacing="")
@example(run_id="run", attempt_id="a", triples=[(0, MIN_TIME_US, 0)], spacing=" ")
@example(run_id='r"\\n', attempt_id="ü", triples=[(1, MAX_TIME_US - 1, 10**18 - 1)], spacing="")
@given(run_id=st.text(min_size=0, max_size=600), attempt_id=st.text(min_size=1, max_size=4),
       triples=st.lists(st.tuples(_numbers, _numbers, _numbers), min_size=1, max_size=5),
       spacing=st.sampled_from(["", " "]))
def test_step_messages_in_columns_agree_with_the_general_path(run_id, attempt_id, triples, spacing):
    """A message of step starts reads the same as bytes (the columnar path) and as text (the general one)."""
    events = ",".join(f'{{"seq":{seq},"time_us":{t},"step_start":{{"step":{step}}}}}'
                      for seq, t, step in triples)
    header = json.dumps({"schema_version": 1, "run_id": run_id, "attempt_id": attempt_id},
                        separators=(",", ":" + spacing), ensure_ascii=False)
    message = f'{header[:-1]},"events":[{events}]}}'
    now = _now_us()  # one clock for both: a reason may say how far ahead of it a time is
    columnar, general = parse_batch(message.encode(), now_us=now), parse_batch(message, now_us=now)
    assert columnar[0] == general[0]
    assert [(d.reason, d.run_id) for d in columnar[1]] == [(d.reason, d.run_id) for d in general[1]]


_times = st.one_of(st.integers(MIN_TIME_US, MAX_TIME_US - 1), _numbers)
_values = st.one_of(st.integers(0, 10**6), st.floats(0, 1e6), st.text(max_size=3), _scalars,
                    st.dictionaries(st.text(max_size=3), st.dictionaries(st.text(max_size=2), st.integers(),
                                                                         max_size=2), max_size=2))


def _events_of(kind: str) -> st.SearchStrategy[dict[str, Any]]:
    descriptor = EventBatch.Event.DESCRIPTOR.fields_by_name.get(kind)
    names = sorted(f.name for f in descriptor.message_type.fields) if descriptor else []
    return st.builds(lambda seq, time_us, body: {"seq": seq, "time_us": time_us, kind: body},
                     st.integers(0, 10**6), _times,
                     st.dictionaries(st.sampled_from([*names, "bogus"]), _values, max_size=3))


_other_events = st.sampled_from([*EVENT_KINDS, "warp_drive"]).flatmap(_events_of)
_step_events = st.builds(lambda seq, t, step: {"seq": seq, "time_us": t, "step_start": {"step": step}},
                         _numbers, _times, _numbers)


@settings(max_examples=400, deadline=None)
@example(events=[{"seq": 0, "time_us": T, "job_start": {"labels": {"a": "b"}}},
                 {"seq": 1, "time_us": T, "step_start": {"step": 0}}], ascii=True, uid="")
@example(events=[{"seq": 1, "time_us": T, "step_start": {"step": 0}},
                 {"seq": 2, "time_us": T, "custom_badput_start": {"badput_type": "a}],{\"seq\":"}}],
         ascii=False, uid="")
@example(events=[{"seq": 1, "time_us": T, "step_start": {"step": "7"}}], ascii=True, uid="")
@example(events=[{"seq": 0, "time_us": T, "job_start": {"labels": {f"k{i}": "v" for i in range(65)}}},
                 {"seq": 1, "time_us": T, "step_start": {"step": 0}}], ascii=True, uid="")  # over MAX_LABELS
@example(events=[{"seq": 0, "time_us": T, "step_start": {"step": 0}},
                 {"seq": 1, "time_us": T, "custom_badput_start": {"badput_type": "\x1b[31m"}}], ascii=False,
         uid="")
@example(events=[{"seq": 0, "time_us": T, "step_start": {"step": 0}},
                 {"seq": 1, "time_us": T, "model_metrics": {"step": 0, "loss": "NaN"}}], ascii=True, uid="")
@example(events=[{"seq": 0, "time_us": T, "model_metrics": {"loss": "NAN"}}], ascii=False, uid="")
@example(events=[{"seq": 0, "time_us": T, "metrics": {"values": {"LOSS": "-Infinity", "mine": 2}}},
                 {"seq": 1, "time_us": T, "configs": {"source": "user", "values": {"a.b": "1"}}}], ascii=True,
         uid="3f2a9c1e-77")
@given(events=st.lists(st.one_of(_step_events, _other_events), min_size=1, max_size=6), ascii=st.booleans(),
       uid=st.sampled_from(["", "3f2a9c1e-77", "ü-uid"]))
def test_mixed_messages_read_in_columns_agree_with_the_general_path(events, ascii, uid):
    """A message of step starts and other events reads the same as bytes (in columns where it
    can) and as text (the general path), dead letters included, with a workload uid or without."""
    header = dict(schema_version=1, run_id="run", attempt_id="a", **({"workload_uid": uid} if uid else {}))
    message = json.dumps({**header, "events": events}, separators=(",", ":"), ensure_ascii=ascii)
    with _in_columns_however_many_others():
        now = _now_us()  # one clock for both: a reason may say how far ahead of it a time is
        columnar, general = parse_batch(message.encode(), now_us=now), parse_batch(message, now_us=now)
    # By repr, which is exact for floats and equal for two NaNs (a diverged run's loss).
    assert repr(columnar[0]) == repr(general[0])
    assert [(d.reason, d.run_id) for d in columnar[1]] == [(d.reason, d.run_id) for d in general[1]]


def _now_us() -> int:
    """The wall clock, read once for calls whose results are compared."""
    return round(time.time() * 1_000_000)


def _in_columns_however_many_others() -> Any:
    """Lets a message of any share of other events take the columnar path (tests of it use few events)."""
    return mock.patch.object(events_module, "_MAX_OTHER_SHARE", 1.0)


def _metrics_message(steps: int, metrics_every: int) -> bytes:
    records: list[tuple[int, int, str, dict[str, object]]] = [
        (0, T, "job_start", {"chip_count": 8, "labels": {"team": "a"}})]
    for step in range(steps):
        records.append((len(records), T + step * 1_500_000, "step_start", {"step": step}))
        if step % metrics_every == 0:
            records.append((len(records), T + step * 1_500_000 + 1, "model_metrics",
                            {"step": step, "loss": 1.5, "mfu": 0.4}))
    records.append((len(records), T + 900_000_000, "checkpoint_save", {"step": steps - 1, "blocking_s": 2.5}))
    return encode_batch("run-1", "a1", records).data


def test_the_emitters_mixed_messages_take_the_columnar_path():
    """Steps with metrics every 20 steps, a checkpoint and a labelled job start read in columns equal the
    general path; with metrics every step, the general path reads them."""
    data = _metrics_message(200, 20)
    columns = _columnar(data)
    assert columns is not None and list(columns.steps) == list(range(200)) and len(columns.others) == 12
    assert columns == parse_batch(data.decode())[0]
    dense = _metrics_message(200, 1)
    assert _columnar(dense) is None
    with _in_columns_however_many_others():
        assert _columnar(dense) == parse_batch(dense.decode())[0]


def test_the_emitters_step_messages_take_the_columnar_path():
    """What the emitter sends for a stretch of steps is read in columns, and equals the general path."""
    records = [(seq, T + seq * 1_500_000, "step_start", {"step": 100 + seq}) for seq in range(1000)]
    data = encode_batch("run-1", "a1", records).data
    columns = _columnar(data)
    assert columns is not None and list(columns.steps) == list(range(100, 1100))
    assert columns == parse_batch(data.decode())[0]


_texts = st.text(max_size=300) | st.sampled_from(["\ud800", "a\x00b", "a\tb", "x" * 257, "é" * 256, "\u202e"])


@settings(max_examples=200, deadline=None)
@example(kind="job_start", text="\ud800", as_label=True, ascii=True)
@example(kind="custom_badput_start", text="EVAL\n", as_label=False, ascii=False)
@given(kind=st.sampled_from(["job_start", "custom_badput_start", "elastic_wait_start"]), text=_texts,
       as_label=st.booleans(), ascii=st.booleans())
def test_strings_in_event_bodies_read_alike_in_columns_and_in_general(kind, text, as_label, ascii):
    """Names, label keys and label values of any length and characters are judged the same as bytes
    (in columns) and as text (the general path)."""
    name = {"job_start": "run_group", "custom_badput_start": "badput_type"}.get(kind, "event_type")
    body = ({"labels": {"key": text, text: "value"}} if as_label and kind == "job_start" else {name: text})
    events = [{"seq": 0, "time_us": T, "step_start": {"step": 0}}, {"seq": 1, "time_us": T, kind: body}]
    message = json.dumps({"schema_version": 1, "run_id": "run", "attempt_id": "a", "events": events},
                         separators=(",", ":"), ensure_ascii=ascii)
    try:
        data = message.encode()
    except UnicodeEncodeError:
        return  # a lone surrogate written raw: the bytes are not UTF-8, so there is no text form
    with _in_columns_however_many_others():
        now = _now_us()
        assert parse_batch(data, now_us=now) == parse_batch(message, now_us=now)


@settings(max_examples=300, deadline=None)
@given(kind=st.sampled_from(["model_metrics", "checkpoint_save", "elastic_slice_counts"]),
       body=st.dictionaries(st.sampled_from(["step", "loss", "mfu", "blocking_s", "active_slices"]),
                            st.one_of(st.integers(0, 2**53 - 1),
                                      st.floats(),
                                      st.sampled_from(["NaN", "Infinity", "-Infinity"]), st.booleans()),
                            min_size=1))
@example(kind="model_metrics", body={"step": 3, "loss": 1e-05, "mfu": -0.0, "blocking_s": 1e+22})
@example(kind="model_metrics", body={"step": 3, "loss": math.nan})
def test_bodies_of_numbers_read_back_exactly_and_non_finite_floats_are_refused(kind, body):
    """The wire format reads back as the bodies it was given, every float to the bit (its text
    is orjson's, not the standard library's), and refuses what the standard library's strict
    encoder refuses: a non-finite float, which orjson alone would write as null."""
    event = {"seq": 0, "time_us": T, kind: body}
    try:
        expected = json.dumps(event, allow_nan=False)  # floats by repr: to the bit, -0.0 included
    except ValueError:
        with pytest.raises(ValueError):
            encode_batch("run-1", "a1", [(0, T, kind, body)])
        return
    data = encode_batch("run-1", "a1", [(0, T, kind, body)]).data
    assert json.dumps(json.loads(data)["events"]) == f"[{expected}]"


def test_null_in_a_string_is_no_refusal():
    """"null" in the encoded text sends a batch to the strict encoder, which writes the same
    values: letters in a string are not a non-finite float."""
    body = {"run_group": "null", "labels": {"null": "x:null"}}
    data = encode_batch("run-1", "a1", [(0, T, "job_start", body)]).data
    assert json.loads(data)["events"] == [{"seq": 0, "time_us": T, "job_start": body}]
