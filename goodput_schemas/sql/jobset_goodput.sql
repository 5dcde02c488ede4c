-- GKE's view of each run on a JobSet beside the run's own: GKE's scheduling goodput (all the
-- JobSet's pods ready) and proxy runtime goodput (all its accelerators busy) over the run's
-- lifetime, in percent, next to the run's latest cumulative goodput_pct. A run is matched to the
-- JobSet its latest metadata names (cluster, namespace, jobset_name; project and jobset_uid too
-- where both sides have them), and its lifetime is window_start to window_end of its latest
-- cumulative snapshot. Each GKE point stands for its sample period, the 60 s before it (or the
-- time since its series' previous point, if less), and weighs as much of that period as lies in
-- the run's lifetime: the goodputs are time-weighted means. *_covered_s: the seconds of the run
-- those points cover, less than its lifetime where GKE wrote none or has not yet (it lags up to
-- an hour). Each point is counted once however often it was imported (goodput import
-- gke-metrics), as in the latest_jobset_metrics view. NULL: no point of that metric in the run.
WITH runs AS (
  SELECT g.run_id, g.window_start AS run_start, g.window_end AS run_end, g.goodput_pct,
    m.project, m.cluster, m.namespace, m.jobset_name, m.jobset_uid
  FROM ${dataset}.goodput_snapshots AS g
  JOIN (
    SELECT run_id, project, cluster, namespace, jobset_name, jobset_uid
    FROM ${dataset}.run_metadata
    WHERE jobset_name IS NOT NULL
    QUALIFY ROW_NUMBER() OVER (PARTITION BY run_id ORDER BY start_time DESC) = 1
  ) AS m ON m.run_id = g.run_id
  WHERE g.window_s = 0
  QUALIFY ROW_NUMBER() OVER (PARTITION BY g.run_id ORDER BY g.snapshot_time DESC) = 1
),
points AS (
  SELECT project, location, cluster, namespace, jobset_name, jobset_uid, metric, end_time, value
  FROM ${dataset}.jobset_metrics
  WHERE metric IN ('scheduling_goodput', 'proxy_runtime_goodput')
  QUALIFY ROW_NUMBER() OVER (
    PARTITION BY project, location, cluster, namespace, jobset_name, jobset_uid, metric, end_time
    ORDER BY imported_at DESC) = 1
),
periods AS (
  SELECT *,
    GREATEST(TIMESTAMP_SUB(end_time, INTERVAL 60 SECOND), IFNULL(LAG(end_time) OVER (
      PARTITION BY project, location, cluster, namespace, jobset_name, jobset_uid, metric ORDER BY end_time),
      TIMESTAMP_SUB(end_time, INTERVAL 60 SECOND))) AS period_start
  FROM points
),
weighted AS (
  SELECT r.run_id, p.metric, p.value,
    TIMESTAMP_DIFF(LEAST(p.end_time, r.run_end), GREATEST(p.period_start, r.run_start), MICROSECOND) / 1e6
      AS weight_s
  FROM runs AS r
  JOIN periods AS p
    ON p.cluster = r.cluster AND p.namespace = r.namespace AND p.jobset_name = r.jobset_name
    AND (r.project IS NULL OR p.project = r.project)
    AND (r.jobset_uid IS NULL OR p.jobset_uid IS NULL OR p.jobset_uid = r.jobset_uid)
    AND p.end_time > r.run_start AND p.period_start < r.run_end
  WHERE p.value IS NOT NULL
),
by_run AS (
  SELECT
    run_id,
    SUM(IF(metric = 'scheduling_goodput', value * weight_s, 0)) AS scheduling_sum,
    SUM(IF(metric = 'scheduling_goodput', weight_s, 0)) AS scheduling_covered_s,
    SUM(IF(metric = 'proxy_runtime_goodput', value * weight_s, 0)) AS runtime_sum,
    SUM(IF(metric = 'proxy_runtime_goodput', weight_s, 0)) AS runtime_covered_s
  FROM weighted
  GROUP BY run_id
)
SELECT
  r.run_id,
  r.cluster,
  r.namespace,
  r.jobset_name,
  r.run_start,
  r.run_end,
  ROUND(r.goodput_pct, 3) AS goodput_pct,
  ROUND(100 * SAFE_DIVIDE(b.scheduling_sum, b.scheduling_covered_s), 3) AS gke_scheduling_goodput_pct,
  ROUND(100 * SAFE_DIVIDE(b.runtime_sum, b.runtime_covered_s), 3) AS gke_proxy_runtime_goodput_pct,
  ROUND(IFNULL(b.scheduling_covered_s, 0), 3) AS scheduling_covered_s,
  ROUND(IFNULL(b.runtime_covered_s, 0), 3) AS proxy_runtime_covered_s
FROM runs AS r
LEFT JOIN by_run AS b ON b.run_id = r.run_id
ORDER BY r.run_id
