"""An MCP server's tools as tether tools; the only module that imports the ``mcp`` SDK.

A server is a command (run as a subprocess, spoken to over stdio) or a URL (streamable
HTTP, headers from named environment variables). The session lives on the toolset's own
event loop thread (:class:`~tether.toolsets._loop.BackgroundLoop`): the sync ``Runner``
waits on it, the ``AsyncRunner`` awaits it. It opens when the tools are first listed and
opens again after it broke (a stdio server is started anew).

Each listed tool becomes a :func:`~tether.tools.schema.schema_tool` with the server's own
input schema. Its annotations set defaults a policy rule can override: ``destructiveHint``
(true unless the tool says otherwise, as the MCP spec has it) requires approval,
``readOnlyHint`` needs none and makes the tool idempotent (as ``idempotentHint`` does),
``openWorldHint`` (true by default) tags it ``network``; every tool is tagged ``mcp`` and
``read_only`` or ``mutates`` (and ``destructive``). The result is the text and the structured
content (JSON), each once; images, audio and resources are described in words. An ``isError``
result reaches the model as an ``is_error`` result (:class:`MCPToolError`). A call the server
never answers, within ``timeout`` or because it died, may have taken effect:
:class:`~tether.tools.OutcomeUnknown`, so the engine treats it as in doubt.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import os
import shlex
import tempfile
import threading
from collections.abc import Mapping, Sequence
from contextlib import AsyncExitStack, suppress
from typing import Any, TextIO, cast

import httpx2

from tether.extras import needs

with needs("mcp", "an MCP toolset (tether.toolsets.mcp)"):
    from mcp import Client, MCPError, StdioServerParameters
    from mcp.client.stdio import stdio_client
    from mcp.client.streamable_http import streamable_http_client
    from mcp.types import CONNECTION_CLOSED, INVALID_PARAMS, CallToolResult, ContentBlock, ToolAnnotations
    from mcp.types import Tool as ListedTool

    from tether.tools.schema import schema_tool

from tether.errors import ConfigError, ToolDefinitionError, ToolsetError
from tether.tools import ModelRetry, OutcomeUnknown, Tool
from tether.toolsets import asking, credentials, describe, included, local_name, recorded
from tether.toolsets._loop import BackgroundLoop

DEFAULT_TIMEOUT = 60.0
"""Seconds a call may wait for the server's answer before its outcome counts as unknown."""
CONNECT_TIMEOUT = 30.0
"""Seconds to start (or reach) a server and list its tools."""
MAX_PAGES = 100
"""Pages of a tool listing read at most: a server that pages forever cannot hang a run."""
STDERR_TAIL = 2000
"""Characters of a stdio server's stderr quoted when it could not be started."""
OPTIONS = (
    "command",
    "url",
    "cwd",
    "env",
    "headers",
    "bearer",
    "prefix",
    "timeout",
    "connect_timeout",
    "approval",
    "include",
)
"""What a record keeps (and :meth:`MCPToolset.from_record` passes back)."""


class MCPToolError(ModelRetry):
    """The server ran the tool and the tool reported an error (``isError``): the model reads its text."""


class MCPCallError(Exception):
    """The server refused the call with a protocol error (not the tool's own error)."""

    def __init__(self, message: str, *, code: int) -> None:
        super().__init__(message)
        self.code = code
        """The JSON-RPC error code."""


class MCPToolset:
    """The tools of one MCP server: ``MCPToolset(command="python server.py")`` or ``MCPToolset(url=...)``.

    Args:
        command: the server's command line (a string is split as a shell would), run in ``cwd``.
        url: a streamable HTTP endpoint (``http://127.0.0.1:8000/mcp``).
        cwd: the command's directory (default: the current one, recorded as an absolute path).
        env: names of environment variables passed to a command (it gets only PATH, HOME and
            the like otherwise); their values are read at each start, never stored.
        headers: HTTP header names to the environment variables holding their values.
        bearer: the environment variable holding a bearer token (``Authorization: Bearer ...``).
        prefix: put before each tool's name (``gh_`` makes ``create_issue`` ``gh_create_issue``).
        timeout: seconds a call may wait for its answer.
        connect_timeout: seconds to start or reach the server and list its tools.
        approval: True asks a person before every call, False before none; None (the
            default) follows each tool's annotations.
        include: only the tools whose names (the server's) match these globs (default: all).
    """

    def __init__(
        self,
        *,
        command: str | Sequence[str] | None = None,
        url: str | None = None,
        cwd: str | None = None,
        env: Sequence[str] = (),
        headers: Mapping[str, str] | None = None,
        bearer: str | None = None,
        prefix: str = "",
        timeout: float = DEFAULT_TIMEOUT,
        connect_timeout: float = CONNECT_TIMEOUT,
        approval: bool | None = None,
        include: Sequence[str] | None = None,
    ) -> None:
        if (command is None) == (url is None):
            raise ConfigError("an MCP toolset needs the server's command or its URL (one of them)")
        self.command = shlex.split(command) if isinstance(command, str) else list(command or [])
        self.url = url
        self.cwd = os.path.abspath(cwd or os.getcwd()) if url is None else None
        self.source = describe({"kind": "mcp", "command": self.command, "url": url})
        if url is None and not self.command:
            raise ConfigError(f"{self.source}: the command is empty")
        if url is not None:
            credentials.check_url(url, self.source)
        elif headers or bearer:
            raise ConfigError(f"{self.source}: headers and bearer tokens are for servers reached by URL")
        self.env = credentials.check_names(env, self.source)
        self.headers = dict(headers or {})
        credentials.check_names([*self.headers.values(), *([bearer] if bearer else [])], self.source)
        self.bearer = bearer
        self.prefix = prefix
        if not (timeout > 0 and connect_timeout > 0):
            raise ConfigError(f"{self.source}: timeouts must be positive seconds")
        self.timeout = float(timeout)
        self.connect_timeout = float(connect_timeout)
        self.approval = approval
        self.include = list(include) if include is not None else None
        self._lock = threading.RLock()  # tools() holds it while connecting, and _connected() takes it too
        self._tools: list[Tool] | None = None
        self._loop: BackgroundLoop | None = None
        self._session: _Session | None = None

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> MCPToolset:
        """The toolset a run recorded (see :meth:`record`)."""
        return cls(**{key: record[key] for key in OPTIONS if record.get(key) is not None})

    def options(self) -> dict[str, Any]:
        """How to reach the server again: what :meth:`record` keeps besides the tools."""
        where = {"command": self.command, "cwd": self.cwd} if self.url is None else {"url": self.url}
        return {
            **where,
            **({"env": self.env} if self.env else {}),
            **({"headers": self.headers} if self.headers else {}),
            **({"bearer": self.bearer} if self.bearer else {}),
            "prefix": self.prefix,
            "timeout": self.timeout,
            "connect_timeout": self.connect_timeout,
            "approval": self.approval,
            **({"include": self.include} if self.include is not None else {}),
        }

    def tools(self) -> list[Tool]:
        """The server's tools, listed once (starting or reaching the server).

        Raises:
            ToolsetError: the server cannot be started or reached in time, refused us, or
                lists a tool tether cannot offer (a bad name or schema).
        """
        with self._lock:
            if self._tools is None:
                loop, session = self._connected()
                listed = loop.run(session.listing())
                self._tools = [self._tool(item) for item in listed if included(item.name, self.include)]
            return list(self._tools)

    def record(self) -> dict[str, Any]:
        """JSON for a run's spec (see :mod:`tether.toolsets`)."""
        return recorded("mcp", self.options(), self.tools())

    def close(self) -> None:
        """End the session (a stdio server's process too) and the loop's thread."""
        with self._lock:
            loop, session = self._loop, self._session
            self._loop = self._session = None
        if loop is not None and session is not None:
            loop.run(session.drop())
            loop.close()
            session.stderr_close()

    def __enter__(self) -> MCPToolset:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _connected(self) -> tuple[BackgroundLoop, _Session]:
        """The loop and session, made on first use (again after :meth:`close`)."""
        with self._lock:
            if self._loop is None or self._session is None:
                self._loop = BackgroundLoop(name=f"tether-mcp {self.source}")
                self._session = _Session(self)
            return self._loop, self._session

    def _tool(self, listed: ListedTool) -> Tool:
        hints = listed.annotations or ToolAnnotations()
        read_only = hints.read_only_hint is True
        destructive = not read_only and hints.destructive_hint is not False
        tags = {"mcp", "read_only" if read_only else "mutates"}
        tags |= {"destructive"} if destructive else set()
        tags |= {"network"} if hints.open_world_hint is not False else set()
        remote = listed.name

        async def call(arguments: dict[str, Any]) -> Any:
            loop, session = self._connected()
            return await loop.arun(session.call(remote, arguments))

        name = local_name(remote, self.prefix, self.source)
        if self.approval is not None:
            why = f"every call to {self.source} is asked about (approval=True)" if self.approval else None
        elif destructive:
            said = "says it" if hints.destructive_hint else "does not say it is read-only, so it"
            why = f"{self.source} {said} may change or delete things (MCP destructiveHint)"
        else:
            why = None
        try:
            return schema_tool(
                call,
                listed.input_schema,
                name=name,
                description=listed.description or f"The tool {remote!r} of {self.source}.",
                approval=asking(why),
                idempotent=read_only or hints.idempotent_hint is True,
                tags=tags,
                source=self.source,
            )
        except ToolDefinitionError as error:
            raise ToolsetError(str(error), toolset=self.source) from error


class _Session:
    """The live connection to the server, in the toolset's loop: opened on first use, again after it broke."""

    def __init__(self, toolset: MCPToolset) -> None:
        self.toolset = toolset
        self.client: Client | None = None
        self._stop: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._lock: asyncio.Lock | None = None
        self._stderr: TextIO | None = None
        self._refused: str | None = None
        """The last HTTP error status the server answered (the SDK's errors do not say it)."""

    async def listing(self) -> list[ListedTool]:
        """Every tool the server lists, page by page (connecting first)."""
        source, limit = self.toolset.source, self.toolset.connect_timeout
        try:
            async with asyncio.timeout(limit):
                client = await self.connected()
                listed: list[ListedTool] = []
                cursor: str | None = None
                for _ in range(MAX_PAGES):
                    page = await client.list_tools(cursor=cursor)
                    listed += page.tools
                    cursor = page.next_cursor
                    if cursor is None:
                        return listed
        except ToolsetError:  # a credential's variable is not set: said as it is
            await self.drop()
            raise
        except TimeoutError:
            await self.drop()
            raise ToolsetError(
                f"no tool list within {limit:g}s (the server hangs?){self._context()}", toolset=source
            ) from None
        except (Exception, ExceptionGroup) as error:
            await self.drop()
            raise ToolsetError(f"cannot list its tools: {_reason(error)}{self._context()}", toolset=source) from error
        raise ToolsetError(f"its tool list goes on past {MAX_PAGES} pages", toolset=source)

    async def call(self, remote: str, arguments: dict[str, Any]) -> Any:
        """Call the tool and turn its result into what the model reads (or the error it is)."""
        source, timeout = self.toolset.source, self.toolset.timeout
        try:
            async with asyncio.timeout(self.toolset.connect_timeout):
                client = await self.connected()
        except (Exception, ExceptionGroup) as error:  # nothing was sent: safe to try again
            await self.drop()
            raise ConnectionError(f"{source} cannot be reached: {_reason(error)}{self._context()}") from error
        try:
            async with asyncio.timeout(timeout):
                result = await client.call_tool(remote, arguments)
        except TimeoutError:
            raise OutcomeUnknown(
                f"{source} did not answer within {timeout:g}s; the call may still complete there"
            ) from None
        except MCPError as error:
            if error.code == INVALID_PARAMS:
                raise ModelRetry(f"{source} refused the arguments: {error.message}") from error
            if error.code != CONNECTION_CLOSED:
                raise MCPCallError(f"{source} refused the call: {error.message}", code=error.code) from error
            await self.drop()
            raise OutcomeUnknown(f"{source} closed the connection during the call ({error.message})") from error
        except (Exception, ExceptionGroup) as error:  # the transport broke mid-call
            await self.drop()
            raise OutcomeUnknown(f"{source} failed during the call: {_reason(error)}") from error
        return _result(result)

    async def connected(self) -> Client:
        """The open client, opening the connection if there is none."""
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self.client is not None and _closed(self.client):  # the server went away since the last call
                await self.drop()
            if self.client is None:
                ready: asyncio.Future[Client] = asyncio.get_running_loop().create_future()
                self._stop = asyncio.Event()
                self._task = asyncio.create_task(self._hold(ready, self._stop))
                try:
                    self.client = await ready
                except BaseException:
                    await self._end()
                    raise
            return self.client

    async def _hold(self, ready: asyncio.Future[Client], stop: asyncio.Event) -> None:
        """Open the connection and keep it until ``stop`` (the SDK's contexts close in the task that opened them)."""
        try:
            async with AsyncExitStack() as stack:
                client = await stack.enter_async_context(Client(await self._transport(stack), cache=None))
                ready.set_result(client)
                await stop.wait()
        except (Exception, ExceptionGroup) as error:  # noqa: BLE001 - handed to whoever waits for the connection
            if not ready.done():
                ready.set_exception(error)

    async def _transport(self, stack: AsyncExitStack) -> Any:
        toolset = self.toolset
        if toolset.url is None:
            if self._stderr is None:
                stderr = tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace")  # noqa: SIM115 - kept open
                self._stderr = cast(TextIO, stderr)  # for the server's life; closed by MCPToolset.close
            self._stderr.seek(0)
            self._stderr.truncate()
            command, *args = toolset.command
            server = StdioServerParameters(
                command=command, args=args, cwd=toolset.cwd, env=credentials.variables(toolset.env, toolset.source)
            )
            return stdio_client(server, errlog=self._stderr)
        headers = credentials.headers(toolset.headers, toolset.bearer, toolset.source)
        timeout = httpx2.Timeout(toolset.connect_timeout, read=max(toolset.timeout, toolset.connect_timeout))
        self._refused = None
        http = httpx2.AsyncClient(headers=headers, timeout=timeout, event_hooks={"response": [self._note_status]})
        await stack.enter_async_context(http)
        return streamable_http_client(toolset.url, http_client=http)

    async def _note_status(self, response: httpx2.Response) -> None:
        if response.status_code >= 400:
            self._refused = f"HTTP {response.status_code} {response.reason_phrase}"

    async def drop(self) -> None:
        """Close the connection, if one is open (the next call opens another)."""
        self.client = None
        await self._end()

    async def _end(self) -> None:
        """Stop the task holding the connection: asked to, else cancelled (a stdio server's process ends with it)."""
        task, stop = self._task, self._stop
        self._task = self._stop = None
        if stop is not None:
            stop.set()
        if task is not None:
            await asyncio.wait({task}, timeout=self.toolset.connect_timeout)
            task.cancel()
            with suppress(asyncio.CancelledError):
                await task

    def _context(self) -> str:
        """What the server said besides the SDK's error: its HTTP status, or the end of its stderr."""
        if self._refused is not None:
            return f" ({self._refused})"
        if self._stderr is None:
            return ""
        self._stderr.flush()
        self._stderr.seek(0)
        text = self._stderr.read().strip()
        return f"; its stderr ends: {text[-STDERR_TAIL:]}" if text else ""

    def stderr_close(self) -> None:
        """Let go of the stderr file (after the server has ended)."""
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None


def _closed(client: Client) -> bool:
    """Whether the connection is known to be closed before a request is sent (the server went away).

    The SDK keeps this in its dispatcher's private state; where that cannot be read, the
    connection counts as open, and a call on it that finds it closed is in doubt (the safe side).
    """
    dispatcher = getattr(client.session, "_dispatcher", None)
    return getattr(dispatcher, "_closed", False) is True


def _result(result: CallToolResult) -> Any:
    """What the model reads: the text, or the structured content where the text only repeats it; the rest described.

    Servers send structured content with its JSON as text too (the spec asks them to), and
    the SDK's servers wrap a plain value as ``{"result": value}``: the model reads each thing once.
    """
    text = "\n".join(block.text for block in result.content if block.type == "text")
    described = [_describe(block) for block in result.content if block.type != "text"]
    if result.is_error:
        raise MCPToolError("\n".join([text, *described]).strip() or "the tool reported an error")
    data = result.structured_content
    if data is None:
        return "\n".join(block.text if block.type == "text" else _describe(block) for block in result.content)
    if not text or _says(text, data):
        main: Any = data
    elif isinstance(data, dict) and len(data) == 1 and _says(text, next(iter(data.values()))):
        main = text
    else:
        main = f"{text}\n{json.dumps(data, ensure_ascii=False)}"
    if not described:
        return main
    return "\n".join([main if isinstance(main, str) else json.dumps(main, ensure_ascii=False), *described])


def _says(text: str, value: Any) -> bool:
    """Whether ``text`` is ``value`` written out (as itself, or as JSON)."""
    if text == value:
        return True
    try:
        return bool(json.loads(text) == value)
    except ValueError:
        return False


def _describe(block: ContentBlock) -> str:
    """An image, audio clip or resource in words (the model reads text only)."""
    if block.type in ("image", "audio"):
        return f"[{block.type}: {block.mime_type}, {_size(block.data)}]"
    if block.type == "resource_link":
        about = f": {block.description}" if block.description else ""
        return f"[resource link {block.name} <{block.uri}>{f' ({block.mime_type})' if block.mime_type else ''}{about}]"
    if block.type == "resource":
        content = block.resource
        kind = f" ({content.mime_type})" if content.mime_type else ""
        if hasattr(content, "text"):
            return f"[resource <{content.uri}>{kind}]\n{content.text}"
        return f"[resource <{content.uri}>{kind}, {_size(content.blob)}]"
    return f"[{block.type} content]"


def _size(data: str) -> str:
    try:
        return f"{len(base64.b64decode(data, validate=True))} bytes"
    except (binascii.Error, ValueError):
        return "undecodable data"


def _reason(error: BaseException) -> str:
    """The root causes of ``error`` in words (the SDK wraps transport failures in exception groups)."""
    if isinstance(error, BaseExceptionGroup):
        return "; ".join(dict.fromkeys(_reason(inner) for inner in error.exceptions))
    if isinstance(error, MCPError):
        return error.message
    if isinstance(error, httpx2.HTTPStatusError):
        return f"HTTP {error.response.status_code} from {error.request.url}"
    text = str(error) or type(error).__name__
    return f"{type(error).__name__}: {text}" if isinstance(error, OSError | httpx2.HTTPError) else text
