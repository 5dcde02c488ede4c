"""Imports a job's history from the reference library's Cloud Logging log as pipeline events.

Jobs that ran with ``ml-goodput-measurement`` left their goodput history in a Cloud Logging log
(``logger_name``, e.g. ``goodput_<run>``). Export it and import it, and the pipeline computes
those runs like any other::

    gcloud logging read 'logName="projects/P/logs/goodput_my-run"' --format=json > history.json
    goodput import history.json --output history.jsonl
    python -m pipeline --events=history.jsonl --duckdb=goodput.duckdb

or publish straight to the events topic with ``--destination projects/P/topics/T``.

Input: ``gcloud logging read --format=json`` output (a JSON array of LogEntry objects), or JSON
lines of LogEntry objects or of bare ``jsonPayload`` objects. Every reference payload becomes
one event of the same kind and time (the mapping is ``_KINDS`` and ``_orbax_event`` below,
the same one ``tests/unit/test_reference_replay.py`` checks for the recorder). Orbax's checkpoint
save and restore entries become ``checkpoint_save`` and ``checkpoint_restore`` events.

The reference has no attempts: a new attempt starts at each ``job_start_time`` entry (entries
before a run's first one form an attempt of their own). Attempt ids are derived from the run and
the attempt's first entry, and events are numbered in log order, so importing the same export
twice gives the same event ids and the pipeline counts each event once. (An export that starts in
the middle of an attempt numbers that attempt's events differently from one that starts at its
beginning: import overlapping exports only when each starts at an attempt boundary.) Entries are
taken in LogEntry timestamp order (``gcloud`` lists the newest first), the order the reference
reads them; bare payloads keep their order in the file. A LogEntry seen twice (same log, insert
id and timestamp) or a bare payload seen twice is counted as a duplicate and imported once.
Anything that cannot be imported is counted and reported with its reason, never dropped unseen:
that includes a value outside the event contract's limits (``goodput_schemas.limits``: ids,
strings, step and slice counts, durations, and times no later than ``MAX_CLOCK_AHEAD_S`` after
the importer's clock), which the pipeline would otherwise dead-letter, and an entry nested deeper
than ``MAX_JSON_DEPTH``. One bad entry costs only itself: an element of ``gcloud``'s array that
does not parse is rejected alone, and a byte that is not UTF-8 only the entry it is in.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import datetime
import hashlib
import itertools
import json
import math
import re
import sys
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, BinaryIO, TextIO, TypeGuard

from emitter.transports import PubSubTransport
from goodput_schemas.limits import (
    MAX_DURATION_S,
    MAX_JSON_DEPTH,
    MAX_TIME_US,
    MIN_TIME_US,
    id_problem,
    int_limit,
    int_name,
    text_problem,
)
from goodput_schemas.wire import Message, Record, encode_batch
from pipeline.core.events import event_problem, latest_time_us

#: Events per message; well under Pub/Sub's 10 MB message limit.
EVENTS_PER_MESSAGE = 1000

# The reference's payload time key -> our event kind, and the payload field -> our body field.
_KINDS: tuple[tuple[str, str, dict[str, str]], ...] = (
    ("job_start_time", "job_start", {}),
    ("job_end_time", "job_end", {}),
    ("step_start_time", "step_start", {"step_count": "step"}),
    ("tpu_init_start_time", "tpu_init_start", {}),
    ("tpu_init_end_time", "tpu_init_end", {}),
    ("training_prep_start_time", "training_prep_start", {}),
    ("training_prep_end_time", "training_prep_end", {}),
    ("data_loading_start_time", "data_loading_start", {}),
    ("data_loading_end_time", "data_loading_end", {}),
    ("custom_badput_event_start_time", "custom_badput_start", {"custom_badput_event_type": "badput_type"}),
    ("custom_badput_event_end_time", "custom_badput_end", {"custom_badput_event_type": "badput_type"}),
    ("elastic_slice_counts_timestamp", "elastic_slice_counts",
     {"active_slices": "active_slices", "total_slices": "total_slices",
      "available_slices": "available_slices"}),
    ("elastic_wait_start_time", "elastic_wait_start", {"elastic_wait_event_type": "event_type"}),
    ("elastic_wait_end_time", "elastic_wait_end", {"elastic_wait_event_type": "event_type"}),
    ("elastic_reinit_start_time", "elastic_reinit_start", {}),
    ("elastic_reinit_end_time", "elastic_reinit_end", {}),
)
# Body fields that are counts (Cloud Logging stores every number as a double: 5.0).
_COUNTS = frozenset({"step", "active_slices", "total_slices", "available_slices"})
# The reference's default for a custom badput event without a type.
_DEFAULTS = {"badput_type": "unknown"}
# Orbax entries: when training blocked, by preference, and the blocking duration.
_SAVE_TIMES = ("checkpoint_manager_blocking_start_time", "wait_for_prev_start_time",
               "checkpointer_blocking_start_time")
_RESTORE_TIMES = ("checkpoint_manager_start_time", "checkpointer_start_time")
# What tells how a JSON text nests: a string (the brackets in it are text), or a bracket or comma.
_STRUCTURE = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[][{},]', re.S)
_NOT_SPACE = re.compile(r"\S")
_DECODER = json.JSONDecoder()


@dataclasses.dataclass(frozen=True)
class Rejected:
    """An entry that was not imported.

    Attributes:
        source: Where it is, e.g. ``history.json#12`` (array index) or ``history.jsonl:13`` (line).
        reason: Why, one of a few fixed phrases (``ImportResult.reasons`` counts them).
        detail: The specifics, for a person to read.
        payload: The entry's JSON text.
    """

    source: str
    reason: str
    detail: str
    payload: str


@dataclasses.dataclass
class ImportResult:
    """What an import read, made and rejected.

    Attributes:
        entries: Entries read (every array element or non-blank line).
        events: Events made, one per imported entry.
        duplicates: Entries seen before in this import, imported once.
        other_jobs: Entries of jobs the ``job_name`` filter left out.
        rejected: Entries that could not be imported, with the reasons.
        attempts: Attempts made, per run.
        messages: The messages, in order: a run's attempts in log order, each in seq order.
    """

    entries: int = 0
    events: int = 0
    duplicates: int = 0
    other_jobs: int = 0
    rejected: list[Rejected] = dataclasses.field(default_factory=list)
    attempts: dict[str, int] = dataclasses.field(default_factory=dict)
    messages: list[Message] = dataclasses.field(default_factory=list)

    @property
    def reasons(self) -> collections.Counter[str]:
        """Rejected entries counted by reason."""
        return collections.Counter(rejected.reason for rejected in self.rejected)

    def summary(self) -> str:
        """A few lines for a person: counts, runs, and each reason with an example."""
        lines = [f"{self.entries} entries read: {self.events} events in {len(self.messages)} messages, "
                 f"{len(self.attempts)} runs, {sum(self.attempts.values())} attempts; "
                 f"{self.duplicates} duplicates, {self.other_jobs} of other jobs, "
                 f"{len(self.rejected)} rejected"]
        for reason, count in sorted(self.reasons.items()):
            example = next(r for r in self.rejected if r.reason == reason)
            lines.append(f"  rejected {count}: {reason} (e.g. {example.source}: {example.detail})")
        return "\n".join(lines)


class _Reject(Exception):
    def __init__(self, reason: str, detail: str, raw: str = "") -> None:
        super().__init__(reason, detail)
        self.reason, self.detail, self.raw = reason, detail, raw


@dataclasses.dataclass(frozen=True)
class _Entry:
    source: str
    payload: dict[str, Any]
    write_time_us: int | None  # the LogEntry timestamp; None for a bare payload
    identity: str  # what makes two copies of the entry the same entry


def read_entries(text: str, source: str = "") -> Iterator[tuple[str, Any]]:
    """(where, parsed JSON) of each entry of an export: a JSON array, or JSON lines.

    An entry that is not JSON, or that nests deeper than ``MAX_JSON_DEPTH`` (the limit an event
    is held to), comes back as a ``_Reject`` in place of its value, and the entries after it are
    read on.
    """
    if text.lstrip().startswith("["):
        yield from _array_entries(text, source)
        return
    for number, line in enumerate(text.splitlines(), 1):
        if line.strip():
            yield f"{source}:{number}", _parsed(line)


def _array_entries(text: str, source: str) -> Iterator[tuple[str, Any]]:
    """``read_entries`` of a JSON array, one element at a time: an element that does not parse
    is rejected alone, from where it starts to the comma or bracket that ends it."""
    position, index = _skip_space(text, text.index("[") + 1), 0
    while not text.startswith("]", position):
        if position == len(text):
            yield source, _Reject("invalid JSON", "the JSON array does not end: the export is cut short")
            return
        try:
            value, end = _DECODER.raw_decode(text, position)
            if _nests_too_deep(text, position, end):
                value = _too_deep(text[position:end])
        except (ValueError, RecursionError):  # RecursionError: nested past Python's stack
            end = max(_extent(text, position)[0], position + 1)  # a stray comma or bracket is skipped
            value = _parsed(text[position:end])
        yield f"{source}#{index}", value
        index += 1
        position = _skip_space(text, end)
        if text.startswith(",", position):
            position = _skip_space(text, position + 1)
    rest = text[position + 1:]
    if rest.strip():
        yield source, _Reject("invalid JSON", "text after the end of the JSON array", rest[:10_000])


def _skip_space(text: str, position: int) -> int:
    """The first position from ``position`` on that is not white space, or the end of ``text``."""
    found = _NOT_SPACE.search(text, position)
    return found.start() if found else len(text)


def _parsed(text: str) -> Any:
    """The value of one entry's JSON text, or a ``_Reject`` saying why it has none (parsed only
    once its depth is known, so that the parser never recurses past the limit)."""
    if _nests_too_deep(text, 0, len(text)):
        return _too_deep(text)
    try:
        return json.loads(text)
    except ValueError as error:
        return _Reject("invalid JSON", str(error), text)


def _too_deep(text: str) -> _Reject:
    return _Reject("too deep", f"the entry nests {_extent(text, 0)[1]} levels deep, more than MAX_JSON_DEPTH "
                               f"({MAX_JSON_DEPTH}), the limit an event is held to", text)


def _nests_too_deep(text: str, start: int, end: int) -> bool:
    """Whether the JSON value of ``text[start:end]`` nests deeper than ``MAX_JSON_DEPTH`` (its
    brackets are counted first: an entry seldom has enough to)."""
    return (text.count("[", start, end) + text.count("{", start, end) > MAX_JSON_DEPTH
            and _extent(text, start)[1] > MAX_JSON_DEPTH)


def _extent(text: str, start: int) -> tuple[int, int]:
    """Where the JSON value at ``start`` ends (the first comma or closing bracket outside it, or
    the end of ``text``) and how deep it nests, read without parsing it: a string is one token,
    so a bracket inside it is text."""
    depth = deepest = 0
    for token in _STRUCTURE.finditer(text, start):
        mark = token.group()
        if mark in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif mark in ",]}" and depth == 0:
            return token.start(), deepest
        elif mark in "]}":
            depth -= 1
    return len(text), deepest


def _parse_timestamp(value: object) -> int:
    """Microseconds since the epoch of an RFC 3339 LogEntry timestamp (nanoseconds are cut)."""
    if not isinstance(value, str):
        raise _Reject("bad timestamp", f"LogEntry timestamp must be an RFC 3339 string, got {value!r}")
    text = re.sub(r"(\.\d{6})\d+", r"\1", value.strip()).replace("Z", "+00:00").replace("z", "+00:00")
    try:
        moment = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise _Reject("bad timestamp", f"LogEntry timestamp {value!r} is not RFC 3339") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.timezone.utc)
    epoch = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)
    return (moment - epoch) // datetime.timedelta(microseconds=1)


def _entry(source: str, value: object) -> _Entry:
    if isinstance(value, _Reject):
        raise value
    if not isinstance(value, dict):
        raise _Reject("not a JSON object", f"an entry must be a LogEntry or a jsonPayload object, "
                                           f"got {type(value).__name__}")
    if "jsonPayload" in value:
        payload = value["jsonPayload"]
        if not isinstance(payload, dict):
            raise _Reject("no jsonPayload", "the LogEntry's jsonPayload is not an object")
        write_time = _parse_timestamp(value["timestamp"]) if "timestamp" in value else None
        insert_id = value.get("insertId")
        identity = (json.dumps([value.get("logName"), insert_id, value.get("timestamp")])
                    if insert_id else json.dumps(payload, sort_keys=True))
        return _checked(_Entry(source, payload, write_time, identity))
    if any(key in value for key in ("textPayload", "protoPayload", "logName", "insertId")):
        raise _Reject("no jsonPayload", "a LogEntry without a jsonPayload is not a goodput entry")
    return _checked(_Entry(source, value, None, json.dumps(value, sort_keys=True)))


def _checked(entry: _Entry) -> _Entry:
    run_id = entry.payload.get("job_name")
    if not isinstance(run_id, str) or not run_id:
        raise _Reject("no job_name", f"jsonPayload.job_name must be a non-empty string, got {run_id!r}")
    problem = id_problem("jsonPayload.job_name (the run id)", run_id)
    if problem is not None:
        raise _Reject("bad field", problem)
    return entry


def _number(value: object) -> TypeGuard[int | float]:
    """Whether a JSON value is a finite number: a boolean is not one, and an integer of any size
    is (compared, never converted to a float, which an integer past 1e308 cannot be)."""
    return not isinstance(value, bool) and (
        isinstance(value, int) or (isinstance(value, float) and math.isfinite(value)))


def _time_us(payload: dict[str, Any], key: str) -> int:
    value = payload.get(key)
    if not _number(value):
        raise _Reject("bad time", f"{key} must be a number of seconds since the epoch, got {value!r}")
    time_us = value * 1_000_000  # a float past 1e302 becomes an infinity here: compared, not rounded
    if not MIN_TIME_US <= time_us < MAX_TIME_US:
        raise _Reject("bad time", f"{key} {value!r} is outside 2000-01-01..2200-01-01 UTC")
    return round(time_us)


def _count(name: str, value: object, ours: str) -> int:
    """A count of the reference's field ``name``, held to the limit of our field ``ours``."""
    limit = int_limit(ours)
    if not _number(value) or not 0 <= value <= limit or value != int(value):
        raise _Reject("bad field", f"{name} must be a whole number in 0..{int_name(limit)}, got {value!r}")
    return int(value)


def _string(name: str, value: object) -> str:
    if not isinstance(value, str):
        raise _Reject("bad field", f"{name} must be a string, got {value!r}")
    problem = text_problem(name, value)
    if problem is not None:
        raise _Reject("bad field", problem)
    return value


def _seconds(payload: dict[str, Any], key: str) -> float:
    value = payload.get(key)
    if not _number(value) or not 0 <= value <= MAX_DURATION_S:
        raise _Reject("incomplete checkpoint entry",
                      f"{key} must be seconds in 0..MAX_DURATION_S ({MAX_DURATION_S:.0f}), got {value!r}")
    return float(value)


def _orbax_event(payload: dict[str, Any], write_time_us: int | None) -> tuple[int, str, dict[str, Any]]:
    """An Orbax CheckpointManager save or restore entry as (time_us, kind, body)."""
    event_type = payload["event_type"]
    times: tuple[str, ...]
    if event_type == "save":
        kind, times, duration = "checkpoint_save", _SAVE_TIMES, "checkpoint_manager_blocking_duration_secs"
    elif event_type in ("restore", "emergency_restore"):
        kind, times, duration = "checkpoint_restore", _RESTORE_TIMES, "checkpoint_manager_duration_secs"
    else:
        raise _Reject("unknown payload", f"an Orbax entry of event_type {event_type!r}")
    body: dict[str, Any] = {"step": _count("step", payload.get("step"), "step"),
                            "blocking_s": _seconds(payload, duration)}
    if kind == "checkpoint_save":
        body["persistent"] = str(payload.get("directory", "")).startswith("gs://")
    key = next((k for k in times if isinstance(payload.get(k), (int, float))), None)
    if key is None:  # as the reference: the first field whose name says it is a time
        key = next((k for k, v in payload.items() if "time" in k and isinstance(v, (int, float))), None)
    if key is not None:
        return _time_us(payload, key), kind, body
    if write_time_us is None:
        raise _Reject("bad time", f"an Orbax {event_type} entry with no start time and no LogEntry timestamp")
    if not MIN_TIME_US <= write_time_us < MAX_TIME_US:
        raise _Reject("bad time", f"an Orbax {event_type} entry with no start time, and a LogEntry "
                                  "timestamp outside 2000-01-01..2200-01-01 UTC")
    return write_time_us, kind, body


def _event(entry: _Entry) -> tuple[str, int, str, dict[str, Any]]:
    """(run_id, time_us, kind, body) of one reference entry."""
    payload = entry.payload
    run_id = str(payload["job_name"])
    for time_key, kind, fields in _KINDS:
        if time_key in payload:
            body: dict[str, Any] = {}
            for theirs, ours in fields.items():
                value = payload.get(theirs, _DEFAULTS.get(ours))
                body[ours] = _count(theirs, value, ours) if ours in _COUNTS else _string(theirs, value)
            return run_id, _time_us(payload, time_key), kind, body
    if "event_type" in payload:
        return (run_id, *_orbax_event(payload, entry.write_time_us))
    keys = ", ".join(sorted(k for k in payload if k != "job_name")) or "none"
    raise _Reject("unknown payload", f"no goodput field in the payload (keys: {keys})")


def _attempt_id(run_id: str, first_entry: str) -> str:
    digest = hashlib.sha256(f"{run_id}\0{first_entry}".encode()).hexdigest()
    return f"import-{digest[:24]}"


def import_entries(values: Iterable[tuple[str, Any]], job_name: str | None = None,
                   now_us: int | None = None) -> ImportResult:
    """Turns exported reference entries into event messages.

    Args:
        values: (where, parsed JSON) of each entry, as ``read_entries`` gives them.
        job_name: Import only this job's entries (the others are counted in ``other_jobs``).
        now_us: The importer's clock (default: the wall clock). An entry dated more than
            ``MAX_CLOCK_AHEAD_S`` after it is rejected, as the pipeline would dead-letter it.

    Returns:
        The messages and the counts, with every rejected entry and its reason.
    """
    result = ImportResult()
    entries: list[_Entry] = []
    seen: set[str] = set()
    for source, value in values:
        result.entries += 1
        try:
            entry = _entry(source, value)
        except _Reject as problem:
            result.rejected.append(Rejected(source, problem.reason, problem.detail, _text(value)))
            continue
        if job_name is not None and entry.payload.get("job_name") != job_name:
            result.other_jobs += 1
            continue
        if entry.identity in seen:
            result.duplicates += 1
            continue
        seen.add(entry.identity)
        entries.append(entry)
    if entries and all(entry.write_time_us is not None for entry in entries):
        steps = [b - a for a, b in itertools.pairwise(entry.write_time_us or 0 for entry in entries)]
        if sum(step < 0 for step in steps) > sum(step > 0 for step in steps):
            entries.reverse()  # newest first, as gcloud lists: entries written together keep their order
        entries.sort(key=lambda entry: entry.write_time_us or 0)  # stable: ties keep that order

    attempts: dict[str, list[list[Record]]] = {}  # run -> attempts -> records
    attempt_ids: dict[str, list[str]] = {}
    latest_us = latest_time_us(now_us)
    for entry in entries:
        try:
            run_id, time_us, kind, body = _event(entry)
            invalid = event_problem(kind, 0, time_us, body, latest_us)  # the parser's own rules
            if invalid is not None:
                raise _Reject("bad time" if invalid.startswith("time_us") else "bad field", invalid)
        except _Reject as problem:
            result.rejected.append(
                Rejected(entry.source, problem.reason, problem.detail, _text(entry.payload)))
            continue
        runs = attempts.setdefault(run_id, [])
        if kind == "job_start" or not runs:
            runs.append([])
            attempt_ids.setdefault(run_id, []).append(_attempt_id(run_id, entry.identity))
        records = runs[-1]
        records.append((len(records), time_us, kind, body))
        result.events += 1
    for run_id, run_attempts in attempts.items():
        result.attempts[run_id] = len(run_attempts)
        for attempt_id, records in zip(attempt_ids[run_id], run_attempts, strict=True):
            for first in range(0, len(records), EVENTS_PER_MESSAGE):
                result.messages.append(
                    encode_batch(run_id, attempt_id, records[first:first + EVENTS_PER_MESSAGE]))
    return result


def _text(value: object) -> str:
    if isinstance(value, _Reject):
        return value.raw
    try:
        return json.dumps(value, sort_keys=True, default=str)
    except ValueError:
        return repr(value)


def import_files(paths: Sequence[str | Path], job_name: str | None = None,
                 stdin: BinaryIO | None = None) -> ImportResult:
    """``import_entries`` over the entries of every file (``-``: standard input), in order.

    A byte that is not UTF-8 is kept as a lone surrogate (``surrogateescape``): the entry holding
    it is rejected by the checks of the field it is in, or by JSON's, and the others are imported.
    """

    def values() -> Iterator[tuple[str, Any]]:
        for path in paths:
            data = (stdin or sys.stdin.buffer).read() if str(path) == "-" else Path(path).read_bytes()
            yield from read_entries(data.decode("utf-8", "surrogateescape"),
                                    "<stdin>" if str(path) == "-" else str(path))

    return import_entries(values(), job_name)


def write_messages(messages: Iterable[Message], path: str | Path) -> int:
    """Writes messages to a file of JSON lines, as the emitter's ``file:`` destination does."""
    count = 0
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    with target.open("wb") as out:
        for message in messages:
            out.write(message.data + b"\n")
            count += 1
    return count


def publish_messages(messages: Iterable[Message], topic: str, timeout_s: float = 30.0) -> int:
    """Publishes messages to a Pub/Sub topic through the emitter's transport; waits for each."""
    transport = PubSubTransport(topic, timeout_s=timeout_s)
    count = 0
    try:
        for message in messages:
            transport.send(message)
            count += 1
    finally:
        transport.close()
    return count


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    """The arguments of ``goodput import``, on ``parser`` if given (e.g. a subcommand's)."""
    parser = parser or argparse.ArgumentParser(prog="goodput import")
    parser.description = (
        "Imports a job's goodput history from the Cloud Logging log that ml-goodput-measurement\n"
        "wrote, as events the pipeline reads.")
    parser.epilog = (
        "example:\n"
        "  gcloud logging read 'logName=\"projects/P/logs/goodput_RUN\"' --format=json > h.json\n"
        "  goodput import h.json --output h.jsonl\n"
        "  python -m pipeline --events=h.jsonl --duckdb=goodput.duckdb\n\n"
        "A new attempt starts at each job_start_time entry. Importing the same export twice gives\n"
        "the same event ids, so the pipeline counts nothing twice. Each entry that cannot be\n"
        "imported is counted and listed with its reason. Exit status: 0 if any event was\n"
        "imported, 1 if none was, 2 for a usage error.\n\n"
        "GKE's JobSet metrics are imported from Cloud Monitoring with goodput import gke-metrics\n"
        "(see goodput import gke-metrics --help).")
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("inputs", nargs="+", metavar="INPUT",
                        help="exported entries: 'gcloud logging read --format=json' output, or JSON "
                             "lines of LogEntry objects or of bare jsonPayloads ('-': standard input)")
    output = parser.add_mutually_exclusive_group(required=True)
    output.add_argument("--output", metavar="FILE",
                        help="write the events to FILE, JSON lines (python -m pipeline --events=FILE)")
    output.add_argument("--destination", metavar="projects/P/topics/T",
                        help="publish the events to this Pub/Sub topic "
                             "($PUBSUB_EMULATOR_HOST for an emulator)")
    parser.add_argument("--job-name", dest="job_name", metavar="NAME",
                        help="import only this job's entries (jsonPayload.job_name)")
    parser.add_argument("--rejected", metavar="FILE",
                        help="also write each rejected entry, with its source and reason, "
                             "to FILE (JSON lines)")
    return parser


def run(args: argparse.Namespace, out: TextIO | None = None) -> int:
    """Runs an import for parsed arguments; prints a summary. 0 if any event was imported."""
    out = out or sys.stdout
    if args.destination is not None and not re.fullmatch(r"projects/[^/]+/topics/[^/]+", args.destination):
        print(f"goodput import: --destination must be projects/P/topics/T, got {args.destination!r}",
              file=sys.stderr)
        return 2
    from pipeline.app.checks import UsageError, check_output_file, check_readable_file

    try:
        for path in args.inputs:
            if path != "-":
                check_readable_file(path, "INPUT")
        if args.output is not None:
            check_output_file(args.output, "--output", tuple(args.inputs), b'{"schema_version"')
        if args.rejected:
            check_output_file(args.rejected, "--rejected", tuple(args.inputs), b'{"source"')
    except UsageError as error:
        print(f"goodput import: {error}", file=sys.stderr)
        return 2
    try:
        result = import_files(args.inputs, args.job_name)
    except OSError as error:
        print(f"goodput import: {error}", file=sys.stderr)
        return 1
    if args.rejected:
        with Path(args.rejected).open("w", encoding="utf-8") as rejected:
            for item in result.rejected:
                rejected.write(json.dumps(dataclasses.asdict(item)) + "\n")
    if args.output is not None:
        written = write_messages(result.messages, args.output)
        where = args.output
    else:
        from google.api_core import exceptions

        try:
            written = publish_messages(result.messages, args.destination)
        except (exceptions.GoogleAPIError, TimeoutError) as error:
            print(result.summary(), file=out)
            print(f"goodput import: publishing to {args.destination} failed: {error}. Run the import "
                  "again: the messages already published have the same ids and count once.", file=sys.stderr)
            return 1
        where = args.destination
    print(result.summary(), file=out)
    print(f"{written} messages written to {where}", file=out)
    return 0 if result.events else 1


def main(argv: Sequence[str] | None = None) -> int:
    """``goodput import``: see ``--help``."""
    return run(build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
