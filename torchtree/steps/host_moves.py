"""One MCMC chain as numpy arrays on the host: the latency path of a single chain.

A single chain is a sequence of tiny dependent Metropolis-Hastings steps, so its cost is
per-operation overhead, not arithmetic. :class:`HostChain` runs the same grow / prune /
change / swap moves as :func:`torchtree.steps.moves.propose` (cut proposal ``"prior"``)
with numpy on the CPU and consumes the same uniforms in the same way, so it reproduces
the batched engine's chain (tests/test_mcmc.py checks it). The kept draws are stored as
snapshots (tuples of the tree's arrays), packed for checkpoints by
:func:`pack_snapshots` and stacked into :class:`~torchtree.model.trees.HardTrees` by
:func:`host_trees`.

Layer: a step (one transition); imports the model and the move definitions only.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from torchtree.model.likelihoods import DirichletMultinomial
from torchtree.model.trees import INTERNAL, LEAF, HardTrees
from torchtree.steps.moves import MAX_DEPTH, CHANGE, GROW, PRUNE, SWAP, TreeModel

__all__ = ["HostChain", "pack_snapshots", "unpack_snapshots", "host_trees"]


class HostChain:
    """One chain in numpy arrays on the host: the latency path of a single MCMC chain.

    A single chain is a sequence of tiny dependent steps, so its cost is per-operation
    overhead, not arithmetic. This engine runs the same moves as
    :func:`torchtree.steps.moves.propose` with numpy on the CPU, keeping the leaf of every
    training point (``assign [N]``) and re-routing only the points under the rewritten
    node. It consumes the same uniforms in the same way (node and dimension choices
    in index order, the same cut formula in the data dtype), so it reproduces the
    batched engine's chain; the tests check that.

    Parameters
    ----------
    model : TreeModel
    move_probs : 4 floats (normalised)
    """

    def __init__(self, model: TreeModel, move_probs) -> None:
        self.m = model
        d = model.data
        self.X = d.X.cpu().numpy()
        self.dt = self.X.dtype
        self.N, self.D = self.X.shape
        self.S = model.S
        self.pst = model.pstats[:, : model.S].cpu().numpy()
        self.row_id = model.row_id.cpu().numpy()
        self.cp = np.cumsum(np.asarray(move_probs, dtype=np.float64))
        self.cp = self.cp / self.cp[-1]
        self.lg_ratio = math.log(max(move_probs[1], 1e-300) / max(move_probs[0], 1e-300))
        depths = torch.arange(MAX_DEPTH + 2)
        lps, lpn = model.split_prior.log_split_probs(depths)
        self.lps, self.lpn = lps.numpy(), lpn.numpy()
        if not model.chipman:
            self.lps, self.lpn = np.zeros_like(self.lps), np.zeros_like(self.lpn)
            self.glob = model.prior.log_prob_leaves(torch.arange(self.N + 2)).numpy()
        else:
            self.glob = np.zeros(self.N + 2)
        lik = model.likelihood
        # the Dirichlet-multinomial's formula by lookup: for it and for subclasses that keep its log_marginal
        self.dm = (isinstance(lik, DirichletMultinomial) and type(lik).log_marginal is DirichletMultinomial.log_marginal
                   and model.use_likelihood)
        if self.dm:
            K = self.S
            a = lik.alpha / K
            cnt = torch.arange(self.N + 1, dtype=torch.float64)
            self.lg_a, self.lg_b = torch.lgamma(cnt + a).numpy(), torch.lgamma(cnt + lik.alpha).numpy()
            self.lg_c = math.lgamma(lik.alpha) - K * math.lgamma(a)
        C = 64
        self.feat = np.full(C, -1, np.int64)
        self.thr = np.zeros(C, self.dt)
        self.left = np.full(C, -1, np.int64)
        self.right = np.full(C, -1, np.int64)
        self.parent = np.full(C, -1, np.int64)
        self.depth = np.zeros(C, np.int64)
        self.leaf = np.zeros(C, bool)
        self.heap = np.zeros(C, np.int64)
        self.term = np.zeros(C, np.float64)
        self.stats = np.zeros((C, self.S), np.float64)
        self.n = 1
        self.assign = np.zeros(self.N, np.int64)

    # ------------------------------------------------------------------ helpers
    def loglik(self, stats: np.ndarray) -> np.ndarray:
        if not self.m.use_likelihood:
            return np.zeros(stats.shape[0])
        if self.dm:
            c = stats.astype(np.int64)
            return self.lg_c + self.lg_a[c].sum(1) - self.lg_b[c.sum(1)]
        return self.m.likelihood.log_marginal(torch.from_numpy(stats)).numpy()

    def leaf_terms(self, depth, nonconst, stats) -> np.ndarray:
        return self.loglik(stats) + np.where(nonconst, self.lpn[depth], 0.0)

    def internal_term(self, depth, nvary, rng):
        return self.lps[depth] + (-np.log(np.maximum(nvary, 1)) - np.log(np.maximum(rng, 1e-300)))

    def _iterm(self, depth: int, nvary: int, rng: float) -> float:
        return float(self.lps[depth]) + (-math.log(max(nvary, 1)) - math.log(max(rng, 1e-300)))

    def _ensure(self, need: int) -> None:
        C = self.feat.shape[0]
        if need <= C:
            return
        pad = C
        while C + pad < need:  # doubling until it fits (a loaded tree can be many times larger)
            pad *= 2
        for name, fill in (("feat", -1), ("thr", 0), ("left", -1), ("right", -1), ("parent", -1), ("depth", 0),
                           ("leaf", False), ("heap", 0), ("term", 0.0)):
            a = getattr(self, name)
            setattr(self, name, np.concatenate([a, np.full(pad, fill, a.dtype)]))
        self.stats = np.concatenate([self.stats, np.zeros((pad, self.S))])

    def load(self, trees: HardTrees, leaves: np.ndarray) -> None:
        """Start from tree 0 of ``trees`` (``leaves``: its leaf of every training point)."""
        n = int(trees.n_nodes[0])
        self._ensure(n)
        self.n = n
        self.feat[:n] = trees.feature[0, :n].numpy()
        self.thr[:n] = trees.threshold[0, :n].numpy()
        self.left[:n], self.right[:n] = trees.left[0, :n].numpy(), trees.right[0, :n].numpy()
        self.parent[:n], self.depth[:n] = trees.parent[0, :n].numpy(), trees.depth[0, :n].numpy()
        self.leaf[:n] = trees.is_leaf()[0, :n].numpy()
        self.heap[:n] = trees.extra["heap"][0, :n].numpy()
        self.term[:n] = trees.extra["term"][0, :n].numpy()
        self.stats[:n] = trees.stats[0, :n].double().numpy()
        self.assign[:] = leaves

    def log_posterior(self) -> float:
        return float(self.term[: self.n].sum() + self.glob[int(self.leaf[: self.n].sum())])

    _STATE = ("feat", "thr", "left", "right", "parent", "depth", "leaf", "heap", "term", "stats", "assign")

    def state_dict(self) -> dict:
        """The chain's arrays as tensors (copies) and its node count (for checkpoints)."""
        out = {name: torch.from_numpy(getattr(self, name).copy()) for name in self._STATE}
        out["n"] = int(self.n)
        return out

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict` (the same model)."""
        for name in self._STATE:
            old = getattr(self, name)
            setattr(self, name, state[name].numpy().astype(old.dtype, copy=True))
        self.n = int(state["n"])

    def snapshot(self):
        n = self.n
        return (self.feat[:n].copy(), self.thr[:n].copy(), self.left[:n].copy(), self.right[:n].copy(),
                self.parent[:n].copy(), self.depth[:n].copy(), self.leaf[:n].copy(), self.stats[:n].copy())

    def _subtree(self, j: int) -> np.ndarray:
        n = self.n
        dj, hj = self.depth[j], self.heap[j]
        d = self.depth[:n]
        return (d >= dj) & ((self.heap[:n] >> np.maximum(d - dj, 0)) == hj)

    def _cut(self, lo, hi, u):
        rng = float(hi) - float(lo)
        thr = self.dt.type(float(lo) + u * rng)
        if not thr < hi:
            thr = np.nextafter(hi, self.dt.type(-np.inf))
        return max(thr, lo), rng

    # --------------------------------------------------------------------- step
    def step(self, u: np.ndarray):
        """One MH iteration with uniforms ``u [5]``; returns (move kind, accepted)."""
        kind = min(int(np.searchsorted(self.cp, u[0], side="right")), 3)
        n = self.n
        leaf = self.leaf[:n]
        internal = ~leaf
        if kind == GROW:
            cand = leaf
        elif kind == PRUNE:
            cand = internal & leaf[np.maximum(self.left[:n], 0)] & leaf[np.maximum(self.right[:n], 0)]
        elif kind == CHANGE:
            cand = internal
        else:
            cand = internal & (self.parent[:n] >= 0)
        idx = np.flatnonzero(cand)
        if idx.size == 0:
            return kind, False
        c = int(idx[min(int(u[1] * idx.size), idx.size - 1)])
        j = int(self.parent[c]) if kind == SWAP else c
        if kind == GROW:
            sub, pts = None, np.flatnonzero(self.assign == j)
        else:
            sub = self._subtree(j)
            pts = np.flatnonzero(sub[self.assign])
        xs = self.X[pts]
        lo, hi = xs.min(0), xs.max(0)
        vary = np.flatnonzero(hi > lo)
        nv = vary.size
        logu = math.log(u[4])
        if kind == GROW:
            return kind, self._grow(j, pts, xs, lo, hi, vary, u, logu)
        if kind == PRUNE:
            return kind, self._prune(j, pts, lo, hi, nv, cand, logu)
        if kind == CHANGE:
            f = int(vary[min(int(u[2] * nv), nv - 1)])
            thr, rng_new = self._cut(lo[f], hi[f], u[3])
            fo = int(self.feat[j])
            log_q = math.log(max(rng_new, 1e-300)) - math.log(max(float(hi[fo]) - float(lo[fo]), 1e-300))
            return kind, self._reroute(j, sub, pts, xs, {j: (f, thr)}, log_q, logu)
        fj, fc = int(self.feat[j]), int(self.feat[c])
        return kind, self._reroute(j, sub, pts, xs, {j: (fc, self.thr[c]), c: (fj, self.thr[j])}, 0.0, logu)

    def _grow(self, j, pts, xs, lo, hi, vary, u, logu) -> bool:
        nv = vary.size
        if nv == 0:
            return False
        f = int(vary[min(int(u[2] * nv), nv - 1)])
        thr, rng = self._cut(lo[f], hi[f], u[3])
        right = xs[:, f] > thr
        pl, pr = pts[~right], pts[right]
        st = np.stack([self.pst[pl].sum(0), self.pst[pr].sum(0)]).astype(np.float64)
        nc = np.array([self.row_id[pl].min() != self.row_id[pl].max(), self.row_id[pr].min() != self.row_id[pr].max()])
        d = int(self.depth[j])
        t_ch = self.leaf_terms(np.array([d + 1, d + 1]), nc, st)
        t_j = self._iterm(d, nv, rng)
        n = self.n
        n_leaves = int(self.leaf[:n].sum())
        leaf = self.leaf[:n]
        l_, r_ = self.left[:n], self.right[:n]
        n_prun = int((~leaf & leaf[np.maximum(l_, 0)] & leaf[np.maximum(r_, 0)]).sum())
        p = int(self.parent[j])
        if p >= 0:
            sib = int(self.right[p]) if int(self.left[p]) == j else int(self.left[p])
            n_prun_new = n_prun + 1 - int(bool(self.leaf[sib]))
        else:
            n_prun_new = n_prun + 1
        delta = t_j + t_ch.sum() - self.term[j] + self.glob[n_leaves + 1] - self.glob[n_leaves]
        log_q = self.lg_ratio + math.log(n_leaves) - math.log(n_prun_new) + math.log(nv) + math.log(max(rng, 1e-300))
        if not logu < delta + log_q:
            return False
        self._ensure(n + 2)
        self.feat[j], self.thr[j], self.left[j], self.right[j], self.leaf[j] = f, thr, n, n + 1, False
        self.term[j] = t_j
        h = int(self.heap[j])
        for k in (0, 1):
            c = n + k
            self.feat[c], self.thr[c], self.left[c], self.right[c] = -1, 0, -1, -1
            self.parent[c], self.depth[c], self.leaf[c], self.heap[c] = j, d + 1, True, 2 * h + k
            self.term[c], self.stats[c] = t_ch[k], st[k]
        self.assign[pl], self.assign[pr] = n, n + 1
        self.n = n + 2
        return True

    def _prune(self, j, pts, lo, hi, nv, prunable, logu) -> bool:
        n = self.n
        L, R = int(self.left[j]), int(self.right[j])
        f = int(self.feat[j])
        rng_old = float(hi[f]) - float(lo[f])
        rid = self.row_id[pts]
        d = int(self.depth[j])
        t_j = self.leaf_terms(np.array([d]), np.array([rid.min() != rid.max()]), self.stats[j:j + 1])[0]
        n_leaves = int(self.leaf[:n].sum())
        delta = t_j - self.term[j] - self.term[L] - self.term[R] + self.glob[n_leaves - 1] - self.glob[n_leaves]
        log_q = (-self.lg_ratio + math.log(int(prunable.sum())) - math.log(n_leaves - 1) - math.log(nv)
                 - math.log(max(rng_old, 1e-300)))
        if not logu < delta + log_q:
            return False
        self.feat[j], self.thr[j], self.left[j], self.right[j], self.leaf[j], self.term[j] = -1, 0, -1, -1, True, t_j
        self.assign[pts] = j
        keep = np.ones(n, bool)
        keep[[L, R]] = False
        newidx = np.cumsum(keep) - 1
        kept = np.flatnonzero(keep)
        for name in ("feat", "thr", "left", "right", "parent", "depth", "leaf", "heap", "term", "stats"):
            a = getattr(self, name)
            a[: n - 2] = a[kept]
        for a in (self.left, self.right, self.parent):
            v = a[: n - 2]
            a[: n - 2] = np.where(v >= 0, newidx[np.maximum(v, 0)], v)
        self.n = n - 2
        self.assign = newidx[self.assign]
        return True

    def _reroute(self, j, sub, pts, xs, rules, log_q, logu) -> bool:
        """Change / swap: new rules at the nodes of ``rules``; re-route the points under j."""
        n = self.n
        feat, thr = self.feat[:n].copy(), self.thr[:n].copy()
        for node, (f, t) in rules.items():
            feat[node], thr[node] = f, t
        node = np.full(pts.size, j, np.int64)
        nodes = np.flatnonzero(sub)
        for _ in range(int(self.depth[nodes].max()) - int(self.depth[j])):
            f = feat[node]
            act = f >= 0
            if not act.any():
                break
            go = xs[np.arange(pts.size), np.maximum(f, 0)] > thr[node]
            node = np.where(act, np.where(go, self.right[node], self.left[node]), node)
        order = np.argsort(node, kind="stable")
        ln = node[order]
        brk = np.empty(ln.size, bool)
        brk[0] = True
        np.not_equal(ln[1:], ln[:-1], out=brk[1:])
        starts = np.flatnonzero(brk)
        leaves_hit = ln[starts]
        sub_leaves = nodes[self.leaf[nodes]]
        if leaves_hit.size != sub_leaves.size:
            return False  # an empty leaf
        xo = xs[order]
        lo = np.empty((n, self.D), self.dt)
        hi = np.empty((n, self.D), self.dt)
        lo[leaves_hit], hi[leaves_hit] = np.minimum.reduceat(xo, starts), np.maximum.reduceat(xo, starts)
        stats = np.zeros((n, self.S))
        stats[leaves_hit] = np.add.reduceat(self.pst[pts[order]].astype(np.float64), starts)
        rid = self.row_id[pts[order]]
        nonconst = np.minimum.reduceat(rid, starts) != np.maximum.reduceat(rid, starts)
        t_new = np.zeros(n)
        t_new[leaves_hit] = self.leaf_terms(self.depth[leaves_hit], nonconst, stats[leaves_hit])
        internal = nodes[~self.leaf[nodes]]
        # Push leaf aggregates to every internal ancestor inside the subtree (all at once).
        dj = int(self.depth[j])
        src, dst = [], []
        ids, cur = leaves_hit, leaves_hit
        while cur.size:
            keep = self.depth[cur] > dj  # below j: the parent is inside the subtree
            ids, cur = ids[keep], self.parent[cur[keep]]
            src.append(ids)
            dst.append(cur)
        src, dst = np.concatenate(src), np.concatenate(dst)
        lo[internal], hi[internal] = np.inf, -np.inf
        np.minimum.at(lo, dst, lo[src])
        np.maximum.at(hi, dst, hi[src])
        stats[internal] = 0.0
        np.add.at(stats, dst, stats[src])
        fi = feat[internal]
        rng_i = hi[internal, fi].astype(np.float64) - lo[internal, fi].astype(np.float64)
        t_new[internal] = self.internal_term(self.depth[internal], (hi[internal] > lo[internal]).sum(1), rng_i)
        delta = float(t_new[nodes].sum() - self.term[nodes].sum())
        if not logu < delta + log_q:
            return False
        self.feat[:n], self.thr[:n] = feat, thr
        self.term[nodes], self.stats[nodes] = t_new[nodes], stats[nodes]
        self.assign[pts] = node
        return True


def _narrow_np(a: np.ndarray) -> np.ndarray:
    """``a`` in the narrowest integer type that gives it back exactly (floats: when whole)."""
    if a.size == 0 or a.dtype == np.bool_:
        return a
    if a.dtype.kind == "f":
        if not np.all(np.isfinite(a)) or np.abs(a).max() >= 2 ** 31:
            return a
        whole = a.astype(np.int64)
        if not np.array_equal(whole.astype(a.dtype).view(np.uint8), a.view(np.uint8)):
            return a  # fractions, or -0.0
        a = whole
    lo, hi = int(a.min()), int(a.max())
    for dt in (np.int8, np.int16, np.int32):
        if np.iinfo(dt).min <= lo and hi <= np.iinfo(dt).max:
            return a.astype(dt)
    return a


def pack_snapshots(snaps) -> dict:
    """Host snapshots as flat tensors (what a checkpoint stores).

    Parameters
    ----------
    snaps : list of Q tuples of 8 arrays (:meth:`HostChain.snapshot`), tree q of length ``n_q``

    Returns
    -------
    dict: ``"lengths"`` LongTensor [Q]; ``"fields"`` 8 tensors [sum n_q] (stats [sum n_q, S]),
    the snapshots' arrays concatenated field by field (empty list when Q = 0), each in the
    narrowest integer type that holds it exactly; ``"dtypes"`` their own dtypes.
    """
    lengths = torch.tensor([s[0].shape[0] for s in snaps], dtype=torch.long)
    if not snaps:
        return {"lengths": lengths, "fields": []}
    cols = [np.concatenate([s[i] for s in snaps]) for i in range(8)]
    return {"lengths": lengths, "fields": [torch.from_numpy(_narrow_np(c)) for c in cols],
            "dtypes": [str(c.dtype) for c in cols]}


def unpack_snapshots(packed: dict) -> list:
    """Inverse of :func:`pack_snapshots`: the list of Q snapshot tuples (numpy arrays)."""
    lengths = packed["lengths"].tolist()
    if not lengths:
        return []
    cuts = np.cumsum(lengths)[:-1]
    dtypes = packed.get("dtypes")  # absent in checkpoints of earlier versions (fields not narrowed)
    fields = [f.numpy() if dtypes is None else f.numpy().astype(dtypes[i]) for i, f in enumerate(packed["fields"])]
    cols = [np.split(f, cuts) for f in fields]
    return [tuple(c[q] for c in cols) for q in range(len(lengths))]


def host_trees(snaps, dtype, stats_dtype) -> HardTrees:
    """Stack host snapshots into HardTrees padded to the largest.

    Parameters
    ----------
    snaps : list of Q >= 1 snapshot tuples (distinct consecutive trees of a chain)
    dtype : numpy dtype of the thresholds (the data's)
    stats_dtype : torch dtype of the node statistics (the likelihood's)

    Returns
    -------
    HardTrees with Q trees of capacity ``max n_q`` (a loop over the kept draws, run once
    at the end of a run).
    """
    C = max(s[0].shape[0] for s in snaps)
    Q, S = len(snaps), snaps[0][7].shape[1]

    def pad(i, fill, dt):
        out = np.full((Q, C), fill, dt)
        for q, s in enumerate(snaps):
            out[q, : s[i].shape[0]] = s[i]
        return torch.from_numpy(out)

    stats = np.zeros((Q, C, S))
    status = np.zeros((Q, C), np.int8)
    for q, s in enumerate(snaps):
        stats[q, : s[7].shape[0]] = s[7]
        status[q, : s[6].shape[0]] = np.where(s[6], LEAF, INTERNAL)
    return HardTrees(pad(0, -1, np.int32), pad(1, 0, dtype), pad(2, -1, np.int32), pad(3, -1, np.int32),
                     pad(4, -1, np.int32), pad(5, 0, np.int32), torch.from_numpy(status),
                     torch.from_numpy(stats).to(stats_dtype), torch.tensor([s[0].shape[0] for s in snaps]))
