-- Goodput of each run over an interval, from two cumulative snapshots (the PromQL offset method):
-- productive seconds gained over the interval divided by elapsed seconds gained. The interval is
-- the hour before the fleet's latest snapshot; change `bounds` for another. A run that started
-- inside the interval counts from its start.
WITH bounds AS (
  SELECT TIMESTAMP_SUB(MAX(snapshot_time), INTERVAL 1 HOUR) AS interval_start, MAX(snapshot_time) AS interval_end
  FROM ${dataset}.goodput_snapshots
),
at_end AS (
  SELECT g.run_id, g.snapshot_time, g.productive_time_s, g.total_time_s
  FROM ${dataset}.goodput_snapshots AS g
  CROSS JOIN bounds AS b
  WHERE g.window_s = 0 AND g.snapshot_time <= b.interval_end
  QUALIFY ROW_NUMBER() OVER (PARTITION BY g.run_id ORDER BY g.snapshot_time DESC) = 1
),
at_start AS (
  SELECT g.run_id, g.productive_time_s, g.total_time_s
  FROM ${dataset}.goodput_snapshots AS g
  CROSS JOIN bounds AS b
  WHERE g.window_s = 0 AND g.snapshot_time <= b.interval_start
  QUALIFY ROW_NUMBER() OVER (PARTITION BY g.run_id ORDER BY g.snapshot_time DESC) = 1
)
SELECT
  e.run_id,
  b.interval_start,
  b.interval_end,
  ROUND(e.total_time_s - IFNULL(s.total_time_s, 0), 3) AS elapsed_s,
  ROUND(e.productive_time_s - IFNULL(s.productive_time_s, 0), 3) AS productive_s,
  ROUND(100 * SAFE_DIVIDE(e.productive_time_s - IFNULL(s.productive_time_s, 0),
                          e.total_time_s - IFNULL(s.total_time_s, 0)), 3) AS goodput_pct
FROM at_end AS e
CROSS JOIN bounds AS b
LEFT JOIN at_start AS s USING (run_id)
WHERE e.snapshot_time > b.interval_start
ORDER BY e.run_id
