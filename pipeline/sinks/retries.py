"""Retrying a sink's request: exponential backoff with full jitter, within a deadline, and no
further try once the job is stopping; and no request past the bound of a stop.

``google.api_core.retry`` sleeps between tries without looking up: a stream that begins to stop
while a write backs off would wait for the write's whole deadline (a minute, for Cloud
Monitoring) before it could stop. Here a pause ends as soon as ``give_up()`` is true, and so does
the retrying.

And a service that takes a request and never answers (a stalled server) holds it for its
timeout, a minute for BigQuery, and then the dead letters of what it carried for as long: a
local stream that printed the bound of its stop broke it by a minute or more, and on the
DirectRunner, which runs one bundle at a time, everything behind the request waited too, the
DuckDB writes of what was read among them. So a local stop sets a bound for requests
(``stop_requests_by``): once the job is stopping, a request is given no more than the time left
to it, none is made once it has passed, and one under way then (made before the stop, with its
full timeout) is abandoned unanswered. Either way the caller gets a ``RetryError`` and hands on
what the request carried as not written (a dead letter, or a logged and counted row).

That is the local runner's way, where a failed bundle stops the pipeline. On Dataflow a failed
work item is retried until it succeeds, and Pub/Sub's messages are acknowledged once the first
stage's output is durable, so a bundle that succeeds without its rows has lost them: there a sink
raises ``WriteFailed`` for what it could not write (``pipeline.beam.transforms.fails_work_items``)
and the runner's retry writes it, idempotently.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from typing import TypeVar

T = TypeVar("T")

#: How often a pause between tries, or a wait for an answer, asks whether to give up.
GIVE_UP_POLL_S = 0.1
#: The monotonic time by which the requests of this process's stopping job end (``stop_requests_by``).
_stop_by: float | None = None


def never() -> bool:
    """The ``give_up`` of a job that never stops early: a batch run, a job that drains."""
    return False


def stop_requests_by(deadline: float | None) -> None:
    """From now on, in this process, a request made with a ``give_up()`` that is true ends by the
    monotonic ``deadline`` (see the module docstring); None lifts the bound (a new job)."""
    global _stop_by
    _stop_by = deadline


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


def call_with_retries(call: Callable[..., T], retryable: Callable[[Exception], bool], deadline: float,
                      pauses: Iterator[float], give_up: Callable[[], bool] = never,
                      timeout_s: float = 60.0) -> T:
    """``call(timeout=...)``'s result, trying again after each error that ``retryable`` accepts
    until the monotonic ``deadline`` passes or ``give_up()`` is true; then a ``RetryError`` whose
    cause is the last error. An error it does not accept is raised as it is. A try is given
    ``timeout_s``; once ``give_up()`` is true, no more than is left to the stop's bound, and past
    it no try is made and one under way is abandoned (a ``RetryError`` too)."""
    from google.api_core import exceptions

    while True:
        bound = _bound(give_up)
        left_s = timeout_s if bound is None else min(timeout_s, bound - time.monotonic())
        try:
            if left_s <= 0:
                raise _PastBound("the request was not sent")
            return _answer(call, left_s, give_up)
        except _PastBound as past:
            raise exceptions.RetryError(  # type: ignore[no-untyped-call]
                "gave up: the job is stopping and its bound has passed", past) from None
        except Exception as error:
            if not retryable(error):
                raise
            wait = next(pauses)
            if give_up() or time.monotonic() + wait >= deadline or not pause(wait, give_up):
                reason = "the job is stopping" if give_up() else "its deadline passed"
                raise exceptions.RetryError(  # type: ignore[no-untyped-call]
                    f"gave up retrying ({reason}); last error: {error}", error) from error


class WriteFailed(Exception):
    """What a sink could not write for a reason another try may remove (an outage past its
    retries, a missing table, a permission), raised where the runner retries the work item: the
    retry writes it, and what the failed try wrote already is not written twice."""


class _PastBound(Exception):
    """A request not made, or not waited for, once the stop's bound passed."""


def _bound(give_up: Callable[[], bool]) -> float | None:
    """The monotonic time by which a request ends: the stop's bound, once the job is stopping."""
    bound = _stop_by
    return bound if bound is not None and give_up() else None


def _answer(call: Callable[..., T], timeout_s: float, give_up: Callable[[], bool]) -> T:
    """``call(timeout=timeout_s)``'s result. A job that may stop early makes it on a thread of its
    own, and waits for it only until the stop's bound (``_PastBound``): a request made before the
    stop has its full timeout, which may end past the bound."""
    if give_up is never:
        return call(timeout=timeout_s)
    answer: futures.Future[T] = futures.Future()

    def make() -> None:
        try:
            answer.set_result(call(timeout=timeout_s))
        except BaseException as error:  # noqa: BLE001 -- the caller's to handle, on its thread
            answer.set_exception(error)

    threading.Thread(target=make, name="sink-request", daemon=True).start()
    while not futures.wait([answer], GIVE_UP_POLL_S).done:
        bound = _bound(give_up)
        if bound is not None and time.monotonic() >= bound:
            raise _PastBound("the request got no answer (it may still be carried out)")
    return answer.result()

