"""Synthetic data generators (``synthetic``) used by examples, benchmarks and tests."""
