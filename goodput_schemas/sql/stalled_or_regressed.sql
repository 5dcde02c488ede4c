-- Runs that need attention now: stalled (not ended, and no productive time in the shortest rolling
-- window of their latest snapshot), or whose step time regressed (the median of their last 100
-- steps over regression_ratio times their overall median). since_last_step_s: from the last step
-- start to the latest snapshot.
-- @regression_ratio FLOAT64 = 1.2: recent median step time over overall median above which a run regressed
WITH latest_window AS (
  SELECT run_id, snapshot_time, window_s, ended, productive_time_s, total_time_s
  FROM ${dataset}.goodput_snapshots
  WHERE window_s > 0
  QUALIFY ROW_NUMBER() OVER (PARTITION BY run_id ORDER BY snapshot_time DESC, window_s) = 1
),
latest_steps AS (
  SELECT run_id, step_time_p50_s, recent_step_time_p50_s
  FROM ${dataset}.step_stats
  WHERE steps_measured > 0
  QUALIFY ROW_NUMBER() OVER (PARTITION BY run_id ORDER BY snapshot_time DESC) = 1
),
last_step AS (
  SELECT run_id, MAX(event_time) AS last_step_time
  FROM ${dataset}.events
  WHERE kind = 'step_start'
  GROUP BY run_id
),
flagged AS (
  SELECT
    w.run_id,
    w.snapshot_time,
    NOT w.ended AND w.total_time_s > 0 AND w.productive_time_s = 0 AS stalled,
    IFNULL(s.recent_step_time_p50_s > @regression_ratio * s.step_time_p50_s, FALSE) AS regressed,
    SAFE_DIVIDE(s.recent_step_time_p50_s, s.step_time_p50_s) AS step_time_ratio,
    TIMESTAMP_DIFF(w.snapshot_time, t.last_step_time, SECOND) AS since_last_step_s
  FROM latest_window AS w
  LEFT JOIN latest_steps AS s USING (run_id)
  LEFT JOIN last_step AS t USING (run_id)
)
SELECT run_id, snapshot_time, stalled, regressed, ROUND(step_time_ratio, 3) AS step_time_ratio,
  since_last_step_s
FROM flagged
WHERE stalled OR regressed
ORDER BY run_id
