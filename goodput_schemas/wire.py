"""The wire format: an ``EventBatch`` (``goodput_event.proto``) as the JSON of one message.

The emitter writes it and the pipeline reads it (and writes it again, replaying its raw events
table), so it lives with the contract. A recorded event is a small tuple, ``Record = (seq,
time_us, kind, body)``, where ``kind`` is the name of the ``Event.kind`` oneof field and ``body``
its JSON object, or, for the two events a training loop records every step, a compact form that
costs the loop less to make (``event_body``). Records become the message payload without
protobuf, so a training image needs no protobuf runtime for it; tests check every payload against
the schema.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import re
from collections.abc import Callable
from typing import Any

import orjson

from goodput_schemas.limits import MAX_ID_BYTES, MAX_ID_LENGTH, MAX_MESSAGE_BYTES

#: Version of the event contract this emitter writes (``EventBatch.schema_version``).
SCHEMA_VERSION = 1

#: The model metrics of a ``model_metrics`` event, in the order of its compact body.
MODEL_METRICS = ("loss", "step_time_s", "tokens_per_s", "samples_per_s", "mfu", "tflops_per_device")

#: A recorded event: (seq, time_us, kind, body); the body as ``event_body`` takes it.
Record = tuple[int, int, str, Any]


@dataclasses.dataclass(frozen=True)
class Message:
    """One encoded message: a batch of events of one attempt, ready to publish.

    Attributes:
        run_id: The run the events belong to (Pub/Sub attribute and ordering key).
        attempt_id: The attempt that recorded them.
        first_seq: Sequence number of the first event in the batch.
        last_seq: Sequence number of the last event in the batch.
        event_time_us: The latest event time in the batch (Pub/Sub event-time attribute).
        data: The JSON encoding of the ``EventBatch``.
    """

    run_id: str
    attempt_id: str
    first_seq: int
    last_seq: int
    event_time_us: int
    data: bytes

    @property
    def message_id(self) -> str:
        """Identifies the batch; the same events re-sent in the same batch get the same id."""
        return f"{self.attempt_id}:{self.first_seq}-{self.last_seq}"


#: The standard library's encoder, strict: it refuses a non-finite float, which ``orjson`` would
#: write as ``null``.
_STRICT = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)


#: Hex digits of the digest a derived run id ends with, after ``~`` (``workload_run_id``): 128 bits.
_DIGEST_DIGITS = 32
_DERIVED_ENDING = re.compile(rf"~[0-9a-f]{{{_DIGEST_DIGITS}}}")


def workload_run_id(run_id: str, workload_uid: str) -> str:
    """The run a message of ``run_id`` recorded by workload ``workload_uid`` belongs to.

    Each workload that reuses a name is a run of its own (a name reused by a new JobSet is a new
    run, never a restart of the old one): its run is the run id, ``~`` and the first 32 hex digits
    (128 bits) of the SHA-256 of the run id and the uid joined by a newline (both are printable,
    so the newline is unambiguous), in UTF-8. The run id is shortened to keep the whole within
    MAX_ID_LENGTH characters and MAX_ID_BYTES bytes, as the run id a job gives is; the digest is
    of both whole, so two pairs never give one run however much of them they share. Without a
    workload the run is the run id itself, unless the id ends as a derived one does (``~`` and 32
    hex digits): that id is derived too, with the empty uid, so that it is never a workload's run.
    The same messages always give the same id, whatever order they arrive in."""
    if not workload_uid and _DERIVED_ENDING.fullmatch(run_id, len(run_id) - 1 - _DIGEST_DIGITS) is None:
        return run_id
    whole = f"{run_id}\n{workload_uid}".encode("utf-8", "surrogatepass")
    suffix = "~" + hashlib.sha256(whole).hexdigest()[:_DIGEST_DIGITS]
    head = run_id[:MAX_ID_LENGTH - len(suffix)].encode("utf-8", "surrogatepass")[:MAX_ID_BYTES - len(suffix)]
    return head.decode("utf-8", "ignore") + suffix  # a character cut in two is dropped


def json_double(value: float) -> float | str:
    """A double in proto3 JSON: non-finite values are the strings "NaN", "Infinity", "-Infinity"."""
    if math.isfinite(value):
        return value
    if math.isnan(value):
        return "NaN"
    return "Infinity" if value > 0 else "-Infinity"


def event_body(kind: str, body: Any) -> dict[str, Any]:
    """The JSON object of a record's body: ``body`` itself if it is a dict, else a compact body:
    a ``step_start``'s step (an int), or a ``model_metrics`` tuple ``(step, *MODEL_METRICS)`` of
    floats, any of them non-finite (written as proto3 JSON writes it) or None (not measured)."""
    if type(body) is dict:
        return body
    if kind == "step_start":
        return {"step": body}
    # Written out, not looped over: this runs for every step's metrics, and a loop over
    # MODEL_METRICS costs more than twice as much.
    step, loss, step_time_s, tokens_per_s, samples_per_s, mfu, tflops_per_device = body
    fields = {"step": step}
    if loss is not None:
        fields["loss"] = _double(loss)
    if step_time_s is not None:
        fields["step_time_s"] = _double(step_time_s)
    if tokens_per_s is not None:
        fields["tokens_per_s"] = _double(tokens_per_s)
    if samples_per_s is not None:
        fields["samples_per_s"] = _double(samples_per_s)
    if mfu is not None:
        fields["mfu"] = _double(mfu)
    if tflops_per_device is not None:
        fields["tflops_per_device"] = _double(tflops_per_device)
    return fields


def _double(value: float) -> float | str:
    return value if value - value == 0.0 else json_double(value)  # inf - inf and nan - nan are nan


def encode_body(body: dict[str, Any]) -> bytes:
    """The JSON of an event's dict body, as ``encode_events`` writes it within a batch.

    Raises:
        ValueError: The body holds a non-finite float (write it with ``json_double``).
        TypeError: The body holds something JSON has no value for.
    """
    encoded = orjson.dumps(body)
    return _STRICT.encode(body).encode() if b"null" in encoded else encoded


def encode_events(records: list[Record]) -> bytes:
    """The JSON array of the events of ``records``: ``{"seq": ..., "time_us": ..., kind: body}``
    each, the body as ``event_body`` makes it.

    Raises:
        ValueError: A dict body holds a non-finite float (write it with ``json_double``).
        TypeError: A body holds something JSON has no value for.
    """
    events = [{"seq": seq, "time_us": time_us, kind: body if type(body) is dict else event_body(kind, body)}
              for seq, time_us, kind, body in records]
    # orjson formats a float several times faster than ``repr`` (which the standard library's
    # encoder calls), with the same shortest round-tripping digits. The contract has no nulls:
    # "null" in the output is a non-finite float, a None or those letters in a string, and the
    # strict encoder encodes the batch again, refusing a non-finite float.
    encoded = orjson.dumps(events)
    if b"null" in encoded:
        encoded = _STRICT.encode(events).encode()
    return encoded


#: What writes a batch's events: ``encode_events`` or one that writes the same JSON values.
EventsEncoder = Callable[[list[Record]], bytes]


def encode_batch(run_id: str, attempt_id: str, records: list[Record], workload_uid: str = "",
                 events_encoder: EventsEncoder = encode_events) -> Message:
    """The message carrying ``records`` (non-empty, in seq order) of one attempt, their events
    written by ``events_encoder``; its header names ``workload_uid`` (``EventBatch.workload_uid``)
    only when it is not empty.

    Raises:
        ValueError: A dict body holds a non-finite float (write it with ``json_double``).
        TypeError: A body holds something JSON has no value for.
    """
    encoded = events_encoder(records)
    header_fields = {"schema_version": SCHEMA_VERSION, "run_id": run_id, "attempt_id": attempt_id}
    if workload_uid:
        header_fields["workload_uid"] = workload_uid
    header = orjson.dumps(header_fields)
    return Message(
        run_id=run_id,
        attempt_id=attempt_id,
        first_seq=records[0][0],
        last_seq=records[-1][0],
        event_time_us=max(record[1] for record in records),
        data=b"".join((header[:-1], b',"events":', encoded, b"}")),
    )


def encode_batches(run_id: str, attempt_id: str, records: list[Record],
                   max_bytes: int = MAX_MESSAGE_BYTES, workload_uid: str = "",
                   events_encoder: EventsEncoder = encode_events) -> list[Message]:
    """The messages carrying ``records``: one, or as many as keep each within ``max_bytes`` (the
    pipeline dead-letters a larger one). An event is far smaller than the limit: the contract's
    limits on text and labels bound it to a few hundred kilobytes."""
    message = encode_batch(run_id, attempt_id, records, workload_uid, events_encoder)
    if len(message.data) <= max_bytes or len(records) == 1:
        return [message]
    half = len(records) // 2
    return (encode_batches(run_id, attempt_id, records[:half], max_bytes, workload_uid, events_encoder)
            + encode_batches(run_id, attempt_id, records[half:], max_bytes, workload_uid, events_encoder))
