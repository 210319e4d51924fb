"""Run-time basics that know no tree: argument checks (``validate``), counter-based randomness
(``random``), resampling from log-weights (``resampling``), the SMC engine (``smc``), torch's threads
(``threads``), the count of host reads (``syncs``), the prediction memory budget (``budget``), memory
estimates made before allocating (``memory``), warnings attributed to the user's line (``warn``) and
the work clock (``work``).

Layer: above ``torchtree.kernels`` / ``torchtree.distributed``, below the model.
"""
