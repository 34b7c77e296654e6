"""A real ``tether ui`` in a subprocess, and what it takes to serve one over TLS and with named tokens.

Imported as ``from ui_servers import ...`` (tests/ is on sys.path) by the tests that need what
only a real server shows: the bytes on its socket, its memory, TLS, a browser's cookies.
"""

from __future__ import annotations

import hashlib
import re
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from support import clean_env

ALICE = "alice-approver-token-0123456789"
"""Named ``alice``, an approver of every tenant's runs."""
BOB = "bob-viewer-token-0123456789"
"""Named ``bob``, a viewer: his file entry holds only the token's hash."""
TOKENS_TOML = f"""
[[tokens]]
name = "alice"
token = "{ALICE}"
role = "approver"

[[tokens]]
name = "bob"
sha256 = "{hashlib.sha256(BOB.encode()).hexdigest()}"
"""
_PRINTED = re.compile(r"tether ui: (https?://[^/\s]+/)(?:\?token=(\S+))?")


@dataclass
class UiServer:
    """A running ``tether ui``: where it answers, and the token it printed (if it made one)."""

    process: subprocess.Popen[str]
    base: str
    """``http://127.0.0.1:PORT/`` (https for TLS), as printed."""
    token: str | None
    log: Path

    @property
    def port(self) -> int:
        return int(self.base.rstrip("/").rsplit(":", 1)[1])

    @property
    def address(self) -> str:
        """The printed address: with ``?token=`` for a generated token."""
        return f"{self.base}?token={self.token}" if self.token else self.base


@contextmanager
def ui_server(db_url: str, log: Path, *options: str, **env: str) -> Iterator[UiServer]:
    """``tether ui --db URL --port 0 OPTIONS...`` until the block ends (no Traceback in its log)."""
    command = [sys.executable, "-m", "tether", "ui", "--db", db_url, "--port", "0", *options]
    with (
        log.open("w") as errors,
        subprocess.Popen(command, env=clean_env(**env), stdout=subprocess.PIPE, stderr=errors, text=True) as server,
    ):
        try:
            assert server.stdout is not None
            found = _PRINTED.search(server.stdout.readline())  # printed once bound
            assert found is not None, log.read_text()
            yield UiServer(server, found.group(1), found.group(2), log)
        finally:
            server.terminate()
            try:
                server.wait(timeout=20)
            except subprocess.TimeoutExpired:
                server.kill()
    assert "Traceback" not in log.read_text(), log.read_text()


def self_signed(where: Path) -> tuple[Path, Path]:
    """A certificate for localhost and 127.0.0.1 (signed by its own key) and that key, made by openssl."""
    cert, key = where / "cert.pem", where / "key.pem"
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", str(key), "-out", str(cert), "-days", "2", "-subj", "/CN=localhost",
            "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1",
        ],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return cert, key


def peak_memory(pid: int) -> int:
    """The most resident memory process ``pid`` has held, in bytes (Linux's VmHWM)."""
    status = Path(f"/proc/{pid}/status").read_text()
    found = re.search(r"^VmHWM:\s+(\d+) kB", status, re.MULTILINE)
    assert found is not None, status
    return int(found.group(1)) * 1024
