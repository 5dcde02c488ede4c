"""The on-disk spool: a bounded FIFO of recorded events of one run, kept in segment files.

Each segment holds events of one attempt: a JSON header line ``{"run_id", "attempt_id"}`` and one
JSON array ``[seq, time_us, kind, body]`` per event. Names sort oldest first: the attempt's start
time, its id, then the first sequence number in the file. A segment is written by one process
under an exclusive ``flock``, so another process (the next attempt draining what this one left)
never reads or deletes a segment that is still being written.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import re
from pathlib import Path

from emitter.encoding import Record

_LOG = logging.getLogger(__name__)
_SUFFIX = ".seg"
_WRITE_CHUNK = 64 * 1024
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def run_directory(root: Path, run_id: str) -> Path:
    """The spool directory of one run: a readable, collision-free name under ``root``."""
    digest = hashlib.sha256(run_id.encode("utf-8")).hexdigest()[:12]
    readable = _UNSAFE.sub("_", run_id)[:80].strip("._") or "run"
    return root / f"{readable}-{digest}"


class Spool:
    """Spooled events of one run, written by one attempt and drained oldest first.

    Not thread-safe: the emitter's worker serializes access under its queue lock.
    """

    def __init__(
        self,
        root: Path,
        run_id: str,
        attempt_id: str,
        attempt_start_ns: int,
        *,
        max_bytes: int,
        segment_bytes: int,
    ) -> None:
        self.directory = run_directory(root, run_id)
        self._run_id = run_id
        self._attempt_id = attempt_id
        self._prefix = f"{attempt_start_ns:020d}-{attempt_id}-"
        self._max_bytes = max_bytes
        self._segment_bytes = segment_bytes
        self._fd: int | None = None
        self._open_path: Path | None = None
        self._open_bytes = 0
        self._buffer: list[bytes] = []
        self._buffered = 0
        self._total_bytes: int | None = None
        #: Events dropped because the spool was full.
        self.dropped_events = 0

    # -- writing ----------------------------------------------------------------------------

    def append(self, record: Record) -> bool:
        """Adds one event of this attempt; False if it was dropped because the spool is full."""
        line = (json.dumps(record, separators=(",", ":"), ensure_ascii=False) + "\n").encode()
        size = len(line)
        if not self._make_room(size):
            self.dropped_events += 1
            return False
        if self._fd is None or self._open_bytes + size > self._segment_bytes:
            self._begin_segment(record[0])
        self._buffer.append(line)
        self._buffered += size
        if self._buffered >= _WRITE_CHUNK:
            self._write_buffer()
        self._open_bytes += size
        self._total_bytes = (self._total_bytes or 0) + size
        return True

    def _write_buffer(self) -> None:
        if self._fd is not None and self._buffer:
            data = b"".join(self._buffer)
            while data:
                data = data[os.write(self._fd, data):]
        self._buffer.clear()
        self._buffered = 0

    def write_segment(self, records: list[Record]) -> None:
        """Writes ``records`` (in seq order) as sealed segments of this attempt; what does not
        fit is dropped and counted in ``dropped_events``."""
        if not records:
            return
        self.seal()
        for record in records:
            self.append(record)
        self.seal()

    def seal(self) -> None:
        """Closes the segment being written, so that it can be drained."""
        if self._fd is not None:
            try:
                self._write_buffer()
            finally:
                fcntl.flock(self._fd, fcntl.LOCK_UN)
                os.close(self._fd)
                self._fd = None
                self._open_path = None
                self._open_bytes = 0

    def _begin_segment(self, first_seq: int) -> None:
        self.seal()
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / f"{self._prefix}{first_seq:012d}{_SUFFIX}"
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX)
        header = (json.dumps({"run_id": self._run_id, "attempt_id": self._attempt_id}) + "\n").encode()
        self._fd, self._open_path = fd, path
        self._buffer.append(header)
        self._buffered += len(header)
        self._open_bytes = len(header)
        self._total_bytes = (self._total_bytes or 0) + self._open_bytes

    def _make_room(self, size: int) -> bool:
        if self._total_bytes is None:
            self._total_bytes = sum(p.stat().st_size for p in self._segment_files())
        while self._total_bytes + size > self._max_bytes:
            oldest = self.segments()
            if not oldest:
                return False
            dropped = self._count_events(oldest[0])
            self.remove(oldest[0])
            self.dropped_events += dropped
        return True

    # -- draining ---------------------------------------------------------------------------

    def _segment_files(self) -> list[Path]:
        if not self.directory.is_dir():
            return []
        return sorted(p for p in self.directory.iterdir() if p.name.endswith(_SUFFIX))

    def segments(self, *, own: bool | None = None) -> list[Path]:
        """Sealed segments, oldest first; ``own`` selects this attempt's (True) or others' (False)."""
        found = [p for p in self._segment_files() if p != self._open_path]
        if own is None:
            return found
        return [p for p in found if p.name.startswith(self._prefix) == own]

    def read(self, path: Path) -> tuple[str, str, list[Record]] | None:
        """(run_id, attempt_id, records) of a sealed segment; None if it is gone or in use.

        A torn last line (the writer was killed mid-write) is skipped with a warning.
        """
        try:
            handle = open(path, encoding="utf-8")  # noqa: SIM115 - closed below
        except FileNotFoundError:
            return None
        with handle:
            try:
                fcntl.flock(handle.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                return None  # another live process is still writing it
            lines = handle.read().splitlines()
        if not lines:
            return None
        try:
            header = json.loads(lines[0])
            run_id, attempt_id = str(header["run_id"]), str(header["attempt_id"])
        except (ValueError, KeyError, TypeError):
            _LOG.warning("spool segment %s has no valid header; removing it", path)
            self.remove(path)
            return None
        records: list[Record] = []
        for number, line in enumerate(lines[1:], start=2):
            try:
                seq, time_us, kind, body = json.loads(line)
                records.append((int(seq), int(time_us), str(kind), dict(body)))
            except (ValueError, TypeError):
                _LOG.warning("spool segment %s: skipping unreadable line %d", path, number)
        return run_id, attempt_id, records

    def remove(self, path: Path) -> None:
        """Deletes a drained (or dropped) segment."""
        try:
            size = path.stat().st_size
            path.unlink()
        except FileNotFoundError:
            return
        if self._total_bytes is not None:
            self._total_bytes = max(0, self._total_bytes - size)

    @staticmethod
    def _count_events(path: Path) -> int:
        try:
            with open(path, "rb") as handle:
                return max(0, sum(1 for _ in handle) - 1)
        except FileNotFoundError:
            return 0

    def after_fork(self, attempt_id: str, attempt_start_ns: int) -> None:
        """Forgets the parent's open segment and writes under the child's attempt from now on."""
        if self._fd is not None:
            os.close(self._fd)  # the parent keeps its own descriptor, and with it the lock
        self._fd = None
        self._buffer.clear()  # the parent writes what it had buffered
        self._buffered = 0
        self._open_path = None
        self._open_bytes = 0
        self._attempt_id = attempt_id
        self._prefix = f"{attempt_start_ns:020d}-{attempt_id}-"
        self.dropped_events = 0

    def close(self) -> None:
        """Seals the open segment and removes the run directory if nothing is left in it."""
        self.seal()
        with contextlib.suppress(OSError):
            os.rmdir(self.directory)
