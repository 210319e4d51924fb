"""Damaged, edited, truncated and empty files, and interrupts while writing (issue #20).

A posterior or checkpoint carries a sha256 of its content; loading one whose tensors
were edited (a child pointer, a log weight) is refused naming the file, and so is a file
that is empty or cut short, without torch's advice to load it with weights_only=False.
Files of earlier versions (no checksum) still load when their trees are well formed.
A Ctrl-C inside torch.save is held until the file is complete, then raised.
"""
from __future__ import annotations

import os
import signal
import threading

import numpy as np
import pytest
import torch

from torchtree import Data, DirichletMultinomial, ChipmanPrior, TopDownSMC, TreePosterior
from torchtree.io.checkpoint import (CheckpointError, Checkpointer, atomic_save, content_checksum, load_checkpoint,
                                  seal)
from torchtree.model.trees import INTERNAL


def _data(n=40, seed=0):
    g = np.random.default_rng(seed)
    X = g.normal(size=(n, 3))
    y = (X[:, 0] > 0).astype(int) + (X[:, 1] > 0.5).astype(int)
    return X, y


@pytest.fixture(scope="module")
def post():
    X, y = _data()
    p = TopDownSMC(ChipmanPrior(0.95, 0.5), DirichletMultinomial(3.0), n_particles=40,
                   proposal="optimal").run(Data(X, y), seed=1)
    assert bool((p.trees.status == INTERNAL).any())  # the edits below need a split
    return p


def _edit(path, fn, reseal=False):
    payload = torch.load(path, weights_only=True)
    fn(payload)
    if reseal:
        payload = seal(payload)
    torch.save(payload, path)


def _first_split(payload):
    st = payload["trees"]["status"]
    if st.dim() == 1:  # compact layout (torchtree.model.tree_storage): split fields list internal nodes only
        return (0,)
    return tuple(int(v) for v in (st == INTERNAL).nonzero()[0])


def test_edited_posterior_tensor_is_refused(post, tmp_path):
    path = str(tmp_path / "post.pt")
    post.save(path)
    assert TreePosterior.load(path).trees.n_trees == post.trees.n_trees

    def right(p):
        p["trees"]["right"][_first_split(p)] = -5
    _edit(path, right)
    with pytest.raises(ValueError, match=r"post\.pt.*damaged or edited"):
        TreePosterior.load(path)

    post.save(path)

    def logw(p):
        p["log_weights"][0] += 1.0
    _edit(path, logw)
    with pytest.raises(ValueError, match="damaged or edited"):
        TreePosterior.load(path)


def test_old_posterior_without_checksum_loads_but_structure_is_checked(post, tmp_path):
    path = str(tmp_path / "old.pt")
    post.save(path)
    _edit(path, lambda p: p.pop("checksum"))  # as written by the previous version
    X, _ = _data()
    assert np.array_equal(TreePosterior.load(path).predict_proba(X), post.predict_proba(X))

    def right(p):
        p["trees"]["right"][_first_split(p)] = -5
    _edit(path, right)
    with pytest.raises(ValueError, match="damaged or edited: tree structure"):
        TreePosterior.load(path)


def test_resealed_edit_with_bad_feature_index_is_refused(post, tmp_path):
    path = str(tmp_path / "post.pt")
    post.save(path)

    def feature(p):
        p["trees"]["feature"][_first_split(p)] = 99
    _edit(path, feature, reseal=True)
    with pytest.raises(ValueError, match="feature index"):
        TreePosterior.load(path)


@pytest.mark.parametrize("cut", ["empty", "half", "text"])
def test_truncated_or_empty_posterior_names_the_path(post, tmp_path, cut):
    path = tmp_path / "post.pt"
    post.save(str(path))
    raw = path.read_bytes()
    path.write_bytes({"empty": b"", "half": raw[: len(raw) // 2], "text": b"a,b\n1,2\n"}[cut])
    with pytest.raises(ValueError) as info:
        TreePosterior.load(str(path))
    msg = str(info.value)
    assert str(path) in msg and ("damaged" in msg or "empty" in msg)
    assert "weights_only" not in msg
    # no chained torch error (its text advises weights_only=False) under the traceback
    assert info.value.__cause__ is None and (info.value.__suppress_context__ or info.value.__context__ is None)


def test_edited_or_truncated_checkpoint_is_refused(tmp_path):
    path = str(tmp_path / "run.ckpt")
    ck = Checkpointer(path, 1, fingerprint="f", min_seconds=0)
    ck.save(3, {"logw": torch.zeros(5), "step": 3})
    assert torch.equal(ck.load()["logw"], torch.zeros(5))
    payload = torch.load(path, weights_only=True)
    payload["state"]["sampler_state"]["logw"][2] = 7.0
    torch.save(payload, path)
    with pytest.raises(CheckpointError, match=r"run\.ckpt.*damaged or edited"):
        ck.load()
    ck.save(3, {"logw": torch.zeros(5), "step": 3})
    raw = open(path, "rb").read()
    open(path, "wb").write(raw[:100])
    with pytest.raises(CheckpointError, match=r"run\.ckpt: not a readable checkpoint: the file is damaged, truncated"):
        load_checkpoint(path)
    open(path, "wb").close()
    with pytest.raises(CheckpointError, match="empty"):
        load_checkpoint(path)


def test_checksum_covers_every_field():
    a = {"x": torch.arange(4.0), "n": 3, "s": "a", "nested": [torch.ones(2), {"k": 1.5}]}
    ref = content_checksum(a)
    assert content_checksum(seal(a)) == ref  # its own entry is left out
    for change in (lambda d: d["x"].__setitem__(0, 1.0), lambda d: d.__setitem__("n", 4),
                   lambda d: d["nested"][1].__setitem__("k", 1.25), lambda d: d.__setitem__("x", d["x"].float().double())):
        b = {"x": a["x"].clone(), "n": 3, "s": "a", "nested": [torch.ones(2), {"k": 1.5}]}
        change(b)
        assert content_checksum(b) != ref


# --------------------------------------------------------------------------- Ctrl-C while saving
class _InterruptingFile:
    """A file whose third write sends this process a SIGINT: a Ctrl-C that lands inside
    torch's zip writer (which calls back into Python for every record)."""

    def __init__(self, fh):
        self.fh, self.n = fh, 0

    def write(self, b):
        self.n += 1
        if self.n == 3:
            signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)  # where Python runs handlers
        return self.fh.write(b)

    def flush(self):
        self.fh.flush()


@pytest.fixture
def sigint_inside_torch_save(monkeypatch):
    # Python's own Ctrl-C handler, whatever this process inherited: a test run started in the
    # background of a non-interactive shell starts with SIGINT ignored, and then nothing raises
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    real = torch.save

    def save(obj, f, *a, **k):
        return real(obj, _InterruptingFile(f) if hasattr(f, "write") else f, *a, **k)
    monkeypatch.setattr(torch, "save", save)
    yield
    signal.signal(signal.SIGINT, previous)


def test_ctrl_c_inside_torch_save_completes_the_file_then_interrupts(tmp_path, sigint_inside_torch_save):
    path = str(tmp_path / "x.ckpt")
    big = {"a": torch.arange(50000.0), "b": torch.ones(50000)}
    with pytest.raises(KeyboardInterrupt):
        atomic_save(big, path)
    back = load_checkpoint(path)  # the write finished before the interrupt was raised
    assert torch.equal(back["a"], big["a"]) and torch.equal(back["b"], big["b"])
    assert [f for f in os.listdir(tmp_path) if f.endswith(".tmp")] == []
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_cli_ctrl_c_during_checkpoint_save_exits_130(tmp_path, capsys, sigint_inside_torch_save):
    from torchtree.cli import main

    X, y = _data(60)
    csv = tmp_path / "d.csv"
    csv.write_text("a,b,c,y\n" + "".join(f"{r[0]},{r[1]},{r[2]},{t}\n" for r, t in zip(X, y)))
    ck = str(tmp_path / "run.ckpt")
    rc = main(["fit", str(csv), "--method", "mcmc", "--n-chains", "1", "--n-samples", "20", "--n-warmup", "5",
               "--checkpoint", ck, "--quiet", "--out", str(tmp_path / "p.pt")])
    err = capsys.readouterr().err
    assert rc == 130 and "interrupted" in err and "Traceback" not in err
    assert f"{ck} holds the run so far: the same command resumes it" in err
    assert load_checkpoint(ck)["format"] == cp_format()  # the checkpoint is complete


# --------------------------------------------------------------------------- cost-aware checkpoints
class _Clock:
    """A fake clock for torchtree.checkpoint: a step costs 1 s, a save 2 s."""

    def __init__(self):
        self.t = 0.0

    def perf_counter(self):
        return self.t

    def time(self):
        return self.t


def _saved_steps(monkeypatch, tmp_path, n_steps=100, every=1, **kw):
    import torchtree.io.checkpoint as cp

    clock = _Clock()
    monkeypatch.setattr(cp, "time", clock)
    real = cp.atomic_save

    def slow_save(obj, path):
        real(obj, path)
        clock.t += 2.0
    monkeypatch.setattr(cp, "atomic_save", slow_save)
    ck = Checkpointer(str(tmp_path / "c.ckpt"), every, **kw)
    saved = []
    for step in range(n_steps):
        clock.t += 1.0
        if ck.maybe_save(step, lambda: {"step": step}, last=step == n_steps - 1):
            saved.append(step)
    return saved, clock.t, ck


def test_cost_aware_checkpointer_keeps_saving_under_five_percent(monkeypatch, tmp_path):
    monkeypatch.delenv("TORCHTREE_CHECKPOINT_MIN_SECONDS", raising=False)
    saved, total, ck = _saved_steps(monkeypatch, tmp_path)
    assert ck.min_seconds is None
    # the first due save measures the cost (2 s); then one save per 19 x 2 s of steps
    assert saved == [0, 38, 76, 99]
    cycle = (saved[2] - saved[1]) * 1.0 + 2.0  # steps, then one save
    assert 2.0 / cycle <= 0.05 + 1e-12 and total == 100 + 2.0 * len(saved)
    assert ck.n_skipped == 99 - 3
    assert load_checkpoint(str(tmp_path / "c.ckpt"))["step"] == 99  # the last step is always saved


def test_min_seconds_zero_saves_every_due_step(monkeypatch, tmp_path):
    saved, _, _ = _saved_steps(monkeypatch, tmp_path, n_steps=10, every=3, min_seconds=0)
    assert saved == [2, 5, 8, 9]
    saved, _, _ = _saved_steps(monkeypatch, tmp_path, n_steps=20, min_seconds=5)
    assert saved == [0, 5, 10, 15, 19]  # each >= 5 s (5 steps) after the previous one ended
    monkeypatch.setenv("TORCHTREE_CHECKPOINT_MIN_SECONDS", "7")
    assert Checkpointer("x", 1).min_seconds == 7.0
    monkeypatch.setenv("TORCHTREE_CHECKPOINT_MIN_SECONDS", "auto")
    assert Checkpointer("x", 1).min_seconds is None
    monkeypatch.setenv("TORCHTREE_CHECKPOINT_MIN_SECONDS", "soon")
    with pytest.raises(ValueError, match="TORCHTREE_CHECKPOINT_MIN_SECONDS"):
        Checkpointer("x", 1)
    with pytest.raises(ValueError, match="min_seconds"):
        Checkpointer("x", 1, min_seconds=-1)


def test_cost_aware_checkpoints_resume_bit_identical(monkeypatch, tmp_path):
    """Saves skipped by the clock change where a run resumes from, never what it returns."""
    from torchtree import MCMC
    from torchtree.monitor import CallbackMonitor

    X, y = _data(80)
    data = Data(X, y)
    kw = dict(n_chains=2, n_samples=30, n_warmup=10, engine="batched")
    ref = MCMC(**kw).run(data, seed=3)
    monkeypatch.delenv("TORCHTREE_CHECKPOINT_MIN_SECONDS", raising=False)
    real_fsync = os.fsync

    def slow_fsync(fd):  # saves cost ~10 ms: most due saves are skipped
        import time
        time.sleep(0.01)
        real_fsync(fd)
    monkeypatch.setattr(os, "fsync", slow_fsync)
    path = str(tmp_path / "m.ckpt")
    s = MCMC(**kw, checkpoint=path, checkpoint_every=1)
    saves = []

    class Stop(Exception):
        pass

    def hook(step):
        saves.append(step)
        if len(saves) == 2:
            raise Stop
    with pytest.raises(Stop):
        s.run(data, seed=3, monitor=CallbackMonitor(on_checkpoint=hook))
    assert saves[1] > saves[0] + 1  # due saves in between were skipped
    back = MCMC(**kw, checkpoint=path, checkpoint_every=1).run(data, seed=3)
    for k, v in ref.trees.as_dict().items():
        assert torch.equal(back.trees.as_dict()[k], v), k
    assert torch.equal(back.log_weights, ref.log_weights)


# --------------------------------------------------------------------------- fit --out
def _csv(tmp_path, n=60):
    X, y = _data(n)
    csv = tmp_path / "d.csv"
    csv.write_text("a,b,c,y\n" + "".join(f"{r[0]},{r[1]},{r[2]},{t}\n" for r, t in zip(X, y)))
    return str(csv)


@pytest.fixture
def unwritable_dir(tmp_path):
    """A directory this process cannot create files in (root ignores permission bits:
    then /sys, where even root cannot create files)."""
    d = tmp_path / "ro"
    d.mkdir()
    d.chmod(0o500)
    candidates = [str(d), "/sys"]
    try:
        for c in candidates:
            try:
                open(os.path.join(c, "probe.pt"), "wb").close()
                os.unlink(os.path.join(c, "probe.pt"))
            except OSError:
                yield c
                return
        pytest.skip("no unwritable directory on this machine")
    finally:
        d.chmod(0o700)


def test_fit_out_unwritable_is_refused_before_the_fit(tmp_path, capsys, monkeypatch, unwritable_dir):
    from torchtree import estimators
    from torchtree.cli import main

    def no_fit(*a, **k):
        raise AssertionError("the fit ran although --out cannot be written")
    monkeypatch.setattr(estimators.BayesianTreeClassifier, "fit", no_fit)
    out = os.path.join(unwritable_dir, "post.pt")
    assert main(["fit", _csv(tmp_path), "--n-particles", "20", "--quiet", "--out", out]) == 2
    err = capsys.readouterr().err
    assert f"--out {out}: cannot write in directory" in err and "Traceback" not in err


def test_fit_out_failing_after_the_fit_is_rescued(tmp_path, capsys, monkeypatch):
    from torchtree.cli import main

    real = TreePosterior.save
    out = str(tmp_path / "post.pt")

    def save(self, path):
        if path == out:  # e.g. the disk filled up or the directory went away during the fit
            raise RuntimeError("[enforce fail at inline_container.cc] unexpected pos")
        real(self, path)
    monkeypatch.setattr(TreePosterior, "save", save)
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
    rc = main(["fit", _csv(tmp_path), "--n-particles", "20", "--quiet", "--out", out])
    err = capsys.readouterr().err
    rescued = [str(p) for p in work.glob("torchtree-posterior-*.pt")]
    assert rc == 1 and len(rescued) == 1
    assert f"could not save the posterior to {out}" in err and f"saved it to {rescued[0]} instead" in err
    assert TreePosterior.load(rescued[0]).n_features == 3


def test_cli_summary_and_predict_refuse_an_edited_posterior(post, tmp_path, capsys):
    from torchtree.cli import main

    path = str(tmp_path / "post.pt")
    post.save(path)

    def stats(p):
        p["trees"]["stats"].view(-1)[0] += 1  # either layout (padded or compact)
    _edit(path, stats)
    assert main(["summary", path]) == 2
    err = capsys.readouterr().err
    assert f"torchtree: error: {path}: this torchtree posterior file is damaged or edited" in err and "Traceback" not in err
    open(path, "wb").close()
    assert main(["predict", path, _csv(tmp_path)]) == 2
    assert "the file is empty" in capsys.readouterr().err


def cp_format():
    from torchtree.io.checkpoint import FORMAT
    return FORMAT
