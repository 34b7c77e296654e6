"""Toolsets: tools that live outside the program, in an MCP server or behind an OpenAPI spec.

A toolset gives ordinary :class:`tether.tools.Tool` s (each call host-run under retries,
approvals, policy rules, cache and audit like any other), and a *record*: JSON saying how to
reach it again (a command, a URL, a spec's location, the *names* of the environment variables
its credentials come from, never their values) with a fingerprint of the tools it gave. A run
stores the records of its agent's toolsets in its spec, so ``tether resume`` in another
process reconnects (:func:`from_record`); the tools' schemas are stored with the run as every
tool's are, so a schema changed incompatibly since is refused (:mod:`tether.core.compat`), and
:func:`changes` says what else changed.

Each client lives in its own module (``mcp.py`` is the only one importing the ``mcp`` SDK);
those are imported only when such a toolset is used.
"""

from __future__ import annotations

import fnmatch
import hashlib
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from tether.canonical import canonical_json
from tether.errors import ConfigError, ToolsetError
from tether.policy.policies import ApprovalContext, ApprovalSetting, ApprovalVerdict
from tether.tools import TOOL_NAME, Tool

KINDS = ("mcp", "openapi")
"""The kinds of toolset a record may name."""


@runtime_checkable
class Toolset(Protocol):
    """Tools from outside the program, and how to reach them again."""

    def tools(self) -> list[Tool]:
        """The tools, connecting (or reading the spec) the first time; the same list afterwards."""
        ...

    def options(self) -> dict[str, Any]:
        """How to reach the tools again, as JSON (what :func:`from_record` takes, with the ``kind``)."""
        ...

    def record(self) -> dict[str, Any]:
        """JSON for a run's spec: ``kind``, :meth:`options`, ``fingerprint`` and ``tools`` (their names)."""
        ...

    def close(self) -> None:
        """Let go of connections and processes (a toolset used again reconnects)."""
        ...


def fingerprint(tools: Iterable[Tool]) -> str:
    """A digest of what a toolset offers: each tool's name, description, schema and settings."""
    offered = [
        {**tool.definition(), **tool.settings(), "tags": sorted(tool.tags), "idempotent": tool.idempotent}
        for tool in sorted(tools, key=lambda t: t.name)
    ]
    return hashlib.sha256(canonical_json(offered).encode()).hexdigest()[:16]


def recorded(kind: str, options: Mapping[str, Any], tools: Sequence[Tool]) -> dict[str, Any]:
    """A toolset's record: its options, then ``fingerprint`` and ``tools``."""
    return {"kind": kind, **options, "fingerprint": fingerprint(tools), "tools": [tool.name for tool in tools]}


def local_name(remote: str, prefix: str, source: str) -> str:
    """The tool's name here: ``prefix`` plus the remote name, characters the Messages API refuses as ``_``."""
    name = prefix + re.sub(r"[^a-zA-Z0-9_-]", "_", remote)
    if not TOOL_NAME.match(name):
        raise ToolsetError(
            f"tool {remote!r} cannot be named {name!r}: names must match {TOOL_NAME.pattern}", toolset=source
        )
    return name


def included(name: str, globs: Sequence[str] | None) -> bool:
    """Whether a remote tool named ``name`` is offered: it matches one of ``globs`` (None: every tool is)."""
    return globs is None or any(fnmatch.fnmatchcase(name, glob) for glob in globs)


def asking(reason: str | None) -> ApprovalSetting:
    """A tool's ``approval=``: ask a person before each call, saying ``reason``; None asks nobody."""
    if reason is None:
        return False
    verdict = ApprovalVerdict("require_approval", reason)

    def ask(arguments: Any, context: ApprovalContext) -> ApprovalVerdict:
        return verdict

    return ask


def from_record(record: Mapping[str, Any]) -> Toolset:
    """The toolset a run's spec describes (not yet connected).

    Raises:
        ConfigError: the record names an unknown kind or misses what that kind needs, or the
            kind's client is not installed (the error says which extra to install).
    """
    kind = record.get("kind")
    try:
        if kind == "mcp":
            from tether.toolsets.mcp import MCPToolset

            return MCPToolset.from_record(record)
        if kind == "openapi":
            from tether.toolsets.openapi import OpenAPIToolset

            return OpenAPIToolset.from_record(record)
    except ImportError as missing:
        raise ConfigError(str(missing)) from missing
    raise ConfigError(f"unknown toolset kind {kind!r} in the run's spec (known: {', '.join(KINDS)})")


def changes(recorded_toolsets: Sequence[Mapping[str, Any]], toolsets: Sequence[Toolset]) -> list[str]:
    """What the toolsets offer now that differs from what a run recorded, in words (empty: nothing).

    Changes that break the run (a tool gone, a schema narrowed) are refused when it is loaded
    (:func:`tether.core.compat.check_compatible`); the rest, said here, is for a warning.
    """
    notes = []
    for before, toolset in zip(recorded_toolsets, toolsets, strict=False):
        now = toolset.record()
        if before.get("fingerprint") in (None, now["fingerprint"]):
            continue
        added = sorted(set(now["tools"]) - set(before.get("tools") or []))
        removed = sorted(set(before.get("tools") or []) - set(now["tools"]))
        detail = "; ".join(
            part
            for part in (
                f"new: {', '.join(added)}" if added else "",
                f"gone: {', '.join(removed)}" if removed else "",
            )
            if part
        )
        notes.append(
            f"{describe(now)} offers different tools than when the run started"
            f"{f' ({detail})' if detail else ' (descriptions, schemas or annotations)'}"
        )
    return notes


def describe(record: Mapping[str, Any]) -> str:
    """A toolset in words, from its record: ``MCP server 'python server.py'``, ``OpenAPI spec api.yaml``."""
    if record.get("kind") == "mcp":
        where = " ".join(record["command"]) if record.get("command") else record.get("url")
        return f"MCP server {where!r}"
    return f"OpenAPI spec {record.get('spec')}"


__all__ = [
    "KINDS",
    "Toolset",
    "asking",
    "changes",
    "describe",
    "fingerprint",
    "from_record",
    "included",
    "local_name",
    "recorded",
]
