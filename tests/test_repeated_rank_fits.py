"""Fits by backend name under torchrun, one after another in a process: the process group the name opened is
kept for the next run and destroyed at exit, one rendezvous per process. Opening and destroying it at every fit
failed by the third or fourth fit (gloo's connections refused; a QA pass)."""
from __future__ import annotations

import pytest

from _launch import torchrun

SCRIPT = """
import numpy as np, warnings
warnings.simplefilter("ignore")
import torch.distributed as dist
from torchtree import BayesianTreeClassifier
rng = np.random.default_rng(0)
X = rng.uniform(size=(80, 3)); y = (X[:, 0] > 0.5).astype(int)
scores = [BayesianTreeClassifier(method="smc-moves", n_particles=20, n_iterations=6, random_state=i, backend="gloo",
                                 verbose=0).fit(X, y).score(X, y) for i in range(6)]
print(f"rank {dist.get_rank()} fits {len(scores)}", flush=True)
"""


@pytest.mark.slow
@pytest.mark.distributed
def test_six_fits_by_backend_name_in_one_torchrun_job(tmp_path):
    (tmp_path / "fits.py").write_text(SCRIPT)
    proc = torchrun(["fits.py"], tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "rank 0 fits 6" in proc.stdout and "rank 1 fits 6" in proc.stdout
