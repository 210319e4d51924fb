"""MkDocs hooks of the torchtree site (``mkdocs.yml``: ``hooks: [docs/hooks.py]``).

Markers a page may hold, each on a line of its own, replaced before the Markdown is rendered:

``<!-- options: dotted.path.SomeConfig -->``
    The option table of a sampler's settings, read from the frozen dataclass's fields
    (:meth:`torchtree.samplers.protocol.SamplerConfig.options`): name, default, allowed values,
    whether the setting decides the result, the presets of ``"auto"`` and the help line. The help
    is written once, in the config, and rendered here, in ``--help`` and in the estimators.
``<!-- cli-help: fit --method smc -->``
    The ``--help`` page of ``torchtree ARGS`` (the same option tables, as the command line prints them).
``<!-- gallery: examples/NAME.py -->``
    An example script: how to run it, what it printed and the figures it saved when the site was
    built (see below), and its source.
``<!-- if-importable: MODULE -->`` ... ``<!-- end-if -->``
    The lines between are kept only when ``MODULE`` imports (a module still being written leaves a
    note instead of failing the build).

Links from a page to a repository file outside ``docs/`` (``../benchmarks/results/bench_scale.txt``,
written relative to the page's source so that they work when the Markdown is read in the
repository too) are checked: the file is copied into the site under ``repo/`` and the link
rewritten to the copy; a link to a missing file is a warning, so ``mkdocs build --strict`` fails.

Gallery runs. Every script named by a ``gallery`` marker runs once per build, in a fresh temporary
folder, with ``TORCHTREE_FIGURES_DIR`` set to an empty folder: a script that saves figures there
(PNG, SVG, JPEG) gets them embedded under its output. ``TORCHTREE_DOCS_GALLERY`` chooses how:
``smoke`` (the default: ``--smoke``, the tiny configuration the test suite runs, seconds each),
``full`` (as written, minutes) or ``off`` (no runs: the pages show the source only; CI builds so,
since the test suite already runs every ``--smoke``). A script that fails is a warning (so a strict
build fails).
"""
from __future__ import annotations

import contextlib
import importlib
import io
import logging
import os
import posixpath
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

ROOT = Path(__file__).resolve().parent.parent
#: repository folders (and files) whose files pages may link to; copied into the site under ``repo/``
LINKABLE = ("examples", "benchmarks", "data/README.md", "tests/golden/README.md", "kernels/csrc", "CONTRIBUTING.md")
REPO_PREFIX = "repo"
FIGURE_SUFFIXES = (".png", ".svg", ".jpg", ".jpeg")
GALLERY_TIMEOUT = 900

log = logging.getLogger("mkdocs.hooks.torchtree")

_MARKER = re.compile(r"^<!--\s*(options|cli-help|gallery):\s*(.*?)\s*-->\s*$", re.M)
_IF_BLOCK = re.compile(r"^<!--\s*if-importable:\s*([\w.]+)\s*-->\s*\n(.*?)^<!--\s*end-if\s*-->\s*$", re.M | re.S)
_LINK = re.compile(r"(\]\()([^)\s#]+)(#[^)\s]*)?(\))")

_gallery: Dict[str, Dict[str, Any]] = {}
_figures_root: Optional[Path] = None


# --------------------------------------------------------------------------- option tables
def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _type_name(tp: Any) -> str:
    if tp is None:
        return ""
    if isinstance(tp, type):
        return tp.__name__
    return re.sub(r"\btyping\.", "", str(tp)).replace("NoneType", "None")


def _allowed(opt, low_open: bool = False, high_open: bool = False) -> str:
    """The "allowed" cell: the choices, or the bounds of a number, each end closed or open.

    ``low_open`` / ``high_open`` are the :func:`~torchtree.samplers.protocol.option` flags of the
    field (the bound itself refused): ``> 0`` rather than ``>= 0``, ``(0, 1)`` rather than ``[0, 1]``.
    """
    if opt.choices is not None:
        return ", ".join(f"`{c!r}`" for c in opt.choices)
    lo = "" if opt.low is None else f"{opt.low:g}"
    hi = "" if opt.high is None else f"{opt.high:g}"
    if lo and hi:
        return f"{'(' if low_open else '['}{lo}, {hi}{')' if high_open else ']'}"
    if lo:
        return f"{'>' if low_open else '>='} {lo}"
    if hi:
        return f"{'<' if high_open else '<='} {hi}"
    return ""


def _open_ends(cls) -> Dict[str, tuple]:
    """Field name -> (low_open, high_open), read from the dataclass fields' :func:`option` metadata."""
    import dataclasses

    return {f.name: (bool((f.metadata or {}).get("low_open")), bool((f.metadata or {}).get("high_open")))
            for f in dataclasses.fields(cls)}


def option_table(dotted: str) -> str:
    """The Markdown table of the settings of the config class ``dotted`` (module path + class name)."""
    module, _, name = dotted.rpartition(".")
    cls = getattr(importlib.import_module(module), name)
    rows = ["| setting | default | type | allowed | decides the result | `\"auto\"` presets | meaning |",
            "|---|---|---|---|---|---|---|"]
    open_ends = _open_ends(cls)
    for opt in cls.options():
        presets = "; ".join(f"`{p.name}`: {p.why}" for p in opt.presets)
        allowed = _allowed(opt, *open_ends.get(opt.name, (False, False)))
        rows.append(f"| `{opt.name}` | `{opt.default!r}` | {_cell(_type_name(opt.type))} | {_cell(allowed)} | "
                    f"{'yes' if opt.result else 'no'} | {_cell(presets)} | {_cell(opt.help)} |")
    note = (f"*Settings of `{name}`, generated from the dataclass `{dotted}`. A setting with presets may be "
            "given as `\"auto\"`: the first preset whose condition holds on the data chooses its value "
            "(the estimators and `torchtree fit` ask for `\"auto\"` on every such setting you leave out). "
            "Settings that do not decide the result stay out of the checkpoint fingerprint.*")
    return note + "\n\n" + "\n".join(rows) + "\n"


# --------------------------------------------------------------------------- CLI help
def cli_help(args: str) -> str:
    """``torchtree ARGS --help`` as a text block."""
    from torchtree.cli import main

    out = io.StringIO()
    argv = args.split() + ["--help"]
    with contextlib.redirect_stdout(out):
        try:
            main(argv)
        except SystemExit:
            pass
    text = out.getvalue().rstrip()
    if not text:
        log.warning(f"cli-help: 'torchtree {' '.join(argv)}' printed nothing")
    return f"```text\n$ torchtree {' '.join(argv)}\n{text}\n```\n"


# --------------------------------------------------------------------------- gallery
def gallery_mode() -> str:
    mode = os.environ.get("TORCHTREE_DOCS_GALLERY", "smoke").strip().lower()
    if mode not in ("smoke", "full", "off"):
        raise ValueError(f"TORCHTREE_DOCS_GALLERY={mode!r}: use smoke, full or off")
    return mode


def gallery_scripts(docs_dir: Path) -> List[str]:
    """The scripts named by ``gallery`` markers in the pages, repository-relative, in page order."""
    found = []
    for page in sorted(docs_dir.rglob("*.md")):
        for kind, arg in _MARKER.findall(page.read_text(encoding="utf-8")):
            if kind == "gallery" and arg not in found:
                found.append(arg)
    return found


def run_script(script: str, mode: str, figures_dir: Path) -> Dict[str, Any]:
    """Run one gallery script; returns its output, exit status, seconds and figures."""
    env = dict(os.environ, TORCHTREE_FIGURES_DIR=str(figures_dir), MPLBACKEND="Agg",
               PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.setdefault("OMP_NUM_THREADS", "1")
    argv = [sys.executable, str(ROOT / script)] + (["--smoke"] if mode == "smoke" else [])
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="docs_gallery_") as cwd:
        try:
            p = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=GALLERY_TIMEOUT)
            code, out, err = p.returncode, p.stdout, p.stderr
        except subprocess.TimeoutExpired as exc:
            code, out, err = "timeout", str(exc.stdout or ""), str(exc.stderr or "")
    figures = sorted(f for f in figures_dir.rglob("*") if f.suffix.lower() in FIGURE_SUFFIXES)
    return {"code": code, "stdout": out, "stderr": err, "seconds": time.perf_counter() - t0, "figures": figures,
            "mode": mode}


def _gallery_block(script: str, page_uri: str) -> str:
    stem = Path(script).stem
    parts = [f"Run it from the repository root: `python {script}` (or `python {script} --smoke` for a tiny "
             "configuration that finishes in seconds)."]
    res = _gallery.get(script)
    if res is not None:
        how = "`--smoke`" if res["mode"] == "smoke" else "as written"
        parts.append(f"\n## Output\n\nPrinted when this page was built ({how}, {res['seconds']:.1f} s wall):\n")
        parts.append("```text\n" + res["stdout"].rstrip() + "\n```")
        for fig in res["figures"]:
            target = posixpath.relpath(f"gallery/figures/{stem}/{fig.name}", posixpath.dirname(page_uri))
            parts.append(f"\n![{fig.stem}]({target})")
    source = (ROOT / script).read_text(encoding="utf-8")
    parts.append(f"\n## Source\n\n`{script}`:\n\n```python\n{source.rstrip()}\n```\n")
    return "\n".join(parts)


# --------------------------------------------------------------------------- repository links
def _linkable(rel: str) -> bool:
    return any(rel == p or rel.startswith(p + "/") for p in LINKABLE)


def _rewrite_links(markdown: str, page_src: str, docs_dir: Path, page_uri: str) -> str:
    page_dir = (docs_dir / page_src).parent

    def sub(m: re.Match) -> str:
        target = m.group(2)
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("/"):
            return m.group(0)
        path = (page_dir / target).resolve()
        try:
            path.relative_to(docs_dir.resolve())
            return m.group(0)  # a documentation file: mkdocs checks it
        except ValueError:
            pass
        try:
            rel = path.relative_to(ROOT).as_posix()
        except ValueError:
            log.warning(f"{page_src}: link {target!r} leaves the repository")
            return m.group(0)
        if not path.is_file():
            log.warning(f"{page_src}: link {target!r}: no file {rel} in the repository")
            return m.group(0)
        if not _linkable(rel):
            log.warning(f"{page_src}: link {target!r}: {rel} is not under {LINKABLE} (add it to docs/hooks.py LINKABLE)")
            return m.group(0)
        new = posixpath.relpath(f"{REPO_PREFIX}/{rel}", posixpath.dirname(page_uri))
        return m.group(1) + new + (m.group(3) or "") + m.group(4)

    # leave fenced code alone
    chunks = re.split(r"(^```.*?^```)", markdown, flags=re.M | re.S)
    return "".join(c if c.startswith("```") else _LINK.sub(sub, c) for c in chunks)


# --------------------------------------------------------------------------- mkdocs events
_VERBATIM: Dict[type, type] = {}


def _verbatim_file_class(base: type) -> type:
    """A subclass of mkdocs' ``File`` that is never a documentation page (copied to the site as it is)."""
    if base not in _VERBATIM:
        _VERBATIM[base] = type("VerbatimFile", (base,), {"is_documentation_page": lambda self: False})
    return _VERBATIM[base]


def on_files(files, config, **kwargs):
    from mkdocs.structure.files import File

    for top in LINKABLE:
        base = ROOT / top
        paths = [base] if base.is_file() else sorted(p for p in base.rglob("*") if p.is_file()) if base.is_dir() else []
        for p in paths:
            rel = p.relative_to(ROOT).as_posix()
            if "__pycache__" in rel or p.suffix == ".pyc":
                continue
            f = File.generated(config, f"{REPO_PREFIX}/{rel}", abs_src_path=str(p))
            if f.is_documentation_page():
                f.__class__ = _verbatim_file_class(File)  # a repository .md file is copied as it is, not rendered
            files.append(f)

    _gallery.clear()
    mode = gallery_mode()
    if mode == "off":
        log.info("gallery: not run (TORCHTREE_DOCS_GALLERY=off)")
        return files
    global _figures_root
    figures_root = _figures_root = Path(tempfile.mkdtemp(prefix="docs_figures_"))
    for script in gallery_scripts(Path(config["docs_dir"])):
        stem = Path(script).stem
        fig_dir = figures_root / stem
        fig_dir.mkdir(parents=True)
        res = run_script(script, mode, fig_dir)
        log.info(f"gallery: {script} ({mode}) exit {res['code']}, {res['seconds']:.1f} s, {len(res['figures'])} figure(s)")
        if res["code"] != 0:
            log.warning(f"gallery: {script} exited {res['code']}:\n{res['stderr'][-2000:]}")
        for fig in res["figures"]:
            files.append(File.generated(config, f"gallery/figures/{stem}/{fig.name}", abs_src_path=str(fig)))
        _gallery[script] = res
    return files


def on_page_markdown(markdown, page, config, files, **kwargs):
    docs_dir = Path(config["docs_dir"])

    def keep_if(m: re.Match) -> str:
        module = m.group(1)
        try:
            if getattr(importlib.import_module(module), "__file__", None) is None:
                raise ImportError("a namespace package (no __init__.py yet)")
            return m.group(2)
        except Exception as exc:  # a module being written may fail in any way
            log.info(f"{page.file.src_uri}: {module} left out: {type(exc).__name__}: {exc}")
            return (f"!!! note \"`{module}` is not part of this build\"\n    It did not import when the site was built "
                    f"({type(exc).__name__}); its reference appears here once it does.\n")

    markdown = _IF_BLOCK.sub(keep_if, markdown)

    def expand(m: re.Match) -> str:
        kind, arg = m.group(1), m.group(2)
        try:
            if kind == "options":
                return option_table(arg)
            if kind == "cli-help":
                return cli_help(arg)
            if not (ROOT / arg).is_file():
                log.warning(f"{page.file.src_uri}: gallery script {arg} not found")
                return m.group(0)
            return _gallery_block(arg, page.file.src_uri)
        except Exception as exc:
            log.warning(f"{page.file.src_uri}: {kind} {arg!r} failed: {type(exc).__name__}: {exc}")
            return m.group(0)

    markdown = _MARKER.sub(expand, markdown)
    return _rewrite_links(markdown, page.file.src_uri, docs_dir, page.file.src_uri)


def on_post_build(config, **kwargs):
    global _figures_root
    if _figures_root is not None:
        shutil.rmtree(_figures_root, ignore_errors=True)
        _figures_root = None
