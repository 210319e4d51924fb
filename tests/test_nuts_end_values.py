"""NUTS's end-of-run values go to ``on_end`` under names of their own: the run's mean acceptance and its total
divergences were written under the per-iteration ``hmc/accept`` and ``hmc/divergences`` tags, so their last
step showed two values in TensorBoard (and a total would show as a spike) (a QA pass)."""
import numpy as np

from torchtree.monitor import CallbackMonitor
from torchtree.soft import NUTS


def test_nuts_end_values_do_not_reuse_the_per_iteration_tags():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(60, 2))
    y = (X[:, 0] > 0).astype(int)
    steps, ends = [], []
    mon = CallbackMonitor(on_step=lambda s, d: steps.append((s, dict(d))), on_end=lambda d: ends.append(dict(d)))
    post = NUTS(n_chains=2, n_samples=6, n_warmup=6, depth=1).run(X, y, seed=0, monitor=mon)
    per_step = {k for _, d in steps for k in d}
    assert "hmc/accept" in per_step and "hmc/divergences" in per_step
    end = ends[-1]
    assert not (set(end) & per_step), set(end) & per_step
    assert end["accept"] == post.info["accept"] and end["divergences"] == post.info["divergences"]
    assert end["step_size"] == post.info["step_size"]
