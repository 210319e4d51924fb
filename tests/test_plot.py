"""torchtree.plot: every plot rendered to PNG (Agg backend) on small fitted posteriors of each kind
(hard trees from smc and mcmc, BART, soft trees from dcc), with its content checked against numbers
computed here by another route: the tree's text against the posterior's own rule text, bars against
counts over the stored trees, the partial-dependence line against ``predict`` / ``latent_draws`` over
the grid, traces against ``info["trace"]``, calibration bins against ``numpy.histogram`` and the PIT
against scipy's distribution functions. Fits are seeded and tiny (well under a second each)."""
from __future__ import annotations

import ast
import csv
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

import matplotlib

matplotlib.use("Agg")
import matplotlib.image  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402

import torchtree.plot as tp  # noqa: E402
from torchtree import BayesianTreeClassifier, BayesianTreeRegressor  # noqa: E402
from torchtree.cli import main  # noqa: E402
from torchtree.model.diagnostics import rhat  # noqa: E402
from torchtree.model.encoding import rule_text  # noqa: E402
from torchtree.model.trees import INTERNAL  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
SOFT = dict(n_iterations=2, n_initial=4, n_chains=2, n_samples=5, n_warmup=10, max_depth=2)


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    X = rng.uniform(size=(80, 3))
    return {"X": X, "y": (X[:, 0] > 0.5).astype(int), "yr": 2 * X[:, 0] + 0.1 * rng.normal(size=80)}


def _fit(cls, X, y, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # short chains warn that they look unconverged
        return cls(**kw).fit(X, y)


@pytest.fixture(scope="module")
def fits(data):
    X, y, yr = data["X"], data["y"], data["yr"]
    return {
        "hard_reg": _fit(BayesianTreeRegressor, X, yr, method="smc", n_particles=30),  # with the evidence search
        "hard_cls": _fit(BayesianTreeClassifier, X, y, method="smc", n_particles=30, hyper=None),
        "mcmc_reg": _fit(BayesianTreeRegressor, X, yr, method="mcmc", n_chains=2, n_samples=40, n_warmup=40, hyper=None),
        "bart_reg": _fit(BayesianTreeRegressor, X, yr, method="bart", n_trees=8, n_chains=2, n_samples=40, n_warmup=20),
        "bart_cls": _fit(BayesianTreeClassifier, X, y, method="bart", n_trees=8, n_chains=2, n_samples=40, n_warmup=20),
        "soft_cls": _fit(BayesianTreeClassifier, X, y, method="dcc", **SOFT),
    }


def _check_png(ax, path: Path) -> None:
    """Save the Axes' figure as PNG and check it is a valid, non-blank image."""
    ax.figure.savefig(path, format="png")
    assert path.read_bytes()[:8] == PNG_SIGNATURE
    img = matplotlib.image.imread(path)
    assert img.ndim == 3 and img.shape[0] > 100 and img.shape[1] > 100
    assert float(img[..., :3].std()) > 0.01  # something was drawn


def _lines(ax, label):
    return [line for line in ax.get_lines() if line.get_label() == label]


def _with(X, j, v):
    out = np.array(X, dtype=np.float64, copy=True)
    out[:, j] = v
    return out


# ------------------------------------------------------------------ plot_tree
def test_tree_plot_holds_the_root_rule_and_leaf_probabilities(fits, tmp_path):
    post = fits["hard_cls"].posterior_
    ax = tp.plot_tree(post)
    _check_png(ax, tmp_path / "tree.png")
    texts = [t.get_text() for t in ax.texts]
    t, i = post.trees, int(torch.argmax(post.weights))
    assert int(t.status[i, 0]) == INTERNAL
    root = rule_text(None, None, int(t.feature[i, 0]), float(t.threshold[i, 0]))
    assert root in texts and root.startswith("x0 <= ")
    n = int(t.n_nodes[i])
    leaves = [k for k in range(n) if int(t.status[i, k]) != INTERNAL]
    leaf_texts = [s for s in texts if s.startswith("n=")]
    assert len(leaf_texts) == len(leaves)
    table = post.likelihood.predictive_table(t.stats[i, :n]).double()
    for k in leaves:
        want = f"n={int(t.stats[i, k].sum())}\n" + "\n".join(f"{c}: {float(p):.2f}" for c, p in zip(post.classes_, table[k]))
        assert want in leaf_texts
    # any draw, by index; out of range refused
    other = tp.plot_tree(post, draw=post.trees.n_trees - 1)
    assert other.get_title().startswith(f"tree {post.trees.n_trees - 1} of")
    with pytest.raises(IndexError):
        tp.plot_tree(post, draw=post.trees.n_trees)


@pytest.fixture(scope="module")
def coded():
    """A table with a text column and missing values (coded by the posterior's TableEncoder)."""
    pd = pytest.importorskip("pandas")
    rng = np.random.default_rng(1)
    n = 120
    color = rng.choice(["red", "green", "blue"], n)
    size = rng.uniform(size=n)
    size[rng.random(n) < 0.2] = np.nan
    X = pd.DataFrame({"color": color, "size": size})
    y = np.where(color == "red", "yes", "no")
    return X, y, _fit(BayesianTreeClassifier, X, y, method="smc", n_particles=30, hyper=None)


def test_tree_plot_of_a_coded_table_uses_its_rule_text(coded, tmp_path):
    post = coded[2].posterior_
    assert post.encoder is not None
    ax = tp.plot_tree(post)
    _check_png(ax, tmp_path / "coded.png")
    t, i = post.trees, int(torch.argmax(post.weights))
    root = rule_text(post.encoder, ["color", "size"], int(t.feature[i, 0]), float(t.threshold[i, 0]))
    assert root.startswith("color in {")
    assert root in [s.get_text() for s in ax.texts]


def test_tree_plot_of_a_bart_tree(fits, tmp_path):
    post = fits["bart_reg"].posterior_
    feat = post.feature.numpy()
    draw, tree = map(int, np.argwhere(feat[:, :, 0] >= 0)[0])  # a tree with a split at its root
    ax = tp.plot_tree(post, draw=draw, tree=tree)
    _check_png(ax, tmp_path / "bart_tree.png")
    texts = [t.get_text() for t in ax.texts]
    f0, c0 = int(feat[draw, tree, 0]), int(post.cut[draw, tree, 0])
    assert rule_text(None, None, f0, float(post.grid.cuts[f0, c0])) in texts
    values = post.value[draw, tree].numpy()
    want = sorted(f"value {post.prior.scale * values[j]:.4g}" for j in np.flatnonzero(feat[draw, tree] == -1))
    assert sorted(s for s in texts if s.startswith("value ")) == want
    assert f"tree {tree} of draw {draw}" in ax.get_title()
    with pytest.raises(IndexError):
        tp.plot_tree(post, tree=post.n_trees)


def test_tree_plot_of_a_soft_topology(fits):
    post = fits["soft_cls"].posterior_
    ax = tp.plot_tree(post)
    texts = [t.get_text() for t in ax.texts]
    top = post.topologies[int(torch.argmax(post.weights))]
    assert sum(s.startswith("leaf ") for s in texts) == top.n_leaves
    gates = [s for s in texts if "(w=" in s]
    assert len(gates) == len(top.internal) and all(s.split()[0] in {"x0", "x1", "x2", "1-x0", "1-x1", "1-x2"} for s in gates)


# ------------------------------------------------------------------ plot_importance
def _bars(ax):
    labels = [t.get_text() for t in ax.get_yticklabels()]
    ys = list(ax.get_yticks())
    return {labels[ys.index(p.get_y() + p.get_height() / 2)]: p.get_width() for p in ax.patches}


def test_importance_bars_equal_split_shares_counted_tree_by_tree(fits, tmp_path):
    post = fits["bart_reg"].posterior_
    ax = tp.plot_importance(post)
    _check_png(ax, tmp_path / "importance.png")
    feat = post.feature.numpy()  # [draws, trees, slots]
    shares = []
    for s in range(feat.shape[0]):
        used = [int(f) for tree in feat[s] for f in tree if f >= 0]
        counts = np.array([used.count(d) for d in range(3)], dtype=np.float64)
        shares.append(counts / counts.sum() if counts.sum() else counts)
    want = np.mean(shares, 0)
    got = _bars(ax)
    assert got.keys() == {"x0", "x1", "x2"}
    np.testing.assert_allclose([got[f"x{d}"] for d in range(3)], want, rtol=0, atol=1e-12)
    lo, hi = np.quantile(np.asarray(shares), [0.05, 0.95], axis=0, method="inverted_cdf")
    imp = tp.feature_importance(post)
    np.testing.assert_allclose(imp["lower"], lo, atol=1e-12)
    np.testing.assert_allclose(imp["upper"], hi, atol=1e-12)


def test_inclusion_probability_is_the_weight_of_the_trees_that_split_on_a_feature(fits):
    post = fits["hard_cls"].posterior_
    t, w = post.trees, post.weights.numpy()
    want = np.zeros(3)
    for q in range(t.n_trees):
        used = {int(t.feature[q, k]) for k in range(int(t.n_nodes[q])) if int(t.status[q, k]) == INTERNAL}
        for d in used:
            want[d] += w[q]
    ax = tp.plot_importance(fits["hard_cls"], metric="inclusion")  # the estimator, not its posterior
    got = _bars(ax)
    np.testing.assert_allclose([got[f"x{d}"] for d in range(3)], want, atol=1e-12)
    assert ax.get_xlabel() == "posterior inclusion probability"
    with pytest.raises(ValueError, match="metric='share'"):
        tp.plot_importance(fits["soft_cls"], metric="inclusion")
    with pytest.raises(ValueError, match="metric must be one of"):
        tp.plot_importance(post, metric="gain")


# ------------------------------------------------------------------ partial dependence
def test_pdp_line_is_the_posterior_mean_partial_dependence(fits, data, tmp_path):
    """Hard trees: the line against ``predict`` (the weighted mixture) averaged over the rows."""
    X, post = data["X"], fits["hard_reg"].posterior_
    ax = tp.plot_pdp(post, X, 0)
    _check_png(ax, tmp_path / "pdp.png")
    (line,) = _lines(ax, "posterior mean")
    grid = np.linspace(X[:, 0].min(), X[:, 0].max(), 20)
    np.testing.assert_allclose(line.get_xdata(), grid, rtol=0, atol=1e-12)
    want = np.array([post.predict(_with(X, 0, v)).mean() for v in grid])
    np.testing.assert_allclose(line.get_ydata(), want, rtol=0, atol=1e-6)


def test_pdp_of_bart_and_its_band_from_the_draws(fits, data):
    """BART: the line against ``latent_draws`` averaged over draws and rows; the band is the
    (0.25, 0.75) quantiles of the per-draw curves."""
    X, post = data["X"], fits["bart_reg"].posterior_
    grid = [0.1, 0.3, 0.5, 0.7, 0.9]
    ax = tp.plot_pdp(post, X, "x0", grid=grid, interval=(0.25, 0.75))
    per_draw = np.stack([post.latent_draws(_with(X, 0, v)).numpy().mean(1) for v in grid], 1)  # [S, G]
    (line,) = _lines(ax, "posterior mean")
    np.testing.assert_allclose(line.get_ydata(), per_draw.mean(0), rtol=0, atol=1e-10)
    np.testing.assert_allclose(line.get_ydata(), [post.predict(_with(X, 0, v)).mean() for v in grid], atol=1e-10)
    lo, hi = np.quantile(per_draw, [0.25, 0.75], axis=0, method="inverted_cdf")
    verts = ax.collections[0].get_paths()[0].vertices
    for g, x in enumerate(grid):
        ys = verts[np.isclose(verts[:, 0], x), 1]
        assert ys.min() == pytest.approx(lo[g], abs=1e-10) and ys.max() == pytest.approx(hi[g], abs=1e-10)
    assert "50% credible band" in [t.get_text() for t in ax.get_legend().get_texts()]


def test_pdp_of_class_probabilities_soft_trees(fits, data):
    X, post = data["X"], fits["soft_cls"].posterior_
    grid = [0.2, 0.5, 0.8]
    ax = tp.plot_pdp(fits["soft_cls"], X, 0, grid=grid)
    (line,) = _lines(ax, "posterior mean")
    want = [post.predict_proba(_with(X, 0, v))[:, 1].mean() for v in grid]
    np.testing.assert_allclose(line.get_ydata(), want, rtol=0, atol=1e-6)
    assert ax.get_ylabel() == "P(y = 1)"


def test_pdp_over_the_levels_of_a_text_column_of_a_frame(coded):
    X, _, est = coded
    ax = tp.plot_pdp(est, X, "color", target_class="yes")
    (line,) = _lines(ax, "posterior mean")
    levels = [t.get_text() for t in ax.get_xticklabels()]
    assert levels == ["blue", "green", "red"]
    want = []
    for level in levels:
        Xv = X.copy()
        Xv["color"] = level
        want.append(est.predict_proba(Xv)[:, list(est.classes_).index("yes")].mean())
    np.testing.assert_allclose(line.get_ydata(), want, rtol=0, atol=1e-6)
    assert want[2] > 0.8 > 0.2 > max(want[:2])  # the rule the data hold: red is "yes"
    # unordered levels: points, no line between them, and a bar of the band per level
    from matplotlib.collections import LineCollection

    assert line.get_linestyle() == "None" and line.get_marker() == "o"
    (bars,) = [c for c in ax.collections if c.get_label().endswith("credible band")]
    assert isinstance(bars, LineCollection) and len(bars.get_segments()) == 3


def test_ice_lines_are_the_rows_posterior_mean_predictions(fits, data, tmp_path):
    X, post = data["X"], fits["hard_reg"].posterior_
    grid = [0.1, 0.4, 0.6, 0.9]
    ax = tp.plot_ice(post, X, 0, grid=grid, n_lines=5)
    _check_png(ax, tmp_path / "ice.png")
    rows = [line for line in ax.get_lines() if line.get_label().startswith("_row ")]
    assert len(rows) == 5
    preds = np.stack([post.predict(_with(X, 0, v)) for v in grid])  # [G, M]
    for line in rows:
        r = int(line.get_label().split()[1])
        np.testing.assert_allclose(line.get_ydata(), preds[:, r], rtol=0, atol=1e-6)
    (mean,) = _lines(ax, "posterior mean")
    np.testing.assert_allclose(mean.get_ydata(), preds.mean(1), atol=1e-6)
    centred = tp.plot_ice(post, X, 0, grid=grid, n_lines=5, centered=True)
    (mean,) = _lines(centred, "posterior mean")
    np.testing.assert_allclose(mean.get_ydata(), preds.mean(1) - preds.mean(1)[0], atol=1e-6)


# ------------------------------------------------------------------ plot_trace
def test_trace_lines_are_the_chains_and_titles_their_rhat(fits, tmp_path):
    post = fits["bart_reg"].posterior_
    axes = tp.plot_trace(post)
    assert len(axes) == 2
    _check_png(axes[0], tmp_path / "trace.png")
    info = post.info
    for ax, key, r in ((axes[0], "sigma", info["rhat_sigma"]), (axes[1], "leaves_mean", info["rhat_leaves"])):
        tr = np.asarray(info["trace"][key])
        for c in range(tr.shape[0]):
            (line,) = _lines(ax, f"chain {c}")
            np.testing.assert_array_equal(line.get_ydata(), tr[c])
        assert f"R-hat {r:.3f}" in ax.get_title()  # leaves: of the draws after the warm-up, as the sampler reports
    mcmc = fits["mcmc_reg"].posterior_
    axes = tp.plot_trace(mcmc, ["log_posterior"], ax=plt.subplots()[1])
    lp = np.asarray(mcmc.info["trace"]["log_posterior"])
    np.testing.assert_array_equal(_lines(axes[0], "chain 1")[0].get_ydata(), lp[1])
    assert f"R-hat {rhat(lp):.3f}" in axes[0].get_title()


def test_trace_refuses_what_the_posterior_does_not_keep(fits):
    with pytest.raises(ValueError, match="sigma applies to BART regression"):
        tp.plot_trace(fits["bart_cls"], ["sigma"])
    with pytest.raises(ValueError, match="per-chain traces"):
        tp.plot_trace(fits["hard_reg"])
    with pytest.raises(ValueError, match="give 2 Axes"):
        tp.plot_trace(fits["bart_reg"], ax=plt.subplots()[1])


# ------------------------------------------------------------------ plot_calibration
def test_reliability_diagram_bins_are_the_histogram_of_predicted_probabilities(fits, data, tmp_path):
    X, y, post = data["X"], data["y"], fits["bart_cls"].posterior_
    axes = tp.plot_calibration(post, X, y)
    _check_png(axes[0], tmp_path / "calibration.png")
    p = post.predict_proba(X)[:, 1]
    counts, edges = np.histogram(p, bins=10, range=(0, 1))
    np.testing.assert_array_equal([r.get_height() for r in axes[1].patches], counts)
    (observed,) = _lines(axes[0], "observed")
    full = counts > 0
    idx = np.clip(np.searchsorted(edges, p, side="right") - 1, 0, 9)
    freq = np.array([np.mean(y[idx == b] == 1) for b in range(10) if full[b]])
    mean_p = np.array([np.mean(p[idx == b]) for b in range(10) if full[b]])
    np.testing.assert_allclose(observed.get_ydata(), freq, atol=1e-12)
    np.testing.assert_allclose(observed.get_xdata(), mean_p, atol=1e-12)


def test_reliability_diagram_of_three_classes_uses_the_top_label(data, tmp_path):
    X = data["X"]
    labels = np.array(["a", "b", "c"])[np.digitize(X[:, 0], [0.33, 0.66])]
    est = _fit(BayesianTreeClassifier, X, labels, method="bart", n_trees=6, n_chains=2, n_samples=30, n_warmup=20)
    proba = est.predict_proba(X)
    axes = tp.plot_calibration(est, X, labels, n_bins=4)
    np.testing.assert_array_equal([r.get_height() for r in axes[1].patches],
                                  np.histogram(proba.max(1), bins=4, range=(0, 1))[0])
    assert axes[1].get_xlabel() == "confidence (largest class probability)"
    ax = tp.plot_tree(est, utility=1)  # the forest of the second utility (class "c") of the last draw
    assert ax.get_title().endswith("utility of class c")


def test_pit_histogram_and_coverage_bart(fits, data):
    stats = pytest.importorskip("scipy.stats")
    X, yr, post = data["X"], data["yr"], fits["bart_reg"].posterior_
    f = post.latent_draws(X).numpy()
    sd = post.sigma.numpy() * post.prior.scale
    pit = stats.norm.cdf(yr[None, :], loc=f, scale=sd[:, None]).mean(0)
    np.testing.assert_allclose(tp.predictive_cdf(post, X, yr), pit, atol=1e-12)
    axes = tp.plot_calibration(fits["bart_reg"], X, yr, n_bins=5)
    heights = [r.get_height() for r in axes[0].patches]
    np.testing.assert_allclose(heights, np.histogram(pit, bins=5, range=(0, 1))[0] * 5 / len(yr), atol=1e-12)
    (cover,) = _lines(axes[1], "empirical coverage")
    levels = np.array([0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95])
    np.testing.assert_allclose(cover.get_xdata(), levels)
    lo, hi = (1 - levels) / 2, (1 + levels) / 2
    np.testing.assert_allclose(cover.get_ydata(), [np.mean((pit >= a) & (pit <= b)) for a, b in zip(lo, hi)])


def test_pit_of_hard_trees_is_the_student_t_mixture(fits, data):
    stats = pytest.importorskip("scipy.stats")
    X, yr, post = data["X"], data["yr"], fits["hard_reg"].posterior_
    rows = post.trees.predict(torch.as_tensor(X, dtype=post.trees.threshold.dtype), post.likelihood).double().numpy()
    cdf = stats.t.cdf(yr[None, :], df=rows[..., 0], loc=rows[..., 1], scale=rows[..., 2])
    want = post.weights.numpy() @ cdf
    np.testing.assert_allclose(tp.predictive_cdf(post, X, yr), want, atol=1e-9)
    with pytest.raises(ValueError, match="applies to regression"):
        tp.predictive_cdf(fits["hard_cls"], X, data["y"])


# ------------------------------------------------------------------ plot_evidence
def test_evidence_lines_are_the_search_curves(fits, tmp_path):
    est = fits["hard_reg"]
    rec = est.posterior_.info["hyper_search"]
    axes = tp.plot_evidence(est.posterior_)
    assert len(axes) == len(rec["curves"]) == 2
    _check_png(axes[0], tmp_path / "evidence.png")
    for ax, (name, curve) in zip(axes, rec["curves"].items()):
        (line,) = _lines(ax, "log evidence")
        np.testing.assert_allclose(line.get_xdata(), [v for v, _ in curve])
        np.testing.assert_allclose(line.get_ydata(), [z for _, z in curve])
        (chosen,) = [ln for ln in ax.get_lines() if ln.get_label().startswith("chosen")]
        assert chosen.get_xdata()[0] == pytest.approx(rec["chosen"][name])
    same = tp.plot_evidence(est.hyper_search_)  # the estimator's record draws the same curves
    np.testing.assert_allclose(_lines(same[1], "log evidence")[0].get_ydata(), [z for _, z in rec["curves"]["beta_split"]])
    with pytest.raises(ValueError, match="hyperparameter search"):
        tp.plot_evidence(fits["bart_reg"])


# ------------------------------------------------------------------ inputs and the optional dependency
def test_unfitted_estimator_and_other_objects_are_refused():
    with pytest.raises(ValueError, match="not fitted"):
        tp.plot_importance(BayesianTreeRegressor())
    with pytest.raises(TypeError, match="torchtree posterior"):
        tp.plot_importance(object())


def test_missing_matplotlib_says_how_to_install_it(fits, monkeypatch):
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # "import matplotlib" now raises ImportError
    for call in (lambda: tp.plot_importance(fits["hard_cls"]), lambda: tp.write_plots(fits["hard_cls"], "unused")):
        with pytest.raises(ImportError, match=r"pip install matplotlib"):
            call()


def test_matplotlib_is_imported_only_inside_functions():
    """``import torchtree.plot`` must work without matplotlib: no module-level matplotlib import."""
    for path in (ROOT / "torchtree" / "plot").glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in tree.body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                assert not any(n.split(".")[0] == "matplotlib" for n in names), f"{path.name} imports matplotlib at module level"


# ------------------------------------------------------------------ write_plots and the command line
def _csv(path: Path, X, y, names=("a", "b", "c", "y")) -> Path:
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(names)
        w.writerows([[*np.round(x, 5), v] for x, v in zip(X, y)])
    return path


def _valid_png(path: Path) -> bool:
    return path.read_bytes()[:8] == PNG_SIGNATURE and matplotlib.image.imread(path).shape[0] > 100


@pytest.mark.filterwarnings("ignore:MCMC chains look unconverged")
def test_cli_report_writes_every_applicable_plot(data, tmp_path, capsys):
    reg = _csv(tmp_path / "reg.csv", data["X"], np.round(data["yr"], 5))
    post = tmp_path / "reg.pt"
    assert main(["fit", str(reg), "--out", str(post), "--method", "mcmc", "--n-chains", "2", "--n-samples", "30",
                 "--n-warmup", "30", "--test-size", "0", "--quiet"]) == 0
    capsys.readouterr()
    out_dir = tmp_path / "plots"
    assert main(["report", str(post), "--plots", str(out_dir), "--data", str(reg)]) == 0
    out = capsys.readouterr().out
    wrote = [line.split()[1].rstrip(":") for line in out.splitlines() if line.startswith("wrote ")]
    names = {"tree", "importance", "trace", "evidence", "pdp", "ice", "calibration"}
    assert sorted(Path(p).stem for p in wrote) == sorted(names)
    assert sorted(p.stem for p in out_dir.iterdir()) == sorted(names)
    assert all(_valid_png(Path(p)) for p in wrote)
    assert "MAP tree" in out  # the summary comes first
    # without data: the plots that need none, and a word on the others
    assert main(["report", str(post), "--plots", str(tmp_path / "bare")]) == 0
    cap = capsys.readouterr()
    assert sorted(p.stem for p in (tmp_path / "bare").iterdir()) == ["evidence", "importance", "trace", "tree"]
    assert "skipped pdp, ice, calibration: they need --data CSV" in cap.err
    # user errors exit 2
    assert main(["report", str(post), "--plots", str(reg)]) == 2
    assert main(["report", str(post), "--data", str(reg)]) == 2
    assert "--data applies with --plots" in capsys.readouterr().err


def test_write_plots_of_a_soft_classifier_says_what_it_skipped(fits, data, tmp_path):
    written, skipped = tp.write_plots(fits["soft_cls"], str(tmp_path / "soft"), data["X"], data["y"])
    assert sorted(Path(p).stem for p, _ in written) == ["calibration", "ice", "importance", "pdp", "tree"]
    assert all(_valid_png(Path(p)) for p, _ in written)
    why = dict(skipped)
    assert set(why) == {"trace", "evidence"} and "per-chain traces" in why["trace"]


def test_report_help_page(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["report", "--help"])
    assert exit_.value.code == 0
    text = capsys.readouterr().out
    assert "--plots DIR" in text and "--data DATA.csv" in text and "pip install matplotlib" in text
