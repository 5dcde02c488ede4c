-- Each run's ML Productivity Goodput (MPG): scheduling goodput x runtime goodput x program goodput,
-- the product of the factors known (known_factors names them); fractions from 0 to 1, NULL where
-- nothing is known. Runtime goodput is the run's own: its latest cumulative goodput_pct / 100.
-- Scheduling goodput is GKE's scheduling_goodput (all the JobSet's pods ready) over the run's
-- lifetime, time-weighted as in jobset_goodput, for a run whose metadata names its JobSet. Program
-- goodput is the run's mean MFU (model_metrics named MFU), else its mean TFLOPS per device over the
-- peak of its accelerator type (accelerator_peaks); program_from says which. NaN and infinite
-- metric values are left out, and a value recorded twice counts once. The view
-- run_productivity_factors computes the factors (fleet_productivity weighs the same ones).
SELECT
  run_id,
  accelerator_type,
  chip_count,
  location,
  run_start,
  run_end,
  ended,
  ROUND(scheduling_goodput, 4) AS scheduling_goodput,
  ROUND(runtime_goodput, 4) AS runtime_goodput,
  ROUND(program_goodput, 4) AS program_goodput,
  program_from,
  ROUND(ml_productivity_goodput, 4) AS ml_productivity_goodput,
  known_factors
FROM ${dataset}.run_productivity_factors
ORDER BY run_id
