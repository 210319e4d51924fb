"""Top-down growth of a batch of trees: the data partition and one expansion step.

This is the model-level machinery shared by prior sampling and the top-down SMC
sampler (paper 001). It never loops over particles or points.

Data partition. Every node has a ``uid``; copies of a particle made by
resampling share uids, so the data of a node is stored once per uid, not once
per particle, in a :class:`NodeTable` (flat buffer of training-point indices),
and a particle is just a row of node uids (:class:`GrowthState`).
A node's list is materialised lazily, when the node is expanded, by filtering
its parent's list with the node's rule; children of particles that die before
their expansion are never materialised. One stage therefore costs work
proportional to the data in the *distinct* nodes being expanded plus
``O(log)`` per particle, at most the paper's ``O(sum_p N_p)`` (sec. 3.2).

Scoring. For each distinct (node, dimension) that some particle needs, the
node's values in that dimension are sorted once (segmented sort keyed by the
precomputed global ranks) with cumulative label statistics; a particle's cut is
then scored with a binary search. The one-step optimal proposal scores every
interval between consecutive distinct values of every varying dimension of a
distinct node once, however many particles share the node.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch

from torchtree.steps.split_candidates import STAGE_CHUNK_BYTES, SortedCandidates, node_batches
from torchtree.kernels.node_points import (all_intervals, native_usable, node_extents, split_counts, split_intervals,
                                           split_sum_intervals, split_sums)
from torchtree.kernels.segments import exclusive_cumsum, grouped_searchsorted, rank_within, sorted_slice_searchsorted
from torchtree.steps.node_table import NodeTable
from torchtree.core.random import keyed_uniforms
from torchtree.model.feature_groups import choose_column, column_log_probs
from torchtree.model.likelihood_protocol import counts_hook
from torchtree.model.trees import INTERNAL, LEAF, OPEN, HardTrees
from torchtree.core.validate import check_choice

__all__ = ["NodeTable", "GrowthState", "Grower", "PROPOSALS", "ExpansionResult"]

PROPOSALS = ("prior", "empirical", "optimal")


def _logaddexp(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``log(exp(a) + exp(b))`` elementwise, the same bits wherever an element sits in the tensor.

    ``torch.logaddexp``'s vectorised and scalar paths differ in the last bit on the CPU, so a node's
    weight depended on its position in the batch, i.e. on which other particles a rank held
    (ranks then disagreed with one process by 1 ulp); ``exp`` and ``log1p`` do not.
    """
    m = torch.maximum(a, b)
    out = m + torch.log1p(torch.exp(-(a - b).abs()))
    return torch.where(torch.isneginf(m), m, out)

# Purpose codes for keyed random streams (stream = stage * 8 + purpose).
_U_STOP, _U_DIM, _U_CUT, _U_INTERVAL = 0, 1, 2, 3

@dataclass
class GrowthState:
    """Particles as rows of node uids into a shared :class:`NodeTable`.

    Attributes
    ----------
    node_uid : IntTensor [P, C]
        uid of the node at each slot (slots ``>= n_nodes`` are unused).
    n_nodes : LongTensor [P]
    """

    node_uid: torch.Tensor
    n_nodes: torch.Tensor

    @property
    def n_particles(self) -> int:
        """P."""
        return self.node_uid.shape[0]

    def reserve(self, needed: int) -> None:
        """Grow the slot capacity by doubling so ``needed`` nodes fit."""
        C = self.node_uid.shape[1]
        if needed <= C:
            return
        new = C
        while new < needed:
            new *= 2
        pad = torch.zeros(self.n_particles, new - C, dtype=self.node_uid.dtype, device=self.node_uid.device)
        self.node_uid = torch.cat([self.node_uid, pad], 1)

    def take_(self, index: torch.Tensor) -> None:
        """In-place resampling ``self[i] = self[index[i]]``, copying only moved rows."""
        moved = (index != torch.arange(index.numel(), device=index.device)).nonzero().squeeze(1)
        if moved.numel():
            width = int(self.n_nodes.max())
            used = self.node_uid[:, :width]
            if 4 * moved.numel() > index.numel():
                # most rows move (a degenerate island): one gather of every row is ~5x cheaper
                # than advanced-index assignment of the moved ones
                used.copy_(used.index_select(0, index))
            else:
                used.index_copy_(0, moved, used.index_select(0, index.index_select(0, moved)))
            self.n_nodes.copy_(self.n_nodes.index_select(0, index))


@dataclass
class ExpansionResult:
    """Outcome of one expansion step for ``A`` (particle, node) pairs."""

    log_weight: torch.Tensor  # [A] float64 incremental log weight
    split: torch.Tensor  # [A] bool
    n_distinct: int  # distinct nodes scored


class Grower:
    """Expands open nodes of a batch of trees under the Chipman prior.

    Parameters
    ----------
    prior : ChipmanPrior
    likelihood : DirichletMultinomial or NormalInverseGamma
    data : Data
    proposal : {"prior", "empirical", "optimal"}
    seed : int
        Run seed for the keyed random streams.
    use_likelihood : bool
        False samples from the prior (the weights ignore the labels).
    variants : sequence of (prior, likelihood), optional
        One pair per island of ``island_size`` particles (island-major): particle ``p`` grows under
        ``variants[p // island_size]`` instead of ``(prior, likelihood)`` (the prior and empirical
        proposals; the likelihoods must share the task). The node table is shared; a node's scores
        are computed per (node, island).
    island_size : int, the particles per island when ``variants`` is given
    """

    def __init__(self, prior, likelihood, data, proposal: str = "prior", seed: int = 0, use_likelihood: bool = True,
                 variants=None, island_size: int = 0) -> None:
        check_choice("proposal", proposal, PROPOSALS)
        if variants is not None and (proposal == "optimal" or island_size < 1):
            raise ValueError("variants need the prior or empirical proposal and an island size")
        self.variants, self.island_size = (list(variants), int(island_size)) if variants is not None else (None, 0)
        self.prior, self.lik, self.data = prior, likelihood, data
        self.proposal, self.seed = proposal, seed
        self.use_likelihood = use_likelihood
        self.pstats = likelihood.point_stats(data.y, data.n_classes).to(likelihood.stats_dtype)
        # Class counts are integers: cumulate them exactly in int32 (regression stays float64).
        self.cum_stats = self.pstats.int() if likelihood.task == "classification" else self.pstats.double()
        self.table = NodeTable(data.n, self.pstats.sum(0), data.X.dtype)
        self.table.native = native_usable(data.X.device)  # compiled point-list passes on the CPU

    # ------------------------------------------------------------------ state
    def state_dict(self, state: "GrowthState") -> dict:
        """The particles and the node table as plain tensors (for checkpoints)."""
        return {"node_uid": state.node_uid.clone(), "n_nodes": state.n_nodes.clone(), "table": self.table.state_dict()}

    def load_state_dict(self, saved: dict) -> "GrowthState":
        """Restore the node table from :meth:`state_dict`; returns the particles."""
        self.table.load_state_dict(saved["table"])
        dev = self.data.device
        return GrowthState(saved["node_uid"].to(device=dev, dtype=torch.int32).clone(),
                           saved["n_nodes"].to(device=dev, dtype=torch.long).clone())

    def init_state(self, n_particles: int, capacity: int = 32) -> GrowthState:
        """P single-root trees (uid 0, open)."""
        dev = self.data.device
        return GrowthState(
            torch.zeros(n_particles, capacity, dtype=torch.int32, device=dev),
            torch.ones(n_particles, dtype=torch.long, device=dev),
        )

    def slot_status(self, state: GrowthState) -> torch.Tensor:
        """Status of every slot ``[P, C]`` (UNUSED beyond ``n_nodes``)."""
        used = torch.arange(state.node_uid.shape[1], device=state.node_uid.device)[None] < state.n_nodes[:, None]
        st = self.table.status[state.node_uid.long()]
        return torch.where(used, st, torch.zeros_like(st))

    def open_uids(self, state: GrowthState) -> torch.Tensor:
        """uids of all open nodes of all particles (with repeats) ``[k]``."""
        return state.node_uid.long()[self.slot_status(state) == OPEN]

    def to_trees(self, state: GrowthState) -> HardTrees:
        """Materialise the particles as :class:`HardTrees` (trimmed to the largest tree)."""
        width = max(int(state.n_nodes.max()), 1)
        uid = state.node_uid[:, :width].long()
        used = torch.arange(width, device=uid.device)[None] < state.n_nodes[:, None]
        t = self.table

        def g(field, fill):
            v = getattr(t, field)[uid]
            return torch.where(used, v, torch.full_like(v, fill))

        stats = t.stats[uid] * used[..., None].to(t.stats.dtype)
        return HardTrees(
            feature=g("feature", -1), threshold=g("threshold", 0), left=g("left", -1), right=g("right", -1),
            parent=g("pslot", -1), depth=g("depth", 0), status=g("status", 0), stats=stats,
            n_nodes=state.n_nodes.clone(),
        )

    def _loglik(self, stats: torch.Tensor, totals: Optional[torch.Tensor] = None,
                island: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Log marginal likelihood of each row of ``stats``; with variants, row ``r`` under island
        ``island[r]``'s likelihood."""
        if not self.use_likelihood:
            return torch.zeros(stats.shape[:-1], dtype=torch.float64, device=stats.device)
        if island is None:
            return self._loglik_of(self.lik, stats, totals)
        return _by_island(island, len(self.variants), lambda i, rows: self._loglik_of(
            self.variants[i][1], stats[rows], None if totals is None else totals[rows]))

    def _loglik_of(self, lik, stats: torch.Tensor, totals: Optional[torch.Tensor]) -> torch.Tensor:
        counts = counts_hook(lik)
        if counts is not None:  # integral counts: table lookup
            return counts(stats if stats.dtype in (torch.int32, torch.int64) else stats.long(), self.data.n, totals)
        return lik.log_marginal(stats)

    def _split_prob(self, depth: torch.Tensor, island: Optional[torch.Tensor]) -> torch.Tensor:
        """The prior's split probability at each ``depth``; with variants, under island ``island[r]``'s prior."""
        if island is None:
            return self.prior.split_prob(depth)
        return _by_island(island, len(self.variants), lambda i, rows: self.variants[i][0].split_prob(depth[rows]))

    # ---------------------------------------------------------------- expand
    def expand(self, state: GrowthState, pp: torch.Tensor, nn: torch.Tensor, gidx: torch.Tensor, stage: int) -> ExpansionResult:
        """Consider the open nodes at slots ``(pp[a], nn[a])`` for splitting.

        Parameters
        ----------
        state : GrowthState, modified in place
        pp, nn : LongTensor [A]
            Particle and slot of each pair, sorted by particle.
        gidx : LongTensor [A]
            Global index of each pair's particle (keys the random draws).
        stage : int

        Returns
        -------
        ExpansionResult
        """
        data, t = self.data, self.table
        uid = state.node_uid[pp, nn].long()
        if self.variants is None:
            uu, inv = torch.unique(uid, return_inverse=True)
            isl_u = None
            t.materialise(uu, data.X)
        else:  # distinct (node, island): the islands score a shared node (the root) under their own variants
            I = len(self.variants)
            key, inv = torch.unique(uid * I + pp // self.island_size, return_inverse=True)
            uu, isl_u = key // I, key % I
            t.materialise(torch.unique(uu), data.X)
        U = uu.numel()
        # Per distinct node: data extent in every dimension (the reference gathers [sum of node
        # sizes, D], in batches of nodes; the compiled kernel reads the lists in place).
        D = data.X.shape[1]
        batches = [(0, U)] if t.native else node_batches(t.cnt[uu].double() * (16 + 8 * D), STAGE_CHUNK_BYTES)
        lo = torch.empty(U, D, dtype=data.X.dtype, device=data.X.device)
        hi = torch.empty_like(lo)
        for b0, b1 in batches:
            ub = uu[b0:b1]
            lo[b0:b1], hi[b0:b1] = node_extents(t.buf, t.off[ub], t.cnt[ub], data.X, use_native=t.native)
        varying = hi > lo
        nvary = varying.sum(1)
        psplit_u = self._split_prob(t.depth[uu], isl_u)
        pstat_u = t.stats[uu]
        lp_u = self._loglik(pstat_u, island=isl_u)
        # every uniform a pair may need, in one hash pass (rows: _U_STOP, _U_DIM, _U_CUT, _U_INTERVAL)
        u = keyed_uniforms(self.seed, [stage * 8 + k for k in range(4)], gidx, nn)
        if self.proposal == "optimal":
            split, logw, sp, feat, thr, left, n_left = self._choose_optimal(uu, inv, lo, hi, varying, nvary, psplit_u, pstat_u, lp_u, u)
        else:
            split, logw, sp, feat, thr, left, n_left = self._choose_local(uu, inv, lo, hi, varying, nvary, psplit_u, pstat_u,
                                                                          lp_u, u, isl_u)
        self._apply(state, pp, nn, uid, split, sp, feat, thr, left, n_left)
        return ExpansionResult(logw, split, U)

    def _choose_local(self, uu, inv, lo, hi, varying, nvary, psplit_u, pstat_u, lp_u, u, isl_u=None):
        """Prior and empirical proposals: stop/split as the prior, dimension uniform (``isl_u``: each
        distinct node's island, with variants)."""
        data, t = self.data, self.table
        A = inv.numel()
        split = (nvary[inv] > 0) & (u[_U_STOP] < psplit_u[inv])
        sp = split.nonzero().squeeze(1)
        logw = torch.zeros(A, dtype=torch.float64, device=inv.device)
        if sp.numel() == 0:
            return split, logw, sp, None, None, None, None
        k = inv[sp]
        u_dim, u_cut, u_int = u[_U_DIM:, sp].unbind(0)
        groups = getattr(data, "groups", None)
        if groups is None:  # the kth varying dimension, k uniform in [0, nvary)
            kth = (u_dim * nvary[k].double()).long().clamp(max=nvary[k] - 1)
            cumv = torch.cumsum(varying.int(), 1)
            feat = torch.searchsorted(cumv[k], (kth + 1).int()[:, None]).squeeze(1)
        else:  # input column, then split column (torchtree.model.feature_groups)
            feat, _ = choose_column(varying.index_select(0, k), u_dim, groups)
        lo_f, hi_f = lo[k, feat], hi[k, feat]
        # Score only the distinct (node, dim) groups that some particle asked for.
        gk, ginv = torch.unique(k * data.d + feat, return_inverse=True)
        if self.proposal == "prior":
            thr = lo_f.double() + u_cut * (hi_f - lo_f).double()
            thr = _below(thr.to(data.X.dtype), hi_f)
        if t.native:
            gu, gd = uu[gk // data.d], gk % data.d
            nv = data.sorted_values.shape[1]
            if self.cum_stats.dtype == torch.int32:
                # integral statistics: counts left of each cut, exact in any order, without sorting the points
                if self.proposal == "prior":
                    n_left, left = split_counts(t.buf, t.off[gu], t.cnt[gu], data.X, gd, ginv, thr, self.cum_stats)
                else:
                    n_left, left, nc, r0, r1 = split_intervals(t.buf, t.off[gu], t.cnt[gu], data.X_rank, gd, ginv,
                                                               u_int, self.cum_stats, nv)
            elif self.proposal == "prior":  # float statistics: summed in the sorted candidates' order
                n_left, left = split_sums(t.buf, t.off[gu], t.cnt[gu], data.X_rank, data.sorted_values, gd, ginv, thr,
                                          self.cum_stats)
            else:
                n_left, left, nc, r0, r1 = split_sum_intervals(t.buf, t.off[gu], t.cnt[gu], data.X_rank, gd, ginv,
                                                               u_int, self.cum_stats)
            if self.proposal != "prior":
                v0, v1 = data.sorted_values.view(-1)[feat * nv + r0], data.sorted_values.view(-1)[feat * nv + r1]
        else:
            srt = SortedCandidates(t, uu[gk // data.d], gk % data.d, data, self.cum_stats)
            if self.proposal == "prior":
                # one search over (group, value) keys, no host read (64-bit values: a fixed count of halvings,
                # a node's list holding at most n points)
                n_left = grouped_searchsorted(srt.vals, srt.seg, srt.start, srt.end, ginv, thr, right=True,
                                              max_len=data.n)
            else:  # the j-th of the nc intervals between adjacent distinct values, j uniform
                nc = srt.n_cand[ginv]
                j = (u_int * nc.double()).long().clamp(max=nc - 1)
                e = srt.cand[srt.cand_start[ginv] + j]
                v0, v1 = srt.val_at(e), srt.val_at(e + 1)
                n_left = e + 1 - srt.start[ginv]
            left = srt.left_stats_at(ginv, n_left)
        extra = 0.0
        if self.proposal == "empirical":  # the cut uniform in its interval
            thr = torch.maximum(_below((v0.double() + u_cut * (v1 - v0).double()).to(data.X.dtype), v1), v0)
            # prior density 1/range over proposal density 1/((U-1) gap)
            extra = torch.log(nc.double()) + torch.log((v1 - v0).double()) - torch.log((hi_f - lo_f).double())
        left = left.to(pstat_u.dtype)
        right = pstat_u[k] - left
        isl = None if isl_u is None else isl_u[k]
        logw[sp] = self._loglik(left, island=isl) + self._loglik(right, island=isl) - lp_u[k] + extra
        return split, logw, sp, feat, thr, left, n_left

    def _choose_optimal(self, uu, inv, lo, hi, varying, nvary, psplit_u, pstat_u, lp_u, u):
        """One-step optimal proposal (eq. 6-7, sec. 3.1), scored once per distinct node, in
        batches of distinct nodes whose sorted candidate tables fit ``STAGE_CHUNK_BYTES``."""
        S = pstat_u.shape[1] if pstat_u.dim() == 2 else 1
        cost = self.table.cnt[uu].double() * nvary.double() * (96 + 16 * S)
        batches = node_batches(cost, STAGE_CHUNK_BYTES)
        if len(batches) == 1:
            return self._choose_optimal_batch(uu, inv, lo, hi, varying, nvary, psplit_u, pstat_u, lp_u, u)
        A, dev = inv.numel(), inv.device
        split = torch.zeros(A, dtype=torch.bool, device=dev)
        logw = torch.zeros(A, dtype=torch.float64, device=dev)
        parts = []
        for b0, b1 in batches:
            rows = ((inv >= b0) & (inv < b1)).nonzero().squeeze(1)
            if rows.numel() == 0:
                continue
            r = slice(b0, b1)
            got = self._choose_optimal_batch(uu[r], inv[rows] - b0, lo[r], hi[r], varying[r], nvary[r], psplit_u[r],
                                             pstat_u[r], lp_u[r], u[:, rows])
            split[rows], logw[rows] = got[0], got[1]
            if got[2].numel():
                parts.append((rows[got[2]],) + tuple(got[3:]))
        if not parts:
            return split, logw, split.nonzero().squeeze(1), None, None, None, None
        sp = torch.cat([p[0] for p in parts])
        order = torch.argsort(sp)  # pairs in ascending order, as one batch returns them
        return (split, logw, sp[order]) + tuple(torch.cat([p[i] for p in parts])[order] for i in range(1, 5))

    def _choose_optimal_batch(self, uu, inv, lo, hi, varying, nvary, psplit_u, pstat_u, lp_u, u):
        """:meth:`_choose_optimal` for one batch of distinct nodes ``uu`` and the pairs on them."""
        data, t = self.data, self.table
        dev = inv.device
        U = uu.numel()
        gu, gd = varying.nonzero(as_tuple=True)  # every (distinct node, varying dim) group
        # every interval between adjacent distinct values of a group: its group g, the values on either side,
        # and the count and statistics of the node's points at or below it
        if t.native and self.cum_stats.dtype == torch.int32:  # integral statistics: exact without a sort
            nv = data.sorted_values.shape[1]
            g, r0, r1, n_l, left_all = all_intervals(t.buf, t.off[uu[gu]], t.cnt[uu[gu]], data.X_rank, gd,
                                                     self.cum_stats, nv)
            at = gd.index_select(0, g) * nv
            v_lo = data.sorted_values.view(-1).index_select(0, at + r0)
            v_hi = data.sorted_values.view(-1).index_select(0, at + r1)
        else:
            srt = SortedCandidates(t, uu[gu], gd, data, self.cum_stats)
            e, g = srt.cand, srt.cand_seg
            s0 = srt.start[g]
            left_all = srt.cum.index_select(0, e + 1) - srt.cum.index_select(0, s0)
            n_l = e + 1 - s0
            v_lo, v_hi = srt.vals.index_select(0, e), srt.vals.index_select(0, e + 1)
        node_of = gu.index_select(0, g)
        right_all = pstat_u.to(left_all.dtype).index_select(0, node_of) - left_all
        gap = (v_hi - v_lo).double()
        # log range per group, added per candidate: log(gap / range_d)
        log_rng = torch.log((hi - lo).double()[gu, gd]).index_select(0, g)
        n_r = t.cnt[uu].index_select(0, node_of) - n_l
        cand_lw = torch.log(gap) - log_rng + self._loglik(left_all, n_l) + self._loglik(right_all, n_r)
        groups = getattr(data, "groups", None)
        if groups is not None:  # the column's prior probability (1 / nv for a numeric table, below)
            cand_lw = cand_lw + column_log_probs(varying, groups)[gu, gd].index_select(0, g)
        # Segmented logsumexp over the candidates of each distinct node.
        mx = torch.full((U,), -math.inf, dtype=torch.float64, device=dev).scatter_reduce(0, node_of, cand_lw, "amax")
        ssum = torch.zeros(U, dtype=torch.float64, device=dev).index_add_(0, node_of, torch.exp(cand_lw - mx[node_of]))
        lse = mx + ssum.log()
        has = nvary > 0
        log_nv = torch.log(nvary.clamp(min=1).double()) if groups is None else torch.zeros_like(lse)
        log_split = torch.where(has, psplit_u.log() - log_nv + lse, torch.full_like(lse, -math.inf))
        log_stop = torch.where(has, torch.log1p(-psplit_u) + lp_u, lp_u)
        logz = _logaddexp(log_stop, log_split)
        split = u[_U_STOP] >= torch.exp(log_stop - logz)[inv]
        logw = (logz - lp_u)[inv] if self.use_likelihood else torch.zeros(inv.numel(), dtype=torch.float64, device=dev)
        sp = split.nonzero().squeeze(1)
        if sp.numel() == 0:
            return split, logw, sp, None, None, None, None
        # Candidates are grouped by node: cumulative probabilities within each
        # node, then one binary search per particle.
        cprob = torch.cumsum(torch.exp(cand_lw - lse[node_of]), 0)
        ncand = torch.bincount(node_of, minlength=U)
        cstart = exclusive_cumsum(ncand)
        cpad = torch.cat([torch.zeros(1, dtype=cprob.dtype, device=dev), cprob])
        base, tot = cpad[cstart], cpad[cstart + ncand] - cpad[cstart]
        k = inv[sp]
        u_cut, u_int = u[_U_CUT, sp], u[_U_INTERVAL, sp]
        # cprob is one running sum of non-negative terms, sorted as a whole: one search, clamped to the node's slice
        j = sorted_slice_searchsorted(cprob, cstart[k], cstart[k] + ncand[k], base[k] + u_int * tot[k], right=False)
        c = cstart[k] + torch.minimum(j, ncand[k] - 1)
        feat = gd[g[c]]
        v0, v1 = v_lo[c], v_hi[c]
        thr = torch.maximum(_below((v0.double() + u_cut * (v1 - v0).double()).to(data.X.dtype), v1), v0)
        return split, logw, sp, feat, thr, left_all[c].to(pstat_u.dtype), n_l[c]

    # ----------------------------------------------------------------- apply
    def _apply(self, state, pp, nn, uid, split, sp, feat, thr, left, n_left) -> None:
        t = self.table
        A = pp.numel()
        decided = t.new(A)
        t.depth[decided] = t.depth[uid]
        t.stats[decided] = t.stats[uid]
        t.pslot[decided] = t.pslot[uid]
        t.cnt[decided] = t.cnt[uid]  # point count travels with the node (multi-rank export)
        t.status[decided] = torch.where(split, INTERNAL, LEAF).to(torch.int8)
        state.node_uid[pp, nn] = decided.to(torch.int32)
        k = sp.numel()
        if k == 0:
            return
        ps, ns, us, ds = pp[sp], nn[sp], uid[sp], decided[sp]
        per_tree = torch.bincount(ps, minlength=state.n_particles)
        state.reserve(int((state.n_nodes + 2 * per_tree).max()))
        c0 = state.n_nodes[ps] + 2 * rank_within(ps)  # pairs are sorted by particle
        t.feature[ds] = feat.to(torch.int32)
        t.threshold[ds] = thr.to(t.threshold.dtype)
        t.left[ds] = c0.to(torch.int32)
        t.right[ds] = (c0 + 1).to(torch.int32)
        # the children, left ones then right ones, written in one operation per field
        kids = t.new(2 * k)
        pair = lambda x: torch.cat([x, x])  # noqa: E731 - the same value for both children
        t.depth[kids] = pair(t.depth[us] + 1)
        t.stats[kids] = torch.cat([left, t.stats[us] - left])
        t.pslot[kids] = pair(ns.to(torch.int32))
        t.rparent[kids], t.rfeat[kids], t.rthr[kids] = pair(us), pair(feat.long()), pair(thr.double())
        t.rside[kids] = torch.arange(2 * k, device=kids.device) >= k
        t.cnt[kids] = torch.cat([n_left, t.cnt[us] - n_left]).long()
        state.node_uid[pair(ps), torch.cat([c0, c0 + 1])] = kids.to(torch.int32)
        state.n_nodes += 2 * per_tree


def _by_island(island: torch.Tensor, n_islands: int, fn) -> torch.Tensor:
    """float64 ``[len(island)]``: row ``r`` from ``fn(i, rows)``, the values of island ``i``'s rows ``rows``
    (one call per island that has rows; the variants of :class:`Grower`)."""
    out = torch.empty(island.shape, dtype=torch.float64, device=island.device)
    for i in range(n_islands):
        rows = (island == i).nonzero().squeeze(1)
        if rows.numel():
            out[rows] = fn(i, rows)
    return out


def _below(thr: torch.Tensor, upper: torch.Tensor) -> torch.Tensor:
    """Keep cuts strictly below ``upper`` after rounding to the data dtype, so the
    right child is never empty."""
    upper = upper.to(thr.dtype)
    return torch.where(thr < upper, thr, torch.nextafter(upper, torch.full_like(upper, -math.inf)))
