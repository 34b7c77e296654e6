"""Signed-in browsers: a random id each, mapped to a token's grant, ended by sign-out or time.

A session ends when its holder signs out, when nobody used it for ``idle`` seconds, when it
is ``lifetime`` seconds old however busy, or when the server stops: a copied cookie (another
server on the same host receives it, see :mod:`~tether.surfaces.web.guard`) is worth little
and not for long. "Used" means a person's request: opening a page, sending a form. The open
pages' own traffic (their event streams, the refetch a stream triggers) does not keep a
session alive, or a tab left open would never time out.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass

from tether.errors import ConfigError
from tether.policy.access import Grant

IDLE = 30 * 60.0
"""Default seconds a session lasts unused (OWASP's upper bound for an application of some risk)."""
LIFETIME = 8 * 3600.0
"""Default seconds a session lasts at most, used or not: a working day, then sign in again."""
CAPACITY = 10_000
"""Sessions one process remembers (a few hundred bytes each): past it, the oldest ends."""


@dataclass
class _Session:
    grant: Grant
    opened: float
    used: float


class Sessions:
    """This process's open sessions, each ending after ``idle`` unused seconds or ``lifetime`` in all."""

    def __init__(
        self,
        *,
        idle: float = IDLE,
        lifetime: float = LIFETIME,
        clock: Callable[[], float] = time.monotonic,
        capacity: int = CAPACITY,
    ) -> None:
        """Raises ConfigError for a time that is not positive."""
        if not (idle > 0 and lifetime > 0):
            raise ConfigError(f"a session's idle time and lifetime must be positive, not {idle:g} and {lifetime:g}")
        self.idle = idle
        self.lifetime = lifetime
        self._clock = clock
        self._capacity = capacity
        self._open: dict[str, _Session] = {}  # in the order opened: the oldest first

    def open(self, grant: Grant) -> str:
        """A new session for ``grant`` (a token the caller checked): the id its cookie holds."""
        now = self._clock()
        self._forget_old(now)
        while len(self._open) >= self._capacity:
            del self._open[next(iter(self._open))]
        session = secrets.token_urlsafe(32)
        self._open[session] = _Session(grant, opened=now, used=now)
        return session

    def grant(self, session: str, *, used: bool) -> Grant | None:
        """The grant of a session still open, or None; ``used``: a person's request, so its idle time restarts."""
        found = self._open.get(session)
        now = self._clock()
        if found is None:
            return None
        if now - found.used >= self.idle or now - found.opened >= self.lifetime:
            del self._open[session]
            return None
        if used:
            found.used = now
        return found.grant

    def end(self, session: str) -> None:
        """End a session (signing out): its id is refused from now on, wherever a copy of it is."""
        self._open.pop(session, None)

    def _forget_old(self, now: float) -> None:
        """Drop the sessions past their lifetime: the oldest opened first, so only those are looked at."""
        while self._open:
            session, oldest = next(iter(self._open.items()))
            if now - oldest.opened < self.lifetime:
                return
            del self._open[session]


__all__ = ["CAPACITY", "IDLE", "LIFETIME", "Sessions"]
