"""Parsing and validation of event messages against the contract (goodput_schemas/goodput_event.proto).

A message is the JSON encoding of one ``EventBatch``. Parsing checks it exactly as a Pub/Sub topic
with the schema would (the protobuf JSON parser, unknown fields rejected), then the rules the
schema cannot state (a known schema version, non-empty ids, one kind per event, times and steps
in range, finite durations) and the limits below, which bound what one message can cost.

The limits also keep one message from reaching past its own run: every integer is bounded
(``goodput_schemas.limits``: no sum the engine writes can pass int64), slice counts must be
consistent, and an event dated more than ``MAX_CLOCK_AHEAD_S`` after the pipeline's clock is
rejected (it would move the time a batch replay reports every run as of). Nothing
is dropped silently: a message that cannot be read at all becomes one ``DeadLetter``; an invalid
event inside a readable message becomes one ``DeadLetter`` and its valid neighbours are kept.

Who a run is is decided here, once: a message belongs to the run
``goodput_schemas.wire.workload_run_id(run_id, uid)`` of its header's run id and the workload that
recorded it (``workload_uid``, if named), and that id is the run of every stage and table after
parsing (``Batch.run_id``). A restart in the same workload stays one run; a run id reused by
another workload is another run, and no run id a job gives is ever a workload's run.

Pure Python with no Beam import, so the Beam transforms, the tests and the tools share it.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import time
from array import array
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
from google.protobuf import json_format
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message as ProtoMessage

from goodput_schemas.goodput_event_pb2 import EventBatch
from goodput_schemas.limits import (
    MAX_CLOCK_AHEAD_S,
    MAX_COUNT,
    MAX_DURATION_S,
    MAX_EVENTS_PER_MESSAGE,
    MAX_ID_LENGTH,
    MAX_JSON_DEPTH,
    MAX_LABELS,
    MAX_MESSAGE_BYTES,
    MAX_TIME_US,
    MAX_UID_LENGTH,
    MIN_TIME_US,
    SUPPORTED_SCHEMA_VERSIONS,
    configs_problem,
    host_steps_problem,
    id_problem,
    int_limit,
    int_name,
    metrics_problem,
    shown,
    text_problem,
    workload_uid_problem,
)
from goodput_schemas.wire import encode_batch, json_double, workload_run_id

#: The head of an oversized message kept as its dead letter's payload, in bytes.
OVERSIZED_PAYLOAD_BYTES = 64 * 1024

#: Every event kind, in schema order.
EVENT_KINDS: tuple[str, ...] = tuple(
    field.name for field in EventBatch.Event.DESCRIPTOR.oneofs_by_name["kind"].fields
)
# Model metrics are observations, not durations: a diverged loss may be NaN, a loss negative.
_OBSERVATION_KINDS = frozenset({"model_metrics"})
_HEADER_FIELDS = ("schema_version", "run_id", "attempt_id")
_HEADER_STRINGS = ("run_id", "attempt_id", "workload_uid")


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


@dataclasses.dataclass(frozen=True)
class Batch:
    """The valid events of one message (one attempt), with step starts kept in columns.

    Step starts are nearly every event of a training run; as three int64 arrays they cost 24
    bytes each instead of an object, and encode between pipeline stages as raw bytes.

    ``run_id`` is the run the events belong to, which every stage is keyed by: the message's run
    id, or for a message of a workload (``workload_uid``) the id derived from both
    (``goodput_schemas.wire.workload_run_id``), so that a name reused by another workload is
    another run; an id that ends as a derived one does is derived too. ``run_name`` is the
    message's own run id when it differs ("" when it is ``run_id``).
    """

    run_id: str
    attempt_id: str
    step_seqs: array[int]
    step_times: array[int]
    steps: array[int]
    others: tuple[Event, ...]
    workload_uid: str = ""
    run_name: str = ""

    def __len__(self) -> int:
        return len(self.steps) + len(self.others)

    @property
    def max_time_us(self) -> int:
        times = [max(self.step_times)] if self.step_times else []
        return max(times + [e.time_us for e in self.others])

    def events(self) -> list[Event]:
        """Every event as an ``Event``, in seq order."""
        steps = [Event(self.run_id, self.attempt_id, seq, t, "step_start", {"step": step})
                 for seq, t, step in zip(self.step_seqs, self.step_times, self.steps, strict=True)]
        return sorted(steps + list(self.others), key=lambda e: e.seq)


def encode_events(events: Sequence[Event], run_name: str = "", workload_uid: str = "") -> bytes:
    """The message carrying ``events`` (all of one attempt), in the order given, as the emitter
    encodes it: ``parse_batch`` reads the same events back. With ``run_name`` and
    ``workload_uid`` (``Batch.run_name``, ``Batch.workload_uid``), as the job's emitter encoded
    them: under the run id it gave, naming its workload, from which the parser derives the events'
    run again."""
    records = [(e.seq, e.time_us, e.kind, _json_body(e.body)) for e in events]
    return encode_batch(run_name or events[0].run_id, events[0].attempt_id, records, workload_uid).data


def _json_body(body: dict[str, Any]) -> dict[str, Any]:
    """An event body as the emitter writes it: non-finite doubles (a metric's too) as strings."""
    return {k: json_double(v) if type(v) is float else _json_body(v) if k == "values" else v
            for k, v in body.items()}


def _decode(data: bytes | str) -> str:
    return data if isinstance(data, str) else data.decode("utf-8")


def _plain(message: ProtoMessage, defaults: bool = True) -> dict[str, Any]:
    """A protobuf message as plain Python values (int64 stays int).

    Scalars without presence are included with ``defaults`` (an event body's: ``step`` 0 is a
    real step), else only when not empty (a submessage's: an empty field of ``JobStart.workload``
    is one the emitter could not see, and is written so); optional fields and submessages only
    when set.
    """
    values: dict[str, Any] = {}
    for field in message.DESCRIPTOR.fields:
        value = getattr(message, field.name)
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            values[field.name] = dict(value)
        elif field.has_presence and not message.HasField(field.name):
            continue
        elif field.message_type is not None:
            values[field.name] = _plain(value, defaults=False)
        elif defaults or value != field.default_value:
            values[field.name] = value
    return values


def _shown(value: Any, limit: int = 80) -> str:
    """``repr(value)``, shortened for a reason a person reads (a container by its type only)."""
    if isinstance(value, (list, dict)):
        return _JSON_TYPES[type(value)]
    return shown(value, limit) if isinstance(value, str) else repr(value)


def latest_time_us(now_us: int | None = None) -> int:
    """The latest event time accepted when the pipeline's clock reads ``now_us`` (default: the
    wall clock): ``MAX_CLOCK_AHEAD_S`` later."""
    now = round(time.time() * 1_000_000) if now_us is None else now_us
    return now + MAX_CLOCK_AHEAD_S * 1_000_000


def event_problem(kind: str | None, seq: int, time_us: int, body: dict[str, Any],
                  latest_us: int) -> str | None:
    """Why an event is invalid (the schema's rules and the contract's limits), or None;
    ``latest_us`` is the latest event time accepted (``latest_time_us``)."""
    if kind is None:
        return (f"event has no kind: set exactly one of the {len(EVENT_KINDS)} fields of Event.kind "
                f"(goodput_event.proto), e.g. {', '.join(EVENT_KINDS[:3])}")
    if seq < 0:
        return f"seq must be >= 0, got {seq}"
    if seq > MAX_COUNT:
        return f"seq must be at most {int_name(MAX_COUNT)}, got {seq}"
    if not MIN_TIME_US <= time_us < MAX_TIME_US:
        if time_us == 0:
            return "time_us is missing (or 0): it must be in 2000-01-01..2200-01-01 UTC"
        return f"time_us {time_us} is outside 2000-01-01..2200-01-01 UTC"
    if time_us > latest_us:
        ahead_s = (time_us - latest_us) / 1_000_000 + MAX_CLOCK_AHEAD_S
        return (f"time_us {time_us} is {ahead_s:.0f} s ahead of the pipeline's clock, more than "
                f"MAX_CLOCK_AHEAD_S ({MAX_CLOCK_AHEAD_S} s): a host clock far ahead, or a corrupt time")
    problem: str | None
    for name, value in body.items():
        if type(value) is str:
            problem = text_problem(f"{kind}.{name}", value)
            if problem is not None:
                return problem
            continue
        if type(value) is dict:
            problem = _dict_problem(kind, name, value)
            if problem is not None:
                return problem
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if kind in _OBSERVATION_KINDS and name != "step":
            continue
        if not math.isfinite(value):
            return f"{kind}.{name} must be finite, got {value}"
        if value < 0:
            return f"{kind}.{name} must be >= 0, got {value}"
        if type(value) is int and value > int_limit(name):
            return f"{kind}.{name} must be at most {int_name(int_limit(name))}, got {value}"
        if type(value) is float and value > MAX_DURATION_S:  # the doubles outside observations are durations
            return f"{kind}.{name} must be at most MAX_DURATION_S ({MAX_DURATION_S:.0f} s), got {value}"
    ideal = body.get("configured_ideal_step_time_s")
    if ideal is not None and not ideal > 0:
        return f"job_start.configured_ideal_step_time_s must be > 0, got {ideal}"
    if kind == "host_steps":
        problem = host_steps_problem(body.get("host", ""), body.get("count", 0), body.get("mean_s", 0.0),
                                     body.get("max_s", 0.0))
        if problem is not None:
            return problem
    if kind == "configs":
        problem = configs_problem(body.get("source", ""), body.get("values", {}))
        if problem is not None:
            return problem
    if kind == "metrics":
        problem = metrics_problem(body.get("values", {}))
        if problem is not None:
            return problem
    if kind == "elastic_slice_counts":
        total = body.get("total_slices", 0)
        for name in ("active_slices", "available_slices"):
            if body.get(name, 0) > total:
                return f"elastic_slice_counts.{name} ({body[name]}) must be at most total_slices ({total})"
    return None


def _dict_problem(kind: str, name: str, value: dict[str, Any]) -> str | None:
    """Why a map or a submessage of an event body is invalid, or None: the labels map (free text
    under printable keys), the workload (printable names, as ids are); a ``configs`` or ``metrics``
    event's values have their own rules (``configs_problem``, ``metrics_problem``)."""
    if kind in ("configs", "metrics"):
        return None
    if name == "workload":
        problems = (text_problem(f"{kind}.workload.{key}", text) for key, text in value.items())
        return next(filter(None, problems), None)
    if len(value) > MAX_LABELS:
        return f"{kind}.{name} has {len(value)} labels, more than MAX_LABELS ({MAX_LABELS})"
    for key, text in value.items():
        problem = (text_problem(f"{kind}.{name} key {_shown(key, 40)}", key)
                   or text_problem(f"{kind}.{name}[{_shown(key, 40)}]", text, free_form=True))
        if problem is not None:
            return problem
    return None


# The fast path: the JSON shapes the emitter writes, checked against the descriptor directly.
# Anything else (camelCase names, int64 as strings, nulls, wrong types) takes the slow path
# through the protobuf JSON parser, which decides exactly as Pub/Sub's schema check would.
_FD = FieldDescriptor
_INT64 = (-(2**63), 2**63 - 1)
_INT32 = (-(2**31), 2**31 - 1)
_NON_FINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
# name, cpp type (a map's: its values' type), has presence, is map, default
_Spec = tuple[str, int, bool, bool, Any]


def _field_specs(descriptor: Any) -> tuple[dict[str, _Spec], dict[str, Any]]:
    specs: dict[str, _Spec] = {}
    defaults: dict[str, Any] = {}
    for field in descriptor.fields:
        is_map = field.message_type is not None and field.message_type.GetOptions().map_entry
        default = {} if is_map else field.default_value
        cpp = field.message_type.fields_by_name["value"].cpp_type if is_map else field.cpp_type
        specs[field.name] = (field.name, cpp, field.has_presence, is_map, default)
        if not field.has_presence:
            defaults[field.name] = default
    return specs, defaults


_KIND_SPECS = {name: _field_specs(EventBatch.Event.DESCRIPTOR.fields_by_name[name].message_type)
               for name in EVENT_KINDS}
_BATCH_KEYS = frozenset({"schema_version", "run_id", "attempt_id", "workload_uid", "events"})


def _fast_value(spec: _Spec, value: Any) -> Any:
    """The plain value of one body field, or _SLOW if only the protobuf parser can tell."""
    _, cpp, _, is_map, _ = spec
    if not is_map:
        return _fast_scalar(cpp, value)
    if type(value) is not dict:
        return _SLOW
    if cpp == _FD.CPPTYPE_STRING:  # labels, configs
        return dict(value) if all(type(v) is str for v in value.values()) else _SLOW
    plain = {key: _fast_scalar(cpp, item) for key, item in value.items()}
    return _SLOW if _SLOW in plain.values() else plain


def _fast_scalar(cpp: int, value: Any) -> Any:
    """The plain value of a scalar of protobuf type ``cpp``, or _SLOW if only the protobuf parser
    can tell."""
    kind = type(value)
    if cpp in (_FD.CPPTYPE_INT64, _FD.CPPTYPE_INT32):
        low, high = _INT64 if cpp == _FD.CPPTYPE_INT64 else _INT32
        if kind is int and low <= value <= high:
            return value
    elif cpp in (_FD.CPPTYPE_DOUBLE, _FD.CPPTYPE_FLOAT):
        if kind is float or kind is int:
            return float(value)
        if kind is str and value in _NON_FINITE:
            return _NON_FINITE[value]
    elif cpp == _FD.CPPTYPE_STRING:
        if kind is str:
            return value
    elif cpp == _FD.CPPTYPE_BOOL and kind is bool:
        return value
    return _SLOW


_SLOW = object()


def _fast_event(raw: Any) -> tuple[int, int, str, dict[str, Any]] | None:
    """(seq, time_us, kind, body) of an event in the emitter's shape, else None."""
    if type(raw) is not dict or len(raw) != 3:
        return None
    seq, time_us = raw.get("seq"), raw.get("time_us")
    if type(seq) is not int or type(time_us) is not int:
        return None
    kind = next((k for k in raw if k != "seq" and k != "time_us"), None)
    specs_defaults = _KIND_SPECS.get(kind) if kind is not None else None
    given = raw[kind] if specs_defaults is not None else None
    if type(given) is not dict or not (_INT64[0] <= seq <= _INT64[1] and _INT64[0] <= time_us <= _INT64[1]):
        return None
    assert specs_defaults is not None and kind is not None
    specs, defaults = specs_defaults
    body = dict(defaults)
    for name, value in given.items():
        spec = specs.get(name)
        plain = _SLOW if spec is None else _fast_value(spec, value)
        if plain is _SLOW:
            return None
        body[name] = plain
    return seq, time_us, kind, body


# The emitter's messages are read in columns: step starts, nearly every event, in the exact shape
# the emitter writes them, by one regex and numpy, with no Python work per event; the other
# events one by one as in the general path. The patterns accept only what the general path below
# reads the same way: plain ids, step numbers below 10**18 without leading zeros (inside int64;
# the time bounds are checked on the columns), and other events of objects nested at most three
# deep (so that the regex finds where each event ends), with a workload uid in the header or
# without. Anything else, and any message with an invalid event, takes the general path, which
# decides.
_NUMBER = rb"(?:0|[1-9][0-9]{0,17})"
_SEQ = rb'\{"seq":'  # every event begins so: a literal prefix lets the regex skip ahead
_STEP_REST = _NUMBER + rb',"time_us":' + _NUMBER + rb',"step_start":\{"step":' + _NUMBER + rb"\}\}"
_STEP = _SEQ + _STEP_REST
_STRING = rb'"(?:[^"\\]|\\.)*"'
_SCALARS = rb'(?:' + _STRING + rb'|[^"{}\[\]])*'
_FLAT = rb"\{" + _SCALARS + rb"\}"
_OTHER_REST = rb"(?:" + _STRING + rb"|\{(?:" + _STRING + rb"|" + _FLAT + rb'|[^"{}\[\]])*\}|[^"{}\[\]])*\}'
_OTHER = _SEQ + _OTHER_REST
_OTHER_NOT_STEP = re.compile(rb"(" + _SEQ + rb"(?!" + _STEP_REST + rb"(?:,|$))" + _OTHER_REST + rb")")
_ID = rb'"([^"\\\x00-\x1f]{1,%d})"' % MAX_ID_LENGTH
_UID = rb'(?:,"workload_uid":"([^"\\\x00-\x1f]{1,%d})")?' % MAX_UID_LENGTH
_HEADER = rb'\{"schema_version":1,"run_id":' + _ID + rb',"attempt_id":' + _ID + _UID + rb',"events":\['
_STEPS_MESSAGE = re.compile(_HEADER + rb"((?:" + _STEP + rb",)*+" + _STEP + rb")\]\}")
_EVENT = rb"(?:" + _STEP + rb"|" + _OTHER + rb")"
_MESSAGE = re.compile(_HEADER + rb"((?:" + _EVENT + rb",)*+" + _EVENT + rb")\]\}")
_MAX_OTHER_SHARE = 0.1  # of a message's events, for the columnar path
_DIGITS_ONLY = bytes(c if 0x30 <= c <= 0x39 else 0x20 for c in range(256))


def _columnar(data: bytes, latest_us: int | None = None) -> Batch | None:
    """The batch of a valid message in the emitter's exact shape, read in columns; else None.
    ``latest_us`` is the latest event time accepted (``latest_time_us``)."""
    if latest_us is None:
        latest_us = latest_time_us()
    match = _STEPS_MESSAGE.fullmatch(data)
    if match is None:
        # Other events are read one by one here, a regex pass and a decode each: where they are
        # more than a few (metrics every step), one decode of the whole message is faster.
        count = data.count(b'{"seq":')
        if count - data.count(b'"step_start":{"step":') > _MAX_OTHER_SHARE * count:
            return None
        match = _MESSAGE.fullmatch(data)
    if match is None:
        return None
    try:
        name, attempt_id, uid = (part.decode() if part else "" for part in match.group(1, 2, 3))
    except UnicodeDecodeError:
        return None
    if not (name.isprintable() and attempt_id.isprintable() and uid.isprintable()):
        return None
    run_id = workload_run_id(name, uid)
    events = match[4]
    others: list[Event] = []
    if match.re is _MESSAGE:
        parts = _OTHER_NOT_STEP.split(events)  # step starts, an other event, step starts, ...
        for item in parts[1::2]:
            try:
                raw = _JSON.decode(item.decode())
            except ValueError:  # UnicodeDecodeError included
                return None
            event = _read_event(raw, run_id, attempt_id, latest_us)
            if not isinstance(event, Event) or _inline_step(raw, latest_us) is not None:
                return None  # the general path decides (and keeps the message's order of steps)
            others.append(event)
        events = b" ".join(parts[0::2])
    digits = events.translate(_DIGITS_ONLY)
    numbers = np.fromstring(digits, dtype=np.int64, sep=" ") if digits.strip() else np.empty(0, np.int64)
    columns = numbers.reshape(-1, 3)
    if len(columns) + len(others) > MAX_EVENTS_PER_MESSAGE:
        return None
    times = columns[:, 1]
    if len(times) and (times.min() < MIN_TIME_US or times.max() >= MAX_TIME_US or times.max() > latest_us
                       or columns[:, 0].max() > MAX_COUNT or columns[:, 2].max() > MAX_COUNT):
        return None
    return Batch(run_id, attempt_id, array("q", columns[:, 0].tobytes()), array("q", times.tobytes()),
                 array("q", columns[:, 2].tobytes()), tuple(others), uid, name if name != run_id else "")


def _inline_step(raw: Any, latest_us: int) -> tuple[int, int, int] | None:
    """(seq, time_us, step) of the commonest event in its plain shape, checked inline:
    ``{"seq": int, "time_us": int, "step_start": {"step": int}}``; else None."""
    if type(raw) is dict and len(raw) == 3:
        body = raw.get("step_start")
        if type(body) is dict and len(body) == 1:
            seq, time_us, step = raw.get("seq"), raw.get("time_us"), body.get("step")
            if (type(seq) is int and type(time_us) is int and type(step) is int
                    and 0 <= seq <= MAX_COUNT and 0 <= step <= MAX_COUNT
                    and MIN_TIME_US <= time_us < MAX_TIME_US and time_us <= latest_us):
                return seq, time_us, step
    return None


_EVENT_KEYS = frozenset(name for field in EventBatch.Event.DESCRIPTOR.fields
                        for name in (field.name, field.json_name))
_JSON_TYPES = {dict: "an object", list: "an array", str: "a string", int: "a number", float: "a number",
               bool: "a boolean", type(None): "null"}
_TOO_DEEP = f"message nests deeper than MAX_JSON_DEPTH ({MAX_JSON_DEPTH}): not an EventBatch"


def _read_event(raw: Any, run_id: str, attempt_id: str, latest_us: int) -> Event | str:
    """One event of a message as an ``Event``, or the reason it is invalid."""
    fields = _fast_event(raw)
    if fields is None:
        if _too_deep(raw, MAX_JSON_DEPTH - 2):  # an event is two levels down
            return _TOO_DEEP
        if type(raw) is not dict:
            return f"event must be a JSON object, got {_JSON_TYPES.get(type(raw), type(raw).__name__)}"
        unknown = next((key for key in raw if key not in _EVENT_KEYS), None)
        if unknown is not None:
            return (f"event does not match the schema: unknown event kind or field {_shown(unknown, 40)} "
                    "(from a newer emitter? deploy the pipeline that reads it first)")
        parsed = EventBatch.Event()
        try:
            json_format.ParseDict(raw, parsed)
        except (json_format.ParseError, TypeError, ValueError) as error:
            return f"event does not match the schema: {error}"
        kind = parsed.WhichOneof("kind")
        fields = (parsed.seq, parsed.time_us, kind or "", _plain(getattr(parsed, kind)) if kind else {})
    seq, time_us, kind, body = fields
    problem = event_problem(kind or None, seq, time_us, body, latest_us)
    return problem if problem is not None else Event(run_id, attempt_id, seq, time_us, kind, body)


def parse_message(data: bytes | str, source: str = "",
                  now_us: int | None = None) -> tuple[list[Event], list[DeadLetter]]:
    """Valid events of one message, and dead letters for whatever is invalid in it."""
    batch, dead = parse_batch(data, source, now_us)
    return (batch.events() if batch is not None else []), dead


def _no_constant(name: str) -> Any:
    """Refuses the non-standard tokens NaN and Infinity, which Python's json reads by default."""
    raise ValueError(f"{name} is not a JSON value (proto3 JSON writes a non-finite double as the "
                     f'string "{name}")')


_JSON = json.JSONDecoder(parse_constant=_no_constant)


def _too_deep(value: Any, limit: int) -> bool:
    """Whether ``value`` nests deeper than ``limit`` levels (found without recursion)."""
    stack = [(value, 1)]
    while stack:
        value, depth = stack.pop()
        if type(value) in (dict, list):
            if depth > limit:
                return True
            stack.extend((child, depth + 1) for child in (value.values() if type(value) is dict else value))
    return False


_HEAD_RUN_ID = re.compile(rb'"run_id"\s*:\s*"([^"\\\x00-\x1f]{1,%d})"' % MAX_ID_LENGTH)
_HEAD_UID = re.compile(rb'"workload_uid"\s*:\s*"([^"\\\x00-\x1f]{1,%d})"' % MAX_UID_LENGTH)


def _oversized(data: bytes, source: str) -> DeadLetter:
    """The dead letter of a message over ``MAX_MESSAGE_BYTES``: its head, and its run if the head
    names one (not parsed further: reading it is what the limit prevents)."""
    head = data[:OVERSIZED_PAYLOAD_BYTES]
    run_id, uid = (match[1].decode("utf-8", errors="replace") if match else ""
                   for match in (_HEAD_RUN_ID.search(head), _HEAD_UID.search(head)))
    reason = (f"message is {len(data)} bytes, more than MAX_MESSAGE_BYTES ({MAX_MESSAGE_BYTES}); "
              f"the payload holds its first {len(head)} bytes")
    return DeadLetter(head.decode("utf-8", errors="backslashreplace"), reason, source,
                      _run_of(run_id, uid))


def _run_of(run_id: Any, uid: Any) -> str:
    """The run a rejected message's dead letter names: the run of its run id (``workload_run_id``),
    with its workload uid if that is valid, or "" where the id cannot be read."""
    if not isinstance(run_id, str) or not run_id.isprintable():
        return ""
    valid = isinstance(uid, str) and workload_uid_problem(uid) is None
    return workload_run_id(run_id, uid if valid else "")


def parse_batch(data: bytes | str, source: str = "",
                now_us: int | None = None) -> tuple[Batch | None, list[DeadLetter]]:
    """Valid events of one message as a ``Batch`` (None if none), and dead letters.

    ``now_us`` is the pipeline's clock (default: the wall clock): an event dated more than
    ``MAX_CLOCK_AHEAD_S`` after it is a dead letter.
    """
    latest_us = latest_time_us(now_us)
    # Text is measured as the bytes it would be (a character is at most four).
    sized = data if isinstance(data, bytes) or len(data) <= MAX_MESSAGE_BYTES // 4 else data.encode(
        "utf-8", errors="surrogatepass")
    if len(sized) > MAX_MESSAGE_BYTES:
        assert isinstance(sized, bytes)
        return None, [_oversized(sized, source)]
    if isinstance(data, bytes):
        columnar = _columnar(data, latest_us)
        if columnar is not None:
            return columnar, []
    try:
        text = _decode(data)
    except UnicodeDecodeError as error:
        assert isinstance(data, bytes)
        raw = data.decode("utf-8", errors="backslashreplace")
        return None, [DeadLetter(raw, f"message is not UTF-8: {error}", source)]

    def reject(reason: str, run_id: str = "") -> tuple[Batch | None, list[DeadLetter]]:
        return None, [DeadLetter(text, reason, source, run_id)]

    # Depth is checked where the protobuf parser or a payload's encoding would recurse: in the
    # header when the parser reads it, and in events the fast path cannot read.
    try:
        document = _JSON.decode(text)
    except ValueError as error:
        return reject(f"message is not valid JSON: {error}")
    except RecursionError:
        return reject(_TOO_DEEP)
    if not isinstance(document, dict):
        return reject(f"message must be a JSON object (an EventBatch), got "
                      f"{_JSON_TYPES.get(type(document), type(document).__name__)}")
    run_id = _run_of(document.get("run_id"), document.get("workload_uid"))  # the run its dead letters name
    version = document.get("schema_version")
    if type(version) not in (int, float) or version not in SUPPORTED_SCHEMA_VERSIONS:  # true is no 1
        known = sorted(SUPPORTED_SCHEMA_VERSIONS)
        if "schema_version" not in document:
            why = "the message has none"
        elif type(version) is int and version > known[-1]:
            why = "newer than this pipeline (deploy a pipeline that reads it before emitters that write it)"
        else:
            why = "not a version of this contract"
        return reject(f"unsupported schema_version {_shown(version, 40)}: {why}; this pipeline reads {known}",
                      run_id)
    if not (document.keys() <= _BATCH_KEYS
            and all(type(document.get(field, "")) is str for field in _HEADER_STRINGS)):
        header = {k: v for k, v in document.items() if k != "events"}
        if _too_deep(header, MAX_JSON_DEPTH):
            return reject(_TOO_DEEP, run_id)
        try:
            json_format.ParseDict(header, EventBatch())
        except json_format.ParseError as error:
            return reject(f"message does not match the schema: {error}", run_id)
    # The header's proto field names only (goodput_schemas/README.md); a null id is a missing one.
    name, attempt_id, uid = (value if type(value) is str else "" for value in (
        document.get("run_id"), document.get("attempt_id"), document.get("workload_uid")))
    for field, value in (("run_id", name), ("attempt_id", attempt_id)):
        problem = id_problem(field, value)
        if problem is not None:
            return reject(problem, run_id)
    if "workloadUid" in document:  # the schema reads it, but a uid left unread would merge runs
        return reject('the header names "workloadUid": header fields go by their proto names, workload_uid',
                      run_id)
    problem = workload_uid_problem(uid)
    if problem is not None:
        return reject(problem, run_id)
    batch_run_id = workload_run_id(name, uid)
    raw_events = document.get("events")
    if not isinstance(raw_events, list) or not raw_events:
        return reject("message has no events: 'events' must be a non-empty list", run_id)
    if len(raw_events) > MAX_EVENTS_PER_MESSAGE:
        return reject(f"message has {len(raw_events)} events, more than MAX_EVENTS_PER_MESSAGE "
                      f"({MAX_EVENTS_PER_MESSAGE})", batch_run_id)

    others: list[Event] = []
    dead: list[DeadLetter] = []
    step_seqs, step_times, steps = array("q"), array("q"), array("q")
    for index, raw in enumerate(raw_events):
        step = _inline_step(raw, latest_us)
        if step is not None:
            step_seqs.append(step[0])
            step_times.append(step[1])
            steps.append(step[2])
            continue
        event = _read_event(raw, batch_run_id, attempt_id, latest_us)
        if event is _TOO_DEEP:
            return reject(_TOO_DEEP, batch_run_id)
        if isinstance(event, Event):
            others.append(event)
        else:
            where = f"{source}#event{index}" if source else f"event{index}"
            dead.append(DeadLetter(json.dumps(raw), event, where, batch_run_id))
    if not steps and not others:
        return None, dead
    return Batch(batch_run_id, attempt_id, step_seqs, step_times, steps, tuple(others), uid,
                 name if name != batch_run_id else ""), dead


#: What a gzip file begins with; no JSON text does (it is not whitespace), so the test is unambiguous.
GZIP_MAGIC = b"\x1f\x8b"
#: The UTF-8 byte order mark that some editors put at the start of a text file.
UTF8_BOM = b"\xef\xbb\xbf"


def event_file_lines(path: str) -> Iterator[bytes]:
    """The lines of an emitter file: decompressed if it is gzip-compressed, and without a UTF-8
    byte order mark at its start."""
    import gzip

    with open(path, "rb") as handle:
        compressed = handle.read(len(GZIP_MAGIC)) == GZIP_MAGIC
        handle.seek(0)
        lines = iter(gzip.GzipFile(fileobj=handle, mode="rb") if compressed else handle)
        first = next(lines, None)
        if first is not None:
            yield first.removeprefix(UTF8_BOM)
            yield from lines


def read_lines(path: str) -> Iterator[tuple[str, bytes]]:
    """("file:line", message) for every non-empty line of an emitter file: its messages, each with
    where it came from (the ``source`` of ``parse_batch``)."""
    for number, line in enumerate(event_file_lines(path), start=1):
        line = line.rstrip(b"\r\n")
        if line.strip():
            yield f"{path}:{number}", line

