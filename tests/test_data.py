"""Tests for torchtree.model.data: input validation, label coding, per-feature ranks."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from torchtree import Data
from torchtree.model.data import as_feature_matrix


def _xy(n=10, d=3, seed=0):
    g = np.random.default_rng(seed)
    X = g.normal(size=(n, d))
    y = np.arange(n) % 2
    return X, y


class ArrayLike:
    """Minimal pandas-like object: only ``__array__``."""

    def __init__(self, a):
        self._a = np.asarray(a)

    def __array__(self, dtype=None, copy=None):
        return self._a if dtype is None else self._a.astype(dtype)


# ----------------------------------------------------------------- bad X
@pytest.mark.parametrize("bad, kind", [(np.inf, "infinite"), (-np.inf, "infinite")])
def test_nonfinite_X_names_row_and_column(bad, kind):
    X, y = _xy()
    X[7, 2] = bad
    X[8, 0] = bad  # a second bad value: the message reports the count and the first
    with pytest.raises(ValueError) as ei:
        Data(X, y)
    msg = str(ei.value)
    assert kind in msg and "row 7" in msg and "column 2" in msg and "2 non-finite" in msg


def test_infinite_X_with_missing_values_names_row_and_column():
    """Missing values are modelled (torchtree.model.encoding); an infinite value still is not."""
    X, y = _xy()
    X[2, 0] = np.nan
    X[7, 2] = np.inf
    with pytest.raises(ValueError, match=r"column 2.*infinite value at row 7"):
        Data(X, y)


def test_missing_X_from_torch_tensor_is_coded():
    X, y = _xy()
    Xt = torch.as_tensor(X)
    Xt[3, 1] = float("nan")
    d = Data(Xt, y)
    assert d.encoder is not None and d.d == X.shape[1] + 1 and bool(torch.isfinite(d.X).all())


def test_1d_X_refused_with_hint():
    with pytest.raises(ValueError, match=r"2-D.*reshape"):
        Data(np.arange(5.0), np.arange(5) % 2)


def test_3d_X_refused():
    with pytest.raises(ValueError, match="2-D"):
        Data(np.zeros((4, 2, 2)), np.arange(4) % 2)


@pytest.mark.parametrize(
    "X",
    [
        np.array([[1 + 1j, 0], [2, 3], [4, 5]]),
        np.array([[1.0, {"a": 1}], [2.0, 3.0], [4.0, 5.0]], dtype=object),
    ],
)
def test_non_numeric_X(X):
    with pytest.raises(ValueError, match="numeric|a number"):
        Data(X, [0, 1, 0])


def test_text_columns_are_categorical():
    d = Data(np.array([["a", 1.0], ["b", 2.0], ["a", 3.0]], dtype=object), [0, 1, 0])
    assert d.encoder is not None and d.encoder.columns[0].kind == "subsets" and d.d == 2


def test_numeric_strings_and_bools_in_X_are_accepted():
    d = Data(np.array([["1.5", "2"], ["3", "4"]]), [0, 1])
    assert torch.equal(d.X, torch.tensor([[1.5, 2.0], [3.0, 4.0]]))
    d = Data(np.array([[True, False], [False, False]]), [0, 1])
    assert torch.equal(d.X, torch.tensor([[1.0, 0.0], [0.0, 0.0]]))


def test_zero_rows_and_zero_features():
    with pytest.raises(ValueError, match="zero rows"):
        Data(np.zeros((0, 3)), np.zeros(0, dtype=int))
    with pytest.raises(ValueError, match="zero features"):
        Data(np.zeros((3, 0)), [0, 1, 0])


def test_X_y_length_mismatch():
    X, y = _xy(10)
    with pytest.raises(ValueError, match=r"10 rows but y has 9"):
        Data(X, y[:9])


def test_y_shapes():
    X, y = _xy(6)
    with pytest.raises(ValueError, match="1-D"):
        Data(X, np.stack([y, y], 1))
    with pytest.raises(ValueError, match="1-D"):
        Data(X, y.reshape(2, 3, 1))
    d = Data(X, y.reshape(-1, 1))  # a single column is fine
    assert torch.equal(d.y, torch.as_tensor(y))


def test_bad_task():
    X, y = _xy()
    with pytest.raises(ValueError, match="task must be one of"):
        Data(X, y, task="clustering")


# ------------------------------------------------------------ labels
def test_continuous_labels_refused_for_classification():
    X, _ = _xy(4)
    with pytest.raises(ValueError, match="continuous"):
        Data(X, [0.0, 0.5, 1.0, 1.0])


def test_nan_labels_refused_for_classification():
    X, _ = _xy(4)
    with pytest.raises(ValueError, match="missing label|infinite label"):
        Data(X, [0.0, np.nan, 1.0, 1.0])


def test_integer_valued_float_labels_are_classes():
    X, _ = _xy(4)
    d = Data(X, [2.0, 0.0, 2.0, 0.0])
    assert d.n_classes == 2 and d.y.tolist() == [1, 0, 1, 0]
    assert d.decode_labels([0, 1]).tolist() == [0, 2]


def test_single_class_refused_unless_n_classes():
    X, _ = _xy(4)
    with pytest.raises(ValueError, match="single class"):
        Data(X, [1, 1, 1, 1])
    d = Data(X, [1, 1, 1, 1], n_classes=3)
    assert d.n_classes == 3 and d.y.tolist() == [1, 1, 1, 1]
    assert d.classes_.tolist() == [0, 1, 2]
    d = Data(X, ["a"] * 4, classes=["a", "b"])
    assert d.n_classes == 2 and d.y.tolist() == [0, 0, 0, 0]


def test_n_classes_range_and_type_checked():
    X, _ = _xy(4)
    with pytest.raises(ValueError, match=r"0\.\.1"):
        Data(X, [0, 1, 2, 0], n_classes=2)
    with pytest.raises(ValueError, match=r"0\.\.2"):
        Data(X, [0, -1, 1, 0], n_classes=3)
    with pytest.raises(ValueError, match="integer labels"):
        Data(X, ["a", "b", "a", "b"], n_classes=2)


def test_explicit_classes_define_codes_and_refuse_unknown():
    X, _ = _xy(4)
    d = Data(X, ["b", "a", "c", "a"], classes=["c", "b", "a"])
    assert d.y.tolist() == [1, 2, 0, 2]
    assert d.decode_labels(d.y).tolist() == ["b", "a", "c", "a"]
    with pytest.raises(ValueError, match="not in the given classes"):
        Data(X, ["b", "a", "z", "a"], classes=["a", "b"])


@pytest.mark.parametrize(
    "labels, classes",
    [
        ([10, 3, 3, 7, 10, 3], [3, 7, 10]),  # ints with gaps
        (["dog", "cat", "cat", "emu", "dog", "cat"], ["cat", "dog", "emu"]),
        ([True, False, False, True, True, False], [False, True]),
        ([-5, 2, 2, -5, 2, 2], [-5, 2]),
    ],
)
def test_discrete_labels_map_to_codes_and_back(labels, classes):
    X, _ = _xy(len(labels))
    d = Data(X, labels)
    assert d.n_classes == len(classes)
    assert d.classes_.tolist() == classes
    assert d.y.dtype == torch.long
    assert d.y.min() >= 0 and d.y.max() == len(classes) - 1
    # the codes follow the order of classes_
    assert [classes[c] for c in d.y.tolist()] == list(labels)
    assert d.decode_labels(d.y).tolist() == list(labels)
    assert d.encode_y(labels).tolist() == d.y.tolist()


def test_encode_y_unseen_label():
    X, _ = _xy(4)
    d = Data(X, ["a", "b", "a", "b"])
    with pytest.raises(ValueError, match=r"'c' was not seen in training"):
        d.encode_y(["a", "c"])
    with pytest.raises(ValueError, match="1-D"):
        d.encode_y([["a"], ["b"]])


def test_encode_y_accepts_float_copies_of_int_labels():
    X, _ = _xy(4)
    d = Data(X, [3, 5, 3, 5])
    assert d.encode_y(np.array([5.0, 3.0])).tolist() == [1, 0]


# -------------------------------------------------------- regression
def test_regression_targets():
    X, _ = _xy(5)
    y = [0.1, -2.5, 3.0, 0.0, 1e6]
    d = Data(X, y, task="regression")
    assert d.y.dtype == torch.float64 and d.y.tolist() == y
    assert d.n_classes is None and d.classes_ is None and not d.is_classification
    with pytest.raises(ValueError, match="only apply to classification"):
        Data(X, y, task="regression", n_classes=2)
    with pytest.raises(ValueError, match="decode_labels"):
        d.decode_labels([0])
    assert d.encode_y([1.5, 2]).dtype == torch.float64


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_nonfinite_regression_targets(bad):
    X, _ = _xy(5)
    with pytest.raises(ValueError, match="missing target|infinite target"):
        Data(X, [0.0, 1.0, bad, 2.0, 3.0], task="regression")
    d = Data(X, [0.0, 1.0, 2.0, 2.0, 3.0], task="regression")
    with pytest.raises(ValueError, match="non-finite"):
        d.encode_y([bad])


def test_non_numeric_regression_targets():
    X, _ = _xy(3)
    with pytest.raises(ValueError, match="numeric"):
        Data(X, ["a", "b", "c"], task="regression")


# ------------------------------------------------------ input kinds
@pytest.mark.parametrize("kind", ["numpy", "torch", "list", "arraylike", "float64torch"])
def test_input_kinds_give_the_same_data(kind):
    X, y = _xy(8, 2, seed=3)
    conv = {
        "numpy": lambda a: a,
        "torch": lambda a: torch.as_tensor(a),
        "float64torch": lambda a: torch.as_tensor(a, dtype=torch.float64),
        "list": lambda a: a.tolist(),
        "arraylike": ArrayLike,
    }[kind]
    d = Data(conv(X), conv(y))
    ref = Data(X, y)
    assert d.X.dtype == torch.float32
    assert torch.equal(d.X, ref.X) and torch.equal(d.y, ref.y)
    assert torch.equal(d.X, torch.as_tensor(X, dtype=torch.float32))


def test_dtype_option():
    X, y = _xy()
    d = Data(X, y, dtype=torch.float64)
    assert d.X.dtype == torch.float64 and torch.equal(d.X, torch.as_tensor(X))
    assert d.sorted_values.dtype == torch.float64


# ----------------------------------------------------------- ranks
def _check_ranks(d: Data, X: np.ndarray):
    N, D = X.shape
    assert d.n == N and d.d == D
    sv, rank, nu = d.sorted_values, d.X_rank, d.n_unique
    assert sv.shape[0] == D and sv.shape[1] == int(nu.max())
    for j in range(D):
        u = np.unique(X[:, j].astype(np.float32))
        assert int(nu[j]) == len(u)
        assert np.array_equal(sv[j, : len(u)].numpy(), u)
        assert torch.isinf(sv[j, len(u):]).all() and (sv[j, len(u):] > 0).all()
        assert (rank[:, j] >= 0).all() and (rank[:, j] < len(u)).all()
    # sorted_values[d, X_rank[n, d]] == X[n, d]
    gathered = torch.gather(sv, 1, rank.T).T
    assert torch.equal(gathered, d.X)
    assert torch.equal(d.feature_min, d.X.min(0).values) and torch.equal(d.feature_max, d.X.max(0).values)


def test_ranks_consistent_random_with_ties():
    g = np.random.default_rng(5)
    X = np.column_stack([g.normal(size=40), g.integers(0, 4, 40), np.full(40, 2.5), g.integers(0, 40, 40) / 7])
    y = g.integers(0, 3, 40)
    d = Data(X, y)
    _check_ranks(d, X)
    # dense rank order agrees with the value order
    for j in range(X.shape[1]):
        xs = d.X[:, j]
        r = d.X_rank[:, j]
        assert torch.equal(xs[:, None] < xs[None, :], r[:, None] < r[None, :])


def test_constant_features_are_legal():
    X = np.column_stack([np.ones(5), np.arange(5.0)])
    d = Data(X, [0, 1, 0, 1, 0])
    assert d.n_unique.tolist() == [1, 5]
    assert (d.X_rank[:, 0] == 0).all()
    _check_ranks(d, X)
    # a fully constant X is legal too
    d = Data(np.zeros((4, 2)), [0, 1, 1, 0])
    assert d.n_unique.tolist() == [1, 1]


# -------------------------------------------------------- check_X
def test_check_X():
    X, y = _xy(10, 3)
    d = Data(X, y)
    out = d.check_X(X[:4])
    assert out.dtype == torch.float32 and torch.equal(out, d.X[:4])
    out = d.check_X(torch.as_tensor(X[:4]))  # float64 tensor fast path converts dtype
    assert out.dtype == torch.float32 and torch.equal(out, d.X[:4])
    with pytest.raises(ValueError, match=r"2 features, but the model is expecting 3 features as input"):
        d.check_X(X[:, :2])
    with pytest.raises(ValueError, match=r"2 features, but the model is expecting 3 features as input"):
        d.check_X(torch.as_tensor(X[:, :2]))
    with pytest.raises(ValueError, match="2-D"):
        d.check_X(X[0])
    bad = torch.as_tensor(X[:4]).clone()
    bad[2, 1] = float("inf")
    with pytest.raises(ValueError, match=r"row 2, column 1"):
        d.check_X(bad)
    with pytest.raises(ValueError, match="zero rows"):
        d.check_X(torch.zeros(0, 3))


def test_as_feature_matrix_returns_float64():
    arr = as_feature_matrix([[1, 2], [3, 4]])
    assert arr.dtype == np.float64 and arr.shape == (2, 2)
    with pytest.raises(ValueError, match="Xtest"):
        as_feature_matrix([[1, np.nan]], name="Xtest")


# ----------------------------------------------------- subset / to
def test_subset_keeps_class_coding():
    X, _ = _xy(6)
    d = Data(X, ["a", "b", "c", "a", "b", "c"])
    s = d.subset(torch.tensor([0, 3]))  # only class "a" remains
    assert s.n_classes == 3 and s.classes_.tolist() == ["a", "b", "c"]
    assert s.y.tolist() == [0, 0] and torch.equal(s.X, d.X[[0, 3]])
    m = d.subset(torch.tensor([False, True, True, False, False, True]))
    assert m.y.tolist() == [1, 2, 2]
    r = Data(X, np.arange(6.0) * 0.5, task="regression").subset(torch.tensor([1, 2]))
    assert r.y.tolist() == [0.5, 1.0] and r.task == "regression"


def test_to_copies_tensors():
    X, y = _xy()
    d = Data(X, y)
    e = d.to("cpu")
    assert e is not d and torch.equal(e.X, d.X) and e.n_classes == d.n_classes
    assert "n=10" in repr(d) and "d=3" in repr(d)


def test_missing_labels_are_named():
    """None / NaN among string or object labels used to fail in np.unique with a TypeError."""
    X, _ = _xy(4)
    for y in ([0, 1, None, 1], np.array(["a", "b", np.nan, "a"], dtype=object)):
        with pytest.raises(ValueError, match="1 missing label\\(s\\) \\(None / NaN\\); the first is at row 2"):
            Data(X, np.asarray(y, dtype=object))
    pd = pytest.importorskip("pandas")
    with pytest.raises(ValueError, match="missing label"):
        Data(X, pd.array(["a", None, "b", "a"], dtype="string"))
