"""The on-disk spool: a bounded FIFO of recorded events of one run, kept in segment files.

Each segment holds events of one attempt: a JSON header line ``{"run_id", "attempt_id"}`` (and
``"workload_uid"``, where the attempt has one) and one JSON array ``[seq, time_us, kind, body]``
per event. Names sort oldest first: the attempt's start time, its id, then the first sequence
number in the file. A segment is written by one process under an exclusive ``flock``, so another
process (the next attempt draining what this one left) never reads or deletes a segment that is
still being written.

Each event is written with its own ``write`` as it is spilled, not buffered in the process: what
the spool accepted survives the process being killed (``SIGKILL``, the OOM killer), and a write
the disk refuses (full, read-only) fails at once for that event, leaving no torn line behind.

The spool is private: directories it creates are mode 0700; one that another user owns, or that
is a symbolic link, is refused (as a disk that refuses writes), and a group- or world-accessible
directory of the user's own is made private first. A segment is sent only if it is a regular
file of the user's own whose header names this run and the attempt its file name names, so that
nobody can publish events as another run, with its credentials, by planting a file.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import logging
import os
import re
import stat
from pathlib import Path

from goodput_schemas.limits import workload_uid_problem
from goodput_schemas.wire import Record, event_body

_LOG = logging.getLogger(__name__)
_SUFFIX = ".seg"
_COUNT_CHUNK = 1024 * 1024
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def private_directory(path: Path) -> None:
    """Makes ``path`` (and missing parents) a directory only this user can enter.

    Raises:
        OSError: It is a symbolic link, not a directory, or owned by another user.
    """
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        raise OSError(errno.ENOTDIR, f"spool {path} is not a directory of its own (a link?)")
    if info.st_uid != os.geteuid():
        raise OSError(errno.EACCES, f"spool {path} belongs to uid {info.st_uid}, not to this "
                                    f"user ({os.geteuid()}): refusing to spool there")
    if info.st_mode & 0o077:
        os.chmod(path, stat.S_IMODE(info.st_mode) & 0o700)


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
        workload_uid: str = "",
    ) -> None:
        self.directory = run_directory(root, run_id)
        self._run_id = run_id
        self._attempt_id = attempt_id
        self._workload_uid = workload_uid
        self._prefix = f"{attempt_start_ns:020d}-{attempt_id}-"
        self._max_bytes = max_bytes
        self._segment_bytes = segment_bytes
        self._fd: int | None = None
        self._open_path: Path | None = None
        self._open_bytes = 0
        self._total_bytes: int | None = None
        self._claimed: Path | None = None
        self._private = False
        #: Events of this attempt dropped because the spool was full.
        self.dropped_events = 0
        #: Events of earlier attempts dropped (their oldest segments) to make room.
        self.dropped_backlog_events = 0

    # -- writing ----------------------------------------------------------------------------

    def append(self, record: Record) -> bool:
        """Adds one event of this attempt; False if it was dropped because the spool is full.

        Raises:
            OSError: The disk refused the write (full, read-only, gone); nothing was written.
        """
        seq, time_us, kind, body = record
        line = (json.dumps([seq, time_us, kind, event_body(kind, body)], separators=(",", ":"),
                           ensure_ascii=False) + "\n").encode()
        size = len(line)
        if not self._make_room(size):
            self.dropped_events += 1
            return False
        if self._fd is None or self._open_bytes + size > self._segment_bytes:
            self._begin_segment(record[0])
        self._write(line)
        self._open_bytes += size
        self._total_bytes = (self._total_bytes or 0) + size
        return True

    def _write(self, data: bytes) -> None:
        """Writes ``data`` at the end of the open segment, all of it or (raising) none of it."""
        assert self._fd is not None
        written = 0
        try:
            while written < len(data):
                count = os.write(self._fd, data[written:])
                if count <= 0:
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                written += count
        except OSError:
            if written:  # a full disk takes part of a line: cut it off again
                with contextlib.suppress(OSError):
                    os.ftruncate(self._fd, self._open_bytes)
            raise

    def write_segment(self, records: list[Record]) -> int:
        """Writes ``records`` (in seq order) as sealed segments of this attempt.

        What does not fit is dropped and counted in ``dropped_events``. Returns how many events
        the disk refused (from the first refusal on, logged), which are lost and not counted here.
        """
        if not records:
            return 0
        self.seal()
        try:
            for index, record in enumerate(records):
                try:
                    self.append(record)
                except OSError as error:
                    _LOG.error("spool %s refused %d events: %s", self.directory,
                               len(records) - index, error)
                    return len(records) - index
            return 0
        finally:
            self.seal()

    def seal(self) -> None:
        """Closes the segment being written, so that it can be drained."""
        if self._fd is not None:
            fd, self._fd = self._fd, None
            self._open_path = None
            self._open_bytes = 0
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def _ensure_private(self) -> None:
        if not self._private:
            private_directory(self.directory.parent)
            private_directory(self.directory)
            self._private = True

    def _begin_segment(self, first_seq: int) -> None:
        self.seal()
        self._ensure_private()
        path = self.directory / f"{self._prefix}{first_seq:012d}{_SUFFIX}"
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        fields = {"run_id": self._run_id, "attempt_id": self._attempt_id}
        if self._workload_uid:
            fields["workload_uid"] = self._workload_uid
        header = (json.dumps(fields) + "\n").encode()
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            self._fd, self._open_bytes = fd, 0
            self._write(header)
        except OSError:
            self._fd = None
            os.close(fd)
            with contextlib.suppress(OSError):
                path.unlink()
            raise
        self._open_path = path
        self._open_bytes = len(header)
        self._total_bytes = (self._total_bytes or 0) + self._open_bytes

    def _make_room(self, size: int) -> bool:
        if self._total_bytes is None:
            self._total_bytes = sum(p.stat().st_size for p in self._segment_files())
        while self._total_bytes + size > self._max_bytes:
            # The segment being sent is not dropped: its events may be delivered at this moment.
            oldest = [p for p in self.segments() if p != self._claimed]
            if not oldest:
                return False
            dropped = self._count_events(oldest[0])
            self.remove(oldest[0])
            if oldest[0].name.startswith(self._prefix):
                self.dropped_events += dropped
            else:
                self.dropped_backlog_events += dropped
        return True

    # -- draining ---------------------------------------------------------------------------

    def _segment_files(self) -> list[Path]:
        if not self.directory.is_dir():
            return []
        self._ensure_private()  # never read what another user could have put there
        return sorted(p for p in self.directory.iterdir() if p.name.endswith(_SUFFIX))

    def segments(self, *, own: bool | None = None) -> list[Path]:
        """Sealed segments, oldest first; ``own`` selects this attempt's (True) or others' (False)."""
        found = [p for p in self._segment_files() if p != self._open_path]
        if own is None:
            return found
        return [p for p in found if p.name.startswith(self._prefix) == own]

    def claim(self, path: Path | None) -> None:
        """Marks the segment being sent (``None``: none), so that making room never drops it."""
        self._claimed = path

    def read(self, path: Path) -> tuple[str, str, str, list[Record]] | None:
        """(run_id, attempt_id, workload_uid, records) of a sealed segment; None if it is gone, in
        use or unreadable. The workload uid is the one of the attempt that wrote it (empty for none).

        Changes nothing, so the worker reads and decodes a segment without holding the lock that
        ``record_*`` calls take. A segment with no valid header, or not this run's own (see the
        module docstring), has no records. A torn line (the writer was killed mid-write) is
        skipped with a warning.
        """
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        except OSError as error:
            _LOG.warning("spool segment %s cannot be read (%s); removing it", path, error)
            return "", "", "", []
        handle = os.fdopen(fd, "rb")
        with handle:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid():
                _LOG.warning("spool segment %s is not a file of this user's; removing it", path)
                return "", "", "", []
            try:
                fcntl.flock(handle.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                return None  # another live process is still writing it
            data = handle.read()
        # Only "\n" ends a line: JSON escapes it inside strings, but not U+2028 or U+0085.
        lines = data.split(b"\n")
        if lines[-1] == b"":
            lines.pop()
        try:
            header = json.loads(lines[0])
            run_id, attempt_id = str(header["run_id"]), str(header["attempt_id"])
            workload_uid = str(header.get("workload_uid", ""))
            if workload_uid_problem(workload_uid) is not None:
                raise ValueError("an invalid workload uid")
        except (ValueError, KeyError, TypeError, IndexError, AttributeError):
            _LOG.warning("spool segment %s has no valid header; removing it", path)
            return "", "", "", []
        if run_id != self._run_id or f"-{attempt_id}-" not in path.name:
            _LOG.warning("spool segment %s names run %r, attempt %r: not this run's; removing it",
                         path, run_id[:100], attempt_id[:100])
            return "", "", "", []
        records: list[Record] = []
        for number, line in enumerate(lines[1:], start=2):
            try:
                seq, time_us, kind, body = json.loads(line)
                records.append((int(seq), int(time_us), str(kind), dict(body)))
            except (ValueError, TypeError):
                _LOG.warning("spool segment %s: skipping unreadable line %d", path, number)
        return run_id, attempt_id, workload_uid, records

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
        lines = 0
        try:
            with open(path, "rb") as handle:
                while chunk := handle.read(_COUNT_CHUNK):
                    lines += chunk.count(b"\n")
        except FileNotFoundError:
            return 0
        return max(0, lines - 1)

    def after_fork(self, attempt_id: str, attempt_start_ns: int) -> None:
        """Forgets the parent's open segment and writes under the child's attempt from now on."""
        if self._fd is not None:
            os.close(self._fd)  # the parent keeps its own descriptor, and with it the lock
        self._fd = None
        self._claimed = None
        self._open_path = None
        self._open_bytes = 0
        self._attempt_id = attempt_id
        self._prefix = f"{attempt_start_ns:020d}-{attempt_id}-"
        self.dropped_events = 0
        self.dropped_backlog_events = 0

    def close(self) -> None:
        """Seals the open segment and removes the run directory if nothing is left in it."""
        self.seal()
        with contextlib.suppress(OSError):
            os.rmdir(self.directory)
