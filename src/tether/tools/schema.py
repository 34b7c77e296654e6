"""Tools described by a raw JSON schema instead of type hints.

An MCP server or an OpenAPI operation states its input as a JSON schema; turning that into
pydantic types would lose keywords and change what the model sees. So the tool keeps the
schema as given (its definition shows it verbatim) and checks each call's arguments
against it with ``jsonschema``, reporting every place it refuses as a
:class:`pydantic.ValidationError`, the error every other tool raises: the engine, approvals
with edited input, policy rules and the cache treat such a tool like any other.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Unpack

import pydantic
from pydantic_core import InitErrorDetails, PydanticCustomError

from tether.errors import ToolDefinitionError
from tether.extras import needs
from tether.tools import CALL_ID_PARAMETER, SchemaInput, Tool, ToolOptions, built_tool, checked_name

with needs("mcp", "a tool from a JSON schema (tether.tools.schema)"):  # the openapi extra brings it too
    import jsonschema
    from jsonschema.protocols import Validator

DEFAULT_DIALECT = jsonschema.Draft202012Validator
"""For a schema that names no ``$schema``: the dialect MCP and OpenAPI 3.1 use."""


def schema_tool(function: Callable[..., Any], schema: Mapping[str, Any], **options: Unpack[ToolOptions]) -> Tool:
    """A :class:`Tool` whose input is ``schema``; ``function(arguments)`` gets the checked arguments as a dict.

    ``function`` may be sync or async, and may take ``tool_use_id`` (the call's id) as well.
    ``options`` are those of ``@tool``; ``name`` is needed unless the function's own name will do.

    Raises:
        ToolDefinitionError: the schema is not a valid JSON schema, or its root is not an
            object (the Messages API takes objects only), or an option is invalid.
    """
    name = checked_name(options, getattr(function, "__name__", ""))
    raw = dict(schema)
    if raw.get("type") != "object":
        raise ToolDefinitionError(f"tool {name!r}: the input schema's root must be of type 'object'", tool=name)
    dialect = jsonschema.validators.validator_for(raw, default=DEFAULT_DIALECT)
    try:
        dialect.check_schema(raw)
    except jsonschema.SchemaError as error:
        where = ".".join(map(str, error.absolute_path)) or "its root"
        raise ToolDefinitionError(
            f"tool {name!r}: invalid input schema at {where}: {error.message}", tool=name
        ) from error
    model = _input_model(name, raw, dialect(raw))
    parameters = inspect.signature(function).parameters
    return built_tool(
        function,
        options,
        name=name,
        input_model=model,
        wants_call_id=CALL_ID_PARAMETER in parameters,
        cancel_parameter=None,
        description=options.get("description") or f"Call {name}.",
    )


def _input_model(name: str, schema: dict[str, Any], validator: Validator) -> type[SchemaInput]:
    """A :class:`SchemaInput` subclass for one tool, holding its schema and validator."""

    class Arguments(SchemaInput):
        raw_schema: ClassVar[dict[str, Any]] = schema

        @classmethod
        def check(cls, arguments: Any) -> None:
            problems = sorted(validator.iter_errors(arguments), key=_place)
            if problems:
                raise pydantic.ValidationError.from_exception_data(
                    f"{name}_input", [_line_error(problem) for problem in problems]
                )

    Arguments.__name__ = Arguments.__qualname__ = f"{name}_input"
    return Arguments


def _place(error: jsonschema.ValidationError) -> tuple[int, str]:
    """Problems in the order a person reads them: the object's own first, then field by field."""
    path = list(error.absolute_path)
    return len(path), ".".join(map(str, path))


def _line_error(error: jsonschema.ValidationError) -> InitErrorDetails:
    message = PydanticCustomError("json_schema", "{message}", {"message": error.message})
    return InitErrorDetails(type=message, loc=tuple(error.absolute_path), input=error.instance)
