-- Each run's latest badput breakdown: one row per source and window.
-- The dataset of the tables is a template parameter, filled in by Terraform and the DuckDB sink.
SELECT *
FROM ${dataset}.badput_snapshots
WHERE TRUE
QUALIFY snapshot_time = MAX(snapshot_time) OVER (PARTITION BY run_id)
