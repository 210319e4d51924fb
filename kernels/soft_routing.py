"""Soft routing of points through batched, heap-indexed soft decision trees.

A soft tree of padded depth ``d`` has ``I = 2**d - 1`` internal slots and ``L = 2**d``
leaf slots in heap order (node ``i`` has children ``2i+1`` (left) and ``2i+2``
(right); leaf slot ``j`` is heap node ``I + j``). A topology with fewer internal
nodes masks the unused slots: a masked internal node sends every point left, so
a real leaf of depth ``e < d`` collects its mass in its leftmost descendant slot and
the other slots below it get exactly zero (paper 004, eq. 4-5; HMC-DFI splits).

Every function is batched over a leading tree dimension ``B`` (chains x topologies)
and differentiable by autograd; nothing loops over trees or points. The only Python
loop is over the ``d`` levels of the tree.

Functions
---------
split_probabilities  psi [B, N, I]: probability of going right at each node (eq. 4)
leaf_probabilities   phi [B, N, L] from psi: products along root-to-leaf paths (eq. 5)
soft_routing         both at once from split weights and thresholds (fast backward)
soft_routing_autograd  the same in plain torch, differentiated by autograd
soft_class_counts    soft counts phi^T onehot(y) [B, L, C] (eq. 8's phi_{c,k})
dirichlet_multinomial_loglik   eq. 8, summed over leaves [B]
gaussian_soft_loglik           eq. 9 [B]
soft_routing_reference         per-leaf path products (plain reference for tests)
"""
from __future__ import annotations

import math
from typing import Optional, Tuple, Union, overload

import torch

__all__ = [
    "n_internal",
    "n_leaf_slots",
    "split_probabilities",
    "leaf_probabilities",
    "soft_routing",
    "routing_forward",
    "routing_backward",
    "effective_thresholds",
    "soft_routing_autograd",
    "soft_routing_reference",
    "soft_class_counts",
    "dirichlet_multinomial_loglik",
    "gaussian_soft_loglik",
]


def n_internal(depth: int) -> int:
    """Number of internal slots ``2**depth - 1`` of a full tree of ``depth``."""
    return (1 << depth) - 1


def n_leaf_slots(depth: int) -> int:
    """Number of leaf slots ``2**depth`` of a full tree of ``depth``."""
    return 1 << depth


def effective_thresholds(thresholds: torch.Tensor, node_mask: Optional[torch.Tensor]) -> torch.Tensor:
    """Thresholds with ``+inf`` on padded slots (``node_mask`` False), [B, I]."""
    # A padded slot gets threshold +inf: its logit is -inf, so it sends everything
    # left with an exactly zero gradient. Masking the small [B, I] thresholds is far
    # cheaper than masking the [B, N, I] probabilities.
    if node_mask is None:
        return thresholds
    inf = torch.full((), float("inf"), dtype=thresholds.dtype, device=thresholds.device)
    return torch.where(node_mask, thresholds, inf)


def sharpness_view(sharpness: Union[float, torch.Tensor]):
    """Sharpness broadcastable against [B, N, I]: a float or a [B, 1, 1] view."""
    if torch.is_tensor(sharpness) and sharpness.dim() > 0:
        return sharpness.reshape(-1, 1, 1)
    return sharpness


def split_probabilities(
    X: torch.Tensor,
    weights: torch.Tensor,
    thresholds: torch.Tensor,
    sharpness: Union[float, torch.Tensor],
    node_mask: Optional[torch.Tensor] = None,
) -> "tuple[torch.Tensor, torch.Tensor]":
    """Probabilities of going right and left at every internal node (eq. 4).

    Parameters
    ----------
    X : Tensor [N, D]
        Inputs scaled to [0, 1] (min-max on the training data).
    weights : Tensor [B, I, D]
        Split directions on the simplex.
    thresholds : Tensor [B, I]
        Thresholds in (0, 1).
    sharpness : float or Tensor [B]
        Split sharpness ``h`` (smaller = harder split).
    node_mask : BoolTensor [B, I] or [I], optional
        ``False`` for padded slots; they send everything left.

    Returns
    -------
    right, left : Tensor [B, N, I]
        ``right = logistic((x . w - tau) / h)``; ``left`` is computed as
        ``logistic(-(...))`` rather than ``1 - right`` so that tiny left
        probabilities keep their relative precision when ``h`` is small.
    """
    tau = effective_thresholds(thresholds, node_mask)
    z = (torch.matmul(X, weights.transpose(-1, -2)) - tau.unsqueeze(-2)) / sharpness_view(sharpness)
    return torch.sigmoid(z), torch.sigmoid(-z)


def leaf_probabilities(right: torch.Tensor, left: torch.Tensor) -> torch.Tensor:
    """Leaf-assignment probabilities from per-node split probabilities (eq. 5).

    Parameters
    ----------
    right, left : Tensor [B, N, I]
        Per-node probabilities, ``I = 2**d - 1`` in heap order.

    Returns
    -------
    Tensor [B, N, L], ``L = I + 1``; rows sum to one.

    Notes
    -----
    Level ``l`` holds heap nodes ``2**l - 1 .. 2**(l+1) - 2``; node ``j`` of a level
    has its children at positions ``2j`` and ``2j+1`` of the next level, so
    interleaving ``[phi*left, phi*right]`` keeps heap order without any gather.
    """
    I = right.shape[-1]
    depth = int(round(math.log2(I + 1)))
    if (1 << depth) - 1 != I:
        raise ValueError(f"number of internal slots {I} is not 2**d - 1")
    sizes = [1 << level for level in range(depth)]
    # torch.split (not slicing) so that the backward pass concatenates the level
    # gradients instead of allocating one zero-filled [B, N, I] tensor per slice.
    return _combine_levels(right.split(sizes, -1), left.split(sizes, -1), right)


def _combine_levels(rights, lefts, like: torch.Tensor) -> torch.Tensor:
    B, N = like.shape[0], like.shape[1]
    phi = None
    for r, l in zip(rights, lefts):
        if phi is None:  # root level: the path product starts at one
            phi = torch.stack((l, r), dim=-1).reshape(B, N, 2)
        else:
            phi = torch.stack((phi * l, phi * r), dim=-1).reshape(B, N, 2 * r.shape[-1])
    if phi is None:  # depth 0: a single leaf
        phi = torch.ones(B, N, 1, dtype=like.dtype, device=like.device)
    return phi


def _combine_levels_nm(rights, lefts) -> torch.Tensor:
    """Node-major path products: levels ``[B, 2**l, N]`` -> phi ``[B, L, N]``."""
    phi = None
    for r, l in zip(rights, lefts):
        B, n, N = r.shape
        if phi is None:
            phi = torch.cat((l, r), dim=1)
        else:
            phi = torch.stack((phi * l, phi * r), dim=2).reshape(B, 2 * n, N)
    return phi


def routing_forward(
    X: torch.Tensor, weights: torch.Tensor, tau: torch.Tensor, h
) -> "tuple[torch.Tensor, torch.Tensor, torch.Tensor]":
    """Forward half of the fast path, in node-major layout.

    Parameters
    ----------
    X : Tensor [N, D] scaled inputs
    weights : Tensor [B, I, D]
    tau : Tensor [B, I], effective thresholds (``+inf`` on padded slots)
    h : float or Tensor [B, 1, 1]

    Returns
    -------
    phi : Tensor [B, L, N] (leaf-major: ``phi[b, k, n]`` is point n's mass at leaf k)
    right, left : Tensor [B, I, N]

    Notes
    -----
    Node-major ("nodes x points") layout turns every product with the data into
    one plain 2-D GEMM (``[B*I, D] x [D, N]``) instead of a broadcast batched
    matmul, and keeps each level's slice contiguous.
    """
    B, I, D = weights.shape
    N = X.shape[0]
    proj = torch.matmul(weights.reshape(B * I, D), X.transpose(0, 1)).reshape(B, I, N)
    z = (proj - tau.unsqueeze(-1)) / h
    right, left = torch.sigmoid(z), torch.sigmoid(-z)
    sizes = [1 << level for level in range((I + 1).bit_length() - 1)]
    phi = _combine_levels_nm(right.split(sizes, 1), left.split(sizes, 1))
    return phi, right, left


@overload
def routing_backward(
    grad_phi: torch.Tensor, phi: torch.Tensor, right: torch.Tensor, left: torch.Tensor, X: torch.Tensor, h,
    weights: None = None,
) -> Tuple[torch.Tensor, torch.Tensor]: ...


@overload
def routing_backward(
    grad_phi: torch.Tensor, phi: torch.Tensor, right: torch.Tensor, left: torch.Tensor, X: torch.Tensor, h,
    weights: torch.Tensor,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]: ...


def routing_backward(
    grad_phi: torch.Tensor, phi: torch.Tensor, right: torch.Tensor, left: torch.Tensor, X: torch.Tensor, h,
    weights: Optional[torch.Tensor] = None,
) -> Union[Tuple[torch.Tensor, torch.Tensor], Tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Backward half of the fast path (node-major): gradients of split weights and thresholds.

    With ``G = dL/dphi`` and ``S = G * phi`` summed over the leaves below each child,

        dL/dz_j = left_j * S(right subtree of j) - right_j * S(left subtree of j),

    accumulated bottom-up level by level; then ``dL/dW = (dL/dz / h) X`` and
    ``dL/dtau = -sum_n dL/dz / h``.

    Parameters
    ----------
    grad_phi, phi : Tensor [B, L, N]
    right, left : Tensor [B, I, N] (from :func:`routing_forward`)
    X : Tensor [N, D]
    h : float or Tensor [B, 1, 1]

    weights : Tensor [B, I, D], optional
        Given, the gradient of the inputs is returned too.

    Returns
    -------
    (grad_weights [B, I, D], grad_tau [B, I]), and ``grad_X [N, D]`` when ``weights`` is given
    (``dL/dX = sum_{b, i} dL/dz_{b,i} w_{b,i}``).
    """
    B, L, N = phi.shape
    I = right.shape[1]
    S = grad_phi * phi
    sizes = [1 << level for level in range((I + 1).bit_length() - 1)]
    rights, lefts = right.split(sizes, 1), left.split(sizes, 1)
    gz_levels = []
    for level in range(len(sizes) - 1, -1, -1):
        pairs = S.reshape(B, sizes[level], 2, N)
        s_left, s_right = pairs[:, :, 0], pairs[:, :, 1]
        gz_levels.append(lefts[level] * s_right - rights[level] * s_left)
        S = s_left + s_right
    gz = torch.cat(gz_levels[::-1], dim=1) / h  # [B, I, N]
    g_w = torch.matmul(gz.reshape(B * I, N), X).reshape(B, I, X.shape[1])
    if weights is None:
        return g_w, -gz.sum(-1)
    # dL/dX[n] = sum over trees and nodes of dL/dz * w (a latent or learned input's gradient)
    g_x = torch.matmul(gz.permute(2, 0, 1).reshape(N, B * I), weights.reshape(B * I, -1))
    return g_w, -gz.sum(-1), g_x


class _SoftRoutingFn(torch.autograd.Function):
    """Soft routing with the closed-form backward of :func:`routing_backward`.

    Autograd through the level-by-level products records ~10 small ops per level and
    replays them backwards; on a CPU those per-op costs dominate for the batch sizes
    NUTS uses. The closed form is not itself differentiable: a backward that records a graph
    (``create_graph=True``: Hessians, a Laplace approximation) differentiates the plain-torch
    levels (:func:`_routing_levels`) instead, so second derivatives are exact.
    """

    @staticmethod
    def forward(ctx, X, weights, tau, h):
        phi, right, left = routing_forward(X, weights, tau, h)
        ctx.save_for_backward(X, right, left, phi, weights, tau)
        ctx.h = h
        return phi.transpose(-1, -2)

    @staticmethod
    def backward(ctx, grad_phi):
        X, right, left, phi, weights, tau = ctx.saved_tensors
        if torch.is_grad_enabled():  # a double backward: the gradient itself must be differentiable
            want = [t for t, need in zip((X, weights, tau), ctx.needs_input_grad[:3]) if need]
            got = iter(torch.autograd.grad(_routing_levels(X, weights, tau, ctx.h), want, grad_phi, create_graph=True))
            return tuple(next(got) if need else None for need in ctx.needs_input_grad[:3]) + (None,)
        if ctx.needs_input_grad[0]:  # inputs that are latent or learned (a network's output)
            g_w, g_tau, g_x = routing_backward(grad_phi.transpose(-1, -2), phi, right, left, X, ctx.h, weights)
            return g_x, g_w, g_tau, None
        g_w, g_tau = routing_backward(grad_phi.transpose(-1, -2), phi, right, left, X, ctx.h)
        return None, g_w, g_tau, None


def soft_routing(
    X: torch.Tensor,
    weights: torch.Tensor,
    thresholds: torch.Tensor,
    sharpness: Union[float, torch.Tensor],
    node_mask: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Leaf-assignment probabilities phi [B, N, L] of every point in every tree.

    Parameters
    ----------
    X : Tensor [N, D] inputs scaled to [0, 1]
    weights : Tensor [B, I, D] split weights on the simplex
    thresholds : Tensor [B, I] thresholds in (0, 1)
    sharpness : float or Tensor [B]
    node_mask : BoolTensor [B, I], optional (False = padded slot)

    Returns
    -------
    Tensor [B, N, L] with ``L = I + 1``; sums to one over ``L``.

    Notes
    -----
    Fast path with a closed-form backward (see ``_SoftRoutingFn``); gradients flow to
    ``weights`` and ``thresholds``, and to ``X`` when it requires them. :func:`soft_routing_autograd` is the plain-torch
    reference it is tested against.
    """
    I = thresholds.shape[-1]
    if (1 << ((I + 1).bit_length() - 1)) - 1 != I:
        raise ValueError(f"number of internal slots {I} is not 2**d - 1")
    if I == 0:
        return torch.ones(weights.shape[0], X.shape[0], 1, dtype=weights.dtype, device=weights.device)
    tau = effective_thresholds(thresholds, node_mask)
    return _SoftRoutingFn.apply(X.to(weights.dtype), weights, tau, sharpness_view(sharpness))


def soft_routing_autograd(
    X: torch.Tensor,
    weights: torch.Tensor,
    thresholds: torch.Tensor,
    sharpness: Union[float, torch.Tensor],
    node_mask: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Plain-torch :func:`soft_routing`, differentiated by autograd (the reference path).

    Parameters
    ----------
    X : Tensor [N, D] inputs scaled to [0, 1]
    weights : Tensor [B, I, D] split weights on the simplex
    thresholds : Tensor [B, I] thresholds in (0, 1)
    sharpness : float or Tensor [B]
    node_mask : BoolTensor [B, I], optional (False = padded slot)

    Returns
    -------
    Tensor [B, N, L] with ``L = I + 1``; sums to one over ``L``.

    Notes
    -----
    Works level by level on the small per-node parameters (one ``[N, D] x [D, 2**l]``
    product per level), so every large intermediate is level-local and the backward
    pass never scatters into a full ``[B, N, I]`` buffer.
    """
    I = thresholds.shape[-1]
    depth = int(round(math.log2(I + 1)))
    if (1 << depth) - 1 != I:
        raise ValueError(f"number of internal slots {I} is not 2**d - 1")
    return _routing_levels(X, weights, effective_thresholds(thresholds, node_mask), sharpness_view(sharpness))


def _routing_levels(X: torch.Tensor, weights: torch.Tensor, tau: torch.Tensor, h) -> torch.Tensor:
    """:func:`soft_routing_autograd` on the effective thresholds ``tau`` and the sharpness view ``h``,
    ``[B, N, L]`` (plain torch ops: autograd differentiates it to any order)."""
    depth = (tau.shape[-1] + 1).bit_length() - 1
    sizes = [1 << level for level in range(depth)]
    rights, lefts = [], []
    for w_l, t_l in zip(weights.split(sizes, -2), tau.split(sizes, -1)):
        z = (torch.matmul(X, w_l.transpose(-1, -2)) - t_l.unsqueeze(-2)) / h
        rights.append(torch.sigmoid(z))
        lefts.append(torch.sigmoid(-z))
    B = weights.shape[0]
    like = torch.empty(B, X.shape[0], 0, dtype=weights.dtype, device=weights.device)
    return _combine_levels(rights, lefts, like)


def soft_routing_reference(
    X: torch.Tensor,
    weights: torch.Tensor,
    thresholds: torch.Tensor,
    sharpness: Union[float, torch.Tensor],
    node_mask: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Plain reference for :func:`soft_routing`: one explicit path product per leaf.

    Same parameters and result as :func:`soft_routing`; loops over leaves and their
    ancestors (slow, for tests only).
    """
    right, left = split_probabilities(X, weights, thresholds, sharpness, node_mask)
    I = right.shape[-1]
    out = []
    for leaf in range(I + 1):
        node = I + leaf
        prob = torch.ones_like(right[..., 0])
        while node > 0:
            parent = (node - 1) // 2
            prob = prob * (right[..., parent] if node == 2 * parent + 2 else left[..., parent])
            node = parent
        out.append(prob)
    return torch.stack(out, dim=-1)


def soft_class_counts(phi: torch.Tensor, y_onehot: torch.Tensor) -> torch.Tensor:
    """Soft class counts per leaf, ``phi_{c,k} = sum_i phi_{i,k} 1[y_i = c]`` (eq. 8).

    Parameters
    ----------
    phi : Tensor [B, N, L]
    y_onehot : Tensor [N, C]

    Returns
    -------
    Tensor [B, L, C]
    """
    return torch.matmul(phi.transpose(-1, -2), y_onehot.to(phi.dtype))


def dirichlet_multinomial_loglik(counts: torch.Tensor, alpha_per_class: float) -> torch.Tensor:
    """Soft-count Dirichlet-multinomial log likelihood summed over leaves (eq. 8).

    Parameters
    ----------
    counts : Tensor [B, L, C]
        Soft class counts; an empty (padded) leaf contributes exactly zero.
    alpha_per_class : float
        Concentration of each class (the symmetric Dirichlet's ``alpha / K``).

    Returns
    -------
    Tensor [B]
    """
    C = counts.shape[-1]
    a = float(alpha_per_class)
    A = a * C
    per_leaf = (
        math.lgamma(A)
        - torch.lgamma(counts.sum(-1) + A)
        + (torch.lgamma(counts + a) - math.lgamma(a)).sum(-1)
    )
    return per_leaf.sum(-1)


def gaussian_soft_loglik(
    phi: torch.Tensor, mu: torch.Tensor, sigma2: torch.Tensor, y: torch.Tensor
) -> torch.Tensor:
    """Gaussian log likelihood of the soft tree's mean prediction (eq. 9).

    Parameters
    ----------
    phi : Tensor [B, N, L]
    mu : Tensor [B, L] leaf means
    sigma2 : Tensor [B] noise variance shared by the leaves
    y : Tensor [N] targets

    Returns
    -------
    Tensor [B]: ``sum_i log N(y_i | sum_k phi_ik mu_k, sigma2)``.
    """
    pred = torch.matmul(phi, mu.unsqueeze(-1)).squeeze(-1)  # [B, N]
    resid = pred - y.to(pred.dtype)
    N = y.shape[-1]
    return -0.5 * N * torch.log(2 * math.pi * sigma2) - 0.5 * (resid * resid).sum(-1) / sigma2
