"""The per-step calls' fast path and the lane they record into: the compiled implementation and
the Python one behave alike (``emitter.lane``)."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import math
import os
import time
from collections.abc import Callable
from typing import Any

import numpy
import orjson
import pytest

from emitter import lane as lanes
from goodput_schemas import wire
from goodput_schemas.limits import MAX_COUNT
from support.runs import at

COMPILED = importlib.import_module("emitter._lane") if importlib.util.find_spec("emitter._lane") else None


@pytest.fixture(params=["python", "compiled"])
def impl(request: pytest.FixtureRequest) -> tuple[Any, Any]:
    """(Lane, FastPath) of one implementation."""
    if request.param == "python":
        return lanes.PythonLane, lanes.PythonFastPath
    if COMPILED is None:
        pytest.fail("emitter._lane is not built: make install builds it (gcc and Python's headers)")
    return COMPILED.Lane, COMPILED.FastPath


def test_the_compiled_fast_path_is_the_one_in_use_unless_python_is_asked_for():
    """make install builds the compiled lane and the emitter uses it; $GOODPUT_EMITTER_PURE_PYTHON=1
    selects the Python one (the test suite's second pass)."""
    if os.environ.get(lanes.PURE_PYTHON_ENV) == "1":
        assert not lanes.COMPILED and lanes.FastPath is lanes.PythonFastPath
        assert lanes.encode_events is wire.encode_events
    else:
        assert COMPILED is not None and lanes.COMPILED and lanes.FastPath is COMPILED.FastPath
        assert lanes.encode_events is lanes._compiled_encode_events


def test_a_lane_numbers_events_in_order_and_gives_them_up_once(impl):
    """Events put in a lane come out of take in order, numbered from 0; a second take is empty."""
    lane_type, _ = impl
    lane = lane_type(8, MAX_COUNT)
    lane.room = 8
    body = {"step": 3}
    assert lane.put(10, "a", body) and lane.put(11, "b", None)
    assert (len(lane), lane.next_seq) == (2, 2)
    taken = lane.take()
    assert taken == [(0, 10, "a", body), (1, 11, "b", None)] and taken[0][3] is body
    assert (lane.take(), len(lane), lane.next_seq) == ([], 0, 2)


def test_a_lane_takes_no_event_past_its_room(impl):
    """put refuses an event once the lane holds room events, drawing no number; room is kept
    within 0..capacity."""
    lane_type, _ = impl
    lane = lane_type(4, MAX_COUNT)
    assert lane.room == 0 and not lane.put(1, "a", {})
    lane.room = 100
    assert lane.room == 4
    assert [lane.put(t, "a", {}) for t in range(6)] == [True] * 4 + [False] * 2
    assert lane.next_seq == 4
    lane.room = -3
    assert lane.room == 0


def test_a_number_drawn_for_an_event_queued_elsewhere_is_counted(impl):
    """draw_into appends the next number to a list, which put does not give again and next_seq
    counts."""
    lane_type, _ = impl
    lane = lane_type(4, MAX_COUNT)
    lane.room = 4
    lane.put(1, "a", {})
    slot: list[Any] = [7, "kind", {}]
    lane.draw_into(slot)
    assert slot == [7, "kind", {}, 1]
    lane.put(2, "b", {})
    assert [record[0] for record in lane.take()] == [0, 2]
    assert lane.next_seq == 3


def test_a_lane_wakes_the_worker_once_when_it_holds_a_batch(impl):
    """wake is called by the put, or the plain call, that brings the lane to wake_at events, and
    by no other; a wake that fails (the thread was woken already) is not the caller's concern."""
    lane_type, fast_path = impl
    wakes: list[int] = []

    def wake() -> None:
        wakes.append(len(lane))
        raise RuntimeError("release unlocked lock")

    lane = lane_type(8, MAX_COUNT, wake)
    lane.room, lane.wake_at = 8, 3
    recorder = _recorder(fast_path, lane)
    assert lane.put(1, "a", {}) and lane.put(2, "b", {})
    assert wakes == []
    recorder.record_step_start_time(5)
    assert wakes == [3]
    recorder.record_model_metrics(5, loss=0.5)
    lane.put(3, "c", {})
    assert wakes == [3] and len(lane) == 5


class _Calls:
    """A FastPath's slow path, recording the arguments of each call."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def method(self, name: str, signature_of: Callable[..., Any]) -> Callable[..., None]:
        signature = inspect.signature(signature_of)

        def slow(*args: Any, **kwargs: Any) -> None:
            try:
                bound = signature.bind(None, *args, **kwargs)
            except TypeError:  # the recorder's guarded method counts it: here, as given
                self.calls.append((name, {"args": args, "kwargs": kwargs}))
                return
            bound.apply_defaults()
            self.calls.append((name, dict(list(bound.arguments.items())[1:])))

        return slow


def _recorder(fast_path: type, lane: Any) -> Any:
    """A FastPath whose slow path only records its calls (``.slow.calls``)."""

    class Recorder(fast_path):  # type: ignore[misc, valid-type]
        pass

    recorder = Recorder()
    recorder.slow = _Calls()
    for name in ("_slow_step_start", "_slow_data_loading_start", "_slow_data_loading_end",
                 "_slow_model_metrics"):
        setattr(recorder, name, recorder.slow.method(name, getattr(lanes.PythonFastPath, name)))
    recorder._lane = lane
    return recorder


def test_plain_calls_record_into_the_lane_at_the_real_clock(impl):
    """A plain call (an int step, float or missing metrics, no time; by position or by name)
    records a compact event stamped with time.time_ns() // 1000, and nothing else."""
    lane_type, fast_path = impl
    lane = lane_type(16, MAX_COUNT)
    lane.room = 16
    recorder = _recorder(fast_path, lane)
    before = time.time_ns() // 1000
    recorder.record_data_loading_start_time()
    recorder.record_data_loading_end_time(end_time=None)
    recorder.record_step_start_time(7)
    recorder.record_step_start_time(step=MAX_COUNT, start_time=None)
    recorder.record_model_metrics(7, loss=0.25, step_time_s=math.inf, mfu=None, time_=None)
    recorder.record_model_metrics(step=0, tflops_per_device=math.nan)
    after = time.time_ns() // 1000
    records = lane.take()
    assert recorder.slow.calls == []
    assert [record[0] for record in records] == list(range(6))
    assert all(before <= record[1] <= after for record in records)
    assert [record[1] for record in records] == sorted(record[1] for record in records)
    assert [record[2:] for record in records[:5]] == [
        ("data_loading_start", {}), ("data_loading_end", {}), ("step_start", 7), ("step_start", MAX_COUNT),
        ("model_metrics", (7, 0.25, math.inf, None, None, None, None))]
    step, *metrics = records[5][3]
    assert (records[5][2], step, metrics[:5]) == ("model_metrics", 0, [None] * 5) and math.isnan(metrics[5])


CALLS = [
    pytest.param(lambda r: r.record_step_start_time(True), "_slow_step_start",
                 {"step": True, "start_time": None}, id="bool step"),
    pytest.param(lambda r: r.record_step_start_time(numpy.int64(3)), "_slow_step_start",
                 {"step": numpy.int64(3), "start_time": None}, id="numpy step"),
    pytest.param(lambda r: r.record_step_start_time(3.0), "_slow_step_start",
                 {"step": 3.0, "start_time": None}, id="float step"),
    pytest.param(lambda r: r.record_step_start_time(-1), "_slow_step_start",
                 {"step": -1, "start_time": None}, id="negative step"),
    pytest.param(lambda r: r.record_step_start_time(MAX_COUNT + 1), "_slow_step_start",
                 {"step": MAX_COUNT + 1, "start_time": None}, id="step past MAX_COUNT"),
    pytest.param(lambda r: r.record_step_start_time(2**70), "_slow_step_start",
                 {"step": 2**70, "start_time": None}, id="step past int64"),
    pytest.param(lambda r: r.record_step_start_time(3, at(1)), "_slow_step_start",
                 {"step": 3, "start_time": at(1)}, id="explicit time"),
    pytest.param(lambda r: r.record_data_loading_start_time(at(1)), "_slow_data_loading_start",
                 {"start_time": at(1)}, id="data loading start at a time"),
    pytest.param(lambda r: r.record_data_loading_end_time(end_time="soon"), "_slow_data_loading_end",
                 {"end_time": "soon"}, id="data loading end at a bad time"),
    pytest.param(lambda r: r.record_model_metrics(3, loss=1), "_slow_model_metrics",
                 {"step": 3, "loss": 1}, id="int loss"),
    pytest.param(lambda r: r.record_model_metrics(3, mfu=numpy.float32(0.5)), "_slow_model_metrics",
                 {"step": 3, "mfu": numpy.float32(0.5)}, id="numpy metric"),
    pytest.param(lambda r: r.record_model_metrics(3, loss=0.5, time_=at(2)), "_slow_model_metrics",
                 {"step": 3, "loss": 0.5, "time_": at(2)}, id="explicit time_"),
    pytest.param(lambda r: r.record_model_metrics("3", loss=0.5), "_slow_model_metrics",
                 {"step": "3", "loss": 0.5}, id="str step"),
]


@pytest.mark.parametrize(("call", "slow", "arguments"), CALLS)
def test_every_other_call_goes_to_the_slow_path_with_its_arguments(impl, call, slow, arguments):
    """A call the fast path does not take reaches the slow method of the same signature with
    the same arguments, and queues nothing."""
    lane_type, fast_path = impl
    lane = lane_type(4, MAX_COUNT)
    lane.room = 4
    recorder = _recorder(fast_path, lane)
    call(recorder)
    [(name, given)] = recorder.slow.calls
    signature = inspect.signature(getattr(lanes.PythonFastPath, slow))
    defaults = {key: p.default for key, p in signature.parameters.items() if key != "self"}
    assert name == slow
    assert given == {**defaults, **arguments}
    assert len(lane) == 0 and lane.next_seq == 0


def test_without_a_lane_or_room_every_call_goes_to_the_slow_path(impl):
    """With no lane (recording off, closed, an injected clock) or a full one, plain calls go to
    the slow path too."""
    lane_type, fast_path = impl
    full = lane_type(1, MAX_COUNT)
    full.room = 1
    assert full.put(0, "a", {})
    for lane in (None, full):
        recorder = _recorder(fast_path, lane)
        recorder.record_step_start_time(1)
        recorder.record_data_loading_start_time()
        recorder.record_data_loading_end_time()
        recorder.record_model_metrics(1, loss=0.5)
        assert [name for name, _ in recorder.slow.calls] == [
            "_slow_step_start", "_slow_data_loading_start", "_slow_data_loading_end", "_slow_model_metrics"]
    assert len(full) == 1


@pytest.mark.parametrize(("call", "slow", "args", "kwargs"), [
    pytest.param(lambda r: r.record_model_metrics(1, lossy=0.5), "_slow_model_metrics", (1,),
                 {"lossy": 0.5}, id="unknown keyword"),
    pytest.param(lambda r: r.record_model_metrics(loss=0.5), "_slow_model_metrics", (), {"loss": 0.5},
                 id="no step"),
    pytest.param(lambda r: r.record_model_metrics(1, 0.5), "_slow_model_metrics", (1, 0.5), {},
                 id="a metric by position"),
    pytest.param(lambda r: r.record_step_start_time(1, None, None), "_slow_step_start", (1, None, None),
                 {}, id="too many arguments"),
    pytest.param(lambda r: r.record_step_start_time(1, step=2), "_slow_step_start", (1,), {"step": 2},
                 id="the step twice"),
    pytest.param(lambda r: r.record_step_start_time(), "_slow_step_start", (), {}, id="no step at all"),
    pytest.param(lambda r: r.record_data_loading_end_time(start_time=None), "_slow_data_loading_end", (),
                 {"start_time": None}, id="the other span end"),
])
def test_a_call_that_does_not_fit_the_signature_goes_to_the_slow_path_as_given(impl, call, slow, args,
                                                                               kwargs):
    """A call its method's signature does not take raises nothing into the loop: it reaches the
    slow method of the same signature as it was made (the recorder's counts and logs the
    TypeError), and records nothing."""
    lane_type, fast_path = impl
    lane = lane_type(4, MAX_COUNT)
    lane.room = 4
    recorder = _recorder(fast_path, lane)
    call(recorder)
    assert recorder.slow.calls == [(slow, {"args": args, "kwargs": kwargs})]
    assert len(lane) == 0


# -- the compiled encoder ------------------------------------------------------------------------


def _compiled() -> Any:
    if COMPILED is None:
        pytest.fail("emitter._lane is not built: make install builds it (gcc and Python's headers)")
    return COMPILED


def _per_step_records(seed: int, count: int) -> list[wire.Record]:
    """What a training loop's calls queue: step starts, model metrics (any of them None, and
    floats of every kind), data-loading spans and other events' dict bodies."""
    rng = numpy.random.default_rng(seed)
    floats = [0.0, -0.0, 1e-05, 2.5e-07, 1e16, 5e-324, 1.7976931348623157e308, -3.25, math.nan, math.inf,
              -math.inf, 0.1]
    records: list[wire.Record] = []
    for seq in range(count):
        time_us = int(rng.integers(-2**62, 2**62))
        kind = str(rng.choice(["step_start", "model_metrics", "data_loading_start", "checkpoint_save"]))
        step = int(rng.choice([0, 1, MAX_COUNT, 2**63 - 1, int(rng.integers(0, 2**40))]))
        if kind == "step_start":
            body: Any = step
        elif kind == "model_metrics":
            body = (step, *(None if rng.random() < 0.3 else float(rng.choice(floats)) if rng.random() < 0.5
                            else float(rng.normal() * 10.0 ** int(rng.integers(-12, 12)))
                            for _ in wire.MODEL_METRICS))
        elif kind == "data_loading_start":
            body = {}
        else:
            body = {"step": step, "path": f"gs://bucket/ckpt-{step} é \"x\"", "bytes": float(rng.random())}
        records.append((seq, time_us, kind, body))
    return records


@pytest.mark.parametrize("seed", range(20))
def test_the_compiled_encoder_writes_a_batch_as_the_python_one_does(seed):
    """The per-step calls' records, and other dict bodies among them, come out byte for byte as
    goodput_schemas.wire writes them; so does a batch with no finite float, and an empty one."""
    records = _per_step_records(seed, 1 + seed * 50)
    assert lanes.encode_events(records) == wire.encode_events(records)
    assert _compiled().encode_events(records, wire.encode_body, orjson.dumps) == wire.encode_events(records)
    no_floats = [(1, 2, "model_metrics", (3, math.nan, None, math.inf, None, None, None)),
                 (2, 3, "step_start", 4)]
    expected = wire.encode_events(no_floats)
    assert _compiled().encode_events(no_floats, wire.encode_body, orjson.dumps) == expected
    assert _compiled().encode_events([], wire.encode_body, orjson.dumps) == b"[]"


def _outcome(encode: Callable[[list[wire.Record]], bytes], records: list[Any]) -> Any:
    try:
        return encode(records)
    except Exception as error:  # noqa: BLE001 - the error's type is the outcome compared
        return type(error)


@pytest.mark.parametrize("odd", [
    pytest.param((5, 6, "step_start", True), id="a bool step"),
    pytest.param((5, 6, "step_start", 2.0), id="a float step"),
    pytest.param((5, 6, "step_start", 2**63), id="a step past 64 bits"),
    pytest.param((5, 6, "step_start", None), id="no step"),
    pytest.param((5, 2**64, "step_start", 1), id="a time past 64 bits"),
    pytest.param((True, 6, "step_start", 1), id="a bool seq"),
    pytest.param((5, 6.0, "step_start", 1), id="a float time"),
    pytest.param((5, 6, "step start", 1), id="a kind to escape"),
    pytest.param((5, 6, "étape", 1), id="a kind not ascii"),
    pytest.param((5, 6, "other", 1), id="a compact body of another kind"),
    pytest.param((5, 6, "model_metrics", (1, 0.5)), id="metrics too few"),
    pytest.param((5, 6, "model_metrics", (1, 1, None, None, None, None, None)), id="an int metric"),
    pytest.param((5, 6, "model_metrics", (1, numpy.float64(0.5), None, None, None, None, None)),
                 id="a float subclass"),
    pytest.param((5, 6, "model_metrics", [1, 0.5, None, None, None, None, None]), id="metrics in a list"),
    pytest.param([5, 6, "step_start", 1], id="a record in a list"),
    pytest.param((5, 6, "step_start", 1, 0), id="a record of five"),
])
def test_a_batch_the_compiled_encoder_does_not_write_is_written_as_python_writes_it(odd):
    """A batch holding any record other than those the per-step calls queue and dict bodies is
    left to the Python encoder (None), whose bytes, or error, the worker's encoder gives."""
    records = [(1, 2, "model_metrics", (1, 0.25, None, None, None, None, None)), odd, (7, 8, "step_start", 9)]
    assert _compiled().encode_events(records, wire.encode_body, orjson.dumps) is None
    assert _outcome(lanes.encode_events, records) == _outcome(wire.encode_events, records)


@pytest.mark.parametrize(("body", "outcome"), [
    pytest.param({"step": math.nan}, ValueError, id="a non-finite float"),
    pytest.param({"step": object()}, TypeError, id="a value JSON has none for"),
    pytest.param({"note": "nullable", "x": 1e-05}, b'{"note":"nullable","x":1e-05}', id="null in a string"),
])
def test_a_dict_body_is_written_or_refused_as_python_does(body, outcome):
    """A dict body goes through wire.encode_body: the error the Python encoder raises for the
    batch, or the body it writes (the standard library's where it holds "null")."""
    records = [(1, 2, "model_metrics", (1, 0.25, None, None, None, None, None)),
               (5, 6, "checkpoint_save", body)]
    written = _outcome(lanes.encode_events, records)
    assert written == _outcome(wire.encode_events, records)
    assert written == outcome if isinstance(outcome, type) else outcome in written


def test_the_compiled_encoder_reads_the_list_as_it_was_given():
    """encode_body is Python code: a batch it empties while it runs is written whole all the same."""
    records: list[wire.Record] = [(1, 2, "step_start", 3), (2, 3, "checkpoint_save", {"step": 3}),
                                  (3, 4, "model_metrics", (3, 0.5, None, None, None, None, None))]
    expected = wire.encode_events(records)

    def emptying(body: dict[str, Any]) -> bytes:
        records.clear()
        return wire.encode_body(body)

    assert _compiled().encode_events(records, emptying, orjson.dumps) == expected


def test_the_compiled_encoder_refuses_helpers_that_do_not_return_bytes():
    """An encode_body or dumps that returns something else than bytes is a TypeError."""
    metrics: list[wire.Record] = [(1, 2, "model_metrics", (3, 0.5, None, None, None, None, None))]
    with pytest.raises(TypeError, match="dumps"):
        _compiled().encode_events(metrics, wire.encode_body, lambda floats: "[0.5]")
    with pytest.raises(TypeError, match="encode_body"):
        _compiled().encode_events([(1, 2, "x", {"a": 1})], lambda body: "{}", orjson.dumps)
    with pytest.raises(RuntimeError, match="fewer floats"):
        _compiled().encode_events(metrics, wire.encode_body, lambda floats: b"[]")
