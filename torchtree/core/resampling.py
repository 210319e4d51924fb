"""Resampling from log-weights, in float64.

Every resampler has the same signature (as in BlackJAX)::

    fn(generator, log_weights, n) -> ancestors

with ``log_weights`` a 1-D tensor of N (unnormalised) log-weights of any float
dtype, ``n`` the number of ancestors to draw and ``ancestors`` a LongTensor [n]
of indices into ``0..N-1``, sorted ascending, on the device of
``log_weights``. Weights are handled in float64 throughout.

Random numbers come only from ``generator`` (never torch's global RNG). They
are drawn on the generator's device and then moved to the device of
``log_weights``, so a CPU generator gives the same ancestors for CPU and CUDA
weights. ``generator=None`` uses a fresh, non-reproducible generator.

Weight validation (shared by every function here that takes log-weights):

* a NaN log-weight raises ``ValueError``;
* all log-weights ``-inf`` raises ``ValueError("all particle weights are zero")``;
* ``+inf`` log-weights are *accepted*: the particles with ``+inf`` share the
  whole mass equally and every finite particle gets weight zero (the limit of
  letting those log-weights grow together).

Besides the resamplers the module offers ``ncopies`` <-> ancestors
conversions, the copy-count route of Drousiotis et al. (paper 002, eq. 8-10)
for a slice of the cumulative weights held by one rank, ``ess``,
``normalize`` and ``stable_ancestors`` (a slot-preserving ordering of the
ancestors that minimises data movement when gathering particles).
"""
from __future__ import annotations

import math
from typing import Callable

import torch
from torch import Tensor

__all__ = [
    "multinomial",
    "systematic",
    "stratified",
    "residual",
    "ncopies",
    "ancestors_from_ncopies",
    "ncopies_from_cdf",
    "cumulative_weights",
    "ess",
    "ess_rows",
    "normalize",
    "stable_ancestors",
    "RESAMPLERS",
    "get_resampler",
    "Resampler",
]

Resampler = Callable[[torch.Generator | None, Tensor, int], Tensor]

# Largest float64 strictly below 1: uniforms are clamped to it because
# (j + U) / n can round up to exactly 1.0 and would then select index N.
_ONE_MINUS = 1.0 - 2.0**-53
# Relative tolerance (in units of n w) within which residual resampling treats
# n w_i as the integer it is in exact arithmetic.
_SNAP = 64 * 2.0**-52


# ----------------------------------------------------------------------------
# validation and weight helpers
# ----------------------------------------------------------------------------


def _prepare(log_weights: Tensor) -> Tensor:
    """Validate ``log_weights`` and return them as float64 with ``+inf`` resolved.

    Parameters
    ----------
    log_weights : Tensor [N]
        Unnormalised log-weights, any float dtype.

    Returns
    -------
    Tensor [N], float64, finite or ``-inf``.
    """
    if not isinstance(log_weights, Tensor):
        raise TypeError(f"log_weights must be a torch.Tensor, got {type(log_weights).__name__}")
    if log_weights.dim() != 1:
        raise ValueError(f"log_weights must be 1-D [N], got shape {tuple(log_weights.shape)}")
    if log_weights.numel() == 0:
        raise ValueError("log_weights is empty: there are no particles to resample")
    if not (log_weights.is_floating_point()):
        raise TypeError(f"log_weights must be a floating-point tensor, got {log_weights.dtype}")
    lw = log_weights.detach().to(torch.float64)
    # One reduction and one host sync answer all three checks: max propagates
    # NaN, is +inf if any entry is, and is -inf only if every entry is.
    top = float(lw.max())
    if math.isnan(top):
        raise ValueError("log_weights contain NaN")
    if top == -math.inf:
        raise ValueError("all particle weights are zero (every log-weight is -inf)")
    if top == math.inf:
        # Limit of the +inf particles' log-weights growing together: they share
        # the mass equally and everything finite is negligible.
        lw = torch.where(lw.isposinf(), torch.zeros_like(lw), torch.full_like(lw, -torch.inf))
    return lw


def _weights(lw: Tensor) -> Tensor:
    """Unnormalised weights ``exp(lw - max)`` in (0, 1], max exactly 1, no overflow.

    The resamplers only need weights up to a constant (``_cdf`` normalises by
    its last value), which saves a logsumexp per call.
    """
    return torch.exp(lw - lw.max())


def _cdf(w: Tensor) -> Tensor:
    """Inclusive cdf of non-negative weights, monotone and ending at exactly 1.

    Dividing by the last element (rather than clamping) keeps the cdf monotone,
    makes the last value exactly 1.0 (x / x == 1 in IEEE arithmetic) and makes
    the trailing zero-weight particles sit exactly at 1.0 too, so a uniform in
    [0, 1) can never land on them.
    """
    c = torch.cumsum(w, 0)
    return c / c[-1]


def cumulative_weights(log_weights: Tensor) -> Tensor:
    """Inclusive cumulative sum of the normalised weights.

    Parameters
    ----------
    log_weights : Tensor [N]
        Unnormalised log-weights (any float dtype).

    Returns
    -------
    Tensor [N], float64: ``cdf[i] = sum_{j <= i} w_j``, monotone, with
    ``cdf[-1] == 1.0`` exactly.
    """
    return _cdf(_weights(_prepare(log_weights)))


def _check_n(n: int) -> int:
    if isinstance(n, bool) or not isinstance(n, int):
        try:
            n_int = int(n)
        except (TypeError, ValueError):
            raise TypeError(f"n must be an int, got {n!r}") from None
        if n_int != n:
            raise TypeError(f"n must be an int, got {n!r}")
        n = n_int
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    return n


def _uniform(generator: torch.Generator | None, size: int, device: torch.device) -> Tensor:
    """``size`` float64 uniforms in [0, 1) from ``generator``, moved to ``device``."""
    if generator is None:
        generator = torch.Generator()
        generator.seed()
    u = torch.rand(size, generator=generator, dtype=torch.float64, device=generator.device)
    return u.to(device)


def _inverse_cdf(cdf: Tensor, p: Tensor) -> Tensor:
    """Index of the interval ``[cdf[i-1], cdf[i])`` holding each point of ``p``.

    ``right=True`` gives half-open intervals closed on the left, so a
    zero-weight particle (empty interval) is never selected, even for p == 0.
    """
    p = p.clamp(max=_ONE_MINUS)
    return torch.searchsorted(cdf, p, right=True)


# ----------------------------------------------------------------------------
# resamplers
# ----------------------------------------------------------------------------


def multinomial(generator: torch.Generator | None, log_weights: Tensor, n: int) -> Tensor:
    """Multinomial resampling: ``n`` i.i.d. draws from the weights.

    Sorted uniforms are produced directly as normalised cumulative sums of
    ``n + 1`` standard exponentials (the spacings of uniform order statistics),
    which avoids an O(n log n) sort.

    Parameters
    ----------
    generator : torch.Generator or None
        Source of randomness (``n + 1`` uniforms).
    log_weights : Tensor [N]
        Unnormalised log-weights.
    n : int
        Number of ancestors.

    Returns
    -------
    LongTensor [n], sorted ascending; ``ncopies`` is Multinomial(n, w).
    """
    n = _check_n(n)
    lw = _prepare(log_weights)
    cdf = _cdf(_weights(lw))
    u = _uniform(generator, n + 1, lw.device)
    # -log1p(-u) rather than -log(u): u may be exactly 0.
    e = torch.cumsum(-torch.log1p(-u), 0)
    p = e[:n] / e[n]
    return _inverse_cdf(cdf, p)


def systematic(generator: torch.Generator | None, log_weights: Tensor, n: int) -> Tensor:
    """Systematic resampling: points ``(j + u) / n`` with a single ``u ~ U[0, 1)``.

    Parameters
    ----------
    generator : torch.Generator or None
        Source of randomness (one uniform).
    log_weights : Tensor [N]
        Unnormalised log-weights.
    n : int
        Number of ancestors.

    Returns
    -------
    LongTensor [n], sorted ascending. Each particle gets ``floor(n w_i)`` or
    ``ceil(n w_i)`` copies, and ``bincount`` equals
    ``ncopies_from_cdf(cumulative_weights(log_weights), u, n)`` for the same u.
    """
    n = _check_n(n)
    lw = _prepare(log_weights)
    cdf = _cdf(_weights(lw))
    u = _uniform(generator, 1, lw.device)
    # Same as searchsorted(cdf, (j + u) / n, right=True), but counted exactly
    # from n * cdf (see ncopies_from_cdf), so that the single-process result is
    # bit-for-bit the one the ranks of a distributed run compute from their
    # slices of the cdf, with no rounding of (j + u) / n in between.
    # Point j goes to the first particle whose cumulative count exceeds j.
    cum = _systematic_cumcounts(cdf, u[0], n)
    return torch.searchsorted(cum, torch.arange(n, device=cum.device), right=True)


def stratified(generator: torch.Generator | None, log_weights: Tensor, n: int) -> Tensor:
    """Stratified resampling: one uniform point in each stratum ``[j/n, (j+1)/n)``.

    Parameters
    ----------
    generator : torch.Generator or None
        Source of randomness (``n`` uniforms).
    log_weights : Tensor [N]
        Unnormalised log-weights.
    n : int
        Number of ancestors.

    Returns
    -------
    LongTensor [n], sorted ascending.
    """
    n = _check_n(n)
    lw = _prepare(log_weights)
    cdf = _cdf(_weights(lw))
    u = _uniform(generator, n, lw.device)
    p = (torch.arange(n, dtype=torch.float64, device=lw.device) + u) / n
    return _inverse_cdf(cdf, p)


def residual(generator: torch.Generator | None, log_weights: Tensor, n: int) -> Tensor:
    """Residual resampling: ``floor(n w_i)`` copies, multinomial on the rest.

    Parameters
    ----------
    generator : torch.Generator or None
        Source of randomness (``n + 1`` uniforms, however many are needed,
        so the stream consumed does not depend on the weights).
    log_weights : Tensor [N]
        Unnormalised log-weights.
    n : int
        Number of ancestors.

    Returns
    -------
    LongTensor [n], sorted ascending; particle i gets ``floor(n w_i)`` copies
    plus a Multinomial(R, r / R) share, ``r_i = n w_i - floor(n w_i)``,
    ``R = n - sum floor(n w)``.
    """
    n = _check_n(n)
    lw = _prepare(log_weights)
    w = _weights(lw)
    w = w / w.sum()
    nw = n * w
    # n w that is an integer in exact arithmetic often comes out a few ulps
    # below it (7 * (2/7) -> 1.9999999999999998); snap those to the integer so
    # the deterministic part is exact, at a bias of O(1e-14) copies.
    near = torch.round(nw)
    snap = (nw - near).abs() <= _SNAP * torch.clamp(nw, min=1.0)
    det = torch.where(snap, near, torch.floor(nw))
    det_l = det.to(torch.long)
    rest = (nw - det).clamp(min=0.0)
    n_rest = n - det_l.sum()  # stays on the device: no host sync
    # If round-off left no residual mass, fall back to the weights themselves.
    rest = torch.where(rest.sum() > 0, rest, w)
    cdf = _cdf(rest)
    # The first n_rest of e[:n] / e[n_rest] are the sorted order statistics of
    # n_rest uniforms; drawing n + 1 exponentials (an upper bound) and masking
    # keeps every size fixed, so nothing waits for n_rest on the host.
    u = _uniform(generator, n + 1, lw.device)
    e = torch.cumsum(-torch.log1p(-u), 0)
    p = e[:n] / e[n_rest]
    valid = torch.arange(n, device=lw.device) < n_rest
    idx = _inverse_cdf(cdf, p).clamp(max=lw.numel() - 1)
    counts = det_l.scatter_add(0, idx, valid.to(torch.long))
    cum = torch.cumsum(counts, 0)
    return torch.searchsorted(cum, torch.arange(n, device=lw.device), right=True)


RESAMPLERS: dict[str, Resampler] = {
    "multinomial": multinomial,
    "systematic": systematic,
    "stratified": stratified,
    "residual": residual,
}


def get_resampler(name: str | Resampler) -> Resampler:
    """The resampler called ``name``.

    Parameters
    ----------
    name : str
        One of ``RESAMPLERS`` (``"multinomial"``, ``"systematic"``,
        ``"stratified"``, ``"residual"``), case-insensitive. A callable is
        returned unchanged, so user-defined resamplers with the same
        signature can be passed wherever a name is accepted.

    Returns
    -------
    callable ``(generator, log_weights [N], n) -> LongTensor [n]``.
    """
    if callable(name) and not isinstance(name, str):
        return name
    key = name.lower() if isinstance(name, str) else name
    try:
        return RESAMPLERS[key]
    except (KeyError, TypeError):
        valid = ", ".join(repr(k) for k in RESAMPLERS)
        raise ValueError(f"unknown resampling scheme {name!r}; valid names are {valid}") from None


# ----------------------------------------------------------------------------
# ncopies, paper-002 route, ESS, stable ordering
# ----------------------------------------------------------------------------


def ncopies(ancestors: Tensor, N: int) -> Tensor:
    """Number of copies of each particle.

    Parameters
    ----------
    ancestors : LongTensor [n]
        Ancestor indices in ``0..N-1``.
    N : int
        Number of particles.

    Returns
    -------
    LongTensor [N] with ``sum == n``.
    """
    return torch.bincount(ancestors.to(torch.long), minlength=N)[:N]


def ancestors_from_ncopies(ncopies: Tensor, total: int | None = None) -> Tensor:
    """Sorted ancestor indices from copy counts.

    Parameters
    ----------
    ncopies : LongTensor [N]
        Non-negative copy counts.
    total : int, optional
        ``ncopies.sum()`` if known; passing it avoids a host sync on CUDA.

    Returns
    -------
    LongTensor [sum(ncopies)], sorted ascending.
    """
    idx = torch.arange(ncopies.numel(), device=ncopies.device)
    return torch.repeat_interleave(idx, ncopies.to(torch.long), output_size=total)


def ncopies_from_cdf(cdf: Tensor, u: float | Tensor, n: int, prev: float | Tensor = 0.0) -> Tensor:
    """Copy counts from a (slice of the) inclusive cdf, eq. 8-10 of paper 002.

    With ``c`` the inclusive prefix sum of the normalised weights and
    ``c[-1] := prev``,

        ncopies[i] = ceil(n c[i] - u) - ceil(n c[i-1] - u),

    which is eq. 9 of Drousiotis et al. written with the inclusive cdf (the
    paper calls the scheme multinomial; with one shared ``u`` it is in fact
    systematic resampling). It equals ``ncopies(systematic(...), N)`` drawn with
    the same ``u``. Each element depends only on ``c[i]`` and ``c[i-1]``, so a
    rank holding ``cdf[a:b]`` computes its own counts given ``prev = cdf[a-1]``
    (0 on the first rank) and the shared ``u``; the per-rank totals then sum to
    exactly ``n`` when each rank's ``prev`` is bit-for-bit the previous rank's
    last cdf value and the global last value is 1.

    Parameters
    ----------
    cdf : Tensor [M]
        Slice of the global inclusive cdf of normalised weights (monotone, in
        [0, 1]; the global last value should be 1).
    u : float or 0-d Tensor
        The common uniform in [0, 1), identical on every rank.
    n : int
        Total number of copies over all ranks.
    prev : float or 0-d Tensor
        Global cdf value just before this slice (0 for the first slice).

    Returns
    -------
    LongTensor [M] of non-negative counts.
    """
    n = _check_n(n)
    c = cdf.to(torch.float64)
    prev_t = torch.as_tensor(prev, dtype=torch.float64, device=c.device).reshape(1)
    u_t = torch.as_tensor(u, dtype=torch.float64, device=c.device).reshape(())
    return torch.diff(_systematic_cumcounts(torch.cat([prev_t, c]), u_t, n))


def _systematic_cumcounts(cdf: Tensor, u: Tensor, n: int) -> Tensor:
    """``ceil(n * cdf - u)``: how many of the points ``(j + u) / n`` lie below each cdf value.

    ``ceil(y - u)`` is evaluated as ``floor(y) + (frac(y) > u)``: ``frac`` of a
    double is exact and so is the comparison, whereas ``y - u`` rounds (for u
    near 1, ``n - u`` rounds to ``n - 1`` and a copy would be lost).

    Returns a LongTensor of the shape of ``cdf``, non-decreasing, in [0, n].
    """
    y = n * cdf
    fl = torch.floor(y)
    k = fl + (y - fl > u).to(torch.float64)
    # Clamping to [0, n] absorbs a global last value a hair above 1 (or a slice
    # start a hair below 0) so the counts can never exceed n or go negative.
    return k.clamp(0, n).to(torch.long)


def normalize(log_weights: Tensor) -> Tensor:
    """Normalised log-weights in float64.

    Parameters
    ----------
    log_weights : Tensor [N]
        Unnormalised log-weights.

    Returns
    -------
    Tensor [N], float64, with ``logsumexp == 0`` (``+inf`` entries become
    ``-log(k)`` for the k of them, finite ones ``-inf``).
    """
    lw = _prepare(log_weights)
    return lw - torch.logsumexp(lw, 0)


def ess(log_weights: Tensor) -> Tensor:
    """Effective sample size ``1 / sum(w_i^2)`` of the normalised weights.

    Computed as ``exp(2 logsumexp(lw) - logsumexp(2 lw))`` so that it is stable
    for any scale of the log-weights.

    Parameters
    ----------
    log_weights : Tensor [N]
        Unnormalised log-weights.

    Returns
    -------
    0-d float64 Tensor in ``[1, N]``.
    """
    lw = _prepare(log_weights)
    return torch.exp(2.0 * torch.logsumexp(lw, 0) - torch.logsumexp(2.0 * lw, 0))


def ess_rows(log_weights: Tensor) -> Tensor:
    """ESS of each row of a batch of log-weights (islands, chains, tempering groups).

    The formula of :func:`ess` along the last dimension, without its input checks: for the
    hot loops that call it every step on weights they produced themselves.

    Parameters
    ----------
    log_weights : Tensor [R, N], float64

    Returns
    -------
    Tensor [R] float64, each in ``[1, N]``.
    """
    return torch.exp(2 * torch.logsumexp(log_weights, -1) - torch.logsumexp(2 * log_weights, -1))


def stable_ancestors(ancestors: Tensor, N: int) -> Tensor:
    """Reorder ancestors so that survivors stay in their own slot.

    ``out`` is a permutation of ``ancestors`` with ``out[i] == i`` for every
    particle i with at least one copy; the extra copies fill the slots of the
    dead particles in ascending order of both. Gathering ``particles[out]``
    then only writes the dead slots, which minimises data movement in
    ``HardTrees.take``.

    Parameters
    ----------
    ancestors : LongTensor [N]
        Ancestor indices (any order); must have exactly N entries, one per slot.
    N : int
        Number of particles (slots).

    Returns
    -------
    LongTensor [N].
    """
    if ancestors.dim() != 1 or ancestors.numel() != N:
        raise ValueError(
            f"stable_ancestors needs exactly one ancestor per slot: got shape "
            f"{tuple(ancestors.shape)} for N={N}"
        )
    counts = ncopies(ancestors, N)
    out = torch.arange(N, device=ancestors.device)
    dead = counts == 0
    # Each survivor has counts - 1 extra copies; in total they number exactly
    # the dead slots, because sum(counts) == N.
    extras = ancestors_from_ncopies((counts - 1).clamp(min=0))
    out[dead] = extras
    return out
