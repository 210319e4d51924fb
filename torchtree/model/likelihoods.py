"""Conjugate leaf likelihoods: log marginals and predictives from sufficient statistics.

Every likelihood works on per-node sufficient statistics ``stats [..., S]`` that are
sums over the points in a node of ``point_stats(y) [N, S]``; all methods broadcast
over leading dimensions, so a call scores every node of every particle at once. The
contract a likelihood meets is :class:`~torchtree.model.likelihood_protocol.LeafLikelihood`;
both classes here are registered (:func:`~torchtree.model.likelihood_protocol.register_likelihood`)
under their class names, which their ``config()`` carries.
"""
from __future__ import annotations

import math
from typing import Dict

import torch

from torchtree.model.likelihood_protocol import likelihood_from_config, register_likelihood

__all__ = ["DirichletMultinomial", "NormalInverseGamma", "likelihood_from_config", "register_likelihood"]


def target_scale(y: torch.Tensor) -> float:
    """``var(y)``, or ``max|y|^2`` when ``y`` shows no spread (fewer than 2 rows, or all equal; 1 for
    targets all 0), so that rescaling ``y`` rescales the prior."""
    y = y.double()
    var = float(y.var()) if y.numel() > 1 else 0.0
    if var > 0 and math.isfinite(var):
        return var
    return (float(y.abs().max()) ** 2 or 1.0) if y.numel() else 1.0


@register_likelihood
class DirichletMultinomial:
    """Dirichlet-multinomial leaves (paper 001, eq. 3), symmetric prior ``alpha/K``.

    Parameters
    ----------
    alpha : float
        Total concentration of the symmetric Dirichlet (each class gets alpha/K).

    Notes
    -----
    ``log l(Y) = lgamma(alpha) - K lgamma(alpha/K) + sum_k lgamma(m_k + alpha/K)
    - lgamma(sum_k m_k + alpha)``, with ``m_k`` the class counts of the node.
    """

    task = "classification"

    def __init__(self, alpha: float = 5.0) -> None:
        alpha = float(alpha)
        if not alpha > 0 or not math.isfinite(alpha):
            raise ValueError(f"alpha must be a positive finite number, got {alpha}")
        self.alpha = alpha
        self._tables: Dict = {}  # lgamma lookup tables of log_marginal_counts, rebuilt on demand

    def __getstate__(self) -> Dict:
        """The settings only: the lookup tables grow with the rows seen and are rebuilt when needed
        (a pickled estimator would otherwise carry ~16 bytes per training row)."""
        return {**self.__dict__, "_tables": {}}

    def n_stats(self, data) -> int:
        """S = K (class counts)."""
        return int(data.n_classes)

    stats_dtype = torch.float32  # counts are exact in float32 up to 2^24 points

    def point_stats(self, y: torch.Tensor, n_classes: int | None = None) -> torch.Tensor:
        """One-hot rows: ``[N] long -> [N, K]``."""
        K = n_classes if n_classes is not None else int(y.max()) + 1
        return torch.nn.functional.one_hot(y.long(), K).to(self.stats_dtype)

    def log_marginal(self, stats: torch.Tensor) -> torch.Tensor:
        """Log marginal likelihood of each node.

        Parameters
        ----------
        stats : Tensor [..., K] class counts

        Returns
        -------
        Tensor [...] float64
        """
        m = stats.double()
        K = m.shape[-1]
        a = self.alpha / K
        return (
            math.lgamma(self.alpha)
            - K * math.lgamma(a)
            + torch.lgamma(m + a).sum(-1)
            - torch.lgamma(m.sum(-1) + self.alpha)
        )

    def log_marginal_counts(self, counts: torch.Tensor, n_max: int, totals: torch.Tensor | None = None) -> torch.Tensor:
        """:meth:`log_marginal` for integral counts, by table lookup instead of ``lgamma``.

        Parameters
        ----------
        counts : Tensor [..., K] of non-negative integers (any dtype)
        n_max : int
            Upper bound on any count and on the row sums (e.g. the number of points).
        totals : Tensor [...], optional
            Row sums, when the caller knows them already.

        Returns
        -------
        Tensor [...] float64
        """
        K = counts.shape[-1]
        key = (K, counts.device)
        tab = self._tables.get(key)
        if tab is None or tab[0].numel() <= n_max:
            n = torch.arange(max(n_max, 16) + 1, dtype=torch.float64, device=counts.device)
            const = math.lgamma(self.alpha) - K * math.lgamma(self.alpha / K)
            tab = (torch.lgamma(n + self.alpha / K), const - torch.lgamma(n + self.alpha))
            self._tables[key] = tab
        # Row sums as a matmul: torch reductions over a tiny last dim are slow.
        ones = torch.ones(K, dtype=torch.float64, device=counts.device)
        if totals is None:
            totals = (counts.double() @ ones).long()
        lead = counts.shape[:-1]
        t0 = tab[0].index_select(0, counts.reshape(-1).long()).view(*lead, K)
        return t0 @ ones + tab[1].index_select(0, totals.reshape(-1).long()).view(lead)

    def predictive_table(self, stats: torch.Tensor) -> torch.Tensor:
        """Posterior predictive class probabilities per node: ``[..., K] -> [..., K]``."""
        m = stats.to(torch.float32)
        K = m.shape[-1]
        return (m + self.alpha / K) / (m.sum(-1, keepdim=True) + self.alpha)

    def log_predictive_point(self, table_rows: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """``log p(y | leaf)`` from gathered predictive rows ``[..., M, K]`` and codes ``[M]``."""
        idx = y.long().view(*([1] * (table_rows.dim() - 2)), -1, 1).expand(*table_rows.shape[:-1], 1)
        return torch.gather(table_rows, -1, idx).squeeze(-1).double().log()

    def log_prob_rows(self, rows: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """``log p(y_t | row_t)`` for predictive rows ``[T, K]`` and codes ``[T]`` -> ``[T]``."""
        return torch.gather(rows, 1, y.long()[:, None]).squeeze(1).double().log()

    def config(self) -> Dict:
        """Plain description for saving."""
        return {"name": "DirichletMultinomial", "alpha": self.alpha}

    def __repr__(self) -> str:
        return f"DirichletMultinomial(alpha={self.alpha})"


@register_likelihood
class NormalInverseGamma:
    """Normal leaves with unknown mean and variance, Normal-inverse-gamma prior.

    ``sigma^2 ~ InvGamma(a0, b0)``, ``mu | sigma^2 ~ Normal(mu0, sigma^2 / kappa0)``, and
    ``y_n | mu, sigma^2 ~ Normal(mu, sigma^2)`` within a leaf; both are integrated out.

    Parameters
    ----------
    mu0, kappa0, a0, b0 : float
        Prior mean, prior pseudo-count, shape and scale. Use :meth:`default_for` for a
        data-scaled default.

    Notes
    -----
    Statistics are ``(n, sum y', sum y'^2)`` with ``y' = y - mu0`` (centring avoids the
    cancellation of ``sum y^2 - (sum y)^2/n``). Then ``kappa_n = kappa0 + n``,
    ``a_n = a0 + n/2``, ``b_n = b0 + (sum y'^2 - (sum y')^2 / kappa_n) / 2`` and
    ``log l = lgamma(a_n) - lgamma(a0) + a0 log b0 - a_n log b_n
    + (log kappa0 - log kappa_n)/2 - n log(2 pi)/2``.
    The predictive is Student-t with ``2 a_n`` degrees of freedom, location
    ``mu0 + sum y' / kappa_n`` and squared scale ``b_n (kappa_n + 1) / (a_n kappa_n)``.
    """

    task = "regression"
    stats_dtype = torch.float64

    def __init__(self, mu0: float = 0.0, kappa0: float = 0.1, a0: float = 2.0, b0: float = 1.0) -> None:
        for name, v in (("kappa0", kappa0), ("a0", a0), ("b0", b0)):
            if not float(v) > 0 or not math.isfinite(float(v)):
                raise ValueError(f"{name} must be positive and finite, got {v}")
        if not math.isfinite(float(mu0)):
            raise ValueError(f"mu0 must be finite, got {mu0}")
        self.mu0, self.kappa0, self.a0, self.b0 = float(mu0), float(kappa0), float(a0), float(b0)

    @classmethod
    def default_for(cls, y: torch.Tensor, kappa0: float = 0.1, a0: float = 2.0, noise_fraction: float = 0.5) -> "NormalInverseGamma":
        """Prior scaled to the targets: ``mu0`` = mean(y), prior mean of ``sigma^2`` =
        ``noise_fraction * var(y)`` (``b0 = max(a0 - 1, 0.5) * noise_fraction * var(y)``).

        When the targets say nothing about their spread (one row, or all equal), ``var(y)``
        is replaced by ``max|y|^2``, the scale of their magnitude (by 1 only when every target is
        0), so that rescaling ``y`` rescales the prior (``torchtree.model.likelihoods.target_scale``).

        Parameters
        ----------
        y : Tensor [N] float targets
        kappa0 : float, prior strength of a leaf's mean in pseudo-observations (default 0.1)
        a0 : float, shape of the inverse-gamma prior of the noise variance (default 2). The scale is
            ``b0 = max(a0 - 1, 0.5) * noise_fraction * var(y)``: for ``a0 >= 1.5`` the prior mean
            of ``sigma^2``, ``b0 / (a0 - 1)``, is ``noise_fraction * var(y)``
        noise_fraction : float, the prior mean of ``sigma^2`` as a share of the targets' variance
            (default 0.5)

        Returns
        -------
        NormalInverseGamma
        """
        y = y.double()
        return cls(mu0=float(y.mean()) if y.numel() else 0.0, kappa0=kappa0, a0=a0,
                   b0=max((a0 - 1.0), 0.5) * noise_fraction * target_scale(y))

    def n_stats(self, data) -> int:
        """S = 3."""
        return 3

    def point_stats(self, y: torch.Tensor, n_classes: int | None = None) -> torch.Tensor:
        """Rows ``(1, y - mu0, (y - mu0)^2)``: ``[N] -> [N, 3]`` float64."""
        yc = y.double() - self.mu0
        return torch.stack([torch.ones_like(yc), yc, yc * yc], -1)

    def _posterior(self, stats: torch.Tensor):
        s = stats.double()
        n, s1, s2 = s[..., 0], s[..., 1], s[..., 2]
        kn = self.kappa0 + n
        an = self.a0 + 0.5 * n
        bn = self.b0 + 0.5 * (s2 - s1 * s1 / kn).clamp(min=0.0)
        return n, s1, kn, an, bn

    def log_marginal(self, stats: torch.Tensor) -> torch.Tensor:
        """Log marginal likelihood of each node: ``[..., 3] -> [...]`` float64."""
        n, _, kn, an, bn = self._posterior(stats)
        return (
            torch.lgamma(an)
            - math.lgamma(self.a0)
            + self.a0 * math.log(self.b0)
            - an * bn.log()
            + 0.5 * (math.log(self.kappa0) - kn.log())
            - 0.5 * n * math.log(2 * math.pi)
        )

    def predictive_table(self, stats: torch.Tensor) -> torch.Tensor:
        """Student-t predictive per node: ``[..., 3] -> [..., 3]`` as (df, loc, scale)."""
        _, s1, kn, an, bn = self._posterior(stats)
        return torch.stack([2 * an, self.mu0 + s1 / kn, (bn * (kn + 1) / (an * kn)).sqrt()], -1)

    def mean_table(self, stats: torch.Tensor) -> torch.Tensor:
        """Student-t posterior of the leaf mean per node, ``[..., 3] -> [..., 3]`` as (df, loc, scale):
        ``mu | D ~ t_{2 a_n}(mu0 + s1 / kappa_n, sqrt(b_n / (a_n kappa_n)))``, the predictive's
        location with its scale divided by ``sqrt(1 + 1 / kappa_n)`` (no noise of a new ``y``)."""
        _, s1, kn, an, bn = self._posterior(stats)
        return torch.stack([2 * an, self.mu0 + s1 / kn, (bn / (an * kn)).sqrt()], -1)

    def log_predictive_point(self, table_rows: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Student-t log density of ``y [M]`` under gathered rows ``[..., M, 3]``."""
        df, loc, scale = table_rows[..., 0].double(), table_rows[..., 1].double(), table_rows[..., 2].double()
        z = (y.double() - loc) / scale
        return (
            torch.lgamma((df + 1) / 2)
            - torch.lgamma(df / 2)
            - 0.5 * torch.log(df * math.pi)
            - scale.log()
            - (df + 1) / 2 * torch.log1p(z * z / df)
        )

    def log_prob_rows(self, rows: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Student-t ``log p(y_t | row_t)`` for rows ``[T, 3]`` and targets ``[T]`` -> ``[T]``."""
        return self.log_predictive_point(rows, y)

    def config(self) -> Dict:
        """Plain description for saving."""
        return {"name": "NormalInverseGamma", "mu0": self.mu0, "kappa0": self.kappa0, "a0": self.a0, "b0": self.b0}

    def __repr__(self) -> str:
        return f"NormalInverseGamma(mu0={self.mu0:g}, kappa0={self.kappa0:g}, a0={self.a0:g}, b0={self.b0:g})"
