"""Entry point of the Dataflow flex template: the streaming pipeline on Dataflow.

The template launcher runs ``python main.py --NAME=VALUE ...`` with the parameters of
``metadata.json`` and the job's environment; this adds what the template always is (streaming, on
Dataflow) and hands over to ``python -m pipeline``'s launcher, which submits the job and returns.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence


def template_args(argv: Sequence[str]) -> list[str]:
    """``argv`` with ``--streaming`` and, unless one is given, ``--runner=DataflowRunner``."""
    args = list(argv)
    if not any(arg == "--runner" or arg.startswith("--runner=") for arg in args):
        args.append("--runner=DataflowRunner")
    if "--streaming" not in args:
        args.append("--streaming")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    from pipeline.beam.launcher import run

    return run(template_args(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    sys.exit(main())
