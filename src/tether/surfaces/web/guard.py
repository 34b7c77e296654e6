"""Who may use the inspector, and what a browser may do with it: safe by default.

- **A token, always.** Every route but the static files and the sign-in page needs one: in an
  ``Authorization: Bearer`` header (scripts), or as the session cookie a browser gets by opening
  the printed ``/?token=...`` address once or signing in (``HttpOnly``, ``SameSite=Strict``,
  holding a random session id, not the token; signing out ends the session).
  The token names the tenant whose runs it reaches (:mod:`tether.policy.access`).
- **Loopback unless told.** :func:`check_bind` refuses a non-loopback address unless a token was
  given on purpose (a generated one is printed on the terminal of whoever started the server).
- **Decisions are CSRF-protected.** A form a cookie authenticates carries a token derived from
  that cookie with this process's secret; a request from another site (``Origin``,
  ``Sec-Fetch-Site``) is refused before anything is read.
- **Nothing runs but our own script.** Every answer carries a Content-Security-Policy that allows
  scripts and styles from this server's ``/static`` only, so text a model or tool wrote cannot
  run even if it ever reached the page unescaped (templates escape everything).
"""

from __future__ import annotations

import hmac
import ipaddress
import secrets
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any

from tether.errors import ConfigError
from tether.policy.access import Credentials, Grant, bearer, derive

COOKIE = "tether_ui"
"""The session cookie's name (then ``_PORT``): unreadable to scripts, never sent by another site."""
TOKEN_PARAM = "token"
"""``/?token=...``: the address ``tether ui`` prints, traded for the cookie on first use."""
MAX_SESSIONS = 10_000
"""Signed-in browsers one process remembers (a session is a few hundred bytes)."""
CSRF_FIELD = "csrf"
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
"""Our script and stylesheet only: no inline script, no other origin, never framed."""
HEADERS = {
    "content-security-policy": CSP,
    "x-content-type-options": "nosniff",
    "referrer-policy": "same-origin",  # "no-referrer" would make browsers send "Origin: null" with our own forms
    "x-frame-options": "DENY",
    "cache-control": "no-store",
}
"""Sent with every answer that does not set its own (the diagram sets a stricter policy)."""


def is_loopback(host: str) -> bool:
    """Whether ``host`` only reaches this machine (``localhost``, 127.0.0.0/8, ``::1``)."""
    if host.strip("[]").lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_bind(host: str, *, token_given: bool) -> None:
    """Refuse to listen beyond this machine without a token chosen for it.

    Raises:
        ConfigError: ``host`` is not loopback and no token was given.
    """
    if not is_loopback(host) and not token_given:
        raise ConfigError(
            f"--host {host} lets other machines reach the inspector: give it a token "
            "(--token, $TETHER_UI_TOKEN or --tokens FILE), or keep the default --host 127.0.0.1"
        )


@dataclass(frozen=True)
class Viewer:
    """Who is asking: the tenant they may see, and how they proved it."""

    tenant: str | None
    """The only tenant whose runs they reach; None: every tenant's."""
    csrf: str | None
    """The token their forms must carry; None when authenticated by a header (no ambient cookie)."""


class Guard:
    """Checks requests against the credentials; holds this process's sessions and CSRF secret.

    Signing in (with a token) opens a session: the browser's cookie holds a random id that this
    process maps to the token's grant, so the token itself never travels in a cookie (which
    every server on the same host receives). Signing out ends the session: its cookie, copied or
    not, lets nobody in again. Sessions last until then, or until the server stops (at most
    :data:`MAX_SESSIONS`, the oldest ended first). The cookie's name carries the port, so two
    inspectors on one host do not sign each other out.
    """

    def __init__(self, credentials: Credentials, *, secret: bytes | None = None) -> None:
        self.credentials = credentials
        self._secret = secret if secret is not None else secrets.token_bytes(32)
        self._sessions: dict[str, Grant] = {}

    @staticmethod
    def cookie_name(port: int | None) -> str:
        """The session cookie's name for a server on ``port``."""
        return f"{COOKIE}_{port}" if port else COOKIE

    def session(self, grant: Grant) -> str:
        """Open a session for ``grant`` (a token checked by the caller): the cookie value that signs a browser in."""
        while len(self._sessions) >= MAX_SESSIONS:
            del self._sessions[next(iter(self._sessions))]
        session = secrets.token_urlsafe(32)
        self._sessions[session] = grant
        return session

    def end(self, cookies: Mapping[str, str], port: int | None) -> None:
        """End the session a request's cookie holds (signing out): the cookie is refused from now on."""
        self._sessions.pop(cookies.get(self.cookie_name(port)) or "", None)

    def viewer(self, headers: Mapping[str, str], cookies: Mapping[str, str], port: int | None) -> Viewer | None:
        """The viewer a request's header token or session cookie proves, or None."""
        token = bearer(headers.get("authorization"))
        if token is not None:
            grant = self.credentials.grant(token)
            return None if grant is None else Viewer(grant.tenant, csrf=None)
        cookie = cookies.get(self.cookie_name(port))
        grant = self._sessions.get(cookie) if cookie else None
        if grant is None or cookie is None:
            return None
        return Viewer(grant.tenant, csrf=derive(self._secret, "csrf:" + cookie)[:32])

    @staticmethod
    def csrf_ok(viewer: Viewer, sent: str | None) -> bool:
        """Whether a form carries its session's CSRF token (always, for a header-authenticated request)."""
        if viewer.csrf is None:
            return True
        return sent is not None and hmac.compare_digest(sent.encode(errors="surrogatepass"), viewer.csrf.encode())


def cross_site(headers: Mapping[str, str], *, scheme: str, host: str) -> bool:
    """Whether a browser says the request comes from another site."""
    if headers.get("sec-fetch-site") in ("cross-site", "same-site"):
        return True
    origin = headers.get("origin")
    return origin is not None and origin != f"{scheme}://{host}"


ASGIApp = Callable[[MutableMapping[str, Any], Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]], Any]


class SecurityHeaders:
    """ASGI middleware adding :data:`HEADERS` to every answer (streams included) that lacks them."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(
        self,
        scope: MutableMapping[str, Any],
        receive: Callable[[], Awaitable[Any]],
        send: Callable[[Any], Awaitable[None]],
    ) -> None:
        """Pass the request on; add the headers to the answer's start."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Any) -> None:
            if message["type"] == "http.response.start":
                present = {name.lower() for name, _ in message.get("headers", [])}
                extra = [(k.encode(), v.encode()) for k, v in HEADERS.items() if k.encode() not in present]
                message = {**message, "headers": [*message.get("headers", []), *extra]}
            await send(message)

        await self.app(scope, receive, with_headers)


__all__ = [
    "COOKIE",
    "CSP",
    "CSRF_FIELD",
    "HEADERS",
    "TOKEN_PARAM",
    "Guard",
    "SecurityHeaders",
    "Viewer",
    "check_bind",
    "cross_site",
    "is_loopback",
]
