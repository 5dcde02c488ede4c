-- Each run's latest badput breakdown: one row per source and window, each once however often it
-- was written (a retried or repeated write into BigQuery may hold a row twice).
-- The dataset of the tables is a template parameter, filled in by Terraform and the DuckDB sink.
SELECT *
FROM ${dataset}.badput_snapshots
WHERE TRUE
QUALIFY snapshot_time = MAX(snapshot_time) OVER (PARTITION BY run_id)
  AND ROW_NUMBER() OVER (PARTITION BY run_id, snapshot_time, window_s, badput_source) = 1
