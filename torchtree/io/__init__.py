"""Files: crash-safe checkpoints and posterior files (``checkpoint``; ``integrity``: checksums sealed into
them; ``fingerprint``: the run hashes checkpoints store; ``lock``: one run per checkpoint), CSV tables
(``csv``; ``cells``: the text that spells a missing value; ``features``: a prediction file's columns
matched to the model's).

Layer: beside ``torchtree.core``; knows tensors, files and backends, not trees or samplers.
"""
