"""Who may see and decide which tenant's runs: bearer tokens, each bound to a tenant.

A surface that serves people or programs over a network (``tether ui``, the example
service) takes the tenant from the credential a request carries, never from a header or a
parameter the caller picks: a token bound to ``acme`` sees and decides acme's runs only; a
token bound to no tenant (None) is an operator's and sees every tenant's.

Named tokens (a TOML tokens file, :class:`NamedToken`) also say who holds them and what they
may do: a ``viewer`` sees runs, an ``approver`` also decides their calls, and a decision is
recorded under the token's name, never a name the person types. Only a token's SHA-256 is
kept in memory (a file may hold the hash alone), a token is compared in constant time, and an
error about a token never repeats it.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import secrets
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from tether.errors import ConfigError

MIN_TOKEN_LENGTH = 16
"""Shorter tokens are refused: a guessable token protects nothing."""
MAX_NAME_LENGTH = 64
"""A token's name is what the audit says decided: a short, printable name."""


class Role(StrEnum):
    """What a token lets its holder do with the runs it reaches."""

    viewer = "viewer"
    """Sees runs and their pending calls; decides nothing, forks nothing."""
    approver = "approver"
    """Also approves, denies and edits calls, and forks runs."""


@dataclass(frozen=True)
class Grant:
    """What a valid token allows."""

    tenant: str | None
    """The only tenant whose runs it reaches; None: every tenant's (an operator)."""
    name: str | None = None
    """Who holds it (a named token): the decider the audit records. None: the holder says who they are."""
    role: Role = Role.approver
    """Whether it decides calls (an unnamed token does: a server's one token is its operator's)."""

    @property
    def operator(self) -> bool:
        """Whether it reaches every tenant's runs."""
        return self.tenant is None

    @property
    def may_decide(self) -> bool:
        """Whether its holder may approve, deny, edit and fork."""
        return self.role is Role.approver


@dataclass(frozen=True)
class NamedToken:
    """One entry of a tokens file: whose token it is, what it reaches, what it may do."""

    name: str
    """Who holds it: the audit records their decisions under this name."""
    sha256: str
    """The token's SHA-256, in hex: the token itself need not be written anywhere the server reads."""
    tenant: str | None = None
    """The only tenant whose runs it reaches; None: every tenant's."""
    role: Role = Role.viewer
    """What it may do: a token sees, unless it is named an approver."""

    @classmethod
    def of(cls, name: str, token: str, *, tenant: str | None = None, role: Role = Role.viewer) -> NamedToken:
        """A named token from the token itself (checked for strength, then hashed)."""
        return cls(name, _hex(_token_bytes(token, f"the token of {name!r}")), tenant, role)


class Credentials:
    """Known tokens (kept as their SHA-256) and the grant each gives."""

    def __init__(self, tokens: Mapping[str, str | None] | Sequence[NamedToken]) -> None:
        """Take ``{TOKEN: TENANT or None}`` (unnamed tokens that decide) or a list of :class:`NamedToken`.

        Raises:
            ConfigError: no token; a weak or malformed token, tenant, name or role; a name or a
                token given twice.
        """
        if not tokens:
            raise ConfigError("no tokens given: a token is what lets a request in")
        if isinstance(tokens, Mapping):
            known = []
            for number, (token, tenant) in enumerate(tokens.items(), start=1):
                which = f"token {number}" if len(tokens) > 1 else "the token"
                known.append((_hex(_token_bytes(token, which)), Grant(_tenant(tenant, which))))
        else:
            known = [_checked(entry, number) for number, entry in enumerate(tokens, start=1)]
        _no_twice(known)
        self._known = [(bytes.fromhex(digest), grant) for digest, grant in known]

    @classmethod
    def generate(cls, tenant: str | None = None) -> tuple[Credentials, str]:
        """One new random token (bound to ``tenant``), to print for the person who started the server."""
        token = secrets.token_urlsafe(32)
        return cls({token: tenant}), token

    @classmethod
    def from_file(cls, path: str | Path) -> Credentials:
        """Tokens from a file: named tokens in TOML (``.toml``), else a JSON object ``{"TOKEN": "TENANT"}``.

        The TOML file lists one table per token::

            [[tokens]]
            name = "alice"            # decisions are recorded as hers
            sha256 = "9f86d08..."     # or token = "...": the token itself
            tenant = "acme"           # leave out for every tenant's runs
            role = "approver"         # or "viewer", the default: sees, decides nothing
        """
        file = Path(path)
        try:
            text = file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as error:
            reason = error.strerror if isinstance(error, OSError) and error.strerror else error
            raise ConfigError(f"cannot read the token file {file}: {reason}") from None
        try:
            return cls(_named(text) if file.suffix.lower() == ".toml" else _unnamed(text))
        except ConfigError as error:
            raise ConfigError(f"the token file {file}: {error}") from None

    @property
    def tenants(self) -> set[str | None]:
        """Every tenant a token is bound to (None for an operator's)."""
        return {grant.tenant for _, grant in self._known}

    def grant(self, token: str | None) -> Grant | None:
        """What ``token`` allows, or None when it is not one of ours."""
        if not token:
            return None
        given = hashlib.sha256(token.encode(errors="surrogatepass")).digest()
        found: Grant | None = None
        for known, grant in self._known:  # every one compared, so timing tells nothing
            if hmac.compare_digest(given, known):
                found = grant
        return found


def derive(secret: bytes, token: str | bytes) -> str:
    """A token derived from ``token`` with ``secret`` (HMAC-SHA256, hex): the inspector's CSRF tokens."""
    raw = token if isinstance(token, bytes) else token.encode(errors="surrogatepass")
    return hmac.new(secret, raw, hashlib.sha256).hexdigest()


def bearer(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer TOKEN`` header, or None."""
    scheme, _, token = (authorization or "").strip().partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


def _token_bytes(token: object, which: str) -> bytes:
    """A token checked for strength; the message names its position (``which``), never its text."""
    if not isinstance(token, str) or len(token) < MIN_TOKEN_LENGTH:
        raise ConfigError(f"{which} is too weak: a token needs at least {MIN_TOKEN_LENGTH} characters")
    if any(char.isspace() for char in token):
        raise ConfigError(f"{which} holds spaces: a token goes in a header as one word")
    return token.encode(errors="surrogatepass")


def _hex(token: bytes) -> str:
    return hashlib.sha256(token).hexdigest()


def _tenant(tenant: object, which: str) -> str | None:
    if tenant is None:
        return None
    if not isinstance(tenant, str):
        raise ConfigError(f"{which}: its tenant must be a string or null (every tenant), not {tenant!r}")
    if not tenant.strip():
        raise ConfigError(f"{which} has an empty tenant: name one, or null for every tenant")
    return tenant


_SHA256 = re.compile(r"[0-9a-f]{64}")
_FIELDS = ("name", "token", "sha256", "tenant", "role")


def _checked(entry: NamedToken, number: int) -> tuple[str, Grant]:
    """A named token's hash and grant, once its name, hash, tenant and role are sound."""
    if not isinstance(entry.name, str) or not entry.name.strip():
        raise ConfigError(f"token {number} has no name: a named token says who holds it")
    which = f"token {number} ({entry.name})"
    if len(entry.name) > MAX_NAME_LENGTH or not entry.name.isprintable():
        raise ConfigError(f"{which}: a name is at most {MAX_NAME_LENGTH} printable characters")
    if not isinstance(entry.sha256, str) or not _SHA256.fullmatch(entry.sha256.lower()):
        raise ConfigError(f"{which}: sha256 must be the token's SHA-256 as 64 hex digits")
    if entry.role not in tuple(Role):
        raise ConfigError(f"{which}: role must be viewer or approver, not {entry.role!r}")
    grant = Grant(_tenant(entry.tenant, which), name=entry.name.strip(), role=Role(entry.role))
    return entry.sha256.lower(), grant


def _no_twice(known: Sequence[tuple[str, Grant]]) -> None:
    """Refuse one token (or one name) given twice: whose would it be?"""
    digests: dict[str, int] = {}
    names: dict[str, int] = {}
    for number, (digest, grant) in enumerate(known, start=1):
        if digest in digests:
            raise ConfigError(f"tokens {digests[digest]} and {number} are the same token: each must be its own")
        digests[digest] = number
        if grant.name is not None:
            if grant.name in names:
                raise ConfigError(f"tokens {names[grant.name]} and {number} are both named {grant.name!r}")
            names[grant.name] = number


def _unnamed(text: str) -> dict[str, Any]:
    """``{"TOKEN": "TENANT" or null}`` from a JSON tokens file."""
    try:
        data = json.loads(text)
    except ValueError as error:
        raise ConfigError(f"not valid JSON: {error}") from None
    if not isinstance(data, dict):
        raise ConfigError(
            "must hold a JSON object of token: tenant (or null); for named tokens with roles, write a .toml file"
        )
    return data


def _named(text: str) -> list[NamedToken]:
    """The ``[[tokens]]`` tables of a TOML tokens file."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"not valid TOML: {error}") from None
    entries = data.get("tokens")
    if set(data) - {"tokens"} or not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise ConfigError("must hold [[tokens]] tables, each with a name, a token (or its sha256), tenant and role")
    return [_entry(entry, number) for number, entry in enumerate(entries, start=1)]


def _entry(entry: dict[str, Any], number: int) -> NamedToken:
    name = entry.get("name")
    which = f"token {number}" + (f" ({name})" if isinstance(name, str) and name.strip() else "")
    unknown = sorted(set(entry) - set(_FIELDS))
    if unknown:
        raise ConfigError(f"{which}: unknown key {unknown[0]!r} (a token has {', '.join(_FIELDS)})")
    if ("token" in entry) == ("sha256" in entry):
        raise ConfigError(f"{which}: give its token or its sha256, one of them")
    if not isinstance(name, str):
        raise ConfigError(f"token {number} has no name: a named token says who holds it")
    sha256 = _hex(_token_bytes(entry["token"], which)) if "token" in entry else entry["sha256"]
    return NamedToken(name, sha256, entry.get("tenant"), entry.get("role", Role.viewer))


__all__ = ["MIN_TOKEN_LENGTH", "Credentials", "Grant", "NamedToken", "Role", "bearer", "derive"]
