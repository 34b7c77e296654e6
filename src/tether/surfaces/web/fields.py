"""The edit form of a call's input: one field per property of the tool's JSON schema, and back.

:func:`fields_of` turns a tool's input schema (as the run recorded it) and the input a person is
shown into form fields: a text box for a string (a text area for one with lines), a number box,
a choice for an enum or a boolean, and raw JSON for anything nested (objects, arrays, unions).
Each field posts its value as ``f.KEY`` and how to read it as ``t.KEY``; :func:`input_of` reads
them back into the input, with a problem per field that cannot be read.

A field is only offered when what it shows reads back as exactly the value shown (checked when it
is made): otherwise the value is shown as raw JSON, which always does. So a form left untouched
sends the input it was shown, to the character.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tether.views.printable import printable

VALUE = "f."
"""The prefix of a field's value in a posted form (``f.amount``)."""
KIND = "t."
"""The prefix of how to read it (``t.amount``: one of :data:`KINDS`, ``?`` after it: blank leaves the key out)."""
KINDS = ("string", "text", "number", "integer", "json")
"""``string`` as typed; ``text`` with the browser's line breaks (CRLF) as ``\\n``; ``number``, ``integer``
and ``json`` read as JSON (a blank one always leaves the key out)."""
OPTIONAL = "?"
LINE_LENGTH = 80
"""A string longer than this (or with a line break) is edited in a text area."""


@dataclass(frozen=True)
class Field:
    """One field of the edit form."""

    key: str
    control: str
    """``input``, ``textarea``, ``number`` or ``select``."""
    kind: str
    """How the server reads the posted value back (see :data:`KINDS`)."""
    value: str
    """What the field holds as shown."""
    hint: str
    """The type as people read it: ``string``, ``number``, ``one of``, ``JSON``..."""
    required: bool = False
    description: str = ""
    """The schema's description of the property, if any."""
    options: tuple[tuple[str, str], ...] = ()
    """A choice's options: (the value posted, as JSON; what is shown)."""
    step: str = "any"
    """A number box's step: ``1`` for an integer."""

    @property
    def name(self) -> str:
        """The posted value's name."""
        return VALUE + self.key

    @property
    def kind_name(self) -> str:
        """The posted kind's name."""
        return KIND + self.key


def fields_of(schema: Any, shown: Any) -> list[Field] | None:
    """The form's fields for ``shown`` (a call's input) under ``schema``; None: no fields, raw JSON only.

    Fields come in the schema's order, then any key of ``shown`` it does not list (as raw JSON).
    """
    if not isinstance(schema, dict) or not isinstance(shown, dict) or not isinstance(schema.get("properties"), dict):
        return None
    definitions = schema.get("$defs") or schema.get("definitions") or {}
    required = set(schema.get("required") or [])
    fields = []
    for key, property_schema in schema["properties"].items():
        resolved = _resolved(property_schema, definitions)
        fields.append(_field(str(key), resolved, shown.get(key, _ABSENT), key in required))
    listed = set(schema["properties"])
    fields += [_json_field(str(key), value, "JSON", False, "") for key, value in shown.items() if key not in listed]
    return fields


def input_of(form: Mapping[str, str]) -> tuple[dict[str, Any] | None, dict[str, str]]:
    """The input the posted fields say, and a problem per field that cannot be read.

    None when the form holds no fields (a script's form, or one whose fields a person set aside
    for the raw JSON).
    """
    kinds = {name[len(KIND) :]: kind for name, kind in form.items() if name.startswith(KIND)}
    if not kinds:
        return None, {}
    found: dict[str, Any] = {}
    problems: dict[str, str] = {}
    for key, kind in kinds.items():
        try:
            value = _read(kind, form.get(VALUE + key, ""))
        except ValueError as error:
            problems[key] = str(error)
            continue
        if value is not _ABSENT:
            found[key] = value
    return found, problems


class _Absent:
    """A key the input does not hold."""


_ABSENT: Any = _Absent()


def _read(kind: str, text: str) -> Any:
    """One posted field's value; :data:`_ABSENT` for a blank one that leaves its key out."""
    optional = kind.endswith(OPTIONAL)
    kind = kind.removesuffix(OPTIONAL)
    if kind not in KINDS:
        raise ValueError(f"unknown field kind {kind!r}")
    if kind == "text":
        text = text.replace("\r\n", "\n")  # how browsers send a text area's lines
    if kind in ("string", "text"):
        return _ABSENT if optional and text == "" else text
    if text.strip() == "":
        return _ABSENT
    try:
        value = json.loads(text)
    except RecursionError:
        raise ValueError("nested too deeply") from None
    except ValueError as error:
        said = f"not valid JSON: {error}" if kind == "json" else f"{text.strip()!r} is not a number"
        raise ValueError(said) from None
    if kind == "json":
        return value
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{text.strip()!r} is not a number")
    if kind == "integer" and not isinstance(value, int):
        raise ValueError(f"{text.strip()!r} is not a whole number")
    return value


def _resolved(schema: Any, definitions: Mapping[str, Any]) -> dict[str, Any]:
    """A property's schema with a local ``$ref`` followed and ``X | None`` seen as X (nullable)."""
    if not isinstance(schema, dict):
        return {}
    reference = schema.get("$ref")
    if isinstance(reference, str) and reference.startswith(("#/$defs/", "#/definitions/")):
        target = definitions.get(reference.rsplit("/", 1)[1])
        schema = {**(target if isinstance(target, dict) else {}), **{k: v for k, v in schema.items() if k != "$ref"}}
    found: dict[str, Any] = schema
    branches = schema.get("anyOf")
    if isinstance(branches, list):
        others = [branch for branch in branches if branch != {"type": "null"}]
        if len(others) == 1 and len(others) < len(branches):
            rest = {k: v for k, v in schema.items() if k != "anyOf"}
            return {**_resolved(others[0], definitions), **rest, "nullable": True}
    return found


@dataclass(frozen=True)
class _Property:
    """One property of the schema, with the value shown for it."""

    key: str
    schema: dict[str, Any]
    shown: Any
    required: bool

    @property
    def description(self) -> str:
        return str(self.schema.get("description") or "")

    @property
    def absent(self) -> bool:
        return self.shown is _ABSENT

    def made(self, control: str, kind: str, value: str, hint: str, **more: Any) -> Field:
        return Field(self.key, control, kind, value, hint, self.required, self.description, **more)


def _field(key: str, schema: dict[str, Any], shown: Any, required: bool) -> Field:
    """The field for one property, if one shows ``shown`` exactly; else raw JSON."""
    prop = _Property(key, schema, shown, required)
    kind_of = schema.get("type")
    if "enum" in schema or "const" in schema or kind_of == "boolean":
        made = _choice(prop)
    elif kind_of == "string":
        made = _string(prop)
    elif kind_of in ("number", "integer"):
        made = _number(prop, str(kind_of))
    else:
        made = None
    if made is not None and _reads_back(made, shown):
        return made
    return _json_field(key, shown, _type_hint(schema), required, prop.description)


def _choice(prop: _Property) -> Field | None:
    schema = prop.schema
    choices = list(schema.get("enum") or ([schema["const"]] if "const" in schema else [True, False]))
    if schema.get("nullable"):
        choices.append(None)
    options = [(json.dumps(choice, ensure_ascii=False), _label(choice)) for choice in choices]
    if not prop.required:
        options.insert(0, ("", "— leave out"))
    value = "" if prop.absent else json.dumps(prop.shown, ensure_ascii=False)
    if value not in {posted for posted, _ in options}:
        return None
    hint = "true or false" if choices[:2] == [True, False] else "one of"
    return prop.made("select", "json", value, hint, options=tuple(options))


def _string(prop: _Property) -> Field | None:
    if not prop.absent and not isinstance(prop.shown, str):
        return None
    value = "" if prop.absent else str(prop.shown)
    long = "\n" in value or len(value) > LINE_LENGTH
    optional = OPTIONAL if prop.absent and not prop.required else ""
    return prop.made("textarea" if long else "input", ("text" if long else "string") + optional, value, "text")


def _number(prop: _Property, kind: str) -> Field | None:
    if prop.absent:
        value = ""
    elif isinstance(prop.shown, bool) or not isinstance(prop.shown, int | float):
        return None
    else:
        value = json.dumps(prop.shown)
    hint = "whole number" if kind == "integer" else "number"
    return prop.made("number", kind, value, hint, step="1" if kind == "integer" else "any")


def _json_field(key: str, shown: Any, hint: str, required: bool, description: str) -> Field:
    value = "" if shown is _ABSENT else json.dumps(shown, indent=2, ensure_ascii=False)
    return Field(key, "textarea", "json", value, hint, required, description)


def _reads_back(field: Field, shown: Any) -> bool:
    """Whether the field, sent untouched, reads back as ``shown`` (same value, same JSON types)."""
    if printable(field.value) != field.value:  # shown with escapes (a control character): raw JSON says it exactly
        return False
    sent = field.value.replace("\n", "\r\n") if field.kind.startswith("text") else field.value
    try:
        back = _read(field.kind, sent)
    except ValueError:
        return False
    if back is _ABSENT or shown is _ABSENT:
        return back is shown
    return json.dumps(back, sort_keys=True) == json.dumps(shown, sort_keys=True)


def _label(choice: Any) -> str:
    return choice if isinstance(choice, str) else json.dumps(choice)


def _type_hint(schema: dict[str, Any]) -> str:
    kind = schema.get("type")
    return f"JSON ({kind})" if isinstance(kind, str) else "JSON"


__all__ = ["KIND", "KINDS", "VALUE", "Field", "fields_of", "input_of"]
