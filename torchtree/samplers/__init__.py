"""Samplers: loops, adaptation and bookkeeping over the steps.

protocol     the sampler contract: ``SamplerConfig`` and ``option``, ``SamplerState``, the hooks
base         ``SamplerBase``: every hook of a run declared with its default
presets      data-dependent defaults: ``"auto"`` settings, ``Preset``, ``RunShape``, the table sizes
driver       the one ``run()`` (device, threads, seed, backend, checkpoints, monitors, time budget)
             and ``sub_run`` for runs nested in another

One subpackage per method, each with ``config`` (settings and presets), ``state`` (set-up objects
and the state a checkpoint saves) and ``sampler``:

topdown      top-down SMC (paper 001); ``particles``: the particle codec across ranks
mcmc         Metropolis-Hastings over trees, many chains in one batch
smc_moves    SMC sampler with grow / prune / change / swap moves (paper 002)
nuts         ``NUTS`` / ``HMC`` on soft trees; ``chains``: their warm-up and draw loops
dcc          ``DCC``: Divide-Conquer-Combine over soft-tree topologies (paper 004)
bart         BART: sums of trees by backfitting MCMC or Particle Gibbs

tuning       runs that tune or start another: ``evidence`` (hyperparameters by the evidence of
             top-down pilots), ``starts`` (starting trees drawn from a top-down run)

Layer: above the steps and the model; imports nothing from the faces (estimators, CLI, Pyro).
"""
