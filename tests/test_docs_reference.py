"""The API reference (docs/reference/*.md) names every public name, and the README stays short.

Reads the Markdown sources only (the ``::: identifier`` directives that mkdocstrings renders,
the ``<!-- options: ... -->`` and ``<!-- cli-help: ... -->`` markers of docs/hooks.py), so it
needs no MkDocs: it runs in the test suite. ``make docs`` builds the site itself, strictly.
"""
from __future__ import annotations

import importlib
import inspect
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "docs" / "reference"
DIRECTIVE = re.compile(r"^:::\s+([\w.]+)\s*$", re.M)
MARKER = re.compile(r"^<!--\s*(options|cli-help):\s*(.*?)\s*-->\s*$", re.M)

# torchtree.distributed is the top-level folder distributed/ installed under that name; the
# reference renders it from there (MkDocs finds packages by folder)
ALIASES = {"distributed.": "torchtree.distributed."}


def _reference_text() -> str:
    return "\n".join(p.read_text(encoding="utf-8") for p in sorted(REFERENCE.glob("*.md")))


def _identifiers() -> set:
    out = set()
    for ident in DIRECTIVE.findall(_reference_text()):
        out.add(ident)
        for short, full in ALIASES.items():
            if ident.startswith(short):
                out.add(full + ident[len(short):])
    return out


def _public_names():
    """(qualified name, the identifiers that document it) for every public name."""
    import torchtree

    out = []
    for name in torchtree.__all__:
        accepted = {f"torchtree.{name}"}
        if name in torchtree._LAZY:  # loaded on first use: documented where it is defined
            accepted.add(f"{torchtree._LAZY[name]}.{name}")
        out.append((f"torchtree.{name}", accepted))
    for module in ("torchtree.datasets", "torchtree.pyro", "torchtree.pyro_bart", "torchtree.testing"):
        mod = importlib.import_module(module)
        for name in mod.__all__:
            out.append((f"{module}.{name}", {f"{module}.{name}"}))
    # the faces of the soft-tree family and of the distributed package: their names are defined in
    # the layers below, so a directive naming the defining module is accepted too (MPIBackend,
    # a lazy attribute, is documented so)
    for module in ("torchtree.soft", "torchtree.distributed"):
        mod = importlib.import_module(module)
        for name in mod.__all__:
            accepted = {f"{module}.{name}"}
            obj = getattr(mod, name)
            if (inspect.isclass(obj) or inspect.isfunction(obj)) and obj.__name__ == name:
                accepted.add(f"{obj.__module__}.{name}")
            out.append((f"{module}.{name}", accepted))
    # torchtree.plot: its reference page renders the whole module ('::: torchtree.plot'), when it imports
    try:
        plot = importlib.import_module("torchtree.plot")
    except Exception:
        plot = None
    for name in getattr(plot, "__all__", ()):
        out.append((f"torchtree.plot.{name}", {f"torchtree.plot.{name}", "torchtree.plot"}))
    return out


PUBLIC = _public_names()


def _builtin_methods() -> dict:
    """``method=`` name -> sampler class, for torchtree's own methods (tests register toy ones too)."""
    from torchtree.methods import METHODS, get_method

    out = {}
    for name in list(METHODS):
        cls = get_method(name)
        if cls.__module__.startswith("torchtree."):
            out[name] = cls
    return out


@pytest.mark.parametrize("qualified,accepted", PUBLIC, ids=[q for q, _ in PUBLIC])
def test_every_public_name_is_in_the_reference(qualified, accepted):
    assert accepted & _identifiers(), (f"{qualified} is public but no docs/reference/*.md page has a "
                                       f"'::: {sorted(accepted)[0]}' directive")


def test_reference_directives_name_real_objects():
    """Every ``:::`` directive names something importable (a typo would only fail the docs build)."""
    for ident in sorted(_identifiers()):
        if not ident.startswith("torchtree.") or ident == "torchtree.plot":  # torchtree.plot: included when importable
            continue
        module, _, attr = ident.rpartition(".")
        try:
            obj = importlib.import_module(ident)
        except ImportError:
            obj = getattr(importlib.import_module(module), attr, None)
        assert obj is not None, f"docs/reference: '::: {ident}' names nothing"


def test_every_sampler_config_has_its_option_table():
    """The settings of each sampler are rendered from its config class, the one place their help is written."""
    from torchtree.samplers.protocol import config_class_of

    tables = {arg for kind, arg in MARKER.findall(_reference_text()) if kind == "options"}
    for path in tables:
        module, _, name = path.rpartition(".")
        cls = getattr(importlib.import_module(module), name)
        assert cls.options(), path
    wanted = {"TopDownConfig", "MCMCConfig", "SMCSamplerConfig", "BARTConfig", "NUTSConfig", "DCCConfig"}
    for sampler in _builtin_methods().values():
        cfg = config_class_of(sampler)
        if cfg is not None:
            wanted.add(cfg.__name__)
    missing = wanted - {p.rpartition(".")[2] for p in tables}
    assert not missing, f"no '<!-- options: ... -->' table in docs/reference for {sorted(missing)}"


def test_every_command_and_method_has_its_help_page():
    helps = {arg for kind, arg in MARKER.findall(_reference_text()) if kind == "cli-help"}
    for command in ("", "predict", "summary", "demo", "bench"):
        assert command in helps, f"docs/reference/cli.md: no '<!-- cli-help: {command} -->'"
    for method in _builtin_methods():
        assert f"fit --method {method}" in helps, f"docs/reference/cli.md: no help page of fit --method {method}"


def test_every_reference_page_is_in_the_nav():
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    for page in sorted(REFERENCE.glob("*.md")):
        assert f"reference/{page.name}" in nav, f"docs/reference/{page.name} is not in mkdocs.yml's nav"


def test_readme_is_short_and_its_snippets_compile():
    """Issue 38: the README is at most 150 lines; its python blocks (run by
    benchmarks/check_readme_snippets.py) are valid Python."""
    import ast

    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 150, f"README.md has {len(text.splitlines())} lines (at most 150)"
    blocks = re.findall(r"^```python\s*\n(.*?)^```", text, re.M | re.S)
    assert len(blocks) >= 3, "README.md: the classification, regression and BART examples"
    for code in blocks:
        ast.parse(code)


def _hooks():
    """docs/hooks.py, the MkDocs hook module (it imports no MkDocs at module level)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("torchtree_docs_hooks", ROOT / "docs" / "hooks.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _allowed_cells(hooks, dotted: str) -> dict:
    cells = {}
    for line in hooks.option_table(dotted).splitlines():
        parts = [p.strip() for p in line.split("|")]
        if len(parts) > 4 and parts[1].startswith("`"):
            cells[parts[1].strip("`")] = parts[4]
    return cells


def test_option_tables_render_open_bounds_as_open():
    """An ``option(low=..., low_open=True)`` refuses the bound itself: the "allowed" cell says ``> 0``, not ``>= 0``."""
    hooks = _hooks()
    bart = _allowed_cells(hooks, "torchtree.samplers.bart.config.BARTConfig")
    assert bart["k"] == "> 0" and bart["nu"] == "> 0" and bart["sigma_hat"] == "> 0"
    assert bart["max_rhat"] == "> 1"
    assert bart["alpha_split"] == "(0, 1)" and bart["q"] == "(0, 1)"
    assert bart["max_depth"] == "[1, 14]" and bart["n_trees"] == ">= 1" and bart["beta_split"] == ">= 0"
    nuts = _allowed_cells(hooks, "torchtree.samplers.nuts.config.NUTSConfig")
    assert nuts["sharpness"] == "> 0" and nuts["target_accept"] == "(0, 1)"


def test_every_option_table_cell_matches_the_fields_bounds():
    """For every table in docs/reference: open ends render as ``>`` / ``(`` / ``)``, closed ones as ``>=`` / ``[`` / ``]``."""
    import dataclasses

    hooks = _hooks()
    tables = {arg for kind, arg in MARKER.findall(_reference_text()) if kind == "options"}
    for path in sorted(tables):
        module, _, name = path.rpartition(".")
        cells = _allowed_cells(hooks, path)
        for f in dataclasses.fields(getattr(importlib.import_module(module), name)):
            meta = f.metadata or {}
            if meta.get("choices") is not None:
                continue
            lo, hi = meta.get("low"), meta.get("high")
            lo_open, hi_open = bool(meta.get("low_open")), bool(meta.get("high_open"))
            cell = cells[f.name]
            if lo is not None and hi is not None:
                assert cell == f"{'(' if lo_open else '['}{lo:g}, {hi:g}{')' if hi_open else ']'}", (path, f.name, cell)
            elif lo is not None:
                assert cell == f"{'>' if lo_open else '>='} {lo:g}", (path, f.name, cell)
            elif hi is not None:
                assert cell == f"{'<' if hi_open else '<='} {hi:g}", (path, f.name, cell)


def test_no_semicolon_joined_parameter_entries():
    """``a : T; b : U`` on one line of a numpy-style section renders as one entry (griffe reads ``b`` as part
    of ``a``'s type): one entry per line."""
    joined = re.compile(r"^ +[A-Za-z_][A-Za-z_0-9, *]* : [^;\n]*; [A-Za-z_][A-Za-z_0-9, ]* : ", re.M)
    bad = []
    for folder in ("torchtree", "kernels", "distributed"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path.is_symlink() or any(p.is_symlink() for p in path.parents if ROOT in p.parents):
                continue
            for m in joined.finditer(path.read_text(encoding="utf-8")):
                bad.append(f"{path.relative_to(ROOT)}: {m.group(0).strip()}")
    assert not bad, "Parameters entries joined by ';':\n" + "\n".join(bad)
