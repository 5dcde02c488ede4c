"""What Beam's DirectRunner pays around every bundle, cut to what the bundle itself needs.

The DirectRunner runs a stream as a series of bundles, and around each it does work that grows
with everything the stream has seen rather than with the bundle; a local stream of thousands of
runs spent most of its time there. Three things, each measured on the fleet benchmark:

* **Timers.** After every bundle, and in a loop while nothing else runs, the runner asks every
  key that ever held state in every stateful step whether a timer is due: a tracker of 10,000
  runs was visited 10,000 times per step for each bundle of ten messages. ``_KeyedStates`` keeps a
  step's states (the runner's dict of them) with each key's earliest timer per time domain in a
  heap, so that the runner visits only the keys with a timer due, and asks them as it did.
* **Copies.** Each bundle works on a copy of each key's state, which the runner makes with a deep
  copy of the key's timers (timestamps and windows, which nothing changes in place): here each
  window's timers are copied as a dict, and the rest as the runner copies it.
* **DoFns set up once.** For every bundle the runner makes a new copy of each DoFn (a pickle
  round trip), inspects its methods for state and timer specs four times over, sets it up, and
  tears it down at the end: what ``setup`` makes (a client, the tracker's decoded states) lasted
  one bundle. Here, as a Dataflow worker does, a copy is set up once and kept for the bundles
  that follow; a bundle that fails drops its copy, and the next bundle makes a new one. A
  DoFn's specs are read once per copy.

And a state with nothing left in it (no timer, no value: a run whose state was cleared) is
dropped rather than kept forever, so the runner's memory follows the runs it holds, not every run
it ever saw; the runner makes an empty one again when the key comes back, as it does for any new
key.

``install`` patches the runner's private classes (Beam is pinned to 2.77), once per process; if
they have changed it says so in the log and the runner runs as Beam made it. Nothing here runs on
Dataflow. A kept copy is not torn down when the pipeline ends (Beam says teardown is best effort;
none of this pipeline's DoFns has one).
"""

from __future__ import annotations

import copy
import heapq
import itertools
import logging
import threading
import weakref
from collections.abc import Hashable
from typing import Any

from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.utils.timestamp import Timestamp

_LOG = logging.getLogger(__name__)
_DOMAINS = (TimeDomain.REAL_TIME, TimeDomain.WATERMARK)
_INSTALLED = False


def install() -> bool:
    """Patches the DirectRunner as the module docstring says; False (logged) if it cannot."""
    global _INSTALLED
    if _INSTALLED:
        return True
    from apache_beam.runners.direct import evaluation_context, transform_evaluator, watermark_manager
    from apache_beam.transforms import userstate

    context: Any = getattr(evaluation_context, "EvaluationContext", None)
    unmerged: Any = getattr(evaluation_context, "DirectUnmergedState", None)
    marks = getattr(watermark_manager, "_TransformWatermarks", None)
    if not (hasattr(context, "_initialize_keyed_states") and hasattr(unmerged, "copy")
            and hasattr(marks, "extract_transform_timers")
            and hasattr(getattr(transform_evaluator, "pickler", None), "roundtrip")
            and hasattr(transform_evaluator, "DoFnRunner") and hasattr(userstate, "get_dofn_specs")):
        _LOG.warning("the DirectRunner has changed: it runs as Beam made it (every key's timers "
                     "visited after each bundle, each DoFn copied and set up for each bundle)")
        return False
    _patch_keyed_states(context)
    _patch_timers(marks)
    unmerged.copy = _copy_state
    _patch_dofn_reuse(transform_evaluator)
    _patch_specs(userstate, transform_evaluator)
    _INSTALLED = True
    return True


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


def _patch_keyed_states(context: Any) -> None:
    def initialize(self: Any, root_transforms: Any, value_to_consumers: Any) -> dict[Any, _KeyedStates]:
        steps = [*root_transforms, *(c for consumers in value_to_consumers.values() for c in consumers)]
        return {step: _KeyedStates() for step in steps}

    context._initialize_keyed_states = initialize


def _patch_timers(marks: Any) -> None:
    from apache_beam.runners.direct.util import TimerFiring

    extract = marks.extract_transform_timers

    def extract_due(self: Any) -> tuple[list[Any], bool]:
        states = self._keyed_states
        if not isinstance(states, _KeyedStates):
            return extract(self)  # type: ignore[no-any-return]
        with self._lock:
            watermark, now = self._input_watermark, self._clock.time()
            fired: list[Any] = []
            for key, state in states.due(watermark, now):
                timers, _ = state.get_timers(watermark=watermark, processing_time=now)
                fired.extend(TimerFiring(key, window, name, domain, timestamp, dynamic_timer_tag=tag)
                             for window, (name, domain, timestamp, tag) in timers)
            self._fired_timers.update(fired)
            return fired, states.with_processing_time_timers()

    marks.extract_transform_timers = extract_due


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


def _patch_dofn_reuse(evaluator: Any) -> None:
    """The ParDo evaluator's copy of a DoFn (its only use of ``pickler``) comes from the DoFn's
    idle copies when there is one; its runner sets a copy up the first time only, and puts it
    back among the idle copies where it would tear it down."""
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

    evaluator.pickler = KeptCopies
    evaluator.DoFnRunner = KeepingRunner


def _is_in(dofn: Any, copies: weakref.WeakKeyDictionary[Any, Any]) -> bool:
    try:
        return dofn in copies
    except TypeError:  # not hashable
        return False


def _patch_specs(userstate: Any, evaluator: Any) -> None:
    """A DoFn's state and timer specs, read from its methods once per DoFn object."""
    read = userstate.get_dofn_specs
    specs: weakref.WeakKeyDictionary[Any, tuple[frozenset[Any], frozenset[Any]]] = weakref.WeakKeyDictionary()

    def get_dofn_specs(dofn: Any) -> tuple[set[Any], set[Any]]:
        try:
            found = specs.get(dofn)
            if found is None:
                states, timers = read(dofn)
                found = specs[dofn] = frozenset(states), frozenset(timers)
        except TypeError:  # not hashable, or not weakly referable
            return read(dofn)  # type: ignore[no-any-return]
        return set(found[0]), set(found[1])

    userstate.get_dofn_specs = evaluator.get_dofn_specs = get_dofn_specs
