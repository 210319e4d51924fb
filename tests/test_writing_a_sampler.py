"""A method written only as config + init / step / finalize (examples/writing_a_sampler.py)
gets everything else from the driver: estimator, CLI, checkpoint-resume, 2 ranks, seeds,
a time budget. Also checks its answer against the exact evidence of the stump model.
"""
from __future__ import annotations

import csv
import importlib.util
import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from torchtree import BayesianTreeClassifier, DirichletMultinomial
from torchtree.cli import main, sampler_options
from torchtree.io.checkpoint import CheckpointError
from torchtree.monitor import CallbackMonitor, TraceMonitor

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "_dist_workers"))
from thread_backend import run_threads  # noqa: E402

_spec = importlib.util.spec_from_file_location("writing_a_sampler", ROOT / "examples" / "writing_a_sampler.py")
toy = importlib.util.module_from_spec(_spec)
sys.modules["writing_a_sampler"] = toy  # dataclasses look their module up while the class is built
_spec.loader.exec_module(toy)  # registers method="stumps"
PriorStumps = toy.PriorStumps


def _data(n=60, seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n, 3, generator=g)
    y = ((X[:, 1] > 0.4) ^ (torch.rand(n, generator=g) < 0.1)).long()
    return X, y


def _same(a, b):
    assert torch.equal(a.log_weights, b.log_weights)
    for k, v in b.trees.as_dict().items():
        assert torch.equal(a.trees.as_dict()[k], v), k
    assert a.log_evidence == b.log_evidence


def test_evidence_matches_the_exact_stump_evidence():
    """On 10 points the stump model's evidence is a finite sum: for each feature, the
    marginal likelihood is constant between consecutive sorted values, so
    p(y) = (1/D) sum_f sum_intervals (length / range) p(y | f, interval). The importance
    sampler's estimate of it from 8192 prior draws must agree within 0.05 in log space
    (its relative standard error here is about 0.01, so 5 standard errors)."""
    X, y = _data(10, seed=3)
    lik = DirichletMultinomial(2.0)
    post = PriorStumps(lik, n_steps=8, batch_size=1024).run((X, y), seed=0)
    Xd, logs = X.double(), []
    onehot = torch.nn.functional.one_hot(y, 2).double()
    for f in range(X.shape[1]):
        v = torch.sort(Xd[:, f]).values
        lo, hi = v[0], v[-1]
        for a, b in zip(v[:-1], v[1:]):
            if b > a:
                left = onehot[Xd[:, f] <= a].sum(0)
                right = onehot.sum(0) - left
                ll = lik.log_marginal(left[None]) + lik.log_marginal(right[None])
                logs.append(float(ll) + math.log(float((b - a) / (hi - lo))) - math.log(X.shape[1]))
    exact = float(torch.logsumexp(torch.tensor(logs), 0))
    assert abs(post.log_evidence - exact) < 0.05, (post.log_evidence, exact)


def test_seed_none_is_fresh_and_an_int_reproduces():
    X, y = _data()
    a, b = (PriorStumps(n_steps=2, batch_size=16).run((X, y), seed=5) for _ in range(2))
    _same(a, b)
    c, d = (PriorStumps(n_steps=2, batch_size=16).run((X, y), seed=None) for _ in range(2))
    assert not torch.equal(c.trees.threshold, d.trees.threshold)


def test_through_the_estimator():
    X, y = _data(120)
    clf = BayesianTreeClassifier(method="stumps", n_steps=3, batch_size=32, random_state=0).fit(X.numpy(), y.numpy())
    assert clf.score(X.numpy(), y.numpy()) > 0.8
    assert np.isfinite(clf.log_evidence_)
    again = BayesianTreeClassifier(method="stumps", n_steps=3, batch_size=32, random_state=0).fit(X.numpy(), y.numpy())
    assert np.array_equal(clf.predict_proba(X.numpy()), again.predict_proba(X.numpy()))
    with pytest.raises(ValueError, match="n_steps"):
        BayesianTreeClassifier(method="stumps", n_steps=0).fit(X.numpy(), y.numpy())
    with pytest.raises(ValueError, match="alpha_split"):  # the toy takes no tree prior
        BayesianTreeClassifier(method="stumps", alpha_split=0.5).fit(X.numpy(), y.numpy())


def test_presets_resolve_through_the_estimator_and_the_cli(tmp_path, capsys):
    """The toy's one preset (``batch_size``: STUMPS_PER_FEATURE per feature on wide tables) reaches the
    estimator, its summary, the CLI's help and a direct run given ``"auto"``, with no code outside the example."""
    g = torch.Generator().manual_seed(3)
    X = torch.rand(50, 12, generator=g)
    y = (X[:, 4] > 0.5).long()
    per = toy.STUMPS_PER_FEATURE
    clf = BayesianTreeClassifier(method="stumps", n_steps=2, random_state=0).fit(X.numpy(), y.numpy())
    assert clf.sampler_config_.batch_size == -(-per * 12 // 64) * 64 == 128
    assert clf.posterior_.info["settings"]["batch_size"].startswith("128 (many-features: ")
    assert clf.posterior_.n_particles == 2 * 128
    narrow = BayesianTreeClassifier(method="stumps", n_steps=2, random_state=0).fit(X[:, :3].numpy(), y.numpy())
    assert narrow.sampler_config_.batch_size == toy.StumpsConfig.batch_size  # no preset holds: the literal default
    assert narrow.posterior_.info["settings"]["batch_size"].startswith("64 (default: ")
    given = BayesianTreeClassifier(method="stumps", n_steps=2, batch_size=16, random_state=0).fit(X.numpy(), y.numpy())
    assert given.sampler_config_.batch_size == 16 and "settings" not in given.posterior_.info
    # a direct run keeps the literal default unless asked for "auto"; the sampler's own config is left as given
    assert PriorStumps(n_steps=1).run((X, y), seed=0).n_particles == 64
    auto = PriorStumps(n_steps=1, batch_size="auto")
    assert auto.run((X, y), seed=0).n_particles == 128 and auto.config.batch_size == "auto"
    with pytest.raises(SystemExit):
        main(["fit", "x.csv", "--method", "stumps", "--help"])
    assert "many-features" in capsys.readouterr().out


def test_through_the_cli(tmp_path, capsys):
    X, y = _data(80)
    path = tmp_path / "d.csv"
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["a", "b", "c", "label"])
        w.writerows([[*map(float, x), int(t)] for x, t in zip(X, y)])
    names = dict(sampler_options(PriorStumps))
    assert set(names) == {"n_steps", "batch_size", "max_seconds"}  # device / checkpoint are the CLI's own
    assert "each draws batch_size stumps" in names["n_steps"]["help"]
    out = tmp_path / "post.pt"
    assert main(["fit", str(path), "--target", "label", "--method", "stumps", "--n-steps", "2", "--batch-size", "16",
                 "--seed", "1", "--out", str(out), "--quiet"]) == 0
    assert main(["predict", str(out), str(path), "--out", str(tmp_path / "p.csv")]) == 0
    assert (tmp_path / "p.csv").read_text().count("\n") == 81
    with pytest.raises(SystemExit):
        main(["fit", str(path), "--method", "stumps", "--help"])
    assert "--n-steps" in capsys.readouterr().out


class Stop(Exception):
    pass


def test_checkpoint_resume_equals_uninterrupted(tmp_path):
    X, y = _data()
    ref = PriorStumps(n_steps=5, batch_size=8).run((X, y), seed=2)
    path = str(tmp_path / "toy.ckpt")

    def crash(step):
        if step == 2:
            raise Stop

    with pytest.raises(Stop):
        PriorStumps(n_steps=5, batch_size=8, checkpoint=path).run((X, y), seed=2,
                                                                  monitor=CallbackMonitor(on_checkpoint=crash))
    trace = TraceMonitor()
    _same(PriorStumps(n_steps=5, batch_size=8, checkpoint=path).run((X, y), seed=2, monitor=trace), ref)
    assert trace.start_info["resumed_at_step"] == 3
    with pytest.raises(CheckpointError, match="different run"):
        PriorStumps(n_steps=5, batch_size=8, checkpoint=path).run((X, y), seed=3)


def test_two_ranks_give_the_one_rank_answer():
    X, y = _data()
    one = PriorStumps(n_steps=3, batch_size=8).run((X, y), seed=4)
    for post in run_threads(2, lambda b: PriorStumps(n_steps=3, batch_size=8, backend=b).run((X, y), seed=4)):
        _same(post, one)


def test_two_ranks_share_rank_0s_fresh_seed_and_one_budget():
    """seed=None draws on rank 0 only (both ranks then hold the same stumps), and a time budget
    stops both ranks after the same step (no rank waits in a collective for the other)."""
    X, y = _data()
    a, b = run_threads(2, lambda be: PriorStumps(n_steps=3, batch_size=8, backend=be).run((X, y), seed=None))
    _same(a, b)
    a, b = run_threads(2, lambda be: PriorStumps(n_steps=10**6, batch_size=8, backend=be, max_seconds=0.05)
                       .run((X, y), seed=0), timeout=60)
    _same(a, b)
    assert 1 <= a.info["n_steps"] < 10**6


def test_ranks_with_other_settings_refuse_together():
    X, y = _data()
    errors = []

    def job(be):
        try:
            PriorStumps(n_steps=2 + be.rank, batch_size=8, backend=be).run((X, y), seed=0)
        except ValueError as exc:
            errors.append(str(exc))

    run_threads(2, job)
    assert len(errors) == 2 and all("ranks disagree" in e for e in errors)


def test_time_budget_stops_between_steps():
    X, y = _data()
    post = PriorStumps(n_steps=1000, batch_size=8, max_seconds=1e-9).run((X, y), seed=0)
    assert post.info["n_steps"] == 1  # the budget is checked before every step but the first
