"""What the test suites share: runs of every shape (``runs``), the reference library driven the
same way (``reference``), emitter and Beam helpers (``emitter``, ``beam``), snapshot histories
(``history``), the Terraform plan checks (``terraform``) and the soak (``soak``, ``soak_job``).

The suites import it as ``support`` (``pythonpath`` in ``pyproject.toml``)."""

from pathlib import Path

#: The repository's root.
REPO = Path(__file__).resolve().parents[2]
