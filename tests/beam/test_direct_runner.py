"""The DirectRunner fitted for a local stream (``pipeline.beam.direct_runner``): a timer firing
that the runner found twice, or whose timer was set again since, is not delivered."""

from __future__ import annotations

from typing import Any

from apache_beam.runners.direct.evaluation_context import DirectStepContext, DirectUnmergedState
from apache_beam.runners.direct.transform_evaluator import _TransformEvaluator
from apache_beam.runners.direct.util import TimerFiring
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.transforms.window import GlobalWindow
from apache_beam.utils.timestamp import Timestamp

from pipeline.beam import direct_runner
from pipeline.beam.direct_bundles import _KeyedStates

WINDOW = GlobalWindow()
KEY = b"run"


class _Bundle(_TransformEvaluator):
    """A bundle's evaluator as the runner makes one for a step, on copies of the committed keyed
    states; it records the timers delivered to it."""

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
    direct_runner.deliver_timers_once()
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
    direct_runner.deliver_timers_once()
    committed = _KeyedStates()
    committed[KEY] = _with_timer(20)  # found due at 10, then a message set it for 20
    bundle = _Bundle(committed)
    bundle.process_timer_wrapper(_firing(10))
    bundle.process_timer_wrapper(_firing(20))
    assert bundle.delivered == [Timestamp.of(20)]
