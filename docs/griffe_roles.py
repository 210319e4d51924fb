"""A Griffe extension for the API reference: Sphinx roles in docstrings become Markdown.

torchtree's docstrings are NumPy style and name other objects with Sphinx roles
(``:func:`default_likelihood```, ``:class:`~torchtree.model.data.Data```), which Markdown would
show verbatim. Each role becomes inline code (the last part of the path with ``~``, as Sphinx
shows it). No cross-reference: many targets are private modules that the reference does not
render, and an unresolved reference is a warning of the strict build.
"""
from __future__ import annotations

import re

import griffe

_ROLE = re.compile(r":(?:py:)?(?:func|class|meth|mod|attr|data|exc|obj):`(~?)([^`<]+?)(?:\s*<([^>]+)>)?`")


def convert(text: str) -> str:
    """``text`` with its Sphinx roles written as Markdown code (and cross-references)."""

    def sub(m: re.Match) -> str:
        tilde, title, target = m.group(1), m.group(2).strip(), m.group(3)
        path = (target or title).strip().lstrip(".")
        shown = path.rsplit(".", 1)[-1] if tilde else (title if target else path)
        return f"`{shown}`"

    return _ROLE.sub(sub, text)


class SphinxRoles(griffe.Extension):
    """Rewrites the Sphinx roles of every docstring Griffe loads."""

    def on_object(self, *, obj, **kwargs) -> None:  # griffe >= 1.0 calls this once per loaded object
        if obj.docstring is not None and ":" in obj.docstring.value:
            obj.docstring.value = convert(obj.docstring.value)
