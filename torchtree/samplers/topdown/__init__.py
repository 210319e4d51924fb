"""Top-down particle filtering for Bayesian decision trees (paper 001).

Stage ``i`` targets the posterior under the prior truncated at stage ``i``.
Every particle grows its tree node by node (``expansion="node"``: the oldest
open leaf, i.e. breadth-first; since children are appended, that is node ``i``
at stage ``i``) or layer by layer (``expansion="layer"``: every open leaf of the
shallowest open depth). Incremental weights:

* ``prior``: ``l(Y_left) l(Y_right) / l(Y_node)`` on a split, 1 on a stop;
* ``empirical``: the same times ``(U - 1) gap / range`` (prior over proposal
  density of the cut, U distinct values in the node);
* ``optimal``: the normaliser of the one-step optimal proposal over
  ``l(Y_node)`` (sec. 3.1).

The running product of the mean incremental weights estimates ``p(Y | X)``.
Islands are independent filters sharing ``n_particles`` equally; their evidence
is combined by log-mean-exp and their posteriors averaged.

Ranks
-----
A multi-rank :class:`~torchtree.samplers.topdown.TopDownSMC` run goes through the same driver
(:func:`torchtree.samplers.driver.run`) and the same ``step`` as a one-process run; its
backend has more than one rank. This page documents how particles are laid out and moved. Every rank holds the full training data and
``n = n_particles / world_size`` particles with global indices ``rank * n + i``; every random
draw is keyed by the global index (``torchtree.core.random.keyed_uniform``), so the same seed gives
the same particles on 1, 2 or 8 ranks.

Layouts
-------
``"islands"`` (``n_islands`` a multiple of ``world_size``)
    Whole islands live on one rank (rank ``r`` holds islands ``r I/W .. (r+1) I/W - 1``). An
    island's weights, ESS, evidence and resampling are local; per stage the ranks exchange one
    integer (an ``all_reduce`` of the number of nodes still open, ~0.1 ms with gloo on one
    host), so that they run the same stages, end together and checkpoint at the same stages.
    A rank whose trees are finished keeps doing the (cheap, weights-only) bookkeeping of the
    stages the slowest rank still runs, exactly as the one-process filter does for its
    finished islands.
``"gathered"`` (any other ``n_islands``; requires only ``world_size | n_particles``)
    Islands may span ranks (an island of ``m`` particles is split over the ranks that hold
    global indices ``[i m, (i+1) m)``). Every stage does one ``all_gather`` of the local
    incremental log-weights (``8 n`` bytes per rank, ``8 n_particles`` received by every
    rank; 8 MB per stage at a million particles), after which every rank holds the global
    log-weights and computes normalisation, ESS, evidence and resampling decisions with the
    very tensor operations of the one-process filter (same shapes, same order), hence the
    same bits. Resampling: every rank draws the same global ancestors with the same
    generator (``derive_seed(seed, 1, stage, island)``), puts them in canonical order
    (:func:`~torchtree.samplers.topdown.canonical_ancestors`, the order of
    :func:`torchtree.distributed.redistribute`), and particles whose ancestor lives on
    another rank arrive through ``redistribute`` (``method="auto"``: all-to-all).

Moving particles
----------------
A particle is a row of node uids into its rank's :class:`~torchtree.steps.growth.NodeTable`,
meaningless elsewhere. The sender exports the trees that leave it as padded arrays
(:func:`export_particles`: feature, threshold, left, right, parent slot, depth, status,
statistics, point count, sender uid); the receiver creates local uids for them
(:func:`import_particles`; one per distinct (sender, uid), so copies of one tree share nodes
again) with the data-derivation rule of each node taken from its parent's split, and
rebuilds the point lists the open nodes' expansion will need from the root
(:func:`materialise_ancestors`, vectorised over nodes, one pass per depth level). Rebuilding
costs the data of the imported internal nodes, at most ``N x depth`` per distinct imported
tree, paid only for particles that change rank.

Results
-------
Every rank returns the *global* posterior: the final trees are packed into one buffer and
``all_gather``-ed (every rank then holds ``n_particles x capacity`` nodes, about 33 bytes per
node for two classes: 2048 particles x 64 nodes = 4 MB, a million particles x 100 nodes =
3.3 GB per rank -- reduce particles or predict on fewer ranks if that is too much).
Monitors are written by rank 0 only (``as_monitor(monitor, rank=backend.rank)``); the
per-stage tree statistics (``trees/*``, ``smc/distinct_nodes``) are over rank 0's particles,
and in the ``"islands"`` layout so are ``smc/ess`` and ``smc/log_evidence`` (rank 0's islands).

Exactness
---------
Log-evidence, weights, particles and predictions are bit-identical to the one-process run
for classification with the prior and empirical proposals (node counts are integers and all
float reductions run on tensors of the same shape in the same order). Two places can differ
in the last bits: regression (the cumulative sums of float statistics run over the distinct
nodes *present on the rank*), and the optimal proposal's interval choice (a cumulative sum
over the candidates of all distinct nodes present), each of which can change a decision
only when a uniform falls within ~1e-13 of a boundary. Torch's CPU reductions also change
their summation order with the thread count for rows over 32768 elements, so islands of more
than 32768 particles are reproducible across world sizes only at equal thread counts
(``torchrun`` sets ``OMP_NUM_THREADS=1``).
"""
from torchtree.samplers.topdown.config import TopDownConfig, EXPANSIONS, REDISTRIBUTIONS
from torchtree.samplers.topdown.sampler import TopDownSMC
from torchtree.samplers.topdown.state import TopDownSetup, TopDownState
from torchtree.samplers.driver import default_likelihood
from torchtree.core.smc import canonical_ancestors
from torchtree.samplers.topdown.particles import (EXPORT_FIELDS, export_particles, gather_trees, import_particles,
                                                  layout_for, materialise_ancestors, move_particles)

__all__ = ["EXPORT_FIELDS", "EXPANSIONS", "REDISTRIBUTIONS", "TopDownConfig", "TopDownSMC", "TopDownSetup", "TopDownState",
           "canonical_ancestors", "default_likelihood", "export_particles", "gather_trees", "import_particles", "layout_for",
           "materialise_ancestors", "move_particles"]
