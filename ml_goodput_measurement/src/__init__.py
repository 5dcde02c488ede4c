"""The reference's module paths (``ml_goodput_measurement.src.goodput`` and the rest)."""
