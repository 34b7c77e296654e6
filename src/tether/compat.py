"""Whether a stored run can still be driven by the code loaded now.

A run records the machine version and each tool's input schema when it starts. Resuming
with tools whose inputs changed incompatibly would feed the model's recorded arguments to
a function that no longer accepts them, so it is refused with an error saying which tool
changed and how. Adding tools, or optional fields, is compatible.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tether.errors import IncompatibleRun
from tether.machine import MACHINE_VERSION
from tether.tools import Tool


def schema_changes(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """Incompatible differences between two tool input schemas, in words."""
    old_fields: dict[str, Any] = dict(old.get("properties") or {})
    new_fields: dict[str, Any] = dict(new.get("properties") or {})
    changes = [f"field {name!r} was removed" for name in sorted(set(old_fields) - set(new_fields))]
    old_required = set(old.get("required") or [])
    for name in sorted(set(new.get("required") or []) - old_required):
        changes.append(f"field {name!r} is now required")
    for name in sorted(set(old_fields) & set(new_fields)):
        before, after = old_fields[name].get("type"), new_fields[name].get("type")
        if before != after:
            changes.append(f"field {name!r} changed type from {before} to {after}")
    return changes


def check_compatible(run_id: str, spec: Mapping[str, Any], tools: Mapping[str, Tool]) -> None:
    """Raise :class:`IncompatibleRun` unless ``tools`` can continue the run ``spec`` describes."""
    version = int(spec.get("machine_version", MACHINE_VERSION))
    if version > MACHINE_VERSION:
        raise IncompatibleRun(
            f"run {run_id} was started by a newer tether (machine version {version} > {MACHINE_VERSION}); "
            "upgrade tether",
            run_id=run_id,
        )
    problems = []
    for name, schema in sorted((spec.get("tool_schemas") or {}).items()):
        tool = tools.get(name)
        if tool is None:
            problems.append(f"tool {name!r} is no longer available")
            continue
        problems.extend(f"tool {name!r}: {change}" for change in schema_changes(schema, tool.input_schema()))
    if problems:
        raise IncompatibleRun(
            f"run {run_id} cannot be resumed with the current tools: " + "; ".join(problems), run_id=run_id
        )
