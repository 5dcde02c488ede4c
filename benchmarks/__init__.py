"""Benchmarks: ``make bench`` (``python -m benchmarks``) measures and writes BENCHMARKS.md."""
