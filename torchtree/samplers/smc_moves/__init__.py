"""SMC sampler over complete trees with grow / prune / change / swap moves (paper 002, Alg. 4).

Every particle is a complete tree. Initial particles are drawn from the Chipman
prior and weighted by eq. 4b, ``w_0 = pi(t_0) / q_0(t_0)`` (the likelihood, for the
Chipman target). Each of the ``n_iterations`` iterations proposes one move per
particle and multiplies its weight by eq. 5b,

    w_k = w_{k-1} * pi(t_k) q(t_{k-1} | t_k) / (pi(t_{k-1}) q(t_k | t_{k-1})),

i.e. an SMC sampler with a fixed target and the reverse proposal as backward
kernel; weights are normalised and the particles resampled whenever the ESS
falls below ``ess_threshold * n_particles``. A proposal that is impossible under
the prior (an empty node, ...) keeps its particle with incremental weight one:
that is the kernel's atom at the current tree, so the weights stay exact and no
particle is killed for it.

``mh_step=True`` gives the resample-move variant: every proposal goes through a
Metropolis-Hastings accept/reject step, which leaves the target invariant, so
the incremental weights are one and the particles only carry the initial
importance weights (resampled away when they are degenerate).

Unlike the published code, predictions use the final weights; the paper's
accuracy figure (mean accuracy of the individual particles) is available from
:func:`per_particle_accuracy`.

Ranks
-----
With ``backend=`` (a :class:`torchtree.distributed.Backend`) every rank holds
``n = n_particles / world_size`` particles, global indices ``[rank n, (rank+1) n)``,
and the full training data. Every random draw of a particle is keyed by its global
index (:func:`torchtree.core.random.keyed_uniform`), normalisation, ESS and evidence come
from ``all_reduce`` s, resampling from :func:`torchtree.distributed.ncopies_from_log_weights`
followed by :func:`torchtree.distributed.redistribute` of the padded tree blocks (with
their per-node caches and per-particle state). Each iteration costs two small
collectives (a max and an integer sum; the tempering variant adds two per
temperature search round) plus the resampling's when it resamples.

Exactness. The result does not depend on the number of ranks: the same seed gives
bit-identical particles, weights, log evidence and predictions on 1, 2 or 8 ranks.
Sums of weights are taken in exact integer arithmetic
(:func:`torchtree.distributed.exact.global_stats`): each weight is turned into
the fixed-point integer ``round(2^B exp(logw - max))`` by
:func:`torchtree.distributed.fixed_point_weights` (a pure function of the element,
``B = 62 - ceil(log2 N)``), and int64 sums are associative. Weights below
``2^-B`` of the largest (``2^-52`` at N = 1024) count as zero in the ESS and the
evidence (a relative error below ``N 2^-B``). Capacities of the padded trees are
agreed across ranks every iteration, so every tensor op runs on the same shapes as
on one rank. Resampling puts the copies in canonical order (output slot ``j`` holds
a copy of the ``j``-th ancestor in increasing order), the order of ``redistribute``.
``resampling="systematic"`` and ``"multinomial"`` use the distributed ``ncopies``;
``"stratified"`` and ``"residual"`` all-gather the ``N`` log-weights (8 bytes each) and
draw the same global ancestors on every rank.

After the run every rank holds the *global* posterior (trees without the caches
``all_gather`` -ed, ``N x capacity`` nodes per rank). Monitors are written by rank 0.

Checkpoints
-----------
``checkpoint=path`` saves, every ``checkpoint_every`` iterations (and after the
last), everything a bit-identical continuation needs: this rank's trees with their
caches, log-weights, tempering log-likelihoods, the log evidence, the temperature,
the iteration and the traces (plain tensors and lists, loaded with
``weights_only=True``); there is no generator state to keep since every draw is
keyed. A later ``run`` with the same settings, data and seed (and world size)
resumes after the saved iteration (the driver, :func:`torchtree.samplers.driver.run`,
owns the checkpoint file; :class:`SMCSamplerState` is what it saves); a different run's checkpoint is a
:class:`~torchtree.io.checkpoint.CheckpointError`. Multi-rank runs write one file per
rank plus a manifest (:class:`~torchtree.io.checkpoint.Checkpointer`).
"""
from torchtree.samplers.smc_moves.config import SMCSamplerConfig, Stream
from torchtree.samplers.smc_moves.sampler import SMCSampler, per_particle_accuracy
from torchtree.samplers.smc_moves.state import SMCSamplerSetup, SMCSamplerState

__all__ = ["SMCSampler", "SMCSamplerConfig", "SMCSamplerSetup", "SMCSamplerState", "Stream", "per_particle_accuracy"]
