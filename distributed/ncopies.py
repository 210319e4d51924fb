"""Distributed prefix sums and ``ncopies`` from log-weights (paper 002, eqs. 8-10).

Every rank holds ``n = N / P`` particles' log-weights, rank ``r`` the global indices
``[r n, (r + 1) n)``. ``ncopies[i]`` says how many copies of particle ``i`` the next population
holds; ``sum(ncopies) == N`` and ``0 <= ncopies[i] <= N``.

Exactness guarantee
-------------------
:func:`ncopies_from_log_weights` returns *bit-identical* results for every world size and
partition of the same global log-weights (and equals the same function called with one rank),
because every step is either exact or elementwise:

1. ``m = max(logw)`` (an exact reduction);
2. each weight is turned into a fixed-point integer ``q_i = round(2^K exp(logw_i - m))`` by an
   exponential built from IEEE add/mul/round only (:func:`fixed_point_weights`), so it does not
   depend on which SIMD lane or thread evaluated it (``torch.exp`` gives no such promise);
   ``K = 62 - ceil(log2 N)`` so that ``sum q <= 2^62`` fits in int64;
3. the inclusive cdf ``Q_i = sum_{j <= i} q_j`` is an int64 prefix sum (exclusive scan over
   ranks + local cumsum), exact and associative;
4. ``ncopies`` is an elementwise float64 function of ``(Q_i, Q_N, N, u)``.

Relative to exact real arithmetic the weights carry a quantisation of ``2^-K`` of the largest
weight (``2^-42`` for ``N = 2^20``): particles whose weight is below about ``2^-(K+1)`` times the
largest weight get no copies; they would get one with probability below ``N 2^-(K+1)``.
"""

from __future__ import annotations

import math

import torch

from .backend import Backend, LocalBackend

__all__ = [
    "prefix_sum",
    "global_log_sum_exp",
    "global_ess",
    "fixed_point_weights",
    "ncopies_from_log_weights",
]

# Cody-Waite split of ln 2 (fdlibm): k * _LN2_HI is exact for |k| < 2^20.
_LN2_HI = 6.93147180369123816490e-01
_LN2_LO = 1.90821492927058770002e-10
_INV_LN2 = 1.44269504088896338700e00
_EXP_DEGREE = 13  # Taylor degree on |r| <= ln2/2: truncation < 2^-57, below the 2^-K quantum


def _backend(backend) -> Backend:
    return LocalBackend() if backend is None else backend


def prefix_sum(x: torch.Tensor, backend: Backend | None = None, *, exclusive: bool = False) -> torch.Tensor:
    """Global prefix sum along dim 0 of a tensor split across ranks in rank order.

    Parameters
    ----------
    x : Tensor ``[n, ...]``
        This rank's rows of the global ``[N, ...]`` tensor (``n`` may differ between ranks).
    backend : Backend, optional (default: one rank)
    exclusive : bool
        If True, row ``i`` excludes itself (``out[0]`` on rank 0 is zero).

    Returns
    -------
    Tensor ``[n, ...]``, this rank's rows of ``cumsum(global x, 0)`` (or its exclusive version).

    Notes
    -----
    One ``exclusive_scan`` of the local totals plus a local cumsum. Integer results equal the
    single-process cumsum exactly; floating-point ones agree up to rounding, since the sums are
    associated differently.
    """
    backend = _backend(backend)
    offset = backend.exclusive_scan(x.sum(0))
    inclusive = torch.cumsum(x, 0) + offset
    return inclusive - x if exclusive else inclusive


def _check_log_weights(log_weights: torch.Tensor) -> torch.Tensor:
    if not isinstance(log_weights, torch.Tensor) or log_weights.dim() != 1:
        raise ValueError("log_weights must be a 1-D tensor [n]")
    if log_weights.is_complex() or not log_weights.is_floating_point():
        raise ValueError(f"log_weights must be floating point, got {log_weights.dtype}")
    return log_weights.to(torch.float64)


def global_log_sum_exp(log_weights: torch.Tensor, backend: Backend | None = None) -> torch.Tensor:
    """``log(sum(exp(logw)))`` over every rank's log-weights, in float64.

    Parameters
    ----------
    log_weights : Tensor ``[n]``
    backend : Backend, optional

    Returns
    -------
    float64 scalar Tensor (identical on every rank); ``-inf`` when every weight is zero.

    Raises
    ------
    ValueError
        ``log_weights`` is not a 1-D floating-point tensor.
    CollectiveError, CollectiveTimeout
        A peer died, raised, or did not answer within the backend's timeout.

    Notes
    -----
    Two ``all_reduce`` calls (the maximum, then the sum of ``exp(logw - max)``) in float64:
    the result agrees across world sizes up to rounding, not bit for bit; use
    :func:`global_stats` for that.
    """
    backend = _backend(backend)
    lw = _check_log_weights(log_weights)
    local_max = lw.max() if lw.numel() else lw.new_tensor(-math.inf)
    m = backend.all_reduce(local_max.reshape(1), "max")[0]
    if not torch.isfinite(m):
        return m
    s = backend.all_reduce(torch.exp(lw - m).sum().reshape(1), "sum")[0]
    return m + torch.log(s)


def global_ess(log_weights: torch.Tensor, backend: Backend | None = None) -> torch.Tensor:
    """Effective sample size ``(sum w)^2 / sum w^2`` over every rank's particles (eq. 7).

    Parameters
    ----------
    log_weights : Tensor ``[n]`` (unnormalised)
    backend : Backend, optional

    Returns
    -------
    float64 scalar Tensor in ``[1, N]`` (0 when every weight is zero; the number of ``+inf``
    log-weights when there are any).

    Raises
    ------
    ValueError
        ``log_weights`` is not a 1-D floating-point tensor.
    CollectiveError, CollectiveTimeout
        A peer died, raised, or did not answer within the backend's timeout.
    """
    backend = _backend(backend)
    lw = _check_log_weights(log_weights)
    local_max = lw.max() if lw.numel() else lw.new_tensor(-math.inf)
    m = backend.all_reduce(local_max.reshape(1), "max")[0]
    if m == -math.inf:
        return lw.new_tensor(0.0)
    # +inf particles, if any, share the mass equally (as in ncopies_from_log_weights)
    w = (lw == math.inf).to(torch.float64) if m == math.inf else torch.exp(lw - m)
    s = backend.all_reduce(torch.stack([w.sum(), (w * w).sum()]), "sum")
    return s[0] * s[0] / s[1]


def _pow2(e: torch.Tensor) -> torch.Tensor:
    """Exact ``2.0 ** e`` for int64 ``e`` in [-1022, 1023], built from the float64 bit pattern."""
    return torch.bitwise_left_shift(e + 1023, 52).view(torch.float64)


def fixed_point_weights(x: torch.Tensor, bits: int) -> torch.Tensor:
    """``round(2^bits * exp(x))`` for ``x <= 0``, reproducibly, as int64.

    Parameters
    ----------
    x : Tensor [n]
        float64 values ``<= 0`` or ``-inf`` (log-weights minus their maximum).
    bits : int
        Fractional bits, ``0 <= bits <= 62``.

    Returns
    -------
    int64 Tensor ``[n]`` in ``[0, 2^bits]``; exactly ``2^bits`` where ``x == 0``, 0 where
    ``x == -inf``.

    Raises
    ------
    ValueError
        ``bits`` outside ``[0, 62]``.

    Notes
    -----
    ``exp`` is evaluated as ``2^k p(r)`` with ``k = round(x / ln 2)``, a Cody-Waite reduction
    ``r = x - k ln 2`` and a degree-13 Horner polynomial, each step one IEEE-rounded torch op, so
    the result is a pure function of each element (same bits on any partition, thread count or
    vector width). Its error is a few ulp, far below the ``2^-bits`` quantum.
    """
    if not 0 <= bits <= 62:
        raise ValueError(f"bits must be in [0, 62], got {bits}")
    finite = torch.isfinite(x)
    # Below 2^-(bits+2) of the largest weight the result rounds to zero anyway; clamping keeps
    # k in the range where 2^k is a normal double.
    xc = torch.where(finite, x, torch.zeros_like(x)).clamp(min=-(bits + 64) * math.log(2.0))
    k = torch.round(xc * _INV_LN2)
    r = (xc - k * _LN2_HI) - k * _LN2_LO
    p = torch.full_like(r, 1.0 / math.factorial(_EXP_DEGREE))
    for i in range(_EXP_DEGREE - 1, -1, -1):
        p = p * r + (1.0 / math.factorial(i))
    e = k.to(torch.int64) + bits
    q = torch.round(p * _pow2(e.clamp(min=-1022)))
    q = torch.where(finite & (e >= -1022), q, torch.zeros_like(q))
    return q.to(torch.int64)


def ncopies_from_log_weights(
    log_weights: torch.Tensor,
    backend: Backend | None = None,
    *,
    method: str = "systematic",
    u: float | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Number of copies of each local particle for resampling, from log-weights (eqs. 8-10).

    Parameters
    ----------
    log_weights : Tensor ``[n]``
        Unnormalised log-weights of this rank's particles (global rows ``[rank n, (rank+1) n)``;
        every rank must hold the same ``n``). ``-inf`` means weight zero; NaN is an error;
        ``+inf`` particles, if any, share all the mass equally (as in ``torchtree.core.resampling``).
    backend : Backend, optional (default: one rank)
    method : {"systematic", "multinomial"}
        ``"systematic"``: eq. (9) with one shared uniform ``u``:
        ``ncopies_i = ceil(N F_i - u) - ceil(N F_{i-1} - u)`` with ``F`` the normalised
        inclusive cdf (the same as ``floor``-differences with ``u -> 1 - u``, up to ties).
        ``"multinomial"``: ``N`` i.i.d. integer points uniform on ``[0, Q_N)``,
        ``ncopies_i = #{points in [Q_{i-1}, Q_i)}``; every rank draws all ``N`` points from a
        shared seed (``O(N)`` work per rank) so that the result does not depend on ``P``.
    u : float in [0, 1), optional
        The systematic offset. Only rank 0's value is used (it is shared in the first reduce).
    generator : torch.Generator, optional
        Source of ``u`` (systematic) or of the seed of the points (multinomial) when ``u`` is
        not given; only rank 0's draw is used. Default: torch's global generator.

    Returns
    -------
    int64 Tensor ``[n]`` on the device of ``log_weights``: this rank's ``ncopies``; over all
    ranks they sum to ``N = n P``. Bit-identical to the one-rank result on the concatenated
    log-weights (see the module notes for why).

    Raises
    ------
    ValueError
        (on every rank alike) NaN log-weights, all weights zero, unequal ``n`` across ranks,
        bad ``method`` or ``u``.

    Notes
    -----
    Two collectives: one ``all_reduce(max)`` carrying the local maximum, error flags, ``n`` and
    rank 0's uniform; one ``all_gather`` of the local fixed-point sums, from which both the
    global total (the normaliser, "sum-exp") and this rank's exclusive offset come.
    """
    backend = _backend(backend)
    if method not in ("systematic", "multinomial"):
        raise ValueError(f"method must be 'systematic' or 'multinomial', got {method!r}")
    lw = _check_log_weights(log_weights)
    device = log_weights.device
    n = lw.numel()

    # Local problems are folded into the first reduce so that every rank raises together
    # instead of one raising and the others waiting for it until the timeout.
    problem = "log_weights contain NaN" if bool(torch.isnan(lw).any()) else ""
    local_max = lw.masked_fill(torch.isnan(lw), -math.inf).max() if n else lw.new_tensor(-math.inf)
    shared = -math.inf
    if backend.rank == 0:
        if u is not None:
            if method != "systematic":
                problem = problem or "u is only used by systematic resampling"
            elif not 0.0 <= float(u) < 1.0:
                problem = problem or f"u must be in [0, 1), got {u}"
            else:
                shared = float(u)
        elif method == "systematic":
            shared = float(torch.rand((), dtype=torch.float64, generator=generator))
        else:  # a seed below 2^53 travels exactly in float64
            shared = float(torch.randint(0, 2**53, (), generator=generator))
    head = torch.tensor(
        [float(local_max), 1.0 if problem else 0.0, shared, float(n), -float(n)], dtype=torch.float64
    )
    head = backend.all_reduce(head, "max")
    m, shared = float(head[0]), float(head[2])
    n_max, n_min = int(head[3]), -int(head[4])
    if head[1] > 0:
        raise ValueError(problem or "invalid resampling input on another rank (NaN log-weights or bad u)")
    if n_max != n_min:
        raise ValueError(f"every rank must hold the same number of particles, got {n_min}..{n_max}")
    if m == -math.inf:
        raise ValueError("all weights are zero (every log-weight is -inf)")
    big_n = n * backend.world_size

    bits = 62 - max(0, math.ceil(math.log2(big_n)))
    if m == math.inf:
        # As torchtree.core.resampling does: the +inf particles share the mass equally (the limit
        # of their log-weights growing together), every other particle gets weight zero.
        x = torch.where(lw == math.inf, 0.0, -math.inf).to(torch.float64)
    else:
        x = lw - m
    q = fixed_point_weights(x, bits)
    sums = backend.all_gather(q.sum().reshape(1).cpu())
    offset = int(sums[: backend.rank].sum())
    total = int(sums.sum())
    cdf = torch.cumsum(q, 0) + offset  # inclusive integer cdf Q_i, exact

    if method == "systematic":
        total_f = torch.tensor(float(total), dtype=torch.float64, device=lw.device)

        def count_below(qi: torch.Tensor) -> torch.Tensor:
            # Number of systematic points (j + u) / N, j = 0..N-1, below y / N with
            # y = N Q_i / Q_N, i.e. ceil(y - u). Evaluated as floor(y) + (frac(y) > u): the
            # fraction and the comparison are exact, whereas y - u rounds (N - u would round
            # to N - 1 for u near 1 and a copy would be lost).
            y = big_n * (qi.to(torch.float64) / total_f)
            fl = torch.floor(y)
            return fl + (y - fl > shared).to(torch.float64)

        c = count_below(cdf)
        c_prev = count_below(torch.tensor([offset], dtype=torch.int64, device=lw.device))
    else:
        g = torch.Generator(device="cpu").manual_seed(int(shared))
        points, _ = torch.sort(torch.randint(0, total, (big_n,), generator=g, dtype=torch.int64))
        c = torch.searchsorted(points, cdf.cpu(), right=False)
        c_prev = torch.searchsorted(points, torch.tensor([offset], dtype=torch.int64), right=False)
    counts = torch.diff(c.to(torch.int64), prepend=c_prev.to(torch.int64))
    return counts.to(device)
