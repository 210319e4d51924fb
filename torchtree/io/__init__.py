"""Files: crash-safe checkpoints and posterior files (``checkpoint``), CSV tables (``csv``).

Layer: beside ``torchtree.core``; knows tensors, files and backends, not trees or samplers.
"""
