"""Generated steps of runs and hosts, with the noise of real ones, for the anomaly detector:
step start times, ``host_steps`` summaries, and the events that carry them."""

from __future__ import annotations

import math
import random

from pipeline.core.events import Event

S = 1_000_000
T0 = 1_800_000_000 * S


def step_times(count: int, step_s: float, *, noise: float = 0.03, seed: int = 0, compile_s: float = 30.0,
               slow: tuple[float, float, float] | None = None, gaps: dict[int, float] | None = None,
               start_us: int = T0) -> list[int]:
    """Step start times of a run whose step time is log-normal with spread ``noise``, with a
    checkpoint every 100 steps (3 times longer) and heavy tails (1 % of the others 2 to 6 times
    longer), a first step ``compile_s`` longer, ``slow`` = (from s, to s, fraction) slower steps
    between those times (from the start), and ``gaps`` = {step: seconds} the given steps stuck
    that much longer."""
    rng = random.Random(seed)
    times, clock = [start_us], 0.0
    for index in range(count - 1):
        duration = step_s * math.exp(rng.gauss(0, noise))
        if index % 100 == 99:
            duration *= 3
        elif rng.random() < 0.01:
            duration *= rng.uniform(2, 6)
        if index == 0:
            duration += compile_s
        if slow is not None and slow[0] <= clock < slow[1]:
            duration *= 1 + slow[2]
        duration += (gaps or {}).get(index, 0.0)
        clock += duration
        times.append(start_us + round(clock * S))
    return times


def attempt_events(attempt_id: str, times: list[int], *, first_step: int = 0,
                   start_us: int | None = None, end_us: int | None = None) -> list[Event]:
    start = times[0] - 10 * S if start_us is None else start_us
    events = [Event("run", attempt_id, 0, start, "job_start", {})]
    events += [Event("run", attempt_id, 1 + k, t, "step_start", {"step": first_step + k})
               for k, t in enumerate(times)]
    if end_us is not None:
        events.append(Event("run", attempt_id, len(events), end_us, "job_end", {}))
    return events


def host_summaries(hosts: int, minutes: int, *, step_s: float = 1.0, noise: float = 0.03, seed: int = 0,
                   slow: tuple[int, float, float, float] | None = None,
                   start_us: int = T0) -> list[tuple[str, int, int, float, float]]:
    """(host, time, count, mean, max) of each host's summary about every 60 s (60 s plus up to a
    step, as ``HostStepTimer`` records them), its steps' times log-normal with spread ``noise``
    with heavy tails (1 % of steps 2 to 6 times longer); ``slow`` = (host, from s, to s,
    fraction): that host that much slower between those times."""
    rng = random.Random(seed)
    summaries = []
    for host in range(hosts):
        clock = rng.uniform(0, 60)
        while clock < minutes * 60:
            durations = []
            began = clock
            while clock - began < 60:
                duration = step_s * math.exp(rng.gauss(0, noise))
                if rng.random() < 0.01:
                    duration *= rng.uniform(2, 6)
                if slow is not None and host == slow[0] and slow[1] <= clock < slow[2]:
                    duration *= 1 + slow[3]
                durations.append(duration)
                clock += step_s
            summaries.append((f"host-{host}", start_us + round(clock * S), len(durations),
                              sum(durations) / len(durations), max(durations)))
    return sorted(summaries, key=lambda summary: summary[1])


def host_events(summaries: list[tuple[str, int, int, float, float]]) -> list[Event]:
    """The summaries as ``host_steps`` events, each host's from an attempt of its own."""
    seqs: dict[str, int] = {}
    events = []
    for host, time_us, count, mean, longest in summaries:
        seq = seqs[host] = seqs.get(host, -1) + 1
        events.append(Event("run", f"timer-{host}", seq, time_us, "host_steps",
                            {"host": host, "count": count, "mean_s": mean, "max_s": longest}))
    return events
