"""A BART function as the mean of a larger Pyro model, sampled by Gibbs (issue #23).

Partially linear regression ``y = beta z + f(x) + e``, ``e ~ N(0, sigma^2)``: ``beta`` and
``sigma`` are Pyro sample sites, drawn by Pyro's NUTS kernel given the current ``f``; the
sum of trees ``f`` (:class:`torchtree.pyro_bart.BARTFunction`) is redrawn by BART
backfitting sweeps given ``beta`` and ``sigma``. One Gibbs iteration = one NUTS transition
(adapting its step size during warm-up) + one sweep over the trees.

    python examples/pyro_bart.py [--n 400] [--iterations 600] [--n-trees 50]

Prints the posterior of beta and sigma against the truth (beta 2, sigma 0.5) and the
RMSE of the posterior mean of f against the true f.
"""
from __future__ import annotations

import argparse
import time

import numpy as np
import pyro
import pyro.distributions as dist
import torch
from pyro.infer import NUTS

from torchtree.pyro_bart import BARTFunction


# smoke-expect: ^beta\s+[0-9.]+ \+-
# smoke-expect: ^f\s+RMSE


def make_data(n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    X = rng.uniform(size=(n, 5))
    z = rng.normal(size=n)
    f = 3 * np.sin(np.pi * X[:, 0] * X[:, 1]) + 4 * (X[:, 2] - 0.5) ** 2 + 2 * X[:, 3]
    y = 2.0 * z + f + 0.5 * rng.normal(size=n)
    return X, torch.tensor(z), torch.tensor(y), f


def run(n: int = 400, iterations: int = 600, n_trees: int = 50, seed: int = 0) -> dict:
    """The Gibbs sampler; returns posterior summaries (second half of the iterations kept)."""
    pyro.set_rng_seed(seed)
    X, z, y, f_true = make_data(n, seed)
    bart = BARTFunction(X, y_scale=y, n_trees=n_trees, seed=seed)

    def model(z, y):
        beta = pyro.sample("beta", dist.Normal(0.0, 10.0))
        sigma = pyro.sample("sigma", dist.HalfNormal(5.0))
        pyro.sample("y", dist.Normal(beta * z + bart(), sigma), obs=y)  # bart(): the current f, a constant here

    warmup = iterations // 2
    kernel = NUTS(model, adapt_step_size=True)
    kernel.setup(warmup, z.double(), y.double())
    params = kernel.initial_params
    kept, f_sum = [], np.zeros(n)
    t0 = time.process_time()
    for it in range(iterations):
        params = kernel.sample(params)  # beta, sigma | f (unconstrained space)
        beta = float(kernel.transforms["beta"].inv(params["beta"]))
        sigma = float(kernel.transforms["sigma"].inv(params["sigma"]))
        bart.gibbs_step(y - beta * z, sigma)  # f | beta, sigma
        kernel.clear_cache()  # the kernel caches the potential energy at params, which f changed
        if it >= warmup:
            kept.append((beta, sigma))
            f_sum += bart.f.numpy()
    b, s = np.array(kept).T
    f_mean = f_sum / len(kept)
    return {"beta_mean": b.mean(), "beta_sd": b.std(), "sigma_mean": s.mean(),
            "f_rmse": float(np.sqrt(np.mean((f_mean - f_true) ** 2))), "cpu_s": time.process_time() - t0}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--n", type=int, default=400)
    p.add_argument("--iterations", type=int, default=600)
    p.add_argument("--n-trees", type=int, default=50)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--smoke", action="store_true", help="a tiny run (tests)")
    a = p.parse_args()
    if a.smoke:
        a.n, a.iterations, a.n_trees = 150, 60, 10
    r = run(a.n, a.iterations, a.n_trees, a.seed)
    print(f"beta  {r['beta_mean']:.3f} +- {r['beta_sd']:.3f}   (truth 2.0)")
    print(f"sigma {r['sigma_mean']:.3f}           (truth 0.5)")
    print(f"f     RMSE of the posterior mean vs the true f: {r['f_rmse']:.3f}")
    print(f"CPU   {r['cpu_s']:.1f} s")


if __name__ == "__main__":
    main()
