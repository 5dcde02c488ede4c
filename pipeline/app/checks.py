"""What the command lines check in the files they are given, before anything is read or written.

A mistake is a ``UsageError`` whose message is one line saying what is wrong and what to do; the
commands print it after their name and exit with code 2. DuckDB files are only ever opened
read-only here, so a file that is refused is left as it was.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import logging
import os
import re
import stat
import sys
import time
import zlib
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, NoReturn, TypeVar

from pipeline.core.events import GZIP_MAGIC

#: How long a DuckDB file another process is writing is waited for (it holds the file for one
#: bundle at a time).
LOCK_WAIT_S = 5.0
#: How long a stream waits for Pub/Sub to say whether its subscription exists, before it starts.
SUBSCRIPTION_CHECK_S = 10.0

_T = TypeVar("_T")

# Formats an emitter file is sometimes mistaken for, by their first bytes: what they are, and how
# to make an emitter file of them. gzip is not here: it is read as it is.
_NOT_EVENTS = (
    (b"BZh", "bzip2-compressed", "decompress it first (bunzip2 -k)"),
    (b"\xfd7zXZ\x00", "xz-compressed", "decompress it first (unxz -k)"),
    (b"\x28\xb5\x2f\xfd", "zstd-compressed", "decompress it first (unzstd)"),
    (b"PK\x03\x04", "a zip archive", "unzip the emitter file first"),
    (b"\xff\xfe\x00\x00", "UTF-32 text", "convert it to UTF-8 first: iconv -f UTF-32 -t UTF-8"),
    (b"\x00\x00\xfe\xff", "UTF-32 text", "convert it to UTF-8 first: iconv -f UTF-32 -t UTF-8"),
    (b"\xff\xfe", "UTF-16 text", "convert it to UTF-8 first: iconv -f UTF-16 -t UTF-8"),
    (b"\xfe\xff", "UTF-16 text", "convert it to UTF-8 first: iconv -f UTF-16 -t UTF-8"),
)
_DUCKDB_MAGIC = b"DUCK"  # at byte 8 of a DuckDB file
_EVENTS_COLUMNS = frozenset({"run_id", "attempt_id", "seq", "event_time", "kind", "step", "body"})


class UsageError(Exception):
    """A mistake in a command line; the message says what is wrong and what to do, in one line."""


class OneLineParser(argparse.ArgumentParser):
    """argparse, with a mistake in one line: what is wrong, and where to look; exit code 2. A long
    option may be written with underscores or hyphens, and none abbreviated
    (``pipeline.app.spelling``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def parse_known_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                         namespace: argparse.Namespace | None = None
                         ) -> tuple[argparse.Namespace, list[str]]:
        from pipeline.app.spelling import respell

        given = sys.argv[1:] if args is None else args
        parsed, extras = super().parse_known_args(respell(given, self._option_string_actions), namespace)
        unknown = next((arg.split("=", 1)[0] for arg in extras if arg.startswith("--") and arg != "--"), None)
        if unknown is not None:  # here, where this command's options are known: a subcommand's too
            import difflib

            close = difflib.get_close_matches(unknown, [o for o in self._option_string_actions
                                                        if o.startswith("--")], n=1)
            self.error(f"unknown option {unknown}" + (f": did you mean {close[0]}?" if close else ""))
        return parsed, extras

    def error(self, message: str) -> NoReturn:
        required = "the following arguments are required: "
        missing = message[len(required):].split(", ") if message.startswith(required) else []
        if missing and all(name.startswith("-") for name in missing):  # --duckdb FILE is required
            names = [self._usage_name(name) for name in missing]
            message = f"{' and '.join(names)} {'is' if len(names) == 1 else 'are'} required"
        one_of = re.fullmatch(r"one of the arguments (.+) is required", message)
        if one_of:
            message = f"{' or '.join(self._usage_name(name) for name in one_of[1].split())} is required"
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")

    def _usage_name(self, name: str) -> str:
        """An argument as its usage shows it: an option with its metavar (``--duckdb FILE``)."""
        action = self._option_string_actions.get(name)
        if action is None or action.nargs == 0:
            return name
        return f"{name} {action.metavar or action.dest.upper()}"


def _not_a_file(mode: int) -> str | None:
    """What a path that is not a regular file is, in words."""
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO (a named pipe)"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "not a regular file"


def check_readable_file(path: str, option: str) -> os.stat_result:
    """The status of an input file that must exist and be a regular, readable file."""
    try:
        status = os.stat(path)
    except FileNotFoundError:
        raise UsageError(f"no such file: {option}={path}") from None
    except OSError as error:
        raise UsageError(f"cannot read {option}={path}: {error.strerror}") from None
    what = _not_a_file(status.st_mode)
    if what is not None:
        if what != "a directory":
            hint = "the pipeline reads a file, maybe more than once: write it to a file first"
        elif option == "--duckdb":
            hint = f"name a file, e.g. {option}={os.path.join(path, 'goodput.duckdb')}"
        else:
            hint = f"give each file in it as {option}=FILE"
        raise UsageError(f"{option}={path} is {what}, not a file: {hint}")
    if not os.access(path, os.R_OK):
        raise UsageError(f"cannot read {option}={path}: permission denied")
    return status


def check_events_file(path: str, option: str = "--events") -> None:
    """An emitter file: a regular, readable file of JSON lines, plain or gzip-compressed (which
    is read through whole here, so that a damaged one is refused before the replay starts)."""
    check_readable_file(path, option)
    try:
        with open(path, "rb") as handle:
            head = handle.read(16)
    except OSError as error:
        raise UsageError(f"cannot read {option}={path}: {error.strerror}") from None
    if head[8:12] == _DUCKDB_MAGIC:
        raise UsageError(f"{option}={path} is a DuckDB file: replay its raw events table with "
                         f"--from_duckdb={path}")
    for magic, what, hint in _NOT_EVENTS:
        if head.startswith(magic):
            raise UsageError(f"{option}={path} is {what}: {hint}")
    if head.startswith(GZIP_MAGIC):
        try:
            with gzip.open(path, "rb") as compressed:
                while compressed.read(1 << 20):
                    pass
        except EOFError:
            raise UsageError(f"{option}={path} is a gzip file cut short (a copy that did not "
                             f"finish?): nothing was read; gzip -t {path} shows it") from None
        except (OSError, zlib.error) as error:
            raise UsageError(f"{option}={path} is a damaged gzip file ({error}): nothing was read; "
                             f"gzip -t {path} shows it") from None


@contextlib.contextmanager
def read_only(path: str, option: str = "--duckdb", output: bool = False) -> Iterator[Any]:
    """A connection that reads an existing DuckDB file this pipeline wrote, as every reader opens
    one (``pipeline.sinks.duckdb.open_reader``: nothing outside the file, the pipeline's own
    views), waiting a little while another process writes it; a path that is not such a file is a
    ``UsageError``; ``output`` when the file is to be written."""
    import duckdb

    from pipeline.sinks.duckdb import NotOurs, open_reader

    status = check_readable_file(path, option)
    if status.st_size == 0:
        raise UsageError(f"{option}={path} is an empty file, not a DuckDB file: remove it, or name "
                         "another file")
    try:
        connection = while_locked(path, option, lambda: open_reader(path))
    except NotOurs as error:
        hint = ("it was left untouched: name a new file or one this pipeline wrote" if output
                else "name a file this pipeline wrote with --duckdb")
        raise UsageError(f"{option}={path} is not a DuckDB file this pipeline wrote "
                         f"({error.problem}); {hint}") from None
    except duckdb.IOException as error:
        if "not a valid DuckDB database file" in str(error):
            raise UsageError(f"{option}={path} is not a DuckDB file: name a DuckDB file this "
                             "pipeline wrote") from None
        raise UsageError(f"cannot open {option}={path}: {error}") from None
    except duckdb.Error as error:
        raise UsageError(f"cannot open {option}={path}: {error}") from None
    try:
        yield connection
    finally:
        connection.close()


def while_locked(path: str, option: str, attempt: Callable[[], _T]) -> _T:
    """``attempt()`` (which opens the DuckDB file ``path``), tried again for up to
    ``LOCK_WAIT_S`` while another process holds the file (a stream writing it, a bundle at a
    time); then a ``UsageError``. A command that opens a file twice (``goodput report``: its
    check, then the report's read) opens it through here both times, for a writer may take the
    file in between."""
    import duckdb

    deadline = time.monotonic() + LOCK_WAIT_S
    while True:
        try:
            return attempt()
        except duckdb.IOException as error:
            if "lock" not in str(error):
                raise
            if time.monotonic() >= deadline:
                raise UsageError(f"{option}={path} is held by another process for longer than "
                                 f"{LOCK_WAIT_S:g} s: try again once it is done") from None
            time.sleep(0.1)


def check_credentials(needed_by: str, instead: str) -> None:
    """``UsageError`` unless Google's application default credentials are found, as the client
    libraries look for them (``$GOOGLE_APPLICATION_CREDENTIALS``, gcloud's, the metadata server):
    a command whose ``needed_by`` (a service it reaches, in words) has none would otherwise fail
    in a client's traceback, perhaps after writing other outputs. ``instead`` says how to do
    without them (a local stand-in's option)."""
    import google.auth
    from google.auth import exceptions

    # google.auth logs each place it looked in vain; the one line below says it all.
    quiet = logging.getLogger("google.auth")
    level = quiet.level
    quiet.setLevel(logging.CRITICAL)
    try:
        google.auth.default()
    except exceptions.DefaultCredentialsError as error:
        named = os.environ.get("GOOGLE_APPLICATION_CREDENTIALS")
        why = (f"$GOOGLE_APPLICATION_CREDENTIALS={named} does not hold them "
               f"({str(error).split('. ')[0].rstrip('.')})" if named else "none were found")
        raise UsageError(f"{needed_by} needs Google credentials and {why}: run gcloud auth "
                         f"application-default login, or {instead}") from None
    finally:
        quiet.setLevel(level)


def check_subscription(subscription: str) -> None:
    """``UsageError`` if Beam's Pub/Sub read refuses the subscription's name, or if Pub/Sub (the
    emulator at ``$PUBSUB_EMULATOR_HOST``, if set) says that the subscription a stream is to read
    does not exist: the stream would fail in a traceback, or wait for it for ever.
    A service that does not answer, or does not let the subscription be looked at, is left to
    the stream, which retries until it answers."""
    from apache_beam.io.gcp.pubsub import parse_subscription
    from google.api_core import exceptions
    from google.cloud.pubsub_v1 import SubscriberClient

    try:
        parse_subscription(subscription)  # type: ignore[no-untyped-call]
    except ValueError as error:
        raise UsageError(f"--subscription={subscription}: {str(error).rstrip('.')}, which Beam's Pub/Sub "
                         "read refuses (a project id is 6 or more lower-case letters, digits and "
                         "hyphens, e.g. projects/goodput-local/subscriptions/goodput)") from None
    emulator = os.environ.get("PUBSUB_EMULATOR_HOST")
    if not emulator:
        check_credentials(f"--subscription={subscription}",
                          "set PUBSUB_EMULATOR_HOST=HOST:PORT for a local emulator")
    client = SubscriberClient()
    try:
        client.get_subscription(subscription=subscription, timeout=SUBSCRIPTION_CHECK_S, retry=None)
    except exceptions.NotFound:
        where = f"on the Pub/Sub emulator at {emulator}" if emulator else "in Pub/Sub"
        create = (f"goodput emulator pubsub --topic projects/P/topics/T --subscription {subscription} "
                  "starts an emulator that has it" if emulator
                  else "terraform apply creates it, or gcloud pubsub subscriptions create")
        raise UsageError(f"--subscription={subscription} does not exist {where}: {create}") from None
    except exceptions.GoogleAPIError:
        pass  # unreachable, or not allowed to look: the stream says so while it retries
    finally:
        client.close()


def check_duckdb_output(path: str, option: str = "--duckdb") -> None:
    """The DuckDB file a pipeline is to write: a new file in a directory that can be written, or
    an existing file this pipeline wrote (an older version's too: the sink adds the columns it
    lacks), which is checked read-only before anything is written to it."""
    if not os.path.lexists(path):
        ancestor = Path(path).absolute().parent
        while not ancestor.exists():
            ancestor = ancestor.parent
        if not ancestor.is_dir():
            raise UsageError(f"cannot create {option}={path}: {ancestor} is not a directory")
        if not os.access(ancestor, os.W_OK | os.X_OK):
            raise UsageError(f"cannot create {option}={path}: no permission to write in {ancestor}")
        return
    with read_only(path, option, output=True):
        pass
    if not os.access(path, os.W_OK):
        raise UsageError(f"cannot write {option}={path}: permission denied")


def check_duckdb_input(path: str, option: str = "--from_duckdb") -> None:
    """A DuckDB file a backfill reads: one this pipeline wrote, with its raw events table."""
    with read_only(path, option) as connection:
        columns = {column for column, in connection.execute(
            "SELECT column_name FROM duckdb_columns() WHERE database_name = current_database() "
            "AND schema_name = 'main' AND table_name = 'events'").fetchall()}
    if not columns:
        raise UsageError(f"{option}={path} has no raw events table: nothing to replay")
    if not columns >= _EVENTS_COLUMNS:
        raise UsageError(f"{option}={path}: its events table lacks the columns "
                         f"{', '.join(sorted(_EVENTS_COLUMNS - columns))}, without which the events "
                         "cannot be replayed")


def check_output_file(path: str, option: str, inputs: tuple[str, ...], starts: bytes) -> None:
    """A file a command is to write whole: new, or one it wrote before (it begins with ``starts``,
    or is empty), and none of its inputs."""
    if not os.path.lexists(path):
        return
    if any(os.path.realpath(path) == os.path.realpath(given) for given in inputs):
        raise UsageError(f"{option}={path} is also an input: name another file")
    check_readable_file(path, option)
    with open(path, "rb") as existing:
        head = existing.read(len(starts))
    if head and head != starts:
        raise UsageError(f"{option}={path} exists and is not a file this command wrote: it was left "
                         "untouched; name another file")


#: How to reach each of Google's services without credentials: a local stand-in.
BIGQUERY_INSTEAD = "give --bigquery_endpoint=URL of a local stand-in (goodput emulator bigquery)"
MONITORING_INSTEAD = "give --monitoring_endpoint=HOST:PORT of a local stand-in (goodput emulator monitoring)"


def check_services(options: Any) -> None:
    """What a run of the pipeline on a local runner (``options``, its ``PipelineOptions``) needs
    of Google Cloud, looked at before anything is read or written: credentials for each sink
    that has no local endpoint, and the stream's subscription. A job for Dataflow is left to
    Dataflow, whose workers have credentials of their own."""
    from apache_beam.options.pipeline_options import StandardOptions

    standard = options.view_as(StandardOptions)
    if "dataflow" in (standard.runner or "").lower():
        return
    if options.bigquery_dataset and not options.bigquery_endpoint:
        check_credentials(f"--bigquery_dataset={options.bigquery_dataset}", BIGQUERY_INSTEAD)
    if options.monitoring_project and not options.monitoring_endpoint:
        check_credentials(f"--monitoring_project={options.monitoring_project}", MONITORING_INSTEAD)
    if standard.streaming and options.subscription:
        check_subscription(options.subscription)
