-- Each point of GKE's JobSet metrics once, as last imported: two imports at once (goodput import
-- gke-metrics) may append a point twice.
-- The dataset of the tables is a template parameter, filled in by Terraform and the DuckDB sink.
SELECT *
FROM ${dataset}.jobset_metrics
WHERE TRUE
QUALIFY ROW_NUMBER() OVER (
  PARTITION BY project, location, cluster, namespace, jobset_name, jobset_uid, metric, end_time
  ORDER BY imported_at DESC) = 1
