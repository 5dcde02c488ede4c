"""A run's snapshots at a cadence of its own time: the time series a batch replay writes with
``--snapshot_every_s``, so that a report of a replay draws goodput over time as a stream's does.

The snapshot at each cadence time T has the figures a replay ``--as_of=T`` writes for the run:
the engine ignores what was recorded after its ``as_of``. It is not computed so, though: a replay
as of T holds the whole run, and a state that holds events after its ``as_of`` rebuilds the run's
timeline from its first event at every snapshot. Here the run is fed to a state in time order,
one stretch of the cadence at a time, and each snapshot is taken once the state holds what was
recorded up to its time, as a stream takes it: the engine then extends the last snapshot's
timeline, step statistics and anomaly detector (``pipeline.core.engine``) while only the live
attempt's steps were added since, so a run of n steps snapshotted k times costs about n + k, not
n·k. (What the engine cannot extend, say the snapshot after a checkpoint or a restart, it rebuilds,
as a stream's does.)

Anomaly rows are written once, as a stream writes them: each snapshot carries the rows found up
to its time that no earlier snapshot of the run carried (``Cadence.fresh``), the final snapshot
too. So every row a replay as of the final time writes is written, each once, and the views of
the latest state (``latest_goodput``, ``latest_anomalies``, ...) answer as without the cadence.
"""

from __future__ import annotations

import bisect
import dataclasses
from array import array
from collections.abc import Iterable, Iterator, Sequence

import numpy as np

from pipeline.core import engine
from pipeline.core.detect import AnomalyChange, DetectionSettings
from pipeline.core.events import Batch
from pipeline.core.snapshot import Snapshot

#: An anomaly row's identity: kind, host, onset, end, and the time of its state.
RowKey = tuple[str, "str | None", int, "int | None", int]


def row_key(change: AnomalyChange) -> RowKey:
    return change.kind, change.host, change.started_us, change.ended_us, change.changed_us


def cadence_times(first_us: int, last_us: int, every_us: int) -> list[int]:
    """The multiples of ``every_us`` (since the epoch, so that runs' times line up) after
    ``first_us`` and up to ``last_us``."""
    start = first_us // every_us + 1
    return [k * every_us for k in range(start, last_us // every_us + 1)]


def split_by_time(batch: Batch, times: Sequence[int]) -> Iterator[tuple[int, Batch]]:
    """The parts of a message (index, part): part ``i`` holds its events recorded after
    ``times[i - 1]`` and up to ``times[i]``, the last part (index ``len(times)``) those after
    the last time. A message within one stretch (nearly all) is its one part, itself."""
    step_bins = np.searchsorted(np.array(times, dtype=np.int64),
                                np.array(batch.step_times, dtype=np.int64), "left")
    other_bins = [bisect.bisect_left(times, event.time_us) for event in batch.others]
    bins = set(step_bins.tolist()) | set(other_bins)
    if len(bins) == 1:
        yield bins.pop(), batch
        return
    for index in sorted(bins):
        mask = step_bins == index
        yield index, dataclasses.replace(
            batch,
            step_seqs=array("q", np.array(batch.step_seqs, dtype=np.int64)[mask].tobytes()),
            step_times=array("q", np.array(batch.step_times, dtype=np.int64)[mask].tobytes()),
            steps=array("q", np.array(batch.steps, dtype=np.int64)[mask].tobytes()),
            others=tuple(e for e, b in zip(batch.others, other_bins, strict=True) if b == index))


def _first_seq(batch: Batch) -> int:
    return min([*batch.step_seqs[:1], *(e.seq for e in batch.others)])


class Cadence:
    """One run's snapshots every ``every_s`` of its own time (``snapshots``), and the anomaly
    rows they carried, so that the run's final snapshot carries only the others (``fresh``)."""

    def __init__(self, run_id: str, every_s: float, windows_s: tuple[int, ...],
                 exclusions: tuple[tuple[int, int], ...] = (),
                 detection: DetectionSettings | None = None) -> None:
        self.run_id, self.every_us = run_id, max(1, round(every_s * 1_000_000))
        self.windows_s, self.exclusions, self.detection = windows_s, exclusions, detection
        self.written: set[RowKey] = set()

    def snapshots(self, batches: Iterable[Batch], until_us: int,
                  missing_events: int = 0) -> Iterator[Snapshot]:
        """The run's snapshots at the cadence's times after its first event, up to its last one
        and before ``until_us`` (the final snapshot's time, which is not one of them).

        ``missing_events`` is what the whole input lacks (the final snapshot's count): a replay
        as of an earlier time counts the same, for the events recorded after it are not missing,
        only later (an attempt's seqs need not follow its times)."""
        batches = list(batches)
        if not batches:
            return
        first = min(_min_time(batch) for batch in batches)
        last = min(max(batch.max_time_us for batch in batches), until_us - 1)
        times = cadence_times(first, last, self.every_us)
        if not times:
            return
        stretches: list[list[Batch]] = [[] for _ in range(len(times))]
        for batch in batches:
            for index, part in split_by_time(batch, times):
                if index < len(times):
                    stretches[index].append(part)
        state = engine.RunState(self.run_id)
        for time_us, parts in zip(times, stretches, strict=True):
            # An attempt's parts in the order it recorded them: each then extends the state.
            for part in sorted(parts, key=lambda b: (b.attempt_id, _first_seq(b))):
                state.add_batch(part)
            snapshot = state.snapshot(time_us, self.windows_s, self.exclusions, detection=self.detection)
            if snapshot is not None:
                yield self.fresh(dataclasses.replace(snapshot, missing_events=missing_events))

    def fresh(self, snapshot: Snapshot) -> Snapshot:
        """``snapshot`` with only the anomaly rows no snapshot before it carried."""
        new = tuple(change for change in snapshot.anomalies if row_key(change) not in self.written)
        self.written.update(row_key(change) for change in new)
        return snapshot if new == snapshot.anomalies else dataclasses.replace(snapshot, anomalies=new)


def _min_time(batch: Batch) -> int:
    times = [min(batch.step_times)] if batch.step_times else []
    return min(times + [e.time_us for e in batch.others])
