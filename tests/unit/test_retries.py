"""A sink's requests keep the bound of a local stop (``pipeline.sinks.retries``)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
from google.api_core import exceptions

from pipeline.sinks.retries import backoff, call_with_retries, stop_requests_by

#: A request's timeout, as the sinks give it: far past any bound here.
TIMEOUT_S = 60.0


@pytest.fixture(autouse=True)
def no_bound() -> Iterator[None]:
    """Each test sets the process's bound itself; none is left for the next."""
    yield
    stop_requests_by(None)


def retrying(call, give_up) -> None:
    call_with_retries(call, lambda error: True, time.monotonic() + 120, backoff(0.01, 0.01), give_up,
                      TIMEOUT_S)


def test_a_request_under_way_when_the_stops_bound_passes_is_abandoned():
    """A request made before the stop, given its full timeout, is no longer waited for once the
    stop's bound passes."""
    stopping, answered = threading.Event(), threading.Event()

    def never_answered(timeout: float) -> None:
        answered.wait(timeout)

    def stop() -> None:
        time.sleep(0.2)
        stop_requests_by(time.monotonic() + 0.3)
        stopping.set()

    threading.Thread(target=stop, daemon=True).start()
    began = time.monotonic()
    try:
        with pytest.raises(exceptions.RetryError, match="bound has passed") as raised:
            retrying(never_answered, stopping.is_set)
    finally:
        answered.set()
    assert time.monotonic() - began < 2.0
    assert "got no answer" in str(raised.value)


def test_no_request_is_made_once_the_stops_bound_has_passed():
    """Past the stop's bound a request is not sent: the caller learns so at once."""
    calls: list[float] = []
    stop_requests_by(time.monotonic() - 1.0)
    with pytest.raises(exceptions.RetryError, match="was not sent"):
        retrying(lambda timeout: calls.append(timeout), lambda: True)
    assert calls == []


def test_a_request_made_while_stopping_waits_no_longer_than_the_time_left():
    """A request made once the job is stopping is given what is left to the stop's bound, not its
    full timeout."""
    timeouts: list[float] = []
    stop_requests_by(time.monotonic() + 2.0)
    retrying(lambda timeout: timeouts.append(timeout), lambda: True)
    assert len(timeouts) == 1 and 1.0 < timeouts[0] <= 2.0


def test_a_job_that_is_not_stopping_gives_a_request_its_full_timeout():
    """The bound applies only once the job is stopping."""
    timeouts: list[float] = []
    stop_requests_by(time.monotonic() + 2.0)
    retrying(lambda timeout: timeouts.append(timeout), lambda: False)
    assert timeouts == [TIMEOUT_S]
