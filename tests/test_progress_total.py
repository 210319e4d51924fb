"""Progress bars know their total (issue #20): MCMC showed "60it" for 6000 iterations and
SMC with moves "10it", without an ETA. The samplers that know their number of steps send
it as ``on_start``'s ``"total"``, and the bar follows the step index, not the number of
``on_step`` calls (MCMC reports every ``monitor_every`` iterations)."""
from __future__ import annotations

import io

import numpy as np

from torchtree import MCMC, Data, ProgressMonitor, SMCSampler


def _data():
    g = np.random.default_rng(0)
    X = g.normal(size=(60, 3))
    return Data(X, (X[:, 0] > 0).astype(int))


def _bar(sampler):
    out = io.StringIO()
    pm = ProgressMonitor(disable=False, file=out, mininterval=0.0)
    seen = {}
    close = pm.close

    def keep():  # the bar is closed at on_end: remember where it stood
        if pm.bar is not None:
            seen.update(total=pm.bar.total, n=pm.bar.n)
        close()
    pm.close = keep
    sampler.run(_data(), seed=0, monitor=pm)
    return seen, out.getvalue()


def test_mcmc_bar_counts_iterations_not_reports():
    seen, text = _bar(MCMC(n_chains=2, n_samples=250, n_warmup=50, monitor_every=100))
    assert seen == {"total": 300, "n": 300}
    assert "300/300" in text


def test_smc_moves_bar_has_its_total():
    seen, text = _bar(SMCSampler(n_particles=16, n_iterations=6))
    assert seen == {"total": 6, "n": 6}
    assert "6/6" in text


def test_bar_never_runs_backwards_or_past_its_total():
    pm = ProgressMonitor(disable=False, file=io.StringIO(), mininterval=0.0)
    pm.on_start({"total": 10})
    for step in (4, 2, 30):  # nested samplers report their own step numbers
        pm.on_step(step, {})
    assert pm.bar.n == 10
    pm.close()
    pm.on_start({})  # no total: counts calls, as before
    pm.on_step(99, {})
    assert pm.bar.n == 1 and pm.bar.total is None
    pm.close()


def test_nuts_bar_has_its_total():
    from torchtree.soft import NUTS

    g = np.random.default_rng(1)
    X = g.normal(size=(40, 2))
    y = (X[:, 0] > 0).astype(int)
    out = io.StringIO()
    pm = ProgressMonitor(disable=False, file=out, mininterval=0.0)
    NUTS(n_chains=2, n_samples=8, n_warmup=6, depth=1).run(X, y, seed=0, monitor=pm)
    assert "14/14" in out.getvalue()
