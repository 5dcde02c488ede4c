-- Each anomaly's latest state: the row of its end if it ended, else the row of it found.
-- The dataset of the tables is a template parameter, filled in by Terraform and the DuckDB sink.
SELECT *
FROM ${dataset}.run_anomalies
WHERE TRUE
QUALIFY ROW_NUMBER() OVER (
  PARTITION BY run_id, kind, host, started_at ORDER BY changed_at DESC, ended_at IS NULL) = 1
