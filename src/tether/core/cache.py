"""The tool-result cache: keys, and the facts recorded for hits and misses.

A tool marked ``@tool(cache_ttl=seconds)`` runs at most once per distinct input within its
time to live, across every process sharing a store. The split follows the engine's rule:

- the driver looks the key up in the store before running the call (I/O) and, on a hit,
  hands the value to :func:`tether.core.engine.on_cache_hit`, which makes it the call's result
  without running the tool (no ``tool_started``, no execution counted);
- on a miss a ``cache_miss`` record is written with the tool's start, and after a
  *successful* attempt the driver stores the tool's full serialised value. Errors are
  never stored, so a failing call is always tried for real next time.

The key is the tool's name plus a SHA-256 of the canonical JSON (sorted keys, compact
separators) of its validated input, so ``{"a": 1, "b": 2}`` and ``{"b": 2, "a": 1}``
share an entry. A run's tenant is hashed in with the input when there is one, so tenants
sharing a database never read each other's results.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Any

from tether.canonical import canonical_json
from tether.facts.events import CacheMiss

if TYPE_CHECKING:
    from tether.core.engine import RunTool


def cache_key(tool: str, arguments: Any, *, tenant: str | None = None) -> str:
    """``tool:sha256`` of the input (and of the tenant, when the run has one)."""
    hashed = arguments if tenant is None else {"tenant": tenant, "input": arguments}
    digest = hashlib.sha256(canonical_json(hashed).encode(errors="surrogatepass")).hexdigest()  # any str hashes
    return f"{tool}:{digest}"


def key_for(action: RunTool, *, tenant: str | None = None) -> str:
    """The key of the input that would actually run (a reviewer's edit included)."""
    return cache_key(action.tool.name, action.arguments.model_dump(mode="json"), tenant=tenant)


def miss_record(action: RunTool, key: str) -> CacheMiss:
    """The fact written with the tool's start when the cache had nothing usable."""
    return CacheMiss(action.call.call_id, action.tool.name, key)


__all__ = ["cache_key", "key_for", "miss_record"]
