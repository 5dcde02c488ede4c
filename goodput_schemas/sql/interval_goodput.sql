-- Goodput of each run over an interval, from two cumulative snapshots (the PromQL offset method):
-- productive seconds gained over the interval divided by elapsed seconds gained. The interval is
-- the interval_hours hours before the fleet's latest snapshot. Every run that went on
-- inside the interval is listed, counted from (counted_from) its start if it started inside the
-- interval; else from its latest snapshot at or before the interval's start; else, where its
-- earlier snapshots are missing (expired, or never written: the pipeline started later), from its
-- earliest snapshot inside the interval. From a snapshot means from its window_end, the time its
-- figures run up to. elapsed_s never exceeds the time from counted_from to interval_end.
-- @interval_hours INT64 = 1: the interval's length in hours, ending at the fleet's latest snapshot
WITH bounds AS (
  SELECT TIMESTAMP_SUB(MAX(snapshot_time), INTERVAL @interval_hours HOUR) AS interval_start, MAX(snapshot_time) AS interval_end
  FROM ${dataset}.goodput_snapshots
),
cumulative AS (
  SELECT g.run_id, g.snapshot_time, g.window_start, g.window_end, g.productive_time_s, g.total_time_s,
    g.snapshot_time <= b.interval_start AS before_interval
  FROM ${dataset}.goodput_snapshots AS g
  CROSS JOIN bounds AS b
  WHERE g.window_s = 0 AND g.snapshot_time <= b.interval_end
),
at_end AS (
  SELECT *
  FROM cumulative
  WHERE TRUE
  QUALIFY ROW_NUMBER() OVER (PARTITION BY run_id ORDER BY snapshot_time DESC) = 1
),
at_start AS (
  SELECT *
  FROM cumulative
  WHERE before_interval
  QUALIFY ROW_NUMBER() OVER (PARTITION BY run_id ORDER BY snapshot_time DESC) = 1
),
first_inside AS (
  SELECT *
  FROM cumulative
  WHERE NOT before_interval
  QUALIFY ROW_NUMBER() OVER (PARTITION BY run_id ORDER BY snapshot_time) = 1
),
-- A cumulative row's window_start is the run's start and its window_end the run's end, or the
-- snapshot's time while the run goes on: the time its figures run up to. A run that ended before
-- the interval is left out even when a later message snapshotted it again.
counted AS (
  SELECT
    e.run_id,
    b.interval_start,
    b.interval_end,
    e.window_start >= b.interval_start AS started_inside,
    e.window_start AS run_start,
    e.productive_time_s,
    e.total_time_s,
    IFNULL(s.window_end, f.window_end) AS baseline_end,
    IFNULL(s.productive_time_s, f.productive_time_s) AS baseline_productive_s,
    IFNULL(s.total_time_s, f.total_time_s) AS baseline_total_s
  FROM at_end AS e
  CROSS JOIN bounds AS b
  LEFT JOIN at_start AS s ON s.run_id = e.run_id
  LEFT JOIN first_inside AS f ON f.run_id = e.run_id
  WHERE e.window_end > b.interval_start
),
gained AS (
  SELECT
    run_id,
    interval_start,
    interval_end,
    IF(started_inside, run_start, baseline_end) AS counted_from,
    total_time_s - IF(started_inside, 0, baseline_total_s) AS elapsed_s,
    productive_time_s - IF(started_inside, 0, baseline_productive_s) AS productive_s
  FROM counted
)
SELECT
  run_id,
  interval_start,
  interval_end,
  counted_from,
  ROUND(elapsed_s, 3) AS elapsed_s,
  ROUND(productive_s, 3) AS productive_s,
  ROUND(100 * SAFE_DIVIDE(productive_s, elapsed_s), 3) AS goodput_pct
FROM gained
ORDER BY run_id
