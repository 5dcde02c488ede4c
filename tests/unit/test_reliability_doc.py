"""docs/reliability.md: every row names tests, and every test it names exists."""

from __future__ import annotations

import re

from support import REPO

DOC = REPO / "docs" / "reliability.md"
TEST = re.compile(r"(tests/[\w/]+\.py)::(\w+)")


def test_every_row_of_the_reliability_table_names_a_test_that_exists():
    """A fault listed without a test, or with a test that is gone, fails."""
    root = DOC.parent.parent
    rows = [line for line in DOC.read_text().splitlines()
            if line.startswith("| ") and not line.startswith("| fault ")]
    assert len(rows) > 50
    missing = []
    for row in rows:
        named = TEST.findall(row.rsplit("|", 2)[-2])
        assert named, f"no test for: {row}"
        for path, name in named:
            source = root / path
            if not source.is_file() or not re.search(rf"^def {name}\(", source.read_text(), re.M):
                missing.append(f"{path}::{name}")
    assert not missing
