-- Badput sources across the fleet, ranked by the chip-hours they cost: each run's latest cumulative
-- snapshot, a source's seconds times the run's average chips. DATA_LOADING_ASYNC overlaps steps
-- (it is informational, not lost time) and is left out. Each row counts once however often it
-- was written (a retried or repeated write into BigQuery may hold a row twice).
WITH latest AS (
  SELECT run_id, snapshot_time, SAFE_DIVIDE(total_chip_s, total_time_s) AS chips
  FROM ${dataset}.goodput_snapshots
  WHERE window_s = 0
  QUALIFY ROW_NUMBER() OVER (PARTITION BY run_id ORDER BY snapshot_time DESC) = 1
),
costs AS (
  SELECT b.badput_source, b.run_id, b.seconds * IFNULL(l.chips, 0) AS chip_s
  FROM ${dataset}.badput_snapshots AS b
  JOIN latest AS l USING (run_id, snapshot_time)
  WHERE b.window_s = 0 AND b.badput_source != 'DATA_LOADING_ASYNC' AND b.seconds > 0
  QUALIFY ROW_NUMBER() OVER (PARTITION BY b.run_id, b.badput_source) = 1
)
SELECT
  RANK() OVER (ORDER BY SUM(chip_s) DESC) AS position,
  badput_source,
  COUNT(DISTINCT run_id) AS runs,
  ROUND(SUM(chip_s) / 3600, 3) AS chip_hours,
  ROUND(100 * SAFE_DIVIDE(SUM(chip_s), SUM(SUM(chip_s)) OVER ()), 2) AS share_pct
FROM costs
GROUP BY badput_source
ORDER BY position, badput_source
