"""Whether a stored run can still be driven by the code loaded now.

A run records the machine version, the store's schema version and each tool's input
schema when it starts. Resuming with tools whose inputs changed incompatibly would feed
the model's recorded arguments to a function that no longer accepts them, so it is
refused with an error saying which tool, which field and how it changed.

"Compatible" means: every input the old schema accepted, the new one accepts too. So a
new optional field, a wider type (``int`` to ``int | None`` or ``float``), a longer
``Literal``, a looser bound are fine; a removed or newly required field, a changed or
narrower type, a dropped ``Literal``/enum value, a tighter bound are not, at any depth
(``anyOf``/``oneOf`` alternatives, ``$defs`` references, list items, dict values, nested
models).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tether.core.machine import MACHINE_VERSION
from tether.errors import IncompatibleRun
from tether.stores import SCHEMA_VERSION
from tether.tools import Tool

Schema = Mapping[str, Any]
LOWER_BOUNDS = ("minimum", "exclusiveMinimum", "minLength", "minItems", "minProperties")
UPPER_BOUNDS = ("maximum", "exclusiveMaximum", "maxLength", "maxItems", "maxProperties")
_JSON_TYPES: tuple[tuple[type, str], ...] = (
    (bool, "boolean"),  # before int: a bool is an int in Python, never in JSON
    (int, "integer"),
    (float, "number"),
    (str, "string"),
    (type(None), "null"),
    (list, "array"),
    (dict, "object"),
)


def schema_changes(old: Schema, new: Schema) -> list[str]:
    """Incompatible differences between two tool input schemas, in words (empty: compatible)."""
    return _Comparison(old, new).fields(old, new, "")


@dataclass
class _Comparison:
    """One old/new pair of whole schemas: their ``$defs``, and the references already compared."""

    old_root: Schema
    new_root: Schema
    comparing: set[tuple[str | None, str | None]] = field(default_factory=set)
    """Pairs of ``$ref`` being compared: a recursive model is compared once."""

    def fields(self, old: Schema, new: Schema, prefix: str) -> list[str]:
        """An object's fields: removed, newly required, or changed."""
        old_fields: dict[str, Any] = dict(old.get("properties") or {})
        new_fields: dict[str, Any] = dict(new.get("properties") or {})
        changes = [f"field {prefix + name!r} was removed" for name in sorted(set(old_fields) - set(new_fields))]
        old_required = set(old.get("required") or [])
        for name in sorted(set(new.get("required") or []) - old_required):
            changes.append(f"field {prefix + name!r} is now required")
        for name in sorted(set(old_fields) & set(new_fields)):
            changes.extend(self.value(old_fields[name], new_fields[name], prefix + name))
        if isinstance(old.get("additionalProperties"), Mapping):  # dict[str, X]: compare the X
            after = new.get("additionalProperties")
            if after is False:
                changes.append(f"field {prefix.rstrip('.') or '(input)'!r} no longer accepts extra keys")
            elif isinstance(after, Mapping):
                changes.extend(self.value(old["additionalProperties"], after, f"{prefix}<key>"))
        return changes

    def value(self, old: Schema, new: Schema, where: str) -> list[str]:
        """Why some value ``old`` accepts at ``where`` is refused by ``new`` (empty: none is)."""
        if _accepts_anything(_resolve(new, self.new_root)):
            return []
        new_alternatives = _alternatives(new, self.new_root)
        admitting = [_resolve(c, self.new_root) for c in new_alternatives]
        changes: list[str] = []
        for alternative in _alternatives(old, self.old_root):
            values = _values(_resolve(alternative, self.old_root))
            if values is not None:  # a Literal or enum: each value it allowed must still pass
                lost = [v for v in values if not _admits(admitting, v)]
                if lost:
                    changes.append(f"field {where!r} no longer accepts {', '.join(map(repr, lost))}")
                continue
            if any(not self._single(alternative, candidate, where) for candidate in new_alternatives):
                continue  # some new alternative accepts all of it
            kinds = _types(_resolve(alternative, self.old_root))
            similar = [c for c in new_alternatives if _types(_resolve(c, self.new_root)) & kinds]
            if len(similar) != 1:
                before, after = _describe(old, self.old_root), _describe(new, self.new_root)
                return [f"field {where!r} changed type from {before} to {after}"]
            changes.extend(self._single(alternative, similar[0], where))  # changed inside: say where
        return changes

    def _single(self, old: Schema, new: Schema, where: str) -> list[str]:
        """Like :meth:`value`, for two schemas without alternatives (either may be a ``$ref``)."""
        refs = (old.get("$ref"), new.get("$ref"))
        if refs != (None, None):
            if refs in self.comparing:
                return []  # a recursive model, being compared further up
            self.comparing.add(refs)
            try:
                return self._single(_resolve(old, self.old_root), _resolve(new, self.new_root), where)
            finally:
                self.comparing.discard(refs)
        if _accepts_anything(new):
            return []
        old_types, new_types = _types(old), _types(new)
        if not old_types or not old_types <= _widened(new_types):
            before, after = _describe(old, self.old_root), _describe(new, self.new_root)
            return [f"field {where!r} changed type from {before} to {after}"]
        values = _values(new)
        if values is not None:
            return [f"field {where!r} now only accepts {', '.join(map(repr, values))}"]
        changes = _tighter_bounds(old, new, where)
        if "array" in old_types:
            changes.extend(self._items(old, new, where))
        if "object" in old_types:
            changes.extend(self.fields(old, new, f"{where}."))
        return changes

    def _items(self, old: Schema, new: Schema, where: str) -> list[str]:
        changes: list[str] = []
        old_prefix, new_prefix = old.get("prefixItems") or [], new.get("prefixItems") or []
        for index, (before, after) in enumerate(zip(old_prefix, new_prefix, strict=False)):
            changes.extend(self.value(before, after, f"{where}[{index}]"))
        if isinstance(old.get("items"), Mapping) or isinstance(new.get("items"), Mapping):
            changes.extend(self.value(old.get("items") or {}, new.get("items") or {}, f"{where}[]"))
        return changes


def _resolve(schema: Schema, root: Schema) -> Schema:
    """Follow ``$ref`` into the root's ``$defs`` (keeping keys set beside it, like a default)."""
    ref = schema.get("$ref")
    if not isinstance(ref, str) or not ref.startswith("#/"):
        return schema
    target: Any = root
    for part in ref[2:].split("/"):
        target = target.get(part, {}) if isinstance(target, Mapping) else {}
    return {**target, **{k: v for k, v in schema.items() if k != "$ref"}}


def _alternatives(schema: Schema, root: Schema) -> list[Schema]:
    """``anyOf``/``oneOf`` (and a list-valued ``type``) flattened; a ``$ref`` to a model stays a ref."""
    options = schema.get("anyOf") or schema.get("oneOf")
    if isinstance(options, list):
        return [alt for option in options for alt in _alternatives(option, root)]
    if "$ref" in schema:
        target = _resolve(schema, root)
        return _alternatives(target, root) if "anyOf" in target or "oneOf" in target else [schema]
    kinds = schema.get("type")
    if isinstance(kinds, list):
        return [{**schema, "type": kind} for kind in kinds]
    return [schema]


def _describe(schema: Schema, root: Schema) -> str:
    """A schema's kind in a few words: ``integer or null``, ``one of 'a', 'b'``, ``array of string``."""
    words = []
    for alternative in _alternatives(schema, root):
        resolved = _resolve(alternative, root)
        values = _values(resolved)
        if "$ref" in alternative:
            words.append(str(alternative["$ref"]).rsplit("/", 1)[-1])
        elif values is not None:
            words.append("one of " + ", ".join(map(repr, values)))
        elif resolved.get("type") == "array" and isinstance(resolved.get("items"), Mapping):
            words.append(f"array of {_describe(resolved['items'], root)}")
        else:
            words.append(_type_words(resolved))
    return " or ".join(words)


def _type_words(schema: Schema) -> str:
    kinds = schema.get("type")
    if isinstance(kinds, list):
        return " or ".join(map(str, kinds))
    return str(kinds or ("object" if "properties" in schema else "any value"))


def _accepts_anything(schema: Schema) -> bool:
    constraining = {"type", "anyOf", "oneOf", "allOf", "enum", "const", "$ref", "properties", "not"}
    return not constraining & set(schema)


def _types(schema: Schema) -> set[str]:
    kinds = schema.get("type")
    if isinstance(kinds, str):
        return {kinds}
    if isinstance(kinds, list):
        return {str(k) for k in kinds}
    if "properties" in schema:
        return {"object"}
    values = _values(schema)
    return {_json_type(v) for v in values} if values is not None else set()


def _widened(kinds: set[str]) -> set[str]:
    """JSON types a schema of ``kinds`` accepts: a number also accepts every integer."""
    return kinds | {"integer"} if "number" in kinds else kinds


def _values(schema: Schema) -> list[Any] | None:
    if "const" in schema:
        return [schema["const"]]
    enum = schema.get("enum")
    return list(enum) if isinstance(enum, list) else None


def _json_type(value: Any) -> str:
    return next((name for kind, name in _JSON_TYPES if isinstance(value, kind)), "object")


def _admits(alternatives: list[Schema], value: Any) -> bool:
    """Whether one of the (resolved, single) schemas accepts ``value``; checks what a Literal needs."""
    for schema in alternatives:
        kinds = _types(schema)
        if kinds and _json_type(value) not in _widened(kinds):
            continue
        values = _values(schema)
        if values is not None and value not in values:
            continue
        if _json_type(value) in ("integer", "number") and not _within(schema, value):
            continue
        if isinstance(value, str) and not _string_fits(schema, value):
            continue
        return True
    return False


def _within(schema: Schema, number: float) -> bool:
    low, high = schema.get("minimum"), schema.get("maximum")
    above, below = schema.get("exclusiveMinimum"), schema.get("exclusiveMaximum")
    return (
        (low is None or number >= low)
        and (high is None or number <= high)
        and (above is None or number > above)
        and (below is None or number < below)
    )


def _string_fits(schema: Schema, text: str) -> bool:
    if len(text) < schema.get("minLength", 0) or len(text) > schema.get("maxLength", len(text)):
        return False
    pattern = schema.get("pattern")
    return pattern is None or re.search(pattern, text) is not None


def _tighter_bounds(old: Schema, new: Schema, where: str) -> list[str]:
    changes = []
    for key in LOWER_BOUNDS:
        if key in new and (key not in old or new[key] > old[key]):
            changes.append(f"field {where!r}: {key} raised from {old.get(key, 'none')} to {new[key]}")
    for key in UPPER_BOUNDS:
        if key in new and (key not in old or new[key] < old[key]):
            changes.append(f"field {where!r}: {key} lowered from {old.get(key, 'none')} to {new[key]}")
    if "pattern" in new and new.get("pattern") != old.get("pattern"):
        changes.append(f"field {where!r} must now match {new['pattern']!r}")
    return changes


def check_compatible(
    run_id: str, spec: Mapping[str, Any], tools: Mapping[str, Tool], *, whose: str = "the current tools"
) -> None:
    """Raise :class:`IncompatibleRun` unless ``tools`` can continue the run ``spec`` describes.

    ``whose``: what the message calls ``tools``.
    """
    check_versions(run_id, spec)
    problems = []
    for name, schema in sorted((spec.get("tool_schemas") or {}).items()):
        tool = tools.get(name)
        if tool is None:
            problems.append(f"tool {name!r} is no longer available")
            continue
        problems.extend(f"tool {name!r}: {change}" for change in schema_changes(schema, tool.input_schema()))
    if problems:
        raise IncompatibleRun(f"run {run_id} cannot be resumed with {whose}: " + "; ".join(problems), run_id=run_id)


def check_versions(run_id: str, spec: Mapping[str, Any]) -> None:
    """Raise :class:`IncompatibleRun` if a newer tether (machine or store schema) started the run."""
    for key, current, what in (
        ("machine_version", MACHINE_VERSION, "machine"),
        ("schema_version", SCHEMA_VERSION, "schema"),
    ):
        version = int(spec.get(key, current))
        if version > current:
            raise IncompatibleRun(
                f"run {run_id} was started by a newer tether ({what} version {version} > {current}); upgrade tether",
                run_id=run_id,
            )
