"""Tools: plain Python functions the host runs on the model's behalf.

``@tool`` reads the function's type hints once, at decoration time, into a pydantic input
model; each call validates the model's arguments against it before anything runs. A tool
described by a raw JSON schema instead (an MCP server's, an OpenAPI operation's) is made by
:func:`tether.tools.schema.schema_tool`. The model never executes anything: the engine calls
:meth:`Tool.execute` itself. Attempts run under their timeouts in :mod:`tether.execution`.
"""

from __future__ import annotations

import asyncio
import copy
import inspect
import json
import re
import threading
import weakref
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, TypedDict, Unpack, overload

import pydantic

from tether.errors import ToolDefinitionError
from tether.execution import attempts
from tether.execution.attempts import OutcomeUnknown as OutcomeUnknown
from tether.execution.attempts import ToolExit as ToolExit
from tether.execution.attempts import ToolTimeout as ToolTimeout
from tether.policy.policies import NO_RETRY, ApprovalSetting, RetryPolicy
from tether.policy.policies import RetryLater as RetryLater

TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
CALL_ID_PARAMETER = "tool_use_id"
"""A tool parameter with this name receives the call's id (an idempotency key)."""
OnInterrupted = Literal["ask", "error"]
"""What happens to a non-idempotent call a crash left in doubt (it started, never finished):
ask a person whether to run it again, or tell the model it was interrupted and not re-run."""
INTERRUPTED_POLICIES: tuple[OnInterrupted, ...] = ("ask", "error")


class ModelRetry(Exception):
    """Raised by a tool to tell the model what to change; the host does not retry it.

    The message reaches the model verbatim in an ``is_error`` result, e.g.
    ``raise ModelRetry("no customer with that email; ask the user for their id")``.
    """


class UnserializableResult(TypeError):
    """The tool returned something that is neither text, JSON-able, nor a pydantic model."""


class SchemaInput(pydantic.RootModel[dict[str, Any]]):
    """The arguments of a tool described by a raw JSON schema, as one dict.

    Each such tool has a subclass (see :func:`tether.tools.schema.schema_tool`) holding its
    schema and the check of its arguments against it; the function receives the dict as
    ``arguments``.
    """

    raw_schema: ClassVar[dict[str, Any]] = {"type": "object"}
    """The schema as given: what the model sees and arguments are checked against."""

    @classmethod
    def check(cls, arguments: Any) -> None:
        """Raise :class:`pydantic.ValidationError` naming each place the schema refuses ``arguments``."""


_SCHEMAS: weakref.WeakKeyDictionary[type[pydantic.BaseModel], dict[str, Any]] = weakref.WeakKeyDictionary()
"""Input schemas by input model, computed once (see :meth:`Tool.input_schema`)."""


@dataclass(frozen=True)
class Tool:
    """A function the model may ask for, with its schema and policies."""

    name: str
    """Unique name the model uses (``^[a-zA-Z0-9_-]{1,64}$``)."""
    description: str
    """What the model reads to decide when to call it (the docstring)."""
    function: Callable[..., Any]
    """The Python function itself, sync or async."""
    input_model: type[pydantic.BaseModel]
    """Validates the model's arguments; built from the type hints."""
    approval: ApprovalSetting = False
    """True: always ask a person; a callable decides per call."""
    retry: RetryPolicy = NO_RETRY
    """How a raising call is retried."""
    timeout: float | None = None
    """Seconds one attempt may take; None = no limit."""
    final: bool = False
    """Its validated input is the run's result and the run ends."""
    idempotent: bool = False
    """Safe to run again after a crash left its outcome unknown: such a call is simply re-run."""
    on_interrupted: OnInterrupted | None = None
    """A non-idempotent call that a crash left in doubt: ``"ask"`` a person whether to run it
    again, or give the model an ``"error"`` result saying it was not; None = the agent's setting."""
    wants_call_id: bool = False
    """Whether the function takes ``tool_use_id``."""
    cancel_parameter: str | None = None
    """The parameter annotated ``threading.Event``, if any: it receives the attempt's cancel
    signal, set when the attempt times out (a long-running tool may check it and stop)."""
    tags: frozenset[str] = frozenset()
    """Free-form labels (``mutates``, ``network``...) that policy rules match on."""
    cache_ttl: float | None = None
    """Seconds a successful result is reused for the same input, across processes sharing
    the store (see :mod:`tether.core.cache`); None = never cached. Only for tools without side effects."""
    concurrent: bool | None = None
    """May run at the same time as the other concurrent calls of the same model turn (see
    :meth:`tether.Agent.runs_concurrently`); None = the agent's ``concurrent_tools`` setting."""
    source: str | None = None
    """Where the tool comes from when not from Python code (``MCP server 'files'``), named in errors."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call the underlying function directly (tools stay ordinary functions)."""
        return self.function(*args, **kwargs)

    @property
    def is_async(self) -> bool:
        """Whether the function is a coroutine function."""
        return inspect.iscoroutinefunction(self.function)

    def definition(self) -> dict[str, Any]:
        """The Messages API ``tools`` entry."""
        return {
            "name": self.name,
            "description": self.description,
            "input_schema": self.input_schema(),
        }

    def settings(self) -> dict[str, Any]:
        """The settings that shape a run's path, as JSON (a run records them: see ``tether diagram --run``)."""
        approval = "never" if self.approval is False else "always" if self.approval is True else "per call"
        return {
            "approval": approval,
            "max_attempts": self.retry.max_attempts,
            "final": self.final,
            "timeout": self.timeout,
        }

    @property
    def origin(self) -> str:
        """Where the tool comes from, in words: its :attr:`source`, else its Python function."""
        if self.source is not None:
            return self.source
        module, name = getattr(self.function, "__module__", None), getattr(self.function, "__qualname__", None)
        return f"function {module}.{name}" if module and name else f"{self.function!r}"

    def input_schema(self) -> dict[str, Any]:
        """JSON schema of the input, as the model sees it (a fresh copy each call)."""
        if issubclass(self.input_model, SchemaInput):
            return copy.deepcopy(self.input_model.raw_schema)
        schema = _SCHEMAS.get(self.input_model)
        if schema is None:  # pydantic rebuilds it on every call (~1 ms); runs ask per create and resume
            schema = self.input_model.model_json_schema()
            schema.pop("title", None)
            _SCHEMAS[self.input_model] = schema
        return copy.deepcopy(schema)

    def validate(self, arguments: Any) -> pydantic.BaseModel:
        """Validate the model's arguments; raises :class:`pydantic.ValidationError`."""
        if issubclass(self.input_model, SchemaInput):
            self.input_model.check(arguments)
        return self.input_model.model_validate(arguments)

    def _kwargs(self, validated: pydantic.BaseModel, call_id: str, cancel: threading.Event) -> dict[str, Any]:
        if isinstance(validated, SchemaInput):
            kwargs: dict[str, Any] = {"arguments": validated.root}
        else:
            kwargs = {name: getattr(validated, name) for name in type(validated).model_fields}
        if self.wants_call_id:
            kwargs[CALL_ID_PARAMETER] = call_id
        if self.cancel_parameter is not None:
            kwargs[self.cancel_parameter] = cancel
        return kwargs

    def execute(self, validated: pydantic.BaseModel, call_id: str, *, run_id: str | None = None) -> str:
        """Run one attempt synchronously and serialise the result.

        Raises whatever the tool raises, :class:`ToolTimeout` past the timeout, or
        :class:`UnserializableResult`. With ``run_id``, an attempt of a call whose earlier
        attempt is still running waits for it instead of overlapping (see :mod:`tether.execution.attempts`).
        """
        cancel = threading.Event()
        kwargs = self._kwargs(validated, call_id, cancel)
        if self.is_async:
            value = asyncio.run(attempts.run_async(self.function(**kwargs), self.timeout, cancel=cancel))
        else:
            key = None if run_id is None else (run_id, call_id)
            value = attempts.run_sync(self.function, kwargs, self.timeout, cancel=cancel, key=key)
        return serialize_result(value)

    async def aexecute(self, validated: pydantic.BaseModel, call_id: str, *, run_id: str | None = None) -> str:
        """Run one attempt inside an event loop (sync tools in a thread) and serialise the result."""
        cancel = threading.Event()
        kwargs = self._kwargs(validated, call_id, cancel)
        if self.is_async:
            value = await attempts.run_async(self.function(**kwargs), self.timeout, cancel=cancel)
        else:
            key = None if run_id is None else (run_id, call_id)
            value = await attempts.run_sync_in_loop(self.function, kwargs, self.timeout, cancel=cancel, key=key)
        return serialize_result(value)


def plain_errors(error: pydantic.ValidationError) -> str:
    """What :meth:`Tool.validate` refused, in plain words: ``recursive: Input should be a valid boolean``."""
    return "; ".join(
        f"{'.'.join(map(str, problem['loc'])) or 'input'}: {problem['msg']}"
        for problem in error.errors(include_url=False)
    )


def field_problems(error: pydantic.ValidationError) -> dict[str, str]:
    """:func:`plain_errors` by the top-level field each is about (``""``: the input as a whole)."""
    found: dict[str, list[str]] = {}
    for problem in error.errors(include_url=False):
        where = [str(part) for part in problem["loc"]]
        said = f"{'.'.join(where[1:])}: {problem['msg']}" if len(where) > 1 else str(problem["msg"])
        found.setdefault(where[0] if where else "", []).append(said)
    return {field: "; ".join(said) for field, said in found.items()}


def serialize_result(value: Any) -> str:
    """Text for the ``tool_result``: str as is, pydantic models and JSON-able values as JSON."""
    if isinstance(value, str):
        return value
    if isinstance(value, pydantic.BaseModel):
        return value.model_dump_json()
    try:
        return json.dumps(value, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError):
        raise UnserializableResult(
            f"the tool returned a {type(value).__name__}, which is not str, JSON-serialisable or a pydantic model"
        ) from None


def _input_model(function: Callable[..., Any], name: str) -> tuple[type[pydantic.BaseModel], bool, str | None]:
    signature = inspect.signature(function)
    try:
        hints = inspect.get_annotations(function, eval_str=True)
    except Exception as error:
        raise ToolDefinitionError(f"tool {name!r}: cannot read type hints: {error}", tool=name) from error
    fields: dict[str, Any] = {}
    wants_call_id = False
    cancel_parameter: str | None = None
    for parameter in signature.parameters.values():
        if parameter.name == CALL_ID_PARAMETER:
            wants_call_id = True
            continue
        if hints.get(parameter.name) is threading.Event:
            cancel_parameter = parameter.name  # the attempt's cancel signal, not a model argument
            continue
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            raise ToolDefinitionError(f"tool {name!r}: *args/**kwargs cannot be described", tool=name)
        if parameter.name not in hints:
            raise ToolDefinitionError(f"tool {name!r}: parameter {parameter.name!r} needs a type hint", tool=name)
        if parameter.name.startswith("model_"):
            raise ToolDefinitionError(
                f"tool {name!r}: parameter {parameter.name!r} clashes with pydantic's reserved 'model_' prefix; "
                "rename it",
                tool=name,
            )
        default = ... if parameter.default is parameter.empty else parameter.default
        fields[parameter.name] = (hints[parameter.name], default)
    try:
        model = pydantic.create_model(
            f"{name}_input",
            __config__=pydantic.ConfigDict(extra="forbid"),
            **fields,
        )
    except (TypeError, ValueError, pydantic.PydanticUserError) as error:
        raise ToolDefinitionError(f"tool {name!r}: cannot build an input schema: {error}", tool=name) from error
    return model, wants_call_id, cancel_parameter


def _description(function: Callable[..., Any]) -> str:
    doc = inspect.getdoc(function) or ""
    return doc.strip() or f"Call {function.__name__}."


class ToolOptions(TypedDict, total=False):
    """What ``@tool(...)`` and :func:`make_tool` accept; each is the :class:`Tool` field of that name."""

    name: str | None
    description: str | None
    approval: ApprovalSetting
    retry: RetryPolicy | None
    timeout: float | None
    final: bool
    idempotent: bool
    on_interrupted: OnInterrupted | None
    tags: Iterable[str]
    cache_ttl: float | None
    concurrent: bool | None
    source: str | None


def make_tool(function: Callable[..., Any], **options: Unpack[ToolOptions]) -> Tool:
    """Build a :class:`Tool` from a function (what ``@tool`` does)."""
    tool_name = checked_name(options, function.__name__)
    model, wants_call_id, cancel_parameter = _input_model(function, tool_name)
    return built_tool(
        function,
        options,
        name=tool_name,
        input_model=model,
        wants_call_id=wants_call_id,
        cancel_parameter=cancel_parameter,
        description=options.get("description") or _description(function),
    )


def checked_name(options: ToolOptions, default: str) -> str:
    """The tool's name, once the options are known to be real ones (a misspelt one is an error)."""
    unknown = sorted(set(options) - set(ToolOptions.__annotations__))
    if unknown:  # a misspelt option (``aproval=True``) must never silently drop a gate
        known = ", ".join(ToolOptions.__annotations__)
        raise ToolDefinitionError(f"@tool got unknown option(s) {', '.join(unknown)}; known: {known}")
    tool_name = options.get("name") or default
    if not TOOL_NAME.match(tool_name):
        raise ToolDefinitionError(f"tool name {tool_name!r} must match {TOOL_NAME.pattern}", tool=tool_name)
    return tool_name


def built_tool(
    function: Callable[..., Any],
    options: ToolOptions,
    *,
    name: str,
    input_model: type[pydantic.BaseModel],
    wants_call_id: bool,
    cancel_parameter: str | None,
    description: str,
) -> Tool:
    """A :class:`Tool` of ``function`` with its input model and its options, each checked."""
    tool_name = name
    timeout, cache_ttl = options.get("timeout"), options.get("cache_ttl")
    on_interrupted = options.get("on_interrupted")
    if timeout is not None and timeout <= 0:
        raise ToolDefinitionError(f"tool {tool_name!r}: timeout must be positive", tool=tool_name)
    if cache_ttl is not None and not cache_ttl > 0:
        raise ToolDefinitionError(f"tool {tool_name!r}: cache_ttl must be positive seconds", tool=tool_name)
    if on_interrupted not in (None, *INTERRUPTED_POLICIES):
        raise ToolDefinitionError(
            f"tool {tool_name!r}: on_interrupted must be 'ask' or 'error' (idempotent=True re-runs)", tool=tool_name
        )
    concurrent = options.get("concurrent")
    if concurrent not in (None, True, False):  # a truthy string must not silently turn concurrency on
        raise ToolDefinitionError(f"tool {tool_name!r}: concurrent must be True, False or None", tool=tool_name)
    tags = options.get("tags", ())
    labels = frozenset([tags] if isinstance(tags, str) else tags)  # one string is one tag, not its letters
    if not all(isinstance(tag, str) and tag for tag in labels):
        raise ToolDefinitionError(f"tool {tool_name!r}: tags must be non-empty strings", tool=tool_name)
    return Tool(
        name=tool_name,
        description=description,
        function=function,
        input_model=input_model,
        approval=options.get("approval", False),
        retry=options.get("retry") or NO_RETRY,
        timeout=timeout,
        final=options.get("final", False),
        idempotent=options.get("idempotent", False),
        on_interrupted=on_interrupted,
        wants_call_id=wants_call_id,
        cancel_parameter=cancel_parameter,
        tags=labels,
        cache_ttl=cache_ttl,
        concurrent=concurrent,
        source=options.get("source"),
    )


@overload
def tool(function: Callable[..., Any], /) -> Tool: ...


@overload
def tool(**options: Unpack[ToolOptions]) -> Callable[[Callable[..., Any]], Tool]: ...


def tool(
    function: Callable[..., Any] | None = None, /, **options: Unpack[ToolOptions]
) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """Turn a function into a tool: ``@tool`` or ``@tool(approval=True, ...)`` (see :class:`ToolOptions`).

    The input schema comes from the type hints, the description from the docstring. A
    parameter named ``tool_use_id`` receives the call's id, for idempotency keys; one
    annotated ``threading.Event`` receives the attempt's cancel signal, set at its
    ``timeout`` (seconds one attempt may take).
    """
    if function is not None:
        return make_tool(function, **options)
    return lambda fn: make_tool(fn, **options)


def tools_by_name(tools: Sequence[Tool]) -> dict[str, Tool]:
    """Index tools by name, refusing duplicates."""
    index: dict[str, Tool] = {}
    for item in tools:
        if not isinstance(item, Tool):
            raise ToolDefinitionError(f"{item!r} is not a tool; decorate it with @tool")
        if item.name in index:
            first = index[item.name]
            raise ToolDefinitionError(
                f"two tools are named {item.name!r}: one from {first.origin}, one from {item.origin}", tool=item.name
            )
        index[item.name] = item
    return index
