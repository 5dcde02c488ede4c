"""Local stand-ins for cloud services, speaking their real protocols.

Each is started from the command line (``python -m pipeline.emulators.NAME --port P``, or
``goodput emulator NAME``) or in-process as a context manager; the helpers here are their shared
command-line parts.
"""

from __future__ import annotations

import argparse
import logging
import signal
import threading
from typing import Protocol


class Stoppable(Protocol):
    def stop(self) -> None: ...


def emulator_parser(name: str, description: str, port: int) -> argparse.ArgumentParser:
    """The command line every stand-in shares: ``--port`` and ``--host``."""
    parser = argparse.ArgumentParser(prog=f"python -m pipeline.emulators.{name}", description=description)
    parser.add_argument("--port", type=int, default=port, help="port to listen on (default: %(default)s)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: %(default)s)")
    return parser


def log_to_console() -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")


def serve_until_signalled(emulator: Stoppable) -> int:
    """Keeps a started stand-in serving until SIGINT or SIGTERM, then stops it."""
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    stop.wait()
    emulator.stop()
    return 0
