"""The DirectRunner's per-bundle costs cut (``pipeline.beam.direct_bundles``): the keyed states
that know their due timers find exactly what the runner's visit of every key finds."""

from __future__ import annotations

import random

from apache_beam.runners.direct.evaluation_context import DirectUnmergedState
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.transforms.window import GlobalWindow
from apache_beam.utils import shared
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


def test_each_shared_object_is_kept_between_bundles():
    """Two steps each acquire their own object through Beam's Shared: the DirectRunner drops
    its references after every bundle, and both objects are still there for the next (the
    tier's conftest installed the patches)."""

    class Decoded:  # weakly referenced, as Shared requires
        pass

    first, second = shared.Shared(), shared.Shared()
    made: list[str] = []
    ids = []
    for _ in range(3):
        for name, handle in (("first", first), ("second", second)):
            ids.append(id(handle.acquire(lambda name=name: made.append(name) or Decoded())))
    assert made == ["first", "second"]
    assert len(set(ids)) == 2
