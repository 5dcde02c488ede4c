-- Each run's ML Productivity Goodput (MPG) and its three factors, unrounded: what the saved queries
-- run_productivity (per run) and fleet_productivity (per day and accelerator type) read, so both
-- compute the factors the same way. Fractions from 0 to 1, NULL where nothing is known; the run's
-- lifetime (run_start to run_end) is that of its latest cumulative snapshot. Runtime goodput is the
-- run's own: its latest cumulative goodput_pct / 100. Scheduling goodput is GKE's
-- scheduling_goodput (all the JobSet's pods ready) over the run's lifetime, time-weighted as in
-- jobset_goodput, for a run whose metadata names its JobSet. Program goodput is the run's mean MFU
-- (model_metrics named MFU), else its mean TFLOPS per device over the peak of its accelerator type
-- (accelerator_peaks, its type matched in any letter case); program_from says which. What cannot be a
-- fraction is left out, as the events' limits would have it: NaN and infinite metric values, an MFU
-- outside 0..1 (recorded in percent, say), negative TFLOPS, TFLOPS above the accelerator's peak and a
-- scheduling goodput outside 0..1; a value recorded twice counts once. MPG is the product of the
-- factors known; known_factors names them.
-- The dataset of the tables is a template parameter, filled in by Terraform and the DuckDB sink.
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
  WHERE metric = 'scheduling_goodput' AND value BETWEEN 0 AND 1
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
),
scheduling AS (
  SELECT run_id, SAFE_DIVIDE(SUM(value * weight_s), SUM(weight_s)) AS goodput
  FROM weighted
  GROUP BY run_id
),
metrics AS (
  SELECT DISTINCT run_id, attempt_id, metric_time, step, name, value
  FROM ${dataset}.model_metrics
  WHERE NOT IS_NAN(value) AND NOT IS_INF(value)
    AND ((name = 'MFU' AND value BETWEEN 0 AND 1) OR (name = 'TFLOPS' AND value >= 0))
),
program AS (
  SELECT run_id, AVG(IF(name = 'MFU', value, NULL)) AS mfu, AVG(IF(name = 'TFLOPS', value, NULL)) AS tflops
  FROM metrics
  GROUP BY run_id
),
of_peak AS (
  SELECT l.run_id, SAFE_DIVIDE(m.tflops, k.bf16_tflops_per_chip) AS ratio
  FROM latest AS l
  JOIN program AS m ON m.run_id = l.run_id
  JOIN ${dataset}.accelerator_peaks AS k ON LOWER(k.accelerator_type) = LOWER(l.accelerator_type)
),
factors AS (
  SELECT
    l.run_id, l.accelerator_type, l.chip_count, l.location, l.run_start, l.run_end, l.ended,
    s.goodput AS scheduling,
    l.goodput_pct / 100 AS runtime,
    IFNULL(m.mfu, IF(o.ratio <= 1, o.ratio, NULL)) AS program,
    CASE WHEN m.mfu IS NOT NULL THEN 'MFU' WHEN o.ratio <= 1 THEN 'TFLOPS' END AS program_from
  FROM latest AS l
  LEFT JOIN scheduling AS s ON s.run_id = l.run_id
  LEFT JOIN program AS m ON m.run_id = l.run_id
  LEFT JOIN of_peak AS o ON o.run_id = l.run_id
)
SELECT
  run_id,
  accelerator_type,
  chip_count,
  location,
  run_start,
  run_end,
  ended,
  scheduling AS scheduling_goodput,
  runtime AS runtime_goodput,
  program AS program_goodput,
  program_from,
  IF(COALESCE(scheduling, runtime, program) IS NULL, NULL,
     IFNULL(scheduling, 1) * IFNULL(runtime, 1) * IFNULL(program, 1)) AS ml_productivity_goodput,
  NULLIF(RTRIM(CONCAT(IF(scheduling IS NULL, '', 'scheduling,'), IF(runtime IS NULL, '', 'runtime,'),
                      IF(program IS NULL, '', 'program,')), ','), '') AS known_factors
FROM factors
