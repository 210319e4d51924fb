"""Top-down growth of a batch of trees: the data partition and one expansion step.

This is the model-level machinery shared by prior sampling and the top-down SMC
sampler (paper 001). It never loops over particles or points.

Data partition. Every node has a ``uid``; copies of a particle made by
resampling share uids, so the data of a node is stored once per uid, not once
per particle, in a :class:`NodePool` (flat buffer of training-point indices).
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

from .kernels.segments import exclusive_cumsum, ragged_arange, rank_within, segment_minmax, segmented_searchsorted
from .random import keyed_uniform
from .trees import INTERNAL, LEAF, OPEN, HardTrees

__all__ = ["NodePool", "Grower", "PROPOSALS", "ExpansionResult"]

PROPOSALS = ("prior", "empirical", "optimal")

# Purpose codes for keyed random streams (stream = stage * 8 + purpose).
_U_STOP, _U_DIM, _U_CUT, _U_INTERVAL = 0, 1, 2, 3


class NodePool:
    """Training-point index lists of tree nodes, stored once per node uid.

    Parameters
    ----------
    n_points : int
        N, the number of training points.
    device : torch.device
    """

    def __init__(self, n_points: int, device) -> None:
        self.device = torch.device(device)
        self.n_points = n_points
        self.buf = torch.arange(n_points, dtype=torch.int32, device=self.device)
        self.size = n_points
        cap = 1024
        self.off = torch.full((cap,), -1, dtype=torch.long, device=self.device)
        self.cnt = torch.zeros(cap, dtype=torch.long, device=self.device)
        self.parent = torch.full((cap,), -1, dtype=torch.long, device=self.device)
        self.feat = torch.zeros(cap, dtype=torch.long, device=self.device)
        self.thr = torch.zeros(cap, dtype=torch.float64, device=self.device)
        self.side = torch.zeros(cap, dtype=torch.bool, device=self.device)  # True = right child
        self.off[0], self.cnt[0] = 0, n_points  # uid 0 = the root
        self.n_uids = 1
        self.live_after_gc = n_points
        self.limit_bytes: Optional[int] = None

    def _grow_meta(self, need: int) -> None:
        cap = self.off.numel()
        if need <= cap:
            return
        new = cap
        while new < need:
            new *= 2

        def ext(t, fill):
            return torch.cat([t, torch.full((new - cap,), fill, dtype=t.dtype, device=t.device)])

        self.off, self.cnt, self.parent = ext(self.off, -1), ext(self.cnt, 0), ext(self.parent, -1)
        self.feat, self.thr, self.side = ext(self.feat, 0), ext(self.thr, 0.0), ext(self.side, False)

    def define(self, parent_uid: torch.Tensor, feat: torch.Tensor, thr: torch.Tensor, side: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
        """Register new nodes by their rule; returns their uids ``[k]``."""
        k = parent_uid.numel()
        self._grow_meta(self.n_uids + k)
        uids = torch.arange(self.n_uids, self.n_uids + k, device=self.device)
        self.parent[uids], self.feat[uids], self.thr[uids] = parent_uid, feat.long(), thr.double()
        self.side[uids], self.cnt[uids] = side, count.long()
        self.n_uids += k
        return uids

    def _append(self, idx: torch.Tensor) -> int:
        need = self.size + idx.numel()
        if need > self.buf.numel():
            new = max(need, 2 * self.buf.numel())
            if self.limit_bytes is not None and new * self.buf.element_size() > self.limit_bytes:
                new = need
                if new * self.buf.element_size() > self.limit_bytes:
                    raise MemoryError(
                        f"the node-data pool would need {new * 4 / 2**30:.2f} GiB (limit "
                        f"{self.limit_bytes / 2**30:.2f} GiB): too many distinct particles x data points; "
                        "reduce n_particles, use more islands or ranks, or raise max_memory_bytes"
                    )
            buf = torch.empty(new, dtype=self.buf.dtype, device=self.device)
            buf[: self.size] = self.buf[: self.size]
            self.buf = buf
        start = self.size
        self.buf[start:need] = idx
        self.size = need
        return start

    def materialise(self, uids: torch.Tensor, X: torch.Tensor) -> None:
        """Make sure the lists of distinct ``uids`` exist (their parents' must)."""
        todo = uids[self.off[uids] < 0]
        if todo.numel() == 0:
            return
        par = self.parent[todo]
        if bool((self.off[par] < 0).any()):
            raise RuntimeError("internal error: a node's parent data was freed before the node was expanded")
        seg, pos = ragged_arange(self.cnt[par])
        idx = self.buf[self.off[par][seg] + pos].long()
        xv = X[idx, self.feat[todo][seg]]
        go_right = xv > self.thr[todo][seg].to(X.dtype)
        keep = go_right == self.side[todo][seg]
        kept = idx[keep]
        counts = torch.bincount(seg[keep], minlength=todo.numel())
        if not bool((counts == self.cnt[todo]).all()):
            raise RuntimeError("internal error: node counts disagree with the data partition")
        start = self._append(kept.to(self.buf.dtype))
        self.off[todo] = start + exclusive_cumsum(counts)

    def segments(self, uids: torch.Tensor):
        """``(offsets, counts)`` of materialised ``uids``, each ``[k]``."""
        return self.off[uids], self.cnt[uids]

    def gather(self, uids: torch.Tensor):
        """Flatten the lists of ``uids``: returns ``(seg [T], idx [T])``."""
        off, cnt = self.segments(uids)
        seg, pos = ragged_arange(cnt)
        return seg, self.buf[off[seg] + pos].long()

    def maybe_compact(self, open_uids: torch.Tensor, factor: float = 3.0) -> None:
        """Drop lists no open node needs once the buffer is ``factor`` x the live size.

        Parameters
        ----------
        open_uids : LongTensor [k] uids of all open nodes of all particles
        """
        if self.size < factor * max(self.live_after_gc, self.n_points):
            return
        open_u = torch.unique(open_uids)
        unmat = open_u[self.off[open_u] < 0]
        keep = torch.unique(torch.cat([open_u[self.off[open_u] >= 0], self.parent[unmat]]))
        seg, idx = self.gather(keep)
        counts = self.cnt[keep]
        self.off.fill_(-1)
        self.buf = idx.to(torch.int32)
        self.size = idx.numel()
        self.off[keep] = exclusive_cumsum(counts)
        self.live_after_gc = max(self.size, 1)


@dataclass
class ExpansionResult:
    """Outcome of one expansion step for ``A`` (particle, node) pairs."""

    log_weight: torch.Tensor  # [A] float64 incremental log weight
    split: torch.Tensor  # [A] bool
    n_distinct: int  # distinct nodes scored


class _Sorted:
    """Values of distinct (node, dim) groups sorted with cumulative statistics."""

    def __init__(self, pool: NodePool, g_uid: torch.Tensor, g_dim: torch.Tensor, data, pstats: torch.Tensor):
        seg, idx = pool.gather(g_uid)
        ranks = data.X_rank[idx, g_dim[seg]]
        R = int(data.n_unique.max()) + 1
        order = torch.argsort(seg * R + ranks)
        self.idx = idx[order]
        self.seg = seg[order]  # still grouped, now value-sorted within groups
        self.vals = data.X[self.idx, g_dim[self.seg]]
        self.rank = ranks[order]
        cnt = pool.cnt[g_uid]
        self.start = exclusive_cumsum(cnt)
        self.end = self.start + cnt
        cs = torch.cumsum(pstats[self.idx].double(), 0)
        self.cum = torch.cat([torch.zeros(1, cs.shape[1], dtype=cs.dtype, device=cs.device), cs])  # cum[t] = sum of first t
        # Boundary candidates: last element of a run of equal values, not last of its group.
        nxt_same = torch.zeros_like(self.seg, dtype=torch.bool)
        if self.seg.numel() > 1:
            nxt_same[:-1] = (self.seg[1:] == self.seg[:-1]) & (self.rank[1:] != self.rank[:-1])
        self.cand = nxt_same.nonzero().squeeze(1)  # positions e: interval (vals[e], vals[e+1])
        self.cand_seg = self.seg[self.cand]
        n_cand = torch.bincount(self.cand_seg, minlength=g_uid.numel())
        self.cand_start = exclusive_cumsum(n_cand)
        self.n_cand = n_cand

    def left_stats_at(self, g: torch.Tensor, n_left: torch.Tensor) -> torch.Tensor:
        """Statistics of the first ``n_left`` sorted points of group ``g``: ``[Q, S]``."""
        s = self.start[g]
        return self.cum[s + n_left] - self.cum[s]


class Grower:
    """Expands nodes of a batch of trees under the Chipman prior.

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
    """

    def __init__(self, prior, likelihood, data, proposal: str = "prior", seed: int = 0, use_likelihood: bool = True) -> None:
        if proposal not in PROPOSALS:
            raise ValueError(f"proposal must be one of {PROPOSALS}, got {proposal!r}")
        self.prior, self.lik, self.data = prior, likelihood, data
        self.proposal, self.seed = proposal, seed
        self.use_likelihood = use_likelihood
        self.pstats = likelihood.point_stats(data.y, data.n_classes).to(likelihood.stats_dtype)
        self.pool = NodePool(data.n, data.device)

    # ------------------------------------------------------------------ trees
    def init_trees(self, n_trees: int, capacity: int = 32) -> HardTrees:
        """P single-root trees with the root open and uid 0."""
        root = self.pstats.sum(0)
        trees = HardTrees.roots(n_trees, root, capacity=capacity, threshold_dtype=self.data.X.dtype)
        trees.extra["uid"] = torch.zeros(n_trees, trees.capacity, dtype=torch.long, device=trees.device)
        return trees

    def _loglik(self, stats: torch.Tensor) -> torch.Tensor:
        if not self.use_likelihood:
            return torch.zeros(stats.shape[:-1], dtype=torch.float64, device=stats.device)
        return self.lik.log_marginal(stats)

    # ---------------------------------------------------------------- expand
    def expand(self, trees: HardTrees, pp: torch.Tensor, nn: torch.Tensor, gidx: torch.Tensor, stage: int) -> ExpansionResult:
        """Consider the open nodes ``(pp[a], nn[a])`` for splitting.

        Parameters
        ----------
        trees : HardTrees, modified in place
        pp, nn : LongTensor [A]
            Particle and node of each pair, sorted by particle.
        gidx : LongTensor [A]
            Global index of each pair's particle (keys the random draws).
        stage : int

        Returns
        -------
        ExpansionResult
        """
        dev = trees.device
        data, pool = self.data, self.pool
        A = pp.numel()
        uid = trees.extra["uid"][pp, nn]
        uu, inv = torch.unique(uid, return_inverse=True)
        U = uu.numel()
        pool.materialise(uu, data.X)
        # Per distinct node: data extent in every dimension.
        seg, idx = pool.gather(uu)
        lo, hi = segment_minmax(data.X[idx], seg, U)
        varying = hi > lo
        nvary = varying.sum(1)
        depth = trees.depth[pp, nn]
        psplit = self.prior.split_prob(depth)
        pstat = trees.stats[pp, nn]
        lp = self._loglik(pstat)
        can_split = nvary[inv] > 0
        slot = nn
        u_stop = keyed_uniform(self.seed, stage * 8 + _U_STOP, gidx, slot)
        if self.proposal == "optimal":
            return self._expand_optimal(trees, pp, nn, gidx, stage, uu, inv, lo, hi, varying, nvary, psplit, pstat, lp, u_stop)

        split = can_split & (u_stop < psplit)
        sp = split.nonzero().squeeze(1)
        logw = torch.zeros(A, dtype=torch.float64, device=dev)
        if sp.numel():
            k = inv[sp]
            u_dim = keyed_uniform(self.seed, stage * 8 + _U_DIM, gidx[sp], slot[sp])
            # k-th varying dimension, k uniform in [0, nvary).
            kth = (u_dim * nvary[k].double()).long().clamp(max=nvary[k] - 1)
            cumv = torch.cumsum(varying.long(), 1)[k]  # [Sp, D]
            feat = torch.searchsorted(cumv, (kth + 1)[:, None]).squeeze(1)
            u_cut = keyed_uniform(self.seed, stage * 8 + _U_CUT, gidx[sp], slot[sp])
            lo_f, hi_f = lo[k, feat].double(), hi[k, feat].double()
            # Sort only the distinct (node, dim) groups that some particle asked for.
            gkey = k * data.d + feat
            gk, ginv = torch.unique(gkey, return_inverse=True)
            srt = _Sorted(pool, uu[gk // data.d], gk % data.d, data, self.pstats)
            if self.proposal == "prior":
                thr = lo_f + u_cut * (hi_f - lo_f)
                thr = _below(thr.to(data.X.dtype), hi[k, feat])
                n_left = segmented_searchsorted(srt.vals, srt.start[ginv], srt.end[ginv], thr, right=True)
                extra = torch.zeros_like(thr, dtype=torch.float64)
            else:  # empirical: an interval between adjacent distinct values, then uniform in it
                u_int = keyed_uniform(self.seed, stage * 8 + _U_INTERVAL, gidx[sp], slot[sp])
                nc = srt.n_cand[ginv]
                j = (u_int * nc.double()).long().clamp(max=nc - 1)
                e = srt.cand[srt.cand_start[ginv] + j]
                v0, v1 = srt.vals[e].double(), srt.vals[e + 1].double()
                thr = _below((v0 + u_cut * (v1 - v0)).to(data.X.dtype), srt.vals[e + 1])
                thr = torch.maximum(thr, srt.vals[e])
                n_left = e + 1 - srt.start[ginv]
                # prior density 1/range over proposal density 1/((U-1) gap)
                extra = torch.log(nc.double()) + torch.log(v1 - v0) - torch.log(hi_f - lo_f)
            left = srt.left_stats_at(ginv, n_left).to(pstat.dtype)
            right = pstat[sp] - left
            lw = self._loglik(left) + self._loglik(right) - lp[sp] + extra
            logw[sp] = lw
            self._apply_splits(trees, pp[sp], nn[sp], uid[sp], feat, thr, left, right, n_left)
        self._apply_stops(trees, pp[~split], nn[~split])
        return ExpansionResult(logw, split, U)

    def _expand_optimal(self, trees, pp, nn, gidx, stage, uu, inv, lo, hi, varying, nvary, psplit, pstat, lp, u_stop) -> ExpansionResult:
        dev = trees.device
        data, pool = self.data, self.pool
        D, U, A = data.d, uu.numel(), pp.numel()
        # All (distinct node, varying dim) groups.
        gu, gd = varying.nonzero(as_tuple=True)
        srt = _Sorted(pool, uu[gu], gd, data, self.pstats)
        e = srt.cand
        g = srt.cand_seg
        s0 = srt.start[g]
        left = (srt.cum[e + 1] - srt.cum[s0])
        node_of = gu[g]
        # Parent stats of a distinct node: take them from any pair that holds it.
        first_pair = torch.full((U,), A, dtype=torch.long, device=dev).scatter_reduce(0, inv, torch.arange(A, device=dev), "amin")
        par_stats = pstat[first_pair].double()
        right = par_stats[node_of] - left
        gap = (srt.vals[e + 1] - srt.vals[e]).double()
        rng = (hi - lo).double()[node_of, gd[g]]
        cand_lw = torch.log(gap) - torch.log(rng) + self._loglik(left) + self._loglik(right)
        # Per distinct node: log sum over candidates (segmented logsumexp).
        mx = torch.full((U,), -math.inf, dtype=torch.float64, device=dev).scatter_reduce(0, node_of, cand_lw, "amax")
        ssum = torch.zeros(U, dtype=torch.float64, device=dev).index_add_(0, node_of, torch.exp(cand_lw - mx[node_of]))
        lse = mx + ssum.log()  # -inf where no candidate
        lp_u = lp[first_pair]
        ps_u = psplit[first_pair]
        has = nvary > 0
        log_split_mass = torch.where(has, ps_u.log() - torch.log(nvary.clamp(min=1).double()) + lse, torch.full_like(lse, -math.inf))
        log_stop_mass = torch.where(has, torch.log1p(-ps_u) + lp_u, lp_u)
        logz = torch.logaddexp(log_stop_mass, log_split_mass)
        p_stop = torch.exp(log_stop_mass - logz)
        split = u_stop >= p_stop[inv]
        logw = (logz - lp_u)[inv]
        if not self.use_likelihood:
            logw = torch.zeros_like(logw)
        sp = split.nonzero().squeeze(1)
        if sp.numel():
            # Candidates are grouped by node (group order = node order): cumulative
            # probabilities within each node, then a binary search per particle.
            prob = torch.exp(cand_lw - lse[node_of])
            cprob = torch.cumsum(prob, 0)
            ncand_node = torch.bincount(node_of, minlength=U)
            cstart = exclusive_cumsum(ncand_node)
            base = torch.cat([torch.zeros(1, dtype=cprob.dtype, device=dev), cprob])[cstart]
            k = inv[sp]
            u_int = keyed_uniform(self.seed, stage * 8 + _U_INTERVAL, gidx[sp], nn[sp])
            tot = torch.cat([torch.zeros(1, dtype=cprob.dtype, device=dev), cprob])[cstart + ncand_node] - base
            q = base[k] + u_int * tot[k]
            j = segmented_searchsorted(cprob, cstart[k], cstart[k] + ncand_node[k], q, right=False)
            j = torch.minimum(j, ncand_node[k] - 1)
            c = cstart[k] + j
            ec = e[c]
            feat = gd[g[c]]
            u_cut = keyed_uniform(self.seed, stage * 8 + _U_CUT, gidx[sp], nn[sp])
            v0, v1 = srt.vals[ec].double(), srt.vals[ec + 1].double()
            thr = _below((v0 + u_cut * (v1 - v0)).to(data.X.dtype), srt.vals[ec + 1])
            thr = torch.maximum(thr, srt.vals[ec])
            lstats = left[c].to(pstat.dtype)
            rstats = pstat[sp] - lstats
            n_left = ec + 1 - s0[c]
            uid = trees.extra["uid"][pp[sp], nn[sp]]
            self._apply_splits(trees, pp[sp], nn[sp], uid, feat, thr, lstats, rstats, n_left)
        self._apply_stops(trees, pp[~split], nn[~split])
        return ExpansionResult(logw, split, U)

    # ----------------------------------------------------------------- apply
    def _apply_stops(self, trees: HardTrees, pp: torch.Tensor, nn: torch.Tensor) -> None:
        trees.status[pp, nn] = LEAF

    def _apply_splits(self, trees, pp, nn, uid, feat, thr, left, right, n_left) -> None:
        k = pp.numel()
        r = rank_within(pp)  # pairs are sorted by particle
        base = trees.n_nodes[pp] + 2 * r
        per_tree = torch.bincount(pp, minlength=trees.n_trees)
        trees.reserve(int((trees.n_nodes + 2 * per_tree).max()))
        c0, c1 = base, base + 1
        trees.feature[pp, nn] = feat.to(trees.feature.dtype)
        trees.threshold[pp, nn] = thr.to(trees.threshold.dtype)
        trees.left[pp, nn] = c0.to(trees.left.dtype)
        trees.right[pp, nn] = c1.to(trees.right.dtype)
        trees.status[pp, nn] = INTERNAL
        d1 = trees.depth[pp, nn] + 1
        n_parent = self.pool.cnt[uid]
        uids = self.pool.define(
            torch.cat([uid, uid]), torch.cat([feat, feat]), torch.cat([thr, thr]).double(),
            torch.cat([torch.zeros(k, dtype=torch.bool, device=pp.device), torch.ones(k, dtype=torch.bool, device=pp.device)]),
            torch.cat([n_left, n_parent - n_left]),
        )
        for c, st, u in ((c0, left, uids[:k]), (c1, right, uids[k:])):
            trees.status[pp, c] = OPEN
            trees.depth[pp, c] = d1
            trees.parent[pp, c] = nn.to(trees.parent.dtype)
            trees.stats[pp, c] = st
            trees.extra["uid"][pp, c] = u
        trees.n_nodes += 2 * per_tree


def _below(thr: torch.Tensor, upper: torch.Tensor) -> torch.Tensor:
    """Keep cuts strictly below ``upper`` after rounding to the data dtype, so the
    right child is never empty."""
    upper = upper.to(thr.dtype)
    return torch.where(thr < upper, thr, torch.nextafter(upper, torch.full_like(upper, -math.inf)))
