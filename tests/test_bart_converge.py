"""BART run until converged (``min_ess``, ``max_rhat``, ``max_samples``): the run length the rule gives,
its draws, its cap and warning, a resume and several ranks."""
import warnings

import numpy as np
import pytest
import torch

from torchtree import BART, Data
from torchtree.model.diagnostics import unconverged

# small forests on 100 rows mix slowly (f at the traced rows slowest): the loose limits below take a few blocks
# of 10 kept sweeps to reach
RULE = dict(min_ess=2.0, max_rhat=2.5)
KW = dict(n_trees=10, n_chains=3, n_warmup=10, n_samples=10)


def _data(task: str) -> Data:
    rng = np.random.default_rng(3)
    X = rng.uniform(size=(100, 6))
    y = 10 * np.sin(np.pi * X[:, 0] * X[:, 1]) + 20 * (X[:, 2] - 0.5) ** 2 + 10 * X[:, 3] + rng.normal(size=100)
    return Data(X, y if task == "regression" else (y > np.median(y)).astype(int), task=task)


def _same_draws(a, b) -> bool:
    return torch.equal(a.feature, b.feature) and torch.equal(a.value, b.value) and torch.equal(a.sigma, b.sigma)


def _fixed(data, seed, n_warmup, n_samples, thin=1):
    """The fixed-length run whose kept sweeps are sweeps ``n_warmup .. n_warmup + n_samples - 1`` (the draws are
    keyed by sweep, so they are any longer run's sweeps too)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return BART(**{**KW, "n_warmup": n_warmup, "n_samples": n_samples}, thin=thin).run(data, seed=seed)


def _off(post) -> bool:
    return bool(unconverged(post.info, RULE["max_rhat"], RULE["min_ess"]))


@pytest.mark.parametrize("task,thin,seed", [("regression", 1, 4), ("classification", 1, 1), ("regression", 2, 4)])
def test_the_run_ends_at_the_first_window_within_the_limits_with_a_fixed_runs_draws(task, thin, seed):
    """The run keeps blocks of ``n_samples`` sweeps per chain and at each block tries two windows, every kept sweep
    and (once past ``n_samples``) the second half; it stops at the first window within the limits. Checked against
    fixed-length runs (the same draws, keyed by sweep): every window of every earlier block is off the limits, and
    the run returns exactly the draws and diagnostics of the fixed run of its window. Classification has no sigma:
    its NaN diagnostics are skipped. With ``thin`` (a seed that takes the second half) the window's warm-up counts
    every sweep it moved."""
    data = _data(task)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # a run that converged does not warn
        got = BART(**KW, **RULE, max_samples=200, thin=thin).run(data, seed=seed)
    total = (got.info["sweeps"] - 10) // thin  # kept sweeps per chain, the window and what moved to the warm-up
    assert got.info["converged"] is True
    assert 10 < total < 200 and total % 10 == 0  # it went past n_samples, and stopped before the cap
    assert got.info["n_warmup"] + got.info["n_samples"] * thin == got.info["sweeps"]
    assert got.info["n_samples"] in (total, total - total // 2)
    assert not _off(got)
    for block in range(10, total, 10):
        assert _off(_fixed(data, seed, 10, block, thin)), block
        if block > 10:
            assert _off(_fixed(data, seed, 10 + block // 2 * thin, block - block // 2, thin)), block
    fixed = _fixed(data, seed, got.info["n_warmup"], got.info["n_samples"], thin)
    assert _same_draws(got, fixed)
    mixing = lambda p: {k: v for k, v in p.info.items() if k.startswith(("rhat_", "ess_"))}  # noqa: E731
    assert mixing(got) == pytest.approx(mixing(fixed), nan_ok=True)
    if task == "classification":
        assert np.isnan(got.info["rhat_sigma"]) and np.isfinite(got.info["rhat_leaves"])


def test_the_second_half_is_taken_when_the_start_still_drifts():
    """A seed whose whole kept run stays off the limits while its second half is within: the run returns the
    second half, its first half counted as warm-up."""
    data = _data("regression")
    for seed in range(40):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            got = BART(**KW, **RULE, max_samples=200).run(data, seed=seed)
        total = got.info["sweeps"] - 10
        if got.info["converged"] and got.info["n_samples"] < total:
            break
    else:
        pytest.fail("no seed in 0..39 took the second half")
    assert got.info["n_samples"] == total - total // 2 and got.info["n_warmup"] == 10 + total // 2
    assert _off(_fixed(data, seed, 10, total)) and not _off(got)
    assert _same_draws(got, _fixed(data, seed, 10 + total // 2, total - total // 2))


def test_the_cap_ends_the_run_with_a_warning_and_fixed_runs_are_unchanged():
    """Limits no run reaches: the run goes to ``max_samples`` kept sweeps and warns, naming the limits and the cap;
    it returns the window (every kept sweep, or the second half) whose largest R-hat is smaller. Seeds are tried
    until each window has been chosen once. Without ``min_ess`` the run keeps exactly ``n_samples``."""
    data = _data("regression")
    worst = lambda p: max(v for k, v in p.info.items() if k.startswith("rhat_") and v == v)  # noqa: E731
    chosen = set()
    for seed in range(20):
        with pytest.warns(UserWarning, match=r"limits R-hat <= 1.05, ESS >= 1000.*30 kept sweeps per chain "
                                             r"\(max_samples 30\)"):
            got = BART(**KW, min_ess=1000.0, max_samples=30).run(data, seed=seed)
        assert got.info["sweeps"] == 40 and got.info["converged"] is False
        whole, half = _fixed(data, seed, 10, 30), _fixed(data, seed, 25, 15)
        want = half if worst(half) < worst(whole) else whole
        assert got.info["n_samples"] == want.info["n_samples"] and got.info["n_warmup"] == want.info["n_warmup"]
        assert _same_draws(got, want)
        chosen.add(want.info["n_samples"])
        if chosen == {15, 30}:
            break
    assert chosen == {15, 30}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        plain = BART(**KW, max_samples=30).run(data, seed=2)
    assert plain.info["n_samples"] == 10 and "converged" not in plain.info
    # limits any run meets: 2 kept sweeps per chain give no R-hat (NaN), so no verdict before the second block
    tiny = BART(**{**KW, "n_samples": 2}, min_ess=1e-3, max_rhat=1e3).run(data, seed=2)
    assert tiny.info["n_samples"] == 4 and tiny.info["converged"] is True
    # the default cap: CONVERGE_CAP blocks
    from torchtree.samplers.bart.config import CONVERGE_CAP, BARTConfig

    assert BARTConfig(n_samples=7, min_ess=50.0).kept_cap() == 7 * CONVERGE_CAP
    assert BARTConfig(n_samples=7).kept_cap() == 7
    assert BARTConfig(n_samples=7, min_ess=50.0, max_samples=3).kept_cap() == 7  # never below n_samples
    # a cap that is not a multiple of n_samples stops the run there (it went on to the next block: 45 of 40)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        capped = BART(**{**KW, "n_samples": 15}, min_ess=1000.0, max_samples=40).run(data, seed=0)
    assert capped.info["sweeps"] == 10 + 40 and capped.info["converged"] is False


def test_memory_is_checked_for_the_cap(monkeypatch):
    """The refusal before any allocation counts the kept draws the cap allows, not n_samples'."""
    data = _data("regression")
    monkeypatch.setenv("TORCHTREE_MEMORY_LIMIT", "60M")
    kw = dict(n_trees=200, n_chains=4, n_warmup=0, n_samples=5, max_seconds=1e-9)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        BART(**kw).run(data, seed=0)  # 5 kept draws fit
    with pytest.raises(ValueError, match="max_samples"):
        BART(**kw, min_ess=100.0, max_samples=5000).run(data, seed=0)


def test_a_resumed_run_decides_as_the_uninterrupted_one(tmp_path):
    """Stopped after a checkpoint past ``n_samples`` (inside the extension) and resumed: the same length and
    draws as the uninterrupted run."""
    from torchtree.monitor import CallbackMonitor

    data = _data("regression")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        whole = BART(**KW, **RULE, max_samples=200).run(data, seed=4)

    class Stop(Exception):
        pass

    def hook(step):
        if step >= 10 + 10 + 5:  # warm-up, the first block, half of the second
            raise Stop

    ck = str(tmp_path / "bart.ckpt")
    with pytest.raises(Stop):
        BART(**KW, **RULE, max_samples=200, checkpoint=ck, checkpoint_every=1).run(
            data, seed=4, monitor=CallbackMonitor(on_checkpoint=hook))
    resumed = BART(**KW, **RULE, max_samples=200, checkpoint=ck).run(data, seed=4)
    assert resumed.info["sweeps"] == whole.info["sweeps"] > 10 + 20
    assert resumed.info["n_samples"] == whole.info["n_samples"]
    assert _same_draws(resumed, whole)


def test_two_ranks_stop_where_one_process_stops():
    """Each rank decides on every chain (gathered), so the ranks stop together, at one process's length."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent / "_dist_workers"))
    from thread_backend import run_threads

    data = _data("regression")
    kw = {**KW, "n_chains": 4, **RULE, "max_samples": 200}
    one = BART(**kw).run(data, seed=3)
    outs = run_threads(2, lambda be: BART(**kw, backend=be).run(data, seed=3), timeout=120)
    assert one.info["sweeps"] > 10 + 10
    for o in outs:
        assert o.info["sweeps"] == one.info["sweeps"] and o.info["n_samples"] == one.info["n_samples"]
        assert _same_draws(o, one)


def test_a_progress_bar_expects_the_most_sweeps_the_run_may_take():
    """``on_start``'s ``total`` (a progress bar's length) is the cap's sweep count with ``min_ess``, the fixed
    length without; the run itself may end sooner."""
    from torchtree.monitor import CallbackMonitor

    data = _data("regression")
    seen = []
    mon = CallbackMonitor(on_start=lambda info: seen.append(info["total"]))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        BART(**KW, thin=2).run(data, seed=0, monitor=mon)
        got = BART(**KW, **RULE, max_samples=200, thin=2).run(data, seed=3, monitor=mon)
    assert seen == [10 + 10 * 2, 10 + 200 * 2]
    assert got.info["sweeps"] < 10 + 200 * 2
