"""The draw of a split rule's column, uniform or group by group.

Without groups (a numeric table) a rule's column is uniform among the ``nv`` columns in which the
node can split, probability ``1 / nv``. A coded table (:class:`~torchtree.model.encoding.TableEncoder`)
has several split columns per input column (a missing-value side, a subset of levels); its draw is an
input column uniform among the ``G`` inputs with a splitting column, then a column uniform among the
``c`` splitting columns of that input: probability ``1 / (G c)``. :func:`choice_count` returns that
``1 / probability`` (``nv`` or ``G c``), which the rule densities use in place of ``nv``, and
:func:`choose_column` draws a column with it from one uniform per node.

Layer: model; no imports from the samplers.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch

__all__ = ["kth_true", "choose_uniform", "choose_column", "choice_count", "column_log_probs"]


def kth_true(mask: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Column of the k-th True of each row of ``mask [P, C]`` (k < count)."""
    return (mask.long().cumsum(1) > k[:, None]).to(torch.uint8).argmax(1)


def choose_uniform(mask: torch.Tensor, u: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """Uniform choice of a True column per row of ``mask [P, C]`` from ``u [P]``; returns (column [P], count [P])."""
    cnt = mask.sum(1)
    k = torch.minimum((u * cnt.double()).long(), (cnt - 1).clamp(min=0))
    return kth_true(mask, k), cnt


def _group_counts(vary: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
    """Splitting columns per input column: ``vary [n, D] bool -> [n, D] long`` (input ``g`` at ``[:, g]``)."""
    # D slots (no input has an index beyond the columns'): no host sync to size the result
    out = torch.zeros(vary.shape[:-1] + (groups.numel(),), dtype=torch.long, device=vary.device)
    return out.index_add_(-1, groups, vary.long())


def choice_count(vary: torch.Tensor, f: torch.Tensor, groups: Optional[torch.Tensor]) -> torch.Tensor:
    """``1 / P(column f)`` for the draw above: ``vary [..., D]`` bool, ``f [...]`` long -> ``[...]`` long.

    ``nv`` (splitting columns) without groups; ``G * c`` with them (0 where nothing splits).
    """
    if groups is None:
        return vary.sum(-1)
    cnt = _group_counts(vary, groups)
    n_groups = (cnt > 0).sum(-1)
    in_group = cnt.gather(-1, groups.index_select(0, f.reshape(-1).clamp(min=0)).view(f.shape).unsqueeze(-1)).squeeze(-1)
    return n_groups * in_group


def column_log_probs(vary: torch.Tensor, groups: Optional[torch.Tensor]) -> torch.Tensor:
    """``log P(column d)`` for every column: ``vary [n, D] -> [n, D]`` float64 (-inf where it cannot split)."""
    if groups is None:
        nv = vary.sum(-1, keepdim=True).clamp(min=1).double()
        lp = (-torch.log(nv)).expand(vary.shape)
    else:
        cnt = _group_counts(vary, groups)
        n_groups = (cnt > 0).sum(-1, keepdim=True).clamp(min=1).double()
        per = cnt.index_select(-1, groups).clamp(min=1).double()
        lp = -torch.log(n_groups) - torch.log(per)
    return torch.where(vary, lp, torch.full_like(lp, -float("inf")))


def choose_column(vary: torch.Tensor, u: torch.Tensor, groups: Optional[torch.Tensor]) -> Tuple[torch.Tensor, torch.Tensor]:
    """Draw a rule's column per node from ``u [n]``: ``vary [n, D]`` bool.

    Returns (column [n] long, ``1 / P(column)`` [n] long, 0 where no column splits). Without
    groups the draw is :func:`choose_uniform`'s (the same columns from the same uniforms).
    """
    if groups is None:
        return choose_uniform(vary, u)
    cnt = _group_counts(vary, groups)
    has = cnt > 0
    n_groups = has.sum(-1)
    s = u.double() * n_groups.double()
    k = torch.minimum(s.floor().long(), (n_groups - 1).clamp(min=0))
    g = kth_true(has, k)
    frac = (s - k.double()).clamp(0.0, 1.0 - 1e-12)  # uniform on [0, 1) given the group, independent of it
    c = cnt.gather(1, g[:, None]).squeeze(1)
    k2 = torch.minimum((frac * c.double()).floor().long(), (c - 1).clamp(min=0))
    f = kth_true(vary & (groups[None, :] == g[:, None]), k2)
    return f, n_groups * c
