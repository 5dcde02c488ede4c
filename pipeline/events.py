"""Parsing and validation of event messages against the contract (schemas/goodput_event.proto).

A message is the JSON encoding of one ``EventBatch``. Parsing checks it exactly as a Pub/Sub topic
with the schema would (the protobuf JSON parser, unknown fields rejected), then the rules the
schema cannot state (a known schema version, non-empty ids, one kind per event, times and steps
in range, finite durations). Nothing is dropped silently: a message that cannot be read at all
becomes one ``DeadLetter``; an invalid event inside a readable message becomes one
``DeadLetter`` and its valid neighbours are kept.

Pure Python with no Beam import, so the Beam transforms, the tests and the tools share it.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

from google.protobuf import json_format
from google.protobuf.message import Message as ProtoMessage

from goodput_schemas.goodput_event_pb2 import EventBatch

#: Versions of the event contract this pipeline reads.
SUPPORTED_SCHEMA_VERSIONS = frozenset({1})
#: Event times outside [2000-01-01, 2200-01-01) UTC are rejected as corrupt.
MIN_TIME_US = 946_684_800 * 1_000_000
MAX_TIME_US = 7_258_118_400 * 1_000_000
#: Longest run or attempt id accepted.
MAX_ID_LENGTH = 512

#: Every event kind, in schema order.
EVENT_KINDS: tuple[str, ...] = tuple(
    field.name for field in EventBatch.Event.DESCRIPTOR.oneofs_by_name["kind"].fields
)
# Model metrics are observations, not durations: a diverged loss may be NaN, a loss negative.
_OBSERVATION_KINDS = frozenset({"model_metrics"})
_HEADER_FIELDS = ("schema_version", "run_id", "attempt_id")


@dataclasses.dataclass(frozen=True, slots=True)
class Event:
    """One valid event.

    Attributes:
        run_id: The run.
        attempt_id: The attempt (one process start) that recorded it.
        seq: Sequence number within the attempt.
        time_us: Event time, microseconds since the epoch, UTC.
        kind: The ``Event.kind`` oneof field that is set, e.g. ``"step_start"``.
        body: That field's values by name (only the fields that are set).
    """

    run_id: str
    attempt_id: str
    seq: int
    time_us: int
    kind: str
    body: dict[str, Any]

    @property
    def event_id(self) -> str:
        """Unique and stable across retries: the attempt id and the sequence number."""
        return f"{self.attempt_id}:{self.seq}"


@dataclasses.dataclass(frozen=True, slots=True)
class DeadLetter:
    """Input that was rejected, with the reason.

    Attributes:
        payload: The rejected message, or the rejected event's JSON within it.
        reason: Why it was rejected, for a person to read.
        source: Where it came from (e.g. ``events.jsonl:12``), if known.
        run_id: The run, when it could be read.
    """

    payload: str
    reason: str
    source: str = ""
    run_id: str = ""


def _decode(data: bytes | str) -> str:
    return data if isinstance(data, str) else data.decode("utf-8")


def _plain(message: ProtoMessage) -> dict[str, Any]:
    """A protobuf message as plain Python values (int64 stays int).

    Scalars without presence are always included, defaults too (``step`` 0 is a real step);
    optional fields and submessages only when set.
    """
    values: dict[str, Any] = {}
    for field in message.DESCRIPTOR.fields:
        value = getattr(message, field.name)
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            values[field.name] = dict(value)
        elif field.has_presence and not message.HasField(field.name):
            continue
        elif field.message_type is not None:
            values[field.name] = _plain(value)
        else:
            values[field.name] = value
    return values


def _event_problem(kind: str | None, event: EventBatch.Event, body: dict[str, Any]) -> str | None:
    if kind is None:
        return "event has no kind: set exactly one of " + ", ".join(EVENT_KINDS)
    if event.seq < 0:
        return f"seq must be >= 0, got {event.seq}"
    if not MIN_TIME_US <= event.time_us < MAX_TIME_US:
        return f"time_us {event.time_us} is outside 2000-01-01..2200-01-01 UTC"
    for name, value in body.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if kind in _OBSERVATION_KINDS and name != "step":
            continue
        if not math.isfinite(value):
            return f"{kind}.{name} must be finite, got {value}"
        if value < 0:
            return f"{kind}.{name} must be >= 0, got {value}"
    ideal = body.get("configured_ideal_step_time_s")
    if ideal is not None and not ideal > 0:
        return f"job_start.configured_ideal_step_time_s must be > 0, got {ideal}"
    return None


def parse_message(data: bytes | str, source: str = "") -> tuple[list[Event], list[DeadLetter]]:
    """Valid events of one message, and dead letters for whatever is invalid in it."""
    try:
        text = _decode(data)
    except UnicodeDecodeError as error:
        assert isinstance(data, bytes)
        raw = data.decode("utf-8", errors="backslashreplace")
        return [], [DeadLetter(raw, f"message is not UTF-8: {error}", source)]

    def reject(reason: str, run_id: str = "") -> tuple[list[Event], list[DeadLetter]]:
        return [], [DeadLetter(text, reason, source, run_id)]

    try:
        document = json.loads(text)
    except ValueError as error:
        return reject(f"message is not valid JSON: {error}")
    if not isinstance(document, dict):
        return reject(f"message must be a JSON object (an EventBatch), got {type(document).__name__}")
    run_id = document.get("run_id")
    run_id = run_id if isinstance(run_id, str) else ""
    version = document.get("schema_version")
    if version not in SUPPORTED_SCHEMA_VERSIONS:
        return reject(f"unsupported schema_version {version!r}: this pipeline reads "
                      f"{sorted(SUPPORTED_SCHEMA_VERSIONS)}", run_id)
    header = EventBatch()
    try:
        json_format.ParseDict({k: v for k, v in document.items() if k != "events"}, header)
    except json_format.ParseError as error:
        return reject(f"message does not match the schema: {error}", run_id)
    for name in ("run_id", "attempt_id"):
        value = getattr(header, name)
        if not value or len(value) > MAX_ID_LENGTH or not value.isprintable():
            return reject(f"{name} must be 1..{MAX_ID_LENGTH} printable characters, got {value!r}",
                          run_id)
    raw_events = document.get("events")
    if not isinstance(raw_events, list) or not raw_events:
        return reject("message has no events: 'events' must be a non-empty list", run_id)

    events: list[Event] = []
    dead: list[DeadLetter] = []
    for index, raw in enumerate(raw_events):
        where = f"{source}#event{index}" if source else f"event{index}"
        parsed = EventBatch.Event()
        try:
            json_format.ParseDict(raw, parsed)
        except (json_format.ParseError, TypeError, ValueError) as error:
            dead.append(DeadLetter(json.dumps(raw), f"event does not match the schema: {error}",
                                   where, header.run_id))
            continue
        kind = parsed.WhichOneof("kind")
        body = _plain(getattr(parsed, kind)) if kind else {}
        problem = _event_problem(kind, parsed, body)
        if problem is not None:
            dead.append(DeadLetter(json.dumps(raw), problem, where, header.run_id))
            continue
        assert kind is not None
        events.append(Event(header.run_id, header.attempt_id, parsed.seq, parsed.time_us, kind, body))
    return events, dead
