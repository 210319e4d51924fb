"""Missing values (MIA) and categorical subset splits against exact answers on tiny tables.

The exact answers come from :func:`torchtree.testing.exact_table`, which enumerates trees on the
raw table with the missing-value and subset rules written from their definitions (not through
:class:`~torchtree.model.encoding.TableEncoder`). Each sampler's evidence / predictive must agree
within the stated Monte Carlo tolerance; a planted defect (sides not drawn 1/2 each, subsets not
uniform over the node's partitions, a wrong "is missing" mass) moves the exact answers by more.
"""
import numpy as np
import pandas as pd
import pytest
import torch

import torchtree as tt
from torchtree.model.encoding import TableEncoder
from torchtree.model.trees import INTERNAL
from torchtree import MCMC, SMCSampler, TopDownSMC
from torchtree.testing import exact_log_evidence, exact_predictive, exact_table

NAN = float("nan")
pytestmark = pytest.mark.filterwarnings("ignore:MCMC chains look unconverged")  # short runs, compared draw for draw


def tiny_table():
    """8 rows: a numeric column with 3 missing cells (missing rows mostly class 1), a 3-level
    categorical (level 'b' mostly class 1), a numeric column with no missing value."""
    X = np.array([[0.1, "a", 1.0], [NAN, "b", 0.2], [0.4, "c", 0.9], [NAN, "b", 0.1], [0.7, "a", 0.8],
                  [0.2, "c", 0.3], [NAN, "a", 0.5], [0.9, "b", 0.6]], dtype=object)
    y = np.array([0, 1, 0, 1, 1, 0, 1, 1])
    return X, y


XQ = np.array([[0.5, "a", 0.5], [NAN, "c", 0.8], [0.15, "b", 0.2], [NAN, "zz", NAN]], dtype=object)


def frame(X):
    return pd.DataFrame({"x": pd.array([NAN if v != v else float(v) for v in X[:, 0]], dtype="float64"),
                         "c": pd.Series(X[:, 1], dtype=object), "z": X[:, 2].astype(float)})


def log_mean_exp(v):
    v = np.asarray(v)
    return float(np.log(np.mean(np.exp(v - v.max()))) + v.max())


def test_exact_table_matches_the_numeric_enumerator_on_a_numeric_table():
    """Without missing values or categories, the table enumerator is the numeric one."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(7, 2))
    y = (X[:, 0] > 0).astype(int)
    prior, lik = tt.ChipmanPrior(0.95, 0.5), tt.DirichletMultinomial(2.0)
    data = tt.Data(X, y)
    ev, _ = exact_table(X.astype(object), y, prior, lik, (), 2)
    assert ev == pytest.approx(exact_log_evidence(data, prior, lik), abs=1e-6)  # Data keeps X in float32
    Xq = rng.normal(size=(3, 2))
    _, pred = exact_table(X.astype(object), y, prior, lik, (), 2, Xq.astype(object))
    assert np.allclose(pred, exact_predictive(data, prior, lik, Xq), atol=1e-6)


def test_encoder_codes_sides_and_subsets():
    """The coded columns: two MIA copies with stand-ins at max + delta and min - delta (delta the mean
    gap), 2^(L-1) - 1 = 3 subset indicators for L = 3 levels, the numeric column as is."""
    X, y = tiny_table()
    enc = TableEncoder.fit(frame(X), y)
    Z = enc.transform(frame(X))
    assert enc.n_columns == 2 + 3 + 1 and list(enc.groups) == [0, 0, 1, 1, 1, 2]
    delta = (0.9 - 0.1) / 4  # 5 observed values, 4 gaps
    assert Z[1, 0] == pytest.approx(0.9 + delta) and Z[1, 1] == pytest.approx(0.1 - delta)
    # subsets containing level 'a': {a}, {a, b}, {a, c}; value 0 inside the subset
    assert Z[0, 2:5].tolist() == [0, 0, 0] and Z[1, 2:5].tolist() == [1, 0, 1] and Z[2, 2:5].tolist() == [1, 1, 0]
    assert enc.describe(0, 0.95) == "x is not missing" and enc.describe(1, 0.0) == "x is missing"
    assert enc.describe(3, 0.5) == "c in {a, b}"


@pytest.mark.slow
@pytest.mark.parametrize("proposal", ["prior", "optimal"])
def test_topdown_evidence_and_predictive_match_exact(proposal):
    """12 runs x 300 particles: log mean evidence within 0.08 and mean predictive within 0.03 of exact
    enumeration (numbers as for numeric tables, tests/test_topdown.py)."""
    X, y = tiny_table()
    prior, lik = tt.ChipmanPrior(0.95, 0.5), tt.DirichletMultinomial(2.0)
    exact, exact_pred = exact_table(X, y, prior, lik, (1,), 2, XQ)
    data = tt.Data(frame(X), y)
    ests, preds = [], []
    for s in range(12):
        post = TopDownSMC(prior, lik, n_particles=300, proposal=proposal).run(data, seed=s)
        ests.append(post.log_evidence)
        preds.append(post.predict_proba(frame(XQ)))
    assert abs(log_mean_exp(ests) - exact) < 0.08, (log_mean_exp(ests), exact)
    assert np.abs(np.mean(preds, 0) - exact_pred).max() < 0.03


def test_planted_defects_move_the_exact_answer():
    """The tolerance above can fail: the exact evidence changes by more than 0.08 when the missing
    rows are imputed (median) or the categories one-hot coded (different models)."""
    X, y = tiny_table()
    prior, lik = tt.ChipmanPrior(0.95, 0.5), tt.DirichletMultinomial(2.0)
    exact, _ = exact_table(X, y, prior, lik, (1,), 2)
    Xi = X.copy()
    Xi[:, 0] = [0.4 if v != v else v for v in X[:, 0]]
    imputed, _ = exact_table(Xi, y, prior, lik, (1,), 2)
    onehot = np.column_stack([Xi[:, 0], X[:, 1] == "a", X[:, 1] == "b", X[:, 1] == "c", X[:, 2]]).astype(float)
    oh = exact_log_evidence(tt.Data(onehot, y), prior, lik)
    assert abs(imputed - exact) > 0.08 and abs(oh - exact) > 0.08


@pytest.mark.slow
def test_mcmc_predictive_matches_exact():
    """300 chains x 150 kept draws: predictive within 0.03 of exact enumeration."""
    X, y = tiny_table()
    prior, lik = tt.ChipmanPrior(0.95, 0.5), tt.DirichletMultinomial(2.0)
    _, exact_pred = exact_table(X, y, prior, lik, (1,), 2, XQ)
    post = MCMC(prior, lik, n_chains=300, n_warmup=100, n_samples=150).run(tt.Data(frame(X), y), seed=1)
    assert np.abs(post.predict_proba(frame(XQ)) - exact_pred).max() < 0.03


@pytest.mark.slow
def test_smc_moves_evidence_and_predictive_match_exact():
    """4000 particles, resample-move: log evidence within 0.1, predictive within 0.025 of exact."""
    X, y = tiny_table()
    prior, lik = tt.ChipmanPrior(0.95, 0.5), tt.DirichletMultinomial(2.0)
    exact, exact_pred = exact_table(X, y, prior, lik, (1,), 2, XQ)
    post = SMCSampler(prior, lik, n_particles=4000, n_iterations=10, mh_step=True).run(tt.Data(frame(X), y), seed=0)
    assert abs(post.log_evidence - exact) < 0.1
    assert np.abs(post.predict_proba(frame(XQ)) - exact_pred).max() < 0.025


def test_regression_topdown_matches_exact():
    """Regression with missing values and a categorical: 8 runs x 300 particles (optimal proposal),
    evidence within 0.1 and predictive means within 0.1 of exact (targets sd ~1)."""
    X, _ = tiny_table()
    y = np.array([0.1, 1.2, -0.3, 1.0, 0.8, -0.2, 1.1, 0.9])
    prior = tt.ChipmanPrior(0.95, 0.5)
    lik = tt.NormalInverseGamma.default_for(torch.as_tensor(y))
    exact, mean = exact_table(X, y, prior, lik, (1,), None, XQ)
    data = tt.Data(frame(X), y, task="regression")
    ests, preds = [], []
    for s in range(8):
        post = TopDownSMC(prior, lik, n_particles=300, proposal="optimal").run(data, seed=s)
        ests.append(post.log_evidence)
        preds.append(post.predict(frame(XQ)))
    assert abs(log_mean_exp(ests) - exact) < 0.1
    assert np.abs(np.mean(preds, 0) - mean[:, 0]).max() < 0.1


def test_prior_only_mcmc_draws_sides_and_subsets_uniformly():
    """Labels ignored, 4000 chains from prior draws, 20 iterations: among root splits on the categorical,
    the three partitions of its levels are equally likely, and among root splits on x with its
    missing rows on one side, both sides are equally likely (chi-square, alpha = 1e-3)."""
    from scipy.stats import chisquare

    X, y = tiny_table()
    data = tt.Data(frame(X), y)
    post = MCMC(tt.ChipmanPrior(0.95, 0.5), tt.DirichletMultinomial(2.0), n_chains=4000, n_warmup=19,
                n_samples=1, init="prior", use_likelihood=False).run(data, seed=3)
    t = post.trees
    f = t.feature[:, 0].long().numpy()
    internal = (t.status[:, 0] == INTERNAL).numpy()
    w = post.weights.numpy() * post.n_particles  # counts of each distinct tree
    cat = [float(w[(f == c) & internal].sum()) for c in (2, 3, 4)]
    assert chisquare(cat).pvalue > 1e-3, cat
    sides = [float(w[(f == c) & internal].sum()) for c in (0, 1)]
    assert chisquare(sides).pvalue > 1e-3, sides


def test_missing_at_prediction_follows_the_documented_rules():
    """A missing value follows its rule's side; a column never missing in training fills in its
    median; an unseen level counts as missing where the column had missing values, else as the
    most frequent level."""
    X, y = tiny_table()
    enc = TableEncoder.fit(frame(X), y)
    q = pd.DataFrame({"x": [NAN, 5.0], "c": ["zz", "a"], "z": [NAN, 0.5]})
    Z = enc.transform(q)
    delta = (0.9 - 0.1) / 4  # 5 observed values, 4 gaps
    assert Z[0, 0] == pytest.approx(0.9 + delta) and Z[0, 1] == pytest.approx(0.1 - delta)
    assert Z[1, 0] == pytest.approx(0.9) and Z[1, 1] == pytest.approx(0.9)  # clipped to the training range
    assert Z[0, 5] == pytest.approx(np.median(X[:, 2].astype(float)))
    mode_a = TableEncoder.fit(pd.DataFrame({"c": ["a", "a", "b"]}), None).transform(pd.DataFrame({"c": ["zz"]}))
    assert mode_a.tolist() == [[0.0]]  # level 'a' (the first, in every subset)


def test_shuffled_categories_give_the_same_fit():
    """Same labels, another category order (and a string column instead): identical posterior."""
    X, y = tiny_table()
    f1 = frame(X)
    f2 = f1.copy()
    f2["c"] = pd.Categorical(f1["c"], categories=["c", "a", "b"])
    f3 = f1.copy()
    f3["c"] = pd.Categorical(f1["c"], categories=["b", "c", "a"])
    outs = []
    for f in (f1, f2, f3):
        post = TopDownSMC(tt.ChipmanPrior(0.95, 0.5), tt.DirichletMultinomial(2.0), n_particles=64).run(
            tt.Data(f, y), seed=0)
        outs.append(post.predict_proba(frame(XQ)))
    assert np.array_equal(outs[0], outs[1]) and np.array_equal(outs[0], outs[2])


def test_numeric_tables_are_not_coded():
    """A table without missing values or categories takes the numeric path (no coding, same draws); a
    missing value at prediction takes the training median of its column."""
    X = np.random.default_rng(0).normal(size=(20, 3))
    y = (X[:, 0] > 0).astype(int)
    d = tt.Data(X, y)
    assert not d.encoder.is_coded and d.groups is None and torch.equal(d.X, torch.as_tensor(X, dtype=torch.float32))
    assert not tt.Data(pd.DataFrame(X, columns=list("abc")), y).encoder.is_coded
    post = TopDownSMC(tt.ChipmanPrior(0.95, 0.5), tt.DirichletMultinomial(2.0), n_particles=64).run(d, seed=0)
    q = X[:2].copy()
    q[0, 0] = np.nan
    filled = q.copy()
    filled[0, 0] = np.median(X[:, 0])
    assert np.array_equal(post.predict_proba(q), post.predict_proba(filled))


def test_soft_trees_refuse_coded_tables_with_advice():
    X, y = tiny_table()
    with pytest.raises(ValueError, match="hard-tree method"):
        tt.BayesianTreeClassifier(method="dcc", random_state=0).fit(frame(X), y)


@pytest.mark.parametrize("method", ["smc", "mcmc", "smc-moves", "bart"])
def test_estimators_take_raw_frames(method, tmp_path):
    """Every hard-tree method and BART fits a frame with NaN and a text column, predicts frames with
    unseen levels and missing cells, names the rules on the input, and saves / loads the coding."""
    rng = np.random.default_rng(0)
    n = 120
    x = rng.normal(size=n)
    c = rng.choice(["u", "v", "w"], n)
    y = ((x > 0) ^ (c == "v")).astype(int)
    x[rng.random(n) < 0.2] = np.nan
    X = pd.DataFrame({"x": x, "c": c})
    opts = dict(n_trees=20, n_samples=50, n_warmup=50) if method == "bart" else {}
    est = tt.BayesianTreeClassifier(method=method, random_state=0, **opts).fit(X, y)
    assert est.n_features_in_ == 2 and list(est.feature_names_in_) == ["x", "c"]
    assert est.feature_importances_.shape == (2,)
    p = est.predict_proba(pd.DataFrame({"x": [np.nan, 1.0], "c": ["zz", "v"]}))
    assert p.shape == (2, 2) and np.allclose(p.sum(1), 1)
    assert est.score(X, y) > 0.7
    path = str(tmp_path / "post.pt")
    est.posterior_.save(path)
    back = type(est.posterior_).load(path)
    assert np.array_equal(back.predict_proba(X), est.posterior_.predict_proba(X))
    dot = est.posterior_.to_dot()
    assert "x0" not in dot and "x1" not in dot  # rules are named on the input columns


@pytest.mark.slow
@pytest.mark.parametrize("bart_sampler", ["mcmc", "pg"])
def test_one_tree_bart_on_a_coded_table_equals_enumeration(bart_sampler):
    """One BART tree on a table with missing values and a 3-level categorical: the leaves' count
    distribution and the posterior mean at each point equal enumeration over the coded grid with
    the group-wise feature draw (within 5 standard errors over 64 chains)."""
    from torchtree import BART
    from torchtree.model.bart import LEAF, CutGrid
    from torchtree.testing import exact_bart_tree

    x = np.array([0.0, NAN, 1.0, 2.0, NAN, 1.0, 2.0, 0.0, NAN, 2.0])
    c = np.array(["a", "b", "a", "c", "c", "b", "a", "c", "b", "a"], dtype=object)
    y = np.array([0.1, 1.4, 0.3, 1.1, 1.3, 1.0, 0.9, 0.2, 1.6, 1.0])
    data = tt.Data(pd.DataFrame({"x": x, "c": c}), y, task="regression")
    C = 64
    post = BART(n_trees=1, n_chains=C, n_warmup=100, n_samples=600, max_depth=2, nu=1e9, sigma_hat=0.3,
                bart_sampler=bart_sampler, beta_split=1.0).run(data, seed=5)
    prior = post.prior
    grid = CutGrid.from_data(data, 100)
    bins = grid.bins(data.X).T.numpy()
    resid = (y - prior.offset) / prior.scale
    leaves_exact, mean_exact = exact_bart_tree(bins, grid.n_cuts.tolist(), prior, resid, prior.lam,
                                               groups=data.groups.numpy())
    n_leaves = (post.feature == LEAF).sum(-1)[:, 0].numpy()
    onehot = (n_leaves[:, None] == np.arange(leaves_exact.size)[None, :]).astype(float)
    per_chain = onehot.reshape(-1, C, onehot.shape[1]).mean(0)
    freq, se = per_chain.mean(0), per_chain.std(0, ddof=1) / np.sqrt(C)
    assert np.all(np.abs(freq - leaves_exact) < 5 * se + 0.005), (freq[:5], leaves_exact[:5])
    f = post.latent_draws(pd.DataFrame({"x": x, "c": c})).numpy()
    per_chain = f.reshape(-1, C, f.shape[1]).mean(0)
    fm, fse = per_chain.mean(0), per_chain.std(0, ddof=1) / np.sqrt(C)
    exact_f = prior.offset + prior.scale * mean_exact
    assert np.all(np.abs(fm - exact_f) < 5 * fse + 1e-3), (fm, exact_f, fse)


def test_cli_fits_files_with_empty_cells_and_text_columns(tmp_path, capsys):
    """A CSV with empty cells and a text column: one notice per text column, a fit, predictions on a
    file with an unseen level and empty cells, and a summary that names the rules on the inputs;
    --categorical makes a numeric column categorical."""
    from torchtree.cli import main

    rng = np.random.default_rng(1)
    n = 90
    x = rng.normal(size=n)
    c = rng.choice(["red", "green", "blue"], n)
    y = np.where((x > 0) ^ (c == "red"), "yes", "no")
    cells = [("" if rng.random() < 0.15 else f"{v:.3f}", k, t) for v, k, t in zip(x, c, y)]
    path = tmp_path / "t.csv"
    path.write_text("x,colour,label\n" + "".join(f"{a},{b},{t}\n" for a, b, t in cells))
    out = tmp_path / "p.pt"
    assert main(["fit", str(path), "--out", str(out), "--device", "cpu", "--n-particles", "200"]) == 0
    text = capsys.readouterr()
    assert "column 'colour' holds text ('" in text.err and "categorical, 3 levels" in text.err
    q = tmp_path / "q.csv"
    q.write_text("x,colour\n,purple\n0.5,red\n")
    assert main(["predict", str(out), str(q), "--quiet"]) == 0
    assert len(capsys.readouterr().out.strip().splitlines()) == 3
    assert main(["summary", str(out)]) == 0
    summary = capsys.readouterr().out
    assert "colour in {" in summary or "missing" in summary
    assert main(["fit", str(path), "--out", str(out), "--device", "cpu", "--categorical", "x", "--quiet"]) == 0
    from torchtree.cli.report import load_posterior

    assert load_posterior(str(out)).encoder.columns[0].source == "categorical"


class _Stop(Exception):
    pass


def _coded_data(n=60, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=n)
    c = rng.choice(["u", "v", "w", "z"], n)
    y = ((x > 0) ^ (c == "v")).astype(int)
    x[rng.random(n) < 0.25] = np.nan
    return tt.Data(pd.DataFrame({"x": x, "c": c, "z": rng.normal(size=n)}), y)


@pytest.mark.parametrize("kind", ["smc", "mcmc", "bart"])
def test_resumed_runs_on_coded_tables_equal_uninterrupted(kind, tmp_path, monkeypatch):
    """Stopped right after a checkpoint and resumed: the same posterior as an uninterrupted run."""
    import os

    from torchtree import BART
    from torchtree.monitor import CallbackMonitor

    monkeypatch.setattr(os, "fsync", lambda fd: None)
    data = _coded_data()
    make = {"smc": lambda **k: TopDownSMC(n_particles=32, n_islands=2, **k),
            "mcmc": lambda **k: MCMC(n_chains=3, n_samples=30, **k),
            "bart": lambda **k: BART(n_trees=5, n_chains=2, n_samples=10, n_warmup=10, **k)}[kind]
    ref = make().run(data, seed=4)
    path = str(tmp_path / "run.ckpt")

    def hook(step):
        if step >= 3:
            raise _Stop

    with pytest.raises(_Stop):
        make(checkpoint=path, checkpoint_every=1).run(data, seed=4, monitor=CallbackMonitor(on_checkpoint=hook))
    post = make(checkpoint=path, checkpoint_every=1).run(data, seed=4)
    q = pd.DataFrame({"x": [np.nan, 0.3, -1.0], "c": ["v", "zz", "u"], "z": [0.0, 1.0, np.nan]})
    assert np.array_equal(post.predict_proba(q), ref.predict_proba(q))


@pytest.mark.parametrize("kind", ["smc", "mcmc", "smc-moves", "bart"])
def test_two_thread_ranks_equal_one_process_on_coded_tables(kind):
    """The same draws on 1 and 2 ranks (thread backend) for a table with missing values and a
    categorical column."""
    import sys
    from pathlib import Path

    from torchtree import BART

    sys.path.insert(0, str(Path(__file__).parent / "_dist_workers"))
    from thread_backend import run_threads

    data = _coded_data(seed=2)
    make = {"smc": lambda **k: TopDownSMC(n_particles=24, n_islands=2, ess_threshold=0.9, **k),
            "mcmc": lambda **k: MCMC(n_chains=4, n_samples=20, **k),
            "smc-moves": lambda **k: SMCSampler(n_particles=32, n_iterations=3, **k),
            "bart": lambda **k: BART(n_trees=4, n_chains=2, n_samples=8, n_warmup=8, **k)}[kind]
    ref = make().run(data, seed=11)
    outs = run_threads(2, lambda b: make(backend=b).run(data, seed=11), timeout=120)
    q = pd.DataFrame({"x": [np.nan, 0.3], "c": ["v", "zz"], "z": [0.0, 1.0]})
    for post in outs:
        assert np.array_equal(post.predict_proba(q), ref.predict_proba(q))


def test_levels_are_found_as_text_or_number_and_mostly_unseen_levels_warn():
    """A categorical column fitted on numbers takes their text at prediction ("1" is level 1), and the reverse;
    where more than half of a column's cells hold levels fit never saw, a warning names the column."""
    import warnings

    rng = np.random.default_rng(0)
    df = pd.DataFrame({"code": rng.integers(0, 3, 150), "x": rng.normal(size=150)})
    y = (df.code == 1).to_numpy().astype(int)
    num = tt.BayesianTreeClassifier(n_particles=20, random_state=0, categorical_features=["code"]).fit(df, y)
    txt = tt.BayesianTreeClassifier(n_particles=20, random_state=0).fit(df.assign(code=df.code.astype(str)), y)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # found levels, or a minority unseen: no warning
        np.testing.assert_array_equal(num.predict_proba(df.assign(code=df.code.astype(str))), num.predict_proba(df))
        np.testing.assert_array_equal(txt.predict_proba(df), txt.predict_proba(df.assign(code=df.code.astype(str))))
        num.predict_proba(df.assign(code=np.where(np.arange(150) < 70, 7, df.code)))
    with pytest.warns(UserWarning, match=r"column 0 \('code'\): 150 of 150 cells hold levels not seen in fit \(such as"):
        num.predict_proba(df.assign(code=df.code + 10))



def test_text_levels_are_found_from_numeric_and_bool_columns():
    """A text column made categorical by one word ("1", "2", "3", "unknown"), given at prediction as an int64
    column (as read_csv reads a file without the word), finds its levels: "1" for 1 (which arrives as 1.0); a
    "true" / "false" column finds its levels from a bool column. The old lookup sent every such cell to the most
    frequent level (probabilities 0.002 for the class that level "2" predicts at 0.99)."""
    import warnings

    from torchtree.model.levels import find_level

    rng = np.random.default_rng(0)
    grade = rng.choice(["1", "2", "3", "unknown"], 200)
    df = pd.DataFrame({"grade": grade, "noise": rng.normal(size=200)})
    clf = tt.BayesianTreeClassifier(n_particles=30, random_state=0).fit(df, (grade == "2").astype(int))
    new = pd.DataFrame({"grade": [1, 2, 3], "noise": 0.0})
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # every level found: no unseen-level warning
        np.testing.assert_array_equal(clf.predict_proba(new), clf.predict_proba(new.astype({"grade": str})))
    assert clf.predict_proba(new)[1, 1] > 0.9 > 0.1 > clf.predict_proba(new)[0, 1]
    flag = rng.choice(["true", "false"], 200)
    clf = tt.BayesianTreeClassifier(n_particles=30, random_state=0).fit(
        pd.DataFrame({"flag": flag, "other": rng.choice(list("ab"), 200)}), (flag == "true").astype(int))
    both = pd.DataFrame({"flag": [True, False], "other": ["a", "a"]})
    np.testing.assert_array_equal(clf.predict_proba(both), clf.predict_proba(both.astype({"flag": str})))
    assert clf.predict_proba(both)[0, 1] > 0.9 > 0.1 > clf.predict_proba(both)[1, 1]
    # the lookup itself: a level that is the number wins over a truth value; text is not a number's level
    assert find_level({"1": 0, "true": 1}, 1.0) == 0 and find_level({"TRUE": 4, "false": 5}, 1.0) == 4
    assert find_level({"1.5": 2}, 1.5) == 2 and find_level({"x": 0}, 2.0) is None


def test_many_subset_columns_become_ordinal_to_fit_the_column_cap():
    """33 columns of 8 levels would need 33 x 127 = 4191 subset columns (over MAX_ENCODED_COLUMNS = 4096): the
    columns with the most levels become ordinal, one at a time, until the table fits, with a warning naming
    them, instead of a refusal whose advice (a setting no estimator takes) could not be followed."""
    from torchtree.model.encoding import MAX_ENCODED_COLUMNS

    rng = np.random.default_rng(0)
    levels = list("abcdefgh")
    df = pd.DataFrame({f"q{j}": rng.choice(levels[:7] if j == 5 else levels, 300) for j in range(33)})
    with pytest.warns(UserWarning, match=r"subset splits of 1 categorical column\(s\) \(column 0 \('q0'\)\)"):
        enc = TableEncoder.fit(df, rng.integers(0, 2, 300))
    kinds = [c.kind for c in enc.columns]
    assert kinds == ["ordinal"] + ["subsets"] * 32 and enc.n_columns == 1 + 31 * 127 + 63 <= MAX_ENCODED_COLUMNS
    with pytest.raises(ValueError, match=r"X codes to 4100 split columns \(over 4096"):
        TableEncoder.fit(np.zeros((3, 4100)))

def test_levels_are_coded_once_per_distinct_cell(monkeypatch):
    """Coding a categorical column looks each distinct cell up once (work grows with the levels, not the
    rows), and gives every cell the code a per-cell lookup gives: text, None, NaN, pandas categories with
    missing cells, unseen levels."""
    import warnings

    import torchtree.model.levels as lv
    from torchtree.model.inputs import is_missing_cell
    from torchtree.model.levels import find_level

    rng = np.random.default_rng(1)
    pool = np.array(["a", "b", "c", None, np.nan, "d"], dtype=object)
    train = pd.DataFrame({"s": pool[rng.integers(0, 6, 3000)], "k": pd.Categorical(rng.choice(["u", "v", None], 3000))})
    encoder = TableEncoder.fit(train)
    test = pd.DataFrame({"s": np.array(["a", "zz", None, "c", "b", np.nan, "zz", "d"] * 500, dtype=object),
                         "k": pd.Categorical(["v", "u", None, "u"] * 1000)})
    calls = []
    monkeypatch.setattr(lv, "find_level", lambda lookup, v: calls.append(v) or find_level(lookup, v))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "zz" is a minority of the present cells: no warning
        coded = encoder.transform(test)
    assert sorted(calls) == ["a", "b", "c", "d", "u", "v", "zz"]  # once per distinct present cell
    assert coded.shape == (4000, encoder.n_columns)
    for j, c in enumerate(encoder.columns):  # the per-cell reference
        lookup = {v: i for i, v in enumerate(c.levels) if v is not None}
        miss_code = len(c.levels) - 1 if c.levels[-1] is None else c.fill_level
        cells = test.iloc[:, j].to_numpy(dtype=object)
        ref = [miss_code if is_missing_cell(v) or find_level(lookup, v) is None else find_level(lookup, v)
               for v in cells.tolist()]
        np.testing.assert_array_equal(encoder._level_codes(c, cells), ref)


def test_a_rows_level_does_not_depend_on_the_other_rows():
    """Cells of different types that compare equal (1, 1.0, True) are looked up each as itself, as a
    cell alone would be: a row's code does not depend on which of them came first in the batch."""
    frame = pd.DataFrame({"c": np.array(["1", "2", "a", "a", "a", "b"], dtype=object)})
    enc = TableEncoder.fit(frame, np.array([0, 1, 0, 1, 0, 1]))
    col = enc.columns[0]
    alone = {repr(v): enc._level_codes(col, np.array([v], dtype=object))[0] for v in (1, 1.0, True, "1", np.int64(1))}
    for batch in ([1.0, 1], [1, 1.0], [True, 1], [1, True, 1.0, "1", np.int64(1)]):
        codes = enc._level_codes(col, np.array(batch, dtype=object))
        assert [alone[repr(v)] for v in batch] == codes.tolist(), batch


def test_levels_more_noise_than_signal_share_one_place_in_the_ordinal_order():
    """In a column of more than MAX_SUBSET_LEVELS levels, the order comes from the labels, so levels whose
    mean is more noise than signal share one rank: every level when the one-way ANOVA finds no signal at
    5% (F against scipy's quantile here) or no level has two rows, else the levels of n < sigma2 / tau2
    (sigma2 = MS_within, tau2 the unweighted-means estimate; computed here with pandas). Levels with enough
    rows keep their own ranks by mean response; levels of strong effects keep theirs however few their
    rows; signal in a class other than the most frequent one counts."""
    stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(3)

    def check(labels, y, T):
        """The encoder pools exactly the levels the reference rule pools; returns (ranks, coded, cut)."""
        frame = pd.DataFrame({"cat": labels})
        enc = TableEncoder.fit(frame, np.asarray(y))
        col, coded = enc.columns[0], enc.transform(frame)[:, 0]
        T = pd.DataFrame(np.asarray(T, dtype=float).reshape(len(labels), -1))
        g = T.groupby(np.asarray(labels))
        n, m, N, k = g.size(), g.mean(), len(labels), g.ngroups
        within = ((T - g.transform("mean")) ** 2).to_numpy().sum() / (N - k) if N > k else np.nan
        between = (n.to_numpy()[:, None] * (m - T.mean()) ** 2).to_numpy().sum() / (k - 1)
        if N == k or between / within <= stats.f.ppf(0.95, k - 1, N - k):
            cut = np.inf
        else:
            tau2 = m.var(ddof=1).sum() - within * (1.0 / n).mean()
            cut = within / tau2 if tau2 > 0 else np.inf
        expect = {lv for lv in n.index if n[lv] < cut}
        rank = dict(zip(col.levels, col.order))
        shared = {lv for lv in rank if list(rank.values()).count(rank[lv]) > 1}
        assert shared == (expect if len(expect) > 1 else set()), (cut, shared, expect)
        return rank, coded, cut

    # three supported levels of clear effects and 30 levels of 2 rows each, labels drawn at p = 0.5
    labels, ys = [], []
    for lv, p in {"A": 0.9, "B": 0.1, "C": 0.5}.items():
        labels += [lv] * 60
        ys += list((rng.random(60) < p).astype(int))
    rare = [f"r{i:02d}" for i in range(30)]
    for lv in rare:
        labels += [lv] * 2
        ys += list((rng.random(2) < 0.5).astype(int))
    y = np.array(ys)
    rank, coded, cut = check(labels, y, np.eye(2)[y])
    assert 2 < cut < 60  # the rare levels are pooled, the supported ones are not
    lo, hi = ("B", "A") if np.bincount(y).argmax() == 1 else ("A", "B")  # the score is P(most frequent class)
    assert rank[lo] < rank["C"] < rank[hi]  # the supported levels by mean response
    assert rank[lo] < rank[rare[0]] < rank[hi]  # the pooled rows' score is about 0.5
    assert np.unique(coded[np.isin(labels, rare)]).size == 1  # no rule can split them
    # strong effects: 12 levels of 3 rows each, means 1 apart with noise 0.1: none is pooled
    strong = [f"s{i:02d}" for i in range(12) for _ in range(3)]
    target = np.repeat(np.arange(12.0)[::-1], 3) + 0.1 * rng.normal(size=36)
    rank, _, cut = check(strong, target, target)
    assert cut < 3 and [rank[f"s{i:02d}"] for i in range(12)] == list(range(12))[::-1]
    # no signal: 20 levels of 5 rows of one normal sample; an identifier (one row per level): all pooled
    for labels_, target_ in (([f"n{i:02d}" for i in range(20) for _ in range(5)], rng.normal(size=100)),
                             ([f"id{i:03d}" for i in range(150)], rng.normal(size=150))):
        rank, coded, cut = check(labels_, target_, target_)
        assert cut == np.inf and len(set(rank.values())) == 1 and np.unique(coded).size == 1
    # three classes: the most frequent one (0) at random, levels 0-9 lean to class 1, 10-19 to class 2
    lv3 = np.repeat(np.arange(20), 20)
    y3 = np.where(rng.random(400) < 0.5, 0, np.where(lv3 < 10, 1, 2))
    rank, _, cut = check([f"m{v:02d}" for v in lv3], y3, np.eye(3)[y3])
    assert cut < 20 and len(set(rank.values())) == 20  # the signal in classes 1 and 2 keeps the levels apart
    # without y the order is the labels' order and nothing is pooled
    plain = TableEncoder.fit(pd.DataFrame({"cat": labels})).columns[0]
    assert plain.order == list(range(len(plain.levels)))


def test_many_class_levels_are_ordered_along_the_first_principal_component():
    """With three classes or more, levels are placed by the projection of their smoothed class distributions
    on the first principal component of those distributions (weighted by rows; Coppersmith, Hong & Hosking
    1999), checked against an SVD here: where the most frequent class does not depend on the level but
    classes 1 and 2 do, the order puts the class-1 levels on one side and the class-2 levels on the other
    (the most frequent class's share cannot tell them apart)."""
    rng = np.random.default_rng(5)
    lev = np.repeat(np.arange(20), 40)
    y = np.where(rng.random(800) < 0.5, 0, np.where(lev < 10, 1, 2))
    names = np.array([f"L{i:02d}" for i in rng.permutation(20)])
    col = TableEncoder.fit(pd.DataFrame({"c": names[lev]}), y).columns[0]
    rank = dict(zip(col.levels, col.order))
    ones, twos = {rank[names[i]] for i in range(10)}, {rank[names[i]] for i in range(10, 20)}
    assert max(ones) < min(twos) or max(twos) < min(ones)
    # the reference: smoothed distributions about the overall one, weighted SVD, sign of the largest entry
    counts = np.zeros((20, 3))
    np.add.at(counts, (lev, y), 1.0)
    n, p = counts.sum(1), counts.sum(0) / counts.sum()
    dev = (counts + p) / (n + 1.0)[:, None] - p
    _, _, vt = np.linalg.svd(dev * np.sqrt(n)[:, None], full_matrices=False)
    pc = vt[0] * np.sign(vt[0][np.argmax(np.abs(vt[0]))])
    score = dev @ pc
    by = sorted(range(20), key=lambda i: (round(score[i], 12), names[i]))  # ties in label order
    assert [rank[names[i]] for i in by] == list(range(20))


def test_a_missing_cell_in_a_column_complete_in_training_warns_and_reads_the_median():
    """Training saw no missing value in column 0, so no rule says where one goes: prediction reads the training
    median there (the row predicts as at that value) and warns, naming the column and its count of missing
    cells; a complete column predicts silently."""
    import warnings

    from torchtree import BayesianTreeRegressor

    g = np.random.default_rng(0)
    X = g.normal(size=(200, 3))
    y = X[:, 0] + 0.1 * g.normal(size=200)
    est = BayesianTreeRegressor(method="smc", n_particles=20, hyper="fixed", verbose=0).fit(X, y)
    Xt = X[:5].copy()
    Xt[1, 0] = Xt[2, 0] = np.nan
    with pytest.warns(UserWarning, match=r"X column 0: 2 missing cell\(s\), none in training: read as the "
                                         r"training median"):
        got = est.predict(Xt)
    at_median = X[:5].copy()
    at_median[1:3, 0] = np.median(X[:, 0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        np.testing.assert_array_equal(got, est.predict(at_median))
