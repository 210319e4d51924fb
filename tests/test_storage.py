"""Compact storage of trees in posterior files and MCMC checkpoints (issue #20).

The compact layout must give back the stored trees exactly (every field, dtype and
bit), predictions from a reloaded posterior must equal the saved one's bit for bit,
files of the previous layout must still load, and the checksum must cover the new one.
"""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from torchtree import MCMC, ChipmanPrior, Data, DirichletMultinomial, TopDownSMC, TreePosterior
from torchtree.io.checkpoint import atomic_save, seal
from torchtree.model.tree_storage import compact_trees, expand_trees, is_compact
from torchtree.samplers.mcmc import MCMCState


def _data(n=120, seed=0, task="classification"):
    g = np.random.default_rng(seed)
    X = g.normal(size=(n, 4))
    if task == "regression":
        return X, X[:, 0] * 2 + (X[:, 1] > 0) + 0.2 * g.normal(size=n)
    return X, (X[:, 0] > 0).astype(int) + (X[:, 1] > 0.3).astype(int)


def _same_trees(a, b):
    da, db = a.as_dict(), b.as_dict()
    assert da.keys() == db.keys()
    for k in da:
        assert da[k].dtype == db[k].dtype and torch.equal(da[k], db[k]), k


@pytest.fixture(scope="module")
def mcmc_run():
    X, y = _data()
    s = MCMC(ChipmanPrior(0.95, 0.5), DirichletMultinomial(3.0), n_chains=3, n_samples=150, n_warmup=50, engine="batched")
    return s, Data(X, y), X


def test_compact_round_trip_of_mcmc_draws_with_runs(mcmc_run):
    s, data, _ = mcmc_run
    post = s.run(data, seed=3)
    # [draws x chains] flattened, as a checkpoint holds the kept draws; chain 0 repeats
    # tree 0 (two rejected moves), chain 1 repeats tree 1 once
    kept = post.trees
    runs = kept.take(torch.tensor([0, 1, 2, 0, 1, 2, 0, 4, 2, 3, 4, 2]) % kept.n_trees)
    c = compact_trees(runs, stride=3)
    assert is_compact(c) and "raw" not in c
    assert c["n_nodes"].shape[0] < runs.n_trees  # runs stored once
    assert c["left"].dtype in (torch.int8, torch.int16) and c["stats"].dtype in (torch.int8, torch.int16)
    _same_trees(expand_trees(c), runs)
    _same_trees(expand_trees(compact_trees(kept)), kept)


def test_compact_round_trip_of_smc_and_regression_trees():
    X, y = _data(task="regression")
    post = TopDownSMC(n_particles=50, proposal="optimal").run(Data(X, y, task="regression"), seed=1)
    c = compact_trees(post.trees)
    assert "raw" not in c and c["stats"].dtype == post.trees.stats.dtype  # real-valued stats stay as they are
    _same_trees(expand_trees(c), post.trees)
    Xc, yc = _data()
    cls = TopDownSMC(ChipmanPrior(0.95, 0.5), DirichletMultinomial(3.0), n_particles=50).run(Data(Xc, yc), seed=2)
    _same_trees(expand_trees(compact_trees(cls.trees)), cls.trees)  # OPEN and LEAF leaves both kept


def test_what_the_layout_cannot_hold_is_stored_as_is():
    X, y = _data()
    post = TopDownSMC(ChipmanPrior(0.95, 0.5), DirichletMultinomial(3.0), n_particles=20).run(Data(X, y), seed=0)
    t = post.trees.clone()
    t.extra["cache"] = torch.ones(t.n_trees, t.capacity)
    assert "raw" in compact_trees(t)
    _same_trees(expand_trees(compact_trees(t)), t)
    u = post.trees.clone()
    u.threshold[0, -1] = 7.0  # junk in an unused slot
    assert "raw" in compact_trees(u)
    _same_trees(expand_trees(compact_trees(u)), u)


def _old_format_save(post, path):
    """A posterior file as the previous version (format /1) wrote it."""
    from torchtree.model.posterior import to_plain

    payload = {"format": "torchtree.TreePosterior/1", "trees": {k: v.cpu() for k, v in post.trees.as_dict().items()},
               "log_weights": post.log_weights.cpu(), "likelihood": post.likelihood.config(),
               "n_features": post.n_features, "classes": None if post.classes_ is None else post.classes_.tolist(),
               "log_evidence": post.log_evidence, "n_particles": post.n_particles, "ess": post.ess,
               "info": to_plain(post.info)}
    atomic_save(seal(payload), path)


def test_posterior_file_is_smaller_and_predicts_bit_for_bit(mcmc_run, tmp_path):
    s, data, X = mcmc_run
    post = s.run(data, seed=3)
    new, old = str(tmp_path / "new.pt"), str(tmp_path / "old.pt")
    post.save(new)
    _old_format_save(post, old)
    assert torch.load(new, weights_only=True)["format"] == "torchtree.TreePosterior/2"
    assert os.path.getsize(new) * 3 < os.path.getsize(old)
    for path in (new, old):
        back = TreePosterior.load(path)
        _same_trees(back.trees, post.trees)
        assert np.array_equal(back.predict_proba(X), post.predict_proba(X))
        assert back.log_predictive(X, data.y.numpy()) == post.log_predictive(X, data.y.numpy())


def test_checksum_covers_the_compact_trees(mcmc_run, tmp_path):
    s, data, _ = mcmc_run
    post = s.run(data, seed=3)
    path = str(tmp_path / "p.pt")
    post.save(path)
    payload = torch.load(path, weights_only=True)
    payload["trees"]["threshold"][0] += 0.5
    torch.save(payload, path)
    with pytest.raises(ValueError, match="damaged or edited"):
        TreePosterior.load(path)
    payload["trees"]["left"][0] = 127  # resealed, but the child pointer is out of range
    atomic_save(seal(payload), path)
    with pytest.raises(ValueError, match="damaged or edited: tree structure"):
        TreePosterior.load(path)


def test_mcmc_checkpoint_stores_compact_draws_and_resumes_exactly(tmp_path):
    X, y = _data(80, 1)
    data = Data(X, y)

    def sampler(**kw):
        return MCMC(ChipmanPrior(0.95, 0.5), DirichletMultinomial(3.0), n_chains=2, n_samples=60, n_warmup=20,
                    engine="batched", **kw)

    want = sampler().run(data, seed=5)
    ck = str(tmp_path / "ck.pt")

    class Stop(Exception):
        pass

    from torchtree import Monitor

    class StopAt(Monitor):
        def on_step(self, step, info):
            if int(step) >= 40:
                raise Stop()

    with pytest.raises(Stop):
        sampler(checkpoint=ck, checkpoint_every=10).run(data, seed=5, monitor=StopAt())
    saved = torch.load(ck, weights_only=True)["state"]["sampler_state"]["state"]
    assert is_compact(saved["kept"]) and "index" in saved["kept"]
    got = sampler(checkpoint=ck, checkpoint_every=10).run(data, seed=5)
    _same_trees(got.trees, want.trees)
    assert torch.equal(got.log_weights, want.log_weights)


def test_checkpoint_state_of_the_previous_layout_loads(mcmc_run):
    s, data, _ = mcmc_run
    post = s.run(data, seed=3)
    kept = post.trees.take(torch.arange(6) % post.trees.n_trees)
    state = {"step": 7, "done": False, "trees": kept.take(torch.arange(3)).as_dict(),
             "proposed": torch.zeros(4, dtype=torch.long), "accepted": torch.zeros(4, dtype=torch.long),
             "kept": kept.as_dict(), "trace_leaves": None, "trace_lp": None}
    old = MCMCState.from_state_dict(state)
    state["kept"] = compact_trees(kept, stride=3)
    new = MCMCState.from_state_dict(state)
    _same_trees(old.kept[0], kept)
    _same_trees(new.kept[0], kept)


def test_host_chain_snapshots_pack_narrow_and_exact():
    from torchtree.steps.host_moves import pack_snapshots, unpack_snapshots

    g = np.random.default_rng(0)
    snaps = []
    for n in (1, 5, 9):
        snaps.append((g.integers(-1, 8, n).astype(np.int64), g.normal(size=n), g.integers(-1, n, n).astype(np.int64),
                      g.integers(-1, n, n).astype(np.int64), g.integers(-1, n, n).astype(np.int64),
                      g.integers(0, 4, n).astype(np.int64), g.random(n) < 0.5,
                      g.integers(0, 300, (n, 2)).astype(np.float64)))
    packed = pack_snapshots(snaps)
    assert packed["fields"][0].dtype == torch.int8 and packed["fields"][7].dtype == torch.int16
    assert packed["fields"][1].dtype == torch.float64  # thresholds stay as they are
    old = {"lengths": packed["lengths"], "fields": [torch.from_numpy(np.concatenate([s[i] for s in snaps]))
                                                    for i in range(8)]}  # the previous layout
    for back in (unpack_snapshots(packed), unpack_snapshots(old)):
        for a, b in zip(snaps, back):
            for x, y in zip(a, b):
                assert x.dtype == y.dtype and np.array_equal(x, y)


def test_posterior_load_reads_every_kind_of_file(tmp_path):
    """``torchtree.load_posterior`` dispatches on the file's format tag: hard trees, BART and soft trees come
    back as their own classes and predict as before; a checkpoint or another file is refused by name, and
    ``Posterior.load`` (the protocol's) names the function."""
    import torchtree as tt
    from torchtree.model.bart_posterior import BARTPosterior
    from torchtree.model.soft_posterior import SoftTreePosterior

    rng = np.random.default_rng(0)
    X = rng.random((80, 2))
    y = X[:, 0] + 0.1 * rng.normal(size=80)
    fits = {
        TreePosterior: tt.BayesianTreeRegressor(n_particles=20, random_state=0),
        BARTPosterior: tt.BayesianTreeRegressor("bart", n_trees=5, n_samples=10, n_warmup=10, random_state=0),
        SoftTreePosterior: tt.BayesianTreeRegressor("dcc", n_iterations=1, n_initial=2, n_chains=1, n_samples=4,
                                                    n_warmup=4, max_depth=1, random_state=0),
    }
    for kind, est in fits.items():
        post = est.fit(X, y).posterior_
        path = tmp_path / f"{kind.__name__}.pt"
        post.save(str(path))
        back = tt.load_posterior(str(path))
        assert type(back) is kind
        np.testing.assert_array_equal(back.predict(X[:5]), post.predict(X[:5]))
    torch.save({"format": "torchtree.io.checkpoint/1"}, tmp_path / "ck.pt")
    with pytest.raises(ValueError, match="a run's checkpoint"):
        tt.load_posterior(str(tmp_path / "ck.pt"))
    torch.save({"weights": torch.zeros(3)}, tmp_path / "other.pt")
    with pytest.raises(ValueError, match="not a torchtree posterior file"):
        tt.load_posterior(str(tmp_path / "other.pt"))
    with pytest.raises(NotImplementedError, match=r"torchtree.load_posterior\(path\) reads a file of any kind"):
        tt.Posterior.load(str(tmp_path / "TreePosterior.pt"))
