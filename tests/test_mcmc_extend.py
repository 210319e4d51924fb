"""Tree MCMC with ``n_warmup`` given resumes from its checkpoint with a larger ``n_samples``, finished or not: the
draws are those of one run of the new length, on both engines (an iteration's uniforms are keyed by the seed,
the chain and the iteration). Without ``n_warmup`` its default ``n_samples * thin`` grows too: another run."""
import numpy as np
import pytest
import torch

from torchtree import MCMC, Data
from torchtree.io.checkpoint import CheckpointError

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def _data():
    rng = np.random.default_rng(0)
    X = rng.uniform(size=(60, 2))
    return Data(X, (X[:, 0] > 0.5).astype(int))


@pytest.mark.parametrize("engine", ["host", "batched"])
def test_a_finished_run_extended_is_the_longer_run(tmp_path, engine):
    data, ck = _data(), str(tmp_path / "m.ckpt")
    kw = dict(n_chains=3, n_warmup=20, engine=engine)
    MCMC(**kw, n_samples=30, checkpoint=ck).run(data, seed=4)
    got = MCMC(**kw, n_samples=70, checkpoint=ck).run(data, seed=4)
    ref = MCMC(**kw, n_samples=70).run(data, seed=4)
    assert got.info["n_samples"] == 70 and got.info["resumed_at_iteration"] == 50
    for k in ref.info["trace"]:
        assert np.array_equal(got.info["trace"][k], ref.info["trace"][k]), k
    assert torch.equal(torch.as_tensor(got.predict_proba(data.X)), torch.as_tensor(ref.predict_proba(data.X)))


def test_fewer_draws_and_a_default_warm_up_are_refused(tmp_path):
    data, ck = _data(), str(tmp_path / "m.ckpt")
    MCMC(n_chains=2, n_warmup=10, n_samples=40, checkpoint=ck).run(data, seed=0)
    with pytest.raises(ValueError, match=r"has kept 40 draws per chain, more than n_samples=20"):
        MCMC(n_chains=2, n_warmup=10, n_samples=20, checkpoint=ck).run(data, seed=0)
    ck2 = str(tmp_path / "d.ckpt")
    MCMC(n_chains=2, n_samples=20, checkpoint=ck2).run(data, seed=0)  # n_warmup = n_samples: it moves too
    with pytest.raises(CheckpointError, match="the setting n_samples differs: n_samples 20 in the checkpoint, 40"):
        MCMC(n_chains=2, n_samples=40, checkpoint=ck2).run(data, seed=0)
