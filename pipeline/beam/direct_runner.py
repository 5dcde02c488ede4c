"""Beam's DirectRunner fitted for a local stream that runs for days: every patch of its private
classes, the table of the private names they rely on, and the check of that table.

Dataflow reads Pub/Sub its own way, with acknowledgements after a checkpoint, runs bundles its
own way and reports failed jobs itself; nothing here runs there. The launcher calls
``install()`` before it builds a local stream's pipeline.

What a local stream needs to be right (the **correctness** patches, always installed):

* **The Pub/Sub read** (``read``, in place of ``_PubSubReadEvaluator._read_from_pubsub``). It
  pulls messages and acknowledges them at once, before they are processed, as Beam's does, but:

  - A failed pull (the emulator away for more than the client's 60 s of retries, a quota error
    the client does not retry) fails the bundle in Beam's read, and the DirectRunner never
    retries a bundle: the pipeline is dead. Here a failed pull reads nothing, is logged once per
    outage, and the next pull, on a new connection, reads on; a failed acknowledgement keeps
    what was pulled.
  - Cancelling the pipeline loses the messages pulled (so acknowledged) but not yet processed.
    To stop cleanly the launcher first calls ``start_stopping(requests_by)``: from then on
    ``stopping()`` is true, and the steps it was given to (the run tracker, the cloud sinks)
    report each message at once and retry nothing, and the sinks' requests end by
    ``requests_by``, answered or not (``pipeline.sinks.retries``); then ``stop_reading()``:
    later pulls read nothing, and what was read is processed; ``drained`` tells when that is
    done, and the launcher cancels then. ``busy`` names the steps whose bundles are still
    running, for a stop that cannot wait for them.
  - Pub/Sub holds a pull with nothing to deliver open until its deadline, and the runner does
    all its work on one thread: while a pull waits, no timer fires, so no snapshot is made.
    Beam's read gives its pulls 30 s, and a quiet stream's snapshots came up to 30 s late; here
    a pull's deadline is ``PULL_TIMEOUT_S``, 2 s (Pub/Sub answers an idle pull about a second
    before its deadline, or it ends at its deadline; either way it read nothing).
  - A stop that waited for a pull in flight would break its word. ``stop_reading()`` cancels
    the pulls in flight instead, by closing their clients; they had acknowledged nothing, so
    what they took is delivered again to the next stream, after its ack deadline (a Pub/Sub
    that does not notice the cancel holds the pull to its deadline first, and may hand it a
    message published meanwhile).
  - Beam's read holds its watermark at the clock after every pull, whatever is left in the
    subscription. Dataflow's follows the backlog. After a read that stalled or failed (an
    outage), the messages pulled then were behind a watermark that had gone on: every run's
    quiet timer fired as its late messages came, and a run forgotten in the middle of them began
    again without its history. Here (``BACKLOG``, the evaluator's ``finish_bundle`` wrapped)
    the watermark stays where it was while pulls fail, and at the newest publish time of a pull
    that came back full (more are waiting); only a pull that was not full lets it reach the
    clock.
  - Its client receives responses of any size, as the client library sets it up for Pub/Sub
    (for an emulator the library opens a channel that refuses responses over 4 MiB, a hundred
    messages of 1,000 events, and a read that hit it would be refused forever).

* **Metrics of every bundle** (``count_every_bundle``). The runner counts a step's metrics only
  for its first bundle on each of its threads: a thread's state sampler keeps the scoped state
  it made for the step's first bundle, with that bundle's metrics container, and every later
  bundle's counters go to that container, already committed. Here each bundle runs under a
  sampler of its own.

* **Timers delivered once.** The runner looks for due timers in the keys' committed state after
  every bundle, and a timer whose firing waits behind other bundles of its step is found and
  fired again, since its state keeps it until that firing commits. A callback that re-sets its
  timer for a time already past (a silent run's next snapshot, after a busy minute) is then
  called over and over, each call making another, and a stop could not finish. Here a firing is
  delivered only if its timer is still set for that time, as a runner that fires each timer
  once would.

* **The watch** (no patch: ``drained``, ``busy`` and ``failure`` read the runner's private
  structures). When a bundle fails for good the runner tells only ``wait_until_finish``, which
  then waits for its worker threads and may never return: ``failure`` looks for the failure
  instead, so that the launcher stops and says so rather than serve a dead pipeline.

What makes it fast (the **speed-ups**, ``install(speedups=True)``, the default): the runner
pays, around every bundle, for work that grows with everything the stream has seen rather than
with the bundle; a local stream of thousands of runs spent most of its time there. Each was
measured on the fleet benchmark; without them the same results come, slower:

* **Big pulls.** Beam's read pulls ten messages at a time; here a pull takes up to
  ``PULL_MAX_MESSAGES``, as many as Pub/Sub allows. A bundle is what one pull took, and the
  runner pays a cost per bundle (each step's evaluator, its keys' state copies, its timers).
* **A timer index.** After every bundle, and in a loop while nothing else runs, the runner asks
  every key that ever held state in every stateful step whether a timer is due: a tracker of
  10,000 runs was visited 10,000 times per step for each bundle. ``_KeyedStates`` keeps a step's
  states with each key's earliest timer per time domain in a heap, so that the runner visits
  only the keys with a timer due, and asks them as it did. And a state with nothing left in it
  (no timer, no value: a run whose state was cleared) is dropped rather than kept forever, so
  the runner's memory follows the runs it holds; it makes an empty one again when the key
  comes back, as it does for any new key.
* **State copies.** Each bundle works on a copy of each key's state, which the runner makes
  with a deep copy of the key's timers (timestamps and windows, which nothing changes in
  place): here each window's timers are copied as a dict, and the rest as the runner copies it.
* **DoFns set up once.** For every bundle the runner makes a new copy of each DoFn (a pickle
  round trip), sets it up, and tears it down at the end: what ``setup`` makes (a client, the
  tracker's decoded states) lasted one bundle. Here, as a Dataflow worker does, a copy is set up
  once and kept for the bundles that follow; a bundle that fails drops its copy, and the next
  bundle makes a new one. A kept copy is not torn down when the pipeline ends (Beam says
  teardown is best effort; none of this pipeline's DoFns has one).
* **DoFn specs read once.** The runner inspects a DoFn's methods for state and timer specs four
  times per bundle; here once per DoFn object.

Every private name of Beam that these rely on is a row of ``BEAM_NAMES``; ``changed()`` checks
them all against the installed Beam (pinned in ``pyproject.toml``) and
``tests/beam/test_direct_runner.py`` runs it, so a Beam that changed fails a test rather than a
user's stream. ``install`` checks them too, before it patches anything: if a name that a
correctness patch or the watch relies on is missing or changed, it raises ``BeamChanged``,
naming the names and Beam's version, before the pipeline is built; a speed-up whose names are
missing is left out, said in the log, and the stream runs as Beam made that part. The patches
are for the whole process and stay installed.

With ``GOODPUT_BEAM_AS_SHIPPED=1`` in the environment ``install`` (and ``count_every_bundle``)
checks the names and patches nothing: the tests of the run tracker run once on Beam as shipped
(``tests/beam/test_beam_as_shipped.py``). A local stream run so has none of the above: its stop
may lose what was read, and a Pub/Sub outage ends it.
"""

from __future__ import annotations

import contextlib
import copy
import heapq
import importlib
import inspect
import itertools
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import grpc
from apache_beam.io.gcp.pubsub import PubsubMessage
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.utils.timestamp import Timestamp
from google.api_core.exceptions import DeadlineExceeded, GoogleAPIError

from pipeline.sinks.retries import stop_requests_by

_LOG = logging.getLogger(__name__)

#: Set to 1, ``install`` patches nothing (see the module docstring).
AS_SHIPPED_VARIABLE = "GOODPUT_BEAM_AS_SHIPPED"
#: A pull's deadline: an idle pull is held open this long (less a second), unless cancelled; the
#: runner's timers wait for it.
PULL_TIMEOUT_S = 2.0
#: Pause after a failed pull before the runner pulls again.
RETRY_PAUSE_S = 1.0
#: Messages a pull takes at most with the big pulls, and so a bundle holds: Pub/Sub's own limit.
PULL_MAX_MESSAGES = 1000
#: Messages a pull takes at most without them: Beam's read's.
BEAM_PULL_MAX_MESSAGES = 10
#: How long the reading's stop waits for acknowledgements under way before it cancels them.
ACK_WAIT_S = 10.0
_DOMAINS = (TimeDomain.REAL_TIME, TimeDomain.WATERMARK)  # the timer index's, in this order

# The patches and the readers, by name. A correctness one cannot be left out; a speed-up can.
READ, METRICS, TIMERS_ONCE, WATCH = "pubsub read", "metrics of every bundle", "timers once", "watch"
BIG_PULLS, TIMER_INDEX, STATE_COPIES = "big pulls", "timer index", "state copies"
DOFN_REUSE, DOFN_SPECS = "dofns set up once", "dofn specs read once"
CORRECTNESS = (READ, METRICS, TIMERS_ONCE, WATCH)
SPEEDUPS = (BIG_PULLS, TIMER_INDEX, STATE_COPIES, DOFN_REUSE, DOFN_SPECS)


@dataclass(frozen=True)
class BeamName:
    """A private name of Beam that a patch (or the watch) relies on, one row of ``BEAM_NAMES``.

    ``name`` is dotted within ``module``. Without ``named_in`` it must resolve there, and where
    ``parameters`` is given, a callable's parameters must begin with them, in that order (as a
    patch calls it, or as the runner calls what replaces it). With ``named_in`` (a function,
    dotted within ``module``) it is an attribute that function's code names: an instance
    attribute its class sets there (where nothing on the class can show it), or a module global
    it looks up when it runs (so replacing the global reaches it); the last part of ``name`` is
    looked for, the rest says whose it is."""

    uses: tuple[str, ...]
    module: str
    name: str
    parameters: tuple[str, ...] | None = None
    named_in: str | None = None

    def __str__(self) -> str:
        where = f" (named in {self.named_in})" if self.named_in else ""
        return f"{self.module}.{self.name}{where}"


_TE = "apache_beam.runners.direct.transform_evaluator"
_EC = "apache_beam.runners.direct.evaluation_context"
_WM = "apache_beam.runners.direct.watermark_manager"
_EX = "apache_beam.runners.direct.executor"
_PEX = "_ExecutorServiceParallelExecutor"
_STATE = "apache_beam.transforms.trigger"  # InMemoryUnmergedState: DirectUnmergedState's base
_MARKS = "_TransformWatermarks"

#: Every private name of Beam that the local runner relies on, with what relies on it.
BEAM_NAMES: tuple[BeamName, ...] = (
    # The read: the runner calls the method from finish_bundle; the client cache is the class's.
    BeamName((READ,), _TE, "_PubSubReadEvaluator._read_from_pubsub", ("self", "timestamp_attribute")),
    BeamName((READ,), _TE, "_PubSubReadEvaluator._read_from_pubsub",
             named_in="_PubSubReadEvaluator.finish_bundle"),
    BeamName((READ,), _TE, "_PubSubReadEvaluator.finish_bundle", ("self",)),
    BeamName((READ,), "apache_beam.runners.direct.util", "TransformResult.keyed_watermark_holds",
             named_in="TransformResult.__init__"),
    BeamName((READ,), _TE, "_PubSubReadEvaluator._subscriber_client_cache"),
    BeamName((READ,), _TE, "_PubSubReadEvaluator._subscriber_client_cache_lock"),
    BeamName((READ,), _TE, "_PubSubReadEvaluator._sub_name", named_in="_PubSubReadEvaluator.__init__"),
    BeamName((READ, WATCH), _TE, "_TransformEvaluator._applied_ptransform",
             named_in="_TransformEvaluator.__init__"),
    BeamName((READ,), _TE, "_PubSubSubscriberClient", ("client",)),
    BeamName((READ,), _TE, "_PubSubSubscriberClient.client", named_in="_PubSubSubscriberClient.__init__"),
    BeamName((READ,), "apache_beam.io.gcp.pubsub", "PubsubMessage._from_message", ("msg",)),
    # Metrics: each bundle's executor call gets the sampler this thread's counters go through.
    BeamName((METRICS,), _EX, "TransformExecutor.call", ("self", "state_sampler")),
    BeamName((METRICS,), "apache_beam.runners.worker.statesampler", "get_current_tracker", ()),
    BeamName((METRICS,), "apache_beam.runners.worker.statesampler", "set_current_tracker", ("tracker",)),
    BeamName((METRICS,), "apache_beam.runners.worker.statesampler", "StateSampler",
             ("prefix", "counter_factory")),
    # Timers delivered once: a firing is checked against the bundle's copy of its key's state.
    BeamName((TIMERS_ONCE,), _TE, "_TransformEvaluator.process_timer_wrapper", ("self", "timer_firing")),
    BeamName((TIMERS_ONCE,), _TE, "_TransformEvaluator._step_context",
             named_in="_TransformEvaluator.__init__"),
    BeamName((TIMERS_ONCE,), _EC, "DirectStepContext.get_keyed_state", ("self", "key")),
    BeamName((TIMERS_ONCE, WATCH, TIMER_INDEX, STATE_COPIES), _STATE, "InMemoryUnmergedState.timers",
             named_in="InMemoryUnmergedState.__init__"),
    BeamName((TIMERS_ONCE, TIMER_INDEX), "apache_beam.runners.direct.util", "TimerFiring",
             ("encoded_key", "window", "name", "time_domain", "timestamp", "dynamic_timer_tag")),
    # The watch: from the pipeline's result to its executor, its steps' watermarks and updates.
    BeamName((WATCH,), "apache_beam.runners.direct.direct_runner", "DirectPipelineResult._executor",
             named_in="DirectPipelineResult.__init__"),
    BeamName((WATCH,), _EX, "Executor._executor", named_in="Executor.__init__"),
    BeamName((WATCH,), _EX, f"{_PEX}.evaluation_context", named_in=f"{_PEX}.__init__"),
    BeamName((WATCH,), _EX, f"{_PEX}.transform_executor_services", named_in=f"{_PEX}.__init__"),
    BeamName((WATCH,), _EX, f"{_PEX}.visible_updates", named_in=f"{_PEX}.__init__"),
    BeamName((WATCH,), _EX, f"{_PEX}.root_nodes", named_in=f"{_PEX}.start"),
    BeamName((WATCH,), _EX, f"{_PEX}._TypedUpdateQueue.poll", ("self",)),
    BeamName((WATCH,), _EX, f"{_PEX}._VisibleExecutorUpdate.exception",
             named_in=f"{_PEX}._VisibleExecutorUpdate.__init__"),
    BeamName((WATCH,), _EX, "_TransformExecutorServices.executors"),
    BeamName((WATCH,), _EX, "TransformExecutor._applied_ptransform", named_in="TransformExecutor.__init__"),
    BeamName((WATCH,), _EC, "EvaluationContext._watermark_manager", named_in="EvaluationContext.__init__"),
    BeamName((WATCH,), _EC, "EvaluationContext._lock", named_in="EvaluationContext.__init__"),
    BeamName((WATCH,), _WM, "WatermarkManager._transform_to_watermarks",
             named_in="WatermarkManager.__init__"),
    *(BeamName((WATCH, TIMER_INDEX), _WM, f"{_MARKS}.{field}", named_in=f"{_MARKS}.__init__")
      for field in ("_lock", "_fired_timers", "_clock", "_input_watermark", "_keyed_states")),
    BeamName((WATCH,), _WM, f"{_MARKS}._pending", named_in=f"{_MARKS}.__init__"),
    BeamName((WATCH, TIMER_INDEX), _STATE, "InMemoryUnmergedState.get_timers",
             ("self", "clear", "watermark", "processing_time")),
    # The timer index: the runner's dict of a step's states, and its search for due timers.
    BeamName((TIMER_INDEX,), _EC, "EvaluationContext._initialize_keyed_states",
             ("self", "root_transforms", "value_to_consumers")),
    BeamName((TIMER_INDEX,), _WM, f"{_MARKS}.extract_transform_timers", ("self",)),
    BeamName((TIMER_INDEX, STATE_COPIES), _EC, "DirectUnmergedState", ()),
    BeamName((TIMER_INDEX, STATE_COPIES), _STATE, "InMemoryUnmergedState.state",
             named_in="InMemoryUnmergedState.__init__"),
    BeamName((TIMER_INDEX, STATE_COPIES), _STATE, "InMemoryUnmergedState.global_state",
             named_in="InMemoryUnmergedState.__init__"),
    # State copies: the copy each bundle makes of a key's state.
    BeamName((STATE_COPIES,), _EC, "DirectUnmergedState.copy", ("self",)),
    # DoFns set up once: the ParDo evaluator looks up pickler and DoFnRunner when a bundle starts,
    # sets its runner up there and tears it down when the bundle finishes.
    BeamName((DOFN_REUSE,), _TE, "pickler", named_in="_ParDoEvaluator.start_bundle"),
    BeamName((DOFN_REUSE,), _TE, "pickler.roundtrip", ("o",)),
    BeamName((DOFN_REUSE,), _TE, "DoFnRunner", named_in="_ParDoEvaluator.start_bundle"),
    BeamName((DOFN_REUSE,), _TE, "DoFnRunner.setup", named_in="_ParDoEvaluator.start_bundle"),
    BeamName((DOFN_REUSE,), _TE, "DoFnRunner.teardown", named_in="_ParDoEvaluator.finish_bundle"),
    # DoFn specs read once: the module function, and the evaluator's own import of it.
    BeamName((DOFN_SPECS,), "apache_beam.transforms.userstate", "get_dofn_specs", ("dofn",)),
    BeamName((DOFN_SPECS,), _TE, "get_dofn_specs", named_in="_ParDoEvaluator.start_bundle"),
)


@dataclass(frozen=True)
class Changed:
    """A row of ``BEAM_NAMES`` that the installed Beam does not satisfy, and how."""

    name: BeamName
    why: str

    def __str__(self) -> str:
        return f"{self.name}: {self.why}"


def changed(load: Callable[[str], ModuleType] = importlib.import_module,
            names: tuple[BeamName, ...] = BEAM_NAMES) -> list[Changed]:
    """The rows of ``names`` that the modules ``load`` gives (Beam's, by default) do not
    satisfy: a name missing, a callable whose parameters changed, an attribute no longer named
    where it was. Empty on the Beam this project pins."""
    return [Changed(name, why) for name in names if (why := _why_changed(name, load)) is not None]


def _why_changed(name: BeamName, load: Callable[[str], ModuleType]) -> str | None:
    """What is wrong with one row, or None."""
    try:
        module = load(name.module)
    except ImportError:
        return "its module is missing"
    if name.named_in is not None:
        function = _resolve(module, name.named_in)
        code = getattr(inspect.unwrap(function) if function is not None else None, "__code__", None)
        if code is None:
            return f"{name.named_in} is {'missing' if function is None else 'not Python code'}"
        attribute = name.name.rsplit(".", 1)[-1]
        return None if attribute in code.co_names else f"{name.named_in} no longer names {attribute}"
    found = _resolve(module, name.name)
    if found is None:
        return "missing"
    if name.parameters is None:
        return None
    try:
        parameters = tuple(inspect.signature(found).parameters)
    except (TypeError, ValueError):
        return "its parameters cannot be read"
    if parameters[:len(name.parameters)] != name.parameters:
        return f"its parameters are ({', '.join(parameters)}), not ({', '.join(name.parameters)}, ...)"
    return None


def _resolve(module: ModuleType, dotted: str) -> Any:
    """The object at ``dotted`` within ``module``; None if a part is missing."""
    found: Any = module
    for part in dotted.split("."):
        if not hasattr(found, part):
            return None
        found = getattr(found, part)
    return found


class BeamChanged(RuntimeError):
    """The installed Beam lacks, or has changed, a private name that the local stream needs to
    be right (a row of ``BEAM_NAMES`` used by a correctness patch or the watch)."""

    def __init__(self, found: list[Changed], version: str) -> None:
        self.changed = found
        super().__init__(
            f"Beam {version}'s DirectRunner has changed where the local stream relies on it, so it "
            f"cannot run: {'; '.join(map(str, found))} (pipeline.beam.direct_runner.BEAM_NAMES "
            "says what relies on each; install the Beam version pyproject.toml pins)")


def _version(load: Callable[[str], ModuleType]) -> str:
    """The version of the Beam that ``load`` imports."""
    return str(getattr(load("apache_beam"), "__version__", "(of unknown version)"))


def as_shipped() -> bool:
    """Whether this process runs Beam as shipped (``GOODPUT_BEAM_AS_SHIPPED=1``): no patch."""
    return os.environ.get(AS_SHIPPED_VARIABLE) == "1"


def plan(speedups: bool = True, load: Callable[[str], ModuleType] = importlib.import_module
         ) -> tuple[str, ...]:
    """The patches ``install`` applies, by name: every correctness patch, and with ``speedups``
    each speed-up whose names are all there (one that is not is named in the log, with Beam's
    version, and left out); none when Beam runs as shipped. Raises ``BeamChanged`` if a name
    that a correctness patch or the watch needs is missing or changed (``load`` gives the
    modules checked)."""
    found, version = changed(load), _version(load)
    needed = [c for c in found if any(use in CORRECTNESS for use in c.name.uses)]
    if needed:
        raise BeamChanged(needed, version)
    broken = {use for c in found for use in c.name.uses}
    wanted = [use for use in (*CORRECTNESS, *(SPEEDUPS if speedups else ())) if use in _PATCHES]
    left_out = [use for use in wanted if use in broken]
    if left_out:
        _LOG.warning("Beam %s's DirectRunner has changed: the local stream runs without %s (%s)",
                     version, ", ".join(left_out), "; ".join(map(str, found)))
    return () if as_shipped() else tuple(use for use in wanted if use not in broken)


def install(speedups: bool = True) -> tuple[str, ...]:
    """Checks ``BEAM_NAMES`` and patches the DirectRunner as the module docstring says (see
    ``plan``), before any pipeline is built; the patches in force in this process, by name.
    Each patch is installed once per process and stays (``speedups=False`` after a call that
    installed them leaves them in force); a new stream in this process starts with its
    reading and stopping state reset."""
    for use in plan(speedups):
        if use not in _INSTALLED:
            _PATCHES[use]()
            _INSTALLED.add(use)
    for event in (_STOPPING, _STOPPED, _OUTAGE):
        event.clear()
    stop_requests_by(None)
    return tuple(use for use in _PATCHES if use in _INSTALLED)


def count_every_bundle() -> None:
    """Installs the metrics patch alone, for a test or a benchmark that reads counters on the
    DirectRunner without a stream's other patches (not as shipped; its names checked first).
    Idempotent."""
    found = changed(names=tuple(n for n in BEAM_NAMES if METRICS in n.uses))
    if found:
        raise BeamChanged(found, _version(importlib.import_module))
    if not as_shipped() and METRICS not in _INSTALLED:
        _patch_metrics()
        _INSTALLED.add(METRICS)


def _replace(owner: Any, attribute: str, replacement: Callable[..., Any]) -> None:
    """Puts ``replacement`` in place of Beam's ``owner.attribute``, marked as standing for it
    (``__wrapped__``, as ``functools.wraps`` marks a wrapper), so that ``changed`` still reads
    the parameters of Beam's own."""
    replacement.__wrapped__ = getattr(owner, attribute)  # type: ignore[attr-defined]
    setattr(owner, attribute, replacement)


# The correctness patches.

_STOPPING = threading.Event()  # the job is stopping: report each message at once
_STOPPED = threading.Event()  # the job reads no more
_OUTAGE = threading.Event()  # the last pull failed
_STOP_LOCK = threading.Condition()  # a pull begins, an acknowledgement ends, or the reading stops
_PULLING = 0  # reads between their start and their return (under _STOP_LOCK)
_ACKING = 0  # acknowledgements under way (under _STOP_LOCK): the reading stops after them
_pull_messages = BEAM_PULL_MAX_MESSAGES  # what a pull takes at most (PULL_MAX_MESSAGES with big pulls)


class Backlog:
    """Where the read's watermark may be, as far as the backlog of the subscription goes: the
    clock (None) once a pull came back not full; the newest publish time (seconds) of a pull that
    came back full, since more are waiting; where it was while pulls fail."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self.hold_s: float | None = None
        self._caught_up_s = clock()  # when a pull last came back not full

    def pulled(self, publish_times_s: list[float], full: bool) -> None:
        if full:
            self.hold_s = max(publish_times_s)
        else:
            self.hold_s, self._caught_up_s = None, self.clock()

    def failed(self) -> None:
        if self.hold_s is None:
            self.hold_s = self._caught_up_s


#: The local stream's one read's backlog (``Backlog``).
BACKLOG = Backlog()


def _patch_read() -> None:
    """Correctness: the runner's Pub/Sub read is ``read``, and its watermark follows the backlog."""
    from apache_beam.runners.direct.transform_evaluator import _PubSubReadEvaluator

    _replace(_PubSubReadEvaluator, "_read_from_pubsub", read)
    _replace(_PubSubReadEvaluator, "finish_bundle", finish_bundle)


def finish_bundle(evaluator: Any) -> Any:
    """The read's ``finish_bundle``, its watermark hold (the clock) held back to the backlog's."""
    result = finish_bundle.__wrapped__(evaluator)  # type: ignore[attr-defined]
    if BACKLOG.hold_s is not None:
        result.keyed_watermark_holds[None] = min(result.keyed_watermark_holds[None],
                                                 Timestamp.of(BACKLOG.hold_s))
    return result


def read(evaluator: Any, timestamp_attribute: str | None) -> list[tuple[Any, Any]]:
    """What the runner's read does (pull messages, acknowledge them, stamp each with its publish
    time); a failed pull reads nothing, and a failed acknowledgement keeps what was pulled: the
    messages may come again, and the pipeline drops repeated events."""
    if timestamp_attribute:
        raise NotImplementedError("the local stream stamps messages with their publish time")
    global _PULLING
    with _STOP_LOCK:
        if _STOPPED.is_set():
            return []
        client = _client(evaluator)
        _PULLING += 1
    try:
        return _pull(evaluator, client)
    finally:
        with _STOP_LOCK:
            _PULLING -= 1


def _pull(evaluator: Any, client: Any) -> list[tuple[Any, Any]]:
    """``read``'s pull and acknowledgement, with ``client``."""
    global _ACKING
    try:
        received = list(client.pull(subscription=evaluator._sub_name, max_messages=_pull_messages,
                                    timeout=PULL_TIMEOUT_S).received_messages)
    except (GoogleAPIError, ValueError) as error:  # ValueError: a channel that stop_reading closed
        if _STOPPED.is_set() or isinstance(error, DeadlineExceeded):
            return []  # cancelled, or idle until its deadline: nothing was acknowledged
        if not isinstance(error, GoogleAPIError):
            raise
        if not _OUTAGE.is_set():
            _OUTAGE.set()
            _LOG.warning("pulling from Pub/Sub failed (%s); retrying until it answers", error)
        BACKLOG.failed()
        _forget_client(evaluator)
        _STOPPED.wait(RETRY_PAUSE_S)
        return []
    if _OUTAGE.is_set():
        _OUTAGE.clear()
        _LOG.warning("pulling from Pub/Sub again")
    if received:
        with _STOP_LOCK:
            if _STOPPED.is_set():
                return []  # the reading stopped during the pull: as a cancelled pull's, its messages wait
            _ACKING += 1
        try:
            client.acknowledge(subscription=evaluator._sub_name, ack_ids=[m.ack_id for m in received])
        except (GoogleAPIError, ValueError) as error:
            _LOG.warning("acknowledging %d messages failed (%s): they may be delivered again",
                         len(received), error)
        finally:
            with _STOP_LOCK:
                _ACKING -= 1
                _STOP_LOCK.notify_all()
    messages = [(Timestamp.from_utc_datetime(m.message.publish_time), PubsubMessage._from_message(m.message))
                for m in received]
    BACKLOG.pulled([float(stamp) for stamp, _ in messages], full=len(received) >= _pull_messages)
    return messages


def _client(evaluator: Any) -> Any:
    """The subscriber client of the evaluator's read, from the runner's cache (where
    ``stop_reading`` and ``_forget_client`` find it), made on first use: on an emulator, with a
    channel that takes responses of any size, as the library's channel to Pub/Sub does."""
    cls, transform = type(evaluator), evaluator._applied_ptransform.transform
    with cls._subscriber_client_cache_lock:
        cached = cls._subscriber_client_cache.get(transform)
        if cached is None:
            from apache_beam.runners.direct.transform_evaluator import _PubSubSubscriberClient
            from google.cloud.pubsub_v1 import SubscriberClient
            from google.pubsub_v1.services.subscriber.transports import SubscriberGrpcTransport

            host, arguments = os.environ.get("PUBSUB_EMULATOR_HOST"), {}
            if host:
                arguments["transport"] = SubscriberGrpcTransport(channel=grpc.insecure_channel(
                    host, options=[("grpc.max_receive_message_length", -1)]))
            cached = cls._subscriber_client_cache[transform] = _PubSubSubscriberClient(
                SubscriberClient(**arguments))
        return cached.client


def _forget_client(evaluator: Any) -> None:
    """Drops the evaluator's cached client, so the next pull connects anew (a gRPC channel that
    lost its server waits up to two minutes between attempts to reconnect)."""
    cls = type(evaluator)
    with cls._subscriber_client_cache_lock:
        client = cls._subscriber_client_cache.pop(evaluator._applied_ptransform.transform, None)
    if client is not None:
        _close(client)


def _close(client: Any) -> None:
    """Closes a cached subscriber client's channel, cancelling its calls in flight."""
    try:
        client.client.close()
    except Exception as error:  # noqa: BLE001 -- a broken channel may fail to close; it is dropped
        _LOG.debug("closing the Pub/Sub client failed: %s", error)


def start_stopping(requests_by: float) -> None:
    """From now on ``stopping()`` is true in this process, and the cloud sinks' requests end by the
    monotonic ``requests_by``."""
    stop_requests_by(requests_by)
    _STOPPING.set()


def stopping() -> bool:
    """Whether this process's local stream is stopping (given to the steps that care: it is
    pickled by reference, and so read in the process that runs them)."""
    return _STOPPING.is_set()


def stop_reading() -> None:
    """From now on every pull reads nothing: what was read is processed, nothing more comes. A
    pull in flight is cancelled (its client closed): what it took, unacknowledged, stays in the
    subscription for the next stream. An acknowledgement under way ends first (within
    ``ACK_WAIT_S``): cancelled, it would leave messages that are processed in the subscription,
    to be read again by the next stream."""
    from apache_beam.runners.direct.transform_evaluator import _PubSubReadEvaluator as evaluator

    with _STOP_LOCK:
        _STOPPED.set()
        _STOP_LOCK.wait_for(lambda: not _ACKING, ACK_WAIT_S)
    with evaluator._subscriber_client_cache_lock:
        clients = list(evaluator._subscriber_client_cache.values())
        evaluator._subscriber_client_cache.clear()
    for client in clients:
        _close(client)


def drained(result: Any) -> Callable[[], bool]:
    """For the pipeline of ``result``, after ``stop_reading()``: a check that turns true once
    everything the stream read is processed, so that the launcher cancels as soon as cancelling
    loses nothing. It is true when no pull is returning, every bundle that was queued or running
    when the pulls had all returned is done (one may hold what they read), no step has input
    waiting, and no timer is due (a due timer may release what a step holds, as the Monitoring
    writer's do). It reads the runner's private structures (the watch's rows of
    ``BEAM_NAMES``)."""
    executor = result._executor._executor
    context = executor.evaluation_context
    watermarks = context._watermark_manager._transform_to_watermarks
    roots, scheduled, lock = executor.root_nodes, executor.transform_executor_services, context._lock
    earlier: frozenset[Any] | None = None  # the bundles queued or running once the pulls returned

    def done() -> bool:
        nonlocal earlier
        with _STOP_LOCK:
            if _PULLING:
                return False
        running = scheduled.executors
        if earlier is None:
            earlier = running
        if earlier & running or any(e._applied_ptransform not in roots for e in running):
            return False
        with lock:  # a step's outputs become the next steps' input under this lock
            for transform, marks in watermarks.items():
                with marks._lock:
                    if marks._fired_timers or (marks._pending and transform not in roots):
                        return False
                    now = marks._clock.time()
                    if any(state.get_timers(watermark=marks._input_watermark, processing_time=now)[0]
                           for state in marks._keyed_states.values()):
                        return False
        return True

    return done


def busy(result: Any) -> list[str]:
    """The labels of the steps of ``result``'s pipeline whose bundles are running or queued (the
    runner's private structures, as ``drained`` reads them)."""
    scheduled = result._executor._executor.transform_executor_services.executors
    return sorted({e._applied_ptransform.full_label for e in scheduled})


def keys_held(result: Any, label: str) -> int | None:
    """How many keys hold state in the step of ``result``'s pipeline labelled ``label`` (the
    tracker's: the runs it holds), or in the steps the runner made of it (a stateful ParDo runs
    as ``LABEL/ParDo(...)``); None where no step has it. With the timer index a key whose state
    holds nothing is dropped, so this counts the runs held now; without it, every run the stream
    has seen. It reads the runner's private structures, as ``drained`` does."""
    context = result._executor._executor.evaluation_context
    held = None
    for transform, marks in list(context._watermark_manager._transform_to_watermarks.items()):
        if transform.full_label == label or transform.full_label.startswith(label + "/"):
            with marks._lock:
                held = max(held or 0, len(marks._keyed_states))
    return held


def failure(result: Any) -> BaseException | None:
    """The exception that stopped the DirectRunner pipeline of ``result``, if the runner has
    reported one since the last call; None otherwise. It takes the report from the runner's
    queue of updates for the user (private: the watch's rows of ``BEAM_NAMES``), which
    ``wait_until_finish`` would wait on: the caller keeps what it gets."""
    update = result._executor._executor.visible_updates.poll()
    if update is None or update.exception is None:
        return None
    exception = update.exception
    if isinstance(exception, tuple):  # the runner's stall report: (exception, None, None)
        exception = exception[0]
    return exception  # type: ignore[no-any-return]


@contextlib.contextmanager
def own_state_sampler() -> Iterator[Any]:
    """A new state sampler, this thread's for the block (Beam counts a thread's metrics through
    its sampler's current scoped state); the thread's earlier one is put back after."""
    from apache_beam.runners.worker import statesampler
    from apache_beam.utils.counters import CounterFactory

    previous, sampler = statesampler.get_current_tracker(), statesampler.StateSampler("", CounterFactory())
    statesampler.set_current_tracker(sampler)
    try:
        yield sampler
    finally:
        statesampler.set_current_tracker(previous)




def _patch_metrics() -> None:
    """Correctness: each bundle runs under a state sampler of its own (see the module
    docstring), so that the runner counts the metrics of every bundle."""
    from apache_beam.runners.direct.executor import TransformExecutor

    call = TransformExecutor.call

    def call_counted(executor: Any, _: Any) -> Any:
        with own_state_sampler() as sampler:
            return call(executor, sampler)

    _replace(TransformExecutor, "call", call_counted)


def _patch_timers_once() -> None:
    """Correctness: the runner delivers a timer firing only while its timer is set for the time
    it fired for (see the module docstring)."""
    from apache_beam.runners.direct.transform_evaluator import _TransformEvaluator

    _replace(_TransformEvaluator, "process_timer_wrapper",
             delivering_once(_TransformEvaluator.process_timer_wrapper))


def delivering_once(deliver: Callable[[Any, Any], None]) -> Callable[[Any, Any], None]:
    """The runner's ``process_timer_wrapper`` (``deliver``) made to drop a firing that another
    delivered, or whose timer was set again for another time since."""

    def deliver_once(evaluator: Any, firing: Any) -> None:
        state = evaluator._step_context.get_keyed_state(firing.encoded_key)
        timers = state.timers.get(firing.window, {})
        if timers.get((firing.name, firing.time_domain, firing.dynamic_timer_tag)) == firing.timestamp:
            deliver(evaluator, firing)

    return deliver_once


# The speed-ups.

def _patch_big_pulls() -> None:
    """Speed-up: a pull takes up to ``PULL_MAX_MESSAGES`` (the read is the correctness patch's)."""
    global _pull_messages
    _pull_messages = PULL_MAX_MESSAGES


class _KeyedStates(dict[Hashable, Any]):
    """A stateful step's states by encoded key, as the runner keeps them, which knows the keys
    with a timer due. The runner replaces a key's state whole when a bundle commits (it works on
    copies), so each assignment indexes the key again: its earliest timer per time domain, in
    one heap per domain (entries that a later assignment outdated are skipped as they surface).
    A key whose earliest timer is due stays due until its state is assigned again, as the runner
    asks a key again until the bundle that fires its timers commits."""

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self._earliest: dict[Hashable, tuple[int | None, ...]] = {}  # key: micros per domain
        self._heaps: tuple[list[tuple[int, int, Hashable]], ...] = tuple([] for _ in _DOMAINS)
        self._due: dict[Hashable, None] = {}  # keys with a timer due, in the order found
        self._order = itertools.count()  # ties in a heap never compare keys
        self._with_processing_time = 0  # keys with a processing-time timer

    def __setitem__(self, key: Hashable, state: Any) -> None:
        earliest = _earliest_timers(state)
        with self._lock:
            was_due = key in self._due
            self._due.pop(key, None)
            before = self._earliest.pop(key, None)
            if before is not None and before[0] is not None:
                self._with_processing_time -= 1
            if earliest is None:
                if _holds_nothing(state):
                    super().pop(key, None)
                    return
            else:
                self._earliest[key] = earliest
                if earliest[0] is not None:
                    self._with_processing_time += 1
                for heap, micros, previous in zip(self._heaps, earliest, before or (None, None), strict=True):
                    if micros is not None and (micros != previous or was_due):
                        heapq.heappush(heap, (micros, next(self._order), key))
            super().__setitem__(key, state)

    def __missing__(self, key: Hashable) -> Any:
        """A new empty state, for a key whose empty state was dropped (the runner assigns one
        and reads it back)."""
        from apache_beam.runners.direct.evaluation_context import DirectUnmergedState

        return DirectUnmergedState()

    def due(self, watermark: Timestamp, now: Any) -> list[tuple[Hashable, Any]]:
        """The keys (with their states) whose earliest timer in some domain is due: processing
        time ``now``, event time ``watermark``, compared as the runner compares them."""
        with self._lock:
            for domain, (heap, limit) in enumerate(zip(self._heaps, (now, watermark), strict=True)):
                limit_micros = Timestamp.of(limit).micros
                while heap and heap[0][0] <= limit_micros:
                    micros, _, key = heapq.heappop(heap)
                    earliest = self._earliest.get(key)
                    if earliest is not None and earliest[domain] == micros:
                        self._due[key] = None
            return [(key, dict.__getitem__(self, key)) for key in self._due]

    def with_processing_time_timers(self) -> bool:
        """Whether some key has a processing-time timer set, due or not."""
        with self._lock:
            return self._with_processing_time > 0


def _earliest_timers(state: Any) -> tuple[int | None, ...] | None:
    """A state's earliest timer in each domain (micros, or None), or None if it has no timer."""
    earliest: list[int | None] = [None, None]
    for timers in state.timers.values():
        for (_, domain, _), timestamp in timers.items():
            index = 1 if domain == TimeDomain.WATERMARK else 0
            micros = Timestamp.of(timestamp).micros
            if earliest[index] is None or micros < earliest[index]:  # type: ignore[operator]
                earliest[index] = micros
    return None if earliest == [None, None] else tuple(earliest)


def _holds_nothing(state: Any) -> bool:
    """Whether a state without timers holds no value either (what reads leave: empty lists)."""
    return not state.global_state and all(
        values == [] for tags in state.state.values() for values in tags.values())


def _patch_timer_index() -> None:
    """Speed-up: every stateful step's states are kept in a ``_KeyedStates``, and the runner's
    search for due timers asks it for the keys with a timer due."""
    from apache_beam.runners.direct.evaluation_context import EvaluationContext
    from apache_beam.runners.direct.util import TimerFiring
    from apache_beam.runners.direct.watermark_manager import _TransformWatermarks

    def initialize(self: Any, root_transforms: Any, value_to_consumers: Any) -> dict[Any, _KeyedStates]:
        steps = [*root_transforms, *(c for consumers in value_to_consumers.values() for c in consumers)]
        return {step: _KeyedStates() for step in steps}

    extract = _TransformWatermarks.extract_transform_timers

    def extract_due(self: Any) -> tuple[list[Any], bool]:
        states = self._keyed_states
        if not isinstance(states, _KeyedStates):  # a pipeline made before the patch
            return extract(self)
        with self._lock:
            watermark, now = self._input_watermark, self._clock.time()
            fired: list[Any] = []
            for key, state in states.due(watermark, now):
                timers, _ = state.get_timers(watermark=watermark, processing_time=now)
                fired.extend(TimerFiring(key, window, name, domain, timestamp, dynamic_timer_tag=tag)
                             for window, (name, domain, timestamp, tag) in timers)
            self._fired_timers.update(fired)
            return fired, states.with_processing_time_timers()

    _replace(EvaluationContext, "_initialize_keyed_states", initialize)
    _replace(_TransformWatermarks, "extract_transform_timers", extract_due)


def _patch_state_copies() -> None:
    """Speed-up: the runner's copy of a key's state is ``_copy_state``."""
    from apache_beam.runners.direct.evaluation_context import DirectUnmergedState

    _replace(DirectUnmergedState, "copy", _copy_state)


def _copy_state(state: Any) -> Any:
    """The runner's copy of a key's state for a bundle, with each window's timers copied as a
    dict (their keys are tuples of strings, their values timestamps) rather than deep-copied."""
    from apache_beam.runners.direct.evaluation_context import DirectUnmergedState

    clone = DirectUnmergedState()
    for window, timers in state.timers.items():
        clone.timers[window] = dict(timers)
    if state.global_state:
        clone.global_state = copy.deepcopy(state.global_state)
    for window, tags in state.state.items():
        cloned = clone.state[window]
        for tag, values in tags.items():
            cloned[tag] = copy.copy(values)
    return clone


def _patch_dofn_reuse() -> None:
    """Speed-up: the ParDo evaluator's copy of a DoFn (its only use of ``pickler``) comes from the DoFn's
    idle copies when there is one; its runner sets a copy up the first time only, and puts it
    back among the idle copies where it would tear it down."""
    from apache_beam.runners.direct import transform_evaluator

    evaluator: Any = transform_evaluator
    # Weakly, both ways: a pipeline's copies go with its graph (a copy does not refer to it).
    idle: weakref.WeakKeyDictionary[Any, list[Any]] = weakref.WeakKeyDictionary()  # graph DoFn: copies
    origin: weakref.WeakKeyDictionary[Any, weakref.ref[Any]] = weakref.WeakKeyDictionary()  # copy: its DoFn
    set_up: weakref.WeakSet[Any] = weakref.WeakSet()
    pickler = evaluator.pickler

    class KeptCopies:
        @staticmethod
        def roundtrip(dofn: Any) -> Any:
            copies = idle.setdefault(dofn, [])
            if copies:
                return copies.pop()
            made = pickler.roundtrip(dofn)
            origin[made] = weakref.ref(dofn)
            return made

    class KeepingRunner(evaluator.DoFnRunner):
        def __init__(self, dofn: Any, *args: Any, **kwargs: Any) -> None:
            super().__init__(dofn, *args, **kwargs)
            self._kept = dofn if _is_in(dofn, origin) else None

        def setup(self) -> None:
            if self._kept is None or self._kept not in set_up:
                super().setup()
                if self._kept is not None:
                    set_up.add(self._kept)

        def teardown(self) -> None:
            graph_dofn = None if self._kept is None else origin[self._kept]()
            if graph_dofn is None:
                super().teardown()
            else:
                idle.setdefault(graph_dofn, []).append(self._kept)

    KeptCopies.roundtrip.__wrapped__ = pickler.roundtrip  # type: ignore[attr-defined]
    evaluator.pickler = KeptCopies
    evaluator.DoFnRunner = KeepingRunner


def _is_in(dofn: Any, copies: weakref.WeakKeyDictionary[Any, Any]) -> bool:
    try:
        return dofn in copies
    except TypeError:  # not hashable
        return False


def _patch_dofn_specs() -> None:
    """Speed-up: a DoFn's state and timer specs, read from its methods once per DoFn object."""
    from apache_beam.runners.direct import transform_evaluator
    from apache_beam.transforms import userstate

    evaluator: Any = transform_evaluator
    read = userstate.get_dofn_specs
    specs: weakref.WeakKeyDictionary[Any, tuple[frozenset[Any], frozenset[Any]]] = weakref.WeakKeyDictionary()

    def get_dofn_specs(dofn: Any) -> tuple[set[Any], set[Any]]:
        try:
            found = specs.get(dofn)
            if found is None:
                states, timers = read(dofn)
                found = specs[dofn] = frozenset(states), frozenset(timers)
        except TypeError:  # not hashable, or not weakly referable
            return read(dofn)
        return set(found[0]), set(found[1])

    _replace(userstate, "get_dofn_specs", get_dofn_specs)
    _replace(evaluator, "get_dofn_specs", get_dofn_specs)


#: How each patch is installed, by name (the watch reads and installs nothing).
_PATCHES: dict[str, Callable[[], None]] = {
    READ: _patch_read, METRICS: _patch_metrics, TIMERS_ONCE: _patch_timers_once,
    BIG_PULLS: _patch_big_pulls, TIMER_INDEX: _patch_timer_index, STATE_COPIES: _patch_state_copies,
    DOFN_REUSE: _patch_dofn_reuse, DOFN_SPECS: _patch_dofn_specs,
}
_INSTALLED: set[str] = set()  # the patches installed in this process
