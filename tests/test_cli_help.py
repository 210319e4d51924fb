"""Every ``--help`` of the command line renders, and reads as text for a person: one help
line per option from one typed source, no reStructuredText markup, no cut sentences, no raw
type annotations, one default per option."""
from __future__ import annotations

import re

import pytest

from torchtree.cli import main
from torchtree.estimators import METHODS

PAGES = [["--help"], ["predict", "--help"], ["summary", "--help"], ["demo", "--help"], ["bench", "--help"]]
PAGES += [["fit", "--method", m, "--help"] for m in sorted(METHODS)]


def _render(argv, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(list(argv))
    assert exit_.value.code == 0
    return capsys.readouterr().out


def _entries(text):
    """(option flags, help text) for each option of an argparse help page."""
    out, cur = [], None
    for line in text.splitlines():
        m = re.match(r"^  (-{1,2}[\w-]+(?:[ =][^\s]+)?(?:, -{1,2}[\w-]+(?:[ =][^\s]+)?)*)\s{2,}(.*)$", line)
        if m:
            cur = [m.group(1), m.group(2)]
            out.append(cur)
        elif re.match(r"^  -", line):
            cur = [line.strip(), ""]
            out.append(cur)
        elif cur is not None and line.startswith(" " * 8) and line.strip():
            cur[1] += " " + line.strip()
        else:
            cur = None
    return out


@pytest.mark.parametrize("argv", PAGES, ids=lambda a: " ".join(a))
def test_help_pages_read_as_text(argv, capsys):
    text = _render(argv, capsys)
    assert "usage:" in text
    for bad in ("``", ":class:", ":func:", ":meth:", ":mod:", "...)", "... ", "Optional[", "typing."):
        assert bad not in text, f"{bad!r} in {' '.join(argv)}:\n{text}"
    page_has_description = len([ln for ln in text.splitlines() if ln and not ln.startswith((" ", "usage"))]) > 1
    assert page_has_description, f"{' '.join(argv)} has no description"
    for flags, help_text in _entries(text):
        if flags.startswith("-h"):
            continue
        assert help_text.strip(), f"{flags} has no help text in {' '.join(argv)}"
        assert help_text.count("(default") <= 1, f"{flags} claims two defaults: {help_text}"
        assert not re.search(r"\b(int|float|str|bool), [A-Za-z]\b", help_text), f"raw type in {flags}: {help_text}"


@pytest.mark.parametrize("method", sorted(METHODS))
def test_options_do_not_share_one_text(method, capsys):
    """Two options with the same help line say nothing about their difference."""
    text = _render(["fit", "--method", method, "--help"], capsys)
    seen = {}
    for flags, help_text in _entries(text):
        key = re.sub(r"\(default: [^)]*\)", "", help_text).strip()
        if key and not flags.startswith("-h"):
            assert key not in seen, f"{flags} and {seen.get(key)} share the help text {key!r}"
            seen[key] = flags


def _command_parser(name):
    import argparse

    from torchtree.cli import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[name]


def _own_flags(parser):
    """The long options of a command's own group (not the generated model and sampler options)."""
    own = next(g for g in parser._action_groups if g.title in ("options", "optional arguments"))
    return [o for a in own._group_actions for o in a.option_strings
            if o.startswith("--") and o not in ("--help", "--quiet", "--debug")]


def test_fit_usage_line_names_every_option_of_its_own(capsys):
    """The usage line is written by hand; every option of fit's own group must be in it."""
    p = _command_parser("fit")
    usage = p.format_usage()
    missing = [f for f in _own_flags(p) if f not in usage]
    assert not missing, f"fit's usage line omits {missing}:\n{usage}"


@pytest.mark.parametrize("command", ["fit", "predict", "summary", "report", "demo", "bench"])
def test_the_cli_page_names_every_option_of_each_command(command):
    from pathlib import Path

    page = (Path(__file__).resolve().parents[1] / "docs" / "cli.md").read_text()
    missing = [f for f in _own_flags(_command_parser(command)) if not re.search(re.escape(f) + r"\b", page)]
    assert not missing, f"docs/cli.md does not mention torchtree {command} {missing}"


def test_demo_help_says_what_the_demo_runs(capsys):
    text = _render(["demo", "--help"], capsys)
    assert "each method" not in text and "three top-down SMC configurations" in text
