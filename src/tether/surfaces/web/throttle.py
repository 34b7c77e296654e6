"""Failed sign-ins per client address: a few mistakes are free, then each one doubles the wait.

Every way of presenting a token counts (the sign-in form, a ``?token=`` address, an
``Authorization`` header): guessing through one would otherwise skip the others' limit. While an
address waits, its tokens are not even checked, a right one included, so waiting out the
limit is the only way on. An IPv6 client counts by its /64 network, which one machine usually
holds whole. Behind a proxy every client shares the proxy's address (uvicorn takes the client's
from ``X-Forwarded-For`` only when the proxy is on this machine).
"""

from __future__ import annotations

import ipaddress
import time
from collections.abc import Callable
from dataclasses import dataclass

FREE = 5
"""Failures an address may make before it has to wait: typos, an old bookmark."""
FIRST_WAIT = 1.0
"""Seconds to wait after the first failure past the free ones; each further failure doubles it."""
MAX_WAIT = 300.0
"""The longest wait, however many failures."""
FORGET = 900.0
"""Seconds after its last failure when an address starts afresh."""
CAPACITY = 10_000
"""Addresses remembered at once: past it, the one that failed longest ago is forgotten."""


@dataclass
class _Failures:
    count: int
    last: float
    until: float


class Throttle:
    """How long each client address must wait before it may present a token again."""

    def __init__(
        self,
        *,
        free: int = FREE,
        first_wait: float = FIRST_WAIT,
        max_wait: float = MAX_WAIT,
        forget: float = FORGET,
        clock: Callable[[], float] = time.monotonic,
        capacity: int = CAPACITY,
    ) -> None:
        self.free = free
        self.first_wait = first_wait
        self.max_wait = max_wait
        self.forget = forget
        self._clock = clock
        self._capacity = capacity
        self._failures: dict[str, _Failures] = {}  # the least recently failed first

    def wait(self, address: str | None) -> float:
        """Seconds before ``address`` may present a token again (0: now)."""
        found = self._failures.get(_key(address))
        return 0.0 if found is None else max(0.0, found.until - self._clock())

    def failed(self, address: str | None) -> float:
        """Count a wrong token from ``address``; the seconds it must wait now."""
        key, now = _key(address), self._clock()
        found = self._failures.pop(key, None)
        if found is None or now - found.last >= self.forget:
            found = _Failures(0, now, now)
        found.count += 1
        found.last = now
        beyond = found.count - self.free
        doubled = self.first_wait * 2.0 ** min(beyond - 1, 64)  # (bounded: a float holds 2**64, not 2**9999)
        found.until = now + (min(doubled, self.max_wait) if beyond > 0 else 0.0)
        while len(self._failures) >= self._capacity:
            del self._failures[next(iter(self._failures))]
        self._failures[key] = found  # last: the most recent failure
        return found.until - now

    def succeeded(self, address: str | None) -> None:
        """A right token from ``address``: its mistakes are forgotten."""
        self._failures.pop(_key(address), None)


def _key(address: str | None) -> str:
    """What a client is counted by: its IPv4 address, its IPv6 /64 network, or what the server saw."""
    if address is None:
        return ""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:  # a dual-stack socket's IPv4 client
        return str(ip.ipv4_mapped)
    if ip.version == 6:
        return str(ipaddress.ip_network(f"{ip}/64", strict=False))
    return str(ip)


__all__ = ["CAPACITY", "FIRST_WAIT", "FORGET", "FREE", "MAX_WAIT", "Throttle"]
