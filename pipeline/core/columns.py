"""An attempt's int64 columns (step numbers, step times, seqs; observations' columns), whose older
values may be archived: stored apart and read only when something asks for them.

A run's state in a stream is read by every message; what an ordinary message and snapshot need of
a column is its newest values (the steps since the last snapshot, the last step) and a few at its
start (the first two steps: program startup). So a ``Column`` holds a *tail* of recent values in
memory and, before it, ``archived`` values it does not hold until one is asked for: then it calls
its loader once for them all (``pipeline.core.state_coder`` stores them in chunks of their own).
Its first two and its last archived value are kept beside the tail, so those reads load nothing.

A column answers as the ``array('q')`` it replaces: by index, slice, iteration and bisection
(``bisect_right``/``bisect_left``, which search the tail first: a search for the latest time
loads nothing). A change anywhere but at its end (a late event) loads the archive and takes the
column back into memory whole.
"""

from __future__ import annotations

import bisect
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, overload

import numpy as np

#: Reads a column's archived values (all of them, in order).
Loader = Callable[[], "array[int]"]


class ArchiveMissing(LookupError):
    """A column's archived values were asked for, and it has no loader to read them with."""


class Column(Sequence[int]):
    """An int64 column: ``archived`` values kept apart (loaded on first need) and a tail in
    memory (see the module docstring). ``typecode`` is the ``array`` type of its values."""

    __slots__ = ("_archived", "_edges", "_head", "_tail", "load", "moved", "typecode")

    def __init__(self, values: Iterable[int] = (), typecode: str = "q") -> None:
        self.typecode = typecode
        self._tail = array(typecode, values)
        self._archived = 0
        self._edges: tuple[int, ...] = ()  # archived values 0, 1 and the last (as many as there are)
        self._head: array[int] | None = None  # the archived values, once loaded
        self.load: Loader | None = None
        self.moved = False  # whether archived values were taken back into the tail

    # -- the archive ------------------------------------------------------------------------

    @property
    def archived(self) -> int:
        """How many values come before the tail."""
        return self._archived

    @property
    def tail(self) -> array[int]:
        """The values in memory after the archived ones."""
        return self._tail

    @property
    def edges(self) -> tuple[int, ...]:
        """The first two and the last archived value (fewer when fewer are archived)."""
        return self._edges

    def restore(self, archived: int, edges: Iterable[int], load: Loader | None) -> None:
        """Puts ``archived`` values, read by ``load`` when needed, before the column's values
        (a column decoded from a state's hot part: its tail)."""
        self._archived, self._edges, self._head, self.load = archived, tuple(edges), None, load

    def seal(self, keep: int, chunk: int) -> array[int]:
        """Archives the tail's oldest values, whole chunks of ``chunk`` of them, leaving at least
        ``keep`` in the tail; returns the values archived now (nothing if fewer than a chunk)."""
        count = max(0, len(self._tail) - keep) // chunk * chunk
        if not count:
            return array(self.typecode)
        sealed = self._tail[:count]
        del self._tail[:count]
        if self._head is not None:
            self._head.extend(sealed)
        start = self._archived
        self._archived += count
        known = dict(zip((0, 1, start - 1), self._edges, strict=False)) if start else {}
        known.update((start + i, sealed[i]) for i in (0, 1) if i < count)
        known[self._archived - 1] = sealed[-1]
        self._edges = tuple(known[i] for i in sorted({0, 1, self._archived - 1}) if i < self._archived)
        return sealed

    def _all(self) -> array[int]:
        """Every value, the archive read if it must be."""
        if not self._archived:
            return self._tail
        if self._head is None:
            if self.load is None:
                raise ArchiveMissing("the column's archived values cannot be read: no loader")
            head = self.load()
            if len(head) != self._archived:
                raise ValueError(f"the archive holds {len(head)} values of a column that archived "
                                 f"{self._archived}")
            self._head = array(self.typecode, head)
        return self._head + self._tail

    def unarchive(self) -> array[int]:
        """Takes every value back into the tail (before a change other than an append)."""
        if self._archived:
            self._tail = self._all()
            self._archived, self._edges, self._head, self.moved = 0, (), None, True
        return self._tail

    # -- as an array ------------------------------------------------------------------------

    def __len__(self) -> int:
        return self._archived + len(self._tail)

    @overload
    def __getitem__(self, index: int) -> int: ...

    @overload
    def __getitem__(self, index: slice) -> array[int]: ...

    def __getitem__(self, index: int | slice) -> Any:
        archived = self._archived
        if not isinstance(index, slice):  # the engine's every step: kept short
            if index >= archived:
                return self._tail[index - archived]
            if index < 0 and -index <= len(self._tail):
                return self._tail[index]
            return self._archived_value(index + len(self) if index < 0 else index)
        start, stop, step = index.indices(len(self))
        if start >= archived and step == 1:
            return self._tail[start - archived:max(start, stop) - archived]
        return self._all()[index]

    def _archived_value(self, index: int) -> int:
        """The value at ``index``, before the tail: kept beside it, or read from the archive."""
        if index < 0:
            raise IndexError("column index out of range")
        if self._head is None:
            for at, value in zip((0, 1, self._archived - 1), self._edges, strict=False):
                if at == index:
                    return value
        return self._all()[index]

    def __iter__(self) -> Iterator[int]:
        return iter(self._all())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Column):
            return len(self) == len(other) and self._all() == other._all()
        if isinstance(other, array):
            return self._all() == other
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Column({len(self)} values, {self._archived} archived)"

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        return np.frombuffer(self._all(), dtype=np.dtype(self.typecode)).astype(dtype or self.typecode)

    def append(self, value: int) -> None:
        self._tail.append(value)

    def extend(self, values: Iterable[int]) -> None:
        self._tail.extend(values)

    def insert(self, index: int, value: int) -> None:
        if index >= self._archived:
            self._tail.insert(index - self._archived, value)
        else:
            self.unarchive().insert(index, value)

    def __delitem__(self, index: int | slice) -> None:
        if isinstance(index, int):
            index = index + len(self) if index < 0 else index
            if index >= self._archived:
                del self._tail[index - self._archived]
                return
        del self.unarchive()[index]

    def __setitem__(self, index: slice, values: array[int]) -> None:
        self.unarchive()[index] = values

    def bisect_right(self, value: float, lo: int = 0, hi: int | None = None) -> int:
        """``bisect.bisect_right`` over the column (sorted in ``[lo, hi)``), the tail searched
        first: a value at or past the last archived one loads nothing."""
        return self._bisect(bisect.bisect_right, value, lo, hi, lambda last: value >= last)

    def bisect_left(self, value: float, lo: int = 0, hi: int | None = None) -> int:
        """``bisect.bisect_left``, as ``bisect_right`` searches."""
        return self._bisect(bisect.bisect_left, value, lo, hi, lambda last: value > last)

    def _bisect(self, search: Callable[..., int], value: float, lo: int, hi: int | None,
                past: Callable[[int], bool]) -> int:
        archived, hi = self._archived, len(self) if hi is None else hi
        if lo >= archived or (hi > archived and past(self[archived - 1])):
            return archived + search(self._tail, value, max(lo, archived) - archived, hi - archived)
        return search(self._all(), value, lo, hi)


def bisect_right(values: Sequence[int], value: float, lo: int = 0, hi: int | None = None) -> int:
    """``bisect.bisect_right`` over an attempt's column or a plain array."""
    if isinstance(values, Column):
        return values.bisect_right(value, lo, hi)
    return bisect.bisect_right(values, value, lo, len(values) if hi is None else hi)


def bisect_left(values: Sequence[int], value: float, lo: int = 0, hi: int | None = None) -> int:
    """``bisect.bisect_left`` over an attempt's column or a plain array."""
    if isinstance(values, Column):
        return values.bisect_left(value, lo, hi)
    return bisect.bisect_left(values, value, lo, len(values) if hi is None else hi)
