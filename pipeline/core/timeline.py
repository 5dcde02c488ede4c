"""A run's timeline as of a time: every stretch of its elapsed time labelled once.

How time is classified (``docs/differences.md`` says where this departs from the reference):

* The run's elapsed time runs from its first ``job_start`` to the last attempt's ``job_end``, or
  to ``as_of`` while it has none. A gap between a planned stop's ``job_end`` and the next
  ``job_start`` is not elapsed time.
* Each attempt's ``job_start`` opens a segment. An attempt that ends without a ``job_end`` before
  the next attempt's ``job_start`` crashed: the next attempt is a restart (a disruption). So is
  one whose ``job_end`` says ``failed`` (AXLearn records its end in a ``finally``, crash or not),
  or says nothing while the next attempt re-runs steps this one ran (its resume step, below, is at
  or below this attempt's last recorded step): progress was lost. Otherwise (``failed: false``,
  or nothing said and nothing re-run) the end is a planned stop and the next start a resume, no
  disruption. Until the next attempt records a step or a restore, an end that says nothing
  counts as planned; the figures become a crash's when the re-run step arrives.
* A step number that does not increase inside an attempt is an in-process rollback (MaxText's
  elastic recovery rolls back to a checkpoint in the same process) and also a disruption, with
  no recovery gap.
* Inside a segment, the interval from one recorded step start to the next covers the steps in
  between (sparse recording counts). An interval is productive while its steps are kept, and
  wasted progress once a later segment resumes at or before them; the restart's resume step is
  its first recorded step (or its checkpoint restore step until it records one).
* The last step of a segment (from its start to what follows it) counts as productive once the
  attempt has ended as planned (wasted progress if a later segment re-runs it); after a crash,
  the time from it to the next ``job_start`` is infrastructure recovery; after an in-process
  rollback, the time from it to the re-run step is like the time before a segment's first step:
  recorded spans (the elastic wait, the re-initialization, the restore, data loading) take it and
  the rest is OTHER, as in the reference; in a running job it is OTHER until the next step starts,
  so a hang shows as lost time; when the run's last ``job_end`` says ``failed``, it is OTHER too
  (the step never finished).
* Recorded spans (TPU init, training preparation, data loading before a sub-segment's first step,
  checkpoint save and restore, custom badput, elastic waits and re-initialization) take their
  time from productive time and OTHER, never from wasted progress or recovery, and never from
  each other: where spans overlap, the more specific one wins (``SPAN_PRIORITY``). So goodput plus
  every bucket except the informational ``DATA_LOADING_ASYNC`` is exactly 100 % of elapsed time.
* Program startup is the first step of a segment's excess over the segment's mean step time.

Incomplete and inconsistent input is used as recorded, never guessed at:

* A run whose ``job_start`` has not arrived (late, or lost) starts at its earliest step start,
  and steps of an attempt without a ``job_start`` join the segment their times fall in; a run
  with neither has no snapshot yet (its events wait in the state, and in the raw events table,
  until one arrives). When the ``job_start`` arrives, the figures are those of the complete run.
* Times are the hosts' own. An attempt whose host clock runs behind or ahead is placed by its
  times: where a restart's ``job_start`` falls before the previous attempt's last step, the two
  overlap, the earlier-starting one keeps the overlap, and the restart has no recovery time (0,
  never negative); goodput plus the badput buckets is still the elapsed time.
* Step starts of one attempt are ordered by time, and steps recorded at the same time by number.
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pipeline.core.columns import bisect_right
from pipeline.core.snapshot import (
    CHECKPOINT_RESTORE,
    CHECKPOINT_SAVE,
    CUSTOM_PREFIX,
    DATA_LOADING_ASYNC,
    DATA_LOADING_SYNC,
    ELASTIC_REINITIALIZATION,
    ELASTIC_SCALE_UP,
    ELASTIC_SLICE_DOWN,
    EXCLUDED,
    INFRASTRUCTURE_RECOVERY,
    OTHER,
    PRODUCTIVE,
    PROGRAM_STARTUP,
    STANDARD_BUCKETS,
    TPU_INITIALIZATION,
    TRAINING_PREP,
    WASTED_PROGRESS,
    Disruption,
    WindowFigures,
)

if TYPE_CHECKING:
    from pipeline.core.engine import Attempt

#: Where recorded spans overlap, the earlier label in this list keeps the time.
SPAN_PRIORITY: tuple[str, ...] = (
    EXCLUDED, CHECKPOINT_RESTORE, ELASTIC_REINITIALIZATION, ELASTIC_SLICE_DOWN, ELASTIC_SCALE_UP,
    TPU_INITIALIZATION, TRAINING_PREP, DATA_LOADING_SYNC, CHECKPOINT_SAVE,
)

_US = 1_000_000
_PAIRED = {
    "tpu_init": TPU_INITIALIZATION,
    "training_prep": TRAINING_PREP,
    "data_loading": "DATA_LOADING",
    "elastic_reinit": ELASTIC_REINITIALIZATION,
}
# Base labels of the timeline: which of them recorded spans may take time from.
_PRE = "PRE"  # a segment before its first step: OTHER unless a span claims it
_OPEN = "OPEN"  # the running step of a live job: OTHER unless a span claims it
_CLAIMABLE = frozenset({_PRE, _OPEN, PRODUCTIVE})
#: A labelled stretch of the timeline: (start_us, end_us, label, chips).
Piece = tuple[int, int, str, int]


def span_label(name: str, body: dict[str, Any]) -> str | None:
    if name in _PAIRED:
        return _PAIRED[name]
    if name == "custom_badput":
        return CUSTOM_PREFIX + str(body.get("badput_type", "unknown")).upper()
    if name == "elastic_wait":
        kind = str(body.get("event_type", ""))
        return ELASTIC_SCALE_UP if "scale_up" in kind.lower() else ELASTIC_SLICE_DOWN
    return None  # heartbeat and other point events carry no span


def _pair(markers: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Start/end markers paired as the reference pairs them, in time order.

    A start replaces a pending start; an end closes the pending start; an end with none pending
    is ignored; only intervals with start < end count.
    """
    intervals = []
    pending: int | None = None
    for time_us, edge in sorted(markers, key=lambda m: (m[0], -m[1])):
        if edge > 0:
            pending = time_us
        elif pending is not None:
            if pending < time_us:
                intervals.append((pending, time_us))
            pending = None
    return intervals


@dataclasses.dataclass
class SubSegment:
    """Steps ``lo`` to ``hi - 1`` of a segment's (time-ordered) step arrays, numbers increasing."""

    steps: Sequence[int]
    times: Sequence[int]
    lo: int
    hi: int
    end_us: int
    end_kind: str  # "end" (job_end), "failed" (a failed last job_end), "restart", "rollback", "open"
    chips: int
    resume_limit: float = math.inf  # steps at or above this were lost later

    @property
    def first_time(self) -> int:
        return self.times[self.lo]

    @property
    def last_time(self) -> int:
        return self.times[self.hi - 1]

    @property
    def first_step(self) -> int:
        return self.steps[self.lo]

    @property
    def last_step(self) -> int:
        return self.steps[self.hi - 1]

    def kept_count(self) -> int:
        """How many leading step starts end kept intervals: those at or below the resume limit."""
        if self.resume_limit == math.inf:
            return self.hi - self.lo
        return bisect_right(self.steps, self.resume_limit, self.lo, self.hi) - self.lo


@dataclasses.dataclass(frozen=True)
class Settled:
    """A timeline classified up to its settle point (the live sub-segment's last step start),
    before which a later snapshot of the same run finds everything as it was, as long as the run's
    ``signature`` holds: the next snapshot classifies only what follows ``settle_us``."""

    signature: tuple[Any, ...]
    settle_us: int
    pieces: list[Piece]
    totals: dict[str, list[float]]
    custom: list[tuple[int, int]]
    tail_spans: dict[str, list[tuple[int, int]]]  # the recorded spans that end after settle_us
    priority: list[str]
    data_loading_total_s: float


class Timeline:
    """The classified timeline of one run as of a time (built once per snapshot).

    ``version`` is the run's version (``RunState``): while it holds, only the live attempt's
    steps were added since, and ``advance`` moves the timeline on. ``settled`` is the last
    snapshot's ``Settled`` prefix, if any; after classifying, the timeline's own.
    """

    def __init__(self, attempts: Mapping[str, Attempt], as_of_us: int, exclusions: Sequence[tuple[int, int]],
                 version: int, settled: Settled | None = None) -> None:
        self._by_id = attempts
        self.version = version
        self.settled = settled
        self.exclusions = tuple(exclusions)
        self.advanceable = False  # set by _classify when only the live sub-segment can change
        self._base: list[Piece] = []
        self._live_base_from = 0
        self._gaps: list[tuple[int, int]] = []
        self._signature: tuple[Any, ...] = ()
        self.as_of_us = as_of_us
        self._attempts = sorted(attempts.values(), key=lambda a: (
            a.start_us if a.start_us is not None else math.inf, a.attempt_id))
        starts = [a for a in self._attempts if a.start_us is not None and a.start_us <= as_of_us]
        self.metadata: dict[str, Any] = dict(starts[-1].metadata) if starts else {}
        self.chips_now = int(self.metadata.get("chip_count", 0))
        self.disruptions: list[Disruption] = []
        self.max_productive_step = 0
        self.last_step: int | None = None
        self.ended = False
        self.start_us: int | None = None
        self.end_us = as_of_us
        self.data_loading_total_s = 0.0
        self.subsegments: list[SubSegment] = []
        # (attempt id, inserts, steps up to as_of) per segment, when every step has an owner.
        self.step_layout: list[tuple[str, int, int]] | None = None
        self._restarts: list[int] = []  # job_start times of restarts (not planned resumes)
        self._pieces: list[Piece] = []  # start, end, label, chips
        self._totals: dict[str, list[float]] = {}  # label -> [microseconds, chip-microseconds]
        self._custom: list[tuple[int, int]] = []  # pieces labelled custom badput
        if starts:
            self.start_us = starts[0].start_us
        else:  # no job_start recorded: the run starts at its earliest step
            steps = [t for a in self._attempts for t in a.step_times if t <= as_of_us]
            if not steps:
                return
            self.start_us = min(steps)
        self._build(starts, exclusions)

    def _build(self, starts: list[Attempt], exclusions: Sequence[tuple[int, int]]) -> None:
        """One segment per attempt with a job_start (steps of attempts without one are placed by
        time), each split where the step number fails to increase (an in-process rollback)."""
        assert self.start_us is not None
        as_of = self.as_of_us
        owners: list[Attempt | None] = list(starts) or [None]
        bounds = [a.start_us if a is not None and a.start_us is not None else self.start_us
                  for a in owners]
        started = {a.attempt_id for a in starts}  # by id: comparing attempts compares their steps
        orphans = [a for a in self._attempts if a.attempt_id not in started]
        orphan_steps = [(t, step) for a in orphans for step, t in zip(a.steps, a.step_times, strict=True)
                        if t <= as_of]
        merged: list[list[tuple[int, int]]] | None = None
        if orphan_steps:  # rare (a forked child's steps): merge by time into the segments
            merged = [[] for _ in owners]
            for index, attempt in enumerate(starts):
                merged[index].extend(
                    (t, step) for step, t in zip(attempt.steps, attempt.step_times, strict=True)
                    if t <= as_of)
            for t, step in orphan_steps:
                merged[max(0, bisect.bisect_right(bounds, t) - 1)].append((t, step))
        else:
            self.step_layout = [(a.attempt_id, a.inserts, bisect_right(a.step_times, as_of))
                                for a in starts]
        orphan_ends = [(a.end_us, a.failed) for a in self._attempts if a.start_us is None and a.end_us]
        orphan_end = max((end for end, _ in orphan_ends), default=None)
        orphan_failed = _worst(failed for _, failed in orphan_ends)
        # Each segment's steps up to as_of (time-ordered) and where they fail to increase.
        layouts: list[tuple[Sequence[int], Sequence[int], int, list[int]]] = []
        for index, owner in enumerate(owners):
            if merged is not None:
                pairs = sorted(merged[index])
                steps: Sequence[int] = [p[1] for p in pairs]
                layouts.append((steps, [p[0] for p in pairs], len(steps),
                                [k for k in range(1, len(steps)) if steps[k] <= steps[k - 1]]))
            else:
                assert owner is not None and self.step_layout is not None
                count = self.step_layout[index][2]
                layouts.append((owner.steps, owner.step_times, count,
                                [k for k in owner.split_indices() if k < count]))
        resumes = [_resume_step(owner, layout, as_of) for owner, layout in zip(owners, layouts, strict=True)]
        base: list[Piece] = []
        gaps: list[tuple[int, int]] = []
        resume_points: list[tuple[int, int]] = []  # (time, step) where progress restarts
        end_of_run = as_of
        for index, owner in enumerate(owners):
            seg_start = bounds[index]
            chips = int(owner.metadata.get("chip_count", 0)) if owner is not None else 0
            next_start = bounds[index + 1] if index + 1 < len(owners) else None
            job_end: int | None
            failed: bool | None
            if owner is not None and owner.end_us is not None:
                job_end, failed = owner.end_us, owner.failed
            else:
                job_end, failed = orphan_end, orphan_failed
            if job_end is not None and not (seg_start <= job_end <= as_of):
                job_end = None
            if job_end is not None and next_start is not None and job_end > next_start:
                job_end = None  # an end after the next start ended nothing
            steps, times, count, splits = layouts[index]
            if next_start is not None:
                # An end whose next attempt re-runs steps it ran lost progress: a crash (AXLearn
                # records its job_end in a finally), unless the caller said the stop was planned.
                last_step = steps[count - 1] if count else None
                resume = resumes[index + 1]
                lost = last_step is not None and resume is not None and resume <= last_step
                if job_end is not None and failed is not True and not (failed is None and lost):
                    seg_end, end_kind = job_end, "end"
                    gaps.append((job_end, next_start))  # a planned stop: not elapsed time
                else:
                    seg_end, end_kind = next_start, "restart"
                    self._restarts.append(next_start)
            elif job_end is not None:
                seg_end, end_kind = job_end, "failed" if failed else "end"
                self.ended = True
                end_of_run = job_end
            else:
                seg_end, end_kind = as_of, "open"
            subs = _split(steps, times, count, splits, seg_end, end_kind, chips)
            base.append((seg_start, subs[0].first_time if subs else seg_end, _PRE, chips))
            if subs:
                resume_points.extend((sub.first_time, sub.first_step) for sub in subs)
            elif (restored := resumes[index]) is not None:  # no step yet: its restore's step
                resume_points.append((seg_start, restored))
            self.subsegments.extend(subs)
        self.end_us = end_of_run
        # Progress at or above a later resume point was lost.
        resume_points.sort()
        limit = math.inf
        later = len(resume_points)
        for sub in reversed(self.subsegments):
            while later > 0 and resume_points[later - 1][0] > sub.first_time:
                later -= 1
                limit = min(limit, resume_points[later][1])
            sub.resume_limit = limit
        for sub in self.subsegments:
            self._live_base_from = len(base)
            base.extend(self._sub_regions(sub))
        self._base, self._gaps = base, gaps
        self._classify(base, gaps, exclusions)

    def _sub_regions(self, sub: SubSegment) -> list[Piece]:
        """Base regions of one sub-segment: kept steps, lost steps, and its last step."""
        steps, times, limit, lo, hi = sub.steps, sub.times, sub.resume_limit, sub.lo, sub.hi
        regions: list[Piece] = []
        kept = sub.kept_count()  # intervals ending at steps lo+1 .. lo+kept-1 are kept
        last_kept = lo + kept - 1
        kept_end = times[last_kept] if kept > 0 else times[lo]
        if kept > 1:
            self.max_productive_step = max(self.max_productive_step, steps[last_kept] - 1)
        if 0 < kept < hi - lo and steps[last_kept] < limit:  # a sparse interval, partly kept
            a, b = last_kept, last_kept + 1
            fraction = (limit - steps[a]) / (steps[b] - steps[a])
            kept_end = times[a] + round(fraction * (times[b] - times[a]))
            self.max_productive_step = max(self.max_productive_step, int(limit) - 1)
        first, last = times[lo], times[hi - 1]
        if kept_end > first:
            regions.append((first, kept_end, PRODUCTIVE, sub.chips))
        if last > kept_end:
            regions.append((kept_end, last, WASTED_PROGRESS, sub.chips))
        if sub.end_us > last:
            if sub.end_kind == "end":  # the last step finished: kept, or lost by a later resume
                tail_kept = steps[hi - 1] < limit
                label = PRODUCTIVE if tail_kept else WASTED_PROGRESS
                if tail_kept:
                    self.max_productive_step = max(self.max_productive_step, steps[hi - 1])
            elif sub.end_kind == "restart":
                label = INFRASTRUCTURE_RECOVERY
            elif sub.end_kind == "rollback":  # until the re-run step: as before a segment's first
                label = _PRE
            else:  # "open" (the running step) or "failed" (the step the crash cut short)
                label = _OPEN
            regions.append((last, sub.end_us, label, sub.chips))
        self.last_step = steps[hi - 1]
        return regions

    def advance(self, as_of_us: int) -> None:
        """Moves an advanceable timeline to a later ``as_of``, when only the live sub-segment's
        steps were added since (the run's version is unchanged)."""
        live = self.subsegments[-1]
        attempt_id, inserts, _ = self.step_layout[-1]  # type: ignore[index]
        count = bisect_right(self._by_id[attempt_id].step_times, as_of_us)
        live.hi, live.end_us = count, as_of_us
        self.step_layout[-1] = (attempt_id, inserts, count)  # type: ignore[index]
        self.as_of_us = self.end_us = as_of_us
        del self._base[self._live_base_from:]
        self._base.extend(self._sub_regions(live))
        # Disruptions stay as they were: all their costs lie before the live sub-segment.
        self._classify(self._base, self._gaps, self.exclusions, (live.last_time, self._signature))

    def _classify(
        self,
        base: list[Piece],
        gaps: list[tuple[int, int]],
        exclusions: Sequence[tuple[int, int]],
        settled_as: tuple[int, tuple[Any, ...]] | None = None,
    ) -> None:
        assert self.start_us is not None
        settle, signature = settled_as or self._settle_point(exclusions, gaps)
        self._signature, self.advanceable = signature, settle is not None
        cached = self.settled
        if settle is not None and cached is not None and cached.signature == signature \
                and cached.settle_us <= settle:
            # Only the live sub-segment grew since the last snapshot: everything before the
            # settle point is as it was; classify just the stretch after it.
            old_settle, prefix, prefix_totals, prefix_custom = (
                cached.settle_us, cached.pieces, cached.totals, cached.custom)
            tail_spans, priority = cached.tail_spans, cached.priority
            self.data_loading_total_s = cached.data_loading_total_s
            regions = [(max(s, old_settle), e, label, chips) for s, e, label, chips in base
                       if e > old_settle]
            suffix = _sweep(regions, tail_spans, priority, old_settle, self.end_us, self.chips_now)
            self._pieces = _splice(prefix, suffix)
            self._totals = _tally(suffix, prefix_totals)
            self._custom = prefix_custom + _custom_intervals(suffix)
            new_part = _clip(suffix, settle)
            settled = _splice(prefix, new_part)
            settled_totals = _tally(new_part, prefix_totals)
            settled_custom = prefix_custom + _custom_intervals(new_part)
        else:
            tail_spans, priority = self._classify_all(base, gaps, exclusions)
            self._totals = _tally(self._pieces)
            self._custom = _custom_intervals(self._pieces)
            if settle is not None:
                settled = _clip(self._pieces, settle)
                settled_totals, settled_custom = _tally(settled), _custom_intervals(settled)
        if settle is not None:
            self.settled = Settled(
                signature, settle, settled, settled_totals, settled_custom,
                {label: [iv for iv in intervals if iv[1] > settle]
                 for label, intervals in tail_spans.items()},
                priority, self.data_loading_total_s)
        self._apply_program_startup()
        if settled_as is None:
            self._record_disruptions()

    def _settle_point(
        self, exclusions: Sequence[tuple[int, int]], gaps: list[tuple[int, int]]
    ) -> tuple[int | None, tuple[Any, ...]]:
        """(settle time, signature) when only the live sub-segment can change, else (None, ()).

        Live: every step has its attempt, the run is open, and nothing was recorded after
        ``as_of``. Then, as long as the signature (everything but the live attempt's steps) is
        unchanged, the timeline before the live sub-segment's last step start stays as it is.
        """
        layout, subs = self.step_layout, self.subsegments
        if layout is None or not subs or subs[-1].end_kind != "open" or any(
                a.last_event_us > self.as_of_us for a in self._attempts):
            return None, ()
        live = layout[-1][0]
        signature = (self.start_us, tuple(exclusions), tuple(gaps), tuple(
            (a.attempt_id, a.start_us, a.end_us, a.failed, a.steps[0] if a.steps else None,
             tuple((k, len(v)) for k, v in a.markers.items()),
             len(a.saves), len(a.restores), a.inserts, len(a.split_indices()),
             None if a.attempt_id == live else len(a.steps)) for a in self._attempts))
        return subs[-1].last_time, signature

    def _classify_all(
        self,
        base: list[Piece],
        gaps: list[tuple[int, int]],
        exclusions: Sequence[tuple[int, int]],
    ) -> tuple[dict[str, list[tuple[int, int]]], list[str]]:
        """Classifies the whole timeline; returns the spans and their priority order."""
        assert self.start_us is not None
        spans: dict[str, list[tuple[int, int]]] = {}
        data_loading: list[tuple[int, int]] = []
        for attempt in self._attempts:
            for label, markers in attempt.markers.items():
                paired = _pair([m for m in markers if m[0] <= self.as_of_us])
                (data_loading if label == "DATA_LOADING" else spans.setdefault(label, [])).extend(paired)
            for name, records in ((CHECKPOINT_SAVE, attempt.saves), (CHECKPOINT_RESTORE, attempt.restores)):
                spans.setdefault(name, []).extend(
                    (t, t + blocking) for t, blocking, _ in records if t <= self.as_of_us and blocking > 0)
        # Data loading blocks training only before a segment's first step: that part is SYNC.
        pre = [(s, e) for s, e, label, _ in base if label == _PRE and e > s]
        self.data_loading_total_s = sum(e - s for s, e in data_loading) / _US
        spans[DATA_LOADING_SYNC] = _intersections(data_loading, pre)
        spans[EXCLUDED] = [*exclusions, *gaps]
        priority = list(SPAN_PRIORITY) + sorted(k for k in spans if k not in SPAN_PRIORITY)
        self._pieces = _sweep(base, spans, priority, self.start_us, self.end_us, self.chips_now)
        return spans, priority

    def _apply_program_startup(self) -> None:
        """Moves each sub-segment's first-step excess from productive time to PROGRAM_STARTUP.

        As in the reference: the first kept interval, less custom badput (and excluded time)
        inside it, against the mean per step of the sub-segment's other kept intervals, less
        theirs.
        """
        custom = IntervalSums(self._custom)
        relabel = _Relabel(self._pieces)
        for sub in self.subsegments:
            steps, times, lo = sub.steps, sub.times, sub.lo
            last = lo + sub.kept_count() - 1  # intervals lo→lo+1 … last-1→last are kept
            if last - lo < 2:
                continue  # one kept interval: nothing to compare the first step with
            first = (times[lo + 1] - times[lo]) - custom.overlap(times[lo], times[lo + 1])
            rest = (times[last] - times[lo + 1]) - custom.overlap(times[lo + 1], times[last])
            per_step = rest / (steps[last] - steps[lo + 1])
            excess = first - per_step * (steps[lo + 1] - steps[lo])
            if excess > 0:
                moved = relabel.give(times[lo], times[lo + 1], PRODUCTIVE, PROGRAM_STARTUP, excess)
                for label, sign in ((PRODUCTIVE, -1), (PROGRAM_STARTUP, 1)):
                    totals = self._totals.setdefault(label, [0.0, 0.0])
                    totals[0] += sign * moved
                    totals[1] += sign * moved * sub.chips
        self._pieces = relabel.pieces()

    def _record_disruptions(self) -> None:
        """One disruption per restart and per in-process rollback, with its cost."""
        subs = self.subsegments
        points: list[tuple[int, bool, int | None, int | None, float]] = []
        # Host clocks can leave sub-segments' first times out of order: the last one (in
        # sub-segment order) starting before a time is found through the suffix minima, the
        # first one starting at or after it through the prefix maxima (both never decrease).
        firsts = [s.first_time for s in subs]
        suffix_min = list(itertools.accumulate(reversed(firsts), min))[::-1]
        prefix_max = list(itertools.accumulate(firsts, max))
        for restart in self._restarts:
            last_before = bisect.bisect_left(suffix_min, restart) - 1
            first_after = bisect.bisect_left(prefix_max, restart)
            before = subs[last_before] if last_before >= 0 else None
            after = subs[first_after] if first_after < len(subs) else None
            # A host clock behind the previous one's can put the restart before its last step.
            last_step_us = min(before.last_time, restart) if before else restart
            points.append((restart, False, before.last_step if before else None,
                           after.first_step if after else None, (restart - last_step_us) / _US))
        for index in range(1, len(subs)):
            if subs[index - 1].end_kind == "rollback":
                points.append((subs[index].first_time, True, subs[index - 1].last_step,
                               subs[index].first_step, 0.0))
        points.sort(key=lambda p: p[0])
        previous = self.start_us or 0
        # The stretches between consecutive points follow each other, as do the (ordered)
        # pieces: one walk over the wasted ones serves every point.
        wasted_pieces = [(s, e) for s, e, label, _ in self._pieces if label == WASTED_PROGRESS]
        next_piece = 0
        for time_us, in_process, last_before_step, resume, recovery in points:
            while next_piece < len(wasted_pieces) and wasted_pieces[next_piece][1] <= previous:
                next_piece += 1
            wasted = 0
            for index in range(next_piece, len(wasted_pieces)):
                s, e = wasted_pieces[index]
                if s >= time_us:
                    break
                if min(e, time_us) > max(s, previous):
                    wasted += min(e, time_us) - max(s, previous)
            self.disruptions.append(Disruption(time_us, last_before_step, resume, wasted / _US,
                                               recovery, in_process))
            previous = time_us

    # -- figures ----------------------------------------------------------------------------

    def figures(self, window_s: int, start_us: int, end_us: int) -> WindowFigures:
        """Goodput and badput over [start_us, end_us)."""
        if not self._pieces or (start_us <= self._pieces[0][0] and end_us >= self._pieces[-1][1]):
            tally = self._totals  # the whole run (none at all as of the instant it starts)
        else:
            ends = [e for _, e, _, _ in self._pieces]
            first = bisect.bisect_right(ends, start_us)  # pieces are contiguous and ordered
            tally = _tally([(max(s, start_us), min(e, end_us), label, chips)
                            for s, e, label, chips in itertools.islice(self._pieces, first, None)
                            if min(e, end_us) > max(s, start_us)])
        totals: dict[str, float] = dict.fromkeys(STANDARD_BUCKETS, 0.0)
        excluded = chip_total = 0.0
        for label, (micros, chip_micros) in tally.items():
            if label == EXCLUDED:
                excluded = micros / _US
                continue
            chip_total += chip_micros / _US
            if label != PRODUCTIVE:
                bucket = OTHER if label in (_PRE, _OPEN) else label
                totals[bucket] = totals.get(bucket, 0.0) + micros / _US
        productive = tally.get(PRODUCTIVE, (0.0, 0.0))[0] / _US
        chip_productive = tally.get(PRODUCTIVE, (0.0, 0.0))[1] / _US
        if window_s == 0:  # informational: loads that overlapped training
            totals[DATA_LOADING_ASYNC] = max(0.0, self.data_loading_total_s - totals[DATA_LOADING_SYNC])
        disruptions = sum(1 for d in self.disruptions if start_us <= d.restart_us <= end_us)
        return WindowFigures(window_s=window_s, start_us=start_us, end_us=end_us,
                             total_s=(end_us - start_us) / _US - excluded, productive_s=productive,
                             badput_s=totals, disruptions=disruptions,
                             chip_seconds_total=chip_total, chip_seconds_productive=chip_productive)

    def slice_efficiency(self) -> tuple[float | None, float | None]:
        """Time-weighted stepping and available slice fractions over the run (elastic runs)."""
        records = sorted(r for a in self._attempts for r in a.slice_counts if r[0] <= self.as_of_us)
        if not records or self.start_us is None or self.end_us <= self.start_us:
            return None, None
        start, end = self.start_us, self.end_us
        stepping = available = 0.0
        for index, (t, active, total, avail) in enumerate(records):
            lo = max(t, start)
            hi = min(records[index + 1][0] if index + 1 < len(records) else end, end)
            if hi > lo:
                stepping += active / max(total, 1) * (hi - lo)
                available += avail / max(total, 1) * (hi - lo)
        return stepping / (end - start), available / (end - start)


def _worst(flags: Iterable[bool | None]) -> bool | None:
    """How ended attempts ended, together: failed if one failed, else planned if one said so."""
    values = set(flags)
    return True if True in values else False if False in values else None


def _resume_step(owner: Attempt | None, layout: tuple[Sequence[int], Sequence[int], int, list[int]],
                 as_of_us: int) -> int | None:
    """Where a segment resumes progress: its first step, or while it has none, the step its
    first checkpoint restore loaded; None if neither is recorded by ``as_of``."""
    steps, _, count, _ = layout
    if count:
        return steps[0]
    restored = sorted((t, step) for t, _, step in owner.restores if t <= as_of_us) if owner else []
    return restored[0][1] if restored else None


class _Relabel:
    """Gives time of one label to another inside ranges of ordered, contiguous pieces, one range
    after another, as if each ran on the pieces the ones before it left (which it does); the
    pieces are rebuilt once, at the end, rather than spliced at every range."""

    def __init__(self, pieces: list[Piece]) -> None:
        self._pieces = pieces
        self._starts = [s for s, _, _, _ in pieces]
        self._ends = [e for _, e, _, _ in pieces]
        self._split: dict[int, list[Piece]] = {}  # index of a piece -> the pieces it became

    def give(self, start: int, end: int, old: str, new: str, amount: float) -> float:
        """Gives up to ``amount`` microseconds of ``old`` inside [start, end) to ``new``; returns
        how much it gave."""
        first = bisect.bisect_right(self._ends, start)
        last = bisect.bisect_left(self._starts, end, first)
        left = amount
        for index in range(first, last):
            if left <= 0:
                break
            current = self._split.get(index) or [self._pieces[index]]
            middle: list[Piece] = []
            for s, e, label, chips in current:
                if label != old or left <= 0 or e <= start or s >= end:
                    middle.append((s, e, label, chips))
                    continue
                lo, hi = max(s, start), min(e, end)
                cut = lo + min(left, hi - lo)
                left -= cut - lo
                if s < lo:
                    middle.append((s, lo, label, chips))
                middle.append((lo, cut, new, chips))  # type: ignore[arg-type]  # may be fractional
                if cut < e:
                    middle.append((cut, e, label, chips))  # type: ignore[arg-type]
            self._split[index] = middle
        return amount - left

    def pieces(self) -> list[Piece]:
        """The pieces with every range given so far."""
        if not self._split:
            return self._pieces
        return [piece for index, original in enumerate(self._pieces)
                for piece in self._split.get(index, (original,))]


def _intersections(intervals: list[tuple[int, int]],
                   others: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Where each of ``intervals`` overlaps each of ``others``: ``(max(s, os), min(e, oe))`` for
    every pair with a positive overlap, in the order of a nested loop over ``intervals`` then
    ``others``; found by a sweep over the starts, not by trying every pair."""
    edges = sorted([(s, 0, i) for i, (s, e) in enumerate(intervals) if e > s]
                   + [(s, 1, j) for j, (s, e) in enumerate(others) if e > s])
    active: tuple[list[int], list[int]] = ([], [])  # indices started and not yet ended, per side
    ends = ([e for _, e in intervals], [e for _, e in others])
    pairs: list[tuple[int, int]] = []
    for t, side, index in edges:
        # Each overlapping pair is found once: when the later-starting one of the two starts.
        other = 1 - side
        still = [k for k in active[other] if ends[other][k] > t]
        active[other][:] = still
        pairs.extend((index, k) if side == 0 else (k, index) for k in still)
        active[side].append(index)
    pairs.sort()
    return [(max(intervals[i][0], others[j][0]), min(intervals[i][1], others[j][1])) for i, j in pairs]


def _split(steps: Sequence[int], times: Sequence[int], count: int, splits: list[int],
           end_us: int, end_kind: str, chips: int) -> list[SubSegment]:
    """A segment's first ``count`` steps as sub-segments, split where the number fails to increase."""
    if count == 0:
        return []
    subs = []
    for lo, hi in itertools.pairwise([0, *splits, count]):
        last = hi == count
        subs.append(SubSegment(steps, times, lo, hi, end_us if last else times[hi],
                                end_kind if last else "rollback", chips))
    return subs


def _tally(pieces: list[Piece],
           start: dict[str, list[float]] | None = None) -> dict[str, list[float]]:
    """Microseconds and chip-microseconds per label over ``pieces``, added to ``start``."""
    totals = {label: list(values) for label, values in (start or {}).items()}
    for s, e, label, chips in pieces:
        values = totals.get(label)
        if values is None:
            values = totals[label] = [0.0, 0.0]
        values[0] += e - s
        values[1] += (e - s) * chips
    return totals


def _custom_intervals(pieces: list[Piece]) -> list[tuple[int, int]]:
    """Time that is not step time for program startup: custom badput and excluded time."""
    return [(s, e) for s, e, label, _ in pieces
            if label.startswith(CUSTOM_PREFIX) or label == EXCLUDED]


def _clip(pieces: list[Piece], end: int) -> list[Piece]:
    """The pieces before ``end``, the last one cut there."""
    return [p if p[1] <= end else (p[0], end, p[2], p[3]) for p in pieces if p[0] < end]


def _splice(prefix: list[Piece],
            suffix: list[Piece]) -> list[Piece]:
    """``prefix + suffix``, merging the two pieces that meet if they carry the same label."""
    if prefix and suffix and prefix[-1][1] == suffix[0][0] and prefix[-1][2:] == suffix[0][2:]:
        return [*prefix[:-1], (prefix[-1][0], suffix[0][1], *suffix[0][2:]), *suffix[1:]]
    return prefix + suffix


class IntervalSums:
    """Total overlap of disjoint, ordered intervals with a range (O(log n) beyond a few)."""

    def __init__(self, intervals: list[tuple[int, int]]) -> None:
        self.intervals = intervals
        if len(intervals) > 8:
            self.starts = [s for s, _ in intervals]
            self.ends = [e for _, e in intervals]
            self.before = list(itertools.accumulate((e - s for s, e in intervals), initial=0))

    def _covered_until(self, t: int) -> int:
        """Length of the intervals' union before time t."""
        index = bisect.bisect_right(self.starts, t)
        if index == 0:
            return 0
        return self.before[index - 1] + min(t, self.ends[index - 1]) - self.starts[index - 1]

    def overlap(self, start: int, end: int) -> int:
        if len(self.intervals) <= 8:
            return sum(min(e, end) - max(s, start) for s, e in self.intervals
                       if e > start and s < end)
        return self._covered_until(end) - self._covered_until(start)


def _sweep(
    base: list[Piece],
    spans: dict[str, list[tuple[int, int]]],
    priority: list[str],
    run_start: int,
    run_end: int,
    default_chips: int,
) -> list[Piece]:
    """Labels every stretch of [run_start, run_end) once.

    A stretch takes the top-priority span covering it where the base region lets spans claim
    time (or the span is an exclusion), else the base region's label; where no base region
    covers it, OTHER.
    """
    rank = {label: i for i, label in enumerate(priority)}
    edges: list[tuple[int, int, int]] = []  # time, +1/-1, rank
    for label, intervals in spans.items():
        for s, e in intervals:
            s, e = max(s, run_start), min(e, run_end)
            if e > s:
                edges += [(s, 1, rank[label]), (e, -1, rank[label])]
    edges.sort()
    regions: list[Piece] = []
    for s, e, label, chips in sorted(base):  # clip overlaps (clock skew): earlier region wins
        s = max(s, run_start, regions[-1][1] if regions else run_start)
        e = min(e, run_end)
        if e > s:
            regions.append((s, e, label, chips))
    points = sorted({run_start, run_end, *(t for t, _, _ in edges),
                     *(t for r in regions for t in r[:2])})
    active: dict[int, int] = {}  # rank -> open spans of that rank (usually none or one)
    pieces: list[Piece] = []
    edge = region = 0
    for lo, hi in itertools.pairwise(points):
        while edge < len(edges) and edges[edge][0] <= lo:
            _, delta, level = edges[edge]
            count = active.get(level, 0) + delta
            if count:
                active[level] = count
            else:
                del active[level]
            edge += 1
        while region < len(regions) and regions[region][1] <= lo:
            region += 1
        if region < len(regions) and regions[region][0] <= lo:
            _, _, label, chips = regions[region]
        else:
            label, chips = OTHER, default_chips
        if active:
            top = priority[min(active)]
            if label in _CLAIMABLE or top == EXCLUDED:
                label = top
        if pieces and pieces[-1][1] == lo and pieces[-1][2:] == (label, chips):
            pieces[-1] = (pieces[-1][0], hi, label, chips)
        else:
            pieces.append((lo, hi, label, chips))
    return pieces
