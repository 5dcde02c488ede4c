-- The runs of one run group side by side: each run's latest cumulative goodput, the user configs
-- whose values differ between the runs (a key that some runs lack differs too: their value is
-- NULL), and each metric's last value (at the highest step, else the latest time) and its mean
-- over the run. One row per item, name and run, the runs in the order they started: item is
-- goodput (last_value), config (value) or metric (last_value, last_step, mean_value; NaN where
-- the run recorded a NaN). A run's config is the value it recorded last for the key; rows that a
-- redelivered message repeated count once.
-- @run_group STRING = NULL: the run group compared (NULL: the group of the run that started last)
WITH chosen AS (
  SELECT run_group
  FROM ${dataset}.run_metadata
  WHERE run_group IS NOT NULL AND run_group = IFNULL(@run_group, run_group)
  QUALIFY ROW_NUMBER() OVER (ORDER BY start_time DESC, run_id DESC) = 1
),
runs AS (
  SELECT m.run_id, MIN(m.run_group) AS run_group, MIN(m.run_name) AS run_name, MIN(m.start_time) AS started_at
  FROM ${dataset}.run_metadata AS m
  JOIN chosen AS c ON m.run_group = c.run_group
  GROUP BY m.run_id
),
latest AS (
  SELECT g.run_id, g.goodput_pct
  FROM ${dataset}.goodput_snapshots AS g
  JOIN runs AS r ON r.run_id = g.run_id
  WHERE g.window_s = 0
  QUALIFY ROW_NUMBER() OVER (PARTITION BY g.run_id ORDER BY g.snapshot_time DESC) = 1
),
configs AS (
  SELECT c.run_id, c.key, c.value
  FROM ${dataset}.run_configs AS c
  JOIN runs AS r ON r.run_id = c.run_id
  WHERE c.source = 'user'
  QUALIFY ROW_NUMBER() OVER (PARTITION BY c.run_id, c.key ORDER BY c.recorded_at DESC, c.value DESC) = 1
),
differing AS (
  SELECT key
  FROM configs
  GROUP BY key
  HAVING COUNT(DISTINCT value) > 1 OR COUNT(*) < (SELECT COUNT(*) FROM runs)
),
metrics AS (
  SELECT DISTINCT m.run_id, m.attempt_id, m.metric_time, m.step, m.name, m.value
  FROM ${dataset}.model_metrics AS m
  JOIN runs AS r ON r.run_id = m.run_id
),
last_metrics AS (
  SELECT run_id, name, step, value, AVG(value) OVER (PARTITION BY run_id, name) AS mean_value
  FROM metrics
  WHERE TRUE
  QUALIFY ROW_NUMBER() OVER (PARTITION BY run_id, name ORDER BY step DESC NULLS LAST, metric_time DESC) = 1
),
items AS (
  SELECT 'goodput' AS item, 'goodput_pct' AS name, r.run_id, CAST(NULL AS STRING) AS value,
    l.goodput_pct AS last_value, CAST(NULL AS INT64) AS last_step, CAST(NULL AS FLOAT64) AS mean_value
  FROM runs AS r
  LEFT JOIN latest AS l ON l.run_id = r.run_id
  UNION ALL
  SELECT 'config', d.key, r.run_id, c.value, NULL, NULL, NULL
  FROM differing AS d
  CROSS JOIN runs AS r
  LEFT JOIN configs AS c ON c.run_id = r.run_id AND c.key = d.key
  UNION ALL
  SELECT 'metric', n.name, r.run_id, NULL, m.value, m.step, m.mean_value
  FROM (SELECT DISTINCT name FROM last_metrics) AS n
  CROSS JOIN runs AS r
  LEFT JOIN last_metrics AS m ON m.run_id = r.run_id AND m.name = n.name
)
SELECT r.run_group, i.item, i.name, i.run_id, r.run_name, r.started_at, i.value, i.last_value, i.last_step,
  i.mean_value
FROM items AS i
JOIN runs AS r ON r.run_id = i.run_id
ORDER BY CASE i.item WHEN 'goodput' THEN 0 WHEN 'config' THEN 1 ELSE 2 END, i.name, r.started_at, i.run_id
