"""Soft decision trees inside Pyro models.

1. A soft regression tree (``torchtree.pyro.SoftTreeRegressor``) sampled with
   ``pyro.infer.MCMC(pyro.infer.NUTS(model))`` and, for comparison, with torchtree's
   batched NUTS (many chains in lockstep) on the same model.
2. A soft tree as the mean function of a hierarchical model: groups share the tree
   and have their own offsets, ``y = f(x) + b_group + noise``.
3. A soft classification tree (``SoftTreeClassifier``) with the Dirichlet-multinomial
   soft-count likelihood, and its predictive class probabilities on new rows.

Run::

    python examples/pyro_soft_tree.py            # quick settings
    python examples/pyro_soft_tree.py --long     # more draws
    python examples/pyro_soft_tree.py --smoke    # tiny run (< 1 min), for tests
"""
# smoke-expect: ^\[pyro NUTS\]\s+1 chain, .* test MSE [0-9.]+
# smoke-expect: ^\[batched NUTS\] 32 chains, .* test MSE [0-9.]+; [0-9]+x the chain-iterations/s
# smoke-expect: ^\[hierarchical\]  tree threshold
# smoke-expect: ^\[classifier\]    root split weights .* held-out accuracy [0-9.]+
from __future__ import annotations

import argparse
import time

import pyro
import pyro.distributions as dist
import torch
from pyro.infer import MCMC, NUTS, Predictive

from torchtree.datasets.synthetic import wu
from torchtree.pyro import SoftTreeClassifier, SoftTreeFunction, SoftTreeRegressor
from torchtree.soft import NUTS as BatchedNUTS
from torchtree.soft import SoftTreeHyper


def regression(n_samples: int, n_warmup: int, max_tree_depth: int = 8) -> None:
    X, y, Xte, yte = wu(seed=0)
    X, y, Xte, yte = X.float(), y.float(), Xte.float(), yte.float()
    hp = dict(mu_mean=float(y.mean()), mu_var=float(y.var()), sigma_shape=1.5, sigma_scale=0.15 * float(y.var()))
    model = SoftTreeRegressor(3, topology=2, sharpness=0.05, feature_min=X.min(0).values,
                              feature_max=X.max(0).values, **hp)
    pyro.set_rng_seed(0)
    t0 = time.perf_counter()
    mcmc = MCMC(NUTS(model, max_tree_depth=max_tree_depth), num_samples=n_samples, warmup_steps=n_warmup,
                disable_progbar=True)
    mcmc.run(X, y)
    t_pyro = time.perf_counter() - t0
    samples = mcmc.get_samples()
    pred = Predictive(model, posterior_samples=samples, return_sites=["_RETURN"])(Xte)["_RETURN"].mean(0)
    print(f"[pyro NUTS]     1 chain, {n_warmup}+{n_samples} iterations in {t_pyro:.1f} s; "
          f"test MSE {float(((pred - yte) ** 2).mean()):.4f}")

    t0 = time.perf_counter()
    post = BatchedNUTS(n_chains=32, n_samples=n_samples, n_warmup=n_warmup, depth=2, sharpness=0.05,
                       hyper=SoftTreeHyper(**hp), max_tree_depth=max_tree_depth).run((X, y), seed=0)
    t_ours = time.perf_counter() - t0
    mse = float(((torch.as_tensor(post.predict(Xte)) - yte) ** 2).mean())
    print(f"[batched NUTS] 32 chains, {n_warmup}+{n_samples} iterations in {t_ours:.1f} s; test MSE {mse:.4f}; "
          f"{32 * (n_samples + n_warmup) / t_ours / ((n_samples + n_warmup) / t_pyro):.0f}x the chain-iterations/s")


def hierarchical(n_samples: int, n_warmup: int, max_tree_depth: int = 7) -> None:
    g = torch.Generator().manual_seed(1)
    N, G = 120, 4
    X = torch.rand(N, 2, generator=g)
    group = torch.randint(0, G, (N,), generator=g)
    true_offset = torch.tensor([-1.0, -0.3, 0.4, 1.2])
    y = torch.where(X[:, 0] > 0.5, 2.0, 0.0) + true_offset[group] + 0.2 * torch.randn(N, generator=g)
    tree = SoftTreeFunction(2, topology=1, sharpness=0.05, leaf_scale=3.0)

    def model(X, group, y=None):
        scale = pyro.sample("group_scale", dist.HalfNormal(1.0))
        offset = pyro.sample("offset", dist.Normal(0.0, 1.0).expand([G]).to_event(1)) * scale.unsqueeze(-1)
        noise = pyro.sample("noise", dist.HalfNormal(1.0))
        mean = tree(X) + offset[..., group]
        with pyro.plate("data", X.shape[0], dim=-1):
            pyro.sample("y", dist.Normal(mean, noise.unsqueeze(-1)), obs=y)

    pyro.set_rng_seed(2)
    mcmc = MCMC(NUTS(model, max_tree_depth=max_tree_depth), num_samples=n_samples, warmup_steps=n_warmup,
                disable_progbar=True)
    mcmc.run(X, group, y)
    s = mcmc.get_samples()
    off = (s["offset"] * s["group_scale"].unsqueeze(-1)).mean(0)
    print("[hierarchical]  tree threshold", f"{float(s['thresholds'].mean()):.3f}",
          "| leaf values", [round(v, 2) for v in s["leaf_values"].mean(0).tolist()],
          "| centred offsets", [round(v, 2) for v in (off - off.mean()).tolist()],
          "(true", [round(v, 2) for v in (true_offset - true_offset.mean()).tolist()], ")")


def classification(n_samples: int, n_warmup: int, max_tree_depth: int = 7) -> None:
    g = torch.Generator().manual_seed(3)
    X = torch.rand(200, 2, generator=g)
    y = (X[:, 0] > 0.4).long() + ((X[:, 0] > 0.4) & (X[:, 1] > 0.6)).long()
    model = SoftTreeClassifier(2, 3, topology=2, sharpness=0.05)
    pyro.set_rng_seed(4)
    mcmc = MCMC(NUTS(model, max_tree_depth=max_tree_depth), num_samples=n_samples, warmup_steps=n_warmup,
                disable_progbar=True)
    mcmc.run(X, y)
    s = mcmc.get_samples()
    X_new = torch.rand(500, 2, generator=g)
    y_new = (X_new[:, 0] > 0.4).long() + ((X_new[:, 0] > 0.4) & (X_new[:, 1] > 0.6)).long()
    probs = Predictive(model, posterior_samples=s, return_sites=["class_probs"])(X, y, X_new)["class_probs"].mean(0)
    print("[classifier]    root split weights", [round(v, 2) for v in s["split_weights"][:, 0].mean(0).tolist()],
          "thresholds", [round(v, 3) for v in s["thresholds"].mean(0).tolist()],
          "| held-out accuracy", f"{float((probs.argmax(1) == y_new).double().mean()):.3f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--long", action="store_true")
    ap.add_argument("--smoke", action="store_true",
                    help="tiny run (5 warm-up + 5 draws, NUTS trees of depth 4 at most) for the example tests")
    args = ap.parse_args()
    torch.set_num_threads(1)
    n, w = (500, 300) if args.long else (5, 5) if args.smoke else (100, 100)
    depth = {"max_tree_depth": 4} if args.smoke else {}
    regression(n, w, **depth)
    hierarchical(n, w, **depth)
    classification(n, w, **depth)


if __name__ == "__main__":
    main()
