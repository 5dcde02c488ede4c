"""The ``goodput`` command: the demo, batch replays, reports and fleet queries on a local DuckDB
file, imports of the reference's history, and the local emulators.

    goodput demo                                      a live local fleet, end to end, and its report
    goodput replay --events=events.jsonl --duckdb=goodput.duckdb   batch (python -m pipeline)
    goodput replay --from_duckdb=goodput.duckdb --duckdb=new.duckdb  a backfill from the raw events
    goodput report --duckdb goodput.duckdb --output report.html    a self-contained HTML report
    goodput report --duckdb goodput.duckdb --run RUN --output run.html   one run's page
    goodput import exported.json --output events.jsonl             the reference's Cloud Logging history
    goodput import gke-metrics --project P --duckdb goodput.duckdb  GKE's JobSet metrics, the last 2 hours
    goodput import capacity --csv capacity.csv --duckdb goodput.duckdb  the accelerator capacity paid for
    goodput productivity --project P --duckdb goodput.duckdb   ML Productivity Goodput to Cloud Monitoring
    goodput query --list                              the saved fleet queries
    goodput query NAME --duckdb goodput.duckdb        run one, print a table (--limit, --format)
    goodput query NAME --duckdb F --param interval_hours=6   ... with a parameter other than its default
    goodput sql "SELECT ..." --duckdb goodput.duckdb  a query of your own, read-only
    goodput query NAME --sql --dataset PROJECT.DATASET  print its BigQuery SQL, ready to run there
    goodput emulator pubsub --port 8085               a local Pub/Sub emulator
    goodput emulator pubsub --topic projects/P/topics/T --subscription projects/P/subscriptions/S
                                                      ... holding a topic and a subscription of it
    goodput emulator bigquery --port 9050             a local BigQuery API stand-in
    goodput emulator monitoring --port 8086           a local Cloud Monitoring stand-in

The streaming pipeline runs with ``python -m pipeline --streaming`` (see ``--help`` there).
"""

from __future__ import annotations

import argparse
import csv
import datetime
import json
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from goodput_schemas import saved_queries
from pipeline.app.checks import OneLineParser, UsageError, read_only, while_locked
from pipeline.emulators import add_topic_options, check_topic_options

#: What every report this command writes has near its start: a file without it is not one to overwrite.
_REPORT_MARK = b"<title>Fleet goodput report"


def _first_line(sql: str) -> str:
    """A saved query's first comment line: what it answers."""
    return next((line.lstrip("- ") for line in sql.splitlines() if line.startswith("--")), "")


def format_table(columns: Sequence[str], rows: Sequence[Sequence[Any]], out: TextIO,
                 total: int | None = None) -> None:
    """Rows under their column names, numbers right-aligned, NULL as ``-``; ``total``, where more
    rows than these were found, is said in the last line, with how to see them all."""
    cells = [[_text(value) for value in row] for row in rows]
    widths = [max([len(name), *(len(row[i]) for row in cells)]) for i, name in enumerate(columns)]
    numeric = [all(isinstance(row[i], (int, float)) or row[i] is None for row in rows) and bool(rows)
               for i in range(len(columns))]

    def line(values: Sequence[str]) -> str:
        return "  ".join(v.rjust(w) if n else v.ljust(w)
                         for v, w, n in zip(values, widths, numeric, strict=True)).rstrip()

    out.write(line(columns) + "\n")
    out.write(line(["-" * w for w in widths]) + "\n")
    for row in cells:
        out.write(line(row) + "\n")
    if total is not None and total > len(rows):
        out.write(f"({len(rows)} of {total} rows shown; {total - len(rows)} left out: --limit 0 "
                  "shows all, --format csv writes all)\n")
    else:
        out.write(f"({len(rows)} rows)\n")


def _text(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, datetime.datetime):
        return value.isoformat(sep=" ")
    return printable(str(value))


def printable(text: str) -> str:
    """Text from a table as a terminal shows it, character for character: each character that is
    not printable (a control character, such as the start of an escape sequence or a line break,
    a bidi override, a zero-width one) as its Python escape, so that it cannot move the cursor,
    recolor, retitle or reorder what is printed."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


#: What a spreadsheet takes a text cell beginning with for a formula (OWASP, CSV injection).
_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def _spreadsheet_cell(value: Any) -> Any:
    """A CSV cell that a spreadsheet opens as the value it is: text beginning as a formula does is
    prefixed with a single quote (OWASP's advice), which shows it as text; numbers stay numbers."""
    return "'" + value if isinstance(value, str) and value.startswith(_FORMULA_STARTS) else value


#: How many rows ``--format table`` prints unless ``--limit`` says otherwise: a terminal's worth.
TABLE_LIMIT = 50


def _parameter(text: str) -> tuple[str, str]:
    """``--param NAME=VALUE`` as (name, value)."""
    name, equals, value = text.partition("=")
    if not equals or not name.strip():
        raise argparse.ArgumentTypeError(f"invalid parameter {text!r}: NAME=VALUE, e.g. interval_hours=6")
    return name.strip().replace("-", "_"), value  # either spelling, as an option's


def _limit(text: str) -> int:
    """``--limit N``: a whole number, 0 or more (0: every row)."""
    try:
        limit = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid --limit {text!r}: a number of rows (0: all)") from None
    if limit < 0:
        raise argparse.ArgumentTypeError(f"invalid --limit {text!r}: a number of rows (0: all)")
    return limit


def _query(args: argparse.Namespace, out: TextIO) -> int:
    from goodput_schemas import SQL_DIRECTORY, saved_query
    from goodput_schemas.parameters import parameters

    queries = saved_queries(args.dataset or "")  # their text is printed only with --dataset
    if args.list or not args.name:
        for name, sql in queries.items():
            out.write(f"{name:24} {_first_line(sql)}\n")
            raw = (SQL_DIRECTORY / f"{name}.sql").read_text()
            for parameter in parameters(raw).values():
                out.write(f"{'':24}   --param {parameter.name}={parameter.default}: {parameter.help}\n")
        return 0
    if args.name not in queries:
        print(f"goodput query: no saved query {args.name!r}; there are: {', '.join(queries)} "
              "(goodput query --list)", file=sys.stderr)
        return 2
    if args.sql and not args.dataset:
        print("goodput query: --sql needs --dataset PROJECT.DATASET, the BigQuery dataset of the tables",
              file=sys.stderr)
        return 2
    if args.dataset and not args.sql:
        print("goodput query: --dataset is for --sql; a query run on --duckdb FILE reads that file's tables",
              file=sys.stderr)
        return 2
    values = dict(args.param or ())
    try:
        sql = saved_query(args.name, args.dataset or "", values)
    except ValueError as error:
        print(f"goodput query: --param: {error}", file=sys.stderr)
        return 2
    if args.sql:
        if args.limit is not None:
            print("goodput query: --limit is for a query run on --duckdb FILE; --sql prints the whole "
                  "query", file=sys.stderr)
            return 2
        out.write(sql)
        return 0
    if not args.duckdb:
        print("goodput query: --duckdb FILE is required to run a query (or --sql --dataset "
              "PROJECT.DATASET to print it)", file=sys.stderr)
        return 2
    import duckdb

    from pipeline.app.fleet_sql import run_saved

    try:
        with read_only(args.duckdb) as connection:
            try:
                columns, rows = run_saved(args.name, connection, values)
            except (duckdb.CatalogException, duckdb.BinderException) as error:
                raise UsageError(f"{args.duckdb} lacks a table or column the query needs "
                                 f"({_first_line_of(error)}); write it with python -m pipeline "
                                 "--duckdb first") from None
    except UsageError as error:
        print(f"goodput query: {error}", file=sys.stderr)
        return 2
    write_rows(columns, rows, args.format, args.limit, out, "goodput query")
    return 0


#: The statements ``goodput sql`` runs: those that only read.
_READING = ("SELECT", "EXPLAIN")


def _sql(args: argparse.Namespace, out: TextIO) -> int:
    """``goodput sql "SELECT ..." --duckdb FILE``: one query that only reads, on a file opened as
    ``goodput query`` opens one (read-only, nothing outside the file, the pipeline's own views)."""
    import duckdb

    try:
        if not args.duckdb:
            raise UsageError("--duckdb FILE is required: the DuckDB file to query")
        if not args.query.strip():
            raise UsageError('the query is empty: goodput sql "SELECT ..." --duckdb FILE')
        with read_only(args.duckdb) as connection:
            text = args.query
            if args.dialect == "bigquery":
                from sqlglot.errors import SqlglotError

                from pipeline.sinks.duckdb_sql import to_duckdb

                try:
                    text = to_duckdb(args.query.replace("${dataset}", "main"))
                except (SqlglotError, ValueError) as error:  # ValueError: not one statement
                    raise UsageError(f"not BigQuery SQL: {_first_line_of(error)}") from None
            try:
                statements = connection.extract_statements(text)
                if len(statements) != 1:
                    raise UsageError(f"one query at a time, got {len(statements)} statements")
                kind = statements[0].type.name
                if kind not in _READING:
                    raise UsageError(f"{kind} is not run here: only one query that reads (a select, "
                                     "with ..., explain), the file being opened read-only")
                cursor = connection.execute(text)
                columns = [column[0] for column in cursor.description or ()]
                rows = cursor.fetchall()
            except duckdb.Error as error:
                raise UsageError(_first_line_of(error)) from None
    except UsageError as error:
        print(f"goodput sql: {error}", file=sys.stderr)
        return 2
    write_rows(columns, rows, args.format, args.limit, out, "goodput sql")
    return 0


def write_rows(columns: Sequence[str], rows: Sequence[Sequence[Any]], format_name: str, limit: int | None,
               out: TextIO, command: str) -> None:
    """Rows of a query in ``format_name`` (table, csv or json lines), at most ``limit`` of them (0:
    all; by default ``TABLE_LIMIT`` in a table, all in csv and json). A table says in its last line
    how many were left out and how to see them; csv and json say it on standard error, so that
    what they write stays data."""
    if limit is None:
        limit = TABLE_LIMIT if format_name == "table" else 0
    shown = rows[:limit] if limit else rows
    if format_name == "csv":
        writer = csv.writer(out)
        writer.writerow(columns)
        writer.writerows([_spreadsheet_cell(value) for value in row] for row in shown)
    elif format_name == "json":
        for row in shown:
            out.write(json.dumps(dict(zip(columns, row, strict=True)), default=str) + "\n")
    else:
        format_table(columns, shown, out, total=len(rows))
    if len(shown) < len(rows) and format_name != "table":
        print(f"{command}: wrote {len(shown)} of {len(rows)} rows (--limit {limit}; --limit 0 for all)",
              file=sys.stderr)


def _first_line_of(error: BaseException) -> str:
    return str(error).splitlines()[0] if str(error) else type(error).__name__


def _check_report_output(output: Path, duckdb_path: Path) -> None:
    """Where a report may go: a new file, or an earlier report (never the database, nor any
    other file that happens to be there)."""
    if output.is_dir():
        raise UsageError(f"--output={output} is a directory: name a file, e.g. {output / 'report.html'}")
    if not output.exists():
        return
    if output.resolve() == duckdb_path.resolve():
        raise UsageError(f"--output={output} is the --duckdb file: name another file, e.g. report.html")
    try:
        with output.open("rb") as existing:
            head = existing.read(1024)
    except OSError as error:
        raise UsageError(f"cannot read --output={output}: {error.strerror}") from None
    if _REPORT_MARK not in head:
        raise UsageError(f"--output={output} exists and is not a report this command wrote: it was "
                         "left untouched; name another file")


def _report(args: argparse.Namespace, out: TextIO) -> int:
    import duckdb

    from pipeline.app.report import write_report
    from pipeline.app.run_page import write_run_report

    def write() -> None:
        if args.run is None:
            write_report(Path(args.duckdb), Path(args.output))
        else:
            write_run_report(Path(args.duckdb), args.run, Path(args.output))

    try:
        with read_only(args.duckdb):
            pass
        _check_report_output(Path(args.output), Path(args.duckdb))
        try:
            # The report opens the file again, and a stream writing it may have taken it meanwhile.
            while_locked(args.duckdb, "--duckdb", write)
        except LookupError as error:  # a run the file does not know
            raise UsageError(f"--run: {error.args[0]}") from None
        except (duckdb.CatalogException, duckdb.BinderException) as error:
            raise UsageError(f"{args.duckdb} lacks a table or column the report needs "
                             f"({_first_line_of(error)}); write it with python -m pipeline --duckdb "
                             "first") from None
        except OSError as error:
            raise UsageError(f"cannot write --output={args.output}: {error.strerror}") from None
    except UsageError as error:
        print(f"goodput report: {error}", file=sys.stderr)
        return 2
    out.write(f"wrote {args.output}\n")
    return 0


def _replay(argv: Sequence[str]) -> int:
    """``goodput replay ARGS``: the batch pipeline, ``python -m pipeline ARGS``."""
    if "--streaming" in argv:
        print("goodput replay: a replay is a batch run; for the stream, run python -m pipeline --streaming",
              file=sys.stderr)
        return 2
    from pipeline.beam.launcher import run

    return run(list(argv), prog="goodput replay")


_EMULATORS = {"pubsub": 8085, "bigquery": 9050, "monitoring": 8086}  # and their default ports


def _emulator(args: argparse.Namespace, out: TextIO) -> int:
    import importlib

    module = importlib.import_module(f"pipeline.emulators.{args.service}")
    port = args.port or _EMULATORS[args.service]
    held = [*(["--topic", args.topic] if args.topic else []),
            *(part for name in args.subscription or () for part in ("--subscription", name))]
    if held and args.service != "pubsub":
        print(f"goodput emulator: {held[0]} is for the pubsub emulator, which holds topics and "
              "subscriptions", file=sys.stderr)
        return 2
    problem = check_topic_options(args.topic, args.subscription)
    if problem is not None:
        print(f"goodput emulator: {problem}", file=sys.stderr)
        return 2
    try:
        code: int = module.main(["--port", str(port), "--host", args.host, *held])
    except (OSError, RuntimeError) as error:  # gRPC says RuntimeError when it cannot bind
        if "bind" not in str(error).lower() and "address" not in str(error).lower():
            raise
        print(f"goodput emulator: cannot listen on {args.host}:{port} (in use, or not an address "
              "of this machine): choose another --port or --host", file=sys.stderr)
        return 2
    return code


#: A BigQuery dataset: a project id (``example.com:`` before it for a domain-scoped project), a
#: dot, a dataset name.
_DATASET = re.compile(r"(?:[a-z0-9.-]+:)?[a-z][a-z0-9-]{4,28}[a-z0-9]\.[A-Za-z0-9_]{1,1024}")


def _dataset(text: str) -> str:
    """``PROJECT.DATASET`` as BigQuery SQL names it: in backquotes (as Terraform names it in the
    views), for a project id may hold hyphens."""
    if not _DATASET.fullmatch(text):
        raise argparse.ArgumentTypeError(f"invalid dataset {text!r}: PROJECT.DATASET, e.g. "
                                         "my-project.goodput")
    return f"`{text}`"


def _port(text: str) -> int:
    """A TCP port number (0: any free port)."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid port {text!r}: a number from 0 to 65535") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"a port is a number from 0 to 65535, got {port}")
    return port


def _add_format_options(command: argparse.ArgumentParser) -> None:
    """``--format`` and ``--limit``, of the commands that print rows."""
    command.add_argument("--format", choices=("table", "csv", "json"), default="table",
                         help="output format: a table to read, CSV, or JSON lines (default: %(default)s)")
    command.add_argument("--limit", metavar="N", type=_limit, default=None,
                         help=f"at most N rows, 0 for all (default: {TABLE_LIMIT} in a table, with a "
                              "last line saying how many were left out; all in csv and json)")


def version() -> str:
    """The installed distribution's version."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed("fleet-goodput")
    except PackageNotFoundError:
        return "unknown (not installed: pip install -e . in the checkout)"


def parser() -> argparse.ArgumentParser:
    from pipeline.app.spelling import SPELLING_HELP

    top = OneLineParser(
        prog="goodput", description="Fleet goodput on a workstation: the demo, batch replays, HTML reports, "
                                    "fleet queries, imports of the reference's history, local emulators.",
        epilog=SPELLING_HELP)
    top.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    commands = top.add_subparsers(dest="command", required=True)
    commands.add_parser(
        "demo", add_help=False, help="a live local fleet, end to end, in about 2 minutes, with an HTML "
                                     "report (goodput demo --help for its options)")
    commands.add_parser(
        "replay", add_help=False, help="replay emitter files, or backfill from a raw events table, in batch "
                                       "into DuckDB and BigQuery (python -m pipeline; goodput replay "
                                       "--help for its options)")
    report = commands.add_parser(
        "report", help="write a self-contained HTML report of a DuckDB file",
        description="Writes one HTML file (plots inline, nothing loaded from the network): goodput over "
                    "time, badput, disruptions, step-time deviation, the alerts the Terraform policies "
                    "would have fired, and every saved fleet query.")
    report.add_argument("--duckdb", metavar="FILE", required=True, help="the DuckDB file the pipeline wrote")
    report.add_argument("--output", metavar="FILE", default="report.html",
                        help="where to write the report (default: %(default)s)")
    report.add_argument("--run", metavar="RUN",
                        help="write the page of this run alone: a timeline of its attempts and spans, its "
                             "goodput over time, configs and metrics")
    report.set_defaults(handler=_report)
    from pipeline.app import importer

    imported = commands.add_parser(
        "import", help="import ml-goodput-measurement history from a Cloud Logging export, GKE's "
                       "JobSet metrics from Cloud Monitoring (goodput import gke-metrics --help), or "
                       "the accelerator capacity paid for (goodput import capacity --help)")
    importer.build_parser(imported)
    imported.set_defaults(handler=importer.run)
    commands.add_parser(
        "productivity", add_help=False, help="write ML Productivity Goodput of each run and of the fleet to "
                                             "Cloud Monitoring, from the tables (goodput productivity "
                                             "--help for its options)")
    query = commands.add_parser(
        "query", help="run a saved fleet query (goodput_schemas/sql/) on a DuckDB file, or print it "
                      "for BigQuery",
        description="Runs a saved fleet query, written in BigQuery's dialect, on the DuckDB file "
                    "the pipeline wrote (python -m pipeline --duckdb FILE); or prints it with its "
                    "tables in a BigQuery dataset, to paste into the console or pipe into "
                    "bq query --use_legacy_sql=false.")
    query.add_argument("name", nargs="?", help="the query (see --list)")
    query.add_argument("--duckdb", metavar="FILE", help="the DuckDB file to query")
    query.add_argument("--list", action="store_true", help="list the saved queries")
    query.add_argument("--sql", action="store_true",
                       help="print the query's BigQuery SQL instead (with --dataset)")
    query.add_argument("--dataset", metavar="PROJECT.DATASET", type=_dataset,
                       help="the BigQuery dataset of the tables, named in the printed SQL")
    query.add_argument("--param", metavar="NAME=VALUE", type=_parameter, action="append",
                       help="a parameter of the query instead of its default, e.g. --param "
                            "interval_hours=6 (--list shows each query's); repeat for more. With "
                            "--sql, the value is written into the printed SQL")
    _add_format_options(query)
    query.set_defaults(handler=_query)
    adhoc = commands.add_parser(
        "sql", help="run one query of your own on a DuckDB file, read-only",
        description="Runs one query that only reads (SELECT, WITH ..., EXPLAIN) on the DuckDB file "
                    "the pipeline wrote, opened as goodput query opens it: read-only, nothing "
                    "outside the file (no other file, no URL), the pipeline's views as defined by "
                    "this version. Its tables and views are those of goodput_schemas/tables and "
                    "views, e.g. goodput sql \"SELECT run_id, goodput_pct FROM latest_goodput\" "
                    "--duckdb goodput.duckdb.")
    adhoc.add_argument("query", help="the query, in DuckDB's SQL (or BigQuery's, with --dialect bigquery)")
    adhoc.add_argument("--duckdb", metavar="FILE", help="the DuckDB file to query (required)")
    adhoc.add_argument("--dialect", choices=("duckdb", "bigquery"), default="duckdb",
                       help="the SQL's dialect: bigquery is transpiled as the saved queries are, "
                            "its tables named alone or as ${dataset}.NAME (default: %(default)s)")
    _add_format_options(adhoc)
    adhoc.set_defaults(handler=_sql)
    emulator = commands.add_parser("emulator", help="run a local stand-in of a Google Cloud service")
    emulator.add_argument("service", choices=tuple(_EMULATORS), help="the service")
    emulator.add_argument("--port", type=_port, default=None,
                          help="port (default: " + ", ".join(f"{k} {v}" for k, v in _EMULATORS.items()) + ")")
    emulator.add_argument("--host", default="127.0.0.1", help="address (default: %(default)s)")
    add_topic_options(emulator)
    emulator.set_defaults(handler=_emulator)
    return top


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["replay"]:  # the pipeline's own options, parsed by the pipeline
        return _replay(argv[1:])
    if argv[:1] == ["demo"]:
        from pipeline.demo.demo import main as demo

        return demo(argv[1:])
    if argv[:2] == ["import", "gke-metrics"]:  # an import of its own kind, with its own options
        from pipeline.app.gke import main as import_gke_metrics

        return import_gke_metrics(argv[2:], out)
    if argv[:2] == ["import", "capacity"]:
        from pipeline.app.capacity import main as import_capacity

        return import_capacity(argv[2:], out)
    if argv[:1] == ["productivity"]:
        from pipeline.app.productivity import main as productivity

        return productivity(argv[1:], out)
    args = parser().parse_args(argv)
    code: int = args.handler(args, out or sys.stdout)
    return code


if __name__ == "__main__":
    sys.exit(main())
