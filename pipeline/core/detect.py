"""Anomalies in a run's steps, found as the steps arrive: a slowdown (a step-time regression), a
hang (no step for too long), and a straggler (one host slower than the run's other hosts, from
their ``host_steps`` summaries: ``HostScorer``).

A ``Detector`` is fed each attempt's step starts in time order (``feed``), one attempt after
another, and keeps what it found as ``AnomalyChange`` rows: one when an anomaly is found, one
when it is found to have ended. Each row depends only on the steps up to the event time it was
found at (``changed_us``), never on when it is asked, so a stream that asks every few seconds
and a replay that asks once find the same rows. A detector is O(1) in memory and work per step
(``DetectionSettings.refresh_steps`` durations at most).

The first ``warmup_steps`` steps of every attempt are warm-up (compilation, caches filling):
nothing is looked for in them.

**Baseline.** Taken from the first ``reference_steps`` steps after the warm-up (and at least
``reference_s`` of them: consecutive short steps go together too much to tell the noise), then
from each later block of ``refresh_steps`` steps that ran with no slowdown open or building up, so that a
slowdown is never learnt as the new normal before it is found: the block's median duration
(what the sums below compare with), ``noise``, the spread of its log durations (1.4826 MAD, at
least 1 %), and its mean step time with steps as long as a hang left out, which rows report as
``baseline_s`` and count lost time against (a run's normal checkpoint and eval steps are part of
its mean, not a loss).

**Slowdown.** A one-sided CUSUM of each consecutive step's log duration against the baseline: ``S =
max(0, S + x - k)``, ``x = log(duration / baseline)`` clipped to ``[-c, c]`` so that a lone
checkpoint, eval or data-loading step adds at most ``c - k``, with ``k = log(1 + min_slowdown /
2)``, halfway to the smallest slowdown looked for, and ``c = max(4 noise, 2k)``: on a quiet run, no
step counts for more than a step of the smallest slowdown does (``2k``, about ``log(1 +
min_slowdown)``), so a lone outlier adds no more than such a step does. It is found when ``S > h``,
``h = max(4c, 10 noise² / k, k * steps in FLOOR_S)``: ``4c`` so that no three outliers in a row
suffice, ``10 noise² / k`` to hold the false alarms on a noise of that spread to one in about e^20
steps (more for heavy tails and consecutive steps that go together: see ``_rebase``), and what the
smallest slowdown adds in about a minute, so that short steps a little slower for seconds are no
slowdown (it delays only steps under a few seconds, by at most a minute). And not before ``S`` has
counted ``SPELL_STEPS`` (12) steps since its onset, where ``S`` last left 0: a few steps somewhat
slower that go back to normal (a host busy for a few minutes, at 20 s steps) are no regression. 12
steps are 4 minutes at 20 s steps (where 30 steps of latency are allowed), 48 s at 4 s steps, and
less than the minute above at shorter ones.

**Large slowdowns.** The clip that keeps a lone outlier from counting much also keeps a step twice
as long from counting more than one a little slower, so a second sum watches the far steps: those
at least ``FAR`` (25 %) slower than the baseline, a share ``p`` of the baseline's block (``(far + 1) /
(steps + 2)``, never 0) and at least half of the steps of a slowdown of ``FAR`` or more. Each step
adds its log-likelihood ratio of the two, ``log(0.5 / p)`` if far and ``log(0.5 / (1 - p))`` if not,
to ``F = max(0, F + ...)``. Such a sum of likelihood ratios passes ``L`` less than once in e^L clean
steps (independent ones, far as often as in the block), so ``L = log(ARL_S / baseline)``: about once
in ``ARL_S`` (10^8 s, three years) of a clean run's steps, whatever its step time. (``S`` keeps e^20
steps at any step time: its bound is an approximation.) A slowdown is also found when ``F > L``
once ``FLOOR_S`` have passed since ``F`` last left 0 (its onset): a step 2 to 6 times longer now
and then is no slowdown, several in a row are, found in a few steps at any step time (at 20 s, a
slowdown of 50 % or more lasting five minutes is ten steps or fewer: ``S`` alone would need about
as many).

A slowdown ends when the mirror sum ``D = max(0, D + k - x)`` passes ``h``, at the step where
``D`` last left 0, or at its attempt's end.

**Hang.** A gap between two step starts (or from the last one to the attempt's end, or to now)
of ``max(hang_min_s, hang_factor * median)`` or more: found that long after the last step
started, ended when a step (or the attempt's end) comes. An attempt that died without a job_end
(killed, its machine lost) ends, as far as a hang goes, at its last sign of life, its last event
before its successor's start: the silence from there to the restart is the crash's, a disruption
(``pipeline.core.timeline``), not also a hang. So a crash is a hang only if the attempt lived on
without a step for the threshold first (a hang its watchdog killed: both, each for its own time).
While an attempt is silent and has no successor yet, a dead one cannot be told from a hung one:
a stream reports the hang at its threshold, and closes it once the restart shows a crash; a replay
reports it only once the attempt was heard from past the threshold (``pipeline.core.engine``).
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import math
import statistics
from collections.abc import Sequence
from typing import Any

import numpy as np

SLOWDOWN, HANG, STRAGGLER = "slowdown", "hang", "straggler"
#: Every kind of anomaly, as ``run_anomalies.kind`` names it.
ANOMALY_KINDS = (SLOWDOWN, HANG, STRAGGLER)
_US = 1_000_000
#: The least time, in the baseline's steps, the sum must take to find the smallest slowdown.
FLOOR_S = 60.0
#: The least steps the sum must have counted since its onset to find a slowdown.
SPELL_STEPS = 12
#: How much slower than the baseline a step is far, and the share of far steps in a large slowdown.
FAR, FAR_SHARE = 0.25, 0.5
#: How long a clean run steps, at least on average, before the far steps' sum passes its limit:
#: the false alarms a run may have are per hour, whatever its step time.
ARL_S = 1e8
#: The steps by which the lag-1 autocorrelation of a block's steps is shrunk toward 0 (``_rebase``).
SHRINK_STEPS = 32


@dataclasses.dataclass(frozen=True)
class DetectionSettings:
    """What the detector looks for."""

    #: The smallest slowdown looked for: 0.10 is 10 % slower steps.
    min_slowdown: float = 0.10
    #: Steps at the start of every attempt in which nothing is looked for.
    warmup_steps: int = 5
    #: Steps after the warm-up whose median is the first baseline, and the least time they span.
    reference_steps: int = 32
    reference_s: float = 300.0
    #: Steps in each later block the baseline is taken from again.
    refresh_steps: int = 256
    #: A hang is no step for max(hang_min_s, hang_factor * baseline).
    hang_min_s: float = 60.0
    hang_factor: float = 10.0
    #: Hosts are compared per ``host_bucket_s`` of their summaries' times; a bucket is scored
    #: ``host_settle_s`` after it ends (summaries of its hosts are on their way until then).
    host_bucket_s: int = 60
    host_settle_s: int = 30
    #: A straggler is a host slower than its peers for ``straggler_min_s``.
    straggler_min_s: int = 300

    def __post_init__(self) -> None:
        if not (0 < self.min_slowdown <= 10 and self.warmup_steps >= 0 and self.reference_steps >= 1
                and self.reference_s >= 0 and self.refresh_steps >= 2 and self.hang_min_s > 0
                and self.hang_factor > 0 and self.host_bucket_s >= 1 and self.host_settle_s >= 0
                and self.straggler_min_s >= 0):
            raise ValueError(f"detection settings out of range: {self}")


@dataclasses.dataclass(frozen=True)
class AnomalyChange:
    """A row of ``run_anomalies``: an anomaly found (``ended_us`` None), or found to have ended.
    Times are event times in microseconds; figures are seconds."""

    kind: str
    host: str | None
    started_us: int  # the estimated onset
    detected_us: int  # when it was found
    ended_us: int | None
    changed_us: int  # when this row's state was reached: ``detected_us``, or when the end was found
    baseline_s: float
    observed_s: float  # the mean step time from the onset to ``changed_us`` (to the end if ended)
    # The time those steps took beyond the baseline; never below 0: a slowdown of the ordinary
    # steps, found against the median, may come with fewer long ones (evals, checkpoints), so
    # that its steps take no longer than the baseline's mean, which counts those.
    lost_s: float


class Detector:
    """Slowdowns and hangs of one run, as its steps are fed in time order (see the module)."""

    def __init__(self, settings: DetectionSettings | None = None) -> None:
        self.settings = settings = settings or DetectionSettings()
        self.changes: list[AnomalyChange] = []  # in the order found
        self._k = math.log1p(settings.min_slowdown / 2)
        self._clip = self._limit = 0.0
        # The baseline (see the module), in microseconds; the hang threshold and the longest
        # step counted in a mean. None before the first baseline.
        self._median: float | None = None
        self._mean = 0.0
        self._threshold = 0
        self._block: list[float] = []  # durations since the baseline was last taken
        self._sum = 0.0  # the slowdown CUSUM S, and the ending one D while a slowdown is open
        self._onset: int | None = None  # where S (or D) last left 0,
        self._since: tuple[float, int] = (0.0, 0)  # and the durations' sum and count since then
        self._open: AnomalyChange | None = None  # the open slowdown's detection row
        self._through: tuple[float, int] = (0.0, 0)  # its durations' sum and count, onset to now
        self._position = 0  # the index of the current attempt's last step start fed
        # The far steps' sum F, what a far and a near step add to it (0 before a baseline), its
        # onset, and the durations' sum and count since then.
        self._far_sum, self._far_adds, self._far_limit = 0.0, (0.0, 0.0), math.inf
        self._far_onset: int | None = None
        self._far_since: tuple[float, int] = (0.0, 0)

    def new_attempt(self) -> None:
        """The next steps fed are a new attempt's (a restart): its warm-up starts."""
        self._position = 0

    def feed(self, times: Sequence[int], steps: Sequence[int], lo: int, hi: int) -> None:
        """Takes the current attempt's step starts ``lo`` to ``hi - 1`` (``times`` and ``steps``
        are the attempt's, in time order; ``lo`` is the first not fed before)."""
        for k in range(max(lo, 1, self.settings.warmup_steps + 1), hi):
            start, end = times[k - 1], times[k]
            threshold = self.hang_threshold_us()
            if threshold is not None and end - start >= threshold:
                self.changes += self._hang(start, end, threshold)
            if steps[k] == steps[k - 1] + 1 and end > start:
                self._duration(start, end)
        self._position = max(self._position, hi - 1)

    def hang_threshold_us(self) -> int | None:
        """How long a gap between step starts is a hang now (None before any step is measured)."""
        if self._median is not None:
            return self._threshold
        return self._baseline()[1] if self._block else None

    def tail(self, last_us: int | None, end_us: int | None, as_of_us: int) -> list[AnomalyChange]:
        """The rows of a hang after the current attempt's last step start ``last_us`` (None: it
        has none): to the attempt's end ``end_us``, or still going at ``as_of_us`` if it has none;
        and the end, at the attempt's end, of a slowdown open then. Not kept."""
        ended = [] if end_us is None or self._open is None else [
            self._row(self._open, end_us, end_us, *self._through)]
        threshold = self.hang_threshold_us()
        if last_us is None or threshold is None or self._position < self.settings.warmup_steps:
            return ended
        if end_us is not None:
            return ended + (self._hang(last_us, end_us, threshold) if end_us - last_us >= threshold else [])
        if as_of_us - last_us < threshold:
            return []
        return self._hang(last_us, None, threshold)

    @property
    def slowdown_open(self) -> bool:
        """Whether a slowdown was found and has not ended."""
        return self._open is not None

    def end_attempt(self, last_us: int | None, end_us: int, known_us: int | None = None) -> None:
        """Keeps the rows of a hang between the current attempt's last step start and its end
        ``end_us``, and the end of a slowdown open then, before ``new_attempt``: a slowdown is an
        attempt's, and one that goes on after a restart is found again. ``end_us`` is its job_end,
        or, for an attempt that died without one, its last sign of life: the silence after it is
        its crash's (a disruption), not a hang. ``known_us`` is when the end became known (its
        successor's start), when its rows' ends are found (``end_us`` if None)."""
        rows = self.tail(last_us, end_us, end_us)
        if known_us is not None:
            rows = [row if row.ended_us is None
                    else dataclasses.replace(row, changed_us=max(known_us, row.changed_us)) for row in rows]
        self.changes += rows
        if self._open is not None:
            self._open, self._sum, self._onset, self._block = None, 0.0, None, []

    def crash_end(self, last_us: int, heard_us: int, known_us: int) -> AnomalyChange | None:
        """The end of the hang a stream reported while an attempt was silent after its last step
        start ``last_us``, once its successor's start at ``known_us`` showed that it had died at
        ``heard_us``, its last sign of life, less than a threshold after that step: it ended
        there, and the rest of the silence is the crash's. None if the threshold is not known."""
        threshold = self.hang_threshold_us()
        if threshold is None:
            return None
        found, _ = self._hang(last_us, heard_us, threshold)
        mean = found.baseline_s * _US
        return dataclasses.replace(found, ended_us=heard_us, changed_us=known_us,
                                   observed_s=(heard_us - last_us) / _US,
                                   lost_s=max(0.0, heard_us - last_us - mean) / _US)

    def to_json(self) -> dict[str, Any]:
        """The detector as JSON values (for the state coder: a decoded run goes on from here
        rather than feeding its whole history again); ``from_json`` reads it back, exactly."""
        return {"settings": dataclasses.asdict(self.settings),
                "changes": [dataclasses.astuple(change) for change in self.changes],
                "open": None if self._open is None else dataclasses.astuple(self._open),
                "scalars": [self._clip, self._limit, self._median, self._mean, self._threshold, self._sum,
                            self._onset, self._position],
                "since": self._since, "through": self._through, "block": self._block,
                "far": [self._far_sum, *self._far_adds, self._far_limit, self._far_onset, *self._far_since]}

    @classmethod
    def from_json(cls, value: dict[str, Any]) -> Detector:
        detector = cls(DetectionSettings(**value["settings"]))
        detector.changes = [AnomalyChange(*change) for change in value["changes"]]
        detector._open = None if value["open"] is None else AnomalyChange(*value["open"])
        (detector._clip, detector._limit, detector._median, detector._mean, detector._threshold,
         detector._sum, detector._onset, detector._position) = value["scalars"]
        detector._since, detector._through = tuple(value["since"]), tuple(value["through"])
        detector._block = value["block"]
        if "far" in value:  # absent in states encoded before the far steps' sum: it starts afresh
            far_sum, far_add, near_add, detector._far_limit, detector._far_onset, total, count = value["far"]
            detector._far_sum, detector._far_adds = far_sum, (far_add, near_add)
            detector._far_since = (total, count)
        return detector

    # -- internals ---------------------------------------------------------------------------

    def _baseline(self) -> tuple[float, int, float]:
        """The block's median, the hang threshold it gives, and its mean without hangs."""
        median = statistics.median(self._block)
        threshold = round(max(self.settings.hang_min_s * _US, self.settings.hang_factor * median))
        kept = [value for value in self._block if value <= threshold]
        return median, threshold, math.fsum(kept) / len(kept)

    def _hang(self, start: int, end: int | None, threshold: int) -> list[AnomalyChange]:
        mean = self._mean if self._median is not None else self._baseline()[2]
        found = AnomalyChange(HANG, None, start, start + threshold, None, start + threshold, mean / _US,
                              threshold / _US, (threshold - mean) / _US)
        if end is None:
            return [found]
        return [found, dataclasses.replace(found, ended_us=end, changed_us=end,
                                           observed_s=(end - start) / _US, lost_s=(end - start - mean) / _US)]

    def _row(self, found: AnomalyChange | None, start: int, end: int, total: float,
             count: int) -> AnomalyChange:
        """A slowdown's row: found at ``end`` with onset ``start`` (``found`` None), or the end
        at ``start`` of the one ``found``, found at ``end``; over ``count`` steps of ``total``."""
        observed, lost = total / count / _US, max(0.0, total - count * self._mean) / _US
        if found is None:
            return AnomalyChange(SLOWDOWN, None, start, end, None, end, self._mean / _US, observed, lost)
        return dataclasses.replace(found, ended_us=start, changed_us=end, observed_s=observed, lost_s=lost)

    def _duration(self, start: int, end: int) -> None:
        duration = float(end - start)
        self._block.append(duration)
        if self._median is None:
            if (len(self._block) >= self.settings.reference_steps
                    and math.fsum(self._block) >= self.settings.reference_s * _US):
                self._rebase()
            return
        x = max(-self._clip, min(self._clip, math.log(duration / self._median)))
        counted = min(duration, self._threshold)  # a hang is a hang's loss
        if self._open is None:
            self._sum, self._onset, self._since = _summed(
                (self._sum, self._onset, self._since), start, counted, x - self._k)
            far_add, near_add = self._far_adds
            self._far_sum, self._far_onset, self._far_since = _summed(
                (self._far_sum, self._far_onset, self._far_since), start, counted,
                far_add if duration > self._median * (1 + FAR) else near_add)
            found = None
            if self._sum > self._limit and self._since[1] >= SPELL_STEPS:
                assert self._onset is not None
                found = self._onset, self._since
            elif (self._far_sum > self._far_limit and self._far_onset is not None
                  and end - self._far_onset >= FLOOR_S * _US):
                found = self._far_onset, self._far_since
            if found is not None:
                self._open = self._row(None, found[0], end, *found[1])
                self.changes.append(self._open)
                self._through = found[1]
                self._sum, self._onset, self._far_sum, self._far_onset = 0.0, None, 0.0, None
        else:
            total, count = self._through
            self._through = (total + counted, count + 1)
            self._sum, self._onset, self._since = _summed(
                (self._sum, self._onset, self._since), start, counted, self._k - x)
            if self._sum > self._limit:
                assert self._onset is not None
                total, count = self._through[0] - self._since[0], self._through[1] - self._since[1]
                self.changes.append(self._row(self._open, self._onset, end, total, count))
                self._open, self._sum, self._onset = None, 0.0, None
                self._block = []  # the block ran slow: not a baseline
        if len(self._block) >= self.settings.refresh_steps:
            if self._open is None and self._sum < self._limit / 2:
                self._rebase()
            else:
                self._block = []

    def _rebase(self) -> None:
        """Takes the baseline from the block of durations, and starts a new block."""
        self._median, self._threshold, self._mean = self._baseline()
        center = math.log(self._median)
        logs = [math.log(value) - center for value in self._block]  # the sums' x, before the clip
        noise = max(0.01, 1.4826 * statistics.median(abs(value) for value in logs))
        self._clip = max(4 * noise, 2 * self._k)
        clipped = [max(-self._clip, min(self._clip, value)) for value in logs]
        # Consecutive steps' times go together (a busy host, a slow input shard): a sum of n of
        # them spreads as n independent ones would if their variance were (1 + r) / (1 - r) times
        # larger, r the block's lag-1 autocorrelation. Estimated from a block's m steps, r is off
        # by about 1 / sqrt(m), and the high estimates rule the limit: from the first block's 32
        # steps, r came out above 0.5 (more than tripling the limit) in 13 of the benchmark's 60
        # runs at 20 s steps, where a slowdown of 10 % lasting 5 minutes is 15 steps. So r
        # is shrunk by m / (m + SHRINK_STEPS): halved for the first block, by a ninth for a later one.
        power = math.fsum(value * value for value in clipped)
        lagged = math.fsum(a * b for a, b in itertools.pairwise(clipped))
        r = min(0.8, max(0.0, lagged / power)) if power > 0 else 0.0
        r *= len(clipped) / (len(clipped) + SHRINK_STEPS)
        inflation = (1 + r) / (1 - r)
        # A sum with increments x - k passes h about once in e^(theta h) steps, theta the root
        # of mean(exp(theta (x - k))) = 1 over the block's increments: heavy tails, clipped,
        # make theta far smaller than a normal noise's 2k / noise^2.
        theta = _tilt([x - self._k for x in clipped])
        # And at least what the smallest slowdown looked for adds in a minute: a short run's noise
        # and its steps a few seconds slower for a few seconds are no slowdown.
        floor = self._k * FLOOR_S * _US / self._median
        self._limit = max(4 * self._clip, 10 * noise * noise * inflation / self._k, 20 * inflation / theta,
                          floor)
        share = (sum(value > math.log1p(FAR) for value in logs) + 1) / (len(logs) + 2)
        self._far_adds = (math.log(FAR_SHARE / share), math.log((1 - FAR_SHARE) / (1 - share)))
        self._far_limit = math.log(ARL_S * _US / self._median)
        self._block = []


@dataclasses.dataclass
class _Streak:
    """A host's run of slow buckets: from ``start_us``, its step time and its peers' over the
    streak's buckets, and its row once it is a straggler."""

    start_us: int
    last_bucket: int
    own_s: float = 0.0
    peers_s: float = 0.0
    count: int = 0
    found: AnomalyChange | None = None

    def row(self, host: str, changed_us: int, ended_us: int | None = None) -> AnomalyChange:
        baseline, observed = self.peers_s / self.count, self.own_s / self.count
        if self.found is None:
            return AnomalyChange(STRAGGLER, host, self.start_us, changed_us, None, changed_us, baseline,
                                 observed, self.own_s - self.peers_s)
        return dataclasses.replace(self.found, ended_us=ended_us, changed_us=changed_us, baseline_s=baseline,
                                   observed_s=observed, lost_s=self.own_s - self.peers_s)


class HostScorer:
    """Stragglers of one run, from its hosts' step summaries (``host_steps`` events).

    Each summary's longest step is left out (a heavy tail or a checkpoint says nothing of the
    host). Summaries are put in buckets of ``host_bucket_s`` by their time, and a bucket is scored once
    the snapshot time is ``host_settle_s`` past its end: each host's mean step time in it against
    the median of the other hosts' (at least one other). A bucket where a host is at least
    ``min_slowdown / 2`` slower than its peers starts (or goes on with) its streak, one at least
    ``min_slowdown / 4`` slower goes on with it, any other ends it; a bucket without the host
    leaves it as it is, unless the host has been missing for ``straggler_min_s``, which ends it.
    A streak of ``straggler_min_s`` or more, with the host at least ``3/4 min_slowdown`` slower
    over it, is a straggler: found at its bucket's end plus ``host_settle_s`` (so a stream and a
    replay find it at the same time), ended the same way, or at the run's end. Its figures are
    over the streak: the peers' and the host's mean step times, and the host's time beyond its
    peers'.

    Memory is the buckets not scored yet and a streak per host, whatever the run's length. A
    summary that comes after its bucket was scored is late, counted in ``late`` and left out;
    one seen before (the same host and time) is a redelivery.
    """

    def __init__(self) -> None:
        self.changes: list[AnomalyChange] = []
        self.late = 0
        self._pending: dict[tuple[str, int], tuple[int, float]] = {}  # (host, time) -> (count, mean)
        self._scored_until_us = 0  # summaries before this time are scored
        self._ended_us = 0  # the latest end of the run scored
        self._streaks: dict[str, _Streak] = {}

    def add(self, host: str, time_us: int, count: int, mean_s: float, max_s: float) -> bool:
        """Takes one summary; False if it was seen before or came too late to be scored."""
        if time_us < self._scored_until_us:
            self.late += 1
            return False
        key = (host, time_us)
        if key in self._pending:
            return False
        if count > 1:  # its longest step left out: a heavy tail or a checkpoint, not the host
            count, mean_s = count - 1, max(0.0, (count * mean_s - max_s) / (count - 1))
        self._pending[key] = (count, mean_s)
        return True

    def score(self, as_of_us: int, settings: DetectionSettings, ends_us: Sequence[int] = ()) -> None:
        """Scores every bucket that ended ``host_settle_s`` or more before ``as_of_us``, in order,
        and the run's ends ``ends_us`` (its attempts' job_end times) up to ``as_of_us``: at an
        end, the summaries before it are scored at once and every streak ends there (the hosts
        stopped with the run; after a restart they are compared afresh)."""
        if not self.has_state:
            return
        bucket_us = settings.host_bucket_s * _US
        for end_us in sorted(ends_us):
            if self._ended_us < end_us <= as_of_us and end_us > self._scored_until_us:
                self._score_to(end_us, settings, end_us)
                for host, streak in list(self._streaks.items()):
                    self._end(host, streak, end_us, end_us)
                self._ended_us = end_us
        until = (as_of_us - settings.host_settle_s * _US) // bucket_us * bucket_us
        if until > self._scored_until_us:
            self._score_to(until, settings)

    def _score_to(self, until_us: int, settings: DetectionSettings, end_us: int | None = None) -> None:
        """Scores the buckets of the summaries before ``until_us``; found by ``end_us`` at the latest."""
        bucket_us = settings.host_bucket_s * _US
        buckets: dict[int, dict[str, tuple[int, float]]] = {}
        for (host, time_us), (count, mean_s) in list(self._pending.items()):
            if time_us < until_us:
                del self._pending[(host, time_us)]
                steps, total = buckets.setdefault(time_us // bucket_us, {}).get(host, (0, 0.0))
                buckets[time_us // bucket_us][host] = (steps + count, total + count * mean_s)
        self._scored_until_us = until_us
        for bucket in sorted(buckets):
            self._score_bucket(bucket, buckets[bucket], settings, end_us)

    @property
    def has_state(self) -> bool:
        """Whether it was given any summary."""
        return bool(self._scored_until_us or self._pending)

    @property
    def open_count(self) -> int:
        return sum(streak.found is not None for streak in self._streaks.values())

    def to_json(self) -> dict[str, Any]:
        """The scorer as JSON values (for the state coder); ``from_json`` reads it back."""
        pending = [[host, t, count, mean] for (host, t), (count, mean) in sorted(self._pending.items())]
        streaks = {host: [dataclasses.astuple(streak)[:5],
                          None if streak.found is None else dataclasses.astuple(streak.found)]
                   for host, streak in sorted(self._streaks.items())}
        return {"until": self._scored_until_us, "ended": self._ended_us, "late": self.late,
                "pending": pending, "streaks": streaks,
                "changes": [dataclasses.astuple(change) for change in self.changes]}

    @classmethod
    def from_json(cls, value: dict[str, Any]) -> HostScorer:
        scorer = cls()
        scorer._scored_until_us, scorer.late = value["until"], value["late"]
        scorer._ended_us = value.get("ended", 0)  # none in a state of an earlier version
        scorer._pending = {(host, t): (count, mean) for host, t, count, mean in value["pending"]}
        for host, (fields, found) in value["streaks"].items():
            start_us, last_bucket, own_s, peers_s, count = fields
            scorer._streaks[host] = _Streak(start_us, last_bucket, own_s, peers_s, count,
                                            None if found is None else AnomalyChange(*found))
        scorer.changes = [AnomalyChange(*change) for change in value["changes"]]
        return scorer

    def _score_bucket(self, bucket: int, hosts: dict[str, tuple[int, float]],
                      settings: DetectionSettings, end_us: int | None = None) -> None:
        bucket_us = settings.host_bucket_s * _US
        start_us, changed_us = bucket * bucket_us, (bucket + 1) * bucket_us + settings.host_settle_s * _US
        if end_us is not None:
            changed_us = min(changed_us, end_us)
        missing_buckets = max(1, math.ceil(settings.straggler_min_s / settings.host_bucket_s))
        for host, gone in list(self._streaks.items()):
            if host not in hosts and bucket - gone.last_bucket > missing_buckets:
                self._end(host, gone, (gone.last_bucket + 1) * bucket_us, changed_us)
        if len(hosts) < 2:
            return
        means = {host: total / count for host, (count, total) in hosts.items()}
        ordered = sorted(means.values())
        enter, stay = 1 + settings.min_slowdown / 2, 1 + settings.min_slowdown / 4
        for host, mean in means.items():
            peers = _median_without(ordered, mean)
            going = self._streaks.get(host)
            ratio = mean / peers if peers > 0 else 1.0
            if ratio < (enter if going is None else stay):
                if going is not None:
                    self._end(host, going, start_us, changed_us)
                continue
            streak = self._streaks.setdefault(host, _Streak(start_us, bucket))
            count = hosts[host][0]
            streak.last_bucket = bucket
            streak.own_s += count * mean
            streak.peers_s += count * peers
            streak.count += count
            lasted_us = (bucket + 1) * bucket_us - streak.start_us
            if (streak.found is None and lasted_us >= settings.straggler_min_s * _US
                    and streak.own_s >= (1 + 0.75 * settings.min_slowdown) * streak.peers_s):
                streak.found = streak.row(host, changed_us)
                self.changes.append(streak.found)

    def _end(self, host: str, streak: _Streak, ended_us: int, changed_us: int) -> None:
        if streak.found is not None:
            self.changes.append(streak.row(host, changed_us, ended_us))
        del self._streaks[host]


_Sum = tuple[float, int | None, tuple[float, int]]


def _summed(state: _Sum, start: int, duration: float, increment: float) -> _Sum:
    """A running sum (its value, where it last left 0, and the durations' sum and count since then)
    after a step that started at ``start`` adds ``increment`` to it."""
    value, onset, since = state
    if value == 0.0:
        if increment <= 0:
            return state
        onset, since = start, (0.0, 0)
    value = max(0.0, value + increment)
    return value, (onset if value > 0.0 else None), (since[0] + duration, since[1] + 1)


def _tilt(increments: list[float]) -> float:
    """The theta > 0 at which mean(exp(theta x)) over ``increments`` is 1; inf if there is none:
    none is positive, or their mean is not negative (a block that drifts up by itself, a slowdown
    begun in it: the limit's other terms hold it, rather than one without end)."""
    values = np.array(increments)
    top = float(values.max())
    if top <= 0 or float(values.mean()) >= 0:
        return math.inf
    shifted = values - top

    def excess(theta: float) -> float:  # mean(exp(theta x)) - 1, over exp(theta top)
        return float(np.exp(theta * shifted).mean()) - math.exp(-theta * top)

    low, high = 0.0, 1.0
    while excess(high) < 0 and high < 1e6:
        low, high = high, 2 * high
    for _ in range(30):
        middle = (low + high) / 2
        if excess(middle) < 0:
            low = middle
        else:
            high = middle
    return high


def _median_without(ordered: list[float], value: float) -> float:
    """The median of the sorted ``ordered`` with one ``value`` of it left out."""
    at = bisect.bisect_left(ordered, value)
    rest = len(ordered) - 1

    def nth(k: int) -> float:
        return ordered[k if k < at else k + 1]

    return (nth((rest - 1) // 2) + nth(rest // 2)) / 2
