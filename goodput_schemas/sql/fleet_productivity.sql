-- Chip-weighted ML Productivity Goodput (MPG) of the fleet and each of its factors, by day and
-- accelerator type: each run's factors as run_productivity computes them (over its lifetime, from
-- the view run_productivity_factors), weighted on each day by its chips times the seconds of its
-- lifetime within that day (UTC), so a run crossing midnight counts in both days for its time in
-- each. A factor is the weighted mean over the runs that know it; MPG the weighted mean of the
-- runs' own MPG (the product of the factors each knows); runs_with_every_factor counts the runs
-- that know all three. Runs of unknown chips weigh nothing. Fractions from 0 to 1.
WITH days AS (
  SELECT DATE(day_start) AS day, f.accelerator_type,
    f.scheduling_goodput AS scheduling, f.runtime_goodput AS runtime, f.program_goodput AS program,
    f.ml_productivity_goodput AS mpg,
    f.chip_count * TIMESTAMP_DIFF(LEAST(f.run_end, TIMESTAMP_ADD(day_start, INTERVAL 1 DAY)),
                                  GREATEST(f.run_start, day_start), MICROSECOND) / 1e6 AS chip_s
  FROM ${dataset}.run_productivity_factors AS f
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
