"""A BART sum of trees as the mean function inside a larger Pyro model.

:class:`BARTFunction` is a ``PyroModule`` whose value is the current sum of trees ``f(x)`` at
the training inputs it was built on (or at new inputs). It has no ``pyro.sample`` sites of its
own: its trees are redrawn by the BART sampler, not by Pyro's inference, in a Gibbs scheme:

1. the other latent variables of the model (coefficients, the noise scale, ...) are sampled
   by a Pyro kernel (e.g. ``pyro.infer.HMC`` / ``NUTS``) given ``f``, which the model reads
   from the module (a plain tensor, no gradient);
2. ``f`` is redrawn given the rest by :meth:`BARTFunction.gibbs_step`: backfitting sweeps on
   the partial target ``y - (everything else in the mean)`` with the model's noise sd.

``examples/pyro_bart.py`` runs this for a partially linear model
``y = x_lin . beta + f(x) + e``.

As ``f`` is no sample site, Pyro's ``Predictive`` and the kernel's stored samples hold no draws of
it: a posterior predictive built from them reads the last sweep's ``f`` for every draw. Keep each
Gibbs step's ``f`` (or its prediction at new inputs, ``module(X_new)``) beside the other draws, as
the example does.
"""
from __future__ import annotations

import torch
from pyro.nn import PyroModule

from torchtree.core.validate import check_int, check_real
from torchtree.core.warn import warn
from torchtree.model.bart import ABSENT, LEAF, BartPrior, CutGrid, forest_sum
from torchtree.model.data import Data
from torchtree.samplers.bart import backfit_sweep

__all__ = ["BARTFunction"]

_STREAMS = 2  # keyed streams per sweep: moves, leaf normals


class BARTFunction(PyroModule):
    """A sum of ``n_trees`` BART trees on fixed training inputs, redrawn by Gibbs steps.

    The sum's prior is centred at 0 (leaf values ``N(0, tau^2)``): unlike ``BART``, which centres it
    at the middle of the target's range, the model holds its own intercept (a ``pyro.sample`` site
    added to ``f``) when the target is not centred.

    Parameters
    ----------
    X : array-like [N, D] the training inputs
    y_scale : array-like [N], optional; a rough target (e.g. ``y``) whose range calibrates the
        leaf prior as BART does (``tau = range / (2 k sqrt(n_trees))``); default: range 1.
        :meth:`gibbs_step` warns once when its target's range is more than 10 times this range or
        less than a tenth of it
    n_trees : int
        Trees in the sum (default 50).
    alpha_split, beta_split : float
        The trees' Chipman prior: a node at depth d splits with probability
        ``alpha_split (1 + d)^-beta_split`` (defaults 0.95 and 2, Chipman, George & McCulloch 2010).
    k : float
        Leaf prior scale: ``tau = range / (2 k sqrt(n_trees))`` (default 2).
    max_depth : int
        Deepest node of a tree (default 8).
    max_cuts : int
        Candidate cuts per feature, at quantiles of the training inputs (default 100).
    seed : int
        Of the keyed random streams of the sweeps (default 0). These streams are the function's own:
        ``pyro.set_rng_seed`` does not change them, and ``state_dict`` keeps the sweep count, not the
        seed (a resumed function is built with the same ``seed``).

    Attributes
    ----------
    f : Tensor [N] float64, the current sum of trees at the training inputs
    """

    def __init__(self, X, y_scale=None, n_trees: int = 50, alpha_split: float = 0.95, beta_split: float = 2.0,
                 k: float = 2.0, max_depth: int = 8, max_cuts: int = 100, seed: int = 0) -> None:
        super().__init__()
        check_int("n_trees", n_trees, 1)
        check_real("alpha_split", alpha_split, 0.0, 1.0, low_open=True)
        check_real("beta_split", beta_split, 0.0)
        check_real("k", k, 0.0, low_open=True)
        check_int("max_depth", max_depth, 1)
        check_int("max_cuts", max_cuts, 1)
        Xt = torch.as_tensor(X, dtype=torch.float64)
        if Xt.dim() != 2 or Xt.shape[0] == 0:
            raise ValueError(f"X must be 2-D [rows, features] with at least one row, got shape {tuple(Xt.shape)}")
        y = torch.zeros(Xt.shape[0], dtype=torch.float64) if y_scale is None else torch.as_tensor(y_scale).double()
        if y_scale is not None and tuple(y.shape) != (Xt.shape[0],):
            raise ValueError(f"y_scale must be 1-D with one value per row of X ({Xt.shape[0]}), got shape "
                             f"{tuple(y.shape)}")
        data = Data(Xt, y if y_scale is not None else torch.linspace(0, 1, Xt.shape[0], dtype=torch.float64),
                    task="regression")
        self.prior = BartPrior.from_data(data.X, data.y, "regression", n_trees, alpha_split=alpha_split,
                                         beta_split=beta_split, k=k, max_depth=max_depth, sigma_hat=1.0)
        self.grid = CutGrid.from_data(data, max_cuts)
        self._Xb = self.grid.bins(data.X)
        T, N, K = n_trees, data.n, self.prior.n_slots
        feature = torch.full((T, 1, K), ABSENT, dtype=torch.int16)
        feature[:, :, 0] = LEAF
        # the trees and the sweep count are buffers: state_dict() holds the sampler's state
        self.register_buffer("_feature", feature)
        self.register_buffer("_cut", torch.zeros_like(feature))
        self.register_buffer("_value", torch.zeros(T, 1, K, dtype=torch.float64))
        self.register_buffer("_leaf_of", torch.zeros(T, 1, N, dtype=torch.int16))
        self.register_buffer("f", torch.zeros(N, dtype=torch.float64))
        self.register_buffer("_sweeps", torch.zeros((), dtype=torch.long))
        self.seed = int(seed)
        self._y_scale_given, self._warned_scale = y_scale is not None, False

    @property
    def sweeps(self) -> int:
        """Backfitting sweeps run so far (they key the random streams of the next ones)."""
        return int(self._sweeps)

    def forward(self, X=None) -> torch.Tensor:
        """``f`` at the training inputs ``[N]`` (``X`` None), or at new inputs ``X`` ``[M, D]``."""
        if X is None:
            return self.f
        Xt = torch.as_tensor(X, dtype=torch.float64)
        D = self._Xb.shape[0] if self._Xb.dim() == 2 else None
        if Xt.dim() != 2 or (D is not None and Xt.shape[1] != D):
            raise ValueError(f"X must have shape [M, {D}] (the training inputs' columns), got {tuple(Xt.shape)}")
        if not bool(torch.isfinite(Xt).all()):
            raise ValueError("X holds NaN or infinite values; BARTFunction predicts at finite inputs")
        Xb = self.grid.bins(Xt)
        s = forest_sum(self._feature.transpose(0, 1), self._cut.transpose(0, 1), self._value.transpose(0, 1), Xb)
        return self.prior.scale * s[0]

    def gibbs_step(self, target, sigma, n_sweeps: int = 1) -> torch.Tensor:
        """Redraw the trees given the rest of the model: ``n_sweeps`` backfitting sweeps on
        ``target ~ N(f(x), sigma^2)``.

        Parameters
        ----------
        target : Tensor [N] the observations minus the rest of the mean
        sigma : float or 0-d Tensor, the model's current noise sd (original scale)
        n_sweeps : int, backfitting sweeps over all the trees (default 1)

        Returns
        -------
        Tensor [N] float64, the new ``f`` at the training inputs (no gradient: ``target`` and
        ``sigma`` are read as values; cast it, ``f.to(dtype)``, to add it to a float32 mean).

        Raises
        ------
        ValueError
            ``target`` of another length than the training inputs or not finite, ``sigma`` not one
            finite positive number, or ``n_sweeps`` below 0.
        """
        sc = self.prior.scale
        t = torch.as_tensor(target).detach().to(torch.float64)
        if t.dim() != 1:  # a [N, 1] column or a [2, N / 2] block would be read in some order in silence
            raise ValueError(f"target must be 1-D [{self.f.numel()}], got shape {tuple(t.shape)}")
        if t.numel() != self.f.numel() or not bool(torch.isfinite(t).all()):
            raise ValueError(f"target must hold {self.f.numel()} finite values (one per training input), got "
                             f"{t.numel()}{'' if bool(torch.isfinite(t).all()) else ' with NaN or infinite ones'}")
        sd = torch.as_tensor(sigma).detach().to(torch.float64)
        if sd.numel() != 1 or not bool(torch.isfinite(sd).all()) or float(sd) <= 0:
            raise ValueError(f"sigma must be one finite positive number, got {sd.tolist()}")
        if int(n_sweeps) < 0:
            raise ValueError(f"n_sweeps must be >= 0, got {n_sweeps}")
        span = float(t.max() - t.min()) if t.numel() > 1 else 0.0
        if not self._warned_scale and span > 0 and not 0.1 <= span / sc <= 10:
            self._warned_scale = True
            given = ("the range of y_scale" if self._y_scale_given else "1, as no y_scale was given")
            warn(f"the target's range ({span:.3g}) is {span / sc:.3g} times the range the leaf prior was calibrated "
                 f"to ({given}): the trees' leaf values are shrunk as if f ranged over {sc:.3g}. Pass "
                 "y_scale=y (a rough target on the scale of f) when constructing BARTFunction")
        t = t.reshape(1, -1) / sc
        resid = t - self.f.reshape(1, -1) / sc
        s2 = (sd.reshape(1) / sc) ** 2
        T = self._feature.shape[0]
        keys = torch.arange(T)[:, None]
        for _ in range(int(n_sweeps)):
            resid, _ = backfit_sweep(self.prior, self._feature, self._cut, self._value, self._leaf_of, resid,
                                     self._Xb, self.grid.n_cuts, s2, self.seed, self.sweeps * _STREAMS, keys)
            self._sweeps += 1
        self.f = ((t - resid) * sc)[0]
        return self.f

    @property
    def leaves(self) -> torch.Tensor:
        """Leaves per tree ``[n_trees]``."""
        return (self._feature[:, 0] == LEAF).sum(1)
