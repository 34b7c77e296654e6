"""Griffe extension: the reStructuredText in tether's docstrings, as the Markdown mkdocstrings renders.

The docstrings are Google style, with Sphinx's roles for cross-references
(``:class:`~tether.agent.Agent```) and ``::`` before a literal block. Markdown has neither, so
a role becomes the code it names (``Agent``: with ``~``, the last part of the path, as Sphinx
shows it) and ``::`` a plain colon before the indented block, which Markdown shows as code.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:py:)?(?:class|func|meth|mod|attr|data|exc|obj|const|type):`(~?)([^`]+)`")
LITERAL_BLOCK = re.compile(r"(\S)::$", re.M)


def markdown_of(text: str) -> str:
    """``text`` with Sphinx roles as code spans and ``::`` literal-block markers as colons."""

    def code(match: re.Match[str]) -> str:
        shortened, target = match[1], match[2]
        shown = target.rsplit(".", 1)[-1] if shortened else target
        return f"`{shown}`"

    return LITERAL_BLOCK.sub(r"\1:", ROLE.sub(code, text))


class RstToMarkdown(griffe.Extension):
    """Rewrites every docstring once it is read."""

    def on_instance(self, *, obj: griffe.Object, **_: Any) -> None:
        """Rewrite ``obj``'s docstring, if it has one."""
        if obj.docstring is not None:
            obj.docstring.value = markdown_of(obj.docstring.value)
