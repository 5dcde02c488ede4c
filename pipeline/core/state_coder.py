"""The state coder: a run's state as compact, deterministic bytes, for Beam state.

A run's state is two parts, so that a message costs the same at any length of the run:

* the *hot* part (``encode_state``), which every message of the run reads: a JSON header holds
  everything but the step history, the observations and the step statistics (the anomaly
  detector's and the host scorer's state included); each attempt's step columns (numbers,
  times, seqs) and observation columns (seqs, times, fingerprints, kinds) follow, each group
  packed (``pipeline.core.packing``: a couple of bytes a step; 8 a fingerprint). Of the step
  columns it holds only their tails (``pipeline.core.columns``): the values sealed into the
  archive are counted, and their first two and last values kept, in the header; of the
  observations, only the tail (``seal``); the step statistics follow, as
  ``BoundedStepStatistics.to_bytes`` gives them (a few kB);
* the *archive* (``seal``): chunks of ``CHUNK`` sealed values of an attempt's step columns,
  packed alike, each written once, as its own entry, when ``seal`` makes it. A state decoded
  from its hot part reads the archive (``decode_state``'s ``archive``) only when the engine asks
  for a sealed value: for a restart's wasted progress, a late step, a redelivery of an old one.

A message added since the state was last encoded whole is encoded on its own
(``encode_batch``): a JSON header with its events other than step starts, then the step starts'
seqs, times and steps as int64 arrays. A run's state in Beam is the hot part, the archive and
those messages (``pipeline.beam.live``).
"""

from __future__ import annotations

import dataclasses
import json
import struct
import sys
from array import array
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from pipeline.core.columns import ArchiveMissing, Column
from pipeline.core.detect import Detector, HostScorer
from pipeline.core.engine import Attempt, RunState
from pipeline.core.events import Batch, Event
from pipeline.core.packing import pack_columns, unpack_columns
from pipeline.core.stepstats import BoundedStepStatistics

_HEADER = struct.Struct("<4sI")
_MAGIC = b"GPS2"
_EARLIER_MAGIC = b"GPS1"  # a state of the version before the archive
_BATCH_MAGIC = b"GPB1"
_CHUNK_MAGIC = b"GPC1"
#: Values of a column group sealed into one archive chunk (``pipeline.core.packing``: 1.78
#: bytes a step at 1,024, within 3 % of longer chunks).
CHUNK = 1024
#: Values a column group's tail keeps when it is sealed: the steps since the last snapshot, and
#: the one before them, are read by every snapshot (the step statistics' and detector's next
#: steps); a tail holds from KEEP to KEEP + CHUNK values, whatever the run's length.
KEEP = 256
#: An attempt's column groups: the step starts' (sealed into the archive) and the observations'
#: (of which the state keeps the tail alone: see ``seal``).
STEPS, OBSERVATIONS = "steps", "obs"


def _groups(attempt: Attempt) -> dict[str, tuple[Column, ...]]:
    return {STEPS: (attempt.steps, attempt.step_times, attempt.step_seqs),
            OBSERVATIONS: (attempt.obs_seqs, attempt.obs_times, attempt.obs_prints, attempt.obs_kinds)}


def encode_state(state: RunState) -> bytes:
    """The hot part of a run's state: compact and deterministic (the Beam state coder uses it).

    A JSON header holds everything but the columns' tails, which follow as raw little-endian
    arrays (see the module docstring).
    """
    attempts: list[dict[str, Any]] = []
    packed = []
    for attempt in state.attempts.values():
        groups = _groups(attempt)
        steps = groups[STEPS]
        archived = steps[0].archived and [steps[0].archived, [list(column.edges) for column in steps]]
        attempts.append({
            "id": attempt.attempt_id, "start": attempt.start_us, "end": attempt.end_us,
            "meta": attempt.metadata,
            "markers": attempt.markers, "saves": attempt.saves, "restores": attempt.restores,
            "slices": attempt.slice_counts, "last": attempt.last_event_us,
            "wm": attempt.watermark, "extra": sorted(attempt.extra),
            # Events by seq (``Attempt.kept``): a state encoded without them cannot tell a
            # conflicting duplicate of its events from a redelivery.
            "records": [[seq, *record] for seq, record in sorted(attempt.records.items())],
            # Only when known: a state without it encodes as before the flag existed.
            **({} if attempt.failed is None else {"failed": attempt.failed}),
            **({"archived": archived} if archived else {}),
            # Where the step number fails to increase, as scanned so far (not scanned again).
            **({"splits": [attempt.split_scanned, attempt.splits]} if attempt.split_scanned else {}),
        })
        tails = [pack_columns([column.tail for column in columns]) for columns in groups.values()]
        attempts[-1]["packed"] = [len(tail) for tail in tails]
        packed += tails
    fields = {"run": state.run_id, "events": state.events, "dups": state.duplicates, "attempts": attempts}
    if state.hosts.has_state:  # only then: a run without host summaries encodes as before they existed
        fields["hosts"] = state.hosts.to_json()
    detector = state.detector_state()
    if detector is not None:  # else fed afresh after a decode
        fields["detector"] = {**detector[0].to_json(), "fed": detector[1]}
    stats = state.stats_state()
    if stats is not None:  # likewise
        packed.append(stats[0].to_bytes())
        fields["stats"] = {"size": len(packed[-1]), "fed": stats[1]}
    header = json.dumps(fields, separators=(",", ":")).encode()
    return b"".join([_HEADER.pack(_MAGIC, len(header)), header, *packed])


def seal(state: RunState, keep: int = KEEP, chunk: int = CHUNK) -> tuple[list[bytes], bool]:
    """Seals the oldest step starts of each attempt into archive chunks of ``chunk`` values,
    leaving at least ``keep`` in its tail, whole chunks at a time, and forgets its observations
    alike: of a heartbeat or a model-metrics event the state needs only its seq (the watermark
    keeps it) once it is older than the tail, as it keeps only the seqs of configs and metrics
    (a conflicting duplicate of a forgotten one is taken for a redelivery; it changes no
    figure). Returns the new chunks and whether they replace the archive rather than add to it:
    a change inside a sealed stretch (a late step) took a column back whole, and then every
    attempt's step columns are taken back (the archive read) and sealed anew."""
    groups = [_groups(attempt)[STEPS] for attempt in state.attempts.values()]
    anew = any(column.moved for group in groups for column in group)
    if anew:
        for column in (column for group in groups for column in group):
            column.unarchive()
            column.moved = False
    archive = archive_of(state)
    archive.forget()
    chunks = []
    for attempt, group in zip(state.attempts.values(), groups, strict=True):
        attempt.split_indices()  # scanned up to date while every step to be sealed is at hand
        at = group[0].archived
        sealed = [column.seal(keep, chunk) for column in group]
        for index, column in enumerate(group):
            if column.archived and column.load is None:
                column.load = _loader(archive, attempt.attempt_id, index)
        for start in range(0, len(sealed[0]), chunk):
            header = json.dumps({"attempt": attempt.attempt_id, "at": at + start},
                                separators=(",", ":")).encode()
            packed = pack_columns([values[start:start + chunk] for values in sealed])
            chunks.append(b"".join([_HEADER.pack(_CHUNK_MAGIC, len(header)), header, packed]))
        observations = _groups(attempt)[OBSERVATIONS]
        forgotten = max(0, len(observations[0]) - keep) // chunk * chunk
        for column in observations:
            del column[:forgotten]
    return chunks, anew


@dataclasses.dataclass
class Archive:
    """The archive of a decoded state: ``read`` returns its chunks (an entry each, in any
    order); they are read at most once, when a column first asks for a sealed value, and kept."""

    read: Callable[[], Iterable[bytes]] | None = None
    _columns: dict[str, list[array[int]]] | None = None

    def forget(self) -> None:
        """Drops the chunks read (the archive is about to change)."""
        self._columns = None

    def values(self, attempt_id: str, index: int) -> array[int]:
        """The sealed values of an attempt's step column ``index`` (numbers, times, seqs)."""
        if self._columns is None:
            if self.read is None:
                raise ArchiveMissing("the run's sealed steps are asked for, and it has no archive of them")
            self._columns = _chunks_by_attempt(self.read())
        found = self._columns.get(attempt_id)
        if found is None:
            raise ArchiveMissing(f"the archive holds no step of attempt {attempt_id!r}")
        return found[index]


def archive_of(state: RunState) -> Archive:
    """The archive the state's sealed values are read from (made, empty, if it has none)."""
    archive = state.archive
    if archive is None:
        archive = state.archive = Archive()
    assert isinstance(archive, Archive)
    return archive


def _chunks_by_attempt(entries: Iterable[bytes]) -> dict[str, list[array[int]]]:
    """Each attempt's step columns, its chunks put together in order."""
    parts: dict[str, list[tuple[int, list[array[int]]]]] = {}
    for data in entries:
        header, offset = _read_header(data, _CHUNK_MAGIC, "not an archive chunk")
        parts.setdefault(header["attempt"], []).append((header["at"], _unpacked(data[offset:], STEPS)))
    joined = {}
    for attempt_id, chunks in parts.items():
        chunks.sort(key=lambda part: part[0])
        at = 0
        for start, columns in chunks:
            if start != at:
                raise ValueError(f"the archive's chunks of attempt {attempt_id!r} do not follow each "
                                 f"other: one starts at {start}, where {at} was expected")
            at += len(columns[0])
        joined[attempt_id] = [_joined([columns[index] for _, columns in chunks])
                              for index in range(len(chunks[0][1]))]
    return joined


def _unpacked(data: bytes, group: str) -> list[array[int]]:
    """A group's columns, as ``pack_columns`` packed them (observations' kinds are bytes)."""
    typecodes = "qqqb" if group == OBSERVATIONS else "qqq"
    return [array(code, values.astype(np.int8 if code == "b" else np.int64).tobytes())
            for code, values in zip(typecodes, unpack_columns(data, len(typecodes)), strict=True)]


def _joined(parts: list[array[int]]) -> array[int]:
    whole = array(parts[0].typecode)
    for part in parts:
        whole.extend(part)
    return whole


def decode_state(data: bytes, archive: Archive | None = None) -> RunState:
    """The state ``encode_state`` encoded, its sealed values read from ``archive`` when asked
    for (an empty one, whose ``read`` is set later, if None)."""
    archive = archive or Archive()
    if bytes(data[:4]) == _EARLIER_MAGIC:
        raise ValueError("a run state of an earlier version, before its archive: drain the job and "
                         "launch it again (README, Deploy)")
    header, offset = _read_header(data, _MAGIC, "not an encoded run state")
    attempts = []
    for item in header["attempts"]:
        attempt = Attempt(item["id"], item["start"], item["end"], item["meta"])
        groups = _groups(attempt)
        for (name, columns), size in zip(groups.items(), item["packed"], strict=True):
            for column, values in zip(columns, _unpacked(data[offset:offset + size], name), strict=True):
                column.tail.extend(values)
            offset += size
        if "archived" in item:
            count, edges = item["archived"]
            for index, column in enumerate(groups[STEPS]):
                column.restore(count, edges[index], _loader(archive, attempt.attempt_id, index))
        attempt.markers = {k: [tuple(m) for m in v] for k, v in item["markers"].items()}
        attempt.saves = [tuple(s) for s in item["saves"]]
        attempt.restores = [tuple(s) for s in item["restores"]]
        attempt.slice_counts = [tuple(s) for s in item["slices"]]
        attempt.last_event_us, attempt.watermark = item["last"], item["wm"]
        attempt.extra = set(item["extra"])
        attempt.failed = item.get("failed")  # absent in states encoded before the flag existed
        attempt.records = {seq: (t, kind, body) for seq, t, kind, body in item.get("records", ())}
        attempt.split_scanned, attempt.splits = item.get("splits", (0, []))
        attempts.append(attempt)
    hosts = HostScorer.from_json(header["hosts"]) if "hosts" in header else None
    detector = stats = None
    if "detector" in header:
        detector = Detector.from_json(header["detector"]), [tuple(fed) for fed in header["detector"]["fed"]]
    if "stats" in header:
        blob = data[offset:offset + header["stats"]["size"]]
        stats = BoundedStepStatistics.from_bytes(blob), [tuple(fed) for fed in header["stats"]["fed"]]
    state = RunState.of(header["run"], attempts, header["events"], header["dups"], hosts, detector, stats)
    state.archive = archive
    return state


def _loader(archive: Archive, attempt_id: str, index: int) -> Callable[[], array[int]]:
    return lambda: archive.values(attempt_id, index)


def encode_batch(batch: Batch) -> bytes:
    """A compact, deterministic encoding of one message's events (see the module docstring)."""
    header = json.dumps({"attempt": batch.attempt_id, "n": len(batch.steps),
                         "others": [[e.seq, e.time_us, e.kind, e.body] for e in batch.others]},
                        separators=(",", ":")).encode()
    columns = (batch.step_seqs, batch.step_times, batch.steps)
    return b"".join([_HEADER.pack(_BATCH_MAGIC, len(header)), header, *map(_little_endian, columns)])


def decode_batch(run_id: str, data: bytes) -> Batch:
    """The events of run ``run_id`` that ``encode_batch`` encoded."""
    header, offset = _read_header(data, _BATCH_MAGIC, "not an encoded message")
    seqs, times, steps = array("q"), array("q"), array("q")
    _read_arrays(data, offset, [(column, header["n"]) for column in (seqs, times, steps)])
    attempt_id = header["attempt"]
    others = tuple(Event(run_id, attempt_id, seq, time_us, kind, body)
                   for seq, time_us, kind, body in header["others"])
    return Batch(run_id, attempt_id, seqs, times, steps, others)


def _read_header(data: bytes, magic: bytes, refusal: str) -> tuple[Any, int]:
    """The JSON header of an encoding that begins with ``magic``, and where its arrays begin."""
    found, length = _HEADER.unpack_from(data)
    if found != magic:
        raise ValueError(refusal)
    return json.loads(data[_HEADER.size:_HEADER.size + length]), _HEADER.size + length


def _read_arrays(data: bytes, offset: int, targets: Sequence[tuple[array[int], int]]) -> int:
    """Fills each array with its count of little-endian values from ``offset`` on, in turn;
    where the last one ends."""
    for target, count in targets:
        size = count * target.itemsize
        target.frombytes(data[offset:offset + size])
        if sys.byteorder != "little":
            target.byteswap()
        offset += size
    return offset


def _little_endian(values: array[int]) -> memoryview | bytes:
    """The values' bytes, little-endian: on such a machine a view of them, copied only once, by
    the join that builds the encoding (a long history is most of a state's bytes)."""
    if sys.byteorder == "little":
        return memoryview(values)
    swapped = array(values.typecode, values)
    swapped.byteswap()
    return swapped.tobytes()
