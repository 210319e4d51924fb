"""Samplers: loops, adaptation and bookkeeping over the steps.

protocol     the sampler contract (``SamplerConfig``; ``init`` / ``step`` / ``finalize``)
driver       the one ``run()``: device, threads, seed, backend, checkpoints, monitors, time budget
topdown      top-down SMC (paper 001); ``topdown_dist`` its multi-rank layout
mcmc         Metropolis-Hastings over trees, many chains in one batch
smc_moves    SMC sampler with grow / prune / change / swap moves (paper 002)
nuts         ``NUTS`` / ``HMC`` on soft trees; ``soft_chains`` their warm-up and draw loops
dcc          ``DCC``: Divide-Conquer-Combine over soft-tree topologies (paper 004)

Layer: above the steps and the model; imports nothing from the faces (estimators, CLI, Pyro).
"""
