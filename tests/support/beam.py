"""For tests of the pipeline on Beam: options for a streaming test, a keyed test stream, the
batch replay in this process, and the tables it wrote."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import duckdb

#: The snapshot tables: every number the pipeline computes.
SNAPSHOT_TABLES = ("goodput_snapshots", "badput_snapshots", "step_stats", "disruptions")


def keyed_stream(published_s: float = 0.0) -> Any:
    """A TestStream of (run id, message) pairs, with a deterministic key coder for keyed state. Its
    elements are published (timestamped) at ``published_s`` unless the test moves the watermark."""
    from apache_beam import coders
    from apache_beam.testing.test_stream import TestStream

    return TestStream(coder=coders.TupleCoder([coders.StrUtf8Coder(), coders.FastPrimitivesCoder()])
                      ).advance_watermark_to(published_s)


def streaming_options() -> Any:
    """Pipeline options for a streaming Beam test on the DirectRunner (with TestStream)."""
    from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions

    options = PipelineOptions(["--runner=BundleBasedDirectRunner"])
    options.view_as(StandardOptions).streaming = True
    return options


def run_batch(*arguments: str) -> None:
    """The batch pipeline (Beam's DirectRunner) with these options, in this process."""
    import apache_beam as beam

    from pipeline.beam.graph import build_pipeline
    from pipeline.beam.launcher import _batch_runner
    from pipeline.beam.options import GoodputOptions

    options = GoodputOptions(list(arguments))
    with beam.Pipeline(runner=_batch_runner(options), options=options) as pipeline:
        build_pipeline(pipeline, options)


def replay(lines: Sequence[bytes], directory: Path) -> Path:
    """The DuckDB file of a batch replay of a file holding ``lines``."""
    directory.mkdir(parents=True, exist_ok=True)
    events, database = directory / "events.jsonl", directory / "goodput.duckdb"
    events.write_bytes(b"".join(line + b"\n" for line in lines))
    run_batch(f"--events={events}", f"--duckdb={database}")
    return database


def query(database: Path, sql: str) -> list[tuple[object, ...]]:
    with duckdb.connect(str(database), read_only=True) as connection:
        return connection.execute(sql).fetchall()


def table_seqs(database: Path) -> list[int]:
    """The sequence numbers in the events table, or [] while the stream holds the file."""
    try:
        with duckdb.connect(str(database), read_only=True) as connection:
            rows = connection.execute("SELECT DISTINCT seq FROM events ORDER BY seq").fetchall()
    except (duckdb.IOException, duckdb.CatalogException):
        return []
    return [seq for seq, in rows]


def table(database: Path, name: str, where: str = "TRUE") -> list[tuple[object, ...]]:
    """Every row of a table, in a canonical order."""
    return query(database, f"SELECT * FROM {name} WHERE {where} ORDER BY ALL")
