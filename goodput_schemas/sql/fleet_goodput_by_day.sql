-- Chip-weighted fleet goodput by day, accelerator type and run group.
-- A run's chip-seconds of a day are the growth of its cumulative counters over that day: its last
-- cumulative snapshot of the day less its last one of an earlier day. A run spanning days counts
-- in each day for what it did that day; the fleet figure weighs each run by its chips.
-- @days INT64 = NULL: only the last this many days, up to the day of the fleet's latest snapshot (NULL: every day)
WITH daily AS (
  SELECT run_id, DATE(snapshot_time) AS day, accelerator_type, run_group, productive_chip_s, total_chip_s
  FROM ${dataset}.goodput_snapshots
  WHERE window_s = 0
  QUALIFY ROW_NUMBER() OVER (PARTITION BY run_id, DATE(snapshot_time) ORDER BY snapshot_time DESC) = 1
),
growth AS (
  SELECT
    day,
    IFNULL(accelerator_type, 'unknown') AS accelerator_type,
    IFNULL(run_group, 'none') AS run_group,
    productive_chip_s - IFNULL(LAG(productive_chip_s) OVER (PARTITION BY run_id ORDER BY day), 0) AS productive_chip_s,
    total_chip_s - IFNULL(LAG(total_chip_s) OVER (PARTITION BY run_id ORDER BY day), 0) AS total_chip_s
  FROM daily
)
SELECT
  day,
  accelerator_type,
  run_group,
  COUNT(*) AS runs,
  ROUND(SUM(total_chip_s) / 3600, 3) AS chip_hours,
  ROUND(100 * SAFE_DIVIDE(SUM(productive_chip_s), SUM(total_chip_s)), 3) AS goodput_pct
FROM growth
WHERE @days IS NULL OR day > DATE_SUB((SELECT MAX(day) FROM daily), INTERVAL @days DAY)
GROUP BY day, accelerator_type, run_group
ORDER BY day, accelerator_type, run_group
