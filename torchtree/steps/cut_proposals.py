"""How the moves draw a split rule's cut, and the densities of those draws.

Three cut proposals for grow / change moves (:func:`torchtree.steps.moves.propose`):

* ``"prior"``: uniform on the node's data range ``[lo, hi)`` in the chosen dimension, as
  the prior draws it (:func:`prior_cut`, :func:`draw_rule`);
* ``"data"``: a gap between consecutive distinct values uniform among the node's gaps,
  then uniform in that gap (:func:`gap_cut`, :func:`log_gap_density`);
* ``"informed"``: one of ``INFORMED_CELLS`` equal cells of the range, chosen with
  probability ``(1 - eps) softmax(score) + eps / G`` where the score is the log
  likelihood of the node split at the cell's midpoint (:func:`informed_cell_logp`),
  then uniform in the cell (:func:`informed_cut`, :func:`informed_log_density`).

The target (:class:`~torchtree.model.target.TreeModel`) is the same for all three; the
moves' acceptance ratios carry prior density / proposal density of the cuts.

Layer: a step; imports the model only.
"""
from __future__ import annotations

import math

import torch

from torchtree.kernels import distinct as _distinct
from torchtree.model.feature_groups import choose_column, choose_uniform
from torchtree.model.likelihood_protocol import counts_hook

__all__ = ["INFORMED_CELLS", "INFORMED_MIX", "CUT_PROPOSALS", "prior_cut", "draw_rule", "gap_cut", "log_gap_density",
           "informed_cell_logp", "informed_cut", "informed_log_density", "choose"]

CUT_PROPOSALS = ("prior", "data", "informed")
#: cells of a node's range scored by the ``"informed"`` cut proposal, and the uniform share mixed in
INFORMED_CELLS, INFORMED_MIX = 16, 0.1


def prior_cut(lo: torch.Tensor, hi: torch.Tensor, u: torch.Tensor):
    """Cut uniform on ``[lo, hi)`` in the data dtype from uniforms ``u [n]``; returns (threshold [n], range [n] float64)."""
    rng = hi.double() - lo.double()
    thr = (lo.double() + u * rng).to(lo.dtype)
    # Rounding to the data dtype may land on the maximum: keep the right child non-empty.
    thr = torch.where(thr < hi, thr, torch.nextafter(hi, torch.full_like(hi, -math.inf)))
    return torch.maximum(thr, lo), rng


def choose(mask: torch.Tensor, u: torch.Tensor):
    """Uniform choice of a True column per row of ``mask [P, C]`` from ``u [P]``; returns (column [P], count [P])."""
    return choose_uniform(mask, u)


def draw_rule(model, B: torch.Tensor, vary: torch.Tensor, u_dim: torch.Tensor, u_cut: torch.Tensor):
    """Prior draw of a rule on nodes ``B [n, W]`` (column drawn among the varying ones ``vary [n, D]``
    by :func:`~torchtree.model.feature_groups.choose_column`, cut uniform on the data range).

    Returns (feature, threshold, threshold rank, ``1 / P(feature)`` (the number of varying columns
    for a numeric table), range float64), each [n].
    """
    f, nv = choose_column(vary, u_dim, model.groups)
    lo, hi = model.extent(B, f)
    thr, rng = prior_cut(lo, hi, u_cut)
    return f, thr, model.threshold_rank(f, thr), nv, rng


def gap_cut(model, f: torch.Tensor, r_lo: torch.Tensor, r_hi: torch.Tensor, u: torch.Tensor):
    """The ``"data"`` draw: a gap between consecutive distinct values of ``f [n]`` uniform
    among the ``r_hi - r_lo`` gaps of the node's range, then the cut uniform in that gap.

    Returns (threshold [n] in the data dtype, its rank [n], log density [n] float64 of the cut).
    """
    n_gap = (r_hi - r_lo).clamp(min=1)
    s = u.double() * n_gap.double()
    k = torch.minimum(s.floor().long(), n_gap - 1)
    r = r_lo + k
    base = f * model.umax
    top = torch.minimum(r + 1, model.n_unique.index_select(0, f) - 1).clamp(min=0)
    a = model.sorted_flat.index_select(0, base + r)
    b = model.sorted_flat.index_select(0, base + top)
    thr, _ = prior_cut(a, b, (s - k.double()).clamp(0.0, 1.0))
    return thr, r, log_gap_density(model, f, r, r_lo, r_hi)


def log_gap_density(model, f: torch.Tensor, r: torch.Tensor, r_lo: torch.Tensor, r_hi: torch.Tensor) -> torch.Tensor:
    """Log density [n] of a cut of rank ``r`` under the ``"data"`` proposal on a node whose
    values of ``f`` have ranks ``r_lo .. r_hi``: ``-log(r_hi - r_lo) - log(v[r + 1] - v[r])``."""
    base = f * model.umax
    rr = r.clamp(min=0)
    top = torch.minimum(rr + 1, model.n_unique.index_select(0, f) - 1).clamp(min=0)
    gap = model.sorted_flat.index_select(0, base + top).double() - model.sorted_flat.index_select(0, base + rr).double()
    return -torch.log((r_hi - r_lo).clamp(min=1).double()) - torch.log(gap.clamp(min=1e-300))


def informed_cell_logp(model, B: torch.Tensor, f: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor) -> torch.Tensor:
    """Log-probabilities of the ``INFORMED_CELLS`` equal cells of each node's range in
    ``f`` under the ``"informed"`` proposal.

    A cell's score is the log marginal likelihood of the node split at the cell's
    midpoint into two leaves (the subtree below, if any, is ignored: any score that
    depends only on the node's data keeps the proposal exact, since forward and
    reverse moves see the same data). The cell probabilities are
    ``(1 - eps) softmax(score) + eps / G`` with ``eps = INFORMED_MIX``, so every cell
    keeps some mass and the proposal ratio stays bounded. Cost: the node's points
    (:meth:`~torchtree.model.target.TreeModel.members`), one histogram over cells.

    Parameters
    ----------
    model : TreeModel
    B : LongTensor [n, W] node bitsets
    f : LongTensor [n] dimension
    lo, hi : Tensor [n] the node's smallest and largest value in ``f`` (data dtype)

    Returns
    -------
    Tensor [n, G] float64
    """
    n, G = B.shape[0], INFORMED_CELLS
    if n == 0 or not model.use_likelihood:
        return torch.full((n, G), -math.log(G), dtype=torch.float64, device=B.device)
    if n >= _distinct.MIN_ROWS:
        # copies of one node (resampled particles) in one dimension have one histogram;
        # lo and hi are functions of (node, dimension), so they agree across the copies too
        first, inv = _distinct.distinct_rows(B, f)
        if first.numel() < 0.8 * n:
            pick = lambda t: t.index_select(0, first)  # noqa: E731
            return _informed_cell_logp_all(model, pick(B), pick(f), pick(lo), pick(hi)).index_select(0, inv)
    return _informed_cell_logp_all(model, B, f, lo, hi)


def _informed_cell_logp_all(model, B, f, lo, hi):
    """:func:`informed_cell_logp` of every row as given (no de-duplication)."""
    n, G = B.shape[0], INFORMED_CELLS
    # Histogram of the node's points over the G + 1 slots between consecutive cell
    # midpoints (slot c: the points left of midpoint c but not of c - 1); prefix sums
    # then give the left child's statistics at every midpoint.
    rng = (hi.double() - lo.double()).clamp(min=1e-300)
    S, N = model.S, model.N
    scale = (G / rng).float()
    lo32 = lo.float()
    dm = model.class_of_point is not None
    counts = torch.zeros(n * (G + 1) * S if dm else 0, dtype=torch.long, device=B.device)
    hist = torch.zeros(0 if dm else n * (G + 1), S, dtype=torch.float64, device=B.device)
    if int(model.count(B).sum()) * 4 >= n * N:
        # dense nodes: every bit unpacked, per-node constants broadcast (fewer steps per point)
        step = max(1, (1 << 18) // max(N, 1))
        for s0 in range(0, n, step):
            b = B[s0:s0 + step].contiguous()
            m = b.shape[0]
            inside = model._lut.index_select(0, b.view(torch.uint8).reshape(-1).long()).view(m, -1)[:, :N]
            x = model.XT.index_select(0, f[s0:s0 + step])  # [m, N]
            slot = _slot(x, lo32[s0:s0 + step, None], scale[s0:s0 + step, None], G) + (G + 1) * torch.arange(s0, s0 + m, device=B.device)[:, None]
            if dm:
                counts += torch.bincount((slot * S + model.class_of_point[None, :])[inside], minlength=counts.numel())
            else:
                pts = inside.nonzero(as_tuple=True)
                hist.index_add_(0, slot[pts], model.pstats[pts[1], :S].double())
    else:
        for node, pt in model.members(B):
            x = model.XT.view(-1).index_select(0, f.index_select(0, node) * N + pt)
            slot = _slot(x, lo32.index_select(0, node), scale.index_select(0, node), G) + (G + 1) * node
            if dm:
                counts += torch.bincount(slot * S + model.class_of_point.index_select(0, pt), minlength=counts.numel())
            else:
                hist.index_add_(0, slot, model.pstats.index_select(0, pt)[:, :S].double())
    hist = (counts.double() if dm else hist).view(n, G + 1, S)
    cum = hist.cumsum(1)
    s_left, s_node = cum[:, :G], cum[:, G:]
    s_right = s_node - s_left
    lookup = counts_hook(model.likelihood) if model.class_of_point is not None else None
    if lookup is not None:
        # integral counts: lgamma by table lookup (lgamma itself dominated the cost)
        score = lookup(s_left.long(), N) + lookup(s_right.long(), N)
    else:
        score = model.loglik(s_left.to(model.pstats.dtype)) + model.loglik(s_right.to(model.pstats.dtype))
    p = torch.softmax(score, 1) * (1.0 - INFORMED_MIX) + INFORMED_MIX / G
    return p.log()


def _slot(x: torch.Tensor, lo: torch.Tensor, scale: torch.Tensor, G: int) -> torch.Tensor:
    """Slot ``0..G`` of values ``x`` among the cell midpoints of ``[lo, lo + G / scale)``, float32."""
    # float32 is enough to place points in slots: any deterministic rule keeps the
    # proposal exact, and forward and reverse moves evaluate the same one
    t = (x - lo) * scale - 0.5
    # a zero range (a non-varying dimension, e.g. a leaf's unused rule) gives 0 * inf
    t = torch.nan_to_num(t, nan=0.0, posinf=float(G), neginf=0.0)
    return torch.ceil(t).clamp(0, G).long()


def informed_cut(model, logp: torch.Tensor, f: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor, u: torch.Tensor):
    """Draw a cut from the ``"informed"`` proposal given the cell log-probabilities
    ``logp [n, G]`` of :func:`informed_cell_logp`: a cell by inversion of ``u [n]``, then
    uniform in it (the remainder of ``u`` inside the cell's share is again uniform).

    Returns (threshold [n] in the data dtype, its rank [n], log density [n] float64 of the cut).
    """
    G = logp.shape[1]
    cdf = logp.exp().cumsum(1)
    cdf = cdf / cdf[:, -1:]
    uu = u.double()[:, None]
    g = (cdf <= uu).sum(1).clamp(max=G - 1)
    below = torch.where(g > 0, cdf.gather(1, (g - 1).clamp(min=0)[:, None]).squeeze(1), torch.zeros_like(u.double()))
    width = cdf.gather(1, g[:, None]).squeeze(1) - below
    frac = ((u.double() - below) / width.clamp(min=1e-300)).clamp(0.0, 1.0)
    thr, _ = prior_cut(lo, hi, (g.double() + frac) / G)
    return thr, model.threshold_rank(f, thr), informed_log_density(logp, thr, lo, hi)


def informed_log_density(logp: torch.Tensor, thr: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor) -> torch.Tensor:
    """Log density [n] of cut ``thr [n]`` under the ``"informed"`` proposal with cell
    log-probabilities ``logp [n, G]`` on ranges ``[lo, hi)``."""
    G = logp.shape[1]
    rng = hi.double() - lo.double()
    pos = ((thr.double() - lo.double()) / rng.clamp(min=1e-300) * G).floor().long().clamp(0, G - 1)
    return logp.gather(1, pos[:, None]).squeeze(1) + math.log(G) - torch.log(rng.clamp(min=1e-300))
