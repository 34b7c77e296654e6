"""Serve the inspector with uvicorn: bind first, then say where, then serve until stopped."""

from __future__ import annotations

import socket
from collections.abc import Callable

import uvicorn

from tether.drivers.telemetry import Telemetry
from tether.policy.access import Credentials
from tether.stores import Store
from tether.surfaces.web.app import create_app


def address(host: str, port: int) -> str:
    """The base URL of a server on ``host``:``port`` (an IPv6 address in brackets)."""
    shown = f"[{host}]" if ":" in host and not host.startswith("[") else host  # IPv6
    return f"http://{shown}:{port}/"


def serve(
    store: Store,
    credentials: Credentials,
    *,
    host: str,
    port: int,
    announce: Callable[[str], None],
    max_wait: float = 5.0,
    telemetry: Telemetry | None = None,
) -> None:
    """Listen on ``host``:``port`` (0: any free port), tell ``announce`` the address, serve until stopped.

    The socket is bound before anything is announced, so the address printed is one that
    answers (with the port the system chose, for 0). Access logs are off: a ``?token=``
    address must not land in a log.

    Raises:
        OSError: the address cannot be bound (in use, not this machine's).
    """
    bare = host.strip("[]")
    family = socket.getaddrinfo(bare, port, type=socket.SOCK_STREAM)[0][0]
    listener = socket.socket(family, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((bare, port))
    listener.listen(128)
    config = uvicorn.Config(
        create_app(store, credentials, max_wait=max_wait, telemetry=telemetry),
        log_level="warning",
        access_log=False,
        ws="none",
        lifespan="on",
        timeout_graceful_shutdown=3,
    )
    announce(address(host, listener.getsockname()[1]))
    uvicorn.Server(config).run(sockets=[listener])


__all__ = ["address", "serve"]
