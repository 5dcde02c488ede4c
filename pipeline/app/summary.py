"""The summary a batch replay and the demo print: each run's latest cumulative figures and its
largest badput sources, read from the DuckDB tables."""

from __future__ import annotations

from typing import TextIO

from pipeline.app.cli import printable
from pipeline.sinks.duckdb import open_reader

SUMMARY_RUNS = 50  # runs listed by the summary; a larger fleet lists its lowest goodput first


def print_summary(duckdb_path: str, out: TextIO, max_runs: int = SUMMARY_RUNS) -> None:
    """The latest cumulative figures of the runs in the DuckDB file: all of them, in run order,
    or the ``max_runs`` with the lowest goodput."""
    with open_reader(duckdb_path) as connection:
        runs = connection.execute(
            "SELECT run_id, goodput_pct, total_time_s, disruptions, max_productive_step, ended "
            "FROM latest_goodput WHERE window_s = 0 ORDER BY run_id").fetchall()
        dead = connection.execute("SELECT count(*) FROM dead_letter").fetchall()[0][0]
        top = connection.execute(
            "SELECT run_id, badput_source, pct FROM latest_badput WHERE window_s = 0 "
            "AND badput_source <> 'DATA_LOADING_ASYNC' AND pct > 0 "
            "QUALIFY row_number() OVER (PARTITION BY run_id ORDER BY pct DESC) <= 3 "
            "ORDER BY run_id, pct DESC").fetchall()
    shown = runs
    if len(runs) > max_runs:
        shown = sorted(runs, key=lambda run: (run[1] is not None, run[1] or 0.0, run[0]))[:max_runs]
        out.write(f"the {max_runs} of {len(runs)} runs with the lowest goodput (the view latest_goodput "
                  "has them all)\n")
    top_by_run: dict[object, list[str]] = {}
    for run_id, source, pct in top:
        top_by_run.setdefault(run_id, []).append(f"{printable(source)} {pct:.2f}%")
    out.write(f"{'run':30} {'goodput':>8} {'elapsed':>10} {'disruptions':>11} {'max step':>9}  ended\n")
    for run_id, goodput, total, disruptions, max_step, ended in shown:
        figure = "-" if goodput is None else f"{goodput:.2f}%"
        out.write(f"{printable(run_id):30} {figure:>8} {total:>9.0f}s {disruptions:>11} {max_step:>9}  "
                  f"{'yes' if ended else 'no'}\n")
        badput = ", ".join(top_by_run.get(run_id, ()))
        if badput:
            out.write(f"{'':30} top badput: {badput}\n")
    out.write(f"{len(runs)} runs; {dead} rejected inputs in table dead_letter; tables in {duckdb_path}\n")
