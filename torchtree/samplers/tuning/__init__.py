"""Runs that tune or start another run.

evidence     hyperparameters by the evidence of top-down SMC pilot runs (``hyper="evidence"``)
starts       starting trees drawn from a top-down SMC run (``init="topdown"`` of MCMC,
             ``init_prior="topdown"`` of SMC with moves), run as a recorded sub-run
"""
