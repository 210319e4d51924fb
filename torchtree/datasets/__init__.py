"""Synthetic data generators used by examples, benchmarks and tests: ``synthetic`` (the papers'
CGM and WU sets) and ``scale`` (a table of any size for the scale benchmark)."""
