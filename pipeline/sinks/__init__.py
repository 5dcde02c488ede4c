"""Where output rows and points go: DuckDB (``duckdb``), BigQuery (``bigquery``), Cloud Monitoring
(``monitoring``); BigQuery SQL translated for DuckDB (``duckdb_sql``: the views of a DuckDB file,
and the fleet SQL and stand-in queries run on one); and the raw events table read back for backfills
and restores (``raw_events``). Plain clients and writers: the Beam steps that drive them are in
``pipeline.beam.transforms``."""
