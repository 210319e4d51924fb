"""What a type checker (mypy, pyright / Pylance) reads of the public API, checked at run time.

The annotations are read with ``typing.get_type_hints`` (cheap): the estimators' ``fit`` / ``set_params``
return ``Self``, parameters accept what their documentation says (``random_state`` a numpy generator, ``prior``
an object, file paths a ``pathlib.Path``), the lazily exported names are declared for checkers, the fitted
attributes are declared without values and the ``Posterior`` protocol's attributes exist on every kind, and the
estimators' ``**sampler_options`` (``Unpack[SamplerOptions]``) list exactly the options the methods take.

``mypy --strict`` on ``tests/typing_user_script.py`` (the README's snippets and more, as a user writes them)
takes half a minute cold, so it runs under ``make typecheck`` (``TORCHTREE_TYPECHECK=1``), not in every run. mypy on
a few lines with a misspelt sampler option reads only the estimators' modules (seconds): it runs wherever mypy is
installed.
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
    base's defaults and annotations; sampler options still go through ``**sampler_options`` (typed by the
    subclass: ``Unpack[SamplerOptions]``, where the base takes ``Any``)."""
    base = inspect.signature(BayesianTreeBase.__init__).parameters
    own = inspect.signature(Est.__init__).parameters
    for name, p in base.items():
        assert name in own, f"{Est.__name__}.__init__ lacks {name}"
        if p.kind is inspect.Parameter.VAR_KEYWORD:
            assert own[name].kind is p.kind, name
            continue
        assert (own[name].kind, own[name].default, own[name].annotation) == (p.kind, p.default, p.annotation), name
    assert list(own.values())[-1].kind is inspect.Parameter.VAR_KEYWORD


def _builtin_options() -> dict:
    """option name -> ``[(method, annotation or None, default, has presets)]`` for torchtree's own methods, read
    from what ``fit`` checks the names against (:func:`torchtree.methods.accepted_settings`: a config's option table
    and the model objects the constructor takes besides it; the latter have no annotation here)."""
    from torchtree.methods import METHODS, accepted_settings, get_method
    from torchtree.samplers.protocol import config_class_of

    out: dict = {}
    for method in list(METHODS):
        cls = get_method(method)
        if not cls.__module__.startswith("torchtree."):  # a toy method another test registered
            continue
        config = config_class_of(cls)
        table = {o.name: o for o in config.options()} if config is not None else {}
        params = inspect.signature(cls.__init__).parameters
        for name in accepted_settings(cls):
            o = table.get(name)
            row = (method, o.type, o.default, bool(o.presets)) if o else (method, None, params[name].default, False)
            out.setdefault(name, []).append(row)
    return out


def _sampler_options_type(Est) -> type:
    """The TypedDict of ``Est.__init__``'s ``**sampler_options: Unpack[...]``."""
    hint = typing.get_type_hints(Est.__init__)["sampler_options"]
    assert typing.get_origin(hint) is typing.Unpack, hint
    return typing.get_args(hint)[0]


def _takes(hint, value) -> bool:
    """Whether ``value`` is of type ``hint`` as a checker reads it, at the level of runtime classes: a member of the
    union that is a Literal holding it, or whose class (a generic's origin) it is an instance of; an int is a float."""
    members = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    for m in members:
        if typing.get_origin(m) is typing.Literal:
            if any(type(v) is type(value) and v == value for v in typing.get_args(m)):
                return True
        elif isinstance(value, typing.get_origin(m) or m) or (m is float and type(value) is int):
            return True
    return False


def _covers(hint, declared) -> bool:
    """Whether every class a config's annotation ``declared`` admits is a subclass of a class ``hint`` admits."""
    def classes(h, literals: bool):
        members = typing.get_args(h) if typing.get_origin(h) in (typing.Union, types.UnionType) else (h,)
        out = set()
        for m in members:
            if typing.get_origin(m) is typing.Literal:
                out |= {type(v) for v in typing.get_args(m)} if literals else set()
            else:
                out.add(typing.get_origin(m) or m)
        return out
    mine = classes(hint, literals=False)
    return all(any(issubclass(c, t) for t in mine) or (c is int and float in mine) for c in classes(declared, True))


@pytest.mark.parametrize("Est", ESTIMATORS)
def test_sampler_options_list_exactly_the_options_the_methods_take(Est):
    """The TypedDict of ``**sampler_options`` has one key per option some built-in method takes at run time (the
    tables ``fit`` refuses unknown names against), less the estimator's own parameters (a key may not repeat a
    named parameter); every key is optional. An option added to a sampler and not to the TypedDict fails here."""
    td = _sampler_options_type(Est)
    keys = set(typing.get_type_hints(td))
    own = {n for n, p in inspect.signature(Est.__init__).parameters.items() if p.kind is not p.VAR_KEYWORD}
    expected = set(_builtin_options()) - own
    assert not (expected - keys), f"options missing from {td.__name__}: {sorted(expected - keys)}"
    assert not (keys - expected), f"{td.__name__} lists names no method takes: {sorted(keys - expected)}"
    assert td.__required_keys__ == frozenset() and td.__optional_keys__ == frozenset(keys)


@pytest.mark.parametrize("Est", ESTIMATORS)
def test_sampler_options_accept_every_methods_values(Est):
    """Each key's annotation accepts the option's default in every method that takes it, admits the classes the
    method's config declares for it, and takes ``"auto"`` where the method has presets for it."""
    hints = typing.get_type_hints(_sampler_options_type(Est))
    options = _builtin_options()
    for name, hint in hints.items():
        for method, declared, default, presets in options[name]:
            assert _takes(hint, default), f"{name}: {hint} refuses {method}'s default {default!r}"
            assert declared is None or _covers(hint, declared), f"{name}: {hint} does not admit {method}'s {declared}"
            assert not presets or _takes(hint, "auto"), f"{name}: {hint} refuses 'auto' ({method} has presets)"


def test_sampler_options_check_detects_a_missing_or_narrow_key():
    """The checks above can fail: a made-up TypedDict missing an option, and an annotation refusing a default."""
    class Narrow(typing.TypedDict, total=False):
        n_particles: int  # refuses "auto"
        dtype: str  # refuses DCC's torch.float32

    hints = typing.get_type_hints(Narrow)
    assert not _takes(hints["n_particles"], "auto") and not _takes(hints["dtype"], torch.float32)
    assert _takes(typing.Optional[float], 1) and _takes(typing.Union[int, typing.Literal["auto"]], "auto")
    assert not _covers(str, torch.dtype) and _covers(typing.Sequence[float], typing.Tuple[float, float])
    assert set(_builtin_options()) - set(hints) - {"n_particles", "dtype"}  # what the key check would name


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


def test_samplers_run_take_the_base_run_keywords():
    """Every sampler's ``run`` takes the keywords of ``SamplerBase.run`` (what checkers require of an override); the
    soft-tree samplers, which run in one process, refuse a backend other than None."""
    from torchtree.samplers.bart import BART
    from torchtree.samplers.base import SamplerBase
    from torchtree.samplers.dcc.sampler import DCC
    from torchtree.samplers.nuts import NUTS

    base = {n for n, p in inspect.signature(SamplerBase.run).parameters.items() if p.kind is p.KEYWORD_ONLY}
    for cls in (torchtree.TopDownSMC, torchtree.MCMC, torchtree.SMCSampler, BART, NUTS, DCC):
        params = inspect.signature(cls.run).parameters
        assert all(n in params and params[n].default is None for n in base), cls
    for cls in (NUTS, DCC):
        with pytest.raises(TypeError, match="runs in one process"):
            cls().run(None, backend="local")


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


def _checkout_as_installed(cache: Path) -> Path:
    """A folder under ``cache`` holding this checkout's package laid out as installed (kernels/ and distributed/
    inside torchtree/, as symbolic links), for ``MYPYPATH``. Kept with the cache: the same paths keep it valid."""
    src = cache / "src" / "torchtree"
    src.mkdir(parents=True, exist_ok=True)
    wanted = {p.name: p for p in (ROOT / "torchtree").iterdir() if p.name not in ("kernels", "distributed", "__pycache__")}
    wanted.update(kernels=ROOT / "kernels", distributed=ROOT / "distributed")
    for link in src.iterdir():
        if link.is_symlink() and (link.name not in wanted or link.resolve() != wanted[link.name].resolve()):
            link.unlink()
    for name, target in wanted.items():
        if not (src / name).is_symlink():
            (src / name).symlink_to(target)
    return src.parent


@pytest.mark.skipif(os.environ.get("TORCHTREE_TYPECHECK") != "1",
                    reason="mypy --strict takes ~30 s cold: make typecheck runs it (TORCHTREE_TYPECHECK=1)")
def test_user_script_passes_mypy_strict(tmp_path):
    """``mypy --strict`` on tests/typing_user_script.py, reading torchtree from this checkout laid out as
    installed (kernels/ and distributed/ inside torchtree/), its own errors silenced: only the user's code is
    judged. ``TORCHTREE_MYPY_CACHE`` names a cache folder to keep between runs (make typecheck: .mypy_cache)."""
    pytest.importorskip("mypy", reason="the typecheck extra: pip install -e '.[typecheck]'")
    cache = Path(os.environ.get("TORCHTREE_MYPY_CACHE") or tmp_path / "cache").resolve()
    env = {**os.environ, "MYPYPATH": str(_checkout_as_installed(cache))}
    cmd = [sys.executable, "-m", "mypy", "--strict", "--follow-imports=silent", "--no-error-summary",
           "--cache-dir", str(cache), str(ROOT / "tests" / "typing_user_script.py")]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr


_MISSPELT = '''from torchtree.estimators import BayesianTreeClassifier, BayesianTreeRegressor

BayesianTreeRegressor(method="bart", n_trees=50, n_samples="auto", dtype="float64", alpha=None)
BayesianTreeClassifier(method="smc", n_particles=100, move_probs=[0.5, 0.5, 0.0, 0.0])
BayesianTreeRegressor(method="bart", n_tres=50)
BayesianTreeClassifier(random_sate=0)
BayesianTreeClassifier(n_particles="many")
BayesianTreeClassifier(alpha=1.0, method="dcc", n_chains=2).set_params(n_partciles=5)
'''


@pytest.mark.slow
def test_mypy_names_a_misspelt_sampler_option(tmp_path):
    """mypy on a few lines of user code: the right sampler options pass, a misspelt one is an error naming it, and so
    is a value of the wrong type (``set_params`` takes any name: it is checked at run time). Only the estimators'
    modules are read (the rest of torchtree, torch and numpy are skipped), so a cold run takes seconds;
    ``TORCHTREE_MYPY_CACHE`` keeps its cache in a subfolder."""
    pytest.importorskip("mypy", reason="mypy is not installed (the typecheck extra: pip install -e '.[typecheck]')")
    root = os.environ.get("TORCHTREE_MYPY_CACHE")
    cache = (Path(root) / "sampler_options" if root else tmp_path / "cache").resolve()
    script, config = tmp_path / "user.py", tmp_path / "mypy.ini"
    script.write_text(_MISSPELT, encoding="utf-8")
    config.write_text("[mypy]\nfollow_imports = skip\n\n[mypy-torchtree.estimators,torchtree.methods]\n"
                      "follow_imports = silent\n", encoding="utf-8")
    env = {**os.environ, "MYPYPATH": str(_checkout_as_installed(cache))}
    cmd = [sys.executable, "-m", "mypy", "--config-file", str(config), "--strict", "--no-error-summary",
           "--cache-dir", str(cache), str(script)]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    errors = [line for line in out.stdout.splitlines() if ": error: " in line]
    assert [int(line.split(":")[1]) for line in errors] == [5, 6, 7], out.stdout + out.stderr
    assert '"n_tres"' in errors[0] and 'did you mean "n_trees"' in errors[0]
    assert '"random_sate"' in errors[1]
    assert '"n_particles"' in errors[2] and "many" in errors[2]
