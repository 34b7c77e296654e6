"""Serve the inspector with uvicorn: bind first, then say where, then serve until stopped."""

from __future__ import annotations

import socket
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import uvicorn
from starlette.types import ASGIApp

from tether.errors import ConfigError
from tether.surfaces.web.listen import WILDCARDS


@dataclass(frozen=True)
class Tls:
    """The certificate (chain) and private key a server presents: it serves HTTPS."""

    certfile: str
    keyfile: str

    def check(self) -> None:
        """Load both now, so a wrong path or a key that does not match says so before anything listens.

        Raises:
            ConfigError: naming the file and what is wrong with it.
        """
        for option, path, marker, holds in (
            ("--certfile", self.certfile, "-----BEGIN CERTIFICATE-----", "PEM certificate"),
            ("--keyfile", self.keyfile, "PRIVATE KEY-----", "PEM private key"),
        ):
            try:
                text = Path(path).read_text(encoding="ascii", errors="replace")
            except OSError as error:
                raise ConfigError(f"cannot read {option} {path}: {error.strerror or error}") from None
            if marker not in text:
                raise ConfigError(f"{option} {path} holds no {holds}")
        try:
            ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(self.certfile, self.keyfile)
        except ssl.SSLError as error:
            mismatch = error.reason == "KEY_VALUES_MISMATCH"
            problem = "is not the certificate's" if mismatch else f"cannot be used: {error}"
            raise ConfigError(f"the key in --keyfile {self.keyfile} {problem} (--certfile {self.certfile})") from None


def address(host: str, port: int, *, tls: bool = False) -> str:
    """The base URL of a server on ``host``:``port`` (a wildcard shown as this machine's name, IPv6 in brackets)."""
    bare = host.strip("[]")
    shown = socket.gethostname() if bare in WILDCARDS else bare
    shown = f"[{shown}]" if ":" in shown else shown  # IPv6
    return f"{'https' if tls else 'http'}://{shown}:{port}/"


def serve(
    app: ASGIApp,
    *,
    host: str,
    port: int,
    announce: Callable[[str], None],
    tls: Tls | None = None,
) -> None:
    """Listen on ``host``:``port`` (0: any free port), tell ``announce`` the address, serve until stopped.

    The socket is bound before anything is announced, so the address printed is one that
    answers (with the port the system chose, for 0). Access logs are off: a ``?token=``
    address must not land in a log.

    Raises:
        OSError: the address cannot be bound (in use, not this machine's).
        ConfigError: ``tls``'s files cannot be used.
    """
    if tls is not None:
        tls.check()
    bare = host.strip("[]")
    family = socket.getaddrinfo(bare, port, type=socket.SOCK_STREAM)[0][0]
    listener = socket.socket(family, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((bare, port))
    listener.listen(128)
    config = uvicorn.Config(
        app,
        log_level="warning",
        access_log=False,
        ws="none",
        lifespan="on",
        timeout_graceful_shutdown=3,
        ssl_certfile=tls.certfile if tls else None,
        ssl_keyfile=tls.keyfile if tls else None,
    )
    announce(address(host, listener.getsockname()[1], tls=tls is not None))
    uvicorn.Server(config).run(sockets=[listener])


__all__ = ["Tls", "address", "serve"]
