-- Disruptions per 1000 chip-hours, mean time between failures (elapsed hours per disruption) and
-- mean time to recover (seconds from the last step before a failure to the restart), by
-- accelerator type, from each run's latest cumulative snapshot. Each disruption counts once however
-- often its row was written (a retried or repeated write into BigQuery may hold a row twice).
WITH latest AS (
  SELECT run_id, snapshot_time, IFNULL(accelerator_type, 'unknown') AS accelerator_type, disruptions,
    total_time_s, total_chip_s
  FROM ${dataset}.goodput_snapshots
  WHERE window_s = 0
  QUALIFY ROW_NUMBER() OVER (PARTITION BY run_id ORDER BY snapshot_time DESC) = 1
),
reported AS (
  SELECT l.accelerator_type, d.recovery_s
  FROM ${dataset}.disruptions AS d
  JOIN latest AS l USING (run_id, snapshot_time)
  WHERE TRUE
  QUALIFY ROW_NUMBER() OVER (PARTITION BY d.run_id, d.disruption_index) = 1
),
recovery AS (
  SELECT accelerator_type, AVG(recovery_s) AS mttr_s
  FROM reported
  GROUP BY accelerator_type
),
rates AS (
  SELECT accelerator_type, COUNT(*) AS runs, SUM(disruptions) AS disruptions,
    SUM(total_time_s) AS elapsed_s, SUM(total_chip_s) / 3600 AS chip_hours
  FROM latest
  GROUP BY accelerator_type
)
SELECT
  r.accelerator_type,
  r.runs,
  r.disruptions,
  ROUND(r.chip_hours, 3) AS chip_hours,
  ROUND(1000 * SAFE_DIVIDE(r.disruptions, r.chip_hours), 3) AS disruptions_per_1000_chip_hours,
  ROUND(SAFE_DIVIDE(r.elapsed_s, r.disruptions) / 3600, 3) AS mtbf_h,
  ROUND(v.mttr_s, 1) AS mttr_s
FROM rates AS r
LEFT JOIN recovery AS v USING (accelerator_type)
ORDER BY r.accelerator_type
