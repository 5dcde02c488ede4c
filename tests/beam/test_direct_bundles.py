"""The DirectRunner's per-bundle costs cut (``pipeline.beam.direct_bundles``): the keyed states
that know their due timers find exactly what the runner's visit of every key finds, and a DoFn
is set up once for the bundles that follow."""

from __future__ import annotations

import random
from collections.abc import Iterator

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.direct.evaluation_context import DirectUnmergedState
from apache_beam.testing import test_stream
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.transforms.window import GlobalWindow
from apache_beam.utils.timestamp import Timestamp

from pipeline.beam.direct_bundles import _KeyedStates

WINDOW = GlobalWindow()


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
