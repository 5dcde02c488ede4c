-- Lost chip-hours (elapsed chip-hours that were not productive) and what they cost, by run group
-- and accelerator type, from each run's latest cumulative snapshot and the accelerator_prices
-- table. The cost is NULL where an accelerator type has no price.
WITH latest AS (
  SELECT run_id, run_group, accelerator_type, productive_chip_s, total_chip_s
  FROM ${dataset}.goodput_snapshots
  WHERE window_s = 0
  QUALIFY ROW_NUMBER() OVER (PARTITION BY run_id ORDER BY snapshot_time DESC) = 1
)
SELECT
  IFNULL(l.run_group, 'none') AS run_group,
  IFNULL(l.accelerator_type, 'unknown') AS accelerator_type,
  COUNT(*) AS runs,
  ROUND(SUM(l.total_chip_s) / 3600, 3) AS chip_hours,
  ROUND(SUM(l.total_chip_s - l.productive_chip_s) / 3600, 3) AS lost_chip_hours,
  ROUND(SUM((l.total_chip_s - l.productive_chip_s) / 3600 * p.usd_per_chip_hour), 2) AS lost_usd
FROM latest AS l
LEFT JOIN ${dataset}.accelerator_prices AS p ON p.accelerator_type = l.accelerator_type
GROUP BY 1, 2
ORDER BY lost_chip_hours DESC, run_group, accelerator_type
