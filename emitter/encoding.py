"""The JSON encoding of an ``EventBatch`` (schemas/goodput_event.proto, proto3 JSON mapping).

The emitter keeps each recorded event as a small tuple, ``Record = (seq, time_us, kind, body)``,
where ``kind`` is the name of the ``Event.kind`` oneof field and ``body`` its JSON object. This
module turns records into the message payload without protobuf, so a training image needs no
protobuf runtime for it; tests check every payload against the schema.
"""

from __future__ import annotations

import json
import math
from typing import Any

from emitter.transports import Message
from goodput_schemas.limits import MAX_MESSAGE_BYTES

#: Version of the event contract this emitter writes (``EventBatch.schema_version``).
SCHEMA_VERSION = 1

#: A recorded event: (seq, time_us, kind, body).
Record = tuple[int, int, str, dict[str, Any]]

_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def json_double(value: float) -> float | str:
    """A double in proto3 JSON: non-finite values are the strings "NaN", "Infinity", "-Infinity"."""
    if math.isfinite(value):
        return value
    if math.isnan(value):
        return "NaN"
    return "Infinity" if value > 0 else "-Infinity"


def _encode_event(seq: int, time_us: int, kind: str, body: dict[str, Any]) -> str:
    # Kinds are the schema's field names and steps are validated ints, so the two commonest
    # shapes are formatted directly: the JSON encoder costs several times more per event.
    if kind == "step_start":
        return f'{{"seq":{seq},"time_us":{time_us},"step_start":{{"step":{body["step"]}}}}}'
    if not body:
        return f'{{"seq":{seq},"time_us":{time_us},"{kind}":{{}}}}'
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
