"""The reference library (ml-goodput-measurement 0.2.3), driven from this project's tests and
benchmarks in a process of its own.

This project's package ``ml_goodput_measurement`` has taken the reference's import path, so the
reference lives in a venv of its own, ``.venv-reference`` (``make .venv-reference``; the pins are
``requirements.txt`` here). ``ReferenceRunner`` starts ``worker.py`` there once and sends it
requests, one JSON line each way (the protocol is ``worker.py``'s docstring): build an in-memory
Cloud Logging, record calls into it through the reference's recorders, compute with its
calculators, read its functions, signatures and enums. ``$GOODPUT_REFERENCE_PYTHON`` names
another interpreter that has the reference installed.

    with ReferenceRunner() as reference:
        log = reference.log()
        reference.record(log, [[("record_job_start_time", (start,)), ...]])
        calculator = reference.calculator(log, cache_dir)
        goodput_pct, breakdown, max_step = reference.call(calculator, "get_job_goodput", True)

An error the reference raises comes back as ``ReferenceCallError``; one of Python's own types
(``ValueError``) is also an instance of that type, so ``pytest.raises(ValueError)`` still holds.
"""

from __future__ import annotations

import builtins
import functools
import json
import os
import select
import subprocess
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from tools.reference_runner.worker import decode, encode

REPO = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).resolve().with_name("worker.py")
#: Names an interpreter with the reference installed, instead of ``.venv-reference/bin/python``.
PYTHON_ENV = "GOODPUT_REFERENCE_PYTHON"
#: The make target that builds ``.venv-reference``.
MAKE_TARGET = ".venv-reference"
#: One recorder call: (method, arguments).
Call = tuple[str, Sequence[Any]]


def reference_python() -> Path:
    """The interpreter that runs the reference: ``$GOODPUT_REFERENCE_PYTHON``, else
    ``.venv-reference/bin/python`` in this checkout (which may not exist yet)."""
    configured = os.environ.get(PYTHON_ENV)
    return Path(configured) if configured else REPO / ".venv-reference" / "bin" / "python"


def missing_reason(python: Path | None = None) -> str | None:
    """Why the reference cannot run with ``python`` (default: ``reference_python()``), or None."""
    python = python or reference_python()
    if python.is_file():
        return None
    return (f"the reference library runs in {python}, which does not exist: run `make {MAKE_TARGET}` "
            f"(make check, make test and make bench build it) or set ${PYTHON_ENV}")


def reference_version() -> str:
    """The installed reference's version, asked of its interpreter."""
    done = subprocess.run([str(reference_python()), "-I", str(WORKER), "--version"], capture_output=True,
                          text=True, timeout=60, check=True)
    return done.stdout.strip()


class ReferenceCallError(Exception):
    """The reference raised: ``error`` is its exception's type name, ``remote_traceback`` its
    traceback in the worker."""

    def __init__(self, error: str, message: str, remote_traceback: str = "") -> None:
        super().__init__(message)
        self.error = error
        self.message = message
        self.remote_traceback = remote_traceback

    def __str__(self) -> str:
        return f"{self.error}: {self.message}"


@functools.cache
def _error_type(name: str) -> type[ReferenceCallError]:
    """``ReferenceCallError``, made also a subclass of the builtin exception called ``name``."""
    builtin = getattr(builtins, name, None)
    if not (isinstance(builtin, type) and issubclass(builtin, Exception)):
        return ReferenceCallError
    try:
        return type(f"Reference{name}", (ReferenceCallError, builtin), {})
    except TypeError:  # a builtin whose layout does not mix (none the reference raises today)
        return ReferenceCallError


class ReferenceRunner:
    """One worker process of the reference, started on first use, answering in order.

    Not thread-safe: one request at a time. ``close()`` (or leaving ``with``) ends the worker;
    so does this process's exit, since the worker stops when its stdin closes.
    """

    def __init__(self, python: Path | None = None, timeout_s: float = 600.0) -> None:
        self.python = python or reference_python()
        self.timeout_s = timeout_s
        self._process: subprocess.Popen[bytes] | None = None
        self._stderr: IO[bytes] | None = None

    def __enter__(self) -> ReferenceRunner:
        self.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.close()

    @property
    def pid(self) -> int:
        """The worker's process id (it starts the worker)."""
        return self.start().pid

    def start(self) -> subprocess.Popen[bytes]:
        if self._process is not None:
            return self._process
        reason = missing_reason(self.python)
        if reason:
            raise FileNotFoundError(reason)
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 - the worker's, until close()
        # -I: no PYTHONPATH and no script folder on sys.path, so nothing shadows the reference.
        self._process = subprocess.Popen([str(self.python), "-I", str(WORKER)], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=self._stderr, cwd=WORKER.parent)
        return self._process

    def close(self, timeout_s: float = 30.0) -> None:
        """Ends the worker: its stdin closes, it exits; killed if it has not within ``timeout_s``."""
        process, self._process = self._process, None
        if process is not None:
            assert process.stdin is not None and process.stdout is not None
            process.stdin.close()
            try:
                process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=timeout_s)
            process.stdout.close()
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None

    def timed(self, op: str, **fields: Any) -> tuple[Any, float]:
        """The result of one operation and its seconds, timed in the worker."""
        process = self.start()
        assert process.stdin is not None and process.stdout is not None
        try:
            process.stdin.write(json.dumps({"op": op, **encode(fields)}).encode() + b"\n")
            process.stdin.flush()
        except BrokenPipeError:
            raise self._died() from None
        ready, _, _ = select.select([process.stdout], [], [], self.timeout_s)
        if not ready:
            self.close(timeout_s=1.0)
            raise TimeoutError(f"the reference worker did not answer {op} within {self.timeout_s:g} s")
        line = process.stdout.readline()
        if not line:
            raise self._died()
        answer = json.loads(line)
        if not answer["ok"]:
            raise _error_type(answer["error"])(answer["error"], answer["message"], answer["traceback"])
        return decode(answer["result"]), float(answer["seconds"])

    def request(self, op: str, **fields: Any) -> Any:
        """The result of one operation."""
        return self.timed(op, **fields)[0]

    def _died(self) -> RuntimeError:
        process, stderr = self._process, self._stderr
        code = process.poll() if process is not None else None
        tail = b""
        if stderr is not None:
            stderr.seek(0)
            tail = stderr.read()[-4000:]
        self.close(timeout_s=1.0)
        return RuntimeError(f"the reference worker exited ({code}): {tail.decode(errors='replace')}")

    # -- the operations, by name ----------------------------------------------------------------

    def log(self, entries: Iterable[dict[str, Any]] = (), job_name: str = "run") -> str:
        """A new in-memory Cloud Logging in the worker, holding ``entries``; its handle."""
        handle: str = self.request("log", entries=list(entries), job_name=job_name)
        return handle

    def record(self, log: str, attempts: Iterable[Iterable[Call]], *,
               recorder: str = "goodput_elastic.ElasticGoodputRecorder", job_name: str = "run",
               logger_name: str = "log") -> int:
        """Each attempt's calls through a reference recorder of its own (class ``recorder``) into
        ``log``; a ``write_cloud_logging_entry`` call writes its entry to the log itself. Returns
        the entries the log holds."""
        count: int = self.request("record", log=log, recorder=recorder, job_name=job_name,
                                  logger_name=logger_name,
                                  attempts=[[[method, list(args)] for method, args in calls]
                                            for calls in attempts])
        return count

    def entries(self, log: str, first: int = 0) -> list[dict[str, Any]]:
        """The payloads in ``log`` from ``first`` on, in the order written."""
        entries: list[dict[str, Any]] = self.request("entries", log=log, first=first)
        return entries

    def append(self, log: str, entries: Iterable[dict[str, Any]]) -> int:
        """Writes raw ``entries`` to ``log``; returns the entries it holds."""
        count: int = self.request("append", log=log, entries=list(entries))
        return count

    def calculator(self, log: str, cache_dir: str | Path, *, elastic: bool = False, job_name: str = "run",
                   logger_name: str = "log") -> str:
        """A new reference ``GoodputCalculator`` (``ElasticGoodputCalculator``) reading ``log``."""
        name = "goodput_elastic.ElasticGoodputCalculator" if elastic else "goodput.GoodputCalculator"
        handle: str = self.request("calculator", log=log, cache_dir=str(cache_dir), calculator=name,
                                   job_name=job_name, logger_name=logger_name)
        return handle

    def call(self, target: str, method: str, *args: Any, **kwargs: Any) -> Any:
        """``method(*args, **kwargs)`` of the worker's object ``target``; enum keys come back as names."""
        return self.request("call", target=target, method=method, args=list(args), kwargs=kwargs)

    def call_timed(self, target: str, method: str, *args: Any, **kwargs: Any) -> tuple[Any, float]:
        """As ``call``, with the seconds of the reference's call alone."""
        return self.timed("call", target=target, method=method, args=list(args), kwargs=kwargs)

    def function(self, name: str, *args: Any) -> Any:
        """A function of the reference's modules, e.g. ``goodput_utils.compute_ideal_step_time``."""
        return self.request("function", name=name, args=list(args))

    def parameters(self, name: str) -> list[dict[str, Any]]:
        """The parameters of ``name`` (e.g. ``goodput.GoodputCalculator.__init__``): ``name``,
        ``kind``, and where there is one ``default_repr`` (and ``default``, if a plain value)."""
        parameters: list[dict[str, Any]] = self.request("signature", name=name)
        return parameters

    def members(self, name: str) -> list[tuple[str, Any]]:
        """An enum's members (e.g. ``goodput_utils.BadputType``): (name, value) in order."""
        return [(member, value) for member, value in self.request("members", name=name)]

    def release(self, *handles: str) -> None:
        """Drops the worker's objects ``handles`` (a large log, say)."""
        self.request("release", handles=list(handles))
