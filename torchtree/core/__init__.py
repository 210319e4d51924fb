"""Run-time basics that know no tree: argument checks (``validate``), counter-based randomness
(``random``) and resampling from log-weights (``resampling``).

Layer: above ``torchtree.kernels`` / ``torchtree.distributed``, below the model.
"""
