"""``ml_goodput_measurement``, the import path of Google's goodput library, backed by this project.

Replace the reference's package with this one and change no line::

    pip uninstall ml-goodput-measurement
    pip install fleet-goodput-measurement

    from ml_goodput_measurement import goodput, monitoring   # as before

Recorders (``goodput.GoodputRecorder``) are the emitter's: each call queues one event for the
fleet goodput pipeline. Calculators and monitors read the figures the pipeline wrote (DuckDB or
BigQuery); nothing reads Cloud Logging. ``docs/migrating.md`` says what to deploy.
"""

from ml_goodput_measurement.src import (
    goodput,
    goodput_elastic,
    goodput_utils,
    monitoring,
    monitoring_elastic,
)

__all__ = ["goodput", "goodput_elastic", "goodput_utils", "monitoring", "monitoring_elastic"]
