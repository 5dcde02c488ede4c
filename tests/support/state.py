"""Beam's state cells and timers over memory, for calling a stateful DoFn's methods as a runner
would and reading what it left behind."""

from __future__ import annotations

from typing import Any

from apache_beam.utils.timestamp import Timestamp


class Cell:
    """A Beam state cell's interface over memory: a value (read, write, clear) or a bag (read,
    add, clear)."""

    def __init__(self, value: Any = None) -> None:
        self.value, self.items = value, []

    def read(self) -> Any:
        return self.value

    def write(self, value: Any) -> None:
        self.value = value

    def add(self, item: Any) -> None:
        self.items.append(item)

    def clear(self) -> None:
        self.value, self.items = None, []


class Bag(Cell):
    def read(self) -> Any:
        return list(self.items)


class Timer:
    """A timer's interface over memory: the times it was set for, in microseconds, or None once
    cleared."""

    def __init__(self) -> None:
        self.times: list[int | None] = []

    def set(self, timestamp: Timestamp) -> None:
        self.times.append(timestamp.micros)

    def clear(self) -> None:
        self.times.append(None)
