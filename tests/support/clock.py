"""A clock a test moves on by hand, for a stand-in whose time the test controls."""

from __future__ import annotations


class ManualClock:
    """Says ``now`` (seconds since the epoch) until the test sets it."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now
