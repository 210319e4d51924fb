"""``BARTPosterior.mixing``: split-R-hat and ESS of the draws of f(x), per row, over the chains (the run's own
diagnostics cover sigma and the mean leaf count only; a QA pass found f mixing worse)."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from torchtree import BART, Data
from torchtree.model.bart import LEAF


def _posterior():
    rng = np.random.default_rng(0)
    X = rng.uniform(size=(200, 3))
    data = Data(X, 3 * (X[:, 0] > 0.5) + 0.3 * rng.normal(size=200), task="regression")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return BART(n_trees=10, n_chains=4, n_warmup=30, n_samples=60).run(data, seed=1), X


def test_f_diagnostics_per_row_and_a_chain_apart_is_seen():
    post, X = _posterior()
    m = post.mixing(X[:6])
    assert m["rhat"].shape == (6,) and m["ess"].shape == (6,)
    assert np.isfinite(m["rhat"]).all() and (m["rhat"] > 0.9).all() and (m["ess"] > 0).all()
    # shift every draw of chain 0 by one scaled unit (each tree 0's leaves + 1): its f sits apart from the
    # other chains', which split-R-hat must see at every row (draw-major order: draw s of chain c is s C + c)
    feature, cut, value = post._main
    shifted = value.clone()
    rows = post.chain_of == 0
    leaves = (feature[:, 0] == LEAF) & rows[:, None]
    shifted[:, 0][leaves] += 1.0
    post._main = (feature, cut, shifted)
    apart = post.mixing(X[:6])
    assert (apart["rhat"] > 1.5).all() and (apart["ess"] < m["ess"]).all()
    f = post.latent_draws(X[:6])
    assert torch.allclose(f[rows].mean(0) - f[~rows].mean(0), torch.full((6,), float(post.prior.scale), dtype=f.dtype), atol=0.6)


def _three_classes():
    rng = np.random.default_rng(2)
    X = rng.uniform(size=(150, 3))
    y = np.digitize(X[:, 0] + 0.2 * rng.normal(size=150), [0.35, 0.65])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return BART(n_trees=6, n_chains=3, n_warmup=10, n_samples=12).run(Data(X, y, task="classification"), seed=2), X


def test_the_run_traces_f_at_spread_rows_and_summarises_its_mixing():
    """The run records f at 100 training rows spread evenly (``info["f_rows"]``) at every kept sweep, from its
    residuals; the trace equals the kept forests' own f at those rows (float32 residuals: 1e-4 of the scale), and
    ``rhat_f`` / ``ess_f`` are the 90% / 10% quantiles of :meth:`mixing`'s per-row values (1e-3 relative: the
    traced and the recomputed f differ by rounding). Regression, and three classes (a trace per utility)."""
    from torchtree.samplers.bart.mixing import F_ROWS, traced_rows

    post, X = _posterior()
    rows = post.info["f_rows"]
    assert rows == traced_rows(200).tolist() and len(rows) == F_ROWS and rows[0] == 0 and rows[-1] == 199
    assert np.all(np.diff(rows) >= 1) and np.ptp(np.diff(rows)) <= 1  # evenly spread
    f = post.info["trace"]["f"]  # [chains, draws, rows]
    assert f.shape == (4, 60, F_ROWS)
    drawn = post.latent_draws(X[rows]).numpy().reshape(60, 4, F_ROWS).transpose(1, 0, 2)
    np.testing.assert_allclose(f, drawn, atol=1e-4 * post.prior.scale)
    m = post.mixing(X[rows])
    assert post.info["rhat_f"] == pytest.approx(np.quantile(m["rhat"], 0.9), rel=1e-3)
    assert post.info["ess_f"] == pytest.approx(np.quantile(m["ess"], 0.1), rel=1e-3)

    post3, X3 = _three_classes()
    rows3 = post3.info["f_rows"]
    assert rows3 == traced_rows(150).tolist()
    f3 = post3.info["trace"]["f"]  # [chains, draws, utilities, rows]
    assert f3.shape == (3, 12, 2, F_ROWS)
    drawn3 = post3.latent_draws(X3[rows3]).numpy().reshape(12, 3, 2, F_ROWS).transpose(1, 0, 2, 3)
    np.testing.assert_allclose(f3, drawn3, atol=1e-4)
    m3 = post3.mixing(X3[rows3])  # [utilities, rows]
    assert post3.info["rhat_f"] == pytest.approx(np.quantile(m3["rhat"], 0.9), rel=1e-3)
    assert post3.info["ess_f"] == pytest.approx(np.quantile(m3["ess"], 0.1), rel=1e-3)
    assert traced_rows(7).tolist() == list(range(7))


def test_the_until_converged_rule_and_the_warning_read_f():
    """Traces where sigma and the leaf count mix (iid) but f's chains sit apart: the rule's window is off the
    limits because of ``rhat_f`` alone; with f iid too it is within. A trace from a checkpoint written before f was
    traced (no sweeps) gives NaN for f, which the limits skip."""
    from torchtree.model.diagnostics import unconverged
    from torchtree.samplers.bart.mixing import diagnostics, window

    rng = np.random.default_rng(0)
    S, C, R = 400, 4, 30
    sig = torch.as_tensor(1.0 + 0.01 * rng.normal(size=(S, C))) ** 2
    leaves = torch.as_tensor(3.0 + rng.normal(size=(C, 10 + S)))
    f_iid = torch.as_tensor(rng.normal(size=(S, C, R)))
    f_apart = f_iid + torch.arange(C, dtype=torch.float64)[None, :, None]
    args = (10, 1, S, 1.05, 100.0, True, 1)
    drop, d, within = window(sig, leaves, f_apart, *args)
    assert not within and d["rhat_f"] > 1.5 and d["ess_f"] < 10
    assert unconverged(d, 1.05, 100.0) == [f"rhat_f {d['rhat_f']:.2f}", f"ess_f {d['ess_f']:.1f}"]  # f's alone
    drop, d, within = window(sig, leaves, f_iid, *args)
    assert within and drop == 0 and abs(d["rhat_f"] - 1) < 0.02 and d["ess_f"] > 1000
    old = diagnostics(sig, leaves, torch.zeros(0, C, 0, dtype=torch.float64), np.arange(10, 10 + S), True, 1)
    assert np.isnan(old["rhat_f"]) and np.isnan(old["ess_f"]) and not unconverged(old, 1.05, 100.0)


def test_a_checkpointed_state_from_before_the_f_trace_restores():
    """A BART state saved without ``kept_f`` (a checkpoint of an earlier release) restores with an empty trace."""
    from torchtree.samplers.bart.state import BARTState

    t = torch.zeros(1)
    state = BARTState(step=3, done=False, feature=t, cut=t, value=t, leaf_of=t, resid=t, sigma2=t, latent=t, counts=t,
                      kept=[], kept_sigma=[t], trace_leaves=[t], kept_f=[torch.ones(1, 2)])
    saved = state.state_dict()
    assert len(saved["kept_f"]) == 1
    del saved["kept_f"]
    back = BARTState.from_state_dict(saved)
    assert back.kept_f == [] and back.step == 3 and len(back.kept_sigma) == 1


def test_arviz_gets_f_at_the_traced_rows_and_the_kept_draws_apart_from_the_warm_up():
    """ArviZ's posterior holds the kept draws of every trace (sigma, f, and the mean leaf count, which the run
    records at every sweep: its warm-up goes to ``warmup_posterior``); with ``thin`` every thin-th sweep is kept."""
    pytest.importorskip("arviz")
    from torchtree.model.diagnostics import to_arviz

    post, _ = _posterior()  # 30 warm-up + 60 kept sweeps, 4 chains
    idata = to_arviz(post)
    assert idata.posterior["f"].shape == (4, 60, 100) and idata.posterior["sigma"].shape == (4, 60)
    np.testing.assert_array_equal(idata.posterior["f"].values, post.info["trace"]["f"])
    # f's last axis is labelled by the training rows traced (it was f_dim_0 = 0, 1, 2, ...: a QA pass)
    assert idata.posterior["f"].dims == ("chain", "draw", "f_row")
    np.testing.assert_array_equal(idata.posterior["f"].coords["f_row"].values, post.info["f_rows"])
    # sigma's trace is in y's units, as noise_sd (the posterior's sigma is on the scaled target)
    np.testing.assert_allclose(np.sort(post.noise_sd.numpy()), np.sort(post.info["trace"]["sigma"].T.reshape(-1)),
                               rtol=1e-12)
    leaves = post.info["trace"]["leaves_mean"]
    assert leaves.shape == (4, 90)
    np.testing.assert_array_equal(idata.posterior["leaves_mean"].values, leaves[:, 30:])
    np.testing.assert_array_equal(idata.warmup_posterior["leaves_mean"].values, leaves[:, :30])
    assert post.info["kept_sweeps"] == list(range(30, 90))
    post.info.pop("kept_sweeps")  # a posterior saved before the entry: the same 90 sweeps read as 20 + 35 x 2
    post.info.update(n_warmup=20, n_samples=35, thin=2)  # (sigma's 60 draws then pad the leaves' 35 with NaN)
    np.testing.assert_array_equal(to_arviz(post).posterior["leaves_mean"].values[:, :35], leaves[:, 21::2])


def test_three_classes_export_one_row_per_chain_and_judge_each_utility_apart():
    """With class utilities every trace has one row per chain (the leaf count ``[chains, sweeps, utilities]``; no
    sigma, fixed at 1 in a probit), so ArviZ sees 3 chains with no NaN padding (it padded f to 6 "chains", one
    per forest); the leaf count's R-hat is the worst utility's over its chains, not one over all forests."""
    from torchtree.model.diagnostics import rhat_columns
    from torchtree.samplers.bart.mixing import diagnostics

    post, _ = _three_classes()
    tr = post.info["trace"]
    assert "sigma" not in tr and tr["leaves_mean"].shape == (3, 22, 2) and tr["f"].shape == (3, 12, 2, 100)
    kept = tr["leaves_mean"][:, 10:]
    assert post.info["rhat_leaves"] == pytest.approx(np.nanmax(rhat_columns(kept)), rel=1e-12)
    leaves = torch.as_tensor(tr["leaves_mean"].transpose(0, 2, 1).reshape(6, 22))  # forests, utility fastest
    swapped = torch.as_tensor(np.ascontiguousarray(tr["leaves_mean"][:, :, ::-1].transpose(0, 2, 1)).reshape(6, 22))
    at = np.arange(10, 22)
    d = diagnostics(torch.ones(12, 6), leaves, torch.zeros(0, 6, 0), at, False, 2)
    assert d["rhat_leaves"] == diagnostics(torch.ones(12, 6), swapped, torch.zeros(0, 6, 0), at, False, 2)["rhat_leaves"]
    pytest.importorskip("arviz")
    from torchtree.model.diagnostics import to_arviz

    idata = to_arviz(post)
    assert idata.posterior["f"].shape == (3, 12, 2, 100) and not np.isnan(idata.posterior["f"].values).any()
    assert idata.posterior["leaves_mean"].shape[:2] == (3, 12)


@pytest.mark.parametrize("stop_after", [26, 6])  # 10 + 3 x 5 sweeps and one unkept after them; in warm-up
def test_a_budget_stop_exports_and_judges_the_kept_sweeps_alone(monkeypatch, stop_after):
    """With ``thin`` the leaf count's diagnostics read the kept sweeps only (they read every sweep after the
    warm-up, so they disagreed with ArviZ on the exported draws), and a run its budget stopped exports its kept
    draws and its warm-up apart: a stop a sweep past a kept one, or in warm-up, left ``to_arviz`` treating the
    whole leaf-count trace as draws and padding sigma and f with NaN. The budget's clock is a step counter."""
    from torchtree.model.diagnostics import rhat, rhat_columns
    from torchtree.monitor import CallbackMonitor
    from torchtree.samplers import driver

    now = [0.0]
    monkeypatch.setitem(driver.CLOCKS, "wall", lambda: now[0])  # BART's budget is wall time

    def on_step(step, info):
        now[0] = step + 1.0

    rng = np.random.default_rng(0)
    X = rng.uniform(size=(120, 2))
    data = Data(X, np.sin(4 * X[:, 0]) + 0.2 * rng.normal(size=120), task="regression")
    with pytest.warns(UserWarning) as said:
        post = BART(n_trees=5, n_chains=4, n_warmup=10, n_samples=50, thin=3, max_seconds=stop_after - 0.5,
                    monitor_every=1).run(data, seed=1, monitor=CallbackMonitor(on_step=on_step))
    info, tr = post.info, post.info["trace"]
    # the budget's stop is said and recorded (5 of 50 kept sweeps had come with no word but the usual
    # convergence warning: a QA pass)
    assert info["stopped_by"] == "max_seconds"
    want = "ran out after 5 of n_samples=50 kept sweeps" if stop_after == 26 else "ran out in warm-up"
    assert any(want in str(w.message) for w in said), [str(w.message) for w in said]
    assert info["sweeps"] == stop_after and tr["leaves_mean"].shape == (4, stop_after)
    kept = [12, 15, 18, 21, 24] if stop_after == 26 else [5]
    assert info["kept_sweeps"] == kept and tr["sigma"].shape == (4, len(kept))
    if len(kept) >= 4:
        assert info["rhat_leaves"] == pytest.approx(float(rhat_columns(tr["leaves_mean"][:, kept, None])[0]), rel=1e-12)
        assert info["rhat_sigma"] == pytest.approx(rhat(tr["sigma"]), rel=1e-9)
    pytest.importorskip("arviz")
    from torchtree.model.diagnostics import to_arviz

    idata = to_arviz(post)
    np.testing.assert_array_equal(idata.posterior["leaves_mean"].values, tr["leaves_mean"][:, kept])
    np.testing.assert_array_equal(idata.warmup_posterior["leaves_mean"].values, tr["leaves_mean"][:, :min(10, kept[0])])
    assert idata.posterior["sigma"].shape == (4, len(kept)) and not np.isnan(idata.posterior["sigma"].values).any()
