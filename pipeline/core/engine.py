"""The goodput engine: the state of one run and every metric computed from it.

Pure Python, no Beam: the Beam transforms, the batch replay and the tests share it.

``RunState`` takes validated events (``pipeline.core.events.Event``) one at a time, in any order and
with duplicates; ``RunState.snapshot(as_of_us)`` computes the run's figures as of a time. The
result depends only on the set of distinct events, never on their arrival order, on how they were
batched into messages, or on the snapshots taken before (``tests/unit/test_delivery.py``).
An event is identified by its attempt and sequence number: a second event with the same id is a
redelivery and is ignored. Two different events under one id (a conflicting duplicate, a
producer's bug) are resolved whatever their order: the one whose ``(time_us, fingerprint)`` sorts
first is kept, replacing the other in the state if that came first, and the other is a dead
letter (``conflicts``). So each attempt keeps what it needs to tell a redelivery from a
conflict and to take an event back: the seq of each step, its other events whole, and the time
and fingerprint of its observations (heartbeats, model metrics).

How each stretch of the run's time is classified is ``pipeline.core.timeline``'s; what a snapshot
holds is ``pipeline.core.snapshot``'s; the state's encoding for Beam is
``pipeline.core.state_coder``'s.

Memory: O(1) per run and per attempt, plus 24 bytes per recorded step (its number, time and seq
in three int64 ``Column``s), 25 bytes per observation, plus about 300 bytes per other event (span
markers, checkpoints: kept whole and as their effect). A column's older values may be sealed
away (``pipeline.core.columns``): a state decoded from its hot part holds only the columns'
tails until the engine asks for an older value.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
from array import array
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple

import numpy as np

from goodput_schemas.limits import MAX_COUNT
from pipeline.core.columns import Column, bisect_left, bisect_right
from pipeline.core.detect import (
    HANG,
    SLOWDOWN,
    STRAGGLER,
    AnomalyChange,
    DetectionSettings,
    Detector,
    HostScorer,
)
from pipeline.core.events import Batch, DeadLetter, Event
from pipeline.core.snapshot import DEFAULT_WINDOWS_S, Snapshot, StepSummary
from pipeline.core.stepstats import BoundedStepStatistics
from pipeline.core.timeline import Settled, Timeline, span_label

_US = 1_000_000


@dataclasses.dataclass
class Attempt:
    """What one attempt (one process start) recorded."""

    attempt_id: str
    start_us: int | None = None
    end_us: int | None = None
    metadata: dict[str, Any] = dataclasses.field(default_factory=dict)
    # How it ended, as its job_end says: True failed (a crash), False stopped as planned, None not
    # known (no job_end, or one without the flag). Of several job_ends, a failure wins.
    failed: bool | None = None
    steps: Column = dataclasses.field(default_factory=Column)
    step_times: Column = dataclasses.field(default_factory=Column)
    # Span markers: label -> [(time_us, +1 start / -1 end)], paired at snapshot time.
    markers: dict[str, list[tuple[int, int]]] = dataclasses.field(default_factory=dict)
    saves: list[tuple[int, int, int]] = dataclasses.field(default_factory=list)  # time, us, step
    restores: list[tuple[int, int, int]] = dataclasses.field(default_factory=list)
    slice_counts: list[tuple[int, int, int, int]] = dataclasses.field(default_factory=list)
    last_event_us: int = 0
    # Deduplication: every seq below the watermark was seen; ``extra`` holds seen seqs above it.
    watermark: int = 0
    extra: set[int] = dataclasses.field(default_factory=set)
    # Derived, not encoded: where the step number fails to increase (an in-process rollback),
    # scanned up to ``split_scanned``; an out-of-order insert (``inserts``) rescans from 0.
    splits: list[int] = dataclasses.field(default_factory=list)
    split_scanned: int = 0
    inserts: int = 0
    # Each event by its seq (see the module docstring): the seq of each step beside it, other
    # events whole, observations as (seq, time, fingerprint, kind) in seq order.
    step_seqs: Column = dataclasses.field(default_factory=Column)
    records: dict[int, tuple[int, str, dict[str, Any]]] = dataclasses.field(default_factory=dict)
    obs_seqs: Column = dataclasses.field(default_factory=Column)
    obs_times: Column = dataclasses.field(default_factory=Column)
    obs_prints: Column = dataclasses.field(default_factory=Column)
    obs_kinds: Column = dataclasses.field(default_factory=lambda: Column(typecode="b"))

    def first_time(self, seq: int) -> bool:
        """Marks ``seq`` seen; False if it had been seen before."""
        if seq < self.watermark or seq in self.extra:
            return False
        self.extra.add(seq)
        while self.watermark in self.extra:
            self.extra.discard(self.watermark)
            self.watermark += 1
        return True

    def missing(self) -> int:
        """Sequence numbers below the highest seen that have not arrived: events lost (a killed
        process's, a full spool's) or still on their way."""
        return max(self.extra) + 1 - self.watermark - len(self.extra) if self.extra else 0

    def add_step(self, step: int, time_us: int, seq: int) -> bool:
        """Adds a step start; True if it simply extends the attempt (later, higher step)."""
        times = self.step_times
        if not times or time_us > times[-1] or (time_us == times[-1] and step >= self.steps[-1]):
            extends = not self.steps or step > self.steps[-1]
            self.steps.append(step)
            self.step_times.append(time_us)
            self.step_seqs.append(seq)
            return extends
        else:  # late arrival: keep (time, step) order (rare, so the O(n) insert is fine)
            lo = bisect_left(times, time_us)
            at = bisect_right(self.steps, step, lo, bisect_right(times, time_us, lo))
            self.steps.insert(at, step)
            self.step_times.insert(at, time_us)
            self.step_seqs.insert(at, seq)
            self.changed()
            return False

    def changed(self) -> None:
        """Notes a change other than an appended step: the derived step caches start again."""
        self.inserts += 1
        self.splits, self.split_scanned = [], 0

    def observe(self, seq: int, time_us: int, kind: str, body: dict[str, Any]) -> None:
        """Keeps an observation's seq, time and fingerprint, in seq order."""
        at = len(self.obs_seqs)
        if at and self.obs_seqs[-1] > seq:  # a late message (rare): O(n) insert
            at = bisect_left(self.obs_seqs, seq)
        for column, value in ((self.obs_seqs, seq), (self.obs_times, time_us),
                              (self.obs_prints, fingerprint(kind, body)),
                              (self.obs_kinds, _OBSERVATION_KINDS.index(kind))):
            column.insert(at, value)

    def merge_steps(self, seqs: Sequence[int], times: Sequence[int], steps: Sequence[int]) -> bool:
        """Adds new step starts as ``add_step`` would one by one in seq order (each after the
        steps at or before its (time, step)), with one merge instead of an insert each: O(n + k)
        rather than O(n·k) for a late message. True if they extend the attempt as
        ``add_step``'s True says, every one of them."""
        by_seq = np.argsort(_ints(seqs), kind="stable")
        new_seqs, new_times, new_steps = (_ints(column)[by_seq] for column in (seqs, times, steps))
        ranked = np.lexsort((new_steps, new_times))  # stable: equal ones stay in seq order
        in_order = bool(np.all(ranked == np.arange(len(ranked))))
        new_seqs, new_times, new_steps = new_seqs[ranked], new_times[ranked], new_steps[ranked]
        count = len(self.steps)
        if not count or (int(new_times[0]), int(new_steps[0])) >= (self.step_times[-1], self.steps[-1]):
            extends = in_order and bool(np.all(new_steps[1:] > new_steps[:-1])) and (
                not count or int(new_steps[0]) > self.steps[-1])
            self.steps.extend(new_steps.tolist())
            self.step_times.extend(new_times.tolist())
            self.step_seqs.extend(new_seqs.tolist())
            if not in_order:
                self.changed()
            return extends
        old_times = _ints(self.step_times)
        at = np.searchsorted(old_times, new_times, "left")
        ends = np.searchsorted(old_times, new_times, "right")
        for i in np.flatnonzero(ends > at).tolist():  # steps at the same time: by number among them
            at[i] = bisect_right(self.steps, int(new_steps[i]), int(at[i]), int(ends[i]))
        for column, values in ((self.steps, new_steps), (self.step_times, new_times),
                               (self.step_seqs, new_seqs)):
            column[:] = array("q", np.insert(_ints(column), at, values).tobytes())
        self.changed()
        return False

    def observe_many(self, events: Sequence[Event]) -> None:
        """``observe`` for each of ``events`` (new seqs), merged into the columns at once."""
        events = sorted(events, key=lambda e: e.seq)
        new = ([e.seq for e in events], [e.time_us for e in events],
               [fingerprint(e.kind, e.body) for e in events],
               [_OBSERVATION_KINDS.index(e.kind) for e in events])
        columns = (self.obs_seqs, self.obs_times, self.obs_prints, self.obs_kinds)
        if not self.obs_seqs or self.obs_seqs[-1] < new[0][0]:
            for column, values in zip(columns, new, strict=True):
                column.extend(values)
            return
        at = np.searchsorted(_ints(self.obs_seqs), new[0], "left")
        for column, values in zip(columns, new, strict=True):
            dtype = np.int8 if column.typecode == "b" else np.int64
            column[:] = array(column.typecode, np.insert(np.array(column, dtype=dtype), at, values).tobytes())

    def kept(self, seq: int, kind: str) -> Kept | None:
        """The event kept under ``seq`` (looked up first where one of ``kind`` would be), or
        None if the state does not know it (encoded before events were kept by seq)."""
        record = self.records.get(seq)
        if record is not None:
            return Kept(*record, None)
        looks = (self._kept_observation, self._kept_step)
        for look in looks if kind in _OBSERVATIONS else looks[::-1]:
            kept = look(seq)
            if kept is not None:
                return kept
        return None

    def _kept_step(self, seq: int) -> Kept | None:
        i = _index(self.step_seqs, seq)
        if i is None:
            return None
        return Kept(self.step_times[i], "step_start", {"step": self.steps[i]}, None)

    def _kept_observation(self, seq: int) -> Kept | None:
        i = _index(self.obs_seqs, seq)
        if i is None:
            return None
        return Kept(self.obs_times[i], _OBSERVATION_KINDS[self.obs_kinds[i]], None, self.obs_prints[i])

    def take_back(self, seq: int, kept: Kept) -> None:
        """Undoes what the event kept under ``seq`` (``kept``) did to the attempt."""
        if kept.kind == "step_start":
            i = _index(self.step_seqs, seq)
            assert i is not None
            for column in (self.steps, self.step_times, self.step_seqs):
                del column[i]
        elif kept.kind in _OBSERVATIONS:
            i = _index(self.obs_seqs, seq)
            assert i is not None
            for column in (self.obs_seqs, self.obs_times, self.obs_prints, self.obs_kinds):
                del column[i]
        else:
            del self.records[seq]
            t, kind, body = kept.time_us, kept.kind, kept.body or {}
            if kind == "job_start":
                self.start_us, self.metadata = None, {}
                for t_other, kind_other, other in self.records.values():
                    if kind_other == "job_start":
                        self.choose_start(t_other, other)
            elif kind == "job_end":
                self.end_us, self.failed = None, None
                for t_other, kind_other, other in self.records.values():
                    if kind_other == "job_end":
                        self.note_end(t_other, other)
            elif kind == "checkpoint_save":
                self.saves.remove(_entry(t, kind, body))  # type: ignore[arg-type]
            elif kind == "checkpoint_restore":
                self.restores.remove(_entry(t, kind, body))  # type: ignore[arg-type]
            elif kind == "elastic_slice_counts":
                self.slice_counts.remove(_entry(t, kind, body))  # type: ignore[arg-type]
            elif kind.endswith("_start") or kind.endswith("_end"):
                name, _, edge = kind.rpartition("_")
                label = span_label(name, body)
                if label is not None:
                    self.markers[label].remove((t, 1 if edge == "start" else -1))
                    if not self.markers[label]:
                        del self.markers[label]
        self.changed()
        self.last_event_us = max(itertools.chain(  # steps are in time order
            self.step_times[-1:], self.obs_times, (r[0] for r in self.records.values())), default=0)

    def choose_start(self, t: int, body: dict[str, Any]) -> bool:
        """Notes a job_start; True if it is the attempt's start now (the earliest; of two at one
        time, the first in ``_ordering``)."""
        if self.start_us is None or t < self.start_us or (
                t == self.start_us and _ordering(body) < _ordering(self.metadata)):
            self.start_us = t
            self.metadata = dict(body)
            return True
        return False

    def note_end(self, t: int, body: dict[str, Any]) -> None:
        """Notes a job_end: the latest is the attempt's end; of their flags, a failure wins."""
        self.end_us = t if self.end_us is None else max(self.end_us, t)
        failed = body.get("failed")
        if failed is not None and self.failed is not True:  # any order: True > False > None
            self.failed = bool(failed)

    def split_indices(self) -> list[int]:
        """Indices of steps that start a new sub-segment (not 0), scanning only new steps."""
        start, steps = max(1, self.split_scanned), self.steps
        if len(steps) - start > _FEW:
            numbers = _ints(steps[start - 1:])
            self.splits.extend((np.flatnonzero(numbers[1:] <= numbers[:-1]) + start).tolist())
        else:
            self.splits.extend(k for k in range(start, len(steps)) if steps[k] <= steps[k - 1])
        self.split_scanned = len(steps)
        return self.splits


class RunState:
    """Everything recorded about one run, updated one event at a time."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self.attempts: dict[str, Attempt] = {}
        self.events = 0
        self.duplicates = 0
        # Step statistics and anomalies of the steps fed so far, each with what it was fed:
        # [(attempt id, inserts, steps fed)] in segment order (None: not to be extended);
        # extended while steps are only appended, rebuilt otherwise. Both are bounded whatever
        # the run's length, and encoded with the run's state.
        self._stats = BoundedStepStatistics()
        self._stats_fed: list[tuple[str, int, int]] | None = []
        self._detector = Detector()
        self._detector_fed: list[tuple[str, int, int]] | None = []
        # The hosts' step summaries (``host_steps``), scored for stragglers; they change no
        # figure of the run, and their attempts hold no event but their seqs.
        self.hosts = HostScorer()
        # The last snapshot's classified timeline up to its settle point (see Timeline).
        self._settled: Settled | None = None
        # Changes other than steps extending the live (latest started) attempt bump the version;
        # while it holds, the last snapshot's timeline is advanced instead of rebuilt.
        self._version = 0
        self._live: str | None = None
        self._live_start: tuple[int, str] | None = None
        self._latest_us = 0
        self._timeline: Timeline | None = None
        # Where its columns' sealed values are read from (``state_coder.Archive``), once sealed.
        self.archive: Any = None

    @classmethod
    def of(cls, run_id: str, attempts: Iterable[Attempt], events: int, duplicates: int,
           hosts: HostScorer | None = None,
           detector: tuple[Detector, list[tuple[str, int]]] | None = None,
           stats: tuple[BoundedStepStatistics, list[tuple[str, int]]] | None = None) -> RunState:
        """The state that holds ``attempts`` as recorded, with its event counts, host scorer, and
        detector and step statistics each with the steps of each attempt it was fed (how the
        state coder rebuilds a run)."""
        state = cls(run_id)
        state.events, state.duplicates = events, duplicates
        state.hosts = hosts or HostScorer()
        for attempt in attempts:
            state.attempts[attempt.attempt_id] = attempt
            state._latest_us = max(state._latest_us, attempt.last_event_us)
            if attempt.start_us is not None:
                state._started(attempt)
        if detector is not None:
            state._detector, fed = detector
            state._detector_fed = state._fed(fed)
        if stats is not None:
            state._stats, fed = stats
            state._stats_fed = state._fed(fed)
        return state

    def _fed(self, counts: list[tuple[str, int]]) -> list[tuple[str, int, int]]:
        return [(attempt_id, self.attempts[attempt_id].inserts, count) for attempt_id, count in counts]

    def detector_state(self) -> tuple[Detector, list[tuple[str, int]]] | None:
        """The detector and the steps of each attempt it was fed, if it was fed steps as they
        are now (None: it is to be fed afresh, as after a change to steps already fed)."""
        fed = self._as_fed(self._detector_fed)
        return None if fed is None else (self._detector, fed)

    def stats_state(self) -> tuple[BoundedStepStatistics, list[tuple[str, int]]] | None:
        """The step statistics and the steps of each attempt they were fed, as
        ``detector_state``."""
        fed = self._as_fed(self._stats_fed)
        return None if fed is None else (self._stats, fed)

    def _as_fed(self, fed: list[tuple[str, int, int]] | None) -> list[tuple[str, int]] | None:
        """Each attempt's steps fed, if they were fed as they are now."""
        if not fed or any(self.attempts[attempt_id].inserts != inserts for attempt_id, inserts, _ in fed):
            return None
        return [(attempt_id, count) for attempt_id, _, count in fed]

    def add(self, event: Event, conflicts: list[DeadLetter] | None = None) -> bool:
        """Adds one event; False (and no change) if it was seen before. O(1) amortized.

        Of two different events under one id (attempt, seq), the one whose ``(time_us,
        fingerprint)`` sorts first is kept whatever their order: True if ``event`` replaced the
        one kept before. The other is appended to ``conflicts`` as a dead letter.
        """
        attempt = self.attempts.get(event.attempt_id)
        if attempt is None:
            attempt = self.attempts[event.attempt_id] = Attempt(event.attempt_id)
            self._version += 1
        if attempt.first_time(event.seq):
            self.events += 1
            self._apply(attempt, event.seq, event.time_us, event.kind, event.body)
            return True
        self.duplicates += 1
        kept = attempt.kept(event.seq, event.kind)
        if kept is None or kept.same_as(event):  # a redelivery (or a state that cannot tell)
            return False
        if (event.time_us, fingerprint(event.kind, event.body)) >= kept.order():
            if conflicts is not None:
                conflicts.append(_conflict(event.run_id, event.attempt_id, event.seq, event.time_us,
                                           event.kind, event.body))
            return False
        attempt.take_back(event.seq, kept)
        self._version += 1
        self._latest_us = max(a.last_event_us for a in self.attempts.values())
        self._live = self._live_start = None
        for other in self.attempts.values():
            if other.start_us is not None:
                self._started(other)
        self._apply(attempt, event.seq, event.time_us, event.kind, event.body)
        if conflicts is not None:
            conflicts.append(_conflict(self.run_id, attempt.attempt_id, event.seq, kept.time_us, kept.kind,
                                       kept.body))
        return True

    def add_batch(self, batch: Batch, conflicts: list[DeadLetter] | None = None) -> int:
        """Adds one message's events, in bulk when they are all new (appended when they are the
        attempt's next ones, in order; else merged where they fall: a late message costs O(n + k),
        not an O(n) insert per event); returns how many were new or replaced a conflicting one
        (0 for a redelivered message).
        Conflicting duplicates are resolved as ``add`` says, their dead letters appended to
        ``conflicts``."""
        attempt = self.attempts.get(batch.attempt_id)
        if attempt is None:
            attempt = self.attempts[batch.attempt_id] = Attempt(batch.attempt_id)
            self._version += 1
        first, total = attempt.watermark, len(batch)
        seqs = np.sort(np.concatenate((_ints(batch.step_seqs), _ints([e.seq for e in batch.others]))))
        times, steps = batch.step_times, batch.steps
        numbers = _ints(steps)
        if not (seqs[0] == first and seqs[-1] == first + total - 1 and np.all(seqs[1:] != seqs[:-1])
                and not (attempt.extra and min(attempt.extra) < first + total)
                and _in_step_order(_ints(times), numbers)
                and (not times or not attempt.step_times
                     or (times[0], steps[0]) >= (attempt.step_times[-1], attempt.steps[-1]))):
            if _all_new(attempt, seqs):  # late, or after a gap: merged, not added one by one
                return self._add_new(attempt, batch, seqs)
            return sum(self.add(event, conflicts) for event in batch.events())
        attempt.watermark = first + total
        self.events += total
        if times:
            if (attempt.attempt_id != self._live or (attempt.steps and steps[0] <= attempt.steps[-1])
                    or np.any(numbers[1:] <= numbers[:-1])):
                self._version += 1
            attempt.steps.extend(steps)
            attempt.step_times.extend(times)
            attempt.step_seqs.extend(batch.step_seqs)
            attempt.last_event_us = max(attempt.last_event_us, times[-1])
            self._latest_us = max(self._latest_us, times[-1])
        for event in batch.others:
            self._apply(attempt, event.seq, event.time_us, event.kind, event.body)
        return total

    def _add_new(self, attempt: Attempt, batch: Batch, seqs: np.ndarray) -> int:
        """Adds a message whose events are all new to the state as ``add`` would one by one, in
        O(n + k) for an attempt of n events and a message of k, wherever they fall in it."""
        attempt.extra.update(seqs.tolist())
        while attempt.watermark in attempt.extra:
            attempt.extra.discard(attempt.watermark)
            attempt.watermark += 1
        self.events += len(seqs)
        times = batch.step_times
        if times:
            extends = attempt.merge_steps(batch.step_seqs, times, batch.steps)
            if not extends or attempt.attempt_id != self._live:
                self._version += 1
            attempt.last_event_us = max(attempt.last_event_us, max(times))
            self._latest_us = max(self._latest_us, attempt.last_event_us)
        observations = [e for e in batch.others if e.kind in _OBSERVATIONS]
        if observations:
            attempt.observe_many(observations)
            attempt.last_event_us = max(attempt.last_event_us, max(e.time_us for e in observations))
            self._latest_us = max(self._latest_us, attempt.last_event_us)
        for event in sorted(batch.others, key=lambda e: e.seq):
            if event.kind not in _OBSERVATIONS:
                self._apply(attempt, event.seq, event.time_us, event.kind, event.body)
        return len(seqs)

    def _apply(self, attempt: Attempt, seq: int, t: int, kind: str, body: dict[str, Any]) -> None:
        if kind == "host_steps":  # not the run's clock, nor any of its figures
            self.hosts.add(body["host"], t, int(body["count"]), float(body["mean_s"]), float(body["max_s"]))
            return
        if kind in _RECORDED_ONLY:
            return
        attempt.last_event_us = max(attempt.last_event_us, t)
        self._latest_us = max(self._latest_us, t)
        if kind == "step_start":
            if not attempt.add_step(int(body["step"]), t, seq) or attempt.attempt_id != self._live:
                self._version += 1
            return
        if kind in _OBSERVATIONS:
            attempt.observe(seq, t, kind, body)
            return
        self._version += 1
        attempt.records[seq] = (t, kind, body)
        if kind == "job_start":
            if attempt.choose_start(t, body):
                self._started(attempt)
        elif kind == "job_end":
            attempt.note_end(t, body)
        elif kind == "checkpoint_save":
            attempt.saves.append(_entry(t, kind, body))  # type: ignore[arg-type]
        elif kind == "checkpoint_restore":
            attempt.restores.append(_entry(t, kind, body))  # type: ignore[arg-type]
        elif kind == "elastic_slice_counts":
            attempt.slice_counts.append(_entry(t, kind, body))  # type: ignore[arg-type]
        elif kind.endswith("_start") or kind.endswith("_end"):
            name, _, edge = kind.rpartition("_")
            label = span_label(name, body)
            if label is not None:
                attempt.markers.setdefault(label, []).append((t, 1 if edge == "start" else -1))

    def _started(self, attempt: Attempt) -> None:
        """Notes an attempt's start: the latest started attempt is the live one."""
        assert attempt.start_us is not None
        key = (attempt.start_us, attempt.attempt_id)
        if self._live_start is None or key > self._live_start:
            self._live, self._live_start = attempt.attempt_id, key

    def hang_threshold_s(self, detection: DetectionSettings | None = None) -> float:
        """How long the run may go without a step before it is a hang, as of its last snapshot
        (before it has a baseline, the least threshold)."""
        detector = self._detector
        threshold = detector.hang_threshold_us() if detection in (None, detector.settings) else None
        return (detection or detector.settings).hang_min_s if threshold is None else threshold / _US

    def add_all(self, events: Iterable[Event]) -> None:
        for event in events:
            self.add(event)

    # -- snapshot ---------------------------------------------------------------------------

    def snapshot(
        self,
        as_of_us: int,
        windows_s: Sequence[int] = DEFAULT_WINDOWS_S,
        exclusions: Sequence[tuple[int, int]] = (),
        configured_ideal_step_time_s: float | None = None,
        anomalies_after_us: int | None = None,
        detection: DetectionSettings | None = None,
        reported_us: int | None = None,
    ) -> Snapshot | None:
        """The run's figures as of ``as_of_us``; None if nothing was recorded before it.

        Args:
            as_of_us: Events after this time are ignored; a run without an end runs to it.
            windows_s: Rolling windows in seconds, each ending at ``as_of`` and clipped to the
                run's lifetime (None where nothing of the run is left in it).
            exclusions: (start_us, end_us) intervals left out of elapsed time and every bucket.
            configured_ideal_step_time_s: Overrides the ideal step time (else the run's own
                configured value from its metadata, else the computed one).
            anomalies_after_us: The snapshot's anomaly rows are those found after this time (the
                previous snapshot's, in a stream); None for all of them.
            detection: What is looked for in the run's steps (the defaults if None).
            reported_us: In a stream, the previous snapshot's time (``anomalies_after_us`` if
                None): a hang it reported of an attempt that was silent then and has since
                turned out to have crashed gets the row of its end (``_crash_ends``).
        """
        timeline = self._timeline
        if (timeline is not None and timeline.version == self._version
                and timeline.exclusions == tuple(exclusions)
                and timeline.as_of_us <= as_of_us and self._latest_us <= as_of_us):
            timeline.advance(as_of_us)
        else:
            timeline = Timeline(self.attempts, as_of_us, exclusions, self._version, self._settled)
        self._timeline = timeline if timeline.advanceable else None
        self._settled = timeline.settled
        if timeline.start_us is None:
            return None
        cumulative = timeline.figures(0, timeline.start_us, timeline.end_us)
        rolling = []
        for window in windows_s:  # [as_of - window, as_of], clipped to the run's lifetime
            start = max(timeline.start_us, as_of_us - window * _US)
            rolling.append(timeline.figures(window, start, timeline.end_us)
                           if start < timeline.end_us else None)
        configured = configured_ideal_step_time_s
        if configured is None:
            configured = timeline.metadata.get("configured_ideal_step_time_s")
        detection = detection or DetectionSettings()
        stats = self._feed_steps(timeline, detection)  # in microseconds
        self.hosts.score(as_of_us, detection,
                         [a.end_us for a in self.attempts.values() if a.end_us is not None])
        computed_us = stats.ideal()
        # The reference ignores steps under 1 s.
        reference_us = stats.ideal(_US) if stats.any_below(_US) else computed_us
        ideal = configured if configured is not None else _seconds(computed_us)
        reference_ideal = configured if configured is not None else _seconds(reference_us)
        deviation = None if ideal is None else _seconds(stats.deviation(ideal * _US))
        stepping, available = timeline.slice_efficiency()
        anomalies, open_anomalies = self._anomalies(
            timeline, anomalies_after_us, anomalies_after_us if reported_us is None else reported_us)
        return Snapshot(
            run_id=self.run_id,
            as_of_us=as_of_us,
            started_us=timeline.start_us,
            ended=timeline.ended,
            cumulative=cumulative,
            window_sizes_s=tuple(windows_s),
            windows=tuple(rolling),
            disruptions=tuple(timeline.disruptions),
            max_productive_step=timeline.max_productive_step,
            last_step=timeline.last_step,
            ideal_step_time_s=ideal,
            reference_ideal_step_time_s=reference_ideal,
            step_time_deviation_s=deviation,
            chip_count=timeline.chips_now,
            metadata=timeline.metadata,
            stepping_slice_efficiency=stepping,
            available_slice_efficiency=available,
            step_summary=_summary(stats),
            # Capped: each attempt's count is below MAX_COUNT, but a run may have many attempts.
            missing_events=min(MAX_COUNT, sum(attempt.missing() for attempt in self.attempts.values())),
            anomalies=anomalies,
            open_anomalies=open_anomalies,
            slow_step_time_s=None if ideal is None else _seconds(stats.excess(ideal * _US)),
        )

    def _feed_steps(self, timeline: Timeline, detection: DetectionSettings) -> BoundedStepStatistics:
        """Step statistics of the timeline's steps, and the detector fed them: each fed
        incrementally while steps are only appended (and the detection settings hold), else
        rebuilt."""
        layout = timeline.step_layout
        # Every new duration goes in with one ``set_many``: one sort for a whole history,
        # rather than an insert (and a recent-window rebuild for a re-run step) per duration.
        if layout is None:  # steps of attempts without a job_start: placed by time, no cache
            stats, self._detector = BoundedStepStatistics(), Detector(detection)
            self._stats_fed = self._detector_fed = None
            for index, sub in enumerate(timeline.subsegments):
                if index:
                    previous = timeline.subsegments[index - 1]
                    self._detector.end_attempt(previous.last_time, previous.end_us)
                self._detector.new_attempt()
                self._detector.feed(sub.times, sub.steps, sub.lo, sub.hi)
            stats.set_many([pair for sub in timeline.subsegments
                            for pair in _durations(sub.steps, sub.times, sub.lo, sub.hi)])
            return stats
        stats_fed, detector_fed = self._stats_fed, self._detector_fed
        if not _extends(stats_fed, layout):
            self._stats, stats_fed = BoundedStepStatistics(), []
        if not _extends(detector_fed, layout) or detection != self._detector.settings:
            self._detector, detector_fed = Detector(detection), []
        assert stats_fed is not None and detector_fed is not None
        pairs: list[tuple[int, int]] = []
        for i, (attempt_id, _, count) in enumerate(layout):
            attempt = self.attempts[attempt_id]
            if i >= len(detector_fed):  # a new attempt: the hang after the last one's steps, if any
                if i > 0:
                    before = self.attempts[layout[i - 1][0]]
                    last = layout[i - 1][2]
                    assert attempt.start_us is not None
                    self._detector.end_attempt(before.step_times[last - 1] if last else None,
                                               *_heard_until(before, attempt.start_us))
                self._detector.new_attempt()
            start = detector_fed[i][2] if i < len(detector_fed) else 0
            if count > start:
                self._detector.feed(attempt.step_times, attempt.steps, start, count)
            start = stats_fed[i][2] if i < len(stats_fed) else 0
            if count > start:
                pairs += _durations(attempt.steps, attempt.step_times, max(0, start - 1), count)
        self._stats.set_many(pairs, previous=_held_durations(self.attempts, stats_fed))
        self._stats_fed = self._detector_fed = list(layout)
        return self._stats

    def _anomalies(self, timeline: Timeline, after_us: int | None,
                   reported_us: int | None) -> tuple[tuple[AnomalyChange, ...], dict[str, int]]:
        """The detector's rows found after ``after_us`` up to the timeline's time, with the hang
        the live attempt is in, if it is in one (the detector must have been fed), and the ends of
        the hangs a snapshot as of ``reported_us`` reported that crashes explain since; and how
        many anomalies of each kind are open then."""
        as_of = timeline.as_of_us
        changes = self._detector.changes + self.hosts.changes
        known = len(changes)
        layout = timeline.step_layout
        if layout:
            attempt_id, _, count = layout[-1]
            attempt = self.attempts[attempt_id]
            if count:
                end = attempt.end_us if attempt.end_us is not None and attempt.end_us <= as_of else None
                tail = self._detector.tail(attempt.step_times[count - 1], end, as_of)
                if end is None and after_us is None and tail:
                    # A replay is not asked again once the restart shows a crash: an attempt that
                    # is silent as of its time may be dead, and only one heard from past the
                    # threshold is hung. (A stream reports it, and closes it: ``_crash_ends``.)
                    heard = _heard_by(attempt, as_of)
                    tail = [row for row in tail if heard >= row.detected_us]
                changes += tail
        elif timeline.subsegments:  # no layout: the steps were fed by sub-segment
            sub = timeline.subsegments[-1]
            end = None if sub.end_kind == "open" else sub.end_us
            changes += self._detector.tail(sub.last_time, end, as_of)
        if reported_us is not None and layout:
            changes += self._crash_ends(layout, reported_us, as_of)
        after = -1 if after_us is None else after_us
        found = (c for c in changes if after < c.changed_us <= as_of)
        open_hangs = sum(change.ended_us is None for change in changes[known:])
        slowdown_ended = any(change.kind == SLOWDOWN for change in changes[known:])
        open_anomalies = {SLOWDOWN: int(self._detector.slowdown_open and not slowdown_ended),
                          HANG: open_hangs, STRAGGLER: self.hosts.open_count}
        return tuple(sorted(found, key=lambda c: (c.changed_us, c.kind, c.started_us))), open_anomalies

    def _crash_ends(self, layout: list[tuple[str, int, int]], reported_us: int,
                    as_of_us: int) -> list[AnomalyChange]:
        """The ends of the hangs a snapshot as of ``reported_us`` reported of attempts silent
        then, past their hang threshold, that their successors' starts since show to have died
        less than a threshold after their last step (a silent attempt is a hung one until then):
        the detector's rows have no such hang (``_heard_until``), so the stream closes the ones it
        wrote. Reads only the attempts started after ``reported_us``."""
        ends = []
        settings = self._detector.settings
        for index in range(len(layout) - 1, 0, -1):
            restart = self.attempts[layout[index][0]].start_us
            assert restart is not None
            if restart <= reported_us:
                break
            before_id, _, count = layout[index - 1]
            before = self.attempts[before_id]
            if count <= settings.warmup_steps or restart > as_of_us or before.end_us is not None:
                continue  # no hang looked for, not a restart yet, or an end the rows go to
            last, heard = before.step_times[count - 1], _heard_until(before, restart)[0]
            threshold = self._detector.hang_threshold_us()
            if threshold is not None and heard - last < threshold <= reported_us - last:
                end = self._detector.crash_end(last, heard, restart)
                if end is not None:
                    ends.append(end)
        return ends


def _heard_until(attempt: Attempt, next_start_us: int) -> tuple[int, int | None]:
    """Where an attempt that another followed ended, as far as a hang goes, and when that was
    known (None: then): its job_end, if it recorded one by the next start; else its last sign of
    life before it, known at the next start, for it died without an end (killed, its machine
    lost) and the silence after that is its crash's, not a hang."""
    if attempt.end_us is not None:
        return min(attempt.end_us, next_start_us), None
    return min(max(attempt.last_event_us, attempt.start_us or 0), next_start_us), next_start_us


def _heard_by(attempt: Attempt, as_of_us: int) -> int:
    """The time of the attempt's latest event at or before ``as_of_us`` (its start if none): one
    look at its clock while its events are all before it, as they are in a replay of them all; a
    search of its events in a replay as of an earlier time."""
    if attempt.last_event_us <= as_of_us:
        return attempt.last_event_us
    steps = bisect_right(attempt.step_times, as_of_us)
    observed = _ints(attempt.obs_times)
    return max(attempt.step_times[steps - 1] if steps else 0,
               int(observed[observed <= as_of_us].max(initial=0)),
               max((t for t, _, _ in attempt.records.values() if t <= as_of_us), default=0),
               attempt.start_us or 0)


def _extends(fed: list[tuple[str, int, int]] | None, layout: list[tuple[str, int, int]]) -> bool:
    """Whether ``layout`` is what was ``fed`` with steps only appended: the same attempts (and
    inserts) in the same order, more of them, and more steps in the last one fed only."""
    return fed is not None and len(fed) <= len(layout) and all(
        fed[i][:2] == layout[i][:2] and fed[i][2] <= layout[i][2]
        and (fed[i][2] == layout[i][2] or i == len(fed) - 1) for i in range(len(fed)))


def _held_durations(attempts: dict[str, Attempt],
                    fed: list[tuple[str, int, int]]) -> Callable[[int], int | None]:
    """The duration step statistics fed ``fed`` hold for a step (the last fed of it, as a later
    attempt re-running a step replaces its duration): what they ask for of a step re-run before
    the durations they keep. Read at the first question (from the attempts' sealed steps, if
    they must be: a restart's), for all of them."""
    held: tuple[np.ndarray, np.ndarray] | None = None

    def duration(step: int) -> int | None:
        nonlocal held
        if held is None:
            pairs = [pair for attempt_id, _, count in fed for pair in _durations(
                attempts[attempt_id].steps, attempts[attempt_id].step_times, 0, count)]
            steps = np.array([step for step, _ in pairs], dtype=np.int64)[::-1]
            durations = np.array([duration for _, duration in pairs], dtype=np.int64)[::-1]
            distinct, last = np.unique(steps, return_index=True)  # reversed: the last of each step
            held = distinct, durations[last]
        at = int(np.searchsorted(held[0], step))
        return int(held[1][at]) if at < len(held[0]) and held[0][at] == step else None

    return duration


def _summary(stats: BoundedStepStatistics) -> StepSummary | None:
    """The step-time distribution, from statistics kept in microseconds."""
    mean, recent = stats.mean(), stats.recent_median()
    if mean is None or recent is None:
        return None
    p50, p90, p99, top = (stats.quantile(q) or 0.0 for q in (0.5, 0.9, 0.99, 1.0))
    return StepSummary(len(stats), mean / _US, p50 / _US, p90 / _US, p99 / _US, top / _US, recent / _US)


def _durations(steps: Sequence[int], times: Sequence[int], lo: int, hi: int) -> list[tuple[int, int]]:
    """The (step, duration in microseconds) of consecutive step numbers among steps[lo:hi]."""
    if hi - lo <= _FEW:
        return [(steps[k - 1], times[k] - times[k - 1])
                for k in range(lo + 1, hi) if steps[k] == steps[k - 1] + 1]
    numbers, starts = _ints(steps[lo:hi]), _ints(times[lo:hi])
    consecutive = numbers[1:] == numbers[:-1] + 1
    return list(zip(numbers[:-1][consecutive].tolist(),
                    (starts[1:] - starts[:-1])[consecutive].tolist(), strict=True))


def _all_new(attempt: Attempt, seqs: np.ndarray) -> bool:
    """Whether the sorted ``seqs`` are distinct and none of them was seen by ``attempt``."""
    return (bool(seqs[0] >= attempt.watermark) and bool(np.all(seqs[1:] != seqs[:-1]))
            and attempt.extra.isdisjoint(seqs.tolist()))


def _in_step_order(times: np.ndarray, steps: np.ndarray) -> bool:
    """Whether (time, step) pairs never decrease: the order an attempt keeps its steps in."""
    later = times[1:] > times[:-1]
    return bool(np.all(later) or np.all(later | ((times[1:] == times[:-1]) & (steps[1:] >= steps[:-1]))))


def _ordering(body: dict[str, Any]) -> str:
    """A total order of event bodies, to choose between two job starts of one attempt and time."""
    return json.dumps(body, sort_keys=True)


_FEW = 32  # steps below which plain Python beats numpy's fixed cost (a live run's new steps)


def _ints(values: Sequence[int]) -> np.ndarray:
    """A copy of ``values`` as int64 (a copy, so that an ``array`` stays free to grow)."""
    return np.array(values, dtype=np.int64)


def _seconds(microseconds: float | None) -> float | None:
    return None if microseconds is None else microseconds / _US


# Events that only show the attempt is alive: they move its clock and change no figure, so the
# cached timeline stays valid (a job logging metrics every step keeps its incremental snapshots).
_OBSERVATION_KINDS = ("heartbeat", "model_metrics")
_OBSERVATIONS = frozenset(_OBSERVATION_KINDS)
# Events that are rows of their own tables (``pipeline.core.rows.batch_rows``) and nothing of the
# run's: no figure, not its clock; the state keeps only their seqs, so a run that records hundreds
# of metrics a step costs no more memory than one that records none.
_RECORDED_ONLY = frozenset({"configs", "metrics"})


class Kept(NamedTuple):
    """The event an attempt keeps under a seq: its body is None for an observation, whose
    fingerprint alone is kept (``print``, None for the others)."""

    time_us: int
    kind: str
    body: dict[str, Any] | None
    print: int | None

    def same_as(self, event: Event) -> bool:
        """Whether ``event`` is this one again (a redelivery)."""
        if (self.time_us, self.kind) != (event.time_us, event.kind):
            return False
        if self.body is None:
            return self.print == fingerprint(event.kind, event.body)
        return self.body == event.body  # finite values only: NaN is an observation's

    def order(self) -> tuple[int, int]:
        """Where it sorts among conflicting copies: (time_us, fingerprint)."""
        if self.print is not None:
            return self.time_us, self.print
        assert self.body is not None
        return self.time_us, fingerprint(self.kind, self.body)


def _canonical(kind: str, body: dict[str, Any]) -> str:
    """An event's kind and body as one deterministic text (a NaN loss equals itself here)."""
    return json.dumps([kind, body], sort_keys=True, separators=(",", ":"))


def fingerprint(kind: str, body: dict[str, Any]) -> int:
    """A 64-bit fingerprint of an event's kind and body, the same in every process: with its
    time, it orders conflicting duplicates."""
    digest = hashlib.blake2b(_canonical(kind, body).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little", signed=True)


def _entry(t: int, kind: str, body: dict[str, Any]) -> tuple[int, ...]:
    """What a checkpoint or a slice count adds to its attempt's list."""
    if kind == "elastic_slice_counts":
        return (t, int(body["active_slices"]), int(body["total_slices"]), int(body["available_slices"]))
    return (t, round(body["blocking_s"] * _US), int(body["step"]))


def _index(seqs: Column, seq: int) -> int | None:
    """Where ``seq`` is in ``seqs`` (found by bisection while they are in order, as they nearly
    always are; else by a scan), or None."""
    i = bisect_left(seqs, seq)
    if i < len(seqs) and seqs[i] == seq:
        return i
    found = np.flatnonzero(_ints(seqs) == seq)
    return int(found[0]) if len(found) else None


def _conflict(run_id: str, attempt_id: str, seq: int, time_us: int, kind: str,
              body: dict[str, Any] | None) -> DeadLetter:
    """The dead letter of the copy of a conflicting duplicate that is not kept."""
    payload = json.dumps({"seq": seq, "time_us": time_us, kind: body}, sort_keys=True)
    kept_back = " (its body is not kept in the state: see the raw events)" if body is None else ""
    return DeadLetter(payload, f"conflicting duplicate of (attempt {attempt_id!r}, seq {seq}): another "
                      f"event has the same attempt and seq; the one whose (time_us, fingerprint) sorts "
                      f"first is kept{kept_back}", "engine:dedup", run_id)
