"""The goodput emitter: what a training job imports to report its goodput events.

A drop-in for ``ml_goodput_measurement``'s recorders: change the import, keep the calls::

    from emitter import GoodputRecorder

Each ``record_*`` call queues one event and returns in microseconds; a background thread sends
batches to a file or a Pub/Sub topic. See ``GoodputRecorder`` for the arguments,
``emitter.metrics`` for the names ``record_metrics`` takes, and ``goodput_schemas/README.md`` for
the events.
"""

import logging

from emitter.hosts import HostStepTimer
from emitter.recorder import ElasticGoodputRecorder, GoodputRecorder, __version__
from emitter.settings import EmitterSettings
from emitter.worker import EmitterStats

# A library logs, and leaves it to the application to decide what is shown where.
logging.getLogger("emitter").addHandler(logging.NullHandler())

__all__ = [
    "ElasticGoodputRecorder",
    "EmitterSettings",
    "EmitterStats",
    "GoodputRecorder",
    "HostStepTimer",
    "__version__",
]
