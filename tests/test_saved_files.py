"""Saved posterior files that are old, edited or of a newer format (a QA pass on saved models): read where the
format is one this version reads, refused with a message otherwise, never a crash of the compiled kernels."""
import numpy as np
import pytest
import torch

import torchtree
from torchtree import BART, Data
from _edits import edited as _edited
from torchtree.model.bart_posterior import BARTPosterior

pytestmark = pytest.mark.filterwarnings("ignore:MCMC chains look unconverged")


@pytest.fixture(scope="module")
def bart_file(tmp_path_factory):
    rng = np.random.default_rng(0)
    X = rng.uniform(size=(150, 3))
    post = BART(n_trees=8, n_chains=2, n_warmup=20, n_samples=10).run(
        Data(X, X[:, 0] + 0.1 * rng.normal(size=150), task="regression"), seed=0)
    path = tmp_path_factory.mktemp("bart") / "post.pt"
    post.save(path)
    return path, X, post.predict(X)


def test_a_bart_file_of_the_earlier_format_is_read_by_load_posterior(bart_file, tmp_path):
    """``BARTPosterior.load`` reads format /1 files; ``load_posterior`` (and so the CLI) refused them as 'not a
    torchtree posterior file'."""
    path, X, pred = bart_file
    old = _edited(path, tmp_path / "v1.pt", lambda p: p.update(format="torchtree.BARTPosterior/1"))
    np.testing.assert_array_equal(torchtree.load_posterior(old).predict(X), pred)


@pytest.mark.parametrize("edit, match", [
    (lambda p: p["feature"].masked_fill_(p["feature"] >= 0, 32000), "a tree splits on a column or cut outside"),
    (lambda p: p["cut"].masked_fill_(p["feature"] >= 0, 30000), "a tree splits on a column or cut outside"),
    (lambda p: p.pop("prior"), "KeyError: 'prior'"),
    (lambda p: p["prior"].update(bogus=1), "TypeError"),
    (lambda p: p.update(sigma=p["sigma"][:3]), "3 noise draws for"),
    (lambda p: p["n_cuts"].fill_(2**31 - 1), "a column's cut count is outside"),
    (lambda p: p["value"].fill_(float("nan")), "a leaf value or noise draw is not finite"),
])
def test_an_edited_bart_file_is_refused_not_crashing(bart_file, tmp_path, edit, match):
    """Trees pointing outside the grid segfaulted (or read memory beyond it) in the compiled prediction; a missing
    or extra field was a bare KeyError / TypeError. Each is now the loader's ValueError."""
    path, X, _ = bart_file
    bad = _edited(path, tmp_path / "bad.pt", edit)
    for load in (torchtree.load_posterior, BARTPosterior.load):
        with pytest.raises(ValueError, match=r"not a readable torchtree BART posterior file: .*" + match):
            load(bad)


def test_a_posterior_file_of_a_newer_format_says_so(bart_file, tmp_path):
    path, _, _ = bart_file
    new = _edited(path, tmp_path / "v9.pt", lambda p: p.update(format="torchtree.BARTPosterior/9"))
    with pytest.raises(ValueError, match=r"a format this version does not read \(torchtree.BARTPosterior/9\): "
                                         r"written by a newer torchtree"):
        torchtree.load_posterior(new)
    with pytest.raises(ValueError, match=r"not a torchtree BART posterior file \(it holds torchtree.BARTPosterior/9\)"):
        BARTPosterior.load(new)


@pytest.mark.parametrize("drop", ["seed", "state"])
def test_a_checkpoint_lacking_its_sampler_state_fields_is_refused(tmp_path, drop):
    """A checkpoint edited (checksum recomputed) to lack the sampler state's seed or state raised a bare KeyError
    in the driver; now a CheckpointError naming what is missing."""
    from torchtree import BayesianTreeClassifier
    from torchtree.io.integrity import CheckpointError

    rng = np.random.default_rng(1)
    X = rng.uniform(size=(60, 2))
    y = (X[:, 0] > 0.5).astype(int)
    ck = tmp_path / "run.ckpt"
    kw = dict(method="smc", n_particles=20, random_state=0, checkpoint=ck, checkpoint_every=1)
    BayesianTreeClassifier(**kw).fit(X, y)

    def edit(p):
        p["state"] = dict(p["state"], sampler_state={k: v for k, v in p["state"]["sampler_state"].items() if k != drop})

    _edited(ck, ck, edit)
    with pytest.raises(CheckpointError, match=rf"not a checkpoint this run can resume: its sampler state lacks {drop}"):
        BayesianTreeClassifier(**kw).fit(X, y)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_loading_onto_a_device_this_machine_lacks_names_the_device(bart_file):
    """It said the intact file was damaged or truncated."""
    path, _, _ = bart_file
    for device, match in (("cuda", r"device 'cuda': CUDA is not available on this machine"),
                          ("bogus", r"device 'bogus' is not a device torch knows")):
        with pytest.raises(ValueError, match=match):
            torchtree.load_posterior(path, device=device)


def test_saving_to_a_directory_names_the_users_path(bart_file, tmp_path):
    """It raised from the rename, naming the hidden temporary file it had written beside the folder."""
    _, X, _ = bart_file
    post = torchtree.load_posterior(bart_file[0])
    folder = tmp_path / "out"
    folder.mkdir()
    with pytest.raises(IsADirectoryError, match=f"{folder}: is a directory; give the path of the file to write"):
        post.save(folder)
    assert list(tmp_path.iterdir()) == [folder] and list(folder.iterdir()) == []  # no temporary file left
