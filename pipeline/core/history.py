"""A run's step history, compact and in chunks: the cold part of its state.

Every step an attempt records stays in its state (step number, start time, seq), so that a
restart, a late event or a restore can recount what came before. Kept as raw int64 that is 24
bytes a step, and a state written whole grows with the run. Here the history is a list of
sealed chunks of ``CHUNK_STEPS`` steps each, written once when full and never rewritten, plus
an open tail of fewer steps that stays with the hot state. A small index of the sealed chunks
(their step and time bounds) says which chunks a step or time range needs, so a reader loads
only those (``StepHistory.select_steps``, ``select_times``).

The chunk codec (``encode_chunk``) stores each int64 column as its first value and its deltas
less a reference delta (the median one, so a run stepping steadily leaves residuals near zero),
zig-zag mapped to unsigned, split into byte planes (the low bytes of every value, then the next
bytes, ... up to the widest residual's), each plane compressed on its own with raw deflate in
run-length mode. Measured on 1 s steps whose µs times are jittered by ±1 ms, seqs 1-3 apart:

* 1.73 bytes a step for the three columns (times 1.48, seqs 0.25, steps 0.004), against 2.04
  for the same planes deflated in one stream: one stream shares one Huffman table between the
  near-random low plane of the times, their skewed high plane and the seqs' planes; a plane
  on its own gets a table of its own, and run-length mode codes the all-but-constant planes
  in a few bytes without searching for matches that random bytes do not have.
* Deltas, not deltas of deltas (1.83): the latter count each time's deviation three times where
  times jitter around a schedule, twice where they are sums of jittered step durations (1.65
  against 1.73 then).
* zlib, not zstd (which apache-beam installs): per plane, zstd at level 3 takes 1.81 bytes a step,
  at level 19 1.70 for three to four times the encoding time, and the engine's core imports
  nothing beyond numpy and the standard library.

The same codec takes any three int64 columns: an attempt's observations store their kinds,
times and seqs with it (their fingerprints are random 64-bit hashes, which no codec shrinks).
"""

from __future__ import annotations

import bisect
import dataclasses
import zlib
from array import array
from collections.abc import Callable, Iterable, Sequence

import numpy as np
import numpy.typing as npt

#: Steps a chunk holds when sealed. A chunk's fixed cost (its header and each plane's Huffman
#: table) is about 65 bytes, so at 4,096 steps a steady run takes 1.73 bytes a step, within 1%
#: of what larger chunks reach (1.78 at 1,024, 1.98 at 256); the index costs 3 to 5 bytes a chunk,
#: about 5 KB for 5,000,000 steps; and a late event, which loads the one chunk it falls in, reads
#: about 7 KB (four times that at 16,384 steps, for 1% less). 1 s steps seal one every 68 minutes.
CHUNK_STEPS = 4096

Columns = tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64]]
#: A column as callers hold one: a numpy array, an ``array("q")``, a list of ints.
IntColumn = Sequence[int] | npt.NDArray[np.int64]
Loader = Callable[[int], bytes]

_CHUNK_MAGIC = b"GPH1"
_INDEX_MAGIC = b"GPX1"
_LEVEL = 9  # run-length mode gave the same sizes at levels 1, 6 and 9, in the same time
_U1 = np.uint64(1)


@dataclasses.dataclass(frozen=True)
class Chunk:
    """A sealed chunk in the index: its key (``chunk_id``), how many steps it holds, and their
    bounds. Steps are bounded by their smallest and largest number, not the first and last:
    after a restart the numbers go back within a chunk. Times are in order (first <= last)."""

    chunk_id: int
    count: int
    min_step: int
    max_step: int
    first_time_us: int
    last_time_us: int


def encode_chunk(steps: IntColumn, times: IntColumn, seqs: IntColumn) -> bytes:
    """Three int64 columns of one length as compact bytes (see the module docstring); any
    values, in any order. Deterministic: the same columns give the same bytes (with one zlib;
    another may deflate differently, and either decodes the other's)."""
    return _CHUNK_MAGIC + _encode_columns([_column(steps), _column(times), _column(seqs)])


def decode_chunk(data: bytes) -> Columns:
    """The columns (steps, times, seqs) that ``encode_chunk`` encoded."""
    steps, times, seqs = _decode_columns(data, _CHUNK_MAGIC, 3, "not an encoded step-history chunk")
    return steps, times, seqs


def index_to_bytes(chunks: Sequence[Chunk]) -> bytes:
    """The index of sealed chunks as compact, deterministic bytes: its six columns (id, count,
    step and time bounds) through the chunk codec, so a steady run's index costs a few bytes a
    chunk."""
    fields = [field.name for field in dataclasses.fields(Chunk)]
    columns = [np.array([getattr(chunk, name) for chunk in chunks], dtype=np.int64) for name in fields]
    return _INDEX_MAGIC + _encode_columns(columns)


def index_from_bytes(data: bytes) -> list[Chunk]:
    """The index that ``index_to_bytes`` encoded."""
    width = len(dataclasses.fields(Chunk))
    columns = _decode_columns(data, _INDEX_MAGIC, width, "not an encoded chunk index")
    return [Chunk(*row) for row in zip(*(column.tolist() for column in columns), strict=True)]


def read_chunks(chunks: Iterable[Chunk], load: Loader) -> Columns:
    """The columns of ``chunks``, one after the other, each read with ``load(chunk_id)``."""
    parts: list[Columns] = []
    for chunk in chunks:
        part = decode_chunk(load(chunk.chunk_id))
        if len(part[0]) != chunk.count:
            raise ValueError(f"chunk {chunk.chunk_id} holds {len(part[0])} steps, not {chunk.count}")
        parts.append(part)
    if not parts:
        return _empty(), _empty(), _empty()
    steps, times, seqs = (np.concatenate(column) for column in zip(*parts, strict=True))
    return steps, times, seqs


class StepHistory:
    """An attempt's steps (number, time, seq) in time order: sealed chunks and an open tail.

    ``append``/``extend`` add steps at or after the last one's time and return the chunks they
    sealed, with their bytes, for the caller to store under ``chunk_id`` (written once, never
    again). The index (``chunks``) and the tail are the hot part of the history; restore a
    history from them with the constructor.
    """

    def __init__(self, chunks: Sequence[Chunk] = (),
                 tail: tuple[IntColumn, IntColumn, IntColumn] | None = None,
                 chunk_steps: int = CHUNK_STEPS) -> None:
        if chunk_steps < 1:
            raise ValueError("a chunk holds at least one step")
        self.chunk_steps = chunk_steps
        self._chunks: list[Chunk] = []
        self._first_times: list[int] = []
        self._last_times: list[int] = []
        self._reach: list[int] = []  # the largest step number up to each chunk: ascending
        self._floor: list[int] = []  # the smallest step number from each chunk on: ascending
        self._next_id = 0
        for chunk in chunks:
            self._index(chunk)
        # Appended to one step at a time: arrays, amortized O(1) an append.
        self._tail = [array("q", _column(column).tobytes()) for column in tail or ((), (), ())]
        if len(self._tail[0]) >= chunk_steps:
            raise ValueError(f"a tail of {len(self._tail[0])} steps would have been sealed")

    @property
    def chunks(self) -> tuple[Chunk, ...]:
        """The sealed chunks, oldest first."""
        return tuple(self._chunks)

    @property
    def tail(self) -> Columns:
        """The steps not yet sealed: (steps, times, seqs)."""
        steps, times, seqs = (np.array(column, dtype=np.int64) for column in self._tail)
        return steps, times, seqs

    def __len__(self) -> int:
        return sum(chunk.count for chunk in self._chunks) + len(self._tail[0])

    def append(self, step: int, time_us: int, seq: int) -> list[tuple[Chunk, bytes]]:
        """Adds one step; the chunk it sealed, if it filled one."""
        return self.extend([step], [time_us], [seq])

    def extend(self, steps: IntColumn, times: IntColumn, seqs: IntColumn) -> list[tuple[Chunk, bytes]]:
        """Adds steps in time order, at or after the last step's time; the chunks they sealed."""
        new = [_column(steps), _column(times), _column(seqs)]
        if not len(new[0]) == len(new[1]) == len(new[2]):
            raise ValueError("steps, times and seqs differ in length")
        added_times, last = new[1], self._last_time()
        if bool(np.any(added_times[1:] < added_times[:-1])) or (
                len(added_times) and last is not None and int(added_times[0]) < last):
            raise ValueError("steps are added in time order")
        size = self.chunk_steps
        full = (len(self._tail[0]) + len(added_times)) // size * size  # the steps these seal
        if not full:
            for column, added in zip(self._tail, new, strict=True):
                column.frombytes(added.tobytes())
            return []
        steps_, times_, seqs_ = (np.concatenate([np.array(old, dtype=np.int64), added])
                                 for old, added in zip(self._tail, new, strict=True))
        sealed = [self._seal(steps_[at:at + size], times_[at:at + size], seqs_[at:at + size])
                  for at in range(0, full, size)]
        self._tail = [array("q", column[full:].tobytes()) for column in (steps_, times_, seqs_)]
        return sealed

    def chunks_for_steps(self, lo: int, hi: int) -> list[Chunk]:
        """The sealed chunks whose steps span part of ``lo`` to ``hi`` (both included): every
        chunk that holds a step numbered so, and perhaps one whose steps skip over the range
        (steps recorded sparsely, or numbers going back after a restart).

        Found by binary search: the chunks between the first that reaches ``lo`` and the last
        from which a step at or below ``hi`` follows, less any between whose span lies outside
        (only after a restart do any)."""
        start = bisect.bisect_left(self._reach, lo)
        stop = bisect.bisect_right(self._floor, hi)
        return [chunk for chunk in self._chunks[start:stop] if chunk.min_step <= hi and chunk.max_step >= lo]

    def chunks_for_times(self, lo_us: int, hi_us: int) -> list[Chunk]:
        """The sealed chunks whose times span part of ``lo_us`` to ``hi_us`` (both included):
        every chunk that holds a step timed so, and perhaps one with a pause over the range."""
        start = bisect.bisect_left(self._last_times, lo_us)
        stop = bisect.bisect_right(self._first_times, hi_us)
        return self._chunks[start:stop]

    def select_steps(self, lo: int, hi: int, load: Loader) -> Columns:
        """The steps numbered ``lo`` to ``hi`` (both included), in time order, reading only the
        chunks that hold some (a restart at step R reads ``select_steps(R, max, load)``)."""
        chunks = self.chunks_for_steps(lo, hi)
        return _within(self._with_tail(read_chunks(chunks, load)), 0, lo, hi)

    def select_times(self, lo_us: int, hi_us: int, load: Loader) -> Columns:
        """The steps timed ``lo_us`` to ``hi_us`` (both included), reading only the chunks that
        hold some."""
        chunks = self.chunks_for_times(lo_us, hi_us)
        return _within(self._with_tail(read_chunks(chunks, load)), 1, lo_us, hi_us)

    def _seal(self, steps: npt.NDArray[np.int64], times: npt.NDArray[np.int64],
              seqs: npt.NDArray[np.int64]) -> tuple[Chunk, bytes]:
        chunk = Chunk(self._next_id, len(steps), int(steps.min()), int(steps.max()),
                      int(times[0]), int(times[-1]))
        self._index(chunk)
        return chunk, encode_chunk(steps, times, seqs)

    def _index(self, chunk: Chunk) -> None:
        """Adds a sealed chunk to the index and to the bounds that binary searches read."""
        self._chunks.append(chunk)
        self._first_times.append(chunk.first_time_us)
        self._last_times.append(chunk.last_time_us)
        self._reach.append(max(chunk.max_step, self._reach[-1]) if self._reach else chunk.max_step)
        # The floors of earlier chunks fall to this chunk's smallest step where they were above
        # it: none while step numbers only grow.
        at = len(self._floor)
        while at and self._floor[at - 1] > chunk.min_step:
            at -= 1
            self._floor[at] = chunk.min_step
        self._floor.append(chunk.min_step)
        self._next_id = max(self._next_id, chunk.chunk_id + 1)

    def _last_time(self) -> int | None:
        if len(self._tail[1]):
            return int(self._tail[1][-1])
        return self._chunks[-1].last_time_us if self._chunks else None

    def _with_tail(self, columns: Columns) -> Columns:
        steps, times, seqs = (np.concatenate(pair) for pair in zip(columns, self.tail, strict=True))
        return steps, times, seqs


def _within(columns: Columns, by: int, lo: int, hi: int) -> Columns:
    """The rows of ``columns`` whose column ``by`` lies within ``lo`` to ``hi``."""
    keep = (columns[by] >= lo) & (columns[by] <= hi)
    steps, times, seqs = (column[keep] for column in columns)
    return steps, times, seqs


def _column(values: IntColumn) -> npt.NDArray[np.int64]:
    return np.ascontiguousarray(np.asarray(values, dtype=np.int64))


def _empty() -> npt.NDArray[np.int64]:
    return np.empty(0, dtype=np.int64)


def _encode_columns(columns: Sequence[npt.NDArray[np.int64]]) -> bytes:
    """Columns of one length: the count, then each column's first value, reference delta and
    plane count (varints), then each compressed plane, framed by its length."""
    count = len(columns[0]) if columns else 0
    if any(len(column) != count for column in columns):
        raise ValueError("the columns differ in length")
    head = [_varint(count)]
    planes: list[bytes] = []
    for column in columns:
        if not count:
            continue
        first, reference, column_planes = _planes(column)
        head += [_varint(_zigzag(first)), _varint(_zigzag(reference)), _varint(len(column_planes))]
        for plane in column_planes:
            packed = _compress(plane)
            planes += [_varint(len(packed)), packed]
    return b"".join(head + planes)


def _decode_columns(data: bytes, magic: bytes, width: int, refusal: str) -> list[npt.NDArray[np.int64]]:
    """The ``width`` columns ``_encode_columns`` encoded after ``magic``."""
    if data[:len(magic)] != magic:
        raise ValueError(refusal)
    reader = _Reader(data, len(magic), refusal)
    count = reader.varint()
    if not count:
        reader.end()
        return [_empty() for _ in range(width)]
    heads = [(_unzigzag(reader.varint()), _unzigzag(reader.varint()), reader.varint()) for _ in range(width)]
    columns = []
    for first, reference, plane_count in heads:
        if plane_count > 8:
            raise ValueError(f"{refusal}: {plane_count} byte planes")
        planes = [_decompress(reader.take(reader.varint()), count - 1, refusal) for _ in range(plane_count)]
        columns.append(_from_planes(first, reference, planes, count))
    reader.end()
    return columns


def _planes(column: npt.NDArray[np.int64]) -> tuple[int, int, list[bytes]]:
    """A column's first value, its reference delta, and the byte planes of its residuals (the
    deltas less the reference, zig-zag mapped), low bytes first, as many as the widest needs.
    The arithmetic wraps modulo 2**64, so any int64 values round-trip."""
    values = column.view(np.uint64)
    deltas = values[1:] - values[:-1]
    if not len(deltas):
        return int(column[0]), 0, []
    signed = deltas.view(np.int64)
    middle = len(signed) // 2
    reference = int(np.partition(signed, middle)[middle])
    residuals = (deltas - np.int64(reference).view(np.uint64)).view(np.int64)
    mapped = ((residuals << 1) ^ (residuals >> 63)).view(np.uint64)
    width = (int(mapped.max()).bit_length() + 7) // 8
    planes = mapped.astype("<u8").view(np.uint8).reshape(-1, 8)[:, :width].T
    return int(column[0]), reference, [plane.tobytes() for plane in planes]


def _from_planes(first: int, reference: int, planes: list[bytes], count: int) -> npt.NDArray[np.int64]:
    """The column whose first value, reference delta and residuals' planes these are."""
    grid = np.zeros((count - 1, 8), dtype=np.uint8)
    for at, plane in enumerate(planes):
        grid[:, at] = np.frombuffer(plane, dtype=np.uint8)
    mapped = grid.view("<u8").reshape(-1).astype(np.uint64)
    residuals = (mapped >> _U1) ^ (np.uint64(0) - (mapped & _U1))
    deltas = residuals + np.int64(reference).view(np.uint64)
    values = np.empty(count, dtype=np.uint64)
    values[0] = np.int64(first).view(np.uint64)
    np.cumsum(deltas, out=values[1:])
    values[1:] += values[0]
    return values.view(np.int64)


def _compress(plane: bytes) -> bytes:
    packer = zlib.compressobj(_LEVEL, zlib.DEFLATED, -15, 9, zlib.Z_RLE)
    return packer.compress(plane) + packer.flush()


def _decompress(packed: bytes, size: int, refusal: str) -> bytes:
    unpacker = zlib.decompressobj(-15)
    try:
        plane = unpacker.decompress(packed, size + 1)
    except zlib.error as error:
        raise ValueError(f"{refusal}: {error}") from None
    if len(plane) != size or not unpacker.eof or unpacker.unused_data:
        raise ValueError(f"{refusal}: a byte plane of the wrong size")
    return plane


def _zigzag(value: int) -> int:
    return (value << 1) ^ (value >> 63)


def _unzigzag(value: int) -> int:
    return (value >> 1) ^ -(value & 1)


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


class _Reader:
    """Reads varints and framed bytes from an encoding, refusing one that ends too soon or
    goes on too long."""

    def __init__(self, data: bytes, offset: int, refusal: str) -> None:
        self.data, self.offset, self.refusal = data, offset, refusal

    def varint(self) -> int:
        value = shift = 0
        while True:
            if self.offset >= len(self.data) or shift > 63:
                raise ValueError(f"{self.refusal}: truncated")
            byte = self.data[self.offset]
            self.offset += 1
            value |= (byte & 0x7F) << shift
            shift += 7
            if byte < 0x80:
                if value >> 64:
                    raise ValueError(f"{self.refusal}: a number over 64 bits")
                return value

    def take(self, size: int) -> bytes:
        if self.offset + size > len(self.data):
            raise ValueError(f"{self.refusal}: truncated")
        self.offset += size
        return self.data[self.offset - size:self.offset]

    def end(self) -> None:
        if self.offset != len(self.data):
            raise ValueError(f"{self.refusal}: {len(self.data) - self.offset} bytes after its end")
