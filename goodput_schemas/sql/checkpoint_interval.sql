-- Each run's checkpoint interval against the optimum for its failure rate: Young's
-- sqrt(2 * save * MTBF) and Daly's higher-order estimate, from the raw checkpoint_save events
-- (their blocking seconds, and the time between saves of one attempt) and the MTBF of the run, or
-- of its accelerator type where the run has had no disruption. interval_vs_daly above 1: saving
-- less often than optimal; below 1: more often. Each event counts once however often it was
-- written (by its run, attempt and sequence number: a retried or repeated write into BigQuery, or a
-- redelivered message, may hold it twice).
WITH checkpoint_saves AS (
  SELECT run_id, attempt_id, event_time, body
  FROM ${dataset}.events
  WHERE kind = 'checkpoint_save'
  QUALIFY ROW_NUMBER() OVER (PARTITION BY run_id, attempt_id, seq) = 1
),
saves AS (
  SELECT
    run_id,
    CAST(JSON_VALUE(body, '$.blocking_s') AS FLOAT64) AS save_s,
    TIMESTAMP_DIFF(event_time, LAG(event_time) OVER (PARTITION BY run_id, attempt_id ORDER BY event_time), SECOND)
      AS gap_s
  FROM checkpoint_saves
),
per_run AS (
  SELECT run_id, COUNT(*) AS saves, AVG(save_s) AS save_s, AVG(gap_s) AS interval_s
  FROM saves
  GROUP BY run_id
),
latest AS (
  SELECT run_id, IFNULL(accelerator_type, 'unknown') AS accelerator_type, disruptions, total_time_s
  FROM ${dataset}.goodput_snapshots
  WHERE window_s = 0
  QUALIFY ROW_NUMBER() OVER (PARTITION BY run_id ORDER BY snapshot_time DESC) = 1
),
fleet AS (
  SELECT accelerator_type, SAFE_DIVIDE(SUM(total_time_s), SUM(disruptions)) AS mtbf_s
  FROM latest
  GROUP BY accelerator_type
),
joined AS (
  SELECT p.run_id, l.accelerator_type, p.saves, p.save_s, p.interval_s,
    COALESCE(SAFE_DIVIDE(l.total_time_s, l.disruptions), f.mtbf_s) AS mtbf_s
  FROM per_run AS p
  JOIN latest AS l USING (run_id)
  LEFT JOIN fleet AS f USING (accelerator_type)
),
optimum AS (
  SELECT *,
    SQRT(2 * save_s * mtbf_s) AS young_s,
    IF(save_s < 2 * mtbf_s,
       SQRT(2 * save_s * mtbf_s) * (1 + SQRT(save_s / (2 * mtbf_s)) / 3 + save_s / (2 * mtbf_s) / 9) - save_s,
       mtbf_s) AS daly_s
  FROM joined
)
SELECT
  run_id,
  accelerator_type,
  saves,
  ROUND(save_s, 3) AS save_s,
  ROUND(interval_s, 1) AS interval_s,
  ROUND(mtbf_s, 1) AS mtbf_s,
  ROUND(young_s, 1) AS young_s,
  ROUND(daly_s, 1) AS daly_s,
  ROUND(SAFE_DIVIDE(interval_s, daly_s), 3) AS interval_vs_daly
FROM optimum
ORDER BY run_id
