"""The fleet goodput pipeline: parses and validates event messages from training jobs."""
