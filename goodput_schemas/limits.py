"""The limits of the event contract: what one message and one event may hold.

The pipeline dead-letters what breaks them (``pipeline.core.events``); the emitter refuses them at the
call, before an event is queued, so a job learns of its mistake at once instead of in the
``dead_letter`` table. Constants and the checks both share, with no imports: a training image
reads them with the emitter.
"""

#: Versions of the event contract this pipeline reads.
SUPPORTED_SCHEMA_VERSIONS = frozenset({1})
#: Event times outside [2000-01-01, 2200-01-01) UTC are rejected as corrupt.
MIN_TIME_US = 946_684_800 * 1_000_000
MAX_TIME_US = 7_258_118_400 * 1_000_000
#: Longest run or attempt id accepted, in characters (printable ones only).
MAX_ID_LENGTH = 512
#: Longest run or attempt id accepted, in bytes of UTF-8: a run id is a Pub/Sub attribute value
#: and ordering key, which the service takes up to 1,024 bytes; a longer one would have every
#: message of the run refused.
MAX_ID_BYTES = 1024
#: Largest message accepted, in bytes: Pub/Sub's own limit (a publish request is at most 10 MB),
#: so nothing that came through the topic exceeds it; a replayed file's lines are held to it too.
MAX_MESSAGE_BYTES = 10_000_000
#: Most events in one message: 100 times the emitter's default batch. It bounds the dead letters
#: one message can produce (an event of two bytes, ``{}``, would let 10 MB carry millions).
MAX_EVENTS_PER_MESSAGE = 100_000
#: Deepest JSON nesting accepted. The schema nests five levels (batch, events, event, kind,
#: labels); the cap keeps every parser's recursion far below Python's limit, where a deeper
#: document would raise instead of being dead-lettered.
MAX_JSON_DEPTH = 32
#: Most labels on one job start: as many as a Google Cloud resource takes. Labels ride in every
#: snapshot's metadata and in the run's state, once per attempt.
MAX_LABELS = 64
#: Longest string in an event body (label keys and values, run group, accelerator type,
#: location, badput and elastic wait types), in characters. These become table columns and
#: Cloud Monitoring labels, whose values may be 1024 bytes: 256 characters are at most 1024 bytes
#: in UTF-8 (with the ``CUSTOM_BADPUT_EVENTS.`` prefix, an upper-cased badput type still fits).
MAX_TEXT_LENGTH = 256
#: Longest duration (a checkpoint's blocking time, a configured ideal step time), in seconds:
#: the span of accepted event times. Anything longer is corrupt, and would overflow in the
#: engine's microsecond arithmetic.
MAX_DURATION_S = (MAX_TIME_US - MIN_TIME_US) / 1_000_000
#: Largest integer field (steps, sequence numbers, chip and slice counts): protobuf's int64.
MAX_INT64 = 2**63 - 1
#: Largest sequence number and step number (``step_start``, checkpoints, model metrics):
#: 2**53 - 1, the largest integer a double holds exactly (JSON readers, BigQuery's JSON, a
#: dashboard's JavaScript), a trillion times any real run. Derived counts (events missing over
#: all attempts) are capped at it too, so no sum the pipeline writes can pass int64.
MAX_COUNT = 2**53 - 1
#: Most chips one job may report: far above any machine built, and low enough that the fleet's
#: sums of chip counts and chip-seconds stay far inside int64 and exact.
MAX_CHIP_COUNT = 2**24
#: Most slices an elastic job may report (``active``, ``total``, ``available``); the active and
#: the available ones are at most the total.
MAX_SLICE_COUNT = 2**16
#: How far ahead of the pipeline's clock an event time may be, in seconds: host clocks drift by
#: seconds, not minutes. An event dated later is dead-lettered, so that one host with a wrong
#: clock (or a corrupt time) cannot move the latest event time that a replay reports the fleet as of.
MAX_CLOCK_AHEAD_S = 600
#: Longest workload uid (``EventBatch.workload_uid``; a Kubernetes uid is 36 characters).
MAX_UID_LENGTH = 128
#: The sources of a ``configs`` event: what the job recorded, and what the emitter collected.
CONFIG_SOURCES = ("user", "software", "system")
#: Most entries in one ``configs`` event (keys once flattened), and the longest value, in
#: characters. A key is a name of at most MAX_TEXT_LENGTH characters.
MAX_CONFIG_ENTRIES = 1_000
MAX_CONFIG_VALUE_LENGTH = 1_024
#: Most named values in one ``metrics`` event, and the longest metric name.
MAX_METRICS_PER_EVENT = 64
MAX_METRIC_NAME_LENGTH = 128
#: Most distinct metric names one attempt records: the emitter drops (and counts) values of a
#: name past it, so a name made from a step number or a timestamp cannot flood the table.
MAX_METRIC_NAMES = 256


def shown(text: str, limit: int = 80) -> str:
    """``repr(text)``, shortened for a reason a person reads."""
    return f"{text[:limit]!r}… ({len(text)} characters)" if len(text) > limit else repr(text)


def id_problem(name: str, value: str) -> str | None:
    """Why a run or attempt id is unacceptable, or None."""
    if not value:
        return f"{name} is missing or empty: it must be 1..{MAX_ID_LENGTH} printable characters"
    if len(value) > MAX_ID_LENGTH or not value.isprintable():
        return f"{name} must be 1..{MAX_ID_LENGTH} printable characters, got {shown(value)}"
    size = len(value.encode("utf-8", "surrogatepass"))
    if size > MAX_ID_BYTES:
        return (f"{name} must be at most MAX_ID_BYTES ({MAX_ID_BYTES}) bytes of UTF-8 (a Pub/Sub "
                f"attribute's limit), got {size}: {shown(value)}")
    return None


def text_problem(where: str, value: str, free_form: bool = False) -> str | None:
    """Why a string of an event body is unacceptable, or None.

    Names (types, run group, accelerator, location, label keys) become columns, bucket names and
    metric labels that people read: printable characters only, as for ids. Label values are free
    text kept as JSON, so any valid Unicode goes; a lone surrogate cannot be stored as UTF-8.
    """
    if len(value) > MAX_TEXT_LENGTH:
        return f"{where} is {len(value)} characters, more than MAX_TEXT_LENGTH ({MAX_TEXT_LENGTH})"
    if free_form:
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return f"{where} is not valid Unicode (a lone surrogate), got {shown(value)}"
    elif not value.isprintable():
        return f"{where} must be printable characters (no control or format characters), got {shown(value)}"
    return None


def host_steps_problem(host: str, count: int, mean_s: float, max_s: float) -> str | None:
    """Why a ``host_steps`` summary is invalid beyond its fields' own ranges, or None."""
    if not host:
        return "host_steps.host must not be empty"
    if count < 1:
        return f"host_steps.count must be >= 1, got {count}"
    if mean_s > max_s:
        return f"host_steps.mean_s ({mean_s}) must be at most max_s ({max_s})"
    return None


def workload_uid_problem(uid: str) -> str | None:
    """Why a workload uid is unacceptable, or None (an empty one is no workload)."""
    if len(uid) > MAX_UID_LENGTH or not uid.isprintable():
        return f"workload_uid must be at most {MAX_UID_LENGTH} printable characters, got {shown(uid)}"
    return None


def configs_problem(source: str, values: dict[str, str]) -> str | None:
    """Why a ``configs`` event's source and flattened values are unacceptable, or None."""
    if source not in CONFIG_SOURCES:
        return f"configs.source must be one of {', '.join(CONFIG_SOURCES)}, got {shown(source)}"
    if len(values) > MAX_CONFIG_ENTRIES:
        return f"configs has {len(values)} entries, more than MAX_CONFIG_ENTRIES ({MAX_CONFIG_ENTRIES})"
    for key, value in values.items():
        if not key:
            return "a configs key is empty"
        if len(value) > MAX_CONFIG_VALUE_LENGTH:
            return (f"configs value of {shown(key)} is {len(value)} characters, more than "
                    f"MAX_CONFIG_VALUE_LENGTH ({MAX_CONFIG_VALUE_LENGTH})")
        problem = text_problem("a configs key", key)
        if problem:
            return problem
        try:  # free text up to its own limit, not MAX_TEXT_LENGTH
            value.encode("utf-8")
        except UnicodeEncodeError:
            return f"configs value of {shown(key)} is not valid Unicode (a lone surrogate)"
    return None


def metrics_problem(values: dict[str, float]) -> str | None:
    """Why a ``metrics`` event's named values are unacceptable, or None. A value may be any
    double, non-finite ones too (a loss that diverged is worth recording)."""
    if not values:
        return "metrics.values must name at least one metric"
    if len(values) > MAX_METRICS_PER_EVENT:
        return f"metrics has {len(values)} values, more than MAX_METRICS_PER_EVENT ({MAX_METRICS_PER_EVENT})"
    for name in values:
        if not name or len(name) > MAX_METRIC_NAME_LENGTH or not name.isprintable():
            return (f"a metric name must be 1..MAX_METRIC_NAME_LENGTH ({MAX_METRIC_NAME_LENGTH}) printable "
                    f"characters, got {shown(name)}")
    return None


def int_limit(name: str) -> int:
    """The largest value of an integer field of an event body, by the field's name."""
    if name == "chip_count":
        return MAX_CHIP_COUNT
    if name.endswith("_slices"):
        return MAX_SLICE_COUNT
    return MAX_COUNT


def int_name(limit: int) -> str:
    """The name of an integer limit, for a reason a person reads."""
    return {MAX_COUNT: "MAX_COUNT (2**53-1)", MAX_CHIP_COUNT: "MAX_CHIP_COUNT (2**24)",
            MAX_SLICE_COUNT: "MAX_SLICE_COUNT (2**16)"}[limit]
