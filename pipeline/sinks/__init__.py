"""Where output rows and points go: DuckDB (``duckdb``), BigQuery (``bigquery``), Cloud Monitoring
(``monitoring``); and the raw events table read back for backfills and restores (``raw_events``).
Plain clients and writers: the Beam steps that drive them are in ``pipeline.beam.transforms``."""
