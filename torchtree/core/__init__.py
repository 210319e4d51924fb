"""Run-time basics that know no tree: argument checks (``validate``), counter-based randomness
(``random``), resampling from log-weights (``resampling``) and the count of host reads (``syncs``).

Layer: above ``torchtree.kernels`` / ``torchtree.distributed``, below the model.
"""
