"""The wire format: an ``EventBatch`` (``goodput_event.proto``) as the JSON of one message.

The emitter writes it and the pipeline reads it (and writes it again, replaying its raw events
table), so it lives with the contract. A recorded event is a small tuple, ``Record = (seq,
time_us, kind, body)``, where ``kind`` is the name of the ``Event.kind`` oneof field and ``body``
its JSON object. Records become the message payload without protobuf, so a training image needs
no protobuf runtime for it; tests check every payload against the schema.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

from goodput_schemas.limits import MAX_MESSAGE_BYTES

#: Version of the event contract this emitter writes (``EventBatch.schema_version``).
SCHEMA_VERSION = 1

#: A recorded event: (seq, time_us, kind, body).
Record = tuple[int, int, str, dict[str, Any]]


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


_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def json_double(value: float) -> float | str:
    """A double in proto3 JSON: non-finite values are the strings "NaN", "Infinity", "-Infinity"."""
    if math.isfinite(value):
        return value
    if math.isnan(value):
        return "NaN"
    return "Infinity" if value > 0 else "-Infinity"


def _encode_event(seq: int, time_us: int, kind: str, body: dict[str, Any]) -> str:
    # Kinds are the schema's field names, and the commonest bodies hold only finite numbers (a
    # step; model metrics, whose non-finite values the emitter writes as strings): those are
    # formatted directly, since the JSON encoder costs several times more per event. A float's
    # repr is its shortest round-tripping form, which is what the encoder writes too; a
    # non-finite float is left to the encoder, which refuses it.
    if kind == "step_start":
        return f'{{"seq":{seq},"time_us":{time_us},"step_start":{{"step":{body["step"]}}}}}'
    if not body:
        return f'{{"seq":{seq},"time_us":{time_us},"{kind}":{{}}}}'
    fields = []
    for name, value in body.items():
        if (type(value) is not float and type(value) is not int) or value - value != 0:
            break
        fields.append(f'"{name}":{value!r}')
    else:
        return f'{{"seq":{seq},"time_us":{time_us},"{kind}":{{{",".join(fields)}}}}}'
    return f'{{"seq":{seq},"time_us":{time_us},"{kind}":{_ENCODER.encode(body)}}}'


def encode_batch(run_id: str, attempt_id: str, records: list[Record]) -> Message:
    """The message carrying ``records`` (non-empty, in seq order) of one attempt."""
    header = _ENCODER.encode(
        {"schema_version": SCHEMA_VERSION, "run_id": run_id, "attempt_id": attempt_id}
    )
    events = ",".join([_encode_event(*record) for record in records])
    return Message(
        run_id=run_id,
        attempt_id=attempt_id,
        first_seq=records[0][0],
        last_seq=records[-1][0],
        event_time_us=max(record[1] for record in records),
        data=f'{header[:-1]},"events":[{events}]}}'.encode(),
    )


def encode_batches(run_id: str, attempt_id: str, records: list[Record],
                   max_bytes: int = MAX_MESSAGE_BYTES) -> list[Message]:
    """The messages carrying ``records``: one, or as many as keep each within ``max_bytes`` (the
    pipeline dead-letters a larger one). An event is far smaller than the limit: the contract's
    limits on text and labels bound it to a few hundred kilobytes."""
    message = encode_batch(run_id, attempt_id, records)
    if len(message.data) <= max_bytes or len(records) == 1:
        return [message]
    half = len(records) // 2
    return (encode_batches(run_id, attempt_id, records[:half], max_bytes)
            + encode_batches(run_id, attempt_id, records[half:], max_bytes))
