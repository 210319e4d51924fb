"""Packaging: a non-editable ``pip install .`` must ship every subpackage.

``pyproject.toml`` lists packages explicitly (``kernels/`` and ``distributed/`` are
mapped into ``torchtree``), so a new subpackage that is not listed works in the
editable development install but is missing from wheels. This test finds every
folder with an ``__init__.py`` and checks that it is listed.
"""
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_subpackage_is_listed_in_pyproject():
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(cfg["packages"])
    mapping = cfg.get("package-dir", {})
    found = set()
    for pkg, folder in mapping.items():
        base = ROOT / folder
        for init in base.rglob("__init__.py"):
            rel = init.parent.relative_to(base)
            if any(part.startswith((".", "_")) or part == "tests" for part in rel.parts):
                continue
            found.add(".".join([pkg, *rel.parts]) if rel.parts else pkg)
    # a subfolder of torchtree/ that is itself mapped elsewhere is not double-counted
    missing = sorted(p for p in found if p not in listed)
    assert not missing, f"pyproject.toml [tool.setuptools] packages lacks {missing}"
    assert re.match(r"^torchtree", min(listed))
