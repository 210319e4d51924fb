"""Command-line options generated from constructor signatures and numpy-style docstrings.

A sampler registered with ``register_method`` gets its ``torchtree fit`` options from
its ``__init__`` signature (types from defaults and annotations) and its docstring
(help text, ``{a, b}`` choices), so new samplers need no changes to the CLI.
"""
from __future__ import annotations

import argparse
import inspect
import re
from typing import Any, Dict, List, Optional, Sequence, Tuple

from torchtree.cli.common import ESTIMATOR_RESERVED, RESERVED

def _param_docs(obj) -> Dict[str, Tuple[str, str]]:
    """``name -> (type text, first line of the description)`` from a numpydoc ``Parameters`` section."""
    doc = inspect.getdoc(obj) or ""
    out: Dict[str, Tuple[str, str]] = {}
    lines = doc.splitlines()
    for i, line in enumerate(lines):
        m = re.match(r"^(\w+(?:\s*,\s*\w+)*)\s*:\s*(.*)$", line)
        if not m:
            continue
        names = [n.strip() for n in m.group(1).split(",")]
        kind = m.group(2).strip()
        para = []
        for nxt in lines[i + 1:]:
            if not nxt.startswith((" ", "\t")) or not nxt.strip():
                break
            para.append(nxt.strip())
        desc = " ".join(para)
        cut = re.search(r"(?<=\.)\s", desc)  # the first sentence
        if cut:
            desc = desc[: cut.start()]
        if len(desc) > 160:
            desc = desc[:157].rstrip() + "..."
        for n in names:
            out.setdefault(n, (kind, desc))
    return out


def _help_and_choices(doc: Tuple[str, str]) -> Tuple[str, Optional[List[str]]]:
    """Help text from a parameter's documentation; choices when its type is ``{"a", "b"}``."""
    kind, desc = doc
    choices = None
    m = re.match(r"^\{(.*)\}", kind)
    if m:
        opts = re.findall(r"[\"']([^\"']+)[\"']", m.group(1))
        if opts:
            choices = opts
    text = desc or (kind if not re.fullmatch(r"[\w\s,.\[\]()]*", kind) or "," in kind else "")
    if not desc and choices:
        text = ""
    return text.replace("``", "").strip(), choices


def _annotation_kind(annotation: Any) -> Optional[type]:
    if annotation is inspect.Parameter.empty:
        return None
    # a class by its name; a typing form (Optional[float], from a config's type hints) by its
    # full text: its __name__ is only "Optional"
    text = annotation if isinstance(annotation, str) else (annotation.__name__ if isinstance(annotation, type)
                                                          else str(annotation))
    text = str(text)
    if re.search(r"\bfloat\b", text):
        return float
    if re.search(r"\bbool\b", text):
        return bool
    if re.search(r"\bint\b", text):
        return int
    if re.search(r"\bstr\b", text):
        return str
    return object


def _parse_auto(text: str):
    """An option value without a typed default: None, int, float, or the string."""
    if text.lower() in ("none", "null"):
        return None
    for conv in (int, float):
        try:
            return conv(text)
        except ValueError:
            pass
    return text


def _optional(conv):
    def parse(text: str):
        if text.lower() in ("none", "null"):
            return None
        return conv(text)

    parse.__name__ = getattr(conv, "__name__", "value")
    return parse


def parse_threads(text: str):
    """``--threads``: ``auto`` or an integer >= 1 (an argparse error otherwise: exit status 2)."""
    from torchtree.core.threads import check_threads

    try:
        return check_threads(int(text) if text.strip().lstrip("+-").isdigit() else text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be 'auto' or an integer >= 1, got {text!r}") from None


def parse_seed(text: str) -> int:
    """``--seed``: an integer >= 0 (an argparse error naming the option otherwise: exit status 2)."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {text!r}")
    return value


def parse_timeout(text: str) -> float:
    """``--timeout``: seconds > 0 (an argparse error naming the option otherwise: exit status 2)."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number of seconds > 0, got {text!r}")
    return value


def _parse_dtype(text: str):
    import torch

    dt = getattr(torch, text.replace("torch.", ""), None)
    if not isinstance(dt, torch.dtype):
        raise argparse.ArgumentTypeError(f"not a torch dtype: {text!r} (e.g. float32, float64)")
    return dt


def _option_kwargs(param: inspect.Parameter, doc: Tuple[str, str] = ("", ""), note: str = "") -> Optional[Dict[str, Any]]:
    """argparse keywords for a constructor parameter, or None when it is not a CLI option."""
    import torch

    default = param.default
    if default is inspect.Parameter.empty:
        return None
    help_text, choices = _help_and_choices(doc)
    shown = default if not isinstance(default, torch.dtype) else str(default).replace("torch.", "")
    # a None default whose docstring already states the effective default says nothing more
    said = (default is None and "default" in help_text.lower()) or "(default" in note
    help_text = " ".join(x for x in (help_text, note, "" if said else f"(default: {shown})") if x)
    kw: Dict[str, Any] = {"default": argparse.SUPPRESS, "help": help_text.replace("%", "%%")}
    if isinstance(default, bool):
        kw["action"] = argparse.BooleanOptionalAction
    elif isinstance(default, int):
        kw.update(type=int, metavar="INT")
    elif isinstance(default, float):
        kw.update(type=float, metavar="X")
    elif isinstance(default, str):
        if choices and default in choices:
            kw.update(type=str, choices=choices, metavar="{" + ",".join(choices) + "}")
        else:
            kw.update(type=str, metavar="STR")
    elif isinstance(default, torch.dtype):
        kw.update(type=_parse_dtype, metavar="DTYPE")
    elif isinstance(default, (tuple, list)) and default and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in default):
        conv = float if any(isinstance(v, float) for v in default) else int
        kw.update(type=conv, nargs="+", metavar="X" if conv is float else "INT")
    elif default is None:
        kind = _annotation_kind(param.annotation)
        if kind is bool:
            kw["action"] = argparse.BooleanOptionalAction
        elif kind in (int, float, str):
            kw.update(type=_optional(kind), metavar={int: "INT", float: "X", str: "STR"}[kind])
        elif kind is None:
            kw.update(type=_parse_auto, metavar="VALUE")
        else:
            return None  # an object (e.g. a hyperparameter dataclass): Python API only
    else:
        return None
    return kw


def _preset_note(opt) -> str:
    """``(default: auto: ...)`` for a setting with presets: the fit resolves it from the table."""
    if not opt.presets:
        return ""
    shown = "; ".join(f"{p.name}: {p.value!r}" if not callable(p.value) else f"{p.name}: set by the table's size"
                      for p in opt.presets)
    return f"(default: auto = {shown}; otherwise {opt.default!r})"


def _config_options(config_class) -> List[Tuple[str, Dict[str, Any]]]:
    """Options from a sampler's typed config (``SamplerConfig.options()``): help, choices and
    defaults come from the one table the sampler validates against."""
    from torchtree.samplers.protocol import base_type

    out = []
    for opt in config_class.options():
        if opt.name in RESERVED or not opt.cli:
            continue
        kind = base_type(opt.type) or opt.type  # Optional[float] -> float
        param = inspect.Parameter(opt.name, inspect.Parameter.KEYWORD_ONLY, default=opt.default, annotation=kind)
        kind = "{" + ", ".join(f'"{c}"' for c in opt.choices) + "}" if opt.choices else ""
        kw = _option_kwargs(param, (kind, opt.help), _preset_note(opt))
        if kw is not None:
            out.append((opt.name, kw))
    return out


def sampler_options(cls) -> List[Tuple[str, Dict[str, Any]]]:
    """The command-line options of a sampler class: ``[(param name, argparse keywords)]``."""
    from torchtree.samplers.protocol import config_class_of

    config = config_class_of(cls)
    if config is not None:
        return _config_options(config)
    docs = _param_docs(cls)
    out = []
    for name, p in inspect.signature(cls.__init__).parameters.items():
        if name in RESERVED or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        kw = _option_kwargs(p, docs.get(name, ("", "")))
        if kw is not None:
            out.append((name, kw))
    return out


def estimator_options() -> List[Tuple[str, Dict[str, Any], str]]:
    """Options of the estimators (prior, likelihood): ``[(name, kwargs, task or "")]``."""
    from torchtree.estimator_base import BayesianTreeBase
    from torchtree.estimators import BayesianTreeClassifier, BayesianTreeRegressor
    from torchtree.methods import MODEL_SETTINGS_HELP

    out, seen = [], set()
    for cls, task in ((BayesianTreeBase, ""), (BayesianTreeClassifier, "classification"), (BayesianTreeRegressor, "regression")):
        for name, p in inspect.signature(cls.__init__).parameters.items():
            if name in ESTIMATOR_RESERVED or name in seen or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                continue
            kind = '{"chipman", "poisson"}' if name == "prior" else ""
            help_text = MODEL_SETTINGS_HELP.get(name, "")
            if "(default" in help_text:
                # the table states the effective default; argparse's "(default: None)" would contradict it
                p = p.replace(default=None) if p.default is not None and not isinstance(p.default, str) else p
            kw = _option_kwargs(p, (kind, help_text), f"[{task} only]" if task else "")
            if kw is not None:
                seen.add(name)
                out.append((name, kw, task))
    return out


def peek_option(argv: Sequence[str], option: str) -> Optional[str]:
    """The value of ``option`` in ``argv`` before parsing: its last occurrence, the one argparse keeps
    (``--method mcmc --method smc`` runs smc, so smc's options are the ones to check); None if absent."""
    value = None
    for i, a in enumerate(argv):
        if a == option and i + 1 < len(argv):
            value = argv[i + 1]
        elif a.startswith(option + "="):
            value = a.split("=", 1)[1]
    return value
