"""Reading an OpenAPI 3.0 or 3.1 spec into operations: what each takes, as one JSON schema.

The spec (a file or a URL, JSON or YAML) is read as far as the tools need it: each
operation's name (``operationId``, else its method and path), its parameters (path, query,
header, cookie) and its request body become the properties of one input schema (the body as
``body``). ``$ref`` s are followed wherever they point, into other files and URLs too: a
parameter, request body or path item is taken in place; a schema becomes an entry of the
input schema's ``$defs`` (so recursive schemas stay finite), holding only those the
operation reaches. OpenAPI 3.0's own schema words become JSON Schema 2020-12 (``nullable``,
boolean ``exclusiveMinimum``); read-only properties are left out (the server writes those).

A spec that cannot be read this way is refused with a :class:`~tether.errors.ToolsetError`
naming the place (``paths./pets.get.parameters.0: 'in' must be one of ...``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urldefrag, urljoin, urlsplit

import yaml

from tether.errors import ToolsetError

METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")
LOCATIONS = ("path", "query", "header", "cookie")
BODY = "body"
"""The input property holding the request body."""
JSON_TYPES = re.compile(r"^application/([\w.+-]*\+)?json\b|^\*/\*$")
FORM = "application/x-www-form-urlencoded"
SUBSCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
SUBSCHEMA_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems")
SUBSCHEMAS = (
    "items",
    "additionalProperties",
    "not",
    "if",
    "then",
    "else",
    "contains",
    "propertyNames",
    "unevaluatedItems",
    "unevaluatedProperties",
)
OPENAPI_ONLY = ("nullable", "example", "xml", "externalDocs", "discriminator", "readOnly", "writeOnly", "deprecated")
"""Schema words of OpenAPI's own (3.0) that JSON Schema validators and the model need not see."""

Fetch = Callable[[str], str]
"""Reads a document's text by its URI (``file://...`` or ``http(s)://...``)."""


@dataclass(frozen=True)
class Parameter:
    """One parameter of an operation, and the input property that holds it."""

    name: str
    location: str
    """``path``, ``query``, ``header`` or ``cookie``."""
    key: str
    """The input's property: the name, or ``location_name`` when two parameters share a name."""
    style: str
    explode: bool


@dataclass(frozen=True)
class Operation:
    """One method on one path: a tool."""

    name: str
    method: str
    path: str
    description: str
    parameters: tuple[Parameter, ...]
    body_type: str | None
    """The request body's media type (the input's ``body``), if it has one."""
    input_schema: dict[str, Any]


@dataclass(frozen=True)
class Spec:
    """What tether read from a spec."""

    location: str
    """The spec's URI (``file:///abs/api.yaml`` or its URL)."""
    servers: tuple[str, ...]
    """Its ``servers`` URLs, resolved against its location, variables at their defaults."""
    operations: tuple[Operation, ...]


def read(location: str, fetch: Fetch, *, source: str) -> Spec:
    """The operations of the spec at ``location`` (a path, a URL)."""
    documents = _Documents(fetch, source)
    uri = location if re.match(r"^https?://", location) else Path(location).resolve().as_uri()
    return _Reader(documents, uri, documents.load(uri, "the spec"), source).spec()


class _Documents:
    """Documents by URI, each fetched and parsed once."""

    def __init__(self, fetch: Fetch, source: str) -> None:
        self.fetch = fetch
        self.source = source
        self.loaded: dict[str, Any] = {}

    def load(self, uri: str, where: str) -> Any:
        if uri not in self.loaded:
            try:
                text = self.fetch(uri)
            except ToolsetError:
                raise
            except Exception as error:
                raise ToolsetError(f"cannot read {uri}: {error}", toolset=self.source, path=where) from error
            self.loaded[uri] = parse(text, uri, self.source)
        return self.loaded[uri]

    def resolve(self, ref: Any, base: str, where: str) -> tuple[str, str, Any]:
        """``(document URI, JSON pointer, target)`` of a ``$ref`` met at ``where`` in the document ``base``."""
        if not isinstance(ref, str):
            raise ToolsetError(f"$ref must be a string, not {ref!r}", toolset=self.source, path=where)
        target, fragment = urldefrag(urljoin(base, ref) if not ref.startswith("#") else base + ref)
        value = self.load(target, where)
        for part in [unquote(p).replace("~1", "/").replace("~0", "~") for p in fragment.split("/")[1:]]:
            if isinstance(value, Mapping) and part in value:
                value = value[part]
            elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
                value = value[int(part)]
            else:
                raise ToolsetError(
                    f"$ref {ref!r} points at nothing ({part!r} not found)", toolset=self.source, path=where
                )
        return target, fragment, value


def parse(text: str, uri: str, source: str) -> Any:
    """A document's text as JSON, else YAML; neither is an error naming the line."""
    try:
        return json.loads(text)
    except ValueError:
        pass
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise ToolsetError(f"{uri} is neither JSON nor YAML: {error}", toolset=source) from error


@dataclass
class _Reader:
    """One spec being read: its documents, and the schemas bundled so far."""

    documents: _Documents
    uri: str
    root: Any
    source: str
    def_names: dict[tuple[str, str], str] = field(default_factory=dict)
    """Schema ``$ref`` targets (document, pointer) to their names in ``$defs``."""
    defs: dict[str, Any] = field(default_factory=dict)
    """Converted schemas by name."""
    openapi_30: bool = True

    def fail(self, where: str, message: str) -> ToolsetError:
        return ToolsetError(message, toolset=self.source, path=where or "the spec's root")

    def spec(self) -> Spec:
        if not isinstance(self.root, Mapping):
            raise self.fail("", "the spec is not an object")
        version = self.root.get("openapi")
        if "swagger" in self.root:
            raise self.fail("swagger", "Swagger 2.0 is not read: convert the spec to OpenAPI 3 first")
        if not isinstance(version, str) or not re.match(r"^3\.[01]\.", version):
            raise self.fail("openapi", f"{version!r} is not an OpenAPI version tether reads (3.0.x or 3.1.x)")
        self.openapi_30 = version.startswith("3.0")
        paths = self.root.get("paths") or {}
        if not isinstance(paths, Mapping):
            raise self.fail("paths", "must be an object of paths")
        operations: dict[str, Operation] = {}
        for path, item in paths.items():
            for operation in self._path_item(str(path), item):
                if operation.name in operations:
                    first = operations[operation.name]
                    raise self.fail(
                        f"paths.{path}.{operation.method}",
                        f"two operations are named {operation.name!r}: this one and {first.method.upper()} "
                        f"{first.path}",
                    )
                operations[operation.name] = operation
        return Spec(self.uri, self._servers(), tuple(operations.values()))

    def _servers(self) -> tuple[str, ...]:
        servers = self.root.get("servers") or []
        found = []
        for index, server in enumerate(servers if isinstance(servers, list) else []):
            if not isinstance(server, Mapping) or not isinstance(server.get("url"), str):
                raise self.fail(f"servers.{index}", "a server needs a url")
            found.append(urljoin(self.uri, _substituted(server["url"], server.get("variables") or {})))
        return tuple(found)

    def _path_item(self, path: str, item: Any) -> Iterator[Operation]:
        where = f"paths.{path}"
        base, item = self._follow(item, self.uri, where)
        if not isinstance(item, Mapping):
            raise self.fail(where, "a path item must be an object")
        shared = self._parameter_list(item.get("parameters"), base, f"{where}.parameters")
        for method in METHODS:
            if method in item:
                yield self._operation(path, method, item[method], base, shared)

    def _operation(self, path: str, method: str, operation: Any, base: str, shared: list[dict[str, Any]]) -> Operation:
        where = f"paths.{path}.{method}"
        if not isinstance(operation, Mapping):
            raise self.fail(where, "an operation must be an object")
        own = self._parameter_list(operation.get("parameters"), base, f"{where}.parameters")
        by_place = {(p["in"], p["name"]): p for p in [*shared, *own]}  # an operation's own replace the path's
        names = [name for _, name in by_place]
        properties: dict[str, Any] = {}
        required: list[str] = []
        parameters = []
        for (location, name), parameter in by_place.items():
            clash = names.count(name) > 1 or (name == BODY and "requestBody" in operation)
            key = f"{location}_{name}" if clash else name
            schema = self._parameter_schema(parameter, f"{where}.parameters({location} {name})")
            if parameter.get("description") and isinstance(schema, dict):
                schema = {**schema, "description": str(parameter["description"])}
            properties[key] = schema
            if parameter.get("required") or location == "path":
                required.append(key)
            style = parameter.get("style") or ("form" if location in ("query", "cookie") else "simple")
            explode = parameter.get("explode", style == "form")
            parameters.append(Parameter(name, location, key, str(style), bool(explode)))
        for variable in re.findall(r"\{([^}]+)\}", path):
            if ("path", variable) not in by_place:
                raise self.fail(where, f"the path's {{{variable}}} has no path parameter")
        body_type = None
        if "requestBody" in operation:
            body_type, schema, body_required = self._body(operation["requestBody"], base, f"{where}.requestBody")
            properties[BODY] = schema
            if body_required:
                required.append(BODY)
        input_schema: dict[str, Any] = {"type": "object", "properties": properties, "additionalProperties": False}
        if required:
            input_schema["required"] = required
        reached = self._reached(input_schema)
        if reached:
            input_schema["$defs"] = reached
        return Operation(
            name=_name(operation.get("operationId"), method, path),
            method=method.upper(),
            path=path,
            description=_description(operation, method, path),
            parameters=tuple(parameters),
            body_type=body_type,
            input_schema=input_schema,
        )

    def _parameter_list(self, parameters: Any, base: str, where: str) -> list[dict[str, Any]]:
        if parameters is None:
            return []
        if not isinstance(parameters, list):
            raise self.fail(where, "parameters must be a list")
        found = []
        for index, given in enumerate(parameters):
            here = f"{where}.{index}"
            origin, parameter = self._follow(given, base, here)
            if not isinstance(parameter, Mapping) or not isinstance(parameter.get("name"), str):
                raise self.fail(here, "a parameter needs a name")
            if parameter.get("in") not in LOCATIONS:
                raise self.fail(here, f"'in' must be one of {', '.join(LOCATIONS)}, not {parameter.get('in')!r}")
            found.append({**parameter, "_base": origin})
        return found

    def _parameter_schema(self, parameter: Mapping[str, Any], where: str) -> Any:
        if "schema" in parameter:
            return self._schema(parameter["schema"], parameter["_base"], f"{where}.schema")
        content = parameter.get("content")
        if isinstance(content, Mapping) and content:
            media = next(iter(content.values()))
            if isinstance(media, Mapping) and "schema" in media:
                return self._schema(media["schema"], parameter["_base"], f"{where}.content.schema")
        return {}

    def _body(self, body: Any, base: str, where: str) -> tuple[str, Any, bool]:
        base, body = self._follow(body, base, where)
        content = body.get("content") if isinstance(body, Mapping) else None
        if not isinstance(content, Mapping) or not content:
            raise self.fail(where, "a request body needs content (media types and their schemas)")
        media_type = next((t for t in content if JSON_TYPES.match(t)), None) or (FORM if FORM in content else None)
        media_type = media_type or next(iter(content))
        media = content[media_type]
        if not isinstance(media, Mapping):
            raise self.fail(f"{where}.content.{media_type}", "a media type must be an object")
        schema = self._schema(media.get("schema", {}), base, f"{where}.content.{media_type}.schema")
        if not (JSON_TYPES.match(media_type) or media_type == FORM):
            schema = {"type": "string", "description": f"The {media_type} body, as text."}
        return str(media_type), schema, bool(body.get("required"))

    def _follow(self, value: Any, base: str, where: str) -> tuple[str, Any]:
        """A value that may be a ``$ref`` (to a ``$ref``...), followed to what it points at."""
        seen = set()
        while isinstance(value, Mapping) and "$ref" in value:
            base, pointer, value = self.documents.resolve(value["$ref"], base, where)
            if (base, pointer) in seen:
                raise self.fail(where, f"$ref {pointer!r} refers to itself")
            seen.add((base, pointer))
        return base, value

    # Schemas --------------------------------------------------------------------------------
    def _schema(self, schema: Any, base: str, where: str) -> Any:
        """``schema`` as JSON Schema 2020-12, its ``$ref`` s into ``#/$defs/...`` (bundled in :attr:`defs`)."""
        if isinstance(schema, bool):
            return schema
        if not isinstance(schema, Mapping):
            raise self.fail(where, f"a schema must be an object, not {type(schema).__name__}")
        converted: dict[str, Any] = {}
        for key, value in schema.items():
            if key == "$ref":
                converted[key] = f"#/$defs/{self._bundle(value, base, where)}"  # names hold no '/' nor '~'
            elif key in SUBSCHEMA_MAPS and isinstance(value, Mapping):
                converted[key] = {
                    name: self._schema(sub, base, f"{where}.{key}.{name}")
                    for name, sub in value.items()
                    if not (key == "properties" and isinstance(sub, Mapping) and sub.get("readOnly") is True)
                }
            elif key in SUBSCHEMA_LISTS and isinstance(value, list):
                converted[key] = [self._schema(sub, base, f"{where}.{key}.{i}") for i, sub in enumerate(value)]
            elif key in SUBSCHEMAS and isinstance(value, Mapping | bool):
                converted[key] = self._schema(value, base, f"{where}.{key}")
            elif key not in OPENAPI_ONLY:
                converted[key] = value
        if "properties" in converted and isinstance(converted.get("required"), list):
            read_only = set(schema.get("properties") or {}) - set(converted["properties"])
            converted["required"] = [name for name in converted["required"] if name not in read_only]
        return self._from_30(schema, converted) if self.openapi_30 else converted

    def _from_30(self, original: Mapping[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
        """OpenAPI 3.0's ``nullable`` and boolean exclusive bounds, in JSON Schema's words."""
        for flag, bound in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
            if isinstance(schema.get(flag), bool) and schema.pop(flag) and bound in schema:
                schema[flag] = schema.pop(bound)
        if original.get("nullable") is not True:
            return schema
        if isinstance(schema.get("type"), str):
            schema["type"] = [schema["type"], "null"]
            if isinstance(schema.get("enum"), list) and None not in schema["enum"]:
                schema["enum"] = [*schema["enum"], None]
            return schema
        return {"anyOf": [schema, {"type": "null"}]}

    def _bundle(self, ref: Any, base: str, where: str) -> str:
        """The ``$defs`` name of the schema ``ref`` points at, converting it the first time it is met."""
        document, pointer, target = self.documents.resolve(ref, base, where)
        key = (document, pointer)
        if key not in self.def_names:
            last = unquote(pointer.rsplit("/", 1)[-1]) or Path(urlsplit(document).path).stem or "Root"
            stem = re.sub(r"[^\w.-]", "_", last)
            name, number = stem, 1
            while name in self.defs:
                number += 1
                name = f"{stem}{number}"
            self.def_names[key] = name
            self.defs[name] = {}  # taken before converting: a recursive schema refers to itself by this name
            self.defs[name] = self._schema(target, document, f"{where}.$ref({ref})")
        return self.def_names[key]

    def _reached(self, schema: Any) -> dict[str, Any]:
        """The bundled schemas ``schema`` refers to, directly or through others."""
        reached: dict[str, Any] = {}
        pending = [schema]
        while pending:
            for ref in _refs(pending.pop()):
                name = ref.removeprefix("#/$defs/")
                if name not in reached:
                    reached[name] = self.defs[name]
                    pending.append(self.defs[name])
        return dict(sorted(reached.items()))


def _substituted(url: str, variables: Mapping[str, Any]) -> str:
    """A server URL with its ``{variables}`` at their defaults."""

    def default(match: re.Match[str]) -> str:
        variable = variables.get(match.group(1))
        return str(variable.get("default", match.group(0))) if isinstance(variable, Mapping) else match.group(0)

    return re.sub(r"\{([^}]+)\}", default, url)


def _refs(value: Any) -> Iterator[str]:
    if isinstance(value, Mapping):
        for key, inner in value.items():
            if key == "$ref" and isinstance(inner, str):
                yield inner
            else:
                yield from _refs(inner)
    elif isinstance(value, list):
        for inner in value:
            yield from _refs(inner)


def _name(operation_id: Any, method: str, path: str) -> str:
    """``operationId``, else ``get_pets_petId`` from the method and path."""
    if isinstance(operation_id, str) and operation_id:
        return operation_id
    return re.sub(r"_+", "_", re.sub(r"[^A-Za-z0-9]", "_", f"{method}_{path}")).strip("_")


def _description(operation: Mapping[str, Any], method: str, path: str) -> str:
    """Summary and description, then the method and path (the model sees which endpoint it calls)."""
    parts = [str(operation[key]).strip() for key in ("summary", "description") if operation.get(key)]
    return "\n\n".join([*dict.fromkeys(parts), f"{method.upper()} {path}"])
