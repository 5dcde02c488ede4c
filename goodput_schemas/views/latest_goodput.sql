-- Each run's latest goodput snapshot: its cumulative row and one row per rolling window, each once
-- however often it was written (a retried or repeated write into BigQuery may hold a row twice).
-- The dataset of the tables is a template parameter, filled in by Terraform and the DuckDB sink.
SELECT *
FROM ${dataset}.goodput_snapshots
WHERE TRUE
QUALIFY snapshot_time = MAX(snapshot_time) OVER (PARTITION BY run_id)
  AND ROW_NUMBER() OVER (PARTITION BY run_id, snapshot_time, window_s) = 1
