"""Every plot of ``torchtree.plot`` on real tables.

Fits three posteriors on tables of the repository's ``data/`` folder and saves each plot that
applies to them as a PNG:

* top-down SMC on the Pima diabetes table (classification, 70/30 split): the MAP tree, split shares
  with credible intervals, partial dependence and ICE on glucose, the reliability diagram and the
  evidence curves of the hyperparameter search;
* MCMC on the same split: traces per chain of the mean leaves and the log posterior, with R-hat and ESS;
* BART on abalone (regression): sigma's traces per chain, one tree of the last draw, partial dependence
  on shell weight with its credible band, the PIT histogram and interval coverage.

Figures go to ``$TORCHTREE_FIGURES_DIR`` (the docs build sets it) or ``--out``.

Usage::

    python examples/plot_gallery.py --out figures
    python examples/plot_gallery.py --smoke            # tiny fits, for tests

The same from the shell, for a saved posterior::

    torchtree report post.pt --plots figures --data data/pima_diabetes.csv.gz
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np

# smoke-expect: ^wrote .*smc_tree\.png
# smoke-expect: ^wrote .*bart_trace\.png
# smoke-expect: ^plot_gallery: done


def split(name: str, seed: int = 0):
    from torchtree.datasets import load_table

    t = load_table(name)
    perm = np.random.default_rng(seed).permutation(len(t.y))
    k = int(0.7 * len(t.y))
    return t.X[perm[:k]], t.y[perm[:k]], t.X[perm[k:]], t.y[perm[k:]], list(t.feature_names)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=os.environ.get("TORCHTREE_FIGURES_DIR", "figures"), help="folder for the PNGs")
    p.add_argument("--smoke", action="store_true", help="tiny fits (tests)")
    a = p.parse_args(argv)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from torchtree import BayesianTreeClassifier, BayesianTreeRegressor
    from torchtree import plot

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)

    def save(ax, name: str, what: str) -> None:
        fig = np.ravel(ax)[0].figure
        fig.tight_layout()
        path = out / f"{name}.png"
        fig.savefig(path, dpi=90)
        plt.close(fig)
        print(f"wrote {path}: {what}")

    Xtr, ytr, Xte, yte, names = split("pima_diabetes")
    glucose = names.index("glucose")
    smc = BayesianTreeClassifier("smc", n_particles=50 if a.smoke else 1000, random_state=0).fit(Xtr, ytr)
    print(f"smc on pima: test accuracy {smc.score(Xte, yte):.3f}")
    save(plot.plot_tree(smc, feature_names=names), "smc_tree", "the MAP tree")
    save(plot.plot_importance(smc, feature_names=names), "smc_importance", "split shares, 90% intervals")
    save(plot.plot_pdp(smc, Xte, glucose), "smc_pdp", f"partial dependence on {names[glucose]}")
    save(plot.plot_ice(smc, Xte, glucose, n_lines=30), "smc_ice", f"ICE curves on {names[glucose]}")
    save(plot.plot_calibration(smc, Xte, yte), "smc_calibration", "reliability diagram")
    save(plot.plot_evidence(smc), "smc_evidence", "the evidence search's curves")

    # (--smoke: no evidence search here; the smc fit above runs it, for its plot)
    mcmc = BayesianTreeClassifier("mcmc", random_state=0, **(dict(n_chains=2, n_samples=20, n_warmup=20, hyper="fixed")
                                                            if a.smoke else {})).fit(Xtr, ytr)
    save(plot.plot_trace(mcmc), "mcmc_trace", "MCMC traces per chain, R-hat and ESS")

    Xtr, ytr, Xte, yte, names = split("abalone")
    shell = names.index("shell_weight")
    bart = BayesianTreeRegressor("bart", random_state=0, **(dict(n_trees=10, n_samples=10, n_warmup=10)
                                                            if a.smoke else {})).fit(Xtr, ytr.astype(float))
    rmse = float(np.sqrt(np.mean((bart.predict(Xte) - yte) ** 2)))
    print(f"bart on abalone: test RMSE {rmse:.3f}")
    save(plot.plot_trace(bart), "bart_trace", "sigma and mean leaves per chain, R-hat and ESS")
    save(plot.plot_tree(bart, feature_names=names), "bart_tree", "tree 0 of the last draw")
    save(plot.plot_pdp(bart, Xte, shell), "bart_pdp", f"partial dependence on {names[shell]}, 90% band")
    save(plot.plot_calibration(bart, Xte, yte.astype(float)), "bart_calibration", "PIT histogram and coverage")
    print("plot_gallery: done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
