"""scikit-learn conventions of the estimators: check_estimator passes, and each convention a QA pass
found broken (NotFittedError, random_state objects, column-vector y, pickles without the training
data, unseen labels in score, feature_importances_, verbose, sparse input) holds."""
import pickle
import warnings

import numpy as np
import pytest

from torchtree import BayesianTreeClassifier, BayesianTreeRegressor

sklearn = pytest.importorskip("sklearn")
from sklearn.exceptions import DataConversionWarning, NotFittedError  # noqa: E402


def _data(n=200, seed=0):
    g = np.random.default_rng(seed)
    X = g.normal(size=(n, 4))
    return X, (X[:, 1] > 0.2).astype(int), 2.0 * (X[:, 1] > 0.2) + 0.1 * g.normal(size=n)


@pytest.mark.slow
@pytest.mark.parametrize("cls, hyper", [(BayesianTreeClassifier, "evidence"), (BayesianTreeRegressor, "fixed")])
def test_check_estimator_passes(cls, hyper):
    """Every check of scikit-learn's, once with the default evidence search (the classifier: its pilot runs
    take 80% of the time) and once with fixed hyperparameters (the regressor; tests/test_fuzz_inputs.py feeds
    the regressor's evidence search the same kinds of odd input)."""
    from sklearn.utils.estimator_checks import check_estimator

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        results = check_estimator(cls(n_particles=20, n_islands=1, hyper=hyper), on_fail=None)
    failed = [(r["check_name"], str(r["exception"])[:200]) for r in results if r["status"] == "failed"]
    assert not failed, failed


def test_unfitted_estimators_raise_scikit_learns_not_fitted_error():
    X, _, _ = _data()
    for est in (BayesianTreeClassifier(), BayesianTreeRegressor()):
        with pytest.raises(NotFittedError):
            est.predict(X)
    with pytest.raises(NotFittedError):
        BayesianTreeClassifier().feature_importances_
    assert not hasattr(BayesianTreeClassifier(), "feature_importances_")  # an AttributeError, as hasattr needs


def test_random_state_objects_seed_the_fit_as_in_scikit_learn():
    X, y, _ = _data()
    fit = lambda rs: BayesianTreeClassifier(n_particles=20, random_state=rs).fit(X, y).predict_proba(X)  # noqa: E731
    np.testing.assert_array_equal(fit(np.random.RandomState(0)), fit(np.random.RandomState(0)))
    np.testing.assert_array_equal(fit(np.random.default_rng(3)), fit(np.random.default_rng(3)))
    rs = np.random.RandomState(0)
    assert not np.array_equal(fit(rs), fit(rs))  # the object moves on: a new draw per fit
    with pytest.raises(ValueError, match="random_state must be"):
        fit("zero")


def test_a_column_vector_y_warns_and_is_flattened():
    X, y, yr = _data()
    with pytest.warns(DataConversionWarning, match="column-vector y"):
        a = BayesianTreeClassifier(n_particles=20).fit(X, y[:, None]).predict_proba(X)
    np.testing.assert_array_equal(a, BayesianTreeClassifier(n_particles=20).fit(X, y).predict_proba(X))
    with pytest.warns(DataConversionWarning):
        BayesianTreeRegressor(n_particles=20).fit(X, yr[:, None])


def test_the_pickle_holds_the_model_not_the_training_data():
    g = np.random.default_rng(0)
    X = g.normal(size=(20_000, 4))
    y = (X[:, 1] > 0.2).astype(int)
    est = BayesianTreeClassifier(n_particles=10, n_islands=1).fit(X, y)
    assert not hasattr(est, "data_")
    blob = pickle.dumps(est)
    assert len(blob) < X.nbytes / 4, len(blob)  # 640 KB of features; the trees of 10 particles are far less
    np.testing.assert_array_equal(pickle.loads(blob).predict_proba(X[:50]), est.predict_proba(X[:50]))


def test_a_pickle_records_the_version_and_another_versions_pickle_warns():
    """As scikit-learn's estimators record theirs: a pickle of another torchtree version (or of none recorded,
    as before versions were recorded) loads with an InconsistentVersionWarning; one of this version silently."""
    import copy
    import warnings

    from torchtree import InconsistentVersionWarning, __version__

    X, y, _ = _data()
    est = BayesianTreeClassifier(n_particles=20).fit(X, y)
    assert est.__getstate__()["_torchtree_version"] == __version__
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        same = pickle.loads(pickle.dumps(est))
        copy.deepcopy(est)
    assert "_torchtree_version" not in vars(same)
    for made_by, said in (("0.0.9", "pickled by torchtree 0.0.9"), (None, "did not record itself")):
        state = {k: v for k, v in est.__getstate__().items() if k != "_torchtree_version" or made_by}
        if made_by:
            state["_torchtree_version"] = made_by
        other = BayesianTreeClassifier.__new__(BayesianTreeClassifier)
        with pytest.warns(InconsistentVersionWarning, match=f"{said} and is loaded by torchtree {__version__}"):
            other.__setstate__(state)
        np.testing.assert_array_equal(other.predict_proba(X[:20]), est.predict_proba(X[:20]))


def test_score_counts_labels_not_seen_at_fit_as_errors():
    """As scikit-learn's accuracy_score(y, predict(X)): a row of an unseen label is an error (a cross-validation
    fold missing a class scores a number, not NaN), with a warning naming the label."""
    X, y, _ = _data()
    est = BayesianTreeClassifier(n_particles=20).fit(X, y)
    yq = np.array([0, 1, 7, 0, 1])
    with pytest.warns(UserWarning, match=r"label\(s\) \[7\] not seen at fit .*count as errors"):
        got = est.score(X[:5], yq)
    assert got == np.mean(est.predict(X[:5]) == yq)
    assert 0.0 <= est.score(X, y) <= 1.0


@pytest.mark.parametrize("method, kw", [("smc", dict(n_particles=50)), ("bart", dict(n_trees=10, n_samples=20, n_warmup=20))])
def test_feature_importances_share_the_splits_and_find_the_signal(method, kw):
    X, y, yr = _data(400)
    for est in (BayesianTreeClassifier(method=method, **kw).fit(X, y), BayesianTreeRegressor(method=method, **kw).fit(X, yr)):
        imp = est.feature_importances_
        assert imp.shape == (4,) and abs(imp.sum() - 1.0) < 1e-12 and (imp >= 0).all()
        assert int(np.argmax(imp)) == 1  # the only informative feature


def test_verbose_is_a_parameter_and_shows_progress(capsys):
    X, y, _ = _data()
    assert BayesianTreeClassifier().get_params()["verbose"] == 1  # bars for long phases at a terminal
    est = BayesianTreeClassifier(n_particles=20, verbose=2)
    assert est.get_params()["verbose"] == 2
    est.fit(X, y)
    assert "it" in capsys.readouterr().err  # tqdm's progress line (tests/test_progress.py checks them)


def test_sparse_input_is_refused_with_what_to_do():
    sparse = pytest.importorskip("scipy.sparse")
    X, y, _ = _data()
    with pytest.raises(TypeError, match=r"sparse input is not supported; use X\.toarray\(\)"):
        BayesianTreeClassifier(n_particles=20).fit(sparse.csr_matrix(X), y)


def test_an_unavailable_device_is_refused_before_any_work(monkeypatch):
    """device="cuda" on a machine without CUDA used to be refused after the evidence pilots (5.7 s)."""
    import torch

    from _counting import Calls

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    X, y, _ = _data()
    with Calls() as c, pytest.raises(ValueError, match="CUDA is not available"):
        BayesianTreeClassifier(device="cuda").fit(X, y)
    assert c.n < 2000, c.n  # no pilot fit ran (one pilot alone makes tens of thousands of calls)


@pytest.mark.parametrize("method, kw", [("smc", dict(n_particles=20)), ("bart", dict(n_trees=5, n_chains=2, n_samples=5))])
def test_reversed_views_are_read_as_their_copies(method, kw):
    """Arrays with negative strides (X[::-1], np.flip) fit and predict as their contiguous copies: same
    predictions, probabilities, intervals, scores and log densities, with and without missing cells."""
    X, yc, yr = _data(120)
    for Xf, missing in ((X, False), (X.copy(), True)):
        if missing:
            Xf[5, 2] = np.nan
        Xr, Xc = Xf[::-1, ::-1], np.ascontiguousarray(Xf[::-1, ::-1])
        assert any(s < 0 for s in Xr.strides)
        c1 = BayesianTreeClassifier(method=method, random_state=0, **kw).fit(Xr, yc[::-1])
        c2 = BayesianTreeClassifier(method=method, random_state=0, **kw).fit(Xc, yc[::-1].copy())
        np.testing.assert_array_equal(c1.predict_proba(Xr), c2.predict_proba(Xc))
        assert c1.score(Xr, yc[::-1]) == c2.score(Xc, yc[::-1].copy())
        r1 = BayesianTreeRegressor(method=method, random_state=0, **kw).fit(Xr, yr[::-1])
        r2 = BayesianTreeRegressor(method=method, random_state=0, **kw).fit(Xc, yr[::-1].copy())
        np.testing.assert_array_equal(r1.predict_interval(Xr), r2.predict_interval(Xc))
        np.testing.assert_array_equal(r1.log_predictive(Xr, yr[::-1]), r2.log_predictive(Xc, yr[::-1].copy()))


@pytest.mark.parametrize("kw, message", [(dict(n_partcles=5), "invalid parameter"), (dict(n_particles=-5), ">= 1"),
                                         (dict(proposal="optimall"), "proposal must be one of"),
                                         (dict(method="mcmc", n_chains=0), ">= 1"),
                                         (dict(method="bart", n_trees=0), ">= 1")])
def test_sampler_options_are_checked_before_the_evidence_pilots(monkeypatch, kw, message):
    """A misspelt or out-of-range sampler option fails before any pilot runs (the pilots here raise if called),
    and a valid one reaches them."""
    from torchtree.samplers.tuning import evidence

    def pilots(*a, **k):
        raise AssertionError("the evidence pilots ran")

    monkeypatch.setattr(evidence, "choose_by_evidence", pilots)
    X, y, _ = _data(60)
    with pytest.raises(ValueError, match=message):
        BayesianTreeClassifier(**kw).fit(X, y)
    with pytest.raises(AssertionError, match="pilots ran"):
        BayesianTreeClassifier(n_particles=5).fit(X, y)


def test_r2_of_a_constant_target_follows_scikit_learn(monkeypatch):
    """score on a constant y: 1.0 for predictions equal to it, 0.0 otherwise (sklearn's r2_score); else R^2."""
    from sklearn.metrics import r2_score

    X, _, yr = _data(60)
    est = BayesianTreeRegressor(n_particles=5, random_state=0).fit(X, yr)
    flat = np.full(len(X), 2.0)
    for pred in (flat, flat + 0.5, yr):
        monkeypatch.setattr(est, "predict", lambda X_, p=pred: p)
        for target in (flat, yr):
            assert est.score(X, target) == pytest.approx(r2_score(target, pred), abs=1e-12)


@pytest.mark.parametrize("method, kw", [("smc", dict(n_particles=10)), ("bart", dict(n_trees=5, n_chains=2, n_samples=5))])
def test_float_labels_stay_floats(method, kw):
    """Integral float labels are classes of their own type (scikit-learn keeps y's dtype in classes_ and predict)."""
    X, yc, _ = _data(60)
    for y in (yc * 2.0, np.where(yc == 1, 3.0, np.where(X[:, 0] > 0, 1.0, -1.0))):
        est = BayesianTreeClassifier(method=method, random_state=0, **kw).fit(X, y)
        assert est.classes_.dtype == np.float64 and np.array_equal(est.classes_, np.unique(y))
        pred = est.predict(X)
        assert pred.dtype == np.float64 and set(pred.tolist()) <= set(y.tolist())


def test_the_regressors_interval_takes_the_draws_and_the_seed():
    """predict_interval(n_draws=, seed=) reaches the posterior: the same arguments give the same bounds, another
    seed others, and more draws bring the bounds of two seeds closer (Monte Carlo error ~ 1/sqrt(n_draws))."""
    X, _, yr = _data(120)
    est = BayesianTreeRegressor(n_particles=20, random_state=0).fit(X, yr)
    np.testing.assert_array_equal(est.predict_interval(X, n_draws=500, seed=3),
                                  est.posterior_.predict_interval(X, n_draws=500, seed=3))
    gap = [np.abs(est.predict_interval(X, n_draws=n, seed=1) - est.predict_interval(X, n_draws=n, seed=2)).mean()
           for n in (200, 20000)]
    assert gap[0] > 0 and gap[1] < gap[0] / 4  # sqrt(100) = 10x less in expectation; 4x leaves room for noise


def test_feature_importances_of_soft_trees_are_the_heaviest_topologys_gate_weights():
    """DCC: the mean gate weight per feature in the heaviest topology (summary's feature_usage_top), normalised."""
    X, y, yr = _data(120)
    kw = dict(n_iterations=3, n_initial=8, n_chains=2, n_samples=4, n_warmup=10, n_parallel=2, activation_threshold=2,
              max_depth=2, n_proposals=2, max_tree_depth=4, n_threads=1)
    for est in (BayesianTreeClassifier(method="dcc", random_state=0, **kw).fit(X, y),
                BayesianTreeRegressor(method="dcc", random_state=0, **kw).fit(X, yr)):
        usage = np.asarray(est.posterior_.summary()["feature_usage_top"])
        np.testing.assert_allclose(est.feature_importances_, usage / usage.sum(), rtol=1e-12)
        assert est.feature_importances_.shape == (4,)


@pytest.mark.parametrize("method, setting", [("smc", "n_particles"), ("smc", "ess_threshold"), ("mcmc", "n_samples"),
                                             ("bart", "n_trees"), ("bart", "k"), ("smc-moves", "n_particles")])
def test_none_for_a_setting_without_none_is_refused_by_name(method, setting):
    """A search grid's None for a setting whose values do not include None: refused, naming it (it used to fail
    deep inside the sampler with a bare TypeError); settings that take None (n_warmup) still do."""
    X, y, _ = _data()
    with pytest.raises(TypeError, match=rf"^{setting}=None is not one of its values; leave it out"):
        BayesianTreeClassifier(method=method, **{setting: None}).fit(X, y)
    BayesianTreeClassifier(method="bart", n_trees=5, n_samples=5, n_warmup=None).fit(X, y)


def test_predict_interval_takes_what_random_state_takes():
    """An int, a numpy integer (the same intervals), None (a fresh seed), a RandomState or a Generator; anything
    else is refused naming ``seed``."""
    X, _, yr = _data(120)
    est = BayesianTreeRegressor(n_particles=30).fit(X, yr)
    np.testing.assert_array_equal(est.predict_interval(X[:4], seed=np.int64(3)), est.predict_interval(X[:4], seed=3))
    for seed in (None, np.random.RandomState(0), np.random.default_rng(0)):
        assert est.predict_interval(X[:4], seed=seed).shape == (4, 2)
    with pytest.raises(ValueError, match="^seed must be None, an int"):
        est.predict_interval(X[:4], seed="x")


def test_changing_method_removes_the_options_the_new_method_does_not_take():
    """``set_params(method=...)`` on an estimator with another method's options: those the new method does not
    take are removed with a warning naming them (they could not be unset otherwise, so the fit always failed);
    options both take stay, and options given beside the new method are kept for fit to refuse."""
    X, _, yr = _data(120)
    est = BayesianTreeRegressor(method="mcmc", n_chains=2, n_samples=10, n_warmup=5, cut_proposal="data")
    with pytest.warns(UserWarning, match=r"method 'bart' does not take cut_proposal \(set for method 'mcmc'\): removed"):
        est.set_params(method="bart")
    assert est.get_params()["n_chains"] == 2 and "cut_proposal" not in est.get_params()
    est.set_params(n_trees=5).fit(X, yr)  # fits: nothing of the other method is left
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the same method again: nothing removed, no warning
        BayesianTreeRegressor(method="smc", n_particles=20).set_params(method="smc")
    kept = BayesianTreeRegressor(method="smc").set_params(method="bart", n_particles=20)
    with pytest.raises(ValueError, match=r"'n_particles'"):
        kept.fit(X, yr)


def test_set_params_refuses_unknown_and_nested_names_at_once():
    """As scikit-learn's ``set_params``: a name the estimator does not have raises a ValueError when set, with the
    closest valid name; a nested ``a__b`` name says its owner has no parameters."""
    est = BayesianTreeClassifier()
    with pytest.raises(ValueError, match=r"'n_tress' \(did you mean 'n_trees'\?\)"):
        est.set_params(n_tress=5)
    with pytest.raises(ValueError, match=r"'monitor__every' \(nested names: 'monitor' has no parameters"):
        est.set_params(monitor__every=5)
    assert "n_tress" not in est.get_params()


def test_a_frame_given_to_an_estimator_fitted_without_names_warns():
    """As scikit-learn: fitted on an array, predicting on a frame with text column names warns that the columns are
    taken by position (and gives the same predictions); a frame without text names does not warn."""
    pd = pytest.importorskip("pandas")
    X, y, _ = _data(120)
    est = BayesianTreeClassifier(n_particles=20).fit(X, y)
    frame = pd.DataFrame(X, columns=list("abcd"))
    with pytest.warns(UserWarning, match="X has feature names, but BayesianTreeClassifier was fitted without"):
        got = est.predict(frame)
    np.testing.assert_array_equal(got, est.predict(X))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        est.predict(pd.DataFrame(X))  # integer column names: not feature names


def test_r_bart_names_are_refused_with_the_name_used_here():
    """R's BART / dbarts / bartMachine names (``ntree``, ``sigdf``, ...) are refused, at ``fit`` and at
    ``set_params``, each with this estimator's name for it; another unknown name gets the closest one."""
    X, _, y = _data(40)
    with pytest.raises(ValueError, match=r"'ntree' \(R's name; here: n_trees\), 'sigdf' \(R's name; here: nu\)"):
        BayesianTreeRegressor(method="bart", ntree=50, sigdf=3).fit(X, y)
    with pytest.raises(ValueError, match=r"'n_tree' \(did you mean 'n_trees'\?\)"):
        BayesianTreeRegressor(method="bart", n_tree=50).fit(X, y)
    with pytest.raises(ValueError, match=r"'ndpost' \(R's name; here: n_samples \(per chain\)\)"):
        BayesianTreeRegressor().set_params(ndpost=1000)
