"""The fleet goodput pipeline, in rooms by role:

* ``pipeline.core``: the event contract's parser, the goodput engine, output rows (no Beam);
* ``pipeline.beam``: the Beam composites, the stream's run tracker, options and the launcher;
* ``pipeline.sinks``: DuckDB, BigQuery, Cloud Monitoring, and the raw events read back;
* ``pipeline.emulators``: local stand-ins of Pub/Sub, BigQuery and Cloud Monitoring;
* ``pipeline.app``: the ``goodput`` command, the report, alerts, fleet SQL, the importer;
* ``pipeline.demo``: the live local demo and the training jobs it runs.

``python -m pipeline`` runs the pipeline (``pipeline.beam.launcher``).
"""
