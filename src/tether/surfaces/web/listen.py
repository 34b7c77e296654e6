"""Where the inspector listens, and which names it answers to.

- **Loopback unless told.** :func:`check_bind` refuses an address other machines reach unless
  the token was chosen for it (a generated one is printed on the terminal of whoever started
  the server) and the connection is encrypted (``--certfile``/``--keyfile``), or the person said
  another layer encrypts it (``--insecure``: a TLS proxy, a VPN). Over plain HTTP on a network,
  a token and a session cookie travel in clear.
- **Its own names only.** :class:`AllowedHosts` answers only requests whose ``Host`` is one of
  the server's names: the loopback names, the address it listens on (for a wildcard address,
  the machine's names) and those given with ``--allowed-host``. A page on another site that
  points its own name at 127.0.0.1 (DNS rebinding) is then refused before anything is read,
  even though the browser thinks it talks to that site.
"""

from __future__ import annotations

import contextlib
import ipaddress
import socket
from collections.abc import Iterable

from starlette.types import ASGIApp, Receive, Scope, Send

from tether.errors import ConfigError

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
"""The names every inspector answers to."""
WILDCARDS = ("", "0.0.0.0", "::")
"""Addresses that mean "every interface": the machine's own names are its names then."""


def is_loopback(host: str) -> bool:
    """Whether ``host`` only reaches this machine (``localhost``, 127.0.0.0/8, ``::1``)."""
    if host.strip("[]").lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_bind(host: str, *, token_given: bool, tls: bool, insecure: bool = False) -> None:
    """Refuse to listen beyond this machine without a chosen token and an encrypted connection.

    Raises:
        ConfigError: ``host`` is not loopback, and no token was given, or neither TLS nor
            ``insecure`` was.
    """
    if is_loopback(host):
        return
    if not token_given:
        raise ConfigError(
            f"--host {host} lets other machines reach the inspector: give it a token "
            "($TETHER_UI_TOKEN, --token-file FILE or --tokens FILE), or keep the default --host 127.0.0.1"
        )
    if not (tls or insecure):
        raise ConfigError(
            f"--host {host} would send tokens and session cookies over the network in clear: give "
            "--certfile and --keyfile (TLS), or --insecure if something else encrypts (a TLS proxy, a VPN)"
        )


def default_hosts(bind: str) -> frozenset[str]:
    """The names a server listening on ``bind`` answers to unless told more: loopback, and ``bind``'s."""
    names = {*LOOPBACK_NAMES, _bare(bind)}
    if _bare(bind) in WILDCARDS:
        names.discard(_bare(bind))
        machine = {socket.gethostname(), socket.getfqdn()}
        with contextlib.suppress(OSError):  # a host name that does not resolve: it has no addresses to add
            machine |= {str(info[4][0]) for info in socket.getaddrinfo(socket.gethostname(), None)}
        names |= {_bare(name) for name in machine}
    return frozenset(names)


def host_of(header: str | None) -> str:
    """The name a ``Host`` header gives, without its port, brackets or trailing dot, lower-case."""
    host = (header or "").strip().lower()
    if host.startswith("["):  # [::1]:8321
        host = host[1 : host.find("]")] if "]" in host else host
    elif host.count(":") == 1:
        host = host.partition(":")[0]
    return host.rstrip(".")


class AllowedHosts:
    """ASGI middleware answering 400 to a request whose ``Host`` is not one of ``hosts``."""

    def __init__(self, app: ASGIApp, hosts: Iterable[str]) -> None:
        self.app = app
        self.hosts = frozenset(_bare(host) for host in hosts)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Pass on a request to one of our names; refuse any other, unread."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers", []))
        host = host_of(headers.get(b"host", b"").decode("latin-1"))
        if host in self.hosts:
            await self.app(scope, receive, send)
            return
        names = ", ".join(sorted(self.hosts))
        said = f"not to {host!r}" if host else "and this request names none (no Host header)"
        body = f"refused: this server answers to {names}, {said}; open it by one of those names\n".encode()
        await send(
            {
                "type": "http.response.start",
                "status": 400,
                "headers": [(b"content-type", b"text/plain; charset=utf-8"), (b"content-length", b"%d" % len(body))],
            }
        )
        await send({"type": "http.response.body", "body": body})


def _bare(host: str) -> str:
    return host.strip().strip("[]").lower().rstrip(".")


__all__ = ["LOOPBACK_NAMES", "AllowedHosts", "check_bind", "default_hosts", "host_of", "is_loopback"]
