-- Chip-weighted ML Productivity Goodput (MPG) of the fleet and each of its factors, by day and
-- accelerator type: each run's factors as run_productivity computes them (over its lifetime),
-- weighted on each day by its chips times the seconds of its lifetime within that day (UTC), so a
-- run crossing midnight counts in both days for its time in each. A factor is the weighted mean over
-- the runs that know it; MPG the weighted mean of the runs' own MPG (the product of the factors each
-- knows); runs_with_every_factor counts the runs that know all three. Runs of unknown chips weigh
-- nothing. Fractions from 0 to 1.
WITH latest AS (
  SELECT run_id, accelerator_type, chip_count, location, window_start AS run_start, window_end AS run_end,
    ended, goodput_pct
  FROM ${dataset}.goodput_snapshots
  WHERE window_s = 0
  QUALIFY ROW_NUMBER() OVER (PARTITION BY run_id ORDER BY snapshot_time DESC) = 1
),
jobsets AS (
  SELECT run_id, project, cluster, namespace, jobset_name, jobset_uid
  FROM ${dataset}.run_metadata
  WHERE jobset_name IS NOT NULL
  QUALIFY ROW_NUMBER() OVER (PARTITION BY run_id ORDER BY start_time DESC) = 1
),
points AS (
  SELECT project, location, cluster, namespace, jobset_name, jobset_uid, end_time, value
  FROM ${dataset}.jobset_metrics
  WHERE metric = 'scheduling_goodput'
  QUALIFY ROW_NUMBER() OVER (
    PARTITION BY project, location, cluster, namespace, jobset_name, jobset_uid, end_time
    ORDER BY imported_at DESC) = 1
),
periods AS (
  SELECT *,
    GREATEST(TIMESTAMP_SUB(end_time, INTERVAL 60 SECOND), IFNULL(LAG(end_time) OVER (
      PARTITION BY project, location, cluster, namespace, jobset_name, jobset_uid ORDER BY end_time),
      TIMESTAMP_SUB(end_time, INTERVAL 60 SECOND))) AS period_start
  FROM points
),
weighted AS (
  SELECT l.run_id, p.value,
    TIMESTAMP_DIFF(LEAST(p.end_time, l.run_end), GREATEST(p.period_start, l.run_start), MICROSECOND) / 1e6
      AS weight_s
  FROM latest AS l
  JOIN jobsets AS j ON j.run_id = l.run_id
  JOIN periods AS p
    ON p.cluster = j.cluster AND p.namespace = j.namespace AND p.jobset_name = j.jobset_name
    AND (j.project IS NULL OR p.project = j.project)
    AND (j.jobset_uid IS NULL OR p.jobset_uid IS NULL OR p.jobset_uid = j.jobset_uid)
    AND p.end_time > l.run_start AND p.period_start < l.run_end
  WHERE p.value IS NOT NULL
),
scheduling AS (
  SELECT run_id, SAFE_DIVIDE(SUM(value * weight_s), SUM(weight_s)) AS goodput
  FROM weighted
  GROUP BY run_id
),
metrics AS (
  SELECT DISTINCT run_id, attempt_id, metric_time, step, name, value
  FROM ${dataset}.model_metrics
  WHERE name IN ('MFU', 'TFLOPS') AND NOT IS_NAN(value) AND NOT IS_INF(value)
),
program AS (
  SELECT run_id, AVG(IF(name = 'MFU', value, NULL)) AS mfu, AVG(IF(name = 'TFLOPS', value, NULL)) AS tflops
  FROM metrics
  GROUP BY run_id
),
factors AS (
  SELECT
    l.run_id, l.accelerator_type, l.chip_count, l.location, l.run_start, l.run_end, l.ended,
    s.goodput AS scheduling,
    l.goodput_pct / 100 AS runtime,
    IFNULL(m.mfu, SAFE_DIVIDE(m.tflops, k.bf16_tflops_per_chip)) AS program,
    CASE WHEN m.mfu IS NOT NULL THEN 'MFU'
      WHEN SAFE_DIVIDE(m.tflops, k.bf16_tflops_per_chip) IS NOT NULL THEN 'TFLOPS' END AS program_from
  FROM latest AS l
  LEFT JOIN scheduling AS s ON s.run_id = l.run_id
  LEFT JOIN program AS m ON m.run_id = l.run_id
  LEFT JOIN ${dataset}.accelerator_peaks AS k ON k.accelerator_type = l.accelerator_type
),
days AS (
  SELECT f.*, DATE(day_start) AS day,
    f.chip_count * TIMESTAMP_DIFF(LEAST(f.run_end, TIMESTAMP_ADD(day_start, INTERVAL 1 DAY)),
                                  GREATEST(f.run_start, day_start), MICROSECOND) / 1e6 AS chip_s,
    IF(COALESCE(f.scheduling, f.runtime, f.program) IS NULL, NULL,
       IFNULL(f.scheduling, 1) * IFNULL(f.runtime, 1) * IFNULL(f.program, 1)) AS mpg
  FROM factors AS f
  CROSS JOIN UNNEST(GENERATE_TIMESTAMP_ARRAY(TIMESTAMP_TRUNC(f.run_start, DAY), f.run_end, INTERVAL 1 DAY))
    AS day_start
  WHERE day_start < f.run_end
)
SELECT
  day,
  IFNULL(accelerator_type, 'unknown') AS accelerator_type,
  COUNT(*) AS runs,
  COUNTIF(scheduling IS NOT NULL AND runtime IS NOT NULL AND program IS NOT NULL) AS runs_with_every_factor,
  ROUND(SUM(chip_s) / 3600, 3) AS chip_hours,
  ROUND(SAFE_DIVIDE(SUM(chip_s * scheduling), SUM(IF(scheduling IS NULL, 0, chip_s))), 4) AS scheduling_goodput,
  ROUND(SAFE_DIVIDE(SUM(chip_s * runtime), SUM(IF(runtime IS NULL, 0, chip_s))), 4) AS runtime_goodput,
  ROUND(SAFE_DIVIDE(SUM(chip_s * program), SUM(IF(program IS NULL, 0, chip_s))), 4) AS program_goodput,
  ROUND(SAFE_DIVIDE(SUM(chip_s * mpg), SUM(IF(mpg IS NULL, 0, chip_s))), 4) AS ml_productivity_goodput
FROM days
GROUP BY 1, 2
ORDER BY 1, 2
