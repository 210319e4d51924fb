"""Hand-derived potential and gradient of batched soft decision trees (paper 004).

An autograd graph of the soft-tree potential has ~150 small ops whose bookkeeping, not
arithmetic, dominates on a CPU at NUTS batch sizes; :func:`potential_and_grad_core`
computes the same potential and its gradient in closed form from the routing kernels of
:mod:`torchtree.kernels.soft_routing` (forward and backward), with no graph. It is a pure
function of tensors and constants, so ``torch.compile`` fuses it once per tree depth
(:func:`compiled_core`) and :func:`torchtree.steps.nuts.nuts_step` can run it inside one
compiled leapfrog step.

Like every module under ``kernels/``, it imports nothing from torchtree's upper layers:
the model passes its hyperparameters and parameter layout as arguments.
"""
from __future__ import annotations

import math

import torch

from torchtree.kernels.soft_routing import effective_thresholds, routing_backward, routing_forward, sharpness_view

__all__ = ["potential_and_grad_core", "compiled_core", "disable_compiled"]


def potential_and_grad_core(theta, X, target, nm, cmf, node_mask, h, consts):
    """Closed-form potential and gradient of soft trees (see
    :meth:`torchtree.model.soft_trees.SoftTrees.potential_and_grad_analytic`); a pure
    function of tensors and constants so that ``torch.compile`` can fuse it once per tree
    depth.

    Parameters
    ----------
    theta : Tensor [B, P]
    X : Tensor [N, D] scaled inputs
    target : Tensor [N, C] one-hot labels or [N] regression targets
    nm : Tensor [B, I] float node mask
    cmf : Tensor [B, P] float coordinate mask
    node_mask : BoolTensor [B, I]
    h : Tensor [] or [B], sharpness
    consts : (hyper, layout, task, n_classes, include_likelihood)
        ``hyper`` has the prior's numbers (``threshold_a``, ``threshold_b``,
        ``split_concentration``, ``alpha``, ``mu_mean``, ``mu_var``, ``sigma_shape``,
        ``sigma_scale``), ``layout`` the parameter layout (``n_internal``, ``n_features``,
        ``n_leaves``, ``regression``, ``u_offset``, ``mu_offset``, ``s_offset``): a
        ``SoftTreeHyper`` and a ``ParamLayout``, read by attribute so that this module
        needs nothing from the model layer; ``task`` is "classification" or "regression".

    Returns
    -------
    (U [B], grad [B, P])
    """
    hp, lay, task, n_classes, include_likelihood = consts
    B, I, D, L = theta.shape[0], lay.n_internal, lay.n_features, lay.n_leaves
    Dw = D - 1
    dt = theta.dtype
    z = theta[:, : lay.u_offset].reshape(B, I, Dw)
    log_w = torch.log_softmax(torch.cat((z, torch.zeros(B, I, 1, dtype=dt, device=theta.device)), -1), -1)
    w = log_w.exp()
    u = theta[:, lay.u_offset : lay.mu_offset]
    tau = torch.sigmoid(u)
    # ---- prior (log density of theta) and its gradient
    ta, tb = hp.threshold_a, hp.threshold_b
    logbeta = math.lgamma(ta) + math.lgamma(tb) - math.lgamma(ta + tb)
    lp = (nm * (ta * torch.nn.functional.logsigmoid(u) + tb * torch.nn.functional.logsigmoid(-u))).sum(-1)
    lp = lp - logbeta * nm.sum(-1)
    g_u = nm * (ta * (1 - tau) - tb * tau)
    a = hp.split_concentration
    if D > 1:
        const = math.lgamma(D * a) - D * math.lgamma(a)
        lp = lp + (nm * (const + a * log_w.sum(-1))).sum(-1)
        g_z = nm.unsqueeze(-1) * (a * (1 - D * w[..., :Dw]))
    if lay.regression:
        lm = cmf[:, lay.mu_offset : lay.s_offset]
        mu = theta[:, lay.mu_offset : lay.s_offset]
        s = theta[:, lay.s_offset]
        inv = torch.exp(-s)
        dmu = mu - hp.mu_mean
        lp = lp + (lm * (-0.5 * math.log(2 * math.pi * hp.mu_var) - 0.5 * dmu * dmu / hp.mu_var)).sum(-1)
        g_mu = -lm * dmu / hp.mu_var
        sa, sb = hp.sigma_shape, hp.sigma_scale
        lp = lp + sa * math.log(sb) - math.lgamma(sa) - sa * s - sb * inv
        g_s = -sa + sb * inv
    # ---- likelihood and its gradient through the routing
    ll = torch.zeros(B, dtype=dt, device=theta.device)
    if include_likelihood:
        hv = sharpness_view(h if h.dtype == dt else h.to(dt))
        # node-major layout: phi [B, L, N] (see routing_forward)
        phi, right, left = routing_forward(X, w, effective_thresholds(tau, node_mask), hv)
        N = X.shape[0]
        if task == "classification":
            C = n_classes
            ac = hp.alpha / C
            counts = torch.matmul(phi.reshape(B * L, N), target).reshape(B, L, C)
            tot = counts.sum(-1)
            ll = (math.lgamma(hp.alpha) - torch.lgamma(tot + hp.alpha)
                  + (torch.lgamma(counts + ac) - math.lgamma(ac)).sum(-1)).sum(-1)
            dcounts = torch.digamma(counts + ac) - torch.digamma(tot + hp.alpha).unsqueeze(-1)
            G = torch.matmul(dcounts.reshape(B * L, C), target.transpose(0, 1)).reshape(B, L, N)
        else:
            pred = torch.matmul(mu.unsqueeze(-2), phi).squeeze(-2)  # [B, N]
            resid = pred - target.to(dt)
            sse = (resid * resid).sum(-1)
            ll = -0.5 * N * (math.log(2 * math.pi) + s) - 0.5 * inv * sse
            r = resid * inv.unsqueeze(-1)  # [B, N]
            G = -mu.unsqueeze(-1) * r.unsqueeze(-2)  # [B, L, N]
            g_mu = g_mu - torch.matmul(phi, r.unsqueeze(-1)).squeeze(-1)
            g_s = g_s - 0.5 * N + 0.5 * inv * sse
        g_w, g_tau = routing_backward(G, phi, right, left, X, hv)
        g_u = g_u + nm * g_tau * tau * (1 - tau)
        if D > 1:
            g_z = g_z + w[..., :Dw] * (g_w[..., :Dw] - (w * g_w).sum(-1, keepdim=True))
    parts = [g_z.reshape(B, -1)] if D > 1 else []
    parts.append(g_u)
    if lay.regression:
        parts += [g_mu, g_s.unsqueeze(-1)]
    grad = torch.cat(parts, -1) * cmf
    return -(ll + lp), -grad


_COMPILED: dict = {"fn": None, "failed": False}


def compiled_core():
    """``torch.compile(potential_and_grad_core, dynamic=True)``, built once per process
    (one compiled function for every model, so a new model does not recompile); None once
    compilation has failed (see :func:`disable_compiled`)."""
    if _COMPILED["failed"]:
        return None
    if _COMPILED["fn"] is None:
        try:
            _COMPILED["fn"] = torch.compile(potential_and_grad_core, dynamic=True)
        except Exception:  # pragma: no cover
            _COMPILED["failed"] = True
            return None
    return _COMPILED["fn"]


def disable_compiled() -> None:
    """Use the eager :func:`potential_and_grad_core` from now on (a compiled call failed:
    no compiler toolchain, or an unsupported backend)."""
    _COMPILED["failed"] = True
