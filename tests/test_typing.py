"""What a type checker (mypy, pyright / Pylance) reads of the public API, checked at run time.

The annotations are read with ``typing.get_type_hints`` (cheap): the estimators' ``fit`` / ``set_params``
return ``Self``, parameters accept what their documentation says (``random_state`` a numpy generator, ``prior``
an object, file paths a ``pathlib.Path``), the lazily exported names are declared for checkers, the fitted
attributes are declared without values and the ``Posterior`` protocol's attributes exist on every kind.

``mypy --strict`` on ``tests/typing_user_script.py`` (the README's snippets and more, as a user writes them)
takes half a minute cold, so it runs under ``make typecheck`` (``TORCHTREE_TYPECHECK=1``), not in every run.
"""
from __future__ import annotations

import ast
import inspect
import os
import subprocess
import sys
import types
import typing
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

import torchtree
from torchtree import BayesianTreeClassifier, BayesianTreeRegressor, ChipmanPrior, Posterior
from torchtree.estimator_base import BayesianTreeBase
from torchtree.samplers.protocol import SamplerConfig, SamplerState

ROOT = Path(__file__).resolve().parents[1]
ESTIMATORS = [BayesianTreeClassifier, BayesianTreeRegressor]


def _accepts(hint, *kinds) -> bool:
    """Whether every type of ``kinds`` is one of the members of the union ``hint`` (or ``hint`` itself)."""
    members = set(typing.get_args(hint)) if typing.get_origin(hint) in (typing.Union, types.UnionType) else {hint}
    members = {typing.get_origin(m) or m for m in members}
    return all(k in members for k in kinds)


@pytest.mark.parametrize("Est", ESTIMATORS)
def test_fit_and_set_params_return_self(Est):
    for name in ("fit", "set_params", "set_score_request"):
        assert typing.get_type_hints(getattr(Est, name))["return"] is typing.Self, name


@pytest.mark.parametrize("Est", ESTIMATORS)
def test_parameters_accept_what_they_document(Est):
    init = typing.get_type_hints(Est.__init__)
    assert _accepts(init["random_state"], int, np.random.RandomState, np.random.Generator, type(None))
    assert _accepts(init["prior"], str, ChipmanPrior, torchtree.PoissonPrior)
    assert _accepts(init["n_threads"], str, int)
    if Est is BayesianTreeRegressor:
        seed = typing.get_type_hints(Est.predict_interval)["seed"]
        assert _accepts(seed, int, np.random.RandomState, np.random.Generator, type(None))


@pytest.mark.parametrize("Est", ESTIMATORS)
def test_subclasses_spell_every_base_parameter(Est):
    """The base's keyword parameters are in each subclass's signature (IDEs and checkers see them), with the
    base's defaults and annotations; sampler options still go through ``**sampler_options``."""
    base = inspect.signature(BayesianTreeBase.__init__).parameters
    own = inspect.signature(Est.__init__).parameters
    for name, p in base.items():
        assert name in own, f"{Est.__name__}.__init__ lacks {name}"
        assert (own[name].kind, own[name].default, own[name].annotation) == (p.kind, p.default, p.annotation), name
    assert list(own.values())[-1].kind is inspect.Parameter.VAR_KEYWORD


@pytest.mark.parametrize("Est", ESTIMATORS)
def test_fitted_attributes_are_declared_without_values(Est):
    """Declared for checkers, but an unfitted estimator has none of them (``hasattr``, ``check_is_fitted``)."""
    declared = {k for klass in Est.__mro__ for k in getattr(klass, "__annotations__", {})}
    fitted = {"posterior_", "log_evidence_", "sampler_config_", "hyper_search_", "n_features_in_", "feature_names_in_"}
    fitted |= {"classes_"} if Est is BayesianTreeClassifier else set()
    assert fitted <= declared, fitted - declared
    est = Est()
    assert not any(hasattr(est, k) for k in fitted)
    validation = pytest.importorskip("sklearn.utils.validation")
    with pytest.raises(Exception, match="not fitted"):
        validation.check_is_fitted(est)


def test_sampler_config_and_state_constructors_return_self():
    for fn in (SamplerConfig.of, SamplerConfig.resolve, SamplerConfig.replace, SamplerConfig.with_resolution_of,
               SamplerState.from_state_dict):
        assert typing.get_type_hints(fn)["return"] is typing.Self, fn.__qualname__


def test_file_paths_and_devices_are_typed_as_documented():
    from torchtree.model.bart_posterior import BARTPosterior
    from torchtree.model.loading import load_posterior
    from torchtree.model.soft_posterior import SoftTreePosterior

    kinds = (torchtree.TreePosterior, BARTPosterior, SoftTreePosterior)
    names = {"torch": torch, **{c.__name__: c for c in kinds}}  # what loading.py imports for checkers only
    hints = typing.get_type_hints(load_posterior, localns=names)
    assert _accepts(hints["path"], str, os.PathLike) and _accepts(hints["device"], str, torch.device)
    assert _accepts(hints["return"], *kinds)
    for cls in (Posterior, *kinds):
        assert _accepts(typing.get_type_hints(cls.save)["path"], str, os.PathLike), cls
        load = typing.get_type_hints(cls.load)
        assert _accepts(load["path"], str, os.PathLike) and _accepts(load["device"], str, torch.device), cls


def test_samplers_run_take_a_generator_seed():
    from torchtree.samplers.bart import BART
    from torchtree.samplers.dcc.sampler import DCC
    from torchtree.samplers.nuts import NUTS

    for cls in (torchtree.TopDownSMC, torchtree.MCMC, torchtree.SMCSampler, BART, NUTS, DCC):
        assert _accepts(typing.get_type_hints(cls.run)["seed"], int, torch.Generator, type(None)), cls


def test_lazy_names_are_declared_for_type_checkers():
    """The ``if TYPE_CHECKING:`` block of torchtree/__init__.py imports every lazily exported name from the
    module ``__getattr__`` loads it from (and importing torchtree still loads none of them)."""
    tree = ast.parse((ROOT / "torchtree" / "__init__.py").read_text(encoding="utf-8"))
    declared = {}
    for node in tree.body:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            for imp in node.body:
                declared.update({a.asname or a.name: imp.module for a in imp.names})
    assert declared == torchtree._LAZY
    assert typing.get_type_hints(torchtree.__getattr__) == {"name": str, "return": typing.Any}
    code = ("import sys, torchtree; print(sorted(m for m in sys.modules if m.split('.')[0] == 'pyro' "
            "or m in {'torchtree.soft', 'torchtree.samplers.bart', 'torchtree.model.bart_posterior'}))")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_posterior_protocol_attributes_exist_on_every_kind():
    """What ``Posterior`` declares (its annotations, and the read-only ``weights`` / ``log_evidence``) is on a
    posterior of each kind, with the declared type."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(40, 2))
    y = (X[:, 0] > 0).astype(np.int64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # unconverged tiny runs
        posts = [torchtree.TopDownSMC(n_particles=5).run((X, y), seed=0),
                 torchtree.BART(n_trees=2, n_samples=4, n_warmup=2, n_chains=1).run(
                     torchtree.Data(X, X[:, 1], task="regression"), seed=0),
                 torchtree.NUTS(n_chains=1, n_samples=3, n_warmup=3).run((X, y), seed=torch.Generator().manual_seed(0))]
    hints = typing.get_type_hints(Posterior)
    assert {"info", "n_features", "classes_", "n_particles", "FORMAT"} <= set(hints)
    for post in posts:
        assert isinstance(post.weights, torch.Tensor) and post.weights.dtype == torch.float64
        assert post.log_evidence is None or isinstance(post.log_evidence, float)
        assert post.task in ("classification", "regression")
        assert isinstance(post.info, dict) and isinstance(post.n_features, int) and isinstance(post.n_particles, int)
        assert post.classes_ is None or isinstance(post.classes_, np.ndarray)
        assert isinstance(post.FORMAT, str) and post.FORMAT


@pytest.mark.skipif(os.environ.get("TORCHTREE_TYPECHECK") != "1",
                    reason="mypy --strict takes ~30 s cold: make typecheck runs it (TORCHTREE_TYPECHECK=1)")
def test_user_script_passes_mypy_strict(tmp_path):
    """``mypy --strict`` on tests/typing_user_script.py, reading torchtree from this checkout laid out as
    installed (kernels/ and distributed/ inside torchtree/), its own errors silenced: only the user's code is
    judged. ``TORCHTREE_MYPY_CACHE`` names a cache folder to keep between runs (make typecheck: .mypy_cache)."""
    pytest.importorskip("mypy", reason="the typecheck extra: pip install -e '.[typecheck]'")
    cache = Path(os.environ.get("TORCHTREE_MYPY_CACHE") or tmp_path / "cache").resolve()
    src = cache / "src" / "torchtree"  # kept with the cache: the same paths keep it valid
    src.mkdir(parents=True, exist_ok=True)
    wanted = {p.name: p for p in (ROOT / "torchtree").iterdir() if p.name not in ("kernels", "distributed", "__pycache__")}
    wanted.update(kernels=ROOT / "kernels", distributed=ROOT / "distributed")
    for link in src.iterdir():
        if link.is_symlink() and (link.name not in wanted or link.resolve() != wanted[link.name].resolve()):
            link.unlink()
    for name, target in wanted.items():
        if not (src / name).is_symlink():
            (src / name).symlink_to(target)
    env = {**os.environ, "MYPYPATH": str(src.parent)}
    cmd = [sys.executable, "-m", "mypy", "--strict", "--follow-imports=silent", "--no-error-summary",
           "--cache-dir", str(cache), str(ROOT / "tests" / "typing_user_script.py")]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
