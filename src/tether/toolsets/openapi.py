"""An OpenAPI service's operations as tether tools, called over HTTP with httpx.

One tool per operation (see :mod:`tether.toolsets.openapi_spec` for names and input
schemas). GET, HEAD, OPTIONS and TRACE read: they run without approval and are idempotent;
POST, PUT, PATCH and DELETE change things: each call asks a person first (a policy rule
can allow them, ``approval=`` sets every tool), and DELETE is tagged ``destructive``. All
are tagged ``openapi`` and ``network``.

A call sends the arguments where the spec puts them (path, query, header, cookie, body as
JSON or a form) to the base URL (``base_url=``, else the spec's first server), with headers
from named environment variables. A 2xx answer is the result (JSON as JSON, text as text);
any other status raises :class:`HTTPStatusError`, classed by its status like every HTTP
error (401/403 permission, 409 conflict, 408/429/5xx retryable, other 4xx user_fixable). A
request that went out and got no answer (a dropped connection, a read timeout) of a method
that changes things may have taken effect: :class:`~tether.tools.OutcomeUnknown`, a call in
doubt.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote, urljoin, urlsplit
from urllib.request import url2pathname

from tether.extras import needs

with needs("openapi", "an OpenAPI toolset (tether.toolsets.openapi)"):
    import httpx

    from tether.tools.schema import schema_tool

from tether.errors import ConfigError, ToolDefinitionError, ToolsetError
from tether.tools import OutcomeUnknown, Tool
from tether.toolsets import asking, credentials, describe, included, local_name, recorded
from tether.toolsets._loop import BackgroundLoop
from tether.toolsets.openapi_spec import BODY, FORM, JSON_TYPES, Operation, Parameter, read

DEFAULT_TIMEOUT = 30.0
"""Seconds a request (or fetching the spec) may take."""
READING = frozenset({"GET", "HEAD", "OPTIONS", "TRACE"})
"""Methods that only read: no approval, safe to repeat."""
ERROR_BODY = 2000
"""Characters of an error response's body quoted in the error."""
OPTIONS = ("spec", "base_url", "headers", "bearer", "prefix", "timeout", "approval", "include")
"""What a record keeps (and :meth:`OpenAPIToolset.from_record` passes back)."""


class HTTPStatusError(Exception):
    """The service answered with an error status; ``status_code`` decides its class (see execution.faults)."""

    def __init__(self, message: str, *, status_code: int) -> None:
        super().__init__(message)
        self.status_code = status_code


class OpenAPIToolset:
    """The operations of one OpenAPI spec: ``OpenAPIToolset("api.yaml", base_url="https://...")``.

    Args:
        spec: the spec's path or URL (JSON or YAML, OpenAPI 3.0 or 3.1).
        base_url: where requests go (default: the spec's first server, resolved against its URL).
        headers: HTTP header names to the environment variables holding their values.
        bearer: the environment variable holding a bearer token (``Authorization: Bearer ...``).
        prefix: put before each tool's name.
        timeout: seconds a request may take.
        approval: True asks a person before every call, False before none; None (the default)
            asks before the methods that change things.
        include: only the operations whose names match these globs (default: all).
    """

    def __init__(
        self,
        spec: str,
        *,
        base_url: str | None = None,
        headers: Mapping[str, str] | None = None,
        bearer: str | None = None,
        prefix: str = "",
        timeout: float = DEFAULT_TIMEOUT,
        approval: bool | None = None,
        include: Sequence[str] | None = None,
    ) -> None:
        self.spec = spec if urlsplit(spec).scheme in ("http", "https") else str(Path(spec).resolve())
        self.source = describe({"kind": "openapi", "spec": self.spec})
        if self.spec.startswith("http"):
            credentials.check_url(self.spec, self.source)
        self.base_url = credentials.check_url(base_url, self.source) if base_url is not None else None
        self.headers = dict(headers or {})
        self.bearer = bearer
        credentials.check_names([*self.headers.values(), *([bearer] if bearer else [])], self.source)
        self.prefix = prefix
        if not timeout > 0:
            raise ConfigError(f"{self.source}: timeout must be positive seconds")
        self.timeout = float(timeout)
        self.approval = approval
        self.include = list(include) if include is not None else None
        self._lock = threading.Lock()
        self._tools: list[Tool] | None = None
        self._loop: BackgroundLoop | None = None
        self._client: httpx.AsyncClient | None = None
        self._sent_headers: dict[str, str] = {}

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> OpenAPIToolset:
        """The toolset a run recorded (see :meth:`record`)."""
        options = {key: record[key] for key in OPTIONS if record.get(key) is not None}
        return cls(options.pop("spec"), **options)

    def options(self) -> dict[str, Any]:
        """How to reach the service again: what :meth:`record` keeps besides the tools."""
        return {
            "spec": self.spec,
            "base_url": self.base_url,
            **({"headers": self.headers} if self.headers else {}),
            **({"bearer": self.bearer} if self.bearer else {}),
            "prefix": self.prefix,
            "timeout": self.timeout,
            "approval": self.approval,
            **({"include": self.include} if self.include is not None else {}),
        }

    def tools(self) -> list[Tool]:
        """One tool per operation, the spec read once.

        Raises:
            ToolsetError: the spec cannot be read, is invalid (naming the place), gives no
                base URL, or names an operation tether cannot offer.
        """
        with self._lock:
            if self._tools is None:
                self._sent_headers = credentials.headers(self.headers, self.bearer, self.source)  # unset: fail now
                spec = read(self.spec, self._fetch, source=self.source)
                base = self.base_url or (spec.servers[0] if spec.servers else None)
                if base is None or urlsplit(base).scheme not in ("http", "https"):
                    raise ToolsetError(
                        "no base URL: the spec names no http(s) server; give one (base_url=, --base-url)",
                        toolset=self.source,
                    )
                wanted = [op for op in spec.operations if included(op.name, self.include)]
                self._tools = [self._tool(operation, base) for operation in wanted]
            return list(self._tools)

    def record(self) -> dict[str, Any]:
        """JSON for a run's spec (see :mod:`tether.toolsets`)."""
        return recorded("openapi", self.options(), self.tools())

    def close(self) -> None:
        """Close the HTTP connections and the loop's thread."""
        with self._lock:
            loop, client = self._loop, self._client
            self._loop = self._client = None
        if loop is not None:
            if client is not None:
                loop.run(client.aclose())
            loop.close()

    def __enter__(self) -> OpenAPIToolset:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _fetch(self, uri: str) -> str:
        if uri.startswith("file:"):
            return Path(url2pathname(urlsplit(uri).path)).read_text(encoding="utf-8")
        try:
            response = httpx.get(uri, timeout=self.timeout, follow_redirects=True)
        except httpx.HTTPError as error:
            raise ToolsetError(f"cannot fetch {uri}: {type(error).__name__}: {error}", toolset=self.source) from error
        if response.status_code >= 400:
            raise ToolsetError(
                f"cannot fetch {uri}: HTTP {response.status_code} {response.reason_phrase}", toolset=self.source
            )
        return response.text

    def _tool(self, operation: Operation, base: str) -> Tool:
        reading = operation.method in READING
        tags = {"openapi", "network", "read_only" if reading else "mutates"}
        tags |= {"destructive"} if operation.method == "DELETE" else set()

        async def call(arguments: dict[str, Any]) -> Any:
            return await self._background().arun(self._send(operation, base, arguments))

        try:
            return schema_tool(
                call,
                operation.input_schema,
                name=local_name(operation.name, self.prefix, self.source),
                description=operation.description,
                approval=asking(self._why(operation)),
                idempotent=reading,
                tags=tags,
                source=self.source,
            )
        except ToolDefinitionError as error:
            raise ToolsetError(str(error), toolset=self.source, path=f"paths.{operation.path}") from error

    def _why(self, operation: Operation) -> str | None:
        """Why a call is asked about, or None when it is not."""
        if self.approval is not None:
            return f"every call to {self.source} is asked about (approval=True)" if self.approval else None
        if operation.method in READING:
            return None
        return f"{operation.method} {operation.path} changes things on the service ({self.source})"

    def _background(self) -> BackgroundLoop:
        with self._lock:
            if self._loop is None:
                self._loop = BackgroundLoop(name=f"tether-openapi {self.source}")
            return self._loop

    async def _send(self, operation: Operation, base: str, arguments: dict[str, Any]) -> Any:
        """Make the request (in the toolset's loop) and turn the answer into a result or an error."""
        if self._client is None:
            self._client = httpx.AsyncClient(headers=self._sent_headers, timeout=self.timeout)
        request = _request(operation, base, arguments)
        try:
            response = await self._client.send(self._client.build_request(**request))
        except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout):
            raise  # nothing was sent: transient, safe to try again
        except httpx.TransportError as error:
            if operation.method in READING:
                raise
            raise OutcomeUnknown(
                f"{operation.method} {request['url']} got no answer ({type(error).__name__}: {error}); "
                "it may have taken effect"
            ) from error
        return _answer(operation, response)


def _request(operation: Operation, base: str, arguments: Mapping[str, Any]) -> dict[str, Any]:
    """``build_request`` arguments: each argument where the spec puts it."""
    path = operation.path
    query: list[tuple[str, str]] = []
    headers: dict[str, str] = {}
    cookies: dict[str, str] = {}
    for parameter in operation.parameters:
        if parameter.key not in arguments or arguments[parameter.key] is None:
            continue
        value = arguments[parameter.key]
        if parameter.location == "path":
            path = path.replace(f"{{{parameter.name}}}", quote(_joined(value), safe=""))
        elif parameter.location == "query":
            query.extend(_query(parameter, value))
        elif parameter.location == "header":
            headers[parameter.name] = _joined(value)
        else:
            cookies[parameter.name] = _joined(value)
    if cookies:
        headers["Cookie"] = "; ".join(f"{name}={quote(value, safe='')}" for name, value in cookies.items())
    request: dict[str, Any] = {
        "method": operation.method,
        "url": urljoin(base.rstrip("/") + "/", path.lstrip("/")),
        "params": query,
        "headers": headers,
    }
    if operation.body_type is not None and BODY in arguments:
        body = arguments[BODY]
        if JSON_TYPES.match(operation.body_type):
            request["json"] = body
        elif operation.body_type == FORM and isinstance(body, Mapping):
            request["data"] = {key: _joined(value) for key, value in body.items()}
        else:
            request["content"] = body if isinstance(body, str) else str(body)
            headers["Content-Type"] = operation.body_type
    return request


def _text(value: Any) -> str:
    """One value as a URL, header or form has it: JSON's true/false, numbers and strings as written."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _joined(value: Any) -> str:
    """A value in the ``simple`` style: a list's items (an object's keys and values) joined by commas."""
    if isinstance(value, list):
        return ",".join(map(_text, value))
    if isinstance(value, Mapping):
        return ",".join(f"{key},{_text(item)}" for key, item in value.items())
    return _text(value)


def _query(parameter: Parameter, value: Any) -> list[tuple[str, str]]:
    """A query parameter's pairs, per its style: ``form`` (exploded or not) or ``deepObject``."""
    if isinstance(value, Mapping):
        if parameter.style == "deepObject":
            return [(f"{parameter.name}[{key}]", _text(item)) for key, item in value.items()]
        if parameter.explode:
            return [(str(key), _text(item)) for key, item in value.items()]
    elif isinstance(value, list) and parameter.explode:
        return [(parameter.name, _text(item)) for item in value]
    delimiter = {"spaceDelimited": " ", "pipeDelimited": "|"}.get(parameter.style)
    if delimiter is not None and isinstance(value, list):
        return [(parameter.name, delimiter.join(map(_text, value)))]
    return [(parameter.name, _joined(value))]


def _answer(operation: Operation, response: httpx.Response) -> Any:
    """A 2xx response's body as the result (JSON parsed, text as is); an error status raised."""
    where = f"{operation.method} {response.request.url}"
    if response.status_code >= 400:
        body = response.text.strip()
        about = f": {body[:ERROR_BODY]}" if body else ""
        raise HTTPStatusError(
            f"HTTP {response.status_code} {response.reason_phrase} from {where}{about}",
            status_code=response.status_code,
        )
    if not response.content:
        return f"HTTP {response.status_code} {response.reason_phrase}"
    kind = response.headers.get("content-type", "").split(";")[0].strip()
    if JSON_TYPES.match(kind):
        try:
            return response.json()
        except ValueError:
            return response.text
    if kind.startswith("text/") or not kind or kind in ("application/xml", "application/yaml"):
        return response.text
    return f"[{kind}, {len(response.content)} bytes]"
