"""The reference library's side of ``tools.reference_runner``: a worker that drives
ml-goodput-measurement 0.2.3 inside ``.venv-reference``, one JSON line in, one JSON line out.

This file imports the standard library and the reference, nothing else: ``.venv-reference`` holds
nothing of this project (but the file of the benchmarks' shared training loop, which the
operation ``training_loop`` loads), and in this project's environment ``ml_goodput_measurement``
is this project's own package. The client starts it as ``.venv-reference/bin/python -I worker.py``
(isolated: no ``PYTHONPATH``, no script folder on ``sys.path``), so the reference cannot be
shadowed; it checks that it imported the installed distribution anyway.

A request is ``{"op": NAME, ...fields}``, NAME one of ``OPS`` (a ``Worker`` method, the fields its
arguments). The answer is ``{"ok": true, "result": VALUE, "seconds": S}``, S the operation timed
here (for ``call``, the reference's call alone), or ``{"ok": false, "error": TYPE, "message":
..., "traceback": ...}`` when the reference raised. Values are JSON with tags (``encode`` and
``decode``, which the client imports from here): ``{"$datetime": ISO}``, ``{"$tuple": [...]}``,
and ``{"$dict": [[key, value], ...]}`` for a dict whose keys are not strings; enum members travel
as their names. The worker keeps the objects it builds (logs, recorders, calculators) under
handles (``"log-1"``) that later requests name.
"""

from __future__ import annotations

import datetime
import enum
import gc
import importlib
import importlib.util
import inspect
import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from types import ModuleType
from typing import Any, TextIO

DISTRIBUTION = "ml-goodput-measurement"
#: The reference's modules, by the names requests use (``goodput.GoodputCalculator``).
MODULES = ("goodput", "goodput_elastic", "goodput_utils", "monitoring", "monitoring_elastic")


# -- values on the wire -------------------------------------------------------------------------


def encode(value: Any) -> Any:
    """``value`` as tagged JSON: what both sides send."""
    if value is None or isinstance(value, bool | str):
        return value
    if isinstance(value, enum.Enum):
        return value.name
    if isinstance(value, int | float):
        return value
    if isinstance(value, datetime.datetime):
        return {"$datetime": value.isoformat()}
    if isinstance(value, tuple):
        return {"$tuple": [encode(item) for item in value]}
    if isinstance(value, list):
        return [encode(item) for item in value]
    if isinstance(value, dict):
        keys = [encode(key) for key in value]
        if all(isinstance(key, str) for key in keys):
            return {key: encode(item) for key, item in zip(keys, value.values(), strict=True)}
        return {"$dict": [[key, encode(item)] for key, item in zip(keys, value.values(), strict=True)]}
    if hasattr(value, "item") and hasattr(value, "dtype"):  # a numpy scalar
        return encode(value.item())
    raise TypeError(f"cannot send a {type(value).__name__} as JSON: {value!r}")


def decode(value: Any) -> Any:
    """The value that ``encode`` sent."""
    if isinstance(value, list):
        return [decode(item) for item in value]
    if not isinstance(value, dict):
        return value
    if "$datetime" in value:
        moment = datetime.datetime.fromisoformat(value["$datetime"])
        if moment.utcoffset() == datetime.timedelta(0):  # UTC as the reference checks it: timezone.utc
            moment = moment.replace(tzinfo=datetime.timezone.utc)
        return moment
    if "$tuple" in value:
        return tuple(decode(item) for item in value["$tuple"])
    if "$dict" in value:
        return {decode(key): decode(item) for key, item in value["$dict"]}
    return {key: decode(item) for key, item in value.items()}


# -- the stand-ins the reference writes to and reads from ------------------------------------------


class InMemoryCloudLogging:
    """The reference's Cloud Logging writer and reader over a list, for offline runs of its code
    (its ``cloud_logger`` argument). ``read_cloud_logging_entries`` returns the entries after the
    cursor, as the real reader does with its ``last_entry_info`` cursor."""

    def __init__(self, job_name: str = "run") -> None:
        self.job_name = job_name
        self.entries: list[dict[str, Any]] = []
        self.job_start_time = None

    def write_cloud_logging_entry(self, entry: dict[str, Any]) -> None:
        self.entries.append(entry)

    def flush(self) -> None:
        """Writes are synchronous."""

    def read_cloud_logging_entries(self, start_time: Any = None, end_time: Any = None,
                                   last_entry_info: Any = None) -> tuple[list[Any], tuple[Any, Any]]:
        done = int(last_entry_info[1]) + 1 if last_entry_info and last_entry_info[1] else 0
        new = self.entries[done:]
        if not new:
            return [], (None, None)
        stamp = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(days=1)
        return list(new), (stamp, str(len(self.entries) - 1))


class CountingLoggingAPI:
    """Stands in for the Cloud Logging client's HTTP API: the batch commit counts its entries."""

    def __init__(self) -> None:
        self.entries = 0

    def write_entries(self, entries: list[Any], **_: Any) -> None:
        self.entries += len(entries)

    def count(self) -> int:
        return self.entries


# -- the worker ---------------------------------------------------------------------------------


class Worker:
    """The reference's modules, the objects built so far, and one method per operation."""

    def __init__(self) -> None:
        self.modules = {name: importlib.import_module(f"ml_goodput_measurement.src.{name}")
                        for name in MODULES}
        self.objects: dict[str, Any] = {}
        self.made = 0

    def keep(self, kind: str, value: Any) -> str:
        self.made += 1
        handle = f"{kind}-{self.made}"
        self.objects[handle] = value
        return handle

    def resolve(self, dotted: str) -> Any:
        """A module-level name of the reference, e.g. ``goodput.GoodputCalculator.__init__``."""
        module, *attributes = dotted.split(".")
        value: Any = self.modules[module]
        for attribute in attributes:
            value = getattr(value, attribute)
        return value

    # Each operation takes the request's fields and returns the result to send.

    def hello(self) -> dict[str, Any]:
        return {"version": metadata.version(DISTRIBUTION), "python": sys.version.split()[0],
                "package": str(Path(self.modules["goodput"].__file__ or "").parent.parent)}

    def log(self, entries: list[dict[str, Any]] | None = None, job_name: str = "run") -> str:
        """A new in-memory Cloud Logging holding ``entries``."""
        stand_in = InMemoryCloudLogging(job_name)
        stand_in.entries = list(entries or [])
        return self.keep("log", stand_in)

    def record(self, log: str, attempts: list[list[list[Any]]],
               recorder: str = "goodput_elastic.ElasticGoodputRecorder", job_name: str = "run",
               logger_name: str = "log") -> int:
        """Each attempt's calls ``[method, args]`` through a recorder of its own into ``log``;
        ``write_cloud_logging_entry`` calls write their entry to the log itself (as Orbax does).
        Returns the entries the log holds."""
        stand_in = self.objects[log]
        recorder_class = self.resolve(recorder)
        for calls in attempts:
            made = recorder_class(job_name, logger_name, True, cloud_logger=stand_in)
            for method, args in calls:
                target = stand_in if method == "write_cloud_logging_entry" else made
                getattr(target, method)(*args)
        return len(stand_in.entries)

    def entries(self, log: str, first: int = 0) -> list[dict[str, Any]]:
        entries: list[dict[str, Any]] = self.objects[log].entries[first:]
        return entries

    def append(self, log: str, entries: list[dict[str, Any]]) -> int:
        stand_in = self.objects[log]
        stand_in.entries += entries
        return len(stand_in.entries)

    def calculator(self, log: str, cache_dir: str, calculator: str = "goodput.GoodputCalculator",
                   job_name: str = "run", logger_name: str = "log") -> str:
        """A calculator reading ``log``, its cache in ``cache_dir``."""
        made = self.resolve(calculator)(job_name, logger_name, cloud_logger=self.objects[log],
                                        cache_dir=cache_dir)
        return self.keep("calculator", made)

    def logging_client_recorder(self, job_name: str, logger_name: str) -> dict[str, str]:
        """A recorder on its real write path (``CloudLoggingHandler``, ``BackgroundThreadTransport``)
        to an offline Cloud Logging client whose API counts the entries it is sent."""
        from unittest import mock

        google_logging = importlib.import_module("google.cloud.logging")
        credentials = importlib.import_module("google.auth.credentials")
        client = google_logging.Client(project="bench", credentials=credentials.AnonymousCredentials(),
                                       _use_grpc=False)
        api = CountingLoggingAPI()
        client._logging_api = api  # what ``client.logging_api`` returns to the batch commit
        # Only to hand the offline client to ``_CloudLogger``, which builds its own with no arguments.
        with mock.patch("google.cloud.logging.Client", return_value=client):
            recorder = self.modules["goodput"].GoodputRecorder(job_name, logger_name, True)
        return {"recorder": self.keep("recorder", recorder), "api": self.keep("api", api)}

    def training_loop(self, module: str, recorder: str, api: str, config: dict[str, Any]) -> Any:
        """The training loop of the ``training_loop`` benchmark, timed with a kept recorder from
        ``logging_client_recorder`` whose entries the kept ``api`` counts: ``measure_reference``
        of the file ``module`` (``benchmarks/jax_loop.py``, which imports the standard library,
        numpy and JAX only, so that both benchmark processes run the same loop)."""
        spec = importlib.util.spec_from_file_location("jax_loop", module)
        if spec is None or spec.loader is None:
            raise ValueError(f"cannot load {module}")
        loop = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = loop  # dataclasses look their module up there
        spec.loader.exec_module(loop)
        return loop.measure_reference(self.objects[recorder], self.objects[api].count, config)

    def call(self, target: str, method: str, args: list[Any] | None = None,
             kwargs: dict[str, Any] | None = None) -> Any:
        """``method`` of a kept object: the one operation whose ``seconds`` is the call alone."""
        return getattr(self.objects[target], method)(*(args or []), **(kwargs or {}))

    def time_calls(self, target: str, method: str, first: int, count: int, args: list[Any],
                   each: bool = False) -> float | list[float]:
        """``method(step, *args)`` for ``count`` steps from ``first``: the seconds of the whole
        loop, or (``each``) of every call, timed with ``perf_counter_ns``."""
        bound = getattr(self.objects[target], method)
        if not each:
            started = time.perf_counter()
            for step in range(first, first + count):
                bound(step, *args)
            return time.perf_counter() - started
        clock, singles = time.perf_counter_ns, []
        for step in range(first, first + count):
            started_ns = clock()
            bound(step, *args)
            singles.append((clock() - started_ns) / 1e9)
        return singles

    def step_info(self, calculator: str) -> dict[str, Any] | None:
        """The step statistics the calculator's cache holds (its ``StepInfo``)."""
        info = self.objects[calculator]._goodput_cache.get_step_info()
        if info is None:
            return None
        return {"ideal_step_time": info.ideal_step_time, "step_deviations": info.step_deviations}

    def function(self, name: str, args: list[Any] | None = None,
                 kwargs: dict[str, Any] | None = None) -> Any:
        """A module-level function of the reference, e.g. ``goodput_utils.compute_ideal_step_time``."""
        return self.resolve(name)(*(args or []), **(kwargs or {}))

    def signature(self, name: str) -> list[dict[str, Any]]:
        """The parameters of ``name`` in order: name, kind, and the default's repr (and the default
        itself when it is a plain JSON value)."""
        parameters = []
        for parameter in inspect.signature(self.resolve(name)).parameters.values():
            described: dict[str, Any] = {"name": parameter.name, "kind": parameter.kind.name}
            if parameter.default is not inspect.Parameter.empty:
                described["default_repr"] = repr(parameter.default)
                if parameter.default is None or isinstance(parameter.default, bool | int | float | str):
                    described["default"] = parameter.default
            parameters.append(described)
        return parameters

    def members(self, name: str) -> list[list[Any]]:
        """An enum's members: ``[name, value]`` in order."""
        return [[member.name, member.value] for member in self.resolve(name)]

    def full_collections(self, collect_first: bool = False) -> int:
        """The count of full (generation 2) garbage collections so far, after one more if asked."""
        if collect_first:
            gc.collect()
        collections: int = gc.get_stats()[2]["collections"]
        return collections

    def release(self, handles: list[str]) -> None:
        for handle in handles:
            self.objects.pop(handle, None)


#: The operations a request may name.
OPS: dict[str, Callable[..., Any]] = {name: getattr(Worker, name) for name in (
    "hello", "log", "record", "entries", "append", "calculator", "logging_client_recorder",
    "training_loop", "call", "time_calls", "step_info", "function", "signature", "members",
    "full_collections", "release")}


def serve(worker: Worker, requests: TextIO, answers: TextIO) -> None:
    """Answers each request line until stdin closes."""
    for line in requests:
        try:
            fields = decode(json.loads(line))
            name = fields.pop("op")
            if name not in OPS:
                raise ValueError(f"unknown operation {name!r}: one of {', '.join(OPS)}")
            operation = OPS[name]
            started = time.perf_counter()
            result = operation(worker, **fields)
            seconds = time.perf_counter() - started
            answer = {"ok": True, "result": encode(result), "seconds": seconds}
        except Exception as error:  # noqa: BLE001 - every error goes back to the caller, who asserts on it
            answer = {"ok": False, "error": type(error).__name__, "message": str(error),
                      "traceback": traceback.format_exc()}
        answers.write(json.dumps(answer) + "\n")
        answers.flush()


def _installed_reference() -> ModuleType:
    """The reference's package, which must be the installed distribution's."""
    package = importlib.import_module("ml_goodput_measurement")
    installed = Path(str(metadata.distribution(DISTRIBUTION).locate_file("ml_goodput_measurement")))
    found = Path(package.__file__ or "").resolve().parent
    if found != installed.resolve():
        raise RuntimeError(f"ml_goodput_measurement comes from {found}, not from {DISTRIBUTION}'s "
                           f"{installed}: run this worker with .venv-reference's python, with -I")
    return package


def main() -> int:
    if "--version" in sys.argv[1:]:
        print(metadata.version(DISTRIBUTION))
        return 0
    # The protocol owns the real stdout; anything the reference prints goes to stderr.
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "w", encoding="utf-8")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    sys.stdout = sys.stderr
    _installed_reference()
    serve(Worker(), sys.stdin, answers)
    return 0


if __name__ == "__main__":
    sys.exit(main())
