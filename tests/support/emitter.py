"""For tests of the emitter: waiting on a condition, what a file destination holds, and
transports that hold back or fail their sends."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from emitter import GoodputRecorder
from goodput_schemas.wire import Message
from support.runs import at


def wait_for(condition: Callable[[], bool], timeout: float = 10.0) -> bool:
    """Polls ``condition`` until it holds or ``timeout`` passes; never a bare sleep."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.01)
    return condition()


def line_count(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


class GatedTransport:
    """Holds every send until ``open()``; records what it delivered."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.messages: list[Message] = []

    def open(self) -> None:
        self.gate.set()

    def send(self, message: Message) -> None:
        if not self.gate.wait(10):
            raise TimeoutError("gate never opened")
        self.messages.append(message)

    def after_fork(self) -> None:
        """Nothing inherited."""

    def close(self) -> None:
        self.gate.set()

    def seqs(self) -> list[int]:
        return [event["seq"] for m in self.messages for event in json.loads(m.data)["events"]]


class FlakyTransport(GatedTransport):
    """Fails the first ``failures`` sends, then delivers."""

    def __init__(self, failures: int) -> None:
        super().__init__()
        self.failures = failures
        self.gate.set()

    def send(self, message: Message) -> None:
        if self.failures > 0:
            self.failures -= 1
            raise ConnectionError("broker unavailable")
        super().send(message)


def read_events(path: Path) -> list[dict[str, Any]]:
    """Every event in an emitter file, each with its batch's run_id and attempt_id added."""
    events = []
    for line in path.read_text().splitlines():
        batch = json.loads(line)
        for event in batch["events"]:
            events.append({"run_id": batch["run_id"], "attempt_id": batch["attempt_id"], **event})
    return events


def decode(data: bytes) -> list[tuple[str, int, int, str, dict[str, Any]]]:
    """(attempt_id, seq, time_us, kind, body) of each event of a message."""
    batch = json.loads(data)
    out = []
    for event in batch["events"]:
        (kind, body), = ((k, v) for k, v in event.items() if k not in ("seq", "time_us"))
        out.append((batch["attempt_id"], event["seq"], event["time_us"], kind, body))
    return out


def file_events(path: Path) -> list[tuple[str, int, int, str, dict[str, Any]]]:
    """The events of an emitter file, in file order; a line torn by a killed writer is skipped
    (the pipeline dead-letters it)."""
    events = []
    for line in path.read_bytes().splitlines() if path.exists() else []:
        try:
            events.extend(decode(line))
        except ValueError:
            continue
    return events


def record_steps(recorder: GoodputRecorder, steps: range, durations: list[float],
                 queued: list[int] | None = None, pause_every: int = 0) -> None:
    """Records one step start per step, timing each call; pauses 1 ms every ``pause_every``."""
    clock = time.perf_counter
    for step in steps:
        started = clock()
        recorder.record_step_start_time(step, at(step))
        durations.append(clock() - started)
        if pause_every and step % pause_every == 0:
            if queued is not None:
                queued.append(recorder.stats.queued)
            time.sleep(0.001)


def emitter_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name == "goodput-emitter"}


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * fraction))]
