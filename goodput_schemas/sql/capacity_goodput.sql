-- Goodput over paid capacity and idle capacity, by day (UTC) and accelerator type: chip-hours paid
-- for (the capacity table: goodput import capacity), used (each run's chips times its lifetime
-- within the day, from its latest cumulative snapshot) and productive (used times the run's
-- cumulative goodput); productive over paid, and the idle share, 1 - used / paid (below 0 where runs
-- used more than was paid for). Spans crossing midnight count in each day for their time in it;
-- capacity counts up to the fleet's latest snapshot, as the runs do. Locations are summed; a span
-- imported again counts once, as last imported. Accelerator types and locations are compared
-- lower-cased, as goodput import capacity stores them: V5P is v5p.
WITH as_of AS (
  SELECT MAX(snapshot_time) AS as_of
  FROM ${dataset}.goodput_snapshots
),
imported AS (
  SELECT LOWER(accelerator_type) AS accelerator_type, start_time, end_time, chips
  FROM ${dataset}.capacity
  WHERE TRUE
  QUALIFY ROW_NUMBER() OVER (
    PARTITION BY LOWER(accelerator_type), LOWER(location), start_time, end_time ORDER BY imported_at DESC) = 1
),
spans AS (
  SELECT i.accelerator_type, i.start_time, LEAST(i.end_time, IFNULL(a.as_of, i.end_time)) AS end_time, i.chips
  FROM imported AS i
  CROSS JOIN as_of AS a
),
paid AS (
  SELECT DATE(day_start) AS day, s.accelerator_type,
    SUM(s.chips * TIMESTAMP_DIFF(LEAST(s.end_time, TIMESTAMP_ADD(day_start, INTERVAL 1 DAY)),
                                 GREATEST(s.start_time, day_start), MICROSECOND) / 1e6) AS paid_chip_s
  FROM spans AS s
  CROSS JOIN UNNEST(GENERATE_TIMESTAMP_ARRAY(TIMESTAMP_TRUNC(s.start_time, DAY), s.end_time, INTERVAL 1 DAY))
    AS day_start
  WHERE s.end_time > s.start_time AND day_start < s.end_time
  GROUP BY day, accelerator_type
),
runs AS (
  SELECT LOWER(accelerator_type) AS accelerator_type, chip_count, window_start AS run_start, window_end AS run_end,
    IFNULL(goodput_pct, 0) / 100 AS runtime
  FROM ${dataset}.goodput_snapshots
  WHERE window_s = 0
  QUALIFY ROW_NUMBER() OVER (PARTITION BY run_id ORDER BY snapshot_time DESC) = 1
),
used AS (
  SELECT DATE(day_start) AS day, r.accelerator_type,
    SUM(r.chip_count * TIMESTAMP_DIFF(LEAST(r.run_end, TIMESTAMP_ADD(day_start, INTERVAL 1 DAY)),
                                      GREATEST(r.run_start, day_start), MICROSECOND) / 1e6) AS used_chip_s,
    SUM(r.chip_count * r.runtime * TIMESTAMP_DIFF(LEAST(r.run_end, TIMESTAMP_ADD(day_start, INTERVAL 1 DAY)),
                                                  GREATEST(r.run_start, day_start), MICROSECOND) / 1e6)
      AS productive_chip_s
  FROM runs AS r
  CROSS JOIN UNNEST(GENERATE_TIMESTAMP_ARRAY(TIMESTAMP_TRUNC(r.run_start, DAY), r.run_end, INTERVAL 1 DAY))
    AS day_start
  WHERE day_start < r.run_end
  GROUP BY day, accelerator_type
)
SELECT
  p.day,
  p.accelerator_type,
  ROUND(p.paid_chip_s / 3600, 3) AS paid_chip_hours,
  ROUND(IFNULL(u.used_chip_s, 0) / 3600, 3) AS used_chip_hours,
  ROUND(IFNULL(u.productive_chip_s, 0) / 3600, 3) AS productive_chip_hours,
  ROUND(SAFE_DIVIDE(IFNULL(u.productive_chip_s, 0), p.paid_chip_s), 4) AS goodput_over_paid,
  ROUND(1 - SAFE_DIVIDE(IFNULL(u.used_chip_s, 0), p.paid_chip_s), 4) AS idle_share
FROM paid AS p
LEFT JOIN used AS u ON u.day = p.day AND u.accelerator_type = p.accelerator_type
ORDER BY p.day, p.accelerator_type
