"""The state coder: a run's state as compact, deterministic bytes, for Beam state.

A JSON header holds everything but the step history and the observations (the anomaly
detector's and the host scorer's state included); each attempt's steps, step times and step seqs
follow as raw little-endian int64 arrays (24 bytes per recorded step), then its observations'
seqs, times and fingerprints (int64) and kinds (one byte each).

A message added since the state was last encoded whole is encoded the same way
(``encode_batch``): a JSON header with its events other than step starts, then the step starts'
seqs, times and steps as int64 arrays. A run's state in Beam is the one and the others
(``pipeline.beam.live``).
"""

from __future__ import annotations

import json
import struct
import sys
from array import array
from typing import Any

from pipeline.core.detect import Detector, HostScorer
from pipeline.core.engine import Attempt, RunState
from pipeline.core.events import Batch, Event

_HEADER = struct.Struct("<4sI")
_MAGIC = b"GPS1"
_BATCH_MAGIC = b"GPB1"


def encode_state(state: RunState) -> bytes:
    """A compact, deterministic encoding of a run's state (the Beam state coder uses it).

    A JSON header holds everything but the step history and the observations, which follow as
    raw little-endian arrays (see the module docstring).
    """
    attempts = []
    arrays = []
    for attempt in state.attempts.values():
        attempts.append({
            "id": attempt.attempt_id, "start": attempt.start_us, "end": attempt.end_us,
            "meta": attempt.metadata, "n": len(attempt.steps),
            "markers": attempt.markers, "saves": attempt.saves, "restores": attempt.restores,
            "slices": attempt.slice_counts, "last": attempt.last_event_us,
            "wm": attempt.watermark, "extra": sorted(attempt.extra),
            # Events by seq (``Attempt.kept``): a state encoded without them cannot tell a
            # conflicting duplicate of its events from a redelivery.
            "records": [[seq, *record] for seq, record in sorted(attempt.records.items())],
            "obs": len(attempt.obs_seqs),
            # Only when known: a state without it encodes as before the flag existed.
            **({} if attempt.failed is None else {"failed": attempt.failed}),
        })
        arrays += [attempt.steps, attempt.step_times, attempt.step_seqs, attempt.obs_seqs, attempt.obs_times,
                   attempt.obs_prints, attempt.obs_kinds]
    fields = {"run": state.run_id, "events": state.events, "dups": state.duplicates, "attempts": attempts}
    if state.hosts.has_state:  # only then: a run without host summaries encodes as before they existed
        fields["hosts"] = state.hosts.to_json()
    detector = state.detector_state()
    if detector is not None:  # else fed afresh after a decode, as states of earlier versions are
        fields["detector"] = {**detector[0].to_json(), "fed": detector[1]}
    header = json.dumps(fields, separators=(",", ":")).encode()
    return b"".join([_HEADER.pack(_MAGIC, len(header)), header, *map(_little_endian, arrays)])


def decode_state(data: bytes) -> RunState:
    """The state ``encode_state`` encoded."""
    header, offset = _read_header(data, _MAGIC, "not an encoded run state")
    attempts = []
    for item in header["attempts"]:
        attempt = Attempt(item["id"], item["start"], item["end"], item["meta"])
        columns = [(attempt.steps, item["n"]), (attempt.step_times, item["n"])]
        if "obs" in item:
            count = item["obs"]
            columns += [(attempt.step_seqs, item["n"]), (attempt.obs_seqs, count), (attempt.obs_times, count),
                        (attempt.obs_prints, count), (attempt.obs_kinds, count)]
        else:  # encoded before events were kept by seq: those steps' seqs are unknown (-1)
            attempt.step_seqs.extend([-1] * item["n"])
        offset = _read_arrays(data, offset, columns)
        attempt.markers = {k: [tuple(m) for m in v] for k, v in item["markers"].items()}
        attempt.saves = [tuple(s) for s in item["saves"]]
        attempt.restores = [tuple(s) for s in item["restores"]]
        attempt.slice_counts = [tuple(s) for s in item["slices"]]
        attempt.last_event_us, attempt.watermark = item["last"], item["wm"]
        attempt.extra = set(item["extra"])
        attempt.failed = item.get("failed")  # absent in states encoded before the flag existed
        attempt.records = {seq: (t, kind, body) for seq, t, kind, body in item.get("records", ())}
        attempts.append(attempt)
    hosts = HostScorer.from_json(header["hosts"]) if "hosts" in header else None
    detector = None
    if "detector" in header:
        detector = Detector.from_json(header["detector"]), [tuple(fed) for fed in header["detector"]["fed"]]
    return RunState.of(header["run"], attempts, header["events"], header["dups"], hosts, detector)


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


def _read_arrays(data: bytes, offset: int, targets: list[tuple[array[int], int]]) -> int:
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
