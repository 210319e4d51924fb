"""One rank of the BART multi-rank test: ``torchrun --nproc-per-node 2 bart_worker.py OUT``.

Runs the case of :func:`case` with the gloo backend (chains split over the ranks) and saves
the gathered draws to ``OUT/rank{r}.pt``."""
from __future__ import annotations

import os
import sys

import numpy as np
import torch


def case():
    """The data and settings both the ranks and the one-process reference run."""
    rng = np.random.default_rng(3)
    X = rng.uniform(size=(90, 4))
    y = 3 * np.sin(3 * X[:, 0]) + X[:, 1] + 0.3 * rng.normal(size=90)
    return X, y, dict(n_trees=12, n_chains=4, n_warmup=5, n_samples=6)


def main() -> int:
    from torchtree import Data
    from torchtree.samplers.bart import BART

    X, y, kw = case()
    post = BART(**kw, backend="gloo").run(Data(X, y, task="regression"), seed=11)
    rank = int(os.environ["RANK"])
    torch.save({"value": post.value, "feature": post.feature, "sigma": post.sigma,
                "predict": post.predict(X)}, os.path.join(sys.argv[1], f"rank{rank}.pt"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
