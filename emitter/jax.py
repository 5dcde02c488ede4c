"""Recording on one process only, for JAX jobs, without needing JAX installed.

Example::

    import jax
    from emitter import GoodputRecorder
    from emitter.jax import is_process_zero

    jax.distributed.initialize()          # where the job needs it: before asking
    recorder = GoodputRecorder("run-7", logging_enabled=is_process_zero(), destination=...)
"""

from __future__ import annotations

import importlib
import importlib.util
import sys


def is_process_zero() -> bool:
    """True on JAX process 0, and on any process of a job where JAX is not installed.

    JAX is imported only if it is installed. Call this after ``jax.distributed.initialize()``
    (where a job needs it): before that, every process reports index 0.
    """
    module = sys.modules.get("jax")
    if module is None:
        if importlib.util.find_spec("jax") is None:
            return True
        module = importlib.import_module("jax")
    return int(module.process_index()) == 0
