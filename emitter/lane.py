"""The fast path of the calls a training loop makes every step, and the front of the worker's queue.

A recorder's per-step calls (``record_step_start_time``, ``record_model_metrics``,
``record_data_loading_start_time`` and ``..._end_time``) run in the training loop, whose step has
left the caches cold by the time they run: every object, page and function a call touches costs a
memory access, so these calls do as little as they can. A plain call (the step an ``int``, the
metrics ``float`` or ``None``, no explicit time) stamps the time and appends the event to its
``Lane``, the front of the worker's queue; every other call goes to the recorder's Python method of
the same signature (``_slow_step_start``, ...), which checks, converts, counts and logs. So does a
call that does not fit the signature: none raises into the training loop.

Two implementations with one behaviour: the compiled one (``emitter/_lane.c``, built where a C
compiler was at hand when the emitter was installed), whose plain calls create no Python object
and run no bytecode, and the Python one below, used where it was not built or where
``$GOODPUT_EMITTER_PURE_PYTHON=1`` asks for it (the emitter's tests run against both).
``COMPILED`` says which one this process uses.

A lane holds events in the order recorded and draws the attempt's sequence numbers; the worker
moves its events to its own queue (``take``) from its thread, and sets how many the callers may
add before they must take the slow path (``room``) and when the lane wakes the thread for a full
batch (``wake_at``): the caller's part of a batch is one wake, its conversion the thread's. The
thread writes a batch's JSON with ``encode_events``, compiled too where the lane is.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import importlib
import itertools
import os
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import orjson

from goodput_schemas.wire import EventsEncoder, Record, encode_body
from goodput_schemas.wire import encode_events as wire_encode_events

#: Asks for the Python implementation even where the compiled one is built ("1").
PURE_PYTHON_ENV = "GOODPUT_EMITTER_PURE_PYTHON"
_Method = TypeVar("_Method", bound=Callable[..., None])


class PythonLane:
    """The front of a worker's queue: events in the order recorded, numbered as they come.

    ``put`` runs in the caller without a lock: the number is drawn and the event appended in one
    step, the deque pulling both from iterators in C, where no signal handler runs (one may run
    between any two bytecodes: a number drawn in one and appended in the next would be lost to a
    handler that ends the process in between). Several threads recording at once may each find
    room, so a lane may hold a few events more than ``room``.
    """

    def __init__(self, capacity: int, max_count: int, wake: Callable[[], object] | None = None) -> None:
        if capacity < 1 or max_count < 0:
            raise ValueError("Lane: capacity must be >= 1 and max_count >= 0")
        self.capacity = capacity
        self.max_count = max_count
        #: ``wake`` is called when a put brings the lane to this many events.
        self.wake_at = sys.maxsize
        self._wake = wake
        self._room = 0
        self._events: collections.deque[Record] = collections.deque()
        self._seqs = itertools.count()
        self._taken = 0  # numbers below this went to events taken or drawn

    @property
    def room(self) -> int:
        """How many events the lane may hold before a call takes the slow path (0 to capacity)."""
        return self._room

    @room.setter
    def room(self, value: int) -> None:
        self._room = max(0, min(value, self.capacity))

    @property
    def next_seq(self) -> int:
        """The next sequence number: how many were drawn. (A signal handler's event may sit just
        before the one it interrupted: the last two are looked at.)"""
        return max([self._taken, *(record[0] + 1 for record in itertools.islice(
            reversed(self._events), 2))])

    def __len__(self) -> int:
        return len(self._events)

    def put(self, time_us: int, kind: str, body: Any) -> bool:
        """Queues the event under the next sequence number if the callers have room; returns
        whether it did."""
        events = self._events
        if len(events) < self._room:
            events.extend(zip(itertools.islice(self._seqs, 1), (time_us,), (kind,), (body,), strict=True))
            if len(events) == self.wake_at and self._wake is not None:
                with contextlib.suppress(RuntimeError):  # the thread woken already
                    self._wake()
            return True
        return False

    def draw_into(self, slot: list[Any]) -> None:
        """Appends the next sequence number to ``slot``, for an event queued elsewhere (the
        worker's slow path): drawn and appended in one step (the list pulls it from the counter in
        C), so that no signal handler runs between the number's drawing and its being seen where
        the worker looks for it."""
        slot.extend(itertools.islice(self._seqs, 1))
        self._taken = max(self._taken, slot[-1] + 1)

    def take(self) -> list[Record]:
        """Empties the lane: its events, in the order queued."""
        taken: list[Record] = []
        self.take_into(taken)
        return taken

    def take_into(self, queue: list[Record] | collections.deque[Record]) -> None:
        """Empties the lane onto the end of ``queue``, in one step (the queue pulls the events from
        the lane in C): a signal handler never finds the lane's events in neither."""
        events = self._events
        queue.extend(itertools.starmap(events.popleft, itertools.repeat((), len(events))))
        if queue:
            last = itertools.islice(reversed(queue), 2)
            self._taken = max(self._taken, *(record[0] + 1 for record in last))


#: The slow path of each per-step call.
_SLOW = {"record_step_start_time": "_slow_step_start",
         "record_data_loading_start_time": "_slow_data_loading_start",
         "record_data_loading_end_time": "_slow_data_loading_end",
         "record_model_metrics": "_slow_model_metrics"}


def _total(method: _Method) -> _Method:
    """``method``, or, for a call that does not fit its signature, the slow path of the same
    signature, which counts and logs the ``TypeError`` instead of raising it into the loop."""
    slow_name = _SLOW[method.__name__]

    @functools.wraps(method)
    def call(self: Any, *args: Any, **kwargs: Any) -> None:
        try:
            method(self, *args, **kwargs)
        except TypeError:  # the slow path raises none: only the call's binding can
            getattr(self, slow_name)(*args, **kwargs)

    return call  # type: ignore[return-value]


class PythonFastPath:
    """The base class of ``GoodputRecorder``: its per-step calls (see the module docstring)."""

    #: The lane the per-step calls record into, or None: every call takes the slow path.
    _lane: PythonLane | None = None

    @_total
    def record_step_start_time(self, step: int, start_time: Any = None) -> None:
        """Records the start of training step ``step``."""
        lane = self._lane
        if not (lane is not None and start_time is None and type(step) is int and 0 <= step <= lane.max_count
                and lane.put(time.time_ns() // 1000, "step_start", step)):
            self._slow_step_start(step, start_time)

    @_total
    def record_data_loading_start_time(self, start_time: Any = None) -> None:
        """Records the start of a data-loading span."""
        lane = self._lane
        if not (lane is not None and start_time is None
                and lane.put(time.time_ns() // 1000, "data_loading_start", {})):
            self._slow_data_loading_start(start_time)

    @_total
    def record_data_loading_end_time(self, end_time: Any = None) -> None:
        """Records the end of a data-loading span."""
        lane = self._lane
        if not (lane is not None and end_time is None
                and lane.put(time.time_ns() // 1000, "data_loading_end", {})):
            self._slow_data_loading_end(end_time)

    @_total
    def record_model_metrics(
        self,
        step: int,
        *,
        loss: float | None = None,
        step_time_s: float | None = None,
        tokens_per_s: float | None = None,
        samples_per_s: float | None = None,
        mfu: float | None = None,
        tflops_per_device: float | None = None,
        time_: Any = None,
    ) -> None:
        """Records the model metrics of one step; metrics left as ``None`` were not measured.

        A non-finite loss (a diverged run) is recorded as it is.
        """
        lane = self._lane
        if not (lane is not None and time_ is None and type(step) is int and 0 <= step <= lane.max_count
                and (loss is None or type(loss) is float)
                and (step_time_s is None or type(step_time_s) is float)
                and (tokens_per_s is None or type(tokens_per_s) is float)
                and (samples_per_s is None or type(samples_per_s) is float)
                and (mfu is None or type(mfu) is float)
                and (tflops_per_device is None or type(tflops_per_device) is float)
                and lane.put(time.time_ns() // 1000, "model_metrics",
                             (step, loss, step_time_s, tokens_per_s, samples_per_s, mfu, tflops_per_device))):
            self._slow_model_metrics(step, loss=loss, step_time_s=step_time_s, tokens_per_s=tokens_per_s,
                                     samples_per_s=samples_per_s, mfu=mfu,
                                     tflops_per_device=tflops_per_device, time_=time_)

    # The recorder's methods for every call the fast path does not take.

    def _slow_step_start(self, step: Any, start_time: Any = None) -> None:
        raise NotImplementedError

    def _slow_data_loading_start(self, start_time: Any = None) -> None:
        raise NotImplementedError

    def _slow_data_loading_end(self, end_time: Any = None) -> None:
        raise NotImplementedError

    def _slow_model_metrics(self, step: Any, *, loss: Any = None, step_time_s: Any = None,
                            tokens_per_s: Any = None, samples_per_s: Any = None, mfu: Any = None,
                            tflops_per_device: Any = None, time_: Any = None) -> None:
        raise NotImplementedError


def _compiled() -> Any:
    """The compiled module, or None where it was not built or is not wanted."""
    if os.environ.get(PURE_PYTHON_ENV, "").strip() == "1":
        return None
    try:
        return importlib.import_module("emitter._lane")
    except ImportError:
        return None


_module = _compiled()
if TYPE_CHECKING:
    Lane = PythonLane
    FastPath = PythonFastPath
    COMPILED = False
else:
    COMPILED = _module is not None
    Lane = _module.Lane if COMPILED else PythonLane
    FastPath = _module.FastPath if COMPILED else PythonFastPath


def _compiled_encode_events(records: list[Record]) -> bytes:
    encoded: bytes | None = _module.encode_events(records, encode_body, orjson.dumps)
    return wire_encode_events(records) if encoded is None else encoded


#: The worker's ``goodput_schemas.wire.encode_events``. Compiled, it writes the records the
#: per-step calls queue itself, their floats formatted by one ``orjson.dumps`` a batch, every other
#: dict body through ``encode_body``, and leaves a batch holding anything else to the Python one:
#: the same JSON values, and the same bytes unless a "null" made the Python one encode the batch
#: again with the standard library (whose floats read ``1e-05`` where orjson's read ``0.00001``).
encode_events: EventsEncoder = _compiled_encode_events if COMPILED else wire_encode_events
