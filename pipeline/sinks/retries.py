"""Retrying a sink's request: exponential backoff with full jitter, within a deadline, and no
further try once the job is stopping.

``google.api_core.retry`` sleeps between tries without looking up: a stream that begins to stop
while a write backs off would wait for the write's whole deadline (a minute, for Cloud
Monitoring) before it could stop. Here a pause ends as soon as ``give_up()`` is true, and so does
the retrying.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

T = TypeVar("T")

#: How often a pause between tries asks whether to give up.
GIVE_UP_POLL_S = 0.1


def never() -> bool:
    """The ``give_up`` of a job that never stops early: a batch run, a job that drains."""
    return False


def backoff(initial_s: float, maximum_s: float) -> Iterator[float]:
    """Pauses with full jitter, as ``google.api_core.retry`` makes them: uniform up to a ceiling
    that doubles from ``initial_s`` to ``maximum_s``."""
    ceiling = initial_s
    while True:
        yield random.uniform(0.0, ceiling)
        ceiling = min(ceiling * 2.0, maximum_s)


def pause(seconds: float, give_up: Callable[[], bool] = never) -> bool:
    """Sleeps ``seconds``, or less if ``give_up()`` turns true meanwhile; whether it slept them."""
    end = time.monotonic() + seconds
    while not give_up():
        left = end - time.monotonic()
        if left <= 0:
            return True
        time.sleep(min(left, GIVE_UP_POLL_S))
    return False


def call_with_retries(call: Callable[[], T], retryable: Callable[[Exception], bool], deadline: float,
                      pauses: Iterator[float], give_up: Callable[[], bool] = never) -> T:
    """``call()``'s result, trying again after each error that ``retryable`` accepts until the
    monotonic ``deadline`` passes or ``give_up()`` is true; then a ``RetryError`` whose cause is
    the last error. An error it does not accept is raised as it is."""
    from google.api_core import exceptions

    while True:
        try:
            return call()
        except Exception as error:
            if not retryable(error):
                raise
            wait = next(pauses)
            if give_up() or time.monotonic() + wait >= deadline or not pause(wait, give_up):
                reason = "the job is stopping" if give_up() else "its deadline passed"
                raise exceptions.RetryError(  # type: ignore[no-untyped-call]
                    f"gave up retrying ({reason}); last error: {error}", error) from error
