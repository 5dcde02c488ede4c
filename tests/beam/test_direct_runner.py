"""The DirectRunner fitted for a local stream (``pipeline.beam.direct_runner``): every private
name of Beam it relies on is checked, a Beam without one is refused (or runs without the speed-up
that needs it), a timer firing that the runner found twice is delivered once, the keyed states
that know their due timers find what the runner's visit of every key finds, and a DoFn is set up
once for the bundles that follow."""

from __future__ import annotations

import importlib
import inspect
import logging
import random
import types
from collections.abc import Callable, Iterator
from typing import Any

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.direct.evaluation_context import DirectStepContext, DirectUnmergedState
from apache_beam.runners.direct.transform_evaluator import _TransformEvaluator
from apache_beam.runners.direct.util import TimerFiring
from apache_beam.testing import test_stream
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.transforms.window import GlobalWindow
from apache_beam.utils.timestamp import Timestamp

from pipeline.beam import direct_runner
from pipeline.beam.direct_runner import BEAM_NAMES, BeamChanged, BeamName, _KeyedStates
from support.clock import ManualClock

WINDOW = GlobalWindow()
KEY = b"run"
_GONE = object()  # what ``replaced`` puts where an attribute is removed


# The private names: Beam's own modules, and copies of them with one thing changed.

def replaced(owner: Any, path: list[str], value: Any) -> Any:
    """A copy of a module or class with the attribute at ``path`` (dotted, inside it) set to
    ``value``, or removed where ``value`` is ``_GONE``; what it holds is Beam's own."""
    head, rest = path[0], path[1:]
    new = value if not rest else replaced(getattr(owner, head), rest, value)
    if isinstance(owner, types.ModuleType):
        copy = types.ModuleType(owner.__name__)
        copy.__dict__.update(vars(owner))
        namespace = copy.__dict__
    else:  # a class, flattened so that an inherited attribute can be removed too
        namespace = {}
        for cls in reversed(owner.__mro__[:-1]):
            namespace.update(vars(cls))
        for own in ("__dict__", "__weakref__", "__slots__"):
            namespace.pop(own, None)
    if new is _GONE:
        namespace.pop(head, None)
    else:
        namespace[head] = new
    return copy if isinstance(owner, types.ModuleType) else type(owner.__name__, (), namespace)


def loading(module: str, path: str, value: Any) -> Callable[[str], types.ModuleType]:
    """An import of Beam's modules in which ``module`` has ``path`` replaced (see ``replaced``)."""
    changed = replaced(importlib.import_module(module), path.split("."), value)
    return lambda name: changed if name == module else importlib.import_module(name)


def without(name: BeamName) -> Callable[[str], types.ModuleType]:
    """Beam's modules where the row ``name`` no longer holds: its name removed, or, for a name
    that a function's code names, that function renamed it."""
    if name.named_in is None:
        return loading(name.module, name.name, _GONE)
    function = inspect.unwrap(direct_runner._resolve(importlib.import_module(name.module), name.named_in))
    attribute = name.name.rsplit(".", 1)[-1]
    code = function.__code__
    renamed = code.replace(co_names=tuple(f"{n}_renamed" if n == attribute else n for n in code.co_names))
    return loading(name.module, name.named_in,
                   types.FunctionType(renamed, function.__globals__, closure=function.__closure__))


def test_every_private_name_the_local_runner_relies_on_is_there():
    """On the Beam installed (the tier's conftest installed the patches: the check reads Beam's
    own names under them), no row of the table is missing or changed."""
    assert len(set(BEAM_NAMES)) == len(BEAM_NAMES)
    assert {use for name in BEAM_NAMES for use in name.uses} == {
        *direct_runner.CORRECTNESS, *direct_runner.SPEEDUPS} - {direct_runner.BIG_PULLS}
    assert direct_runner.changed() == []


@pytest.mark.parametrize("name", BEAM_NAMES, ids=str)
def test_a_name_that_is_gone_is_found(name: BeamName):
    assert name in [found.name for found in direct_runner.changed(without(name))]


def test_a_method_whose_parameters_changed_is_found():
    def read(self: Any, attribute: str, deadline: float) -> list[Any]:
        return []

    load = loading(direct_runner._TE, "_PubSubReadEvaluator._read_from_pubsub", read)
    [found] = direct_runner.changed(load)
    assert found.name.name == "_PubSubReadEvaluator._read_from_pubsub"
    assert "(self, attribute, deadline), not (self, timestamp_attribute, ...)" in found.why


def test_install_refuses_a_beam_without_a_name_the_stream_needs_to_be_right():
    """Before it patches anything: the error names the name and Beam's version."""
    load = loading("apache_beam.runners.direct.executor", "TransformExecutor.call", _GONE)
    with pytest.raises(BeamChanged) as refused:
        direct_runner.plan(load=load)
    message = str(refused.value)
    assert f"Beam {beam.__version__}" in message
    assert "apache_beam.runners.direct.executor.TransformExecutor.call: missing" in message


def test_a_beam_without_a_name_a_speedup_needs_runs_without_that_speedup(caplog: pytest.LogCaptureFixture):
    load = loading("apache_beam.runners.direct.evaluation_context", "DirectUnmergedState.copy", _GONE)
    with caplog.at_level(logging.WARNING, logger=direct_runner.__name__):
        planned = direct_runner.plan(load=load)
    assert direct_runner.STATE_COPIES not in planned
    assert set(planned) == {*direct_runner.CORRECTNESS, *direct_runner.SPEEDUPS} - {
        direct_runner.STATE_COPIES, direct_runner.WATCH}
    assert f"Beam {beam.__version__}" in caplog.text and "without state copies" in caplog.text


def test_without_speedups_only_what_correctness_needs_is_planned():
    assert direct_runner.plan(speedups=False) == (
        direct_runner.READ, direct_runner.METRICS, direct_runner.TIMERS_ONCE)


def test_beam_as_shipped_is_planned_no_patch(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv(direct_runner.AS_SHIPPED_VARIABLE, "1")
    assert direct_runner.plan() == ()


# Timers delivered once.

class _Bundle(_TransformEvaluator):
    """A bundle's evaluator as the runner makes one for a step, on copies of the committed keyed
    states, delivering timers as the patch does; it records the timers delivered to it."""

    process_timer_wrapper = direct_runner.delivering_once(
        inspect.unwrap(_TransformEvaluator.process_timer_wrapper))

    def __init__(self, committed: dict[bytes, Any]) -> None:  # none of the runner's setup is needed
        self._step_context = DirectStepContext(committed)
        self.delivered: list[Timestamp] = []

    def process_timer(self, timer_firing: TimerFiring) -> None:
        self.delivered.append(timer_firing.timestamp)

    def commit(self, committed: dict[bytes, Any]) -> None:
        committed.update(self._step_context.partial_keyed_state)


def _firing(seconds: float) -> TimerFiring:
    return TimerFiring(KEY, WINDOW, "user/silence", TimeDomain.REAL_TIME, Timestamp.of(seconds))


def _with_timer(seconds: float) -> DirectUnmergedState:
    state = DirectUnmergedState()
    state.set_timer(WINDOW, "user/silence", TimeDomain.REAL_TIME, Timestamp.of(seconds))
    return state


def test_a_timer_found_twice_before_its_firing_commits_is_delivered_once():
    """The runner finds a due timer in the committed state again while its first firing waits
    behind other bundles of the step: the second firing finds it gone and does nothing."""
    committed = _KeyedStates()
    committed[KEY] = _with_timer(10)
    first, second = _firing(10), _firing(10)  # both found before the first bundle commits
    bundle = _Bundle(committed)
    bundle.process_timer_wrapper(first)
    bundle.commit(committed)
    again = _Bundle(committed)
    again.process_timer_wrapper(second)
    assert bundle.delivered == [Timestamp.of(10)] and again.delivered == []


def test_a_firing_of_a_timer_set_again_since_is_not_delivered_but_the_new_one_is():
    committed = _KeyedStates()
    committed[KEY] = _with_timer(20)  # found due at 10, then a message set it for 20
    bundle = _Bundle(committed)
    bundle.process_timer_wrapper(_firing(10))
    bundle.process_timer_wrapper(_firing(20))
    assert bundle.delivered == [Timestamp.of(20)]


# The timer index and the DoFns set up once (speed-ups).

def state(processing: float | None = None, event: float | None = None, value: bytes | None = None
          ) -> DirectUnmergedState:
    made = DirectUnmergedState()
    if processing is not None:
        made.set_timer(WINDOW, "user/snapshot", TimeDomain.REAL_TIME, Timestamp.of(processing))
    if event is not None:
        made.set_timer(WINDOW, "user/final", TimeDomain.WATERMARK, Timestamp.of(event))
    if value is not None:
        made.state[WINDOW]["user/run_state"] = [value]
    return made


def scanned(states: dict[bytes, DirectUnmergedState], watermark: float, now: float
            ) -> tuple[dict[bytes, list[object]], bool]:
    """What the runner finds by asking every key, as Beam does."""
    found, any_processing = {}, False
    for key, held in states.items():
        timers, processing = held.get_timers(watermark=Timestamp.of(watermark), processing_time=now)
        any_processing |= processing
        if timers:
            found[key] = timers
    return found, any_processing


def indexed(states: _KeyedStates, watermark: float, now: float) -> tuple[dict[bytes, list[object]], bool]:
    """What the index finds: the same question asked of the keys it says are due."""
    found = {}
    for key, held in states.due(Timestamp.of(watermark), now):
        timers, _ = held.get_timers(watermark=Timestamp.of(watermark), processing_time=now)
        if timers:
            found[key] = timers
    return found, states.with_processing_time_timers()


def test_only_keys_with_a_timer_due_are_due_and_stay_due_until_assigned_again():
    states = _KeyedStates()
    states[b"soon"] = state(processing=10)
    states[b"late"] = state(processing=100, event=5)
    states[b"none"] = state(value=b"x")
    assert states.due(Timestamp.of(0), 9) == []
    assert [key for key, _ in states.due(Timestamp.of(0), 10)] == [b"soon"]
    assert [key for key, _ in states.due(Timestamp.of(5), 10)] == [b"soon", b"late"]
    assert [key for key, _ in states.due(Timestamp.of(0), 10)] == [b"soon", b"late"]  # not yet fired
    states[b"soon"] = state(processing=10, value=b"x")  # a message's bundle: the timer is still set
    assert [key for key, _ in states.due(Timestamp.of(0), 10)] == [b"late", b"soon"]
    states[b"soon"] = state(processing=50)  # its bundle fired the timer and set the next
    states[b"late"] = state(processing=100)
    assert states.due(Timestamp.of(5), 20) == []
    assert states.with_processing_time_timers()
    states[b"soon"], states[b"late"] = state(value=b"x"), state(value=b"y")
    assert not states.with_processing_time_timers()


def test_a_state_that_holds_nothing_is_dropped_and_read_back_empty():
    states = _KeyedStates()
    states[b"run"] = state(processing=10, value=b"x")
    cleared = state()
    cleared.state[WINDOW]["user/run_state"] = []  # a cleared cell, as reads leave it
    states[b"run"] = cleared
    assert b"run" not in states and states.get(b"run") is None
    assert not states[b"run"].timers and not states[b"run"].state  # as the runner's new state
    assert not states.with_processing_time_timers() and states.due(Timestamp.of(10**9), 10**9) == []


def test_the_index_finds_what_visiting_every_key_finds():
    """Random assignments of timers in both domains and clearings, with time and the watermark
    moving on: at every step the index and the full visit find the same due timers."""
    rng = random.Random(7)
    plain: dict[bytes, DirectUnmergedState] = {}
    states = _KeyedStates()
    now = watermark = 0.0
    for _ in range(3_000):
        key = b"run-%d" % rng.randrange(200)
        choice = rng.random()
        made = (state() if choice < 0.1 else
                state(processing=now + rng.uniform(-5, 30) if choice < 0.8 else None,
                      event=watermark + rng.uniform(-5, 30) if choice > 0.5 else None,
                      value=b"v" if rng.random() < 0.5 else None))
        plain[key] = made
        states[key] = made
        now += rng.uniform(0, 1)
        watermark += rng.uniform(0, 1)
        expected, any_processing = scanned(plain, watermark, now)
        assert indexed(states, watermark, now) == (expected, any_processing)


class _Lifecycle(beam.DoFn):
    """Records, in the module's list (the runner works on copies), what each copy was asked."""

    def setup(self) -> None:
        LIFECYCLE.append(("setup", id(self)))

    def start_bundle(self) -> None:
        LIFECYCLE.append(("bundle", id(self)))

    def process(self, element: int) -> Iterator[int]:
        yield element

    def teardown(self) -> None:
        LIFECYCLE.append(("teardown", id(self)))


LIFECYCLE: list[tuple[str, int]] = []


def test_a_dofn_is_set_up_once_and_kept_for_the_bundles_that_follow():
    """The runner makes, sets up and tears down a copy of a DoFn around every bundle; here one
    copy serves every bundle of the stream, set up once (the tier's conftest installed the
    patches)."""
    LIFECYCLE.clear()
    stream = test_stream.TestStream()
    for element in range(5):
        stream.add_elements([element]).advance_processing_time(1)
    stream.advance_watermark_to_infinity()
    options = PipelineOptions(streaming=True, runner="BundleBasedDirectRunner")
    with beam.Pipeline(options=options) as pipeline:
        _ = pipeline | stream | beam.ParDo(_Lifecycle())
    bundles = [copy for what, copy in LIFECYCLE if what == "bundle"]
    assert len(bundles) >= 5
    assert len(set(bundles)) == 1
    assert LIFECYCLE.count(("setup", bundles[0])) == 1
    assert not [what for what, _ in LIFECYCLE if what == "teardown"]



def test_the_reads_watermark_stays_behind_a_backlog_and_where_it_was_while_pulls_fail():
    """The local read's watermark follows the subscription's backlog as Dataflow's does: the
    clock once a pull comes back not full; the newest publish time of a full pull (more are
    waiting); and, while pulls fail, where it was when the reading last caught up."""
    clock = ManualClock(1_000.0)
    backlog = direct_runner.Backlog(clock)
    assert backlog.hold_s is None  # the clock
    clock.now = 1_030.0
    backlog.pulled([1_020.0, 1_029.0], full=False)
    clock.now = 1_090.0  # an outage: the pulls fail for a minute
    backlog.failed()
    backlog.failed()
    assert backlog.hold_s == 1_030.0  # when the last pull found nothing waiting
    backlog.pulled([1_031.0, 1_040.0], full=True)  # the backlog, read a full pull at a time
    assert backlog.hold_s == 1_040.0
    backlog.pulled([1_041.0, 1_088.0], full=False)
    assert backlog.hold_s is None
