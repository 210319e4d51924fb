"""Packaging: a non-editable install must ship every module.

``pyproject.toml`` lists packages explicitly (``kernels/`` and ``distributed/`` are
mapped into ``torchtree``), so a new subpackage that is not listed works in the
editable development install but is missing from wheels. One test finds every folder
with Python files and checks that it is a listed package; one that each package folder carries
its PEP 561 ``py.typed`` marker and lists it as package data; another clones the repository
into a folder of its own (no neighbouring folders: the repository must be self-contained),
builds the wheel from the clone, installs it into a fresh virtual environment and runs
examples there: one from outside the checkout, one on the clone's own data/ tables.
"""
import os
import re
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_every_subpackage_is_listed_in_pyproject():
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(cfg["packages"])
    mapping = cfg.get("package-dir", {})
    found = set()
    for pkg, folder in mapping.items():
        base = ROOT / folder
        # every folder that holds Python files: one without __init__.py is a defect too
        # (setuptools would leave it out of the wheel)
        for folder in {f.parent for f in base.rglob("*.py")}:
            rel = folder.relative_to(base)
            if any(part.startswith((".", "_")) or part == "tests" for part in rel.parts):
                continue
            found.add(".".join([pkg, *rel.parts]) if rel.parts else pkg)
    # a subfolder of torchtree/ that is itself mapped elsewhere is not double-counted
    missing = sorted(p for p in found if p not in listed)
    assert not missing, f"pyproject.toml [tool.setuptools] packages lacks {missing}"
    assert re.match(r"^torchtree", min(listed))


def test_every_source_folder_is_a_package():
    for folder in ("torchtree", "kernels", "distributed"):
        for sub in {f.parent for f in (ROOT / folder).rglob("*.py")}:
            if "__pycache__" in sub.parts:
                continue
            assert (sub / "__init__.py").exists(), f"{sub.relative_to(ROOT)} has Python files but no __init__.py"


def test_every_package_folder_is_marked_typed():
    """PEP 561: ``py.typed`` in each of the three folders and in pyproject's package-data, so that mypy and
    pyright read the installed package's annotations (without it they treat every name as ``Any``)."""
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    data = cfg.get("package-data", {})
    for pkg, folder in cfg["package-dir"].items():
        assert (ROOT / folder / "py.typed").is_file(), f"{folder}/py.typed is missing"
        assert "py.typed" in data.get(pkg, []), f"pyproject.toml [tool.setuptools.package-data] {pkg!r} lacks py.typed"


@pytest.mark.slow
def test_wheel_from_a_fresh_clone_installs_and_runs(tmp_path):
    """Clone the committed repository into a folder of its own, build the wheel from the clone,
    install it (no dependencies) into a fresh venv whose only other packages are this
    environment's third-party ones, then run an example that needs torchtree.datasets and
    torchtree.pyro from a directory outside the checkout, and one that reads a table of the
    clone's data/ (through TORCHTREE_DATA: the wheel does not carry the tables).

    The clone holds what is committed: uncommitted files are not in it, as on a user's machine."""
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    clone = tmp_path / "own" / "torchtree"
    subprocess.run(["git", "clone", "-q", "--no-hardlinks", str(ROOT), str(clone)], check=True, capture_output=True,
                   text=True, timeout=300)
    assert not (clone.parent.parent / "shared").exists()
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(wheels), str(clone)], check=True, capture_output=True, text=True, timeout=300)
    (wheel,) = wheels.glob("torchtree-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    ours = {str(p.relative_to(clone)) for d in ("torchtree",) for p in (clone / d).rglob("*.py")}
    ours |= {"torchtree/kernels/" + p.name for p in (clone / "kernels").glob("*.py")}
    ours |= {"torchtree/distributed/" + p.name for p in (clone / "distributed").glob("*.py")}
    ours |= {"torchtree/py.typed", "torchtree/kernels/py.typed", "torchtree/distributed/py.typed"}  # PEP 561
    missing = sorted(f for f in ours if f not in names)
    assert not missing, f"the wheel lacks {missing}"

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    fresh_python = venv / "bin" / "python"
    fresh_site = Path(subprocess.run([str(fresh_python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                     check=True, capture_output=True, text=True).stdout.strip())
    # the dependencies (torch, pyro, ...) come from this environment's site-packages, added as a
    # plain path: its .pth files (the editable install of the checkout among them) are not run
    (fresh_site / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(fresh_site), str(wheel)],
                   check=True, capture_output=True, text=True, timeout=300)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["OMP_NUM_THREADS"] = "1"
    where = subprocess.run([str(fresh_python), "-c", "import torchtree, torchtree.datasets.synthetic; print(torchtree.__file__)"],
                           cwd=outside, env=env, check=True, capture_output=True, text=True, timeout=120)
    assert where.stdout.strip().startswith(str(fresh_site)), where.stdout
    script = outside / "pyro_soft_tree.py"
    script.write_text((clone / "examples" / "pyro_soft_tree.py").read_text())
    done = subprocess.run([str(fresh_python), str(script), "--smoke"], cwd=outside, env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "[batched NUTS]" in done.stdout
    # the tables: refused with the way out when nothing says where they are ...
    missing = subprocess.run([str(fresh_python), "-c", "from torchtree.datasets import load_table; load_table('iris')"],
                             cwd=outside, env=env, capture_output=True, text=True, timeout=120)
    assert missing.returncode != 0 and "TORCHTREE_DATA" in missing.stderr, missing.stderr[-2000:]
    # ... and found in the clone's data/ folder when TORCHTREE_DATA names it
    env["TORCHTREE_DATA"] = str(clone / "data")
    quick = subprocess.run([str(fresh_python), str(clone / "examples" / "quickstart.py"), "--smoke"], cwd=clone,
                           env=env, capture_output=True, text=True, timeout=600)
    assert quick.returncode == 0, quick.stderr[-3000:]
    assert "quickstart: done" in quick.stdout and str(clone / "data" / "wine.csv.gz") in quick.stdout, quick.stdout
