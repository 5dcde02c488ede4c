-- Runs whose books do not balance: each run whose latest cumulative snapshot leaves more than a
-- millisecond of its elapsed time, either way, in neither productive time nor a badput bucket
-- (unaccounted_s, the pipeline's own figure; the informational DATA_LOADING_ASYNC is no bucket
-- here). With its elapsed seconds and the unaccounted share of them, largest first. The pipeline's
-- books balance, so a row here is a defect to report. Rows written before the column existed
-- (unaccounted_s NULL) list no run.
-- @min_unaccounted_s FLOAT64 = 0.001: the unaccounted seconds, either way, above which a run is listed
WITH latest AS (
  SELECT run_id, snapshot_time, ended, total_time_s, unaccounted_s
  FROM ${dataset}.goodput_snapshots
  WHERE window_s = 0
  QUALIFY ROW_NUMBER() OVER (PARTITION BY run_id ORDER BY snapshot_time DESC) = 1
)
SELECT
  run_id,
  snapshot_time,
  ended,
  ROUND(total_time_s, 3) AS elapsed_s,
  unaccounted_s,
  ROUND(100 * SAFE_DIVIDE(unaccounted_s, total_time_s), 3) AS unaccounted_pct
FROM latest
WHERE ABS(unaccounted_s) > @min_unaccounted_s
ORDER BY ABS(unaccounted_s) DESC, run_id
