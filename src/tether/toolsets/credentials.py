"""Credentials by name: a toolset records which environment variables hold them, never their values.

A run's spec is stored in the database and shown by ``tether show``; a token in it would
be readable by anyone who can read the database. So headers (``X-Api-Key``), bearer tokens
and the variables a stdio server needs are given as the *names* of environment variables,
read each time the toolset connects, and a URL that carries a secret itself (a password, a
``?token=`` query value) is refused.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from urllib.parse import parse_qsl, urlsplit

from tether.errors import ToolsetError

_VARIABLE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SECRET_PARAM = re.compile(r".*(pass|pwd|secret|token|key|auth|credential|sig).*", re.IGNORECASE)
"""A query parameter whose name says it holds a secret: password, api_key, token, signature..."""


def check_names(names: Sequence[str], toolset: str) -> list[str]:
    """``names`` if each can name an environment variable (a value pasted by mistake cannot)."""
    for name in names:
        if not _VARIABLE.match(name):
            raise ToolsetError(
                f"{name!r} is not the name of an environment variable: give the variable's name, "
                "never the secret itself",
                toolset=toolset,
            )
    return list(names)


def variables(names: Sequence[str], toolset: str) -> dict[str, str]:
    """The named variables' values, read now (a stdio server's environment)."""
    return {name: _value(name, "to pass to the server", toolset) for name in names}


def headers(named: Mapping[str, str], bearer: str | None, toolset: str) -> dict[str, str]:
    """HTTP headers whose values come from the named variables; ``bearer`` names the token's variable."""
    sent = {header: _value(variable, f"for header {header}", toolset) for header, variable in named.items()}
    if bearer is not None:
        sent["Authorization"] = f"Bearer {_value(bearer, 'for its bearer token', toolset)}"
    return sent


def check_url(url: str, toolset: str) -> str:
    """``url`` unless it carries a secret, which would be stored with the run."""
    parts = urlsplit(url)
    secret = parts.password is not None or any(_SECRET_PARAM.fullmatch(key) for key, _ in parse_qsl(parts.query))
    if secret:
        raise ToolsetError(
            "the URL holds a secret (a password or a secret query value), and a run stores its URL: "
            "send it as a header from an environment variable instead (--header NAME=VARIABLE, --bearer VARIABLE)",
            toolset=toolset,
        )
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ToolsetError(f"{url!r} is not an http(s) URL", toolset=toolset)
    return url


def _value(variable: str, purpose: str, toolset: str) -> str:
    value = os.environ.get(variable)
    if value is None:
        raise ToolsetError(f"environment variable {variable} ({purpose}) is not set", toolset=toolset)
    return value
