"""The view ``run_spans`` (goodput_schemas/views/run_spans.sql): the spans of a run's timeline from
SQL, the same as the run's page (``goodput report --run RUN``) draws from the tables."""

from __future__ import annotations

import datetime
import re
from collections import Counter
from pathlib import Path

import pytest

from pipeline.app import report as fleet_report
from pipeline.app.run_page import read_run
from pipeline.demo.simulated_job import JobProfile
from pipeline.sinks.duckdb import open_reader
from support.beam import run_batch
from support.history import simulate_profile
from support.runs import TraceBuilder, as_run, record_ours, write_events

MICROSECOND = datetime.timedelta(microseconds=1)


def gapped_run() -> TraceBuilder:
    """One attempt whose steps stop for five minutes (two stretches), an eval, a save, an end."""
    run = TraceBuilder(seed=3)
    run.start_attempt()
    run.steps(0, 60, noise=0.1, compile_s=10, eval_every=40, save_every=50)
    run.wait(300)
    run.steps(60, 120, noise=0.1)
    run.end()
    return run


@pytest.fixture(scope="module")
def database(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A replay of a run with two crashes (one that wastes progress), checkpoints, evals, a
    slowdown and a hang still going on, and of a run with a gap in its steps."""
    directory = tmp_path_factory.mktemp("spans")
    hung = simulate_profile(directory, "hung", 2000, 7, JobProfile(
        crashes_at=(0.3, 0.5), slowdown=1.6, slowdown_from=0.55, hang_at=0.8, hang_for_s=1800))
    gapped = directory / "gapped.jsonl"
    write_events(as_run(record_ours(gapped_run().attempts), "gapped"), gapped)
    output = directory / "goodput.duckdb"
    run_batch(f"--events={hung}", f"--events={gapped}", f"--duckdb={output}", "--snapshot_every_s=600")
    return output


def page_spans(connection, run_id: str) -> Counter:
    """The run page's spans: (attempt or lane, kind, start, end, first step, last step, count)."""
    page = read_run(connection, fleet_report.table_names(connection), run_id)
    attempts = [row["attempt_id"] for row in page.attempts]
    spans: Counter = Counter()
    for name, _, lane in page.lanes:
        where = attempts[int(name.split()[1]) - 1] if name.startswith("attempt ") else name
        for span in lane:
            steps = re.match(r"steps (\d+)–(\d+): ([\d,]+) recorded", span.about)
            counted = (int(steps[1]), int(steps[2]), int(steps[3].replace(",", ""))) if steps else ()
            spans[(where, span.kind, span.start, span.end, *counted)] += 1
    return spans


def view_spans(connection, run_id: str) -> Counter:
    lanes = {"disruptions": "disruptions", "anomalies": None}
    spans: Counter = Counter()
    for attempt, lane, kind, start, end, first, last, count in connection.execute(
            "SELECT attempt_id, lane, kind, started_at, ended_at, first_step, last_step, steps_recorded "
            "FROM run_spans WHERE run_id = $run", {"run": run_id}).fetchall():
        where = attempt if lane == "attempt" else lanes[lane] or f"{kind}s"
        spans[(where, kind, start, end, *((first, last, count) if kind == "steps" else ()))] += 1
    return spans


def same_within_a_microsecond(ours: Counter, theirs: Counter) -> bool:
    """Equal, but that a time may differ by a microsecond (a float number of seconds added to a
    time is rounded to microseconds half to even in Python, half away from zero in SQL)."""
    def near(a: tuple, b: tuple) -> bool:
        return len(a) == len(b) and all(
            abs(x - y) <= MICROSECOND if isinstance(x, datetime.datetime) else x == y
            for x, y in zip(a, b, strict=True))

    left = sorted(ours.elements(), key=repr)
    right = list(theirs.elements())
    for span in left:
        match = next((other for other in right if near(span, other)), None)
        if match is None:
            return False
        right.remove(match)
    return not right


@pytest.mark.parametrize("run_id", ["hung", "gapped"])
def test_the_views_spans_are_the_run_pages(database: Path, run_id: str):
    """Every span the run page draws is a row of run_spans, with its steps, and nothing else is."""
    connection = open_reader(database)
    try:
        page, view = page_spans(connection, run_id), view_spans(connection, run_id)
    finally:
        connection.close()
    assert same_within_a_microsecond(view, page), (sorted(view - page, key=repr)[:5],
                                                   sorted(page - view, key=repr)[:5])
    kinds = {kind for _, kind, *_ in view}
    if run_id == "hung":
        assert kinds >= {"init", "prep", "data loading", "steps", "checkpoint save", "checkpoint restore",
                         "EVAL_STEP", "crash", "recovery", "wasted progress", "hang", "slowdown"}
    else:
        assert sum(kind == "steps" for _, kind, *_ in view.elements()) == 2
