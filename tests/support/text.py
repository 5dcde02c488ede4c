"""Query results as text to compare: the same rows read twice are the same text."""

from __future__ import annotations

from typing import Any


def canonical(value: Any) -> str:
    """``value`` (a row, a list of rows, a dict of them) as text, its floats to 12 significant
    digits and its dicts' keys in order, so that a NaN equals itself: DuckDB (and so the
    BigQuery stand-in) sums and groups in no fixed order, so an average over the same rows may
    differ in its last bits from one query to the next, and groups come in any order."""
    def rounded(value: Any) -> Any:
        if isinstance(value, float):
            return float(f"{value:.12g}")
        if isinstance(value, dict):
            return {key: rounded(value[key]) for key in sorted(value, key=repr)}
        if isinstance(value, list | tuple):
            return [rounded(item) for item in value]
        return value

    return repr(rounded(value))
