"""``TreeModel``: the hard-tree samplers' target (prior x leaf likelihood) and its data tables.

The moves (:mod:`torchtree.steps.moves`) work on node bitsets, the training points in a
node (``W = ceil(N / 64)`` int64 words); this module holds the data tables and the
per-node computations on those bitsets: log posterior terms, class counts, data extents,
varying dimensions and child bitsets. How cuts are proposed lives in
:mod:`torchtree.steps.cut_proposals`.

Bucket tables. Each feature's distinct values are grouped into ``K_d <= K`` buckets of
consecutive values (quantiles of the points; one value per bucket when the tables fit in
``_EXACT_BYTES``, as on small data), and ``table[boff[d] + k]`` is the bitset of the points
in buckets ``<= k`` (``outside``: the points not in bucket ``k``). A node lies inside one
bucket iff ``B & outside == 0``; its lowest / highest bucket in ``d`` comes from a binary
search over the table (``O(W log K)`` words); the exact rank inside a bucket, and a cut
inside a bucket, from the bucket's points, a run of the points sorted by rank
(``O(N / K)``). Nodes of few points are unpacked instead (:meth:`TreeModel.members`).
Class counts are popcounts of the node's bitset AND the class bitsets (``O(S W)``); other
statistics one unpacked row times the per-point statistics (``O(N)`` per node, in bounded
chunks).

Memory: ``O(N D)``: the data, ranks and rank order, the class bitsets, and the bucket
tables (``_TABLE_BYTES``, at least ``_MIN_BUCKETS`` per feature); temporaries of at most
``_MEMBER_CHUNK`` members / ``_WORD_CHUNK`` words whatever the batch. Nothing grows as ``N^2``.

``max_bins``: the model can instead be built on the data ranked into at most
``max_bins`` quantile bins per feature (:func:`quantile_binned`); the cuts are then
uniform over the grid's range instead of the data's, and :meth:`TreeModel.on_grid` moves
the thresholds of binned features in the returned trees down onto the grid (the largest
grid value below them, which changes no training point's route).
"""
from __future__ import annotations

from typing import Iterator, Optional, Tuple

import torch

from torchtree.kernels import distinct as _distinct
from torchtree.kernels import native
from torchtree.kernels.bitsets import bit_of, count_bits, extent_ranks as extent_ranks_native, split_bits as split_bits_native
from torchtree.kernels.segments import ragged_arange, rows_searchsorted
from torchtree.model.likelihoods import DirichletMultinomial
from torchtree.model.priors import ChipmanPrior
from torchtree.model.routing import routed_node_bits
from torchtree.model.trees import INTERNAL, HardTrees

__all__ = ["TreeModel", "quantile_binned", "bit_of"]

_CHUNK = 1 << 18  # elements per temporary in the chunked unpack-and-multiply kernels (cache-sized)
_WORD_CHUNK = 1 << 22  # bitset words scanned for non-zero words at once (32 MB)
_MEMBER_CHUNK = 1 << 21  # members (node, point) per temporary: with D gathered ranks, ~200 MB at D = 10
_TABLE_BYTES = 1 << 28  # the bucket tables' budget (256 MB) ...
_MIN_BUCKETS = 16  # ... or 16 buckets per dimension, 4 bytes per value, if that is more
_EXACT_BYTES = 1 << 28  # but one bucket per distinct value when that takes at most 256 MB (no scans in buckets)
_SMALL_WORK = 1 << 16  # words below which a batch takes the path of fewest operations, not of least work
_KEEP_BITS_BYTES = 1 << 25  # trees keep per-node bitsets up to this size (32 MB at 64 nodes per tree; measured crossover)


def quantile_binned(data, max_bins: int):
    """``data`` with every feature of more than ``max_bins`` distinct values ranked into at
    most ``max_bins`` quantile bins: a value goes to bin ``floor(max_bins * below / N)``
    (``below``: the points with a smaller value, so equal values share a bin) and is replaced
    by the largest value of its bin. Features with at most ``max_bins`` values are unchanged.

    Parameters
    ----------
    data : Data [N, D]
    max_bins : int >= 1

    Returns
    -------
    Data: a copy (the same object when no feature needs binning).
    """
    if int(max_bins) < 1:
        raise ValueError(f"max_bins must be at least 1, got {max_bins}")
    nu = data.n_unique.tolist()
    if max(nu) <= max_bins:
        return data
    N, D = data.X.shape
    side = data.encoder.missing_sides().tolist() if getattr(data, "encoder", None) is not None else [0] * D
    X, rank, sv = data.X.clone(), data.X_rank.clone(), []
    for d in range(D):
        vals = data.sorted_values[d, : nu[d]]
        if nu[d] <= max_bins:
            sv.append(vals)
            continue
        cnt = torch.bincount(data.X_rank[:, d], minlength=nu[d])
        b = (cnt.cumsum(0) - cnt) * max_bins // N  # bin of each distinct value, non-decreasing
        if side[d] > 0:  # missing values' stand-in above: a bin of its own ("is missing" stays a cut)
            b[-1] = torch.maximum(b[-1], b[-2] + 1)
        elif side[d] < 0:
            b[1:] += (b[1] == b[0]).long()
        last = torch.ones_like(b, dtype=torch.bool)
        last[:-1] = b[1:] != b[:-1]  # the largest value of each bin represents it
        new_rank = torch.cat([torch.zeros(1, dtype=torch.long, device=b.device), last[:-1].long().cumsum(0)])
        rank[:, d] = new_rank.index_select(0, data.X_rank[:, d])
        grid = vals[last]
        X[:, d] = grid.index_select(0, rank[:, d])
        sv.append(grid)
    out = object.__new__(type(data))
    out.__dict__.update(data.__dict__)
    umax = max(v.numel() for v in sv)
    out.sorted_values = torch.full((D, umax), float("inf"), dtype=data.X.dtype, device=data.device)
    for d, v in enumerate(sv):
        out.sorted_values[d, : v.numel()] = v
    out.X, out.X_rank = X, rank
    out.n_unique = torch.tensor([v.numel() for v in sv], dtype=data.n_unique.dtype, device=data.device)
    out.feature_min, out.feature_max = X.min(0).values, X.max(0).values
    return out


# ----------------------------------------------------------------------------- model
class TreeModel:
    """The samplers' target, prior x leaf likelihood on one data set, and its data tables.

    Parameters
    ----------
    prior : ChipmanPrior or PoissonPrior
    likelihood : DirichletMultinomial or NormalInverseGamma
    data : Data
    use_likelihood : bool
        False makes the target the prior (labels ignored).
    max_bins : int, optional
        Fit the data ranked into at most ``max_bins`` quantile bins per feature (a
        change of the split prior: cuts uniform over the grid's range); None: the data.

    Attributes
    ----------
    data : Data, the data the target is defined on (binned when ``max_bins`` is set)
    W : int  words per bitset
    pstats : Tensor [N, S + 1] per-point sufficient statistics and a column of ones
    rank : LongTensor [N, D] rank of each value among the distinct values of its feature
    row_id : LongTensor [N] index of each point's feature row among the distinct rows
    class_bits : LongTensor [S, W] bitset of each class (Dirichlet-multinomial only), or None
    split_prior : ChipmanPrior for split / stop terms and initial draws
    """

    def __init__(self, prior, likelihood, data, use_likelihood: bool = True, max_bins: Optional[int] = None) -> None:
        if likelihood.task != data.task:
            raise ValueError(f"likelihood {likelihood!r} is for {likelihood.task} but the data is {data.task}")
        self.max_bins = None if max_bins is None else int(max_bins)
        #: features ranked into bins (more than max_bins distinct values): their thresholds go onto the grid
        self.binned = data.n_unique > (self.max_bins if self.max_bins is not None else data.n_unique.max())
        if bool(self.binned.any()):
            data = quantile_binned(data, self.max_bins)
        self.prior, self.likelihood, self.data = prior, likelihood, data
        self.use_likelihood = bool(use_likelihood)
        self.chipman = getattr(prior, "name", "chipman") == "chipman"
        self.split_prior = prior if self.chipman else ChipmanPrior()
        dev = data.device
        self.X = data.X
        self.groups = None if getattr(data, "groups", None) is None else data.groups.to(dev)  # feature_groups
        N, D = data.X.shape
        self.N, self.D, self.W = N, D, (N + 63) // 64
        ps = likelihood.point_stats(data.y, data.n_classes).to(likelihood.stats_dtype)
        self.S = ps.shape[1]
        self.pstats = torch.cat([ps, torch.ones(N, 1, dtype=ps.dtype, device=dev)], 1)
        self.rank = data.X_rank.long()
        self.rank_flat = self.rank.reshape(-1)
        self.n_unique = data.n_unique.long()
        self.umax = int(self.n_unique.max())
        self.sorted_flat = data.sorted_values.reshape(-1)
        word, val = bit_of(torch.arange(N, device=dev))
        _, self.row_id = torch.unique(data.X, dim=0, return_inverse=True)
        self.all_bits = torch.zeros(self.W, dtype=torch.long, device=dev).index_put_((word,), val, accumulate=True)
        self.class_bits = None
        if data.task == "classification" and isinstance(likelihood, DirichletMultinomial):
            cb = torch.zeros(self.S, self.W, dtype=torch.long, device=dev)
            self.class_bits = cb.index_put_((data.y.long(), word), val, accumulate=True)
        self._lut = ((torch.arange(256, device=dev)[:, None] >> torch.arange(8, device=dev)) & 1).bool()
        self.native = native.usable(dev)  # compiled bitset kernels (CPU)
        self.XT = data.X.transpose(0, 1).float().contiguous()  # [D, N]: one feature's column per row
        self.class_of_point = data.y.long() if self.class_bits is not None else None
        self._build_buckets(word, val)

    def _build_buckets(self, word: torch.Tensor, val: torch.Tensor) -> None:
        """The bucket prefix table: per dimension ``K_d = min(U_d, K)`` buckets of
        consecutive distinct values (quantiles of the points when ``U_d > K``), ``K`` as
        large as ``_TABLE_BYTES`` allows (at least ``_MIN_BUCKETS``), or every value its own
        bucket when that fits in ``_EXACT_BYTES``; ``table[boff[d] + k]`` is the bitset of the
        points in buckets ``<= k`` of ``d`` (row 0: empty)."""
        N, D, W, dev = self.N, self.D, self.W, self.X.device
        kmax = max(_MIN_BUCKETS, _TABLE_BYTES // (16 * D * W))
        if 16 * int(self.n_unique.sum()) * W <= _EXACT_BYTES:  # exact tables (one value per bucket) if they are small
            kmax = self.umax
        self.bucket_of = torch.zeros(D, self.umax, dtype=torch.long, device=dev)  # bucket of each distinct value
        firsts, lasts, counts = [], [], []
        for d, u in enumerate(self.n_unique.tolist()):
            if u <= kmax:
                b = torch.arange(u, device=dev)
            else:
                cnt = torch.bincount(self.rank[:, d], minlength=u)
                b = (cnt.cumsum(0) - cnt) * kmax // N
                b = torch.cat([b.new_zeros(1), (b[1:] != b[:-1]).long().cumsum(0)])
            self.bucket_of[d, :u] = b
            k = int(b[-1]) + 1
            last = torch.zeros(k, dtype=torch.long, device=dev).scatter_reduce_(0, b, torch.arange(u, device=dev), "amax", include_self=False)
            lasts.append(last)
            firsts.append(torch.cat([last.new_zeros(1), last[:-1] + 1]))
            counts.append(k)
        self.n_buckets = torch.tensor(counts, dtype=torch.long, device=dev)
        self.boff = 1 + torch.cat([self.n_buckets.new_zeros(1), self.n_buckets.cumsum(0)[:-1]])
        self.bucket_first = torch.cat([self.n_buckets.new_zeros(1)] + firsts)  # by table row
        self.bucket_last = torch.cat([self.n_buckets.new_full((1,), -1)] + lasts)
        self.bucket_flat = self.bucket_of.reshape(-1)
        rows = self.boff[None, :] + self.bucket_of.gather(1, self.rank.t()).t()  # [N, D]
        t = torch.zeros(1 + int(self.n_buckets.sum()), W, dtype=torch.long, device=dev)
        t.index_put_((rows.reshape(-1), word.repeat_interleave(D)), val.repeat_interleave(D), accumulate=True)
        for d in range(D):  # the buckets of one dimension are disjoint: a cumulative sum is a cumulative OR
            s = int(self.boff[d])
            t[s:s + counts[d]] = t[s:s + counts[d]].cumsum(0)
        self.table = t
        # The points of each dimension in rank order, and where each bucket's (and each value's) run ends:
        # a bucket's points are a run of that order, so a scan inside one bucket costs its points only.
        self.pts_by_rank = torch.argsort(self.rank, dim=0, stable=True).t().contiguous().reshape(-1).to(torch.int32)
        cnt = torch.zeros(D, self.umax, dtype=torch.long, device=dev)
        cnt.scatter_add_(1, self.rank.t(), torch.ones(D, N, dtype=torch.long, device=dev))
        self.value_end = (cnt.cumsum(1) + N * torch.arange(D, device=dev)[:, None]).reshape(-1)  # flat positions
        # a node holding a point whose value in d is its own varies in d iff it holds another point
        self.unique_value = (cnt.gather(1, self.rank.t()) == 1).t().contiguous()  # bool [N, D]
        self.unique_row = torch.bincount(self.row_id).index_select(0, self.row_id) == 1  # bool [N]
        dim_of_row = torch.repeat_interleave(torch.arange(D, device=dev), self.n_buckets)
        self.run_end = torch.cat([torch.zeros(1, dtype=torch.long, device=dev),
                                  self.value_end.index_select(0, dim_of_row * self.umax + self.bucket_last[1:])])
        self.run_start = torch.where(self.bucket_first > 0, self.value_end.index_select(0, (torch.cat([dim_of_row.new_zeros(1), dim_of_row]) * self.umax + self.bucket_first - 1).clamp(min=0)),
                                     torch.cat([dim_of_row.new_zeros(1), dim_of_row]) * N)
        self._dims_by_values = torch.argsort(self.n_unique, descending=True, stable=True).tolist()
        # outside[row]: the points not in the bucket of that row (row 0: all), to test "inside one bucket"
        rows = torch.arange(t.shape[0], device=dev)
        prev = torch.where(self.bucket_first == 0, torch.zeros_like(rows), rows - 1)
        self.outside = ~t | t.index_select(0, prev)

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
        """Per-split term: ``log p_split(depth) - log nv - log range`` (rule density, eq. 4-5); ``nvary``
        is ``1 / P(column)``, :func:`~torchtree.model.feature_groups.choice_count`."""
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
    def members(self, B: torch.Tensor) -> Iterator[Tuple[torch.Tensor, torch.Tensor]]:
        """The points of node bitsets, in chunks: yields ``(node [m], point [m])`` LongTensors.

        Nodes in order, each node's points ascending; a node may span several chunks.
        Scans ``O(W)`` words per node and expands only the non-zero ones (64 bits each),
        at most ``_WORD_CHUNK`` words and ``_MEMBER_CHUNK`` bits per temporary.

        Parameters
        ----------
        B : LongTensor [n, W]
        """
        n, W = B.shape
        rstep = max(1, _WORD_CHUNK // max(W, 1))
        wstep = max(1, _MEMBER_CHUNK // 64)
        for r0 in range(0, n, rstep):
            b = B[r0:r0 + rstep]
            rows, words = (b != 0).nonzero(as_tuple=True)
            vals = b[rows, words]
            for s in range(0, rows.numel(), wstep):
                v = vals[s:s + wstep].contiguous()
                bits = self._lut.index_select(0, v.view(torch.uint8).long()).view(-1, 64)  # little-endian bytes
                k, bit = bits.nonzero(as_tuple=True)
                yield rows[s:s + wstep].index_select(0, k) + r0, words[s:s + wstep].index_select(0, k) * 64 + bit

    def count(self, B: torch.Tensor) -> torch.Tensor:
        """Points in each node: ``[n, W] -> [n]`` long."""
        return count_bits(B, None, self.native)

    def node_stats(self, B: torch.Tensor) -> torch.Tensor:
        """Sufficient statistics and point count of node bitsets: ``[n, W] -> [n, S + 1]``.

        Class counts are popcounts of ``B & class_bits[k]``; other statistics come from
        unpacking the bitsets and one matrix product with the per-point statistics (the
        same summation order whatever the node, so results do not depend on batching).
        """
        n = B.shape[0]
        out = torch.empty(n, self.S + 1, dtype=self.pstats.dtype, device=B.device)
        if self.class_bits is not None:
            cnt = count_bits(B, self.class_bits, self.native)
            out[:, : self.S] = cnt.to(out.dtype)
            out[:, self.S] = cnt.sum(1).to(out.dtype)
            return out
        step = max(1, _CHUNK // (8 * self.W * 8))
        for s in range(0, n, step):
            by = B[s:s + step].contiguous().view(torch.uint8).reshape(-1).long()  # little-endian bytes
            m = self._lut.index_select(0, by).view(-1, self.W * 64)[:, : self.N]
            out[s:s + step] = m.to(self.pstats.dtype) @ self.pstats
        return out

    def _two_or_more(self, B: torch.Tensor) -> torch.Tensor:
        """Whether each node holds at least two points: ``[n, W] -> bool [n]``."""
        step = max(1, _CHUNK // self.W)
        parts = [((b & (b - 1)) != 0).any(1) | ((b != 0).sum(1) >= 2) for b in B.split(step)]
        return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.bool, device=B.device)

    def first_point(self, B: torch.Tensor) -> torch.Tensor:
        """Index of the lowest point of each non-empty bitset ``[n, W] -> [n]`` (0 if empty)."""
        w0 = (B != 0).to(torch.uint8).argmax(1)
        x = B.gather(1, w0[:, None]).squeeze(1)
        low = (x & -x).double().abs()  # 2^b exactly, also for b = 63
        b = torch.where(low > 0, torch.log2(low.clamp(min=1)).round().long(), torch.zeros_like(w0))
        return w0 * 64 + b

    def nonconst(self, B: torch.Tensor) -> torch.Tensor:
        """True where the node's points are not all the same feature row (it could split): ``[n, W] -> bool [n]``.

        Tests one dimension at a time, those with the most distinct values first, and stops
        as soon as every node is seen to vary: most nodes settle in the first dimension.
        """
        if B.shape[0] * self.D * self.W < _SMALL_WORK:  # a small batch: fewer operations at once
            return self.varying(B).any(1)
        fp = self.first_point(B)
        # a point whose feature row is its own: the node varies iff it holds another point
        own_row = self.unique_row.index_select(0, fp)
        out = own_row & self._two_or_more(B)
        todo = (~own_row).nonzero().squeeze(1)
        r0 = self.rank.index_select(0, fp)  # [n, D]
        for d in self._dims_by_values:
            if todo.numel() == 0:
                break
            b = B.index_select(0, todo)
            rows = self.boff[d] + self.bucket_of[d].index_select(0, r0[todo, d])
            v = ((b & self.outside.index_select(0, rows)) != 0).any(1)
            multi = (self.bucket_last.index_select(0, rows) > self.bucket_first.index_select(0, rows)) & ~v
            if bool(multi.any()):
                sel = multi.nonzero().squeeze(1)
                lo, hi = self._run_extents(b.index_select(0, sel), rows.index_select(0, sel), torch.full_like(sel, int(d)))
                v[sel] = hi > lo
            out[todo[v]] = True
            todo = todo[~v]
        return out

    def rank_extents(self, B: torch.Tensor, f: Optional[torch.Tensor] = None):
        """Smallest and largest rank of each node's points, in every dimension or in ``f``.

        Parameters
        ----------
        B : LongTensor [n, W]
        f : LongTensor [n, k], optional: the dimensions wanted per node (default all D)

        Returns
        -------
        (lo, hi) LongTensors [n, k] (``[n, D]`` without ``f``); an empty node gets ``lo = hi = 0``.
        """
        n = B.shape[0]
        k = self.D if f is None else f.shape[1]
        lo = torch.full((n, k), self.umax, dtype=torch.long, device=B.device)
        hi = torch.full((n, k), -1, dtype=torch.long, device=B.device)
        for node, pt in self.members(B):
            if f is None:
                r = self.rank.index_select(0, pt)
            else:
                r = self.rank_flat.index_select(0, (pt[:, None] * self.D + f.index_select(0, node)).reshape(-1)).view(-1, k)
            idx = node[:, None].expand(-1, k)
            lo.scatter_reduce_(0, idx, r, "amin")
            hi.scatter_reduce_(0, idx, r, "amax")
        empty = hi < 0
        return lo.masked_fill(empty, 0), hi.masked_fill(empty, 0)

    def _run_members(self, B: torch.Tensor, start: torch.Tensor, end: torch.Tensor, rows: Optional[torch.Tensor] = None):
        """The points of runs ``[start, end)`` of the rank order that are in ``B`` (run i against
        row i, or row ``rows[i]``), in chunks: yields ``(i [k], point [k])``; costs the runs' lengths."""
        lens = (end - start).clamp(min=0)
        m, s0, csum = lens.numel(), 0, lens.cumsum(0)
        while s0 < m:
            base = int(csum[s0 - 1]) if s0 else 0
            s1 = max(s0 + 1, int(torch.searchsorted(csum, base + _MEMBER_CHUNK, right=True)))
            seg, pos = ragged_arange(lens[s0:s1])
            seg += s0
            pt = self.pts_by_rank.index_select(0, start.index_select(0, seg) + pos).long()
            brow = seg if rows is None else rows.index_select(0, seg)
            inside = ((B.view(-1).index_select(0, brow * self.W + pt // 64) >> (pt % 64)) & 1) == 1
            yield seg[inside], pt[inside]
            s0 = s1

    def _run_extents(self, B: torch.Tensor, rows: torch.Tensor, f: torch.Tensor):
        """Smallest and largest rank in dimension ``f [m]`` of the points of ``B [m, W]`` inside
        the buckets at table rows ``rows [m]`` (0 where none), from the buckets' runs."""
        m = B.shape[0]
        lo = torch.full((m,), self.umax, dtype=torch.long, device=B.device)
        hi = torch.full((m,), -1, dtype=torch.long, device=B.device)
        for i, pt in self._run_members(B, self.run_start.index_select(0, rows), self.run_end.index_select(0, rows)):
            r = self.rank_flat.index_select(0, pt * self.D + f.index_select(0, i))
            lo.scatter_reduce_(0, i, r, "amin")
            hi.scatter_reduce_(0, i, r, "amax")
        empty = hi < 0
        return lo.masked_fill(empty, 0), hi.masked_fill(empty, 0)

    def varying(self, B: torch.Tensor) -> torch.Tensor:
        """Dimensions in which each node's data vary: ``[n, W] -> bool [n, D]``.

        A node is constant in ``d`` iff it lies inside the bucket of one of its points and,
        for a bucket of several values, a scan of its points says so.
        """
        n, D = B.shape[0], self.D
        out = torch.empty(n, D, dtype=torch.bool, device=B.device)
        if n == 0:
            return out
        fp = self.first_point(B)
        r0 = self.rank.index_select(0, fp)  # [n, D] ranks of one member
        # where that member's value is its own, the node varies iff it holds another point
        own = self.unique_value.index_select(0, fp)  # [n, D]
        out.copy_(own & self._two_or_more(B)[:, None])
        rows = self.boff[None, :] + self.bucket_flat.index_select(0, (torch.arange(D, device=B.device) * self.umax + r0).reshape(-1)).view(n, D)
        rest = (~own.all(1)).nonzero().squeeze(1)  # nodes with a dimension the shortcut does not settle
        step = max(1, _CHUNK // (D * self.W))
        for s in range(0, rest.numel(), step):
            q = rest[s:s + step]
            r = rows.index_select(0, q)
            hit = ((B.index_select(0, q)[:, None, :] & self.outside.index_select(0, r.reshape(-1)).view(r.shape + (self.W,))) != 0).any(-1)
            out[q] = torch.where(own.index_select(0, q), out.index_select(0, q), hit)
        multi = self.bucket_last.index_select(0, rows.reshape(-1)).view(n, D) > self.bucket_first.index_select(0, rows.reshape(-1)).view(n, D)
        node, dim = (~out & multi & ~own).nonzero(as_tuple=True)
        if node.numel():
            lo, hi = self._run_extents(B.index_select(0, node), rows[node, dim], dim)
            out[node, dim] = hi > lo
        return out

    def extent(self, B: torch.Tensor, f: torch.Tensor):
        """Smallest and largest value of dimension ``f [n]`` among each node's points.

        Returns ``(lo, hi)`` in the data dtype.
        """
        lo, hi, _, _ = self.extent_ranks(B, f)
        return lo, hi

    def extent_ranks(self, B: torch.Tensor, f: torch.Tensor):
        """:meth:`extent` and the ranks of the two values among the distinct values of ``f``.

        Binary searches over the buckets of ``f`` (``O(W log K)``), then a scan of the
        node's points in the end buckets when they hold several values. An empty node
        gets rank 0. Returns ``(lo, hi, rank_lo, rank_hi)``, each [n].
        """
        n = B.shape[0]
        if not self.native and n >= _distinct.MIN_ROWS and n * self.W >= _SMALL_WORK:
            # resampled particles share nodes: each distinct (node, feature) is searched once (the compiled
            # search stops early in most words, so it costs less than hashing the rows)
            first, inv = _distinct.distinct_rows(B, f)
            if first.numel() < 0.8 * n:
                out = self._extent_ranks_all(B.index_select(0, first), f.index_select(0, first))
                return tuple(o.index_select(0, inv) for o in out)
        return self._extent_ranks_all(B, f)

    def _extent_ranks_all(self, B: torch.Tensor, f: torch.Tensor):
        """:meth:`extent_ranks` of every row as given (no de-duplication)."""
        n = B.shape[0]
        dev = B.device
        if self.native:
            rlo, rhi = extent_ranks_native(B, f, self)
            base = f * self.umax
            return self.sorted_flat.index_select(0, base + rlo), self.sorted_flat.index_select(0, base + rhi), rlo, rhi
        is_small = 2 * self.count(B) < self.W if n * self.W >= _SMALL_WORK else torch.zeros(n, dtype=torch.bool, device=dev)
        small = is_small.nonzero().squeeze(1)
        if small.numel():
            # nodes of under W / 2 points: unpacking them is cheaper than log K table rows
            big = (~is_small).nonzero().squeeze(1)
            rlo, rhi = torch.zeros(n, dtype=torch.long, device=dev), torch.zeros(n, dtype=torch.long, device=dev)
            a, b = self.rank_extents(B.index_select(0, small), f.index_select(0, small)[:, None])
            rlo[small], rhi[small] = a[:, 0], b[:, 0]
            if big.numel():
                _, _, a, b = self._extent_ranks_all(B.index_select(0, big), f.index_select(0, big))
                rlo[big], rhi[big] = a, b
            base = f * self.umax
            return self.sorted_flat.index_select(0, base + rlo), self.sorted_flat.index_select(0, base + rhi), rlo, rhi
        BB, ff = torch.cat([B, B]), torch.cat([f, f])
        want_hit = torch.arange(2 * n, device=dev) < n
        lo = torch.zeros_like(ff)
        hi = self.n_buckets.index_select(0, ff) - 1
        base = self.boff.index_select(0, ff)
        # min bucket: first k with B & T[k] != 0; max bucket: first k with B within T[k].
        for _ in range(max(1, int(self.n_buckets.max())).bit_length() + 1):
            mid = (lo + hi) // 2
            X = BB & self.table.index_select(0, base + mid)
            ok = torch.where(want_hit, (X != 0).any(1), (X == BB).all(1))
            hi = torch.where(ok, mid, hi)
            lo = torch.where(ok, lo, torch.minimum(mid + 1, hi))
        rows = base + lo
        first, last = self.bucket_first.index_select(0, rows), self.bucket_last.index_select(0, rows)
        r = torch.where(want_hit, first, last)
        sel = (last > first).nonzero().squeeze(1)
        if sel.numel():
            ext_lo, ext_hi = self._run_extents(BB.index_select(0, sel), rows.index_select(0, sel), ff.index_select(0, sel))
            r[sel] = torch.where(want_hit.index_select(0, sel), ext_lo, ext_hi)
        empty = ~(B != 0).any(1)
        r = r.masked_fill(torch.cat([empty, empty]), 0)
        vals = self.sorted_flat.index_select(0, ff * self.umax + r)
        return vals[:n], vals[n:], r[:n], r[n:]

    def extent_ranks_where(self, B: torch.Tensor, f: torch.Tensor, need: torch.Tensor):
        """:meth:`extent_ranks` of nodes ``B [P, W]`` in dimensions ``f [k, P]`` where ``need
        [k, P]``; returns (lo, hi, rank_lo, rank_hi), each [k * P] (zero where not needed)."""
        k, P = f.shape
        lo = torch.zeros(k * P, dtype=self.sorted_flat.dtype, device=B.device)
        hi, rlo, rhi = lo.clone(), torch.zeros(k * P, dtype=torch.long, device=B.device), torch.zeros(k * P, dtype=torch.long, device=B.device)
        rows = need.reshape(-1).nonzero().squeeze(1)
        if rows.numel():
            out = self.extent_ranks(B.index_select(0, rows % P), f.reshape(-1).index_select(0, rows))
            for dst, val in zip((lo, hi, rlo, rhi), out):
                dst[rows] = val
        return lo, hi, rlo, rhi

    def threshold_rank(self, f: torch.Tensor, thr: torch.Tensor) -> torch.Tensor:
        """Rank ``r`` with ``sorted[f, r] <= thr < sorted[f, r + 1]`` (``-1`` below the minimum)."""
        if f.numel() == 0:
            return f
        return rows_searchsorted(self.sorted_flat.view(-1, self.umax), f, thr, right=True) - 1

    def split_bits(self, B: torch.Tensor, f: torch.Tensor, r: torch.Tensor, right: torch.Tensor,
                   src: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Child bitsets: the points of ``B [n, W]`` (or of ``B[src]``) with rank ``<= r [n]`` in
        dimension ``f [n]`` (left), or the others (where ``right [n]``). The buckets wholly below the
        cut come from the table; the cut's own bucket, when it is split, from a scan of its points."""
        rows = self.boff.index_select(0, f) + self.bucket_flat.index_select(0, f * self.umax + r.clamp(min=0))
        first, last = self.bucket_first.index_select(0, rows), self.bucket_last.index_select(0, rows)
        whole = torch.where(r == last, rows, torch.where(first == 0, torch.zeros_like(rows), rows - 1))
        whole = torch.where(r < 0, torch.zeros_like(rows), whole)
        scan = (r >= 0) & (r < last)  # the cut's bucket: its points of rank <= r are a run of the rank order
        if self.native:
            start = torch.where(scan, self.run_start.index_select(0, rows), torch.zeros_like(rows))
            end = torch.where(scan, self.value_end.index_select(0, f * self.umax + r.clamp(min=0)), torch.zeros_like(rows))
            return split_bits_native(B, src, self.table, whole, start, end, self.pts_by_rank, right)
        if src is not None:
            B = B.index_select(0, src)
        left = B & self.table.index_select(0, whole)
        sel = scan.nonzero().squeeze(1)
        if sel.numel():
            # their bits are not in ``left`` yet, so adding them is an OR
            fs, rs = f.index_select(0, sel), r.index_select(0, sel)
            for i, pt in self._run_members(B, self.run_start.index_select(0, rows.index_select(0, sel)),
                                           self.value_end.index_select(0, fs * self.umax + rs), rows=sel):
                word, val = bit_of(pt)
                left.view(-1).index_put_((sel.index_select(0, i) * self.W + word,), val, accumulate=True)
        # right child: B & ~left = B ^ left, as left is a subset of B
        left ^= B & (-right.long())[:, None]
        return left

    def keeps_bits(self, n_trees: int, capacity: int = 64) -> bool:
        """Whether a batch of ``n_trees`` trees keeps every node's bitset: when ``capacity``
        node slots per tree (64: a start from the root) take at most ``_KEEP_BITS_BYTES``
        (otherwise :meth:`node_bits` routes)."""
        return n_trees * max(64, capacity) * self.W * 8 <= _KEEP_BITS_BYTES

    def node_bits(self, trees: HardTrees, node: torch.Tensor) -> torch.Tensor:
        """Bitsets of the training points in ``node[p]`` of every tree, routed down from the root.

        One :meth:`split_bits` per level of the path (read off the heap codes) and distinct
        path (:func:`~torchtree.model.routing.routed_node_bits`), ``O(depth x W)`` words plus the
        points of split buckets, so trees need not keep a bitset per node.

        Parameters
        ----------
        trees : HardTrees [P] with ``extra["heap"]`` and ``extra["thr_rank"]``
        node : LongTensor [P] (>= 0)

        Returns
        -------
        LongTensor [P, W]
        """
        bits, index = routed_node_bits(self, trees, node)
        return bits.index_select(0, index)

    # ------------------------------------------------------------------ max_bins
    def on_grid(self, trees: HardTrees) -> HardTrees:
        """With ``max_bins``: the trees with every threshold on a binned feature moved down
        to the largest grid value not above it (no training point changes route; in place).
        Features of at most ``max_bins`` values, and all without ``max_bins``: unchanged."""
        if not bool(self.binned.any()):
            return trees
        internal = trees.status == INTERNAL
        internal &= self.binned.index_select(0, trees.feature.long().clamp(min=0).reshape(-1)).view(internal.shape)
        p, c = internal.nonzero(as_tuple=True)
        if p.numel():
            f = trees.feature[p, c].long()
            r = self.threshold_rank(f, trees.threshold[p, c]).clamp(min=0)
            trees.threshold[p, c] = self.sorted_flat.index_select(0, f * self.umax + r).to(trees.threshold.dtype)
        return trees
