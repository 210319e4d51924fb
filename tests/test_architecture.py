"""The architecture, checked from the source: layers, import direction, cycles, private names, file sizes.

Layers, lowest first (docs/architecture.md). A module may import from its own layer and
the layers below it, never from a layer above; no import cycle anywhere, with imports
inside functions counted too (a lazy import is still a dependency). No module imports another
module's private names (one leading underscore).
"""
import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"torchtree": ROOT / "torchtree", "torchtree.kernels": ROOT / "kernels",
            "torchtree.distributed": ROOT / "distributed"}

# layer -> module prefixes; a module belongs to the layer of its longest matching prefix
LAYERS = [
    ("base", ["torchtree.kernels", "torchtree.distributed", "torchtree.datasets", "torchtree._version"]),
    ("core", ["torchtree.core", "torchtree.io", "torchtree.monitor"]),
    ("model", ["torchtree.model"]),
    ("steps", ["torchtree.steps"]),
    ("samplers", ["torchtree.samplers"]),
    ("faces", ["torchtree", "torchtree.estimators", "torchtree.cli", "torchtree.pyro", "torchtree.soft", "torchtree.plot",
               "torchtree.testing", "torchtree.__main__", "torchtree._aliases"]),
]
# packages at the bottom that must not depend on each other or on anything above
ISOLATED = ["torchtree.kernels", "torchtree.distributed"]
MAX_LINES = 600
# (module, private name) still imported by another module: each is to be made public or moved
# next to its user. Empty since every such import was removed: never add to it.
PRIVATE_IMPORTS_TO_REMOVE: set = set()


def modules():
    """module name -> (path, is_package) for every module of the three source folders."""
    out = {}
    for pkg, folder in PACKAGES.items():
        for path in folder.rglob("*.py"):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            is_pkg = parts[-1] == "__init__"
            if is_pkg:
                parts = parts[:-1]
            out[".".join([pkg, *parts])] = (path, is_pkg)
    return out


def from_module(name, is_pkg, node):
    """The absolute module of ``from ... import`` statement ``node`` in module ``name``."""
    if not node.level:
        return node.module or ""
    base = name.split(".") if is_pkg else name.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports(name, path, is_pkg, known):
    """Modules of ours that ``name`` imports (at any depth of its code)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        targets = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            mod = from_module(name, is_pkg, node)
            targets = [mod] + [f"{mod}.{a.name}" for a in node.names]
        for t in targets:
            while t and t not in known:
                t = t.rpartition(".")[0]
            if t and t != name:
                found.add(t)
    return found


def private_imports(name, source, is_pkg, known):
    """``(module, name)`` for every private name (one leading underscore, not a dunder) that
    ``name`` imports from a module of ours, at any depth of its code. A private *module*
    (``from torchtree import _aliases``) is no private name and is not listed."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.ImportFrom):
            continue
        mod = from_module(name, is_pkg, node)
        if not any(mod == p or mod.startswith(p + ".") for p in PACKAGES):
            continue
        for a in node.names:
            if a.name.startswith("_") and not a.name.startswith("__") and f"{mod}.{a.name}" not in known:
                found.append((mod, a.name))
    return found


def layer_of(name):
    best, rank = "", None
    for i, (_, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            if (name == p or name.startswith(p + ".")) and len(p) > len(best):
                best, rank = p, i
    return rank


def graph():
    mods = modules()
    return {n: imports(n, p, pkg, mods) for n, (p, pkg) in mods.items()}


def cycles(edges):
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]
    for root in edges:
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(edges[w]))))
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
    return out


def test_every_module_has_a_layer():
    missing = sorted(n for n in modules() if layer_of(n) is None)
    assert not missing, f"modules outside every layer (add them to LAYERS): {missing}"


def test_imports_point_down():
    bad = []
    for name, deps in graph().items():
        for dep in deps:
            if layer_of(dep) > layer_of(name):
                bad.append(f"{name} ({LAYERS[layer_of(name)][0]}) imports {dep} ({LAYERS[layer_of(dep)][0]})")
    assert not bad, "upward imports:\n" + "\n".join(sorted(bad))


def test_bottom_packages_stand_alone():
    bad = []
    for name, deps in graph().items():
        for pkg in ISOLATED:
            if name == pkg or name.startswith(pkg + "."):
                bad += [f"{name} imports {d}" for d in deps if not (d == pkg or d.startswith(pkg + "."))]
    assert not bad, "\n".join(sorted(bad))


def test_no_import_cycles():
    found = cycles(graph())
    assert not found, f"import cycles: {found}"


def test_no_module_imports_another_modules_private_names():
    """A name with a leading underscore belongs to its module: another module that needs it
    wants it public (renamed) or moved next to its user."""
    mods = modules()
    bad = sorted(f"{path.relative_to(ROOT)}: from {mod} import {imported}"
                 for name, (path, is_pkg) in mods.items()
                 for mod, imported in private_imports(name, path.read_text(), is_pkg, mods)
                 if (mod, imported) not in PRIVATE_IMPORTS_TO_REMOVE)
    assert not bad, "private names imported from another module (make them public or move them):\n" + "\n".join(bad)


def test_the_checker_finds_private_imports():
    """The private-name check can fail: imports at module level, inside a function and relative
    ones are found; dunders, private modules and names of other packages are not."""
    known = {"torchtree", "torchtree.cli", "torchtree.cli.common", "torchtree.model.trees", "torchtree._aliases"}
    source = (
        "from torchtree.model.trees import _FILL, HardTrees\n"
        "from torchtree import _aliases, __version__\n"
        "from numpy import _NoValue\n"
        "def f():\n"
        "    from .common import _fmt\n"
    )
    found = private_imports("torchtree.cli.fit", source, False, known)
    assert found == [("torchtree.model.trees", "_FILL"), ("torchtree.cli.common", "_fmt")]


def test_files_stay_focused():
    long = {str(p.relative_to(ROOT)): n for p, _ in modules().values()
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, (f"files over {MAX_LINES} lines: {long}. Split each where a concept ends (a class and its "
                      "helpers, a file format, one step of an algorithm) into a module of its own and import it "
                      "from there, rather than squeezing lines; see CONTRIBUTING.md")


def test_the_checker_finds_upward_imports_and_cycles():
    """The checks above can fail: a made-up graph with an upward import and a cycle."""
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}
    assert cycles(edges) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
    assert layer_of("torchtree.model.data") < layer_of("torchtree.samplers.topdown")
    assert layer_of("torchtree.kernels.hashing") == 0 and layer_of("torchtree.estimators") == len(LAYERS) - 1


@pytest.mark.parametrize("old,new", [("torchtree.topdown", "torchtree.samplers.topdown"),
                                     ("torchtree.soft.dcc", "torchtree.samplers.dcc.sampler"),
                                     ("torchtree.data", "torchtree.model.data"),
                                     ("torchtree.samplers.topdown_dist", "torchtree.samplers.topdown"),
                                     ("torchtree.samplers.topdown_particles", "torchtree.samplers.topdown.particles"),
                                     ("torchtree.samplers.hyper", "torchtree.samplers.tuning.evidence"),
                                     ("torchtree.samplers.topdown_starts", "torchtree.samplers.tuning.starts"),
                                     ("torchtree.samplers.soft_chains", "torchtree.samplers.nuts.chains"),
                                     ("torchtree.samplers.smc_engine", "torchtree.core.smc")])
def test_old_module_paths_still_import_with_a_warning(old, new):
    import importlib
    import sys

    import torchtree  # noqa: F401  (installs the alias finder)

    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning, match=new.replace(".", r"\.")):
        mod = importlib.import_module(old)
    assert mod is importlib.import_module(new)
