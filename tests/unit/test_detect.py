"""Anomaly detection: slowdowns and hangs found in a run's steps, the same rows however often
the run's snapshots ask, and ``slow_step_time_s`` beside goodput."""

from __future__ import annotations

import dataclasses
import itertools
import math
import random

import pytest

from pipeline.core import engine, state_coder
from pipeline.core.detect import (
    HANG,
    SLOWDOWN,
    STRAGGLER,
    AnomalyChange,
    DetectionSettings,
    Detector,
    HostScorer,
)
from pipeline.core.events import Event
from support.steps import T0, S, attempt_events, host_events, host_summaries, step_times


def detect(times: list[int], settings: DetectionSettings | None = None) -> list[AnomalyChange]:
    detector = Detector(settings)
    detector.feed(times, range(len(times)), 0, len(times))
    return detector.changes


@pytest.mark.parametrize("step_s,noise", [(0.3, 0.05), (2.0, 0.03), (20.0, 0.02)])
def test_a_clean_run_with_heavy_tails_and_checkpoints_has_no_anomaly(step_s, noise):
    for seed in range(3):
        assert detect(step_times(20_000 if step_s < 1 else 5_000, step_s, noise=noise, seed=seed)) == []


@pytest.mark.parametrize("fraction", [0.1, 0.2, 0.5])
def test_a_slowdown_is_found_within_two_minutes_and_ends_where_it_ended(fraction):
    """A slowdown from 10 to 20 minutes into a run of 1 s steps: found, with its onset and end
    within a few steps of the truth, and its figures those of the slow steps."""
    times = step_times(3_000, 1.0, slow=(600, 1200, fraction))
    found, ended = detect(times)
    onset, end = (next(t for t in times if t - T0 >= seconds * S) for seconds in (600, 1200))
    assert found.kind == ended.kind == SLOWDOWN and found.host is None
    assert found.ended_us is None and found.started_us == ended.started_us
    assert abs(found.started_us - onset) <= 10 * S
    assert found.detected_us - onset <= 120 * S
    assert abs(ended.ended_us - end) <= 15 * S and ended.changed_us > ended.ended_us
    # The baseline is the mean step, its checkpoints and heavy tails included.
    normal = [(b - a) / S for a, b in itertools.pairwise(times[10:]) if b <= onset]
    assert found.baseline_s == pytest.approx(sum(normal) / len(normal), rel=0.03)
    assert ended.observed_s == pytest.approx(found.baseline_s * (1 + fraction), rel=0.05)
    assert ended.lost_s == pytest.approx((end - onset) / S * fraction / (1 + fraction), rel=0.15)


def test_a_slowdown_of_the_ordinary_steps_that_took_no_longer_than_the_mean_loses_no_time():
    """Steps of 5 s with an eval of 10 s every fourth (median 5 s, mean 6.25 s), then steps of
    5.9 s and no eval: the ordinary steps are 18 % slower, a slowdown, but no step took longer
    than the baseline's mean: it lost no time, never a negative time."""
    durations = [10.0 if i % 4 == 0 else 5.0 for i in range(400)] + [5.9] * 200
    times = list(itertools.accumulate((round(d * S) for d in durations), initial=T0))
    [found] = detect(times)
    assert (found.kind, found.baseline_s, found.observed_s, found.lost_s) == (SLOWDOWN, 6.25, 5.9, 0.0)


def test_a_slowdown_that_begins_within_the_first_baseline_is_found_and_ends():
    """1 s steps half as slow again from 200 s in, before the first baseline's 300 s are over: its
    block drifts up by itself, and the sums' limit stays finite."""
    times = step_times(800, 1.0, slow=(200, 600, 0.5))
    found, ended = detect(times)
    assert found.kind == ended.kind == SLOWDOWN and ended.ended_us is not None
    assert found.detected_us - T0 < 600 * S and abs(ended.ended_us - T0 - 600 * S) <= 60 * S


def test_a_two_percent_slowdown_is_below_what_is_looked_for_unless_asked():
    times = step_times(3_000, 1.0, slow=(600, 1800, 0.02))
    assert [c.kind for c in detect(times)] == []
    assert [c.kind for c in detect(times, DetectionSettings(min_slowdown=0.02))] == [SLOWDOWN, SLOWDOWN]


def test_short_steps_slower_for_seconds_are_no_slowdown_but_for_minutes_are_found_within_two():
    """0.3 s steps 25 % slower for 12 s (40 steps, which a per-step threshold would find), and
    for five minutes."""
    onset_s = 1800.0
    assert detect(step_times(12_000, 0.3, noise=0.05, slow=(onset_s, onset_s + 12, 0.25))) == []
    times = step_times(12_000, 0.3, noise=0.05, slow=(onset_s, onset_s + 300, 0.25))
    found, ended = detect(times)
    onset = next(t for t in times if t - T0 >= onset_s * S)
    assert found.kind == SLOWDOWN and abs(found.started_us - onset) <= 10 * S
    assert 10 * S <= found.detected_us - onset <= 120 * S and ended.ended_us is not None


@pytest.mark.parametrize("seed", [0, 8])
def test_long_steps_somewhat_slower_for_three_minutes_are_no_slowdown_but_for_five_are_found(seed):
    """At 20 s steps, 9 steps 15 % slower (a host busy for three minutes) add as much to the sum
    as its limit on these runs: the sum must also have counted 12 steps. 15 steps 10 % slower
    are found within 30 steps."""
    onset_s = 3600.0
    assert detect(step_times(400, 20.0, noise=0.02, seed=seed, slow=(onset_s, onset_s + 180, 0.15))) == []
    times = step_times(400, 20.0, noise=0.02, seed=seed, slow=(onset_s, onset_s + 300, 0.10))
    found = [c for c in detect(times) if c.ended_us is None]
    onset = next(t for t in times if t - T0 >= onset_s * S)
    assert [c.kind for c in found] == [SLOWDOWN]
    assert abs(found[0].started_us - onset) <= 60 * S and found[0].detected_us - onset <= 600 * S


@pytest.mark.parametrize("fraction", [0.5, 1.0])
def test_long_steps_much_slower_for_five_minutes_are_found_before_the_slowdown_ends(fraction):
    """At 20 s steps, five minutes are 7 to 10 steps this slow. On noise of 3 % whose consecutive
    steps go together (which raises the clipped sum's limit), the clipped sum, counting each as one
    a little slower, does not find them before they end; the far steps' sum does."""
    rng = random.Random(1)
    z, times = 0.0, [T0]
    for index in range(600):
        z = 0.6 * z + 0.8 * rng.gauss(0, 1)  # lag-1 autocorrelation 0.6, spread 1
        duration = 20.0 * math.exp(0.03 * z) * (3 if index % 100 == 99 else 1) + (30 if index == 0 else 0)
        slow = 3600 <= (times[-1] - T0) / S < 3900
        times.append(times[-1] + round(duration * (1 + fraction * slow) * S))
    onset = next(t for t in times if t - T0 >= 3600 * S)
    found = [c for c in detect(times) if c.ended_us is None]
    assert [c.kind for c in found] == [SLOWDOWN]
    assert abs(found[0].started_us - onset) <= 20 * S and found[0].detected_us - onset < 300 * S


def test_far_steps_one_at_a_time_are_no_slowdown_and_an_older_state_starts_their_sum_afresh():
    """A step twice as long every 10th (a tenth of the steps far, against the usual 1 to 2 %):
    the block's share of far steps is the baseline's, and nothing is found."""
    times = step_times(3_000, 4.0, noise=0.02, gaps={k: 4.0 for k in range(500, 3_000, 10)})
    assert detect(times) == []
    detector = Detector()
    detector.feed(times, range(len(times)), 0, 1_000)
    value = detector.to_json()
    del value["far"]  # as a state encoded before the far steps' sum
    decoded = Detector.from_json(value)
    decoded.feed(times, range(len(times)), 1_000, len(times))
    assert decoded.changes == []


def test_a_hang_is_found_its_threshold_after_the_last_step_and_ends_at_the_next():
    times = step_times(500, 2.0, gaps={300: 600.0})
    found, ended = detect(times)
    assert (found.kind, found.started_us, found.detected_us, found.ended_us) == (
        HANG, times[300], times[300] + 60 * S, None)
    assert (ended.ended_us, ended.changed_us) == (times[301], times[301])
    assert ended.observed_s == pytest.approx((times[301] - times[300]) / S)
    # Steps of 20 s: ten of them without a step.
    times = step_times(500, 20.0, noise=0.01, gaps={300: 150.0})
    assert detect(times) == []
    times = step_times(500, 20.0, noise=0.01, gaps={300: 250.0})
    (found, _) = detect(times)
    assert found.detected_us - found.started_us == pytest.approx(200 * S, rel=0.02)


def test_warm_up_steps_are_neither_a_hang_nor_a_slowdown():
    """A first step that compiles for ten minutes, and slow steps after it."""
    times = step_times(400, 1.0, compile_s=600.0, gaps={1: 3.0, 2: 3.0, 3: 3.0})
    assert detect(times) == []


@pytest.mark.parametrize("pieces", [2, 7, 50])
def test_feeding_the_steps_in_pieces_finds_the_same(pieces):
    times = step_times(3_000, 1.0, slow=(600, 1200, 0.2), gaps={2000: 100.0})
    whole = detect(times)
    detector = Detector()
    cuts = sorted(random.Random(pieces).sample(range(1, len(times)), pieces - 1))
    for lo, hi in zip([0, *cuts], [*cuts, len(times)], strict=True):
        detector.feed(times, range(len(times)), lo, hi)
    assert detector.changes == whole and len(whole) == 4


def test_detection_settings_are_checked():
    with pytest.raises(ValueError):
        DetectionSettings(min_slowdown=0)
    with pytest.raises(ValueError):
        DetectionSettings(hang_min_s=-1)


# -- in the engine ---------------------------------------------------------------------------


def run_events() -> tuple[list[Event], int]:
    """A run with a slowdown, a crash (the process silent for 300 s after its last step, then a
    restart), a hang it came out of and one it is in at the end."""
    first = step_times(2_000, 1.0, slow=(600, 1200, 0.3))
    restart = first[-1] + 300 * S
    second = step_times(800, 1.0, seed=1, start_us=restart + 20 * S, gaps={700: 1000.0})
    events = attempt_events("a", first) + attempt_events("b", second, first_step=1_500, start_us=restart)
    return events, second[-1] + 200 * S


def snapshots_rows(events: list[Event], as_of_times: list[int], coded: bool = False) -> list[AnomalyChange]:
    """The anomaly rows of snapshots at ``as_of_times``, each after the one before, the events
    added as their times come, as a stream sees them (``coded``: its state through the state
    coder after every snapshot, as a worker that holds no decoded state has it)."""
    state = engine.RunState("run")
    ordered = sorted(events, key=lambda e: e.time_us)
    rows: list[AnomalyChange] = []
    added, previous = 0, None
    for as_of in as_of_times:
        while added < len(ordered) and ordered[added].time_us <= as_of:
            state.add(ordered[added])
            added += 1
        snapshot = state.snapshot(as_of, anomalies_after_us=previous)
        if snapshot is not None:
            rows += snapshot.anomalies
        previous = as_of
        if coded:
            state = state_coder.decode_state(state_coder.encode_state(state))
    return rows


def test_a_stream_finds_the_rows_a_replay_finds_whatever_its_snapshot_interval():
    """The same rows, but for the silences a replay cannot tell from a death: the crashed
    attempt's, which a stream whose snapshots saw it past the hang threshold reported as a hang and
    closes at the restart, and the one the run is in at the end, a hang to a stream."""
    events, end = run_events()
    replay = snapshots_rows(events, [end])
    assert [(c.kind, c.ended_us is not None) for c in replay] == [
        (SLOWDOWN, False), (SLOWDOWN, True), (HANG, False), (HANG, True)]
    restart = next(e.time_us for e in events if e.attempt_id == "b" and e.kind == "job_start")
    crashed = max(e.time_us for e in events if e.attempt_id == "a")
    final = max(e.time_us for e in events)
    start = min(e.time_us for e in events)
    for interval_s in (7, 30, 61):
        times = [*range(start, end, interval_s * S), end]
        stream = snapshots_rows(events, times)
        silent = [c for c in stream if c.kind == HANG and c.started_us in (crashed, final)]
        assert [(c.started_us, c.detected_us, c.ended_us, c.changed_us) for c in silent] == [
            (crashed, crashed + 60 * S, None, crashed + 60 * S),
            (crashed, crashed + 60 * S, crashed, restart),
            (final, final + 60 * S, None, final + 60 * S)], interval_s
        assert [c for c in stream if c not in silent] == replay, interval_s
    coded = snapshots_rows(events, [*range(start, end, 30 * S), end], coded=True)
    assert [c for c in coded if c.kind != HANG or c.started_us not in (crashed, final)] == replay


def test_a_decoded_run_goes_on_from_its_detectors_state_without_feeding_its_history_again(
        monkeypatch: pytest.MonkeyPatch):
    events, _ = run_events()
    state = engine.RunState("run")
    state.add_all(events)
    middle = events[len(events) // 2].time_us
    state.snapshot(middle)
    fed: list[int] = []
    feed = Detector.feed
    monkeypatch.setattr(Detector, "feed", lambda self, times, steps, lo, hi: (
        fed.append(hi - lo), feed(self, times, steps, lo, hi))[1])
    state = state_coder.decode_state(state_coder.encode_state(state))
    state.snapshot(middle + 60 * S)
    assert 0 < sum(fed) <= 61
    # A step inserted among those fed: the detector is fed the history again, after a decode too.
    state.add(dataclasses.replace(events[100], seq=10**6, time_us=events[100].time_us + 1,
                                  body={"step": 10**6}))
    assert state_coder.decode_state(state_coder.encode_state(state)).detector_state() is None


def test_a_hang_under_way_is_reported_once_and_its_end_later():
    times = step_times(200, 1.0)
    events = attempt_events("a", times)
    last = times[-1]
    state = engine.RunState("run")
    state.add_all(events)
    before = state.snapshot(last + 59 * S)
    assert (before.anomalies, before.open_anomalies[HANG]) == ((), 0)
    during = state.snapshot(last + 61 * S, anomalies_after_us=last + 59 * S)
    (found,) = during.anomalies
    assert (found.kind, found.detected_us, found.ended_us) == (HANG, last + 60 * S, None)
    assert during.open_anomalies == {SLOWDOWN: 0, HANG: 1, STRAGGLER: 0}
    assert state.snapshot(last + 90 * S, anomalies_after_us=last + 61 * S).anomalies == ()
    state.add(Event("run", "a", len(events), last + 100 * S, "step_start", {"step": 200}))
    after = state.snapshot(last + 120 * S, anomalies_after_us=last + 90 * S)
    (ended,) = after.anomalies
    assert (ended.started_us, ended.ended_us) == (last, last + 100 * S)
    assert after.open_anomalies[HANG] == 0
    assert state.hang_threshold_s() == 60.0


def crashed_run(lived_s: float, end: dict[str, object] | None = None) -> tuple[list[Event], int, int]:
    """A run whose first attempt stops stepping and lives on ``lived_s`` (heartbeats every 10 s,
    and the job_end ``end`` if given, with its body), then a restart 300 s after its last step;
    its events, its last step's time and the restart's."""
    first = step_times(300, 1.0)
    last, restart = first[-1], first[-1] + 300 * S
    events = attempt_events("a", first)
    beats = range(10, int(lived_s) + 1, 10)
    events += [Event("run", "a", len(events) + k, last + t * S, "heartbeat", {}) for k, t in enumerate(beats)]
    if end is not None:
        events.append(Event("run", "a", len(events), last + round(lived_s * S), "job_end", end))
    events += attempt_events("b", step_times(100, 1.0, seed=1, start_us=restart + 20 * S), first_step=300,
                             start_us=restart)
    return events, last, restart


def hang_rows(events: list[Event], as_of_us: int) -> list[tuple[int, int | None, int]]:
    """(onset, end, when found or ended) of each hang row a replay as of ``as_of_us`` writes."""
    state = engine.RunState("run")
    state.add_all(events)
    snapshot = state.snapshot(as_of_us)
    assert snapshot is not None
    return [(c.started_us, c.ended_us, c.changed_us) for c in snapshot.anomalies if c.kind == HANG]


def test_the_silence_of_an_attempt_that_died_before_its_restart_is_no_hang():
    """A process killed 10 s after its last step, without a job_end, and restarted 300 s later:
    no hang row, the gap being its crash's (a disruption)."""
    events, _, restart = crashed_run(10)
    assert hang_rows(events, restart + 200 * S) == []
    state = engine.RunState("run")
    state.add_all(events)
    snapshot = state.snapshot(restart + 200 * S)
    assert snapshot is not None and len(snapshot.disruptions) == 1


def test_a_hang_its_process_was_killed_in_lasts_until_its_last_sign_of_life():
    """A process that heartbeats 120 s without a step and is then killed is a hang from its last
    step to its last heartbeat, found at its threshold and ended when the restart shows it; one
    that records its failed end 120 s after its last step is a hang until that end."""
    events, last, restart = crashed_run(120)
    assert hang_rows(events, restart + 200 * S) == [(last, None, last + 60 * S),
                                                    (last, last + 120 * S, restart)]
    events, last, restart = crashed_run(120, {"failed": True})
    assert hang_rows(events, restart + 200 * S) == [(last, None, last + 60 * S),
                                                    (last, last + 120 * S, last + 120 * S)]


def test_a_hang_reported_while_an_attempt_was_silent_is_closed_when_its_restart_shows_a_crash():
    """A stream that saw the killed attempt silent past its threshold reported a hang, open; the
    restart closes it, at the attempt's last sign of life, and nothing of it stays open. A stream
    whose snapshots came before the threshold and after the restart reports nothing."""
    events, last, restart = crashed_run(10)
    rows = snapshots_rows(events, [last + 30 * S, last + 90 * S, restart + 30 * S, restart + 200 * S])
    assert [(c.kind, c.started_us, c.ended_us, c.changed_us) for c in rows] == [
        (HANG, last, None, last + 60 * S), (HANG, last, last + 10 * S, restart)]
    state = engine.RunState("run")
    state.add_all(events)
    assert state.snapshot(restart + 200 * S).open_anomalies[HANG] == 0
    assert snapshots_rows(events, [last + 30 * S, restart + 30 * S, restart + 200 * S]) == []


def test_a_replay_as_of_a_silence_finds_no_hang_but_as_of_a_hang_heard_from_finds_it():
    """A replay as of 100 s after the last step, before the restart: no hang for the attempt silent
    since (it may be dead: a replay is not asked again when the restart shows it), a hang found at
    the threshold for the one whose heartbeats still came past it."""
    events, last, _ = crashed_run(10)
    assert hang_rows(events, last + 100 * S) == []
    events, last, _ = crashed_run(120)
    assert hang_rows(events, last + 100 * S) == [(last, None, last + 60 * S)]


def test_a_slowdown_or_straggler_open_when_the_run_ends_ends_with_it_and_is_found_again_after_a_restart():
    """Slow from 10 minutes in to the end (job_end at 40 min), with a slow host: both end at the
    job end, in the stream (snapshots every 30 s) as in the replay, and nothing is open after it.
    After a restart, still slow, both are found again."""
    times = step_times(2_400, 1.0, slow=(600, 10_000, 0.3))
    end = times[-1] + S
    summaries = host_events([s for s in host_summaries(8, 40, slow=(3, 600, 10_000, 0.3)) if s[1] < end])
    events = sorted(attempt_events("a", times, end_us=end) + summaries, key=lambda e: e.time_us)
    replay = snapshots_rows(events, [end + 600 * S])
    assert [(c.kind, c.ended_us) for c in replay] == [(SLOWDOWN, None), (STRAGGLER, None), (SLOWDOWN, end),
                                                      (STRAGGLER, end)]
    assert snapshots_rows(events, [*range(T0, end, 30 * S), end, end + 600 * S]) == replay
    state = engine.RunState("run")
    state.add_all(events)
    assert state.snapshot(end + 600 * S).open_anomalies == {SLOWDOWN: 0, HANG: 0, STRAGGLER: 0}
    restart = end + 120 * S
    again = step_times(1_200, 1.0, seed=2, start_us=restart + 20 * S, slow=(0, 10_000, 0.3))
    later = host_events(host_summaries(8, 20, slow=(3, 0, 10_000, 0.3), start_us=restart, seed=2))
    state.add_all(sorted(attempt_events("b", again, first_step=3_000, start_us=restart)
                         + [dataclasses.replace(e, attempt_id=e.attempt_id + "-b") for e in later],
                         key=lambda e: e.time_us))
    snapshot = state.snapshot(again[-1])
    assert snapshot.open_anomalies == {SLOWDOWN: 1, HANG: 0, STRAGGLER: 1}
    assert {c.kind for c in snapshot.anomalies if c.ended_us is None and c.started_us > restart} == {
        SLOWDOWN, STRAGGLER}


def test_slow_step_time_is_the_step_time_beyond_the_ideal():
    durations = [1.0] * 50 + [1.5, 3.0]
    times = [T0]
    for duration in durations:
        times.append(times[-1] + round(duration * S))
    state = engine.RunState("run")
    state.add_all(attempt_events("a", times))
    snapshot = state.snapshot(times[-1])
    assert snapshot.ideal_step_time_s == pytest.approx(1.0)
    assert snapshot.slow_step_time_s == pytest.approx(0.5 + 2.0)
    assert snapshot.cumulative.productive_s > snapshot.slow_step_time_s



# -- stragglers ------------------------------------------------------------------------------


def stragglers(summaries: list[tuple[str, int, int, float, float]], as_of_times: list[int],
               settings: DetectionSettings | None = None) -> list[AnomalyChange]:
    """The straggler rows of a scorer given the summaries as their times come and scored at
    each of ``as_of_times``."""
    scorer, added = HostScorer(), 0
    for as_of in as_of_times:
        while added < len(summaries) and summaries[added][1] <= as_of:
            scorer.add(*summaries[added])
            added += 1
        scorer.score(as_of, settings or DetectionSettings())
    return scorer.changes


@pytest.mark.parametrize("hosts", [2, 8, 256])
def test_a_host_ten_percent_slower_is_a_straggler_within_ten_minutes_and_ends_when_it_recovers(hosts):
    summaries = host_summaries(hosts, 60, slow=(1, 600, 2400, 0.10))
    found, ended = stragglers(summaries, [T0 + 3600 * S])
    assert (found.kind, found.host, ended.host) == (STRAGGLER, "host-1", "host-1")
    assert 600 * S - 60 * S <= found.started_us - T0 <= 600 * S + 120 * S
    assert found.detected_us - (T0 + 600 * S) <= 600 * S
    assert abs(ended.ended_us - (T0 + 2400 * S)) <= 120 * S
    assert ended.observed_s == pytest.approx(1.1 * ended.baseline_s, rel=0.03)
    assert ended.lost_s == pytest.approx(0.1 * (2400 - 600) * ended.baseline_s / 1.1, rel=0.15)


@pytest.mark.parametrize("step_s,noise", [(0.3, 0.05), (2.0, 0.03), (20.0, 0.02)])
def test_clean_hosts_are_never_stragglers(step_s, noise):
    minutes = 60 if step_s < 1 else 240
    for seed in range(2):
        assert stragglers(host_summaries(64, minutes, step_s=step_s, noise=noise, seed=seed),
                          [T0 + minutes * 60 * S]) == []


def test_a_host_slower_for_less_than_five_minutes_or_by_less_than_the_threshold_is_no_straggler():
    assert stragglers(host_summaries(16, 60, slow=(3, 600, 780, 0.5)), [T0 + 3600 * S]) == []
    assert stragglers(host_summaries(16, 60, slow=(3, 600, 3000, 0.04)), [T0 + 3600 * S]) == []


def test_stragglers_are_found_at_the_same_times_whatever_the_snapshot_interval():
    summaries = host_summaries(32, 90, slow=(7, 900, 3000, 0.2), seed=3)
    end = T0 + 90 * 60 * S
    replay = stragglers(summaries, [end])
    assert [(c.host, c.ended_us is None) for c in replay] == [("host-7", True), ("host-7", False)]
    for interval_s in (7, 30, 61):
        assert stragglers(summaries, [*range(T0, end, interval_s * S), end]) == replay, interval_s


def test_a_straggler_that_stops_reporting_ends_and_late_or_repeated_summaries_are_left_out():
    summaries = host_summaries(8, 60, slow=(2, 300, 3600, 0.3))
    cut = T0 + 1800 * S
    kept = [s for s in summaries if s[0] != "host-2" or s[1] < cut]
    (found, ended) = stragglers(kept, [T0 + 3600 * S])
    assert found.host == ended.host == "host-2"
    assert cut - 120 * S <= ended.ended_us <= cut
    scorer = HostScorer()
    assert scorer.add("h", T0, 60, 1.0, 2.0) and not scorer.add("h", T0, 60, 1.0, 2.0)  # a redelivery
    scorer.score(T0 + 600 * S, DetectionSettings())
    assert not scorer.add("h", T0 + 60 * S, 60, 1.0, 2.0) and scorer.late == 1


def test_host_summaries_find_a_straggler_change_no_figure_and_survive_the_state_coder():
    times = step_times(3_600, 1.0)
    end = times[-1]
    goodput = attempt_events("a", times)
    summaries = host_events(host_summaries(16, 60, slow=(5, 600, 3600, 0.2)))
    plain, with_hosts = engine.RunState("run"), engine.RunState("run")
    plain.add_all(goodput)
    with_hosts.add_all(sorted(goodput + summaries, key=lambda e: e.time_us))
    expected, snapshot = plain.snapshot(end), with_hosts.snapshot(end)
    assert dataclasses.replace(snapshot, anomalies=(), open_anomalies={}) == dataclasses.replace(
        expected, anomalies=(), open_anomalies={})
    (found,) = snapshot.anomalies
    assert (found.kind, found.host, found.ended_us) == (STRAGGLER, "host-5", None)
    assert snapshot.open_anomalies[STRAGGLER] == 1
    # Half-way through, through the state coder: the same rows and a redelivery is no new event.
    state, half = engine.RunState("run"), len(summaries) // 2
    state.add_all(goodput + summaries[:half])
    state.snapshot(summaries[half - 1].time_us)
    state = state_coder.decode_state(state_coder.encode_state(state))
    assert not state.add(summaries[half - 1])
    state.add_all(summaries[half:])
    assert state.snapshot(end).anomalies == (found,)
