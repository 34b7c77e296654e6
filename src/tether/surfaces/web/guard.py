"""Who may use the inspector, and what a browser may do with it: safe by default.

- **A token, always.** Every route but the static files and the sign-in page needs one: in an
  ``Authorization: Bearer`` header (scripts), or as the session cookie a browser gets by signing
  in (the form, or opening the printed ``/?token=...`` address once). The token names the tenant
  whose runs it reaches, and a named token who holds it and whether they may decide
  (:mod:`tether.policy.access`). Sessions end on sign-out and time out
  (:mod:`~tether.surfaces.web.sessions`); what the cookie is and why, in :func:`cookie_name`.
- **Sign-in only when the person asked.** A ``?token=`` address opened from another site's page
  (another port of this host included) signs nobody in: it would swap the signed-in session for
  the sender's (login CSRF), and decisions made next would be recorded as theirs. Nor does it
  replace a session already open under another token. Wrong tokens slow their sender down
  (:mod:`~tether.surfaces.web.throttle`).
- **Decisions are CSRF-protected.** A form a cookie authenticates carries a token derived from
  that cookie with this process's secret; a request from another site (``Sec-Fetch-Site``,
  ``Origin``, ``Referer``) is refused before anything is read.
- **Nothing runs but our own script.** Every answer carries a Content-Security-Policy that allows
  scripts and styles from this server's ``/static`` only, so text a model or tool wrote cannot
  run even if it ever reached the page unescaped (templates escape everything).

Where the server listens and which names it answers to: :mod:`~tether.surfaces.web.listen`.
"""

from __future__ import annotations

import hmac
import math
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tether.policy.access import Credentials, Grant, bearer, derive
from tether.surfaces.web.sessions import Sessions
from tether.surfaces.web.throttle import Throttle

COOKIE = "tether_ui"
"""The session cookie's name, before its port (see :func:`cookie_name`)."""
SECURE_PREFIX = "__Host-"
"""Over TLS: a browser keeps such a cookie only if it is ``Secure``, for ``/``, without ``Domain``."""
TOKEN_PARAM = "token"
"""``/?token=...``: the address ``tether ui`` prints, traded for the cookie on first use."""
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


class Throttled(Exception):
    """Too many wrong tokens from this address: it may try again in ``wait`` seconds."""

    def __init__(self, wait: float) -> None:
        self.wait = max(1, math.ceil(wait))
        super().__init__(f"too many wrong tokens from your address: try again in {self.wait} s")


@dataclass(frozen=True)
class Viewer:
    """Who is asking: what their token grants, and how they proved it."""

    grant: Grant
    csrf: str | None
    """The token their forms must carry; None when authenticated by a header (no ambient cookie)."""
    session: str | None = None
    """The session their cookie holds; None for a header."""

    @property
    def tenant(self) -> str | None:
        """The only tenant whose runs they reach; None: every tenant's."""
        return self.grant.tenant

    @property
    def name(self) -> str | None:
        """Who they are, when their token is named: their decisions are recorded under it."""
        return self.grant.name

    @property
    def may_decide(self) -> bool:
        """Whether they may approve, deny, edit and fork (a viewer's token may not)."""
        return self.grant.may_decide


def cookie_name(request: Request) -> str:
    """The session cookie's name for the server ``request`` reached: its port, and ``__Host-`` over TLS.

    Browsers send a host's cookies to every port of it (cookies ignore ports), so every server
    on this host (another inspector, any web app on another port) receives this cookie with the
    requests a browser makes to it, and could replay it here. What keeps a copy worth little:

    - It holds a random session id, never the token: it opens this process only, and ends at
      sign-out, after the idle time or the lifetime (:mod:`~tether.surfaces.web.sessions`), or
      when the server stops. No ``Domain``: it is never sent to another host name.
    - Its name carries the port, so two inspectors on one host keep their own sessions instead
      of overwriting each other's cookie (each signing the other out).
    - ``HttpOnly``: no script reads it. ``SameSite=Strict``: no other site's page makes the
      browser send it. (Another port of this host is the same *site* for SameSite: the CSRF
      checks refuse its requests; see :func:`cross_site`.)
    - Over TLS, ``Secure`` and the ``__Host-`` prefix: the browser never sends it over plain
      HTTP (so no plain-HTTP server on the host, nor anyone on the network, sees it), and
      accepts it only for ``/`` from a secure origin, so no other server can plant one.

    What remains, another TLS server on the same host name, is why other people's servers
    belong under other host names.
    """
    port = request.url.port
    name = f"{COOKIE}_{port}" if port else COOKIE
    return SECURE_PREFIX + name if request.url.scheme == "https" else name


def cross_site(headers: Mapping[str, str], *, scheme: str, host: str) -> bool:
    """Whether a browser says the request comes from a page of another origin (another port included).

    ``Sec-Fetch-Site`` when the browser sends it (every current one does), else ``Origin``, else
    ``Referer``. A request saying none of these (a script, or a browser that predates them) is
    not from another site as far as anyone can tell.
    """
    site = headers.get("sec-fetch-site")
    if site is not None:
        return site not in ("same-origin", "none")  # "none": typed, a bookmark, opened from the terminal
    ours = f"{scheme}://{host}"
    origin = headers.get("origin")
    if origin is not None:
        return origin != ours
    referer = urlsplit(headers.get("referer") or "")
    return bool(referer.netloc) and f"{referer.scheme}://{referer.netloc}" != ours


def by_a_person(headers: Mapping[str, str]) -> bool:
    """Whether a person made the request (opened a page, sent a form), not a page's script or stream.

    Only that keeps a session from timing out idle. A browser says ``Sec-Fetch-Mode: navigate``
    for what a person does; the live pages' streams and refetches say ``cors``. A client that
    says nothing (a script) counts as a person.
    """
    return headers.get("sec-fetch-mode") in (None, "navigate")


class Guard:
    """Checks requests against the credentials; holds this process's sessions, throttle and CSRF secret."""

    def __init__(
        self,
        credentials: Credentials,
        *,
        sessions: Sessions | None = None,
        throttle: Throttle | None = None,
        secret: bytes | None = None,
    ) -> None:
        self.credentials = credentials
        self.sessions = sessions or Sessions()
        self.throttle = throttle or Throttle()
        self._secret = secret if secret is not None else secrets.token_bytes(32)

    def check(self, token: str | None, request: Request) -> Grant | None:
        """What ``token``, sent with ``request``, grants (None: nothing), counting a wrong one against its address.

        Raises:
            Throttled: the address sent too many wrong tokens lately; not even a right one is checked.
        """
        address = request.client.host if request.client else None
        wait = self.throttle.wait(address)
        if wait > 0:
            raise Throttled(wait)
        grant = self.credentials.grant(token)
        if grant is None:
            self.throttle.failed(address)
        else:
            self.throttle.succeeded(address)
        return grant

    def viewer(self, request: Request) -> Viewer | None:
        """The viewer a request's header token or session cookie proves, or None.

        Raises:
            Throttled: a header token, from an address that sent too many wrong ones lately.
        """
        token = bearer(request.headers.get("authorization"))
        if token is not None:
            grant = self.check(token, request)
            return None if grant is None else Viewer(grant, csrf=None)
        session = request.cookies.get(cookie_name(request))
        grant = self.sessions.grant(session, used=by_a_person(request.headers)) if session else None
        if grant is None or session is None:
            return None
        return Viewer(grant, csrf=derive(self._secret, "csrf:" + session)[:32], session=session)

    def signed_in(self, viewer: Viewer) -> bool:
        """Whether ``viewer``'s session is still open (a header's token always is): streams end when not."""
        return viewer.session is None or self.sessions.grant(viewer.session, used=False) is not None

    def sign_in(self, request: Request, answer: Response, grant: Grant) -> None:
        """Open a session for ``grant`` and set its cookie on ``answer``, ending the one the request held."""
        self.sessions.end(request.cookies.get(cookie_name(request)) or "")
        lifetime = self.sessions.lifetime
        answer.set_cookie(
            cookie_name(request),
            self.sessions.open(grant),
            max_age=int(lifetime) if math.isfinite(lifetime) else None,
            path="/",
            secure=request.url.scheme == "https",
            httponly=True,
            samesite="strict",
        )

    def sign_out(self, request: Request, answer: Response) -> None:
        """End the request's session (every copy of its cookie is refused from now on) and drop the cookie."""
        self.sessions.end(request.cookies.get(cookie_name(request)) or "")
        secure = request.url.scheme == "https"
        answer.delete_cookie(cookie_name(request), path="/", secure=secure, httponly=True, samesite="strict")

    @staticmethod
    def csrf_ok(viewer: Viewer, sent: str | None) -> bool:
        """Whether a form carries its session's CSRF token (always, for a header-authenticated request)."""
        if viewer.csrf is None:
            return True
        return sent is not None and hmac.compare_digest(sent.encode(errors="surrogatepass"), viewer.csrf.encode())


class SecurityHeaders:
    """ASGI middleware adding :data:`HEADERS` to every answer (streams included) that lacks them."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Pass the request on; add the headers to the answer's start."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
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
    "Throttled",
    "Viewer",
    "by_a_person",
    "cookie_name",
    "cross_site",
]
