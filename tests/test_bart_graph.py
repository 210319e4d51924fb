"""``compile="graph"``: a sweep's tree updates recorded once and replayed (torchtree/samplers/bart/graph.py).

A CUDA graph needs a GPU (tests/test_cuda.py runs the real one there). On the CPU a stand-in records the
sweep by keeping the function and replays it by calling it again on the same static buffers, so these
tests check what the graph route adds around the recording: every input copied into the buffers before
each replay, the trees copied back, one recording per run, a resume's new tensors, the fallback when
recording fails, and the refusals. The draws must equal the eager sweeps' bit for bit (same kernels,
same numbers, on the CPU).
"""
from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from torchtree import BART, Data
from torchtree.samplers.bart import graph as sweep_graph
from torchtree.samplers.bart import sampler as bart_module
from torchtree.steps.bart_moves import tree_update

KW = dict(n_trees=6, n_chains=3, n_warmup=8, n_samples=6, max_depth=4)
pytestmark = pytest.mark.filterwarnings("ignore:MCMC chains look unconverged")


class ReplayGraph:
    """A CUDA graph's stand-in on the CPU: ``capture`` runs the function once (the warm-up) and keeps it;
    ``replay`` runs it again. Counts its recordings."""

    recorded = 0

    def capture(self, fn) -> None:
        fn()
        self.fn = fn
        ReplayGraph.recorded += 1

    def replay(self) -> None:
        self.fn()


class BrokenGraph:
    def capture(self, fn) -> None:
        fn()
        raise RuntimeError("operation not permitted when stream is capturing")


def _data(task: str, n: int = 160, seed: int = 0) -> Data:
    rng = np.random.default_rng(seed)
    X = rng.uniform(size=(n, 4))
    y = 4 * np.sin(3 * X[:, 0]) + 2 * X[:, 1] + rng.normal(size=n)
    if task == "classification":
        y = (y > np.median(y)).astype(int)
    return Data(X, y, task=task)


def _same_draws(a, b) -> bool:
    same = all(torch.equal(x, y) for x, y in ((a.feature, b.feature), (a.cut, b.cut), (a.value, b.value)))
    if a.sigma is not None:
        same = same and torch.equal(a.sigma, b.sigma)
    rates = [k for k in a.info if k.startswith("accept/")]
    return same and bool(rates) and all(a.info[k] == b.info[k] for k in rates)


class Compiled:
    """Stands in for ``torch.compile(tree_update)`` (which takes ~20 s to build on a CPU): the eager update,
    counting its calls."""

    calls = 0

    def __call__(self, *args):
        Compiled.calls += 1
        return tree_update(*args)


@pytest.fixture
def replay(monkeypatch):
    monkeypatch.setattr(sweep_graph, "GRAPH", ReplayGraph)
    monkeypatch.setitem(bart_module._COMPILED, "fn", Compiled())
    ReplayGraph.recorded, Compiled.calls = 0, 0
    return ReplayGraph


@pytest.mark.parametrize("task", ["regression", "classification"])
def test_replayed_sweeps_draw_what_the_eager_sweeps_draw(task, replay):
    data = _data(task)
    eager = BART(**KW, compile="off").run(data, seed=3)
    graphed = BART(**KW, compile="graph").run(data, seed=3)
    assert replay.recorded == 1  # one recording, then replays: the shapes never change within a run
    # the compiled update is what gets recorded: every tree, in the stand-in's recording and in the replays
    # of all the sweeps
    assert Compiled.calls == KW["n_trees"] * (1 + KW["n_warmup"] + KW["n_samples"])
    assert _same_draws(graphed, eager)


def test_a_resumed_run_records_again_and_draws_the_same(tmp_path, replay):
    """The restored state is new tensors: they are copied into the buffers like any other sweep's."""
    from torchtree.monitor import CallbackMonitor

    data = _data("regression")
    whole = BART(**KW, compile="off").run(data, seed=5)

    class Stop(Exception):
        pass

    def hook(step):
        if step >= 10:
            raise Stop

    ck = str(tmp_path / "bart.ckpt")
    with pytest.raises(Stop):
        BART(**KW, compile="graph", checkpoint=ck, checkpoint_every=1).run(data, seed=5,
                                                                           monitor=CallbackMonitor(on_checkpoint=hook))
    resumed = BART(**KW, compile="graph", checkpoint=ck).run(data, seed=5)
    assert replay.recorded == 2
    assert _same_draws(resumed, whole)


def test_a_failed_recording_warns_once_and_runs_eagerly(monkeypatch):
    monkeypatch.setattr(sweep_graph, "GRAPH", BrokenGraph)
    monkeypatch.setitem(bart_module._COMPILED, "fn", Compiled())
    data = _data("regression")
    eager = BART(**KW, compile="off").run(data, seed=1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        graphed = BART(**KW, compile="graph").run(data, seed=1)
    said = [w for w in caught if "CUDA graph" in str(w.message)]
    assert len(said) == 1 and "running it eagerly" in str(said[0].message)
    assert _same_draws(graphed, eager)  # the warm-up ran on the buffers, not on the chains' trees


def test_the_buffers_are_refilled_before_every_replay(replay):
    """A replay that reused the first sweep's uniforms would repeat its moves: checked directly on
    :class:`SweepGraph` against the loop called on fresh inputs."""
    calls = []

    def loop(feature, cut, value, leaf_of, resid, sigma2, U, Z):
        calls.append(float(U.sum()))
        feature.add_(1)
        return resid + U.sum(), torch.zeros(2, 3, dtype=torch.long)

    g = sweep_graph.SweepGraph()
    trees = [torch.zeros(2, 3, 4, dtype=torch.int16) for _ in range(4)]
    resid, sigma2 = torch.zeros(3, 5), torch.ones(3, dtype=torch.float64)
    for k in range(3):
        U = torch.full((2, 3, 5), float(k))
        r, _ = g(loop, *trees, resid, sigma2, U, torch.zeros(2, 3, 4, dtype=torch.float64))
        assert float(r[0, 0]) == 30.0 * k  # this sweep's uniforms, not the recording's
    assert int(trees[0][0, 0, 0]) == 3  # one increment per sweep copied back: the warm-up's is not
    assert replay.recorded == 1


def test_graph_needs_cuda_and_backfitting():
    data = _data("regression")
    with pytest.raises(ValueError, match="CUDA device"):
        BART(**KW, compile="graph").run(data, seed=0)
    with pytest.raises(ValueError, match="bart_sampler='mcmc'"):
        BART(**KW, compile="graph", bart_sampler="pg").run(data, seed=0)


def test_the_memory_check_counts_the_recorded_sweeps_copy(monkeypatch, replay):
    """The recorded sweep keeps its own copy of each point's leaf (``[T, C, N]`` int16): a run that fits
    eagerly may not fit recorded, and is refused before anything is allocated."""
    rng = np.random.default_rng(0)
    X = rng.uniform(size=(20_000, 3))
    data = Data(X, X[:, 0] + rng.normal(size=20_000), task="regression")
    kw = dict(n_trees=100, n_chains=2, n_warmup=0, n_samples=1, max_depth=2, max_seconds=1e-9)
    monkeypatch.setenv("TORCHTREE_MEMORY_LIMIT", "12M")  # the leaves' map alone: 8 MB eagerly, 16 MB recorded
    BART(**kw, compile="off").run(data, seed=0)
    with pytest.raises(ValueError, match="memory|GB|MB"):
        BART(**kw, compile="graph").run(data, seed=0)


def test_nothing_compiles_while_recording_or_replaying(monkeypatch):
    """The compiled update compiles at its first call (and would again on a guard it fails); a compilation
    inside a CUDA graph's recording would break it. Dynamo with its eager backend (the same guards and
    recompilations, no code generation) counts the graphs made during the recording and each replay:
    none, after the warm-up calls."""
    from torchtree.steps import bart_moves

    def graphs() -> int:
        return torch._dynamo.utils.counters["stats"]["unique_graphs"]

    class Recorder:
        made: list = []

        def capture(self, fn) -> None:
            sweep_graph.warm_up(fn)  # as CudaGraph.capture
            before = graphs()
            fn()
            Recorder.made.append(graphs() - before)
            self.fn = fn

        def replay(self) -> None:
            before = graphs()
            self.fn()
            Recorder.made.append(graphs() - before)

    torch._dynamo.reset()
    monkeypatch.setattr(bart_moves, "_TABLES", {})  # as in a fresh process: the first call fills them
    monkeypatch.setattr(sweep_graph, "GRAPH", Recorder)
    monkeypatch.setitem(bart_module._COMPILED, "fn", torch.compile(tree_update, backend="eager", dynamic=False))
    before = graphs()
    BART(**KW, compile="graph").run(_data("regression"), seed=0)
    assert graphs() - before >= 1  # the update did compile, during the warm-up
    assert Recorder.made == [0] * (1 + KW["n_warmup"] + KW["n_samples"])
    torch._dynamo.reset()
