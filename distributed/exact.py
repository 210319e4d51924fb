"""Exact global reductions of log-weights: the same bits on any partition of the particles.

A sum of floats depends on the order of the terms, so a log-sum-exp or an ESS reduced over
ranks would change with the number of ranks. Here every weight becomes the fixed-point
integer ``round(2^B exp(logw - max))`` (:func:`torchtree.distributed.fixed_point_weights`,
a pure function of the element, ``B = 62 - ceil(log2 N)`` so that N of them cannot
overflow int64), and int64 sums are associative: :func:`global_stats` returns the same
log-sum-exp and ESS on 1 rank or on 8. Weights below ``2^-B`` of the largest count as zero
(a relative error below ``N 2^-B``).

Knows tensors and backends, not samplers.
"""
from __future__ import annotations

import math
from typing import List, Sequence, Tuple

import torch

from .ncopies import fixed_point_weights

__all__ = ["fixed_bits", "fixed_sums", "global_stats"]

_LN2 = math.log(2.0)


def fixed_bits(n_total: int) -> int:
    """Fractional bits ``B`` of the fixed-point weights of ``n_total`` particles.

    ``B = 62 - ceil(log2 N)``: the sum of ``N`` numbers in ``[0, 2^B]`` fits in int64.

    Parameters
    ----------
    n_total : int
        ``N``, the particles over all ranks (values below 1 count as 1).

    Returns
    -------
    int
        ``B``, at most 62 (``2^-B`` of the largest weight is the quantum of the fixed-point
        weights).
    """
    return 62 - max(0, math.ceil(math.log2(max(n_total, 1))))


def fixed_sums(x: torch.Tensor, m: torch.Tensor, bits: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """Row sums of ``round(2^bits exp(x - m))`` and of ``round(2^bits exp(2 (x - m)))``.

    Parameters
    ----------
    x : float64 Tensor [R, n]
        This rank's part of ``R`` log-weight vectors.
    m : float64 Tensor [R]
        The global row maxima (finite), so that ``x - m <= 0``.
    bits : int
        Fractional bits, from :func:`fixed_bits` (``0 <= bits <= 62``).

    Returns
    -------
    sums : int64 Tensor [R]
        ``sum_i round(2^bits exp(x_ri - m_r))``.
    square_sums : int64 Tensor [R]
        ``sum_i round(2^bits exp(2 (x_ri - m_r)))``.
        Both exact, so partial sums from any partition add up to the same total.

    Raises
    ------
    ValueError
        ``bits`` outside ``[0, 62]``.
    """
    z = x - m[:, None]
    R, n = z.shape
    q = fixed_point_weights(z.reshape(-1), bits).view(R, n).sum(1)
    q2 = fixed_point_weights((2.0 * z).reshape(-1), bits).view(R, n).sum(1)
    return q, q2


def global_stats(backend, n_total: int, lws: torch.Tensor, maxes: Sequence[float] = (),
                 sums: Sequence[int] = ()) -> Tuple[List[float], List[float], List[float], List[int]]:
    """Log-sum-exp and ESS of each row of ``lws`` over all ranks, bit-identical on any partition.

    Parameters
    ----------
    backend : Backend (``LocalBackend()`` for one process)
    n_total : int, N (global particles)
    lws : float64 Tensor [R, n], this rank's rows of R global log-weight vectors
    maxes : floats reduced with ``max`` in the same collective (e.g. tree capacity)
    sums : ints reduced with ``sum`` in the same collective (e.g. accepted moves)

    Returns
    -------
    lse : list of R floats, ``log sum_i exp(lws[r, i])`` (``-inf`` if every weight is zero)
    ess : list of R floats, ``(sum w)^2 / sum w^2`` (0 if every weight is zero)
    maxes : list of floats
    sums : list of ints

    Notes
    -----
    Two collectives: one ``all_reduce(max)`` of ``R + len(maxes)`` float64, one
    ``all_reduce(sum)`` of ``2R + len(sums)`` int64. The sums are exact integers (see the
    module notes), so the result is a pure function of the global log-weights.
    """
    R = lws.shape[0]
    loc = lws.max(1).values if lws.shape[1] else torch.full((R,), -math.inf, dtype=torch.float64)
    head = torch.cat([loc.double().cpu(), torch.tensor([float(v) for v in maxes], dtype=torch.float64)])
    head = backend.all_reduce(head, "max")
    M = head[:R]
    bits = fixed_bits(n_total)
    fin = torch.isfinite(M)
    q, q2 = fixed_sums(lws, torch.where(fin, M, torch.zeros_like(M)).to(lws.device), bits)
    q = torch.where(fin.to(q.device), q, torch.zeros_like(q))
    q2 = torch.where(fin.to(q.device), q2, torch.zeros_like(q2))
    ints = torch.cat([q.cpu(), q2.cpu(), torch.tensor([int(v) for v in sums], dtype=torch.int64)])
    ints = backend.all_reduce(ints, "sum").tolist()
    # R is the handful of weight vectors of one step (1 or 2; the grid search's candidates):
    # a loop over rows of python ints, after the collectives, not over particles
    lse, ess = [], []
    for r in range(R):
        s1, s2 = int(ints[r]), int(ints[R + r])
        if s1 <= 0 or not bool(fin[r]):
            lse.append(-math.inf)
            ess.append(0.0)
        else:
            lse.append(float(M[r]) + math.log(s1) - bits * _LN2)
            ess.append(s1 * s1 / (s2 << bits))
    return lse, ess, head[R:].tolist(), [int(v) for v in ints[2 * R:]]
