"""What the plots say: feature names, discrete features, probability axes, refusals (a QA pass)."""
from __future__ import annotations

import csv

import numpy as np
import pytest
import torch

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

import torchtree.plot as tp  # noqa: E402
from torchtree import BayesianTreeClassifier  # noqa: E402
from torchtree.cli import main  # noqa: E402
from torchtree.soft import DCC, SoftTreePosterior  # noqa: E402


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


@pytest.fixture(scope="module")
def table():
    """Column 0 continuous (the signal), column 1 takes the values 1, 2, 3, column 2 is constant."""
    rng = np.random.default_rng(3)
    X = np.column_stack([rng.uniform(size=120), rng.integers(1, 4, 120).astype(float), np.full(120, 7.0)])
    y = (X[:, 0] > 0.5).astype(int)
    clf = BayesianTreeClassifier(n_particles=40, random_state=0, hyper="fixed").fit(X, y)
    return X, y, clf


def test_feature_names_label_partial_dependence_ice_and_written_plots(table, tmp_path):
    X, _, clf = table
    names = ["dose", "grade", "site"]
    ax = tp.plot_pdp(clf, X, "dose", feature_names=names)
    assert ax.get_title() == "Partial dependence on dose" and ax.get_xlabel() == "dose"
    assert tp.plot_ice(clf, X, 1, feature_names=names, n_lines=5).get_title() == "ICE curves of grade (5 rows)"
    with pytest.raises(ValueError, match="feature_names has 2 names; the posterior takes 3 input columns"):
        tp.plot_pdp(clf, X, 0, feature_names=names[:2])
    written, _ = tp.write_plots(clf, str(tmp_path / "plots"), X, feature_names=names)
    assert dict((p.rsplit("/", 1)[1], w) for p, w in written)["pdp.png"].startswith("partial dependence on dose")
    with pytest.raises(ValueError, match="feature 'nope' is not one of the features"):
        tp.write_plots(clf, str(tmp_path / "plots"), X, feature="nope", feature_names=names)


def test_a_feature_of_few_values_is_drawn_at_its_values_and_a_constant_one_as_a_point(table):
    X, _, clf = table
    ax = tp.plot_pdp(clf, X, 1)
    (mean,) = [ln for ln in ax.get_lines() if ln.get_label() == "posterior mean"]
    assert mean.get_linestyle() == "None" and mean.get_marker() == "o"
    assert list(mean.get_xdata()) == [1.0, 2.0, 3.0] and [t.get_text() for t in ax.get_xticklabels()] == ["1", "2", "3"]
    rows = [ln for ln in tp.plot_ice(clf, X, 1, n_lines=4).get_lines() if ln.get_label().startswith("_row ")]
    assert len(rows) == 4 and all(ln.get_linestyle() == "None" for ln in rows)
    ax = tp.plot_pdp(clf, X, 2)  # one value: a point, not an empty axes
    (mean,) = [ln for ln in ax.get_lines() if ln.get_label() == "posterior mean"]
    assert list(mean.get_xdata()) == [7.0] and mean.get_marker() == "o"
    # a continuous feature keeps its line
    (mean,) = [ln for ln in tp.plot_pdp(clf, X, 0).get_lines() if ln.get_label() == "posterior mean"]
    assert mean.get_linestyle() == "-" and len(mean.get_xdata()) == 20


def test_calibration_refuses_labels_not_seen_in_training_and_shows_whole_markers(table):
    X, y, clf = table
    with pytest.raises(ValueError, match=r"y holds label\(s\) \['7'\] not seen in training \(classes: \[0, 1\]\)"):
        tp.plot_calibration(clf, X[:5], np.full(5, 7))
    a, _ = tp.plot_calibration(clf, X, y)
    lo, hi = a.get_xlim()
    assert lo < 0 and hi > 1  # markers at 0 and 1 are drawn whole
    assert {"calibrated", "observed"} <= {t.get_text() for t in a.get_legend().get_texts()}


def test_soft_tree_posteriors_keep_their_feature_names_through_save_and_load(tmp_path):
    g = torch.Generator().manual_seed(0)
    X = torch.rand(40, 2, generator=g)
    y = (X[:, 0] > 0.5).long()
    post = DCC(n_iterations=1, n_initial=4, n_chains=2, n_samples=4, n_warmup=8, max_depth=1).run((X, y), seed=0)
    post.feature_names = ["dose", "grade"]
    post.save(str(tmp_path / "soft.pt"))
    back = SoftTreePosterior.load(str(tmp_path / "soft.pt"))
    assert back.feature_names == ["dose", "grade"]
    assert "dose" in back.to_dot() or "grade" in back.to_dot()
    assert tp.plot_pdp(back, X.numpy(), 0).get_xlabel() == "dose"


def test_report_takes_the_csv_header_when_the_posterior_has_no_names(table, tmp_path, capsys):
    X, y, clf = table
    clf.posterior_.save(str(tmp_path / "post.pt"))  # fitted on an array: no names kept
    path = tmp_path / "rows.csv"
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["dose", "grade", "site", "y"])
        w.writerows([list(r) + [int(t)] for r, t in zip(X.tolist(), y.tolist())])
    assert main(["report", str(tmp_path / "post.pt"), "--plots", str(tmp_path / "plots"), "--data", str(path)]) == 0
    out = capsys.readouterr().out
    assert "pdp.png: partial dependence on dose (the feature the prediction moves most with)" in out


def test_arguments_that_do_not_apply_are_refused_not_ignored(table):
    X, y, clf = table
    with pytest.raises(ValueError, match="tree= and utility= pick a tree of a BART draw"):
        tp.plot_tree(clf, tree=3)
    rng = np.random.default_rng(0)
    from torchtree import BayesianTreeRegressor

    reg = BayesianTreeRegressor(n_particles=30, random_state=0, hyper="fixed").fit(X, X[:, 0] + 0.1 * rng.normal(size=len(X)))
    with pytest.raises(ValueError, match="target_class applies to classification"):
        tp.plot_pdp(reg, X, 0, target_class=1)
    with pytest.raises(ValueError, match="target_class applies to classification"):
        tp.plot_calibration(reg, X, X[:, 0], target_class=1)


def test_a_bart_tree_says_what_its_leaf_values_add_up_to():
    from torchtree import BayesianTreeRegressor
    from torchtree.plot.tree import tree_drawing

    rng = np.random.default_rng(0)
    X = rng.random((100, 2))
    reg = BayesianTreeRegressor(method="bart", n_trees=5, n_samples=10, n_warmup=10, random_state=0).fit(X, 3 + X[:, 0])
    title = tree_drawing(reg).title
    assert title.startswith("tree 0 of draw ") and f"y = {reg.posterior_.prior.offset:.4g} + the sum of 5 trees'" in title


def test_bart_inclusion_intervals_count_correlated_draws_by_their_ess():
    """A BART inclusion value is the mean share of a forest's trees that split on the feature (counted
    by brute force here); its interval ``value -+ z sd / sqrt(ESS)`` uses the shares' multi-chain ESS, not
    the number of draws: with autocorrelated sweeps it is wider than the draws-as-independent interval."""
    from scipy.stats import norm

    from torchtree import BayesianTreeRegressor
    from torchtree.model.diagnostics import chain_ess
    from torchtree.plot.effects import feature_importance

    rng = np.random.default_rng(1)
    X = rng.random((150, 4))
    reg = BayesianTreeRegressor(method="bart", n_trees=3, n_chains=2, n_samples=60, n_warmup=20,
                                random_state=0).fit(X, X[:, 0] + 0.3 * rng.normal(size=150))
    post = reg.posterior_
    imp = feature_importance(post, "inclusion")
    per, chains = imp["per_draw"], post.chain_of.numpy()
    S = per.shape[0]
    feat = post.feature.numpy()  # [S, T, K]: -1 at leaves and unused slots
    brute = np.array([[np.mean([d in set(feat[s, t][feat[s, t] >= 0].tolist()) for t in range(feat.shape[1])])
                       for d in range(4)] for s in range(S)])
    np.testing.assert_allclose(per, brute, rtol=0, atol=1e-12)
    z = norm.ppf(0.95)
    checked = 0
    for d in range(per.shape[1]):
        if per[:, d].min() == per[:, d].max():
            continue
        ess = min(max(chain_ess(np.stack([per[chains == c, d] for c in np.unique(chains)])), 1.0), S)
        half = z * per[:, d].std() / np.sqrt(ess)
        v = imp["value"][d]
        assert imp["lower"][d] == pytest.approx(max(v - half, 0.0)) and imp["upper"][d] == pytest.approx(min(v + half, 1.0))
        assert half >= z * per[:, d].std() / np.sqrt(S) - 1e-12
        checked += 1
    assert checked >= 1
    assert "Monte Carlo" in tp.plot_importance(post, metric="inclusion").get_title()


def test_deep_trees_are_drawn_down_to_a_depth_with_their_leaf_counts(tmp_path):
    from torchtree.datasets import load_table
    from torchtree.plot.tree import tree_drawing

    t = load_table("pima_diabetes")
    clf = BayesianTreeClassifier(n_particles=40, random_state=0, hyper="fixed").fit(t.X, t.y)
    full = tree_drawing(clf)
    assert len(full.leaves) > 8  # a deep MAP tree
    top = tree_drawing(clf, max_depth=2)
    cut = [n for n in top.leaves if "leaves below" in top.labels[n]]
    assert cut and len(top.leaves) <= 4 and "collapsed" in top.title
    below = sum(int(top.labels[n].rsplit("... ", 1)[1].split()[0]) for n in cut)
    assert below + len(top.leaves) - len(cut) == len(full.leaves)  # every leaf accounted for
    assert tree_drawing(clf, max_depth=50).labels == full.labels
    with pytest.raises(ValueError, match="max_depth must be >= 0"):
        tree_drawing(clf, max_depth=-1)
    written, _ = tp.write_plots(clf, str(tmp_path / "plots"))
    what = dict((p.rsplit("/", 1)[1], w) for p, w in written)["tree.png"]
    assert what.startswith("the MAP tree, down to depth ")


def test_partial_dependence_importance_is_the_data_weighted_spread_of_the_partial_dependence():
    """Against a brute-force reference from the estimator's own predict (every draw, every row):
    the standard deviation of PD_j(x_j) over n_points inverted-CDF quantiles of x_j (numeric) or the
    levels by frequency (text). Tolerance 1e-9."""
    import pandas as pd
    from torchtree import BayesianTreeRegressor
    rng = np.random.default_rng(5)
    n = 150
    frame = pd.DataFrame({"u": rng.uniform(size=n), "g": rng.choice(["a", "b", "c"], n, p=[0.6, 0.3, 0.1]),
                          "w": rng.normal(size=n)})
    y = 2.0 * (frame["u"] > 0.4) + frame["g"].map({"a": 0.0, "b": 1.0, "c": 3.0}) + 0.1 * rng.normal(size=n)
    reg = BayesianTreeRegressor(n_particles=30, random_state=0, hyper="fixed").fit(frame, y.to_numpy())
    got = tp.partial_dependence_importance(reg, frame, n_points=7, max_draws=None, max_rows=None)
    assert list(got["names"]) == ["u", "g", "w"]

    def spread(values, weights, j):
        pdv = []
        for v in values:
            f = frame.copy()
            f[f.columns[j]] = v
            pdv.append(reg.predict(f).mean())
        pdv, w = np.asarray(pdv), np.asarray(weights, float) / np.sum(weights)
        return np.sqrt(w @ (pdv - w @ pdv) ** 2)

    q = (np.arange(7) + 0.5) / 7
    for j in (0, 2):
        vals, counts = np.unique(np.quantile(frame.iloc[:, j], q, method="inverted_cdf"), return_counts=True)
        assert abs(got["value"][j] - spread(vals, counts, j)) < 1e-9
    levels, counts = np.unique(frame["g"], return_counts=True)
    assert abs(got["value"][1] - spread(levels, counts, 1)) < 1e-9
    assert got["value"][2] < min(got["value"][:2])  # w is noise


def test_write_plots_draws_the_feature_the_prediction_moves_most_with(tmp_path):
    """A binary feature with one large effect, split once per tree, against a numeric one with a
    small effect that the trees split on often: the split share ranks the numeric one first, the
    partial-dependence spread the binary one, which write_plots then draws."""
    rng = np.random.default_rng(11)
    n = 400
    X = np.column_stack([rng.integers(0, 2, n).astype(float), rng.uniform(size=n)])
    y = 4.0 * X[:, 0] + np.sin(12 * X[:, 1]) * 0.6 + 0.1 * rng.normal(size=n)
    from torchtree import BayesianTreeRegressor
    reg = BayesianTreeRegressor(n_particles=50, random_state=0, hyper="fixed").fit(X, y)
    share = tp.feature_importance(reg)["value"]
    spread = tp.partial_dependence_importance(reg, X)["value"]
    assert share[1] > share[0] and spread[0] > spread[1]
    written, _ = tp.write_plots(reg, str(tmp_path), X, feature_names=["treated", "dose"])
    what = dict(written)
    assert "partial dependence on treated (the feature the prediction moves most with)" in what[str(tmp_path / "pdp.png")]


def test_partial_dependence_has_a_point_at_missing_where_the_rows_miss_the_feature():
    """The "missing" point is the rows' mean prediction with the feature missing in every row
    (against the estimator's predict_proba, every draw and row; tolerance 1e-9), drawn right of the
    grid on a tick naming the share of rows missing it; a feature without missing cells has none."""
    import pandas as pd
    rng = np.random.default_rng(2)
    n = 200
    age = rng.uniform(0, 80, n)
    y = ((age < 15) | (rng.uniform(size=n) < 0.3)).astype(int)
    age[rng.uniform(size=n) < 0.25] = np.nan
    frame = pd.DataFrame({"age": age, "fare": rng.exponential(30, n)})
    clf = BayesianTreeClassifier(n_particles=30, random_state=0, hyper="fixed").fit(frame, y)
    got = tp.partial_dependence(clf, frame, "age", max_draws=None, max_rows=None)
    m = got["missing"]
    assert m is not None and abs(m["share"] - np.isnan(age).mean()) < 1e-12
    ref = clf.predict_proba(frame.assign(age=np.nan))[:, 1].mean()
    assert abs(m["mean"] - ref) < 1e-9 and m["draws"].shape == got["weights"].shape
    assert tp.partial_dependence(clf, frame, "fare")["missing"] is None
    ax = tp.plot_pdp(clf, frame, "age")
    assert any(line.get_label() == "feature missing" for line in ax.get_lines())
    assert ax.get_xticklabels()[-1].get_text() == f"missing\n{100 * np.isnan(age).mean():.0f}%"


def test_regression_calibration_reads_the_pit_of_a_seeded_subset_of_rows():
    """The PIT costs about a millisecond per row (every tree's predictive): at most max_rows rows,
    drawn with the seed, and the title says so; the histogram is exactly that subset's."""
    from torchtree import BayesianTreeRegressor
    rng = np.random.default_rng(0)
    X = rng.normal(size=(300, 2))
    y = X[:, 0] + rng.normal(size=300)
    reg = BayesianTreeRegressor(n_particles=30, random_state=0, hyper="fixed").fit(X, y)
    a, _ = tp.plot_calibration(reg, X, y, max_rows=100, seed=3)
    assert a.get_title() == "PIT histogram (100 rows of 300)"
    rows = np.sort(np.random.default_rng(3).choice(300, 100, replace=False))
    counts = np.histogram(tp.predictive_cdf(reg, X[rows], y[rows]), np.linspace(0, 1, 11))[0]
    np.testing.assert_allclose([p.get_height() for p in a.patches], counts * 10 / 100)


def test_a_frame_in_another_column_order_labels_the_plots_in_the_training_order(tmp_path):
    """write_plots labelled the MAP tree's rules and the importance bars with the names of X's columns in X's order,
    while the values are in the training order: a reordered frame (read by name everywhere) put each bar under
    another column's name (a QA pass as an analyst)."""
    import pandas as pd

    from torchtree import BayesianTreeRegressor
    from torchtree.plot.common import input_names, training_names

    rng = np.random.default_rng(0)
    df = pd.DataFrame({"ä b": rng.normal(size=120), "colour": rng.normal(size=120), "β": rng.normal(size=120)})
    y = 3 * df["β"].to_numpy() + 0.1 * rng.normal(size=120)
    est = BayesianTreeRegressor(n_particles=40, n_islands=1, random_state=0).fit(df, y)
    shuffled = df[["β", "ä b", "colour"]]
    assert training_names(est.posterior_, shuffled) == ["ä b", "colour", "β"]
    assert input_names(est.posterior_, shuffled) == ["β", "ä b", "colour"]  # partial dependence indexes X's order
    ax = tp.plot_importance(est, feature_names=training_names(est.posterior_, shuffled))
    labels = [t.get_text() for t in ax.get_yticklabels()]
    share = tp.feature_importance(est)["value"]
    assert labels[int(np.argmax([share[["ä b", "colour", "β"].index(n)] for n in labels]))] == "β"
    files, _ = tp.write_plots(est, tmp_path, shuffled, y)
    from pathlib import Path
    assert {Path(f).stem for f, _ in files} >= {"tree", "importance"}


def test_a_printed_cut_reads_back_to_the_stored_cut():
    """Cuts were printed with six significant digits: a cut at 1,600,000,382.55 on Unix seconds read
    `x0 <= 1.6e+09`, and routing the training rows by the printed rule sent 37.5% of them the other way."""
    from torchtree.model.encoding import cut_text

    for v in (1600000382.55, 0.1 + 0.2, 1e-300, -2.5, 1234567.0, 0.5022480487823486):
        assert float(cut_text(v)) == v or np.float32(float(cut_text(v))) == np.float32(v)
    assert cut_text(0.25) == "0.25" and cut_text(1600000382.55) == "1600000382.55"
    assert cut_text(float(np.float32(0.502248))) == "0.502248"  # a float32 cut keeps its short form
    rng = np.random.default_rng(1)
    X = np.c_[1.6e9 + rng.uniform(0, 1000, 200), rng.uniform(size=200)]
    y = (X[:, 0] > 1.6e9 + 500).astype(int)
    clf = BayesianTreeClassifier(n_particles=30, random_state=0).fit(X, y)
    t = clf.posterior_.trees
    i = int(torch.argmax(clf.posterior_.weights))
    root_cut = float(t.threshold[i, 0])
    rule = [ln for ln in clf.posterior_.to_dot().splitlines() if " <= " in ln][0]
    printed = float(rule.split(" <= ")[1].split('"')[0])
    assert np.array_equal(X[:, 0] <= printed, X[:, 0] <= root_cut)


def test_write_plots_refuses_a_feature_out_of_range_before_writing(tmp_path, table):
    """feature=9 of a 3-column table raised a bare IndexError after tree.png, importance.png and the other plots
    were written."""
    X, y, clf = table
    for bad in (9, -1, True, 0.7):
        with pytest.raises(ValueError, match=r"feature must be a column name or an index in 0\.\.2"):
            tp.write_plots(clf, tmp_path / "p", X, y, feature=bad)
    assert not (tmp_path / "p").exists() or not any((tmp_path / "p").iterdir())


@pytest.mark.parametrize("task", ["classification", "regression"])
def test_a_soft_tree_drawing_shows_its_leaves_values(task):
    """plot_tree's docstring promises leaf values or class probabilities; a DCC topology's leaves read only
    `leaf 3 (depth 2)` (a QA pass)."""
    from torchtree.plot.tree import tree_drawing

    g = torch.Generator().manual_seed(0)
    X = torch.rand(40, 2, generator=g)
    y = (X[:, 0] > 0.5).long() if task == "classification" else 3 * X[:, 0]
    post = DCC(n_iterations=1, n_initial=4, n_chains=2, n_samples=4, n_warmup=8, max_depth=1).run((X, y), seed=0)
    i = int(torch.argmax(post.weights))
    leaves = post.gates(i)["leaves"]
    d = tree_drawing(post)
    for leaf, value in leaves.items():
        text = d.labels[leaf]
        if task == "classification":
            shown = [float(v) for v in text.split("p=[")[1].rstrip("]").split(", ")]
            assert np.allclose(shown, value.numpy(), atol=0.005) and abs(sum(shown) - 1) < 0.02
        else:
            assert float(text.split("mean ")[1]) == pytest.approx(float(value), rel=1e-3)


def test_partial_dependence_on_an_ordered_category_keeps_its_declared_order():
    """An ordered pandas categorical (low < medium < high) was laid out alphabetically (high, low, medium)."""
    import pandas as pd

    from torchtree import BayesianTreeRegressor

    rng = np.random.default_rng(0)
    k = pd.Categorical(rng.choice(["low", "medium", "high"], 150), categories=["low", "medium", "high"], ordered=True)
    df = pd.DataFrame({"k": k, "x": rng.normal(size=150)})
    y = np.asarray(k.codes, float) + 0.1 * rng.normal(size=150)
    est = BayesianTreeRegressor(n_particles=30, n_islands=1, random_state=0).fit(df, y)
    pdp = tp.partial_dependence(est, df, "k")
    assert list(pdp["grid"]) == ["low", "medium", "high"] and np.all(np.diff(pdp["mean"]) > 0.5)
    plain = df.assign(k=df["k"].astype(str).astype("category"))  # unordered: the levels sorted as before
    est2 = BayesianTreeRegressor(n_particles=30, n_islands=1, random_state=0).fit(plain, y)
    assert list(tp.partial_dependence(est2, plain, "k")["grid"]) == ["high", "low", "medium"]


def test_partial_dependence_names_an_empty_grid_and_zero_rows(table):
    """grid=[] and grid_size=0 said "X has zero rows: 0 sample(s)", max_rows=0 "the feature has no observed
    values": none named the argument at fault."""
    X, _, clf = table
    with pytest.raises(ValueError, match="grid is empty"):
        tp.partial_dependence(clf, X, 0, grid=[])
    with pytest.raises(ValueError, match="grid_size must be >= 1, got 0"):
        tp.partial_dependence(clf, X, 0, grid_size=0)
    with pytest.raises(ValueError, match="max_rows must be >= 1, got 0"):
        tp.partial_dependence(clf, X, 0, max_rows=0)


def test_a_long_tree_title_is_wrapped_to_the_figure():
    """BART's tree title (the offset, the number of trees, the class utility) ran past a small tree's figure and was
    cut off in write_plots' tree.png."""
    import torchtree
    from torchtree import BART

    rng = np.random.default_rng(0)
    X = rng.normal(size=(60, 2))
    post = BART(n_trees=200, n_chains=1, n_samples=2, n_warmup=2, alpha_split=1e-6).run(torchtree.Data(X, X[:, 0], task="regression"), seed=0)
    ax = tp.plot_tree(post)
    fig_chars = ax.figure.get_size_inches()[0] * 72 / (0.6 * 9.0)
    assert "\n" in ax.get_title() and max(len(ln) for ln in ax.get_title().split("\n")) <= max(30, fig_chars)
