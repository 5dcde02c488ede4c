-- Each run's timeline as spans, one row each: what a run's page (goodput report --run RUN) draws as
-- its Gantt chart, so that the same timeline can be drawn from SQL. lane says where a span goes:
-- 'attempt' (attempt_id names it): init, prep, data loading, elastic reinit, the elastic waits
-- (slice down wait, scale-up wait), each custom badput (named by its type, e.g. EVAL_STEP: an eval),
-- checkpoint save and restore (blocking_s long, first_step the checkpoint's) and steps (a stretch of
-- recorded step starts, first_step to last_step, steps_recorded of them; a gap of more than ten
-- times the attempt's median step, and a minute, starts another; the last runs a median step past
-- its last start, not past the attempt's end); 'disruptions': each crash (a point), the wasted
-- progress before it and the recovery to the restart, as the run's latest snapshot counts them;
-- 'anomalies': each hang, slowdown and straggler in its latest state (as latest_anomalies), up to
-- its end, or while it goes on up to the run's latest snapshot (ongoing; lost_s then the time lost
-- so far, a lower bound). Start and end markers pair as the engine pairs them: an end closes the
-- start before it; a start replaces an unclosed one. Times are the events' own.
-- The dataset of the tables is a template parameter, filled in by Terraform and the DuckDB sink.
WITH events AS (
  SELECT run_id, attempt_id, seq, event_time, kind, step, body
  FROM ${dataset}.events
  WHERE kind NOT IN ('heartbeat', 'model_metrics', 'metrics', 'host_steps', 'configs')
  QUALIFY ROW_NUMBER() OVER (PARTITION BY run_id, attempt_id, seq) = 1
),
markers AS (
  SELECT run_id, attempt_id, seq, event_time, ENDS_WITH(kind, '_start') AS opens,
    CASE REGEXP_REPLACE(kind, '_(start|end)$', '')
      WHEN 'tpu_init' THEN 'init'
      WHEN 'training_prep' THEN 'prep'
      WHEN 'data_loading' THEN 'data loading'
      WHEN 'elastic_reinit' THEN 'elastic reinit'
      WHEN 'custom_badput' THEN IFNULL(NULLIF(JSON_VALUE(body, '$.badput_type'), ''), 'unknown')
      ELSE IF(STRPOS(LOWER(IFNULL(JSON_VALUE(body, '$.event_type'), '')), 'scale_up') > 0,
              'scale-up wait', 'slice down wait')
    END AS label
  FROM events
  WHERE REGEXP_CONTAINS(kind, r'^(tpu_init|training_prep|data_loading|elastic_reinit|custom_badput|elastic_wait)_(start|end)$')
),
paired AS (
  SELECT run_id, attempt_id, label, opens, event_time AS ended_at,
    LAG(opens) OVER edges AS after_start, LAG(event_time) OVER edges AS started_at
  FROM markers
  WINDOW edges AS (PARTITION BY run_id, attempt_id, label ORDER BY event_time, seq)
),
step_gaps AS (
  SELECT run_id, attempt_id, seq, event_time, step,
    TIMESTAMP_DIFF(event_time, LAG(event_time) OVER (PARTITION BY run_id, attempt_id ORDER BY event_time, seq),
                   MICROSECOND) AS gap_us
  FROM events
  WHERE kind = 'step_start'
),
step_medians AS (
  SELECT *, IFNULL(PERCENTILE_CONT(gap_us, 0.5) OVER (PARTITION BY run_id, attempt_id), 0) AS median_us
  FROM step_gaps
),
stretched AS (
  SELECT *,
    SUM(IF(gap_us IS NULL OR gap_us > GREATEST(60000000, 10 * median_us), 1, 0)) OVER (
      PARTITION BY run_id, attempt_id ORDER BY event_time, seq) AS stretch
  FROM step_medians
),
stretch_edges AS (
  SELECT *,
    FIRST_VALUE(step) OVER (PARTITION BY run_id, attempt_id, stretch ORDER BY event_time, seq
                            ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING) AS first_step,
    LAST_VALUE(step) OVER (PARTITION BY run_id, attempt_id, stretch ORDER BY event_time, seq
                           ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING) AS last_step
  FROM stretched
),
stretches AS (
  SELECT run_id, attempt_id, stretch, MIN(event_time) AS started_at, MAX(event_time) AS last_time,
    ANY_VALUE(median_us) AS median_us, ANY_VALUE(first_step) AS first_step, ANY_VALUE(last_step) AS last_step,
    COUNT(*) AS steps_recorded
  FROM stretch_edges
  GROUP BY run_id, attempt_id, stretch
),
attempt_ends AS (
  SELECT run_id, attempt_id, MAX(event_time) AS ended_at
  FROM events
  WHERE kind = 'job_end'
  GROUP BY run_id, attempt_id
),
disruptions AS (
  SELECT *,
    TIMESTAMP_SUB(restart_time, INTERVAL CAST(ROUND(IFNULL(recovery_s, 0) * 1e6) AS INT64) MICROSECOND)
      AS failed_at
  FROM ${dataset}.disruptions
  WHERE TRUE
  QUALIFY ROW_NUMBER() OVER (PARTITION BY run_id, disruption_index ORDER BY snapshot_time DESC) = 1
),
latest AS (
  SELECT run_id, MAX(snapshot_time) AS snapshot_time
  FROM ${dataset}.goodput_snapshots
  WHERE window_s = 0
  GROUP BY run_id
),
anomalies AS (
  SELECT *
  FROM ${dataset}.run_anomalies
  WHERE TRUE
  QUALIFY ROW_NUMBER() OVER (
    PARTITION BY run_id, kind, host, started_at ORDER BY changed_at DESC, ended_at IS NULL) = 1
),
spans AS (
  SELECT run_id, attempt_id, 'attempt' AS lane, label AS kind, started_at, ended_at,
    CAST(NULL AS INT64) AS first_step, CAST(NULL AS INT64) AS last_step, CAST(NULL AS INT64) AS steps_recorded,
    CAST(NULL AS FLOAT64) AS median_step_s, CAST(NULL AS FLOAT64) AS blocking_s,
    CAST(NULL AS INT64) AS disruption_index, CAST(NULL AS BOOL) AS in_process,
    CAST(NULL AS STRING) AS host, CAST(NULL AS FLOAT64) AS lost_s, CAST(NULL AS BOOL) AS ongoing
  FROM paired
  WHERE NOT opens AND after_start
  UNION ALL
  SELECT run_id, attempt_id, 'attempt', IF(kind = 'checkpoint_save', 'checkpoint save', 'checkpoint restore'),
    event_time,
    TIMESTAMP_ADD(event_time, INTERVAL CAST(ROUND(
      IFNULL(CAST(JSON_VALUE(body, '$.blocking_s') AS FLOAT64), 0) * 1e6) AS INT64) MICROSECOND),
    CAST(JSON_VALUE(body, '$.step') AS INT64), NULL, NULL, NULL,
    IFNULL(CAST(JSON_VALUE(body, '$.blocking_s') AS FLOAT64), 0), NULL, NULL, NULL, NULL, NULL
  FROM events
  WHERE kind IN ('checkpoint_save', 'checkpoint_restore')
  UNION ALL
  SELECT s.run_id, s.attempt_id, 'attempt', 'steps', s.started_at,
    IF(e.ended_at IS NOT NULL AND s.stretch = MAX(s.stretch) OVER (PARTITION BY s.run_id, s.attempt_id),
       LEAST(TIMESTAMP_ADD(s.last_time, INTERVAL CAST(ROUND(s.median_us) AS INT64) MICROSECOND),
             GREATEST(e.ended_at, s.last_time)),
       TIMESTAMP_ADD(s.last_time, INTERVAL CAST(ROUND(s.median_us) AS INT64) MICROSECOND)),
    s.first_step, s.last_step, s.steps_recorded, s.median_us / 1e6,
    -- typed: beside an analytic function a bare NULL is an INT64
    CAST(NULL AS FLOAT64), NULL, CAST(NULL AS BOOL), CAST(NULL AS STRING), CAST(NULL AS FLOAT64),
    CAST(NULL AS BOOL)
  FROM stretches AS s
  LEFT JOIN attempt_ends AS e ON e.run_id = s.run_id AND e.attempt_id = s.attempt_id
  UNION ALL
  SELECT run_id, NULL, 'disruptions', 'wasted progress',
    TIMESTAMP_SUB(failed_at, INTERVAL CAST(ROUND(wasted_progress_s * 1e6) AS INT64) MICROSECOND), failed_at,
    resume_step, last_step_before, NULL, NULL, NULL, disruption_index, in_process, NULL, wasted_progress_s, NULL
  FROM disruptions
  WHERE wasted_progress_s > 0
  UNION ALL
  SELECT run_id, NULL, 'disruptions', 'crash', failed_at, failed_at, NULL, last_step_before, NULL, NULL, NULL,
    disruption_index, in_process, NULL, NULL, NULL
  FROM disruptions
  UNION ALL
  SELECT run_id, NULL, 'disruptions', 'recovery', failed_at, restart_time, NULL, NULL, NULL, NULL, NULL,
    disruption_index, in_process, NULL, recovery_s, NULL
  FROM disruptions
  UNION ALL
  SELECT a.run_id, NULL, 'anomalies', a.kind, a.started_at,
    COALESCE(a.ended_at, GREATEST(l.snapshot_time, a.changed_at), a.changed_at),
    NULL, NULL, NULL, NULL, NULL, NULL, NULL, a.host,
    IF(a.ended_at IS NULL AND a.kind = 'hang' AND l.snapshot_time IS NOT NULL,
       GREATEST(IFNULL(a.lost_s, 0),
                TIMESTAMP_DIFF(l.snapshot_time, a.started_at, MICROSECOND) / 1e6 - IFNULL(a.baseline_step_s, 0)),
       IFNULL(a.lost_s, 0)),
    a.ended_at IS NULL
  FROM anomalies AS a
  LEFT JOIN latest AS l ON l.run_id = a.run_id
)
SELECT *
FROM spans
