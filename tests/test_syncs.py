"""``torchtree.core.syncs.HostReads`` counts the calls that read a device value back, and the move
samplers' threshold rank search makes none."""
import numpy as np
import pytest
import torch

import torchtree as tt
from torchtree.core.syncs import HostReads
from torchtree.kernels.segments import segmented_searchsorted
from torchtree.steps.moves import TreeModel


def test_counts_the_reads_and_nothing_else():
    x = torch.arange(6.0)
    with HostReads(where=True) as m:
        y = (x * 2 + 1).sum(0)  # arithmetic: no read
        x.cumsum(0)
        assert m.total == 0
        float(y)
        x.max().item()
        x[x > 2]
        (x > 2).nonzero()
        x.repeat_interleave(torch.tensor([1, 0, 2, 1, 1, 1]))
        x.repeat_interleave(torch.tensor([1, 0, 2, 1, 1, 1]), output_size=6)  # sized by the caller: no read
        x.to("cpu")
        x.tolist()
        torch.tensor(3, device=x.device)  # a host value copied to the run's device
        torch.as_tensor([1, 2], device=x.device)
        torch.tensor(3), torch.as_tensor(x, device=x.device), torch.tensor(x)  # on the host, or from a tensor: no read
        torch.full((), 3, device=x.device)  # a fill: no copy
    assert m.reads == {"__float__": 1, "item": 1, "bool-mask index": 1, "nonzero": 1, "repeat_interleave": 1,
                       "to(cpu)": 1, "tolist": 1, "host copy": 2}
    assert m.total == 9 and sum(m.sites.values()) == 9


def test_sites_are_files_of_the_package_whatever_the_checkout_is_called():
    """A read is credited to the last torchtree source line on the stack (relative to the package), or "?"
    when no torchtree code made it: by the package's folders, not by "/torchtree/" in a path, which every file
    of a checkout called torchtree (tests included) has."""
    import os

    X, y = np.random.default_rng(0).normal(size=(20, 2)), np.arange(20.0)
    with HostReads(where=True) as m:
        torch.arange(3.0).tolist()  # this test's own read
        tt.Data(X, y, task="regression")
    root = os.path.dirname(os.path.abspath(tt.__file__))
    sites = {site for _, site in m.sites}
    assert "?" in sites and len(sites) > 1
    for site in sites - {"?"}:
        path = site.rsplit(":", 1)[0]
        assert not path.startswith("tests/") and os.path.exists(os.path.join(root, path)), site


@pytest.mark.parametrize("route", ["copied rows", "in place"])
def test_threshold_rank_reads_nothing_and_equals_the_stopping_search(route, monkeypatch):
    """Both routes of the search (a copy of each threshold's row of sorted values, searched at once, or
    the segmented search in place, for many thresholds on long rows) rank as numpy does."""
    import torchtree.kernels.segments as segments

    if route == "in place":
        monkeypatch.setattr(segments, "_ROW_SEARCH", 0)
    g = np.random.default_rng(0)
    X = np.column_stack([g.integers(0, 3, 200), g.normal(size=200), g.integers(0, 40, 200)]).astype(float)
    data = tt.Data(X, (X[:, 1] > 0).astype(int))
    model = TreeModel(tt.ChipmanPrior(0.95, 0.5), tt.DirichletMultinomial(1.0), data)
    f = torch.tensor([0, 1, 2, 1, 0, 2, 2, 0, 1])
    thr = torch.tensor([-1.0, 0.1, 17.5, 9.0, 1.0, 39.0, -3.0, 1e6, 0.0], dtype=model.X.dtype)
    thr[-1] = model.sorted_flat[model.umax + 7]  # a value of the column itself
    with HostReads() as m:
        r = model.threshold_rank(f, thr)
    assert m.total == 0
    starts = f * model.umax
    ref = segmented_searchsorted(model.sorted_flat, starts, starts + model.n_unique.index_select(0, f), thr) - 1
    assert torch.equal(r, ref)
    # against numpy: the rank r of thr among the sorted distinct values of its column (-1 below the minimum)
    Xd = X.astype(model.X.numpy().dtype)  # the values as the model holds them
    want = [np.searchsorted(np.unique(Xd[:, k]), t, side="right") - 1 for k, t in zip(f.tolist(), thr.numpy())]
    assert r.tolist() == want


def test_topdown_torch_route_searches_cuts_without_reads(monkeypatch):
    """On the torch route (what runs on a GPU) the top-down cut searches are single searches over
    sorted keys: they read nothing back, and the run equals the compiled route's."""
    import torchtree.steps.growth as growth

    g = np.random.default_rng(1)
    X = g.normal(size=(300, 4))
    data = tt.Data(X, (X[:, 0] * X[:, 1] > 0).astype(int), task="classification")
    calls, reads = [], []

    def counting(fn):
        def counted(*args, **kwargs):
            with HostReads() as m:
                out = fn(*args, **kwargs)
            calls.append(fn.__name__)
            reads.append(m.total)
            return out
        return counted

    for proposal in ("prior", "optimal"):
        ref = tt.TopDownSMC(n_particles=40, proposal=proposal).run(data, seed=3)
        calls.clear(), reads.clear()
        with monkeypatch.context() as mp:
            mp.setattr(growth, "native_usable", lambda device: False)
            for name in ("grouped_searchsorted", "sorted_slice_searchsorted"):
                mp.setattr(growth, name, counting(getattr(growth, name)))
            got = tt.TopDownSMC(n_particles=40, proposal=proposal).run(data, seed=3)
        want = "grouped_searchsorted" if proposal == "prior" else "sorted_slice_searchsorted"
        assert want in calls and sum(reads) == 0, (proposal, calls, sum(reads))
        assert torch.equal(got.trees.feature, ref.trees.feature) and torch.equal(got.trees.threshold, ref.trees.threshold)
        assert abs(got.log_evidence - ref.log_evidence) < 1e-9
