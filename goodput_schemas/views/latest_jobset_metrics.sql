-- Each point of GKE's JobSet metrics once, as last imported: an import over a range already
-- imported (goodput import gke-metrics, or the stream's) appends its points again.
-- The dataset of the tables is a template parameter, filled in by Terraform and the DuckDB sink.
SELECT *
FROM ${dataset}.jobset_metrics
WHERE TRUE
QUALIFY ROW_NUMBER() OVER (
  PARTITION BY project, location, cluster, namespace, jobset_name, jobset_uid, metric, end_time
  ORDER BY imported_at DESC) = 1
