"""``TreeModel``: the hard-tree samplers' target (prior x leaf likelihood) and its bitset tables.

The moves (:mod:`torchtree.steps.moves`) keep, per node, the bitset of the training
points in it (``W = ceil(N / 64)`` int64 words); this module holds the tables and
the per-node computations on those bitsets: log posterior terms, data extents,
rule draws and cut densities.

Data extents. The prior needs, per node, the number of dimensions in which its
data vary and the data range in the split dimension. With ``pref[d, r]`` the
bitset of the points whose value in ``d`` has rank ``<= r`` (precomputed once,
``sum_d U_d x W`` words), a node is constant in ``d`` iff it is a subset of the
value class of any of its points, and its minimum / maximum rank in ``d`` come from
a binary search over ``r``. A node costs ``O(D W + W log U)`` word operations
instead of ``O(n_points D)``; class counts / statistics come from unpacking the
bitset and one matrix product with the per-point statistics.

Memory: ``sum_d U_d x N / 8`` bytes for the prefix table (a few MB on the UCI
benchmarks).
"""
from __future__ import annotations

import math

import torch

from torchtree.kernels.segments import segmented_searchsorted
from torchtree.model.likelihoods import DirichletMultinomial
from torchtree.model.priors import ChipmanPrior

__all__ = ["TreeModel", "INFORMED_CELLS", "INFORMED_MIX"]

_CHUNK = 1 << 18  # elements per temporary in the chunked bitset kernels (cache-sized)
#: cells of a node's range scored by the ``"informed"`` cut proposal, and the uniform share mixed in
INFORMED_CELLS, INFORMED_MIX = 16, 0.1


def _popcount(x: torch.Tensor) -> torch.Tensor:
    """Set bits per int64 element (SWAR). The masks clear the sign bits that an
    arithmetic shift drags in, so signed int64 is safe."""
    x = x - ((x >> 1) & 0x5555555555555555)
    x = (x & 0x3333333333333333) + ((x >> 2) & 0x3333333333333333)
    x = (x + (x >> 4)) & 0x0F0F0F0F0F0F0F0F
    return (x * 0x0101010101010101) >> 56


def _bit_of(idx: torch.Tensor):
    """(word, bit value) of point indices: the bitset of point i is ``1 << (i % 64)`` in word ``i // 64``."""
    return idx // 64, torch.ones_like(idx) << (idx % 64)


# ----------------------------------------------------------------------------- model
class TreeModel:
    """The samplers' target, prior x leaf likelihood on one data set, and its bitset tables.

    Parameters
    ----------
    prior : ChipmanPrior or PoissonPrior
    likelihood : DirichletMultinomial or NormalInverseGamma
    data : Data
    use_likelihood : bool
        False makes the target the prior (labels ignored).

    Attributes
    ----------
    W : int  words per bitset
    pstats : Tensor [N, S + 1] per-point sufficient statistics and a column of ones
    pref : LongTensor [1 + sum_d U_d, W] prefix bitsets (row 0 empty; dim d starts at ``off[d]``)
    rowbits : LongTensor [R, W] bitset of each distinct feature row
    split_prior : ChipmanPrior for split / stop terms and initial draws
    """

    def __init__(self, prior, likelihood, data, use_likelihood: bool = True) -> None:
        if likelihood.task != data.task:
            raise ValueError(f"likelihood {likelihood!r} is for {likelihood.task} but the data is {data.task}")
        self.prior, self.likelihood, self.data = prior, likelihood, data
        self.use_likelihood = bool(use_likelihood)
        self.chipman = getattr(prior, "name", "chipman") == "chipman"
        self.split_prior = prior if self.chipman else ChipmanPrior()
        dev = data.device
        self.X = data.X
        N, D = data.X.shape
        self.N, self.D, self.W = N, D, (N + 63) // 64
        ps = likelihood.point_stats(data.y, data.n_classes).to(likelihood.stats_dtype)
        self.S = ps.shape[1]
        self.pstats = torch.cat([ps, torch.ones(N, 1, dtype=ps.dtype, device=dev)], 1)
        self.rank = data.X_rank.long()
        self.n_unique = data.n_unique.long()
        self.umax = int(self.n_unique.max())
        self.sorted_flat = data.sorted_values.reshape(-1)
        self.off = 1 + torch.cat([torch.zeros(1, dtype=torch.long, device=dev), self.n_unique.cumsum(0)[:-1]])
        word, val = _bit_of(torch.arange(N, device=dev))
        rows = self.off[None, :] + self.rank  # [N, D] row of "value == x[n, d]"
        eq = torch.zeros(1 + int(self.n_unique.sum()), self.W, dtype=torch.long, device=dev)
        eq.index_put_((rows.reshape(-1), word.repeat_interleave(D)), val.repeat_interleave(D), accumulate=True)
        # The value classes of one dimension are disjoint, so a cumulative sum is a cumulative OR.
        pref = torch.zeros_like(eq)
        for d in range(D):
            s, e = int(self.off[d]), int(self.off[d]) + int(self.n_unique[d])
            pref[s:e] = eq[s:e].cumsum(0)
        self.pref = pref
        _, self.row_id = torch.unique(data.X, dim=0, return_inverse=True)
        rb = torch.zeros(int(self.row_id.max()) + 1, self.W, dtype=torch.long, device=dev)
        rb.index_put_((self.row_id, word), val, accumulate=True)
        self.rowbits = rb
        self.all_bits = torch.zeros(self.W, dtype=torch.long, device=dev).index_put_((word,), val, accumulate=True)
        # noteq[off[d] + v]: the points whose value in d is not the v-th distinct value.
        prev = torch.cat([torch.zeros(1, self.W, dtype=torch.long, device=dev), pref[:-1]])
        first = torch.zeros(pref.shape[0], dtype=torch.bool, device=dev)
        first[self.off] = True
        self.noteq = ~pref | torch.where(first[:, None], torch.zeros_like(pref), prev)
        self.pref2 = torch.cat([pref, ~pref])  # rows R + r: the complement of pref[r]
        self.class_bits = None
        if data.task == "classification" and isinstance(likelihood, DirichletMultinomial):
            cb = torch.zeros(self.S, self.W, dtype=torch.long, device=dev)
            self.class_bits = cb.index_put_((data.y.long(), word), val, accumulate=True)
        self._lut = ((torch.arange(256, device=dev)[:, None] >> torch.arange(8, device=dev)) & 1).bool()
        self.XT = data.X.transpose(0, 1).float().contiguous()  # [D, N]: one feature's column per row
        self.class_of_point = data.y.long() if self.class_bits is not None else None

    # ---------------------------------------------------------------- terms
    def loglik(self, stats: torch.Tensor) -> torch.Tensor:
        """Leaf log marginal likelihood ``[..., S] -> [...]`` float64 (0 without likelihood)."""
        if not self.use_likelihood:
            return torch.zeros(stats.shape[:-1], dtype=torch.float64, device=stats.device)
        return self.likelihood.log_marginal(stats)

    def leaf_term(self, depth: torch.Tensor, nonconst: torch.Tensor, stats: torch.Tensor) -> torch.Tensor:
        """Per-leaf term: ``log(1 - p_split(depth))`` if the leaf could split, plus log l(Y)."""
        ll = self.loglik(stats)
        if not self.chipman:
            return ll
        _, lpn = self.split_prior.log_split_probs(depth)
        return ll + torch.where(nonconst, lpn, torch.zeros_like(lpn))

    def internal_term(self, depth: torch.Tensor, nvary: torch.Tensor, rng: torch.Tensor) -> torch.Tensor:
        """Per-split term: ``log p_split(depth) - log nv - log range`` (rule density, eq. 4-5)."""
        rule = -torch.log(nvary.clamp(min=1).double()) - torch.log(rng.double().clamp(min=1e-300))
        if not self.chipman:
            return rule
        lps, _ = self.split_prior.log_split_probs(depth)
        return lps + rule

    def global_term(self, n_leaves: torch.Tensor) -> torch.Tensor:
        """Whole-tree term: the Poisson prior's ``log p(m)`` (0 for the Chipman prior), [P] float64."""
        if self.chipman:
            return torch.zeros(n_leaves.shape, dtype=torch.float64, device=n_leaves.device)
        return self.prior.log_prob_leaves(n_leaves)

    # ------------------------------------------------------------ bitset kernels
    def node_stats(self, B: torch.Tensor) -> torch.Tensor:
        """Sufficient statistics and point count of node bitsets: ``[n, W] -> [n, S + 1]``.

        Class counts are popcounts of ``B & class_bits[k]``; other statistics come from
        unpacking the bitsets and one matrix product with the per-point statistics.
        """
        n = B.shape[0]
        out = torch.empty(n, self.S + 1, dtype=self.pstats.dtype, device=B.device)
        if self.class_bits is not None:
            step = max(1, _CHUNK // (self.S * self.W))
            for s in range(0, n, step):
                cnt = _popcount(B[s:s + step, None, :] & self.class_bits[None]).sum(-1)
                out[s:s + step, : self.S] = cnt.to(out.dtype)
                out[s:s + step, self.S] = cnt.sum(1).to(out.dtype)
            return out
        step = max(1, _CHUNK // (8 * self.W * 8))
        for s in range(0, n, step):
            by = B[s:s + step].contiguous().view(torch.uint8).reshape(-1).long()  # little-endian bytes
            m = self._lut.index_select(0, by).view(-1, self.W * 64)[:, : self.N]
            out[s:s + step] = m.to(self.pstats.dtype) @ self.pstats
        return out

    def first_point(self, B: torch.Tensor) -> torch.Tensor:
        """Index of the lowest point of each non-empty bitset ``[n, W] -> [n]`` (0 if empty)."""
        w0 = (B != 0).to(torch.uint8).argmax(1)
        x = B.gather(1, w0[:, None]).squeeze(1)
        low = (x & -x).double().abs()  # 2^b exactly, also for b = 63
        b = torch.where(low > 0, torch.log2(low.clamp(min=1)).round().long(), torch.zeros_like(w0))
        return w0 * 64 + b

    def nonconst(self, B: torch.Tensor) -> torch.Tensor:
        """True where the node's points are not all the same feature row (it could split)."""
        rb = self.rowbits.index_select(0, self.row_id.index_select(0, self.first_point(B)))
        return ((B & ~rb) != 0).any(1)

    def varying(self, B: torch.Tensor) -> torch.Tensor:
        """Dimensions in which each node's data vary: ``[n, W] -> bool [n, D]``."""
        n = B.shape[0]
        out = torch.empty(n, self.D, dtype=torch.bool, device=B.device)
        step = max(1, _CHUNK // (self.D * self.W))
        for s in range(0, n, step):
            b = B[s:s + step]
            r0 = self.rank.index_select(0, self.first_point(b))  # [m, D] ranks of one member
            rows = (self.off[None, :] + r0).reshape(-1)
            # Constant in d iff no point has a value other than the member's.
            other = self.noteq.index_select(0, rows).view(r0.shape + (self.W,))
            out[s:s + step] = ((b[:, None, :] & other) != 0).any(-1)
        return out

    def extent(self, B: torch.Tensor, f: torch.Tensor):
        """Smallest and largest value of dimension ``f [n]`` among each node's points.

        Binary searches over the prefix bitsets. Returns ``(lo, hi)`` in the data dtype.
        """
        lo, hi, _, _ = self.extent_ranks(B, f)
        return lo, hi

    def extent_ranks(self, B: torch.Tensor, f: torch.Tensor):
        """:meth:`extent` and the ranks of the two values among the distinct values of ``f``.

        Returns ``(lo, hi, rank_lo, rank_hi)``, each [n].
        """
        n = B.shape[0]
        BB = torch.cat([B, B])
        ff = torch.cat([f, f])
        want_hit = torch.cat([torch.ones(n, dtype=torch.bool, device=B.device), torch.zeros(n, dtype=torch.bool, device=B.device)])
        lo = torch.zeros_like(ff)
        hi = self.n_unique.index_select(0, ff) - 1
        # min rank: first r with B & pref[r] != 0; max rank: first r with B & ~pref[r] == 0.
        base = self.off.index_select(0, ff) + torch.where(want_hit, 0, self.pref.shape[0])
        for _ in range(max(1, self.umax).bit_length() + 1):
            mid = (lo + hi) // 2
            ok = ((BB & self.pref2.index_select(0, base + mid)) != 0).any(1) == want_hit
            hi = torch.where(ok, mid, hi)
            lo = torch.where(ok, lo, torch.minimum(mid + 1, hi))
        vals = self.sorted_flat.index_select(0, ff * self.umax + lo)
        return vals[:n], vals[n:], lo[:n], lo[n:]

    def gap_cut(self, f: torch.Tensor, r_lo: torch.Tensor, r_hi: torch.Tensor, u: torch.Tensor):
        """The ``cut_proposal="data"`` draw: a gap between consecutive distinct values of
        ``f`` uniform among the ``r_hi - r_lo`` gaps of the node's range, then the cut
        uniform in that gap.

        Returns (threshold in the data dtype, its rank, log density float64 of the cut).
        """
        n_gap = (r_hi - r_lo).clamp(min=1)
        s = u.double() * n_gap.double()
        k = torch.minimum(s.floor().long(), n_gap - 1)
        r = r_lo + k
        base = f * self.umax
        top = torch.minimum(r + 1, self.n_unique.index_select(0, f) - 1).clamp(min=0)
        a = self.sorted_flat.index_select(0, base + r)
        b = self.sorted_flat.index_select(0, base + top)
        thr, _ = _cut(a, b, (s - k.double()).clamp(0.0, 1.0))
        return thr, r, self.log_gap_density(f, r, r_lo, r_hi)

    def log_gap_density(self, f: torch.Tensor, r: torch.Tensor, r_lo: torch.Tensor, r_hi: torch.Tensor) -> torch.Tensor:
        """Log density of a cut of rank ``r`` under the ``"data"`` proposal on a node whose
        values of ``f`` have ranks ``r_lo .. r_hi``: ``-log(r_hi - r_lo) - log(v[r + 1] - v[r])``."""
        base = f * self.umax
        rr = r.clamp(min=0)
        top = torch.minimum(rr + 1, self.n_unique.index_select(0, f) - 1).clamp(min=0)
        gap = self.sorted_flat.index_select(0, base + top).double() - self.sorted_flat.index_select(0, base + rr).double()
        return -torch.log((r_hi - r_lo).clamp(min=1).double()) - torch.log(gap.clamp(min=1e-300))

    def informed_cell_logp(self, B: torch.Tensor, f: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor) -> torch.Tensor:
        """Log-probabilities of the ``INFORMED_CELLS`` equal cells of each node's range in
        ``f`` under the ``cut_proposal="informed"`` proposal.

        A cell's score is the log marginal likelihood of the node split at the cell's
        midpoint into two leaves (the subtree below, if any, is ignored: any score that
        depends only on the node's data keeps the proposal exact, since forward and
        reverse moves see the same data). The cell probabilities are
        ``(1 - eps) softmax(score) + eps / G`` with ``eps = INFORMED_MIX``, so every cell
        keeps some mass and the proposal ratio stays bounded.

        Parameters
        ----------
        B : LongTensor [n, W] node bitsets
        f : LongTensor [n] dimension
        lo, hi : Tensor [n] the node's smallest and largest value in ``f`` (data dtype)

        Returns
        -------
        Tensor [n, G] float64
        """
        n, G = B.shape[0], INFORMED_CELLS
        if n == 0 or not self.use_likelihood:
            return torch.full((n, G), -math.log(G), dtype=torch.float64, device=B.device)
        # Histogram of the node's points over the G + 1 slots between consecutive cell
        # midpoints (slot c: the points left of midpoint c but not of c - 1), one pass
        # over the points instead of G bitset intersections per class; prefix sums then
        # give the left child's statistics at every midpoint.
        rng = (hi.double() - lo.double()).clamp(min=1e-300)
        S, N = self.S, self.N
        hist = torch.zeros(n, G + 1, S, dtype=torch.float64, device=B.device)
        step = max(1, _CHUNK // max(N, 1))
        for s0 in range(0, n, step):
            b = B[s0:s0 + step]
            m = b.shape[0]
            by = b.contiguous().view(torch.uint8).reshape(-1).long()
            inside = self._lut.index_select(0, by).view(m, self.W * 64)[:, :N]
            # float32 is enough to place points in slots: any deterministic rule keeps the
            # proposal exact, and forward and reverse moves evaluate the same one
            x = self.XT.index_select(0, f[s0:s0 + step])  # [m, N]
            t = (x - lo[s0:s0 + step].float()[:, None]) * (G / rng[s0:s0 + step, None]).float() - 0.5
            # a zero range (a non-varying dimension, e.g. a leaf's unused rule) gives 0 * inf
            t = torch.nan_to_num(t, nan=0.0, posinf=float(G), neginf=0.0)
            slot = torch.ceil(t).clamp(0, G).long() + (G + 1) * torch.arange(m, device=B.device)[:, None]
            if self.class_of_point is not None:
                flat = (slot * S + self.class_of_point[None, :])[inside]
                hist[s0:s0 + step] = torch.bincount(flat, minlength=m * (G + 1) * S).view(m, G + 1, S).double()
            else:
                pts = inside.nonzero(as_tuple=True)
                hist[s0:s0 + step].view(-1, S).index_add_(0, slot[pts], self.pstats[pts[1], :S].double())
        cum = hist.cumsum(1)
        s_left, s_node = cum[:, :G], cum[:, G:]
        s_right = s_node - s_left
        if self.class_of_point is not None and hasattr(self.likelihood, "log_marginal_counts"):
            # integral counts: lgamma by table lookup (lgamma itself dominated the cost)
            score = (self.likelihood.log_marginal_counts(s_left.long(), N)
                     + self.likelihood.log_marginal_counts(s_right.long(), N))
        else:
            score = self.loglik(s_left.to(self.pstats.dtype)) + self.loglik(s_right.to(self.pstats.dtype))
        p = torch.softmax(score, 1) * (1.0 - INFORMED_MIX) + INFORMED_MIX / G
        return p.log()

    def informed_cut(self, logp, f, lo, hi, u):
        """Draw a cut from the ``"informed"`` proposal given the cell log-probabilities
        ``logp [n, G]`` of :meth:`informed_cell_logp`: a cell by inversion of ``u [n]``, then
        uniform in it (the remainder of ``u`` inside the cell's share is again uniform).

        Returns (threshold in the data dtype, its rank, log density float64 of the cut).
        """
        G = logp.shape[1]
        cdf = logp.exp().cumsum(1)
        cdf = cdf / cdf[:, -1:]
        uu = u.double()[:, None]
        g = (cdf <= uu).sum(1).clamp(max=G - 1)
        below = torch.where(g > 0, cdf.gather(1, (g - 1).clamp(min=0)[:, None]).squeeze(1), torch.zeros_like(u.double()))
        width = cdf.gather(1, g[:, None]).squeeze(1) - below
        frac = ((u.double() - below) / width.clamp(min=1e-300)).clamp(0.0, 1.0)
        thr, _ = _cut(lo, hi, (g.double() + frac) / G)
        return thr, self.threshold_rank(f, thr), self.informed_log_density(logp, thr, lo, hi)

    @staticmethod
    def informed_log_density(logp, thr, lo, hi) -> torch.Tensor:
        """Log density of cut ``thr [n]`` under the ``"informed"`` proposal with cell
        log-probabilities ``logp [n, G]`` on ranges ``[lo, hi)``."""
        G = logp.shape[1]
        rng = hi.double() - lo.double()
        pos = ((thr.double() - lo.double()) / rng.clamp(min=1e-300) * G).floor().long().clamp(0, G - 1)
        return logp.gather(1, pos[:, None]).squeeze(1) + math.log(G) - torch.log(rng.clamp(min=1e-300))

    def threshold_rank(self, f: torch.Tensor, thr: torch.Tensor) -> torch.Tensor:
        """Rank ``r`` with ``sorted[f, r] <= thr < sorted[f, r + 1]`` (``-1`` below the minimum)."""
        if f.numel() == 0:
            return f
        starts = f * self.umax
        return segmented_searchsorted(self.sorted_flat, starts, starts + self.n_unique.index_select(0, f), thr, right=True) - 1

    def split_bits(self, B: torch.Tensor, f: torch.Tensor, r: torch.Tensor, right: torch.Tensor) -> torch.Tensor:
        """Child bitsets: ``B & pref[f, r]`` (left) or ``B & ~pref[f, r]`` (right)."""
        pr = self.pref.index_select(0, torch.where(r >= 0, self.off.index_select(0, f) + r, torch.zeros_like(r)))
        return torch.where(right[:, None], B & ~pr, B & pr)

    def draw_rule(self, B: torch.Tensor, vary: torch.Tensor, u_dim: torch.Tensor, u_cut: torch.Tensor):
        """Prior draw of a rule on nodes ``B`` (dimension uniform over the varying ones,
        cut uniform on the data range).

        Returns (feature, threshold, threshold rank, n varying, range float64), each [n].
        """
        f, nv = _choose(vary, u_dim)
        lo, hi = self.extent(B, f)
        thr, rng = _cut(lo, hi, u_cut)
        return f, thr, self.threshold_rank(f, thr), nv, rng


def _cut(lo: torch.Tensor, hi: torch.Tensor, u: torch.Tensor):
    """Cut uniform on ``[lo, hi)`` in the data dtype; returns (threshold, range float64)."""
    rng = hi.double() - lo.double()
    thr = (lo.double() + u * rng).to(lo.dtype)
    # Rounding to the data dtype may land on the maximum: keep the right child non-empty.
    thr = torch.where(thr < hi, thr, torch.nextafter(hi, torch.full_like(hi, -math.inf)))
    return torch.maximum(thr, lo), rng


def _kth_true(mask: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Column of the k-th True of each row of ``mask [P, C]`` (k < count)."""
    return (mask.long().cumsum(1) > k[:, None]).to(torch.uint8).argmax(1)


def _choose(mask: torch.Tensor, u: torch.Tensor):
    """Uniform choice of a True column per row; returns (column, count)."""
    cnt = mask.sum(1)
    k = torch.minimum((u * cnt.double()).long(), (cnt - 1).clamp(min=0))
    return _kth_true(mask, k), cnt
