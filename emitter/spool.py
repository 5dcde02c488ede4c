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
nobody can publish events as another run, with its credentials, by planting a file. Where the
spool's root itself is taken (another user made the predictable ``<tmp>/goodput-spool-<uid>``
first, or left a link there), the spool moves to a new private directory of its own, logged,
rather than lose the job's events.

What others do to the spool's files loses nothing while the disk has room:

- An attempt holds an exclusive ``flock`` on a lock file of its own in the run's directory while
  it lives: another attempt of the run (a sibling process, a forked child) sends and deletes only
  the segments of attempts whose lock is free (ended, or killed), never a live one's, and the
  directory is never empty (and so never removed by a sibling's ``close``) while it is in use.
- A directory removed all the same (a tmp cleaner) is made again at the next write; a segment
  removed while it is being written (its file unlinked under the open descriptor) is written
  again in full from that descriptor. A sealed segment of this attempt's that disappears before
  it was sent is counted: its events are in ``dropped_events``, logged once.
- A signal handler may interrupt a write of the spool on the same thread and write itself (the
  emitter's worker serializes writers with a re-entrant lock): ``busy`` tells it that a write is
  under way, so that it does not spill into the open segment; ``write_segment`` writes sealed
  segments of their own, never the open one, and ``close`` while a write is under way is done by
  that write as it ends.
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
import tempfile
from pathlib import Path

from goodput_schemas.limits import workload_uid_problem
from goodput_schemas.wire import Record, event_body

_LOG = logging.getLogger(__name__)
_SUFFIX = ".seg"
_LOCK_SUFFIX = ".lock"
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


def _attempt_of(name: str) -> str:
    """The ``{start}-{attempt_id}`` part of a segment's file name."""
    return name.rsplit("-", 1)[0]


class _Size:
    """The bytes a run's spool holds, as its writers in this process estimate them (None: not
    counted yet)."""

    __slots__ = ("bytes",)

    def __init__(self) -> None:
        self.bytes: int | None = None


class _Segment:
    """A segment file being written: its descriptor (holding the file's exclusive ``flock``)."""

    __slots__ = ("fd", "path", "size")

    def __init__(self, fd: int, path: Path) -> None:
        self.fd = fd
        self.path = path
        self.size = 0


class Spool:
    """Spooled events of one run, written by one attempt and drained oldest first.

    Not thread-safe: the emitter's worker serializes access under its queue lock (see the module
    docstring for a signal handler on the same thread).
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
        self._root = root
        self.directory = run_directory(root, run_id)
        self._run_id = run_id
        self._attempt_id = attempt_id
        self._workload_uid = workload_uid
        self._prefix = f"{attempt_start_ns:020d}-{attempt_id}-"
        self._max_bytes = max_bytes
        self._segment_bytes = segment_bytes
        self._open: _Segment | None = None
        self._own: dict[str, int] = {}  # this attempt's segments (sealed and open): events unsent in each
        self._sent: dict[str, int] = {}  # of this attempt's sealed segments, how many events, first
        # in the file, were delivered already (a send that closing interrupted)
        self._lock_fd: int | None = None
        self._size = _Size()  # shared with the spools of the run's next attempts in this process
        self._claimed: Path | None = None
        self._private = False
        self._busy = False
        self._close_pending = False
        self._closed = False
        self._logged: set[str] = set()
        #: Events of this attempt dropped: the spool was full, or a segment was removed unsent.
        self.dropped_events = 0
        #: Of those, events whose segment someone else removed before it was sent.
        self.removed_events = 0
        #: Events of earlier attempts dropped (their oldest segments) to make room.
        self.dropped_backlog_events = 0

    def next_attempt(self, attempt_id: str, attempt_start_ns: int, workload_uid: str) -> Spool:
        """The spool of the run's next attempt in this process: where this one spools (moved, if
        it moved), with its estimate of the spool's size."""
        spool = Spool(self._root, self._run_id, attempt_id, attempt_start_ns, max_bytes=self._max_bytes,
                      segment_bytes=self._segment_bytes, workload_uid=workload_uid)
        spool._size = self._size
        return spool

    @property
    def busy(self) -> bool:
        """A write to the open segment is under way (interrupted, if this is asked on its thread)."""
        return self._busy

    @property
    def kept_events(self) -> int:
        """Events of this attempt in the spool: spilled and not sent yet, or left for the next
        process of the run."""
        return sum(self._own.values())

    # -- writing ----------------------------------------------------------------------------

    def append(self, record: Record) -> bool:
        """Adds one event of this attempt; False if it was dropped because the spool is full.

        Raises:
            OSError: The disk refused the write (full, read-only, gone); nothing was written.
        """
        line = _line(record)
        self._busy = True
        try:
            # Before anything: a full spool drops every event, and would not write the open
            # segment again, whose events a kill would then lose uncounted.
            self._keep_open_on_disk()
            if not self._make_room(len(line)):
                self.dropped_events += 1
                return False
            if self._open is None or self._open.size + len(line) > self._segment_bytes:
                self.seal()
                self._open = self._new_segment(record[0])
            self._write(self._open, line)
            self._keep_open_on_disk()
            return True
        finally:
            self._busy = False
            if self._close_pending:
                self.close()

    def write_segment(self, records: list[Record]) -> int:
        """Writes ``records`` (in seq order) as sealed segments of this attempt of their own.

        What does not fit is dropped and counted in ``dropped_events``. Returns how many events
        the disk refused (from the first refusal on, logged), which are lost and not counted here.
        """
        segment = None
        try:
            for index, record in enumerate(records):
                line = _line(record)
                if not self._make_room(len(line)):
                    self.dropped_events += 1
                    continue
                try:
                    if segment is None or segment.size + len(line) > self._segment_bytes:
                        if segment is not None:
                            self._seal(segment)
                        segment = None
                        segment = self._new_segment(record[0])
                    self._write(segment, line)
                except OSError as error:
                    _LOG.error("spool %s refused %d events: %s", self.directory, len(records) - index, error)
                    return len(records) - index
            return 0
        finally:
            if segment is not None:
                self._seal(segment)

    def seal(self) -> None:
        """Closes the segment being written, so that it can be drained."""
        segment, self._open = self._open, None
        if segment is not None:
            self._seal(segment)

    def _keep_open_on_disk(self) -> None:
        """Writes the open segment again if someone removed it (else it is lost, counted)."""
        if self._open is not None and os.fstat(self._open.fd).st_nlink == 0 and not self._rewrite(self._open):
            self._abandon_open()

    def _abandon_open(self) -> None:
        """Closes the open segment, lost (counted) with the file someone removed."""
        segment, self._open = self._open, None
        if segment is not None:
            with contextlib.suppress(OSError):
                os.close(segment.fd)

    def _seal(self, segment: _Segment) -> None:
        with contextlib.suppress(OSError):  # a descriptor that cannot be asked: found missing later
            if os.fstat(segment.fd).st_nlink == 0:
                self._rewrite(segment)
        fd, segment.fd = segment.fd, -1
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_UN)
        with contextlib.suppress(OSError):
            os.close(fd)

    def _write(self, segment: _Segment, data: bytes) -> None:
        """Writes ``data`` at the end of ``segment``, all of it or (raising) none of it."""
        written = 0
        try:
            while written < len(data):
                count = os.write(segment.fd, data[written:])
                if count <= 0:
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                written += count
        except OSError:
            if written:  # a full disk takes part of a line: cut it off again
                with contextlib.suppress(OSError):
                    os.ftruncate(segment.fd, segment.size)
            raise
        segment.size += len(data)
        self._size.bytes = (self._size.bytes or 0) + len(data)
        if data.count(b"\n") == 1 and segment.size > len(data):  # an event, not the header
            self._own[segment.path.name] = self._own.get(segment.path.name, 0) + 1

    def _new_segment(self, first_seq: int) -> _Segment:
        """A new segment file of this attempt, its header written, under an exclusive ``flock``."""
        for attempt in range(2):
            self._ensure_private()
            try:
                fd, path = self._create(first_seq)
            except FileNotFoundError:
                if attempt:
                    raise
                self._private = False  # the directory was removed: made again
                continue
            break
        segment = _Segment(fd, path)
        fields = {"run_id": self._run_id, "attempt_id": self._attempt_id}
        if self._workload_uid:
            fields["workload_uid"] = self._workload_uid
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            self._write(segment, (json.dumps(fields) + "\n").encode())
        except OSError:
            os.close(fd)
            with contextlib.suppress(OSError):
                path.unlink()
            raise
        self._own[path.name] = 0
        return segment

    def _create(self, first_seq: int) -> tuple[int, Path]:
        """Creates a segment file of a name no other file has (a signal handler's segment may
        begin at the same number as the one it interrupted)."""
        flags = os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        for copy in range(1000):
            name = f"{self._prefix}{first_seq:012d}{f'.{copy}' if copy else ''}{_SUFFIX}"
            path = self.directory / name
            try:
                return os.open(path, flags, 0o600), path
            except FileExistsError:
                continue
        raise OSError(errno.EEXIST, f"spool {self.directory}: no free name for a segment at {first_seq}")

    def _rewrite(self, segment: _Segment) -> bool:
        """Writes a segment that was removed while open (its events only in the unlinked file
        the descriptor holds) again, under its name, and writes on there; False if it cannot (a
        full disk): its events are then lost with it, counted dropped and logged."""
        old_name = segment.path.name
        events = self._own.get(old_name, 0)
        failed = "a segment removed while it was written could not be written again"
        try:
            data = os.pread(segment.fd, segment.size, 0)
            self._private = False  # whoever removed it may have removed the directory too
            self._ensure_private()
            fd, path = self._create(int(old_name[len(self._prefix):].split(".", 1)[0]))
        except OSError as error:
            self._lose(old_name, f"{failed} ({error})")
            return False
        replacement = _Segment(fd, path)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            self._write(replacement, data)
        except OSError as error:
            os.close(fd)
            with contextlib.suppress(OSError):
                path.unlink()
            self._lose(old_name, f"{failed} ({error})")
            return False
        self._own[path.name] = self._own.pop(old_name, 0)
        with contextlib.suppress(OSError):
            os.close(segment.fd)
        segment.fd, segment.path = fd, path
        self._log_once("rewritten", "spool %s: a segment was removed while it was written (a tmp "
                       "cleaner?); wrote its %d events again", self.directory, events)
        return True

    def _lose(self, name: str, reason: str) -> None:
        """Counts the events of this attempt's segment ``name``, removed by someone else, as
        dropped; logged once."""
        lost = self._own.pop(name, 0)
        self._sent.pop(name, None)
        self.dropped_events += lost
        self.removed_events += lost
        self._log_once("lost", "spool %s: %s: %d events lost with it, counted dropped (logged once)",
                       self.directory, reason, lost)

    def _ensure_private(self) -> None:
        if self._private and (self._lock_fd is None or os.fstat(self._lock_fd).st_nlink):
            return
        try:
            private_directory(self._root)
        except OSError as error:
            if error.errno not in (errno.EACCES, errno.EPERM, errno.ENOTDIR, errno.EEXIST):
                raise
            self._move(error)
        private_directory(self.directory)
        if not self._closed and (self._lock_fd is None or not os.fstat(self._lock_fd).st_nlink):
            self._hold_lock()
        self._private = True

    def _move(self, error: OSError) -> None:
        """Spools under a new private directory: the root is not the user's to use."""
        root = Path(tempfile.mkdtemp(prefix=f"goodput-spool-{os.geteuid()}-"))
        _LOG.error("goodput spool: %s; spooling in %s instead (what earlier attempts of the run "
                   "left in the old one is not sent from here)", error, root)
        self._root = root
        self.directory = run_directory(root, self._run_id)

    def _hold_lock(self) -> None:
        """Takes (again, if its file was removed) the lock that says this attempt is alive."""
        path = self.directory / f"{self._prefix[:-1]}{_LOCK_SUFFIX}"
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise
        if self._lock_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._lock_fd)
        self._lock_fd = fd

    def _make_room(self, size: int) -> bool:
        if self._size.bytes is None:
            self._size.bytes = sum(p.stat().st_size for p in self._segment_files())
        while self._size.bytes + size > self._max_bytes:
            # The segment being sent is not dropped: its events may be delivered at this moment;
            # nor are those of a live sibling attempt, which will send them.
            oldest = [p for p in self.segments() if p != self._claimed
                      and (p.name.startswith(self._prefix) or not self._alive(p))]
            if not oldest:
                return False
            path = oldest[0]
            own = self._own.pop(path.name, None)
            if own is None:
                self.dropped_backlog_events += self._count_events(path)
            else:
                self.dropped_events += own
            self.remove(path)
        return True

    # -- draining ---------------------------------------------------------------------------

    def _segment_files(self) -> list[Path]:
        if not self.directory.is_dir():
            names: list[Path] = []
        else:
            self._ensure_private()  # never read what another user could have put there
            names = sorted(p for p in self.directory.iterdir() if p.name.endswith(_SUFFIX))
        self._count_missing({p.name for p in names})
        return names

    def _count_missing(self, present: set[str]) -> None:
        """Counts the events of this attempt's segments that disappeared unsent (the one being
        sent is read already: its events are counted where its send ends)."""
        skip = {segment.name for segment in (self._open and self._open.path, self._claimed) if segment}
        for name in [name for name in self._own if name not in present and name not in skip]:
            self._lose(name, f"segment {name} was removed before it was sent")

    def segments(self, *, own: bool | None = None) -> list[Path]:
        """Sealed segments, oldest first; ``own`` selects this attempt's (True) or those of
        other attempts that are no longer alive (False)."""
        open_path = self._open.path if self._open is not None else None
        found = [p for p in self._segment_files() if p != open_path]
        if own is None:
            return found
        if own:
            return [p for p in found if p.name.startswith(self._prefix)]
        alive: dict[str, bool] = {}  # by attempt: its lock looked at once a listing
        others = []
        for path in found:
            attempt = _attempt_of(path.name)
            if not path.name.startswith(self._prefix):
                if attempt not in alive:
                    alive[attempt] = self._alive(path)
                if not alive[attempt]:
                    others.append(path)
        return others

    def _alive(self, path: Path) -> bool:
        """Whether the attempt that wrote segment ``path`` still holds its lock."""
        lock = path.with_name(f"{_attempt_of(path.name)}{_LOCK_SUFFIX}")
        try:
            fd = os.open(lock, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        except OSError:
            return False
        finally:
            os.close(fd)
        return False

    def claim(self, path: Path | None) -> None:
        """Marks the segment being sent (``None``: none), so that making room never drops it and
        its removal by someone else meanwhile loses nothing: its events are read already."""
        self._claimed = path

    def delivered(self, path: Path, count: int) -> None:
        """Notes that the next ``count`` events of this attempt's segment ``path`` were
        delivered: they are no longer kept, nor lost if the segment is, nor sent again by this
        attempt (``already_sent``)."""
        name = path.name
        if name in self._own:
            self._own[name] = max(0, self._own[name] - count)
            self._sent[name] = self._sent.get(name, 0) + count

    def already_sent(self, path: Path) -> int:
        """How many of the first events of this attempt's segment ``path`` were delivered."""
        return self._sent.get(path.name, 0)

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
        self._own.pop(path.name, None)
        self._sent.pop(path.name, None)
        try:
            size = path.stat().st_size
            path.unlink()
        except FileNotFoundError:
            return
        if self._size.bytes is not None:
            self._size.bytes = max(0, self._size.bytes - size)

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
        """Forgets the parent's open segment and lock and writes under the child's attempt from
        now on (the parent keeps its descriptors, and with them its locks)."""
        for fd in (self._open.fd if self._open is not None else None, self._lock_fd):
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._open = None
        self._lock_fd = None
        self._own = {}
        self._sent = {}
        self._private = False
        self._busy = self._close_pending = self._closed = False
        self._claimed = None
        self._attempt_id = attempt_id
        self._prefix = f"{attempt_start_ns:020d}-{attempt_id}-"
        self.dropped_events = 0
        self.removed_events = 0
        self.dropped_backlog_events = 0

    def close(self) -> None:
        """Seals the open segment, lets this attempt's segments go to the next process of the
        run (its lock released), and removes the run directory if nothing is left in it. While a
        write is under way (a signal handler closing), that write does it as it ends."""
        if self._busy:
            self._close_pending = True
            return
        self._close_pending = False
        self._closed = True
        self._claimed = None  # a send that closing interrupted: what it did not deliver is kept, or lost
        self.seal()
        self._count_missing({name for name in self._own if (self.directory / name).exists()})
        if self._lock_fd is not None:
            fd, self._lock_fd = self._lock_fd, None
            with contextlib.suppress(OSError):
                (self.directory / f"{self._prefix[:-1]}{_LOCK_SUFFIX}").unlink()
            with contextlib.suppress(OSError):
                os.close(fd)
        self._private = False
        with contextlib.suppress(OSError):
            os.rmdir(self.directory)

    def _log_once(self, key: str, message: str, *args: object) -> None:
        if key not in self._logged:
            self._logged.add(key)
            _LOG.error(message, *args)


def _line(record: Record) -> bytes:
    seq, time_us, kind, body = record
    return (json.dumps([seq, time_us, kind, event_body(kind, body)], separators=(",", ":"),
                       ensure_ascii=False) + "\n").encode()
