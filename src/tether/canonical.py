"""One JSON spelling per value, so equal inputs hash (and compare) equally.

Cache keys, approval fingerprints and toolset schema fingerprints all hash a value's JSON; they
must agree on it whatever the order of a dict's keys, so they share this one spelling.
"""

from __future__ import annotations

import json
from typing import Any


def canonical_json(value: Any) -> str:
    """One spelling per value: sorted keys, no spaces, so equal inputs hash equally."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


__all__ = ["canonical_json"]
