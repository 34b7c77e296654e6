"""Markdown a tool or a rule wrote for the person deciding, rendered as safe HTML.

CommonMark with raw HTML off (``<script>`` in a description is shown as those characters), no
images (nothing is fetched), and links only to the schemes markdown-it allows (``javascript:``
and the like stay text), opened without a referrer. Invisible and control characters are shown
as their escapes first, as everywhere on the inspector's pages (:func:`tether.views.printable.printable`).
"""

from __future__ import annotations

from typing import Any

from markdown_it import MarkdownIt
from markupsafe import Markup

from tether.views.printable import printable

_PARSER = MarkdownIt("commonmark", {"html": False}).disable("image")


def _link_open(renderer: Any, tokens: Any, index: int, options: Any, env: Any) -> str:
    tokens[index].attrSet("rel", "noopener noreferrer nofollow")
    return str(renderer.renderToken(tokens, index, options, env))


_PARSER.add_render_rule("link_open", _link_open)


def markdown(text: str) -> Markup:
    """``text`` (Markdown) as HTML a page may include as it is."""
    return Markup(_PARSER.render(printable(text)))  # escaped by markdown-it: raw HTML is off


__all__ = ["markdown"]
