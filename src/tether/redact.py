"""Keeping configured secrets out of what tether prints and stores.

A secret reaches text in two ways: inside a URL (a database password, a token in the query
string), masked by the URL's structure wherever it is shown (:func:`tether.stores.shown_url`);
and echoed in someone else's message (an API error body repeating the key), masked here by value.
"""

from __future__ import annotations

from collections.abc import Iterable

MASK = "***"
"""What a secret is shown as."""
MIN_SECRET_LENGTH = 4
"""Shorter values are not masked by value: replacing every ``ab`` would garble the message and hide nothing."""


def scrub(text: str, secrets: Iterable[str | None]) -> str:
    """``text`` with every occurrence of each secret (longest first) replaced by :data:`MASK`."""
    for secret in sorted({s for s in secrets if s and len(s) >= MIN_SECRET_LENGTH}, key=len, reverse=True):
        text = text.replace(secret, MASK)
    return text


__all__ = ["MASK", "MIN_SECRET_LENGTH", "scrub"]
