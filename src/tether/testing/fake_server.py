"""The HTTP shell the fake model APIs share: a local server, a FIFO script, recorded requests.

Why: :class:`~tether.testing.FakeMessagesAPI` and :class:`~tether.testing.FakeChatCompletionsAPI`
differ in what they accept and answer, never in how they serve it. This module holds the
serving: a threaded server on ``127.0.0.1`` speaking keep-alive HTTP/1.1, every request
recorded before it is judged, answers either a JSON body or a stream of server-sent events
written one chunk per event (optionally cut off without ending the body). A fake is a
subclass that says which requests are valid (:meth:`FakeServer.check_request`) and what the
next scripted item answers (:meth:`FakeServer.scripted`). Standard library only, so it cannot
drift with the clients it tests.
"""

from __future__ import annotations

import abc
import contextlib
import copy
import itertools
import json
import socket
import threading
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Self, cast
from urllib.parse import urlsplit

_POLL_INTERVAL = 0.01  # seconds

__all__ = ["Answer", "Dynamic", "Failure", "FakeServer", "Raw", "Reply", "Stream"]

Responder = Callable[[dict[str, Any]], dict[str, Any]]
"""Builds a response dict from the parsed request body."""


@dataclass(frozen=True)
class Answer:
    """One HTTP answer: a JSON ``body``, or server-sent ``events`` written one chunk each."""

    status: int
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)
    events: list[bytes] | None = None
    """Served as a ``text/event-stream`` instead of ``body``: each item already encoded."""
    drop_connection: bool = False
    """Close the connection after ``events``, without ending the stream."""
    payload: bytes | None = None
    """Served byte for byte instead of ``body`` (as ``application/json``)."""


@dataclass(frozen=True)
class Reply:
    """A scripted response body (the fake fills in defaults when it serves it)."""

    body: dict[str, Any]


@dataclass(frozen=True)
class Dynamic:
    """A response built from the request when it arrives."""

    responder: Responder


@dataclass(frozen=True)
class Failure:
    """A scripted HTTP error, its body in the API's shape."""

    status: int
    body: dict[str, Any]
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Stream:
    """A scripted stream served exactly as given, for a streaming request only."""

    events: list[bytes]
    drop_connection: bool


@dataclass(frozen=True)
class Raw:
    """A scripted body served byte for byte, for a non-streaming request only."""

    payload: bytes


Scripted = Reply | Dynamic | Failure | Stream | Raw


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024
    """The listen backlog: the standard library's 5 made the kernel refuse most of 128 clients
    connecting at once (the accept loop takes one per turn); a service-scale test opens 256."""
    fake: FakeServer


class _Handler(BaseHTTPRequestHandler):
    """Thin HTTP shell; all behaviour lives in `FakeServer.answer`."""

    protocol_version = "HTTP/1.1"  # keep-alive, like the real APIs
    disable_nagle_algorithm = True  # headers and body go out in two writes; avoid a 40 ms stall

    def setup(self) -> None:
        super().setup()
        self._fake().track(self.connection, open_=True)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self._fake().track(self.connection, open_=False)

    def _fake(self) -> FakeServer:
        return cast(_Server, self.server).fake

    def handle(self) -> None:
        """Serve until the client leaves; one that drops a stream half read resets the connection."""
        with contextlib.suppress(ConnectionResetError, BrokenPipeError):
            super().handle()

    def do_POST(self) -> None:
        """Serve an API call."""
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length) if length else b""
        headers = {k.lower(): v for k, v in self.headers.items()}
        self._send(self._fake().answer(urlsplit(self.path).path, headers, raw))

    def do_GET(self) -> None:
        """Nothing is served over GET."""
        self._send(self._fake().not_found(self.path))

    def _send(self, answer: Answer) -> None:
        if answer.events is not None:
            self._send_events(answer)
            return
        payload = answer.payload if answer.payload is not None else json.dumps(answer.body).encode()
        self.send_response(answer.status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(payload)))
        for name, value in answer.headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(payload)

    def _send_events(self, answer: Answer) -> None:
        """One chunk per event, each written at once, as the real APIs stream (chunked HTTP/1.1)."""
        self.send_response(answer.status)
        self.send_header("content-type", "text/event-stream; charset=utf-8")
        self.send_header("transfer-encoding", "chunked")
        for name, value in answer.headers.items():
            self.send_header(name, value)
        self.end_headers()
        for data in answer.events or []:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        if answer.drop_connection:
            self.close_connection = True  # no terminating chunk: the client sees a cut body
            return
        self.wfile.write(b"0\r\n\r\n")

    def log_message(self, format: str, *args: Any) -> None:
        """Keep test output quiet."""


class FakeServer(abc.ABC):
    """A scripted API on ``127.0.0.1``: each valid POST consumes the next scripted item (FIFO).

    Attributes:
        requests: Parsed JSON bodies received, in order, including rejected ones.
        headers: Request headers (lower-cased names), parallel to ``requests``.
        paths: Request paths, parallel to ``requests``.
    """

    request_id_prefix = "req_fake_"
    """How the ``request-id`` header of each answer starts."""

    def __init__(self, *, name: str, fast_retries: bool) -> None:
        self.fast_retries = fast_retries
        """Retryable errors carry ``retry-after-ms: 1`` so a client's retry loop does not sleep
        its default back-off (the real APIs do not send it; it changes timing, never behaviour)."""
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.paths: list[str] = []
        self._queue: deque[Scripted] = deque()
        self._lock = threading.Lock()
        self._request_ids = itertools.count(1)
        self._connections: set[socket.socket] = set()
        self._closed = False
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.fake = self
        # A short poll interval keeps `close` (which waits for the loop to notice) near-instant.
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": _POLL_INTERVAL}, name=name, daemon=True
        )
        self._thread.start()

    # -- lifecycle

    @property
    def origin(self) -> str:
        """``http://127.0.0.1:PORT``."""
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Stop the server and drop kept-alive connections (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self._server.shutdown()
        self._server.server_close()
        with self._lock:
            connections = list(self._connections)
        for conn in connections:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        self._thread.join(timeout=5)

    def track(self, conn: socket.socket, *, open_: bool) -> None:
        """Record live connections so `close` can end kept-alive ones (server internal)."""
        with self._lock:
            if open_:
                self._connections.add(conn)
            else:
                self._connections.discard(conn)

    # -- scripting

    def enqueue(self, item: Scripted) -> None:
        """Add one scripted item."""
        with self._lock:
            self._queue.append(item)

    def reply_with(self, responder: Responder) -> None:
        """Queue a dynamic reply: ``responder(request_body)`` returns the response dict.

        Defaults are filled as for ``reply``. If the responder raises, the client gets a 500
        naming the exception.
        """
        self.enqueue(Dynamic(responder))

    def reply_raw(self, payload: bytes | str) -> None:
        """Queue a body served exactly as given, for a non-streaming call: JSON this fake would never write.

        Why: a broken API or proxy can send what no JSON encoder here produces (a value nested
        thousands deep, which :func:`json.dumps` refuses, or text that is no JSON at all);
        defaults are not filled in. A streaming request meeting it gets 500 ``api_error``.
        """
        self.enqueue(Raw(payload.encode() if isinstance(payload, str) else payload))

    def reset(self) -> None:
        """Forget the script, the recorded requests and the id counters.

        Why: lets one server (and one client, whose construction is the slow part)
        serve a whole test module; call it between tests.
        """
        with self._lock:
            self._queue.clear()
            self.requests.clear()
            self.headers.clear()
            self.paths.clear()
            self._request_ids = itertools.count(1)
            self.reset_counters()

    def reset_counters(self) -> None:  # noqa: B027 - optional: a server without id counters keeps it
        """Restart the subclass's own id counters (called under the lock by :meth:`reset`)."""

    @property
    def pending(self) -> int:
        """Number of scripted items not yet consumed."""
        with self._lock:
            return len(self._queue)

    # -- serving

    def answer(self, path: str, headers: dict[str, str], raw: bytes) -> Answer:
        """Decide the response to one POST (server internal; runs on handler threads)."""
        try:
            parsed: object = json.loads(raw) if raw else None
        except ValueError:
            parsed = None
            body: dict[str, Any] = {"_unparsed": raw.decode("utf-8", "replace")}
        else:
            body = cast(dict[str, Any], parsed) if isinstance(parsed, dict) else {"_body": parsed}
        with self._lock:
            self.requests.append(body)
            self.headers.append(dict(headers))
            self.paths.append(path)
            request_id = f"{self.request_id_prefix}{next(self._request_ids)}"

        answer = self.check_request(path, headers, parsed)
        if answer is None:
            answer = self.scripted(body)
        return replace(answer, headers={"request-id": request_id, **answer.headers})

    def scripted(self, request: dict[str, Any]) -> Answer:
        """The next scripted item as the answer to a valid ``request``: a stream when it asked for one."""
        with self._lock:
            item = self._queue.popleft() if self._queue else None
        if item is None:
            return Answer(500, self.error_body("fake API: no scripted reply left"))
        if isinstance(item, Failure):  # before a stream starts, errors are plain HTTP errors
            return self._failure(item)
        streaming = request.get("stream") is True
        if isinstance(item, Raw):
            if streaming:
                return Answer(500, self.error_body("fake API: a raw body was scripted for a streaming call"))
            return Answer(200, {}, payload=item.payload)
        if isinstance(item, Stream):
            if not streaming:
                return Answer(500, self.error_body("fake API: a stream was scripted for a non-streaming call"))
            return Answer(200, {}, events=item.events, drop_connection=item.drop_connection)
        if isinstance(item, Dynamic):
            try:
                response = item.responder(copy.deepcopy(request))
            except Exception as exc:  # noqa: BLE001 - whatever a test's responder raises, the client gets an API error
                return Answer(500, self.error_body(f"fake API: reply_with callable raised {type(exc).__name__}: {exc}"))
            body = self.complete(dict(response), request)
        else:
            body = self.complete(copy.deepcopy(item.body), request)
        if streaming:
            return Answer(200, {}, events=self.stream_of(body, request))
        return Answer(200, body)

    def _failure(self, item: Failure) -> Answer:
        headers: dict[str, str] = {}
        if item.status == 429:
            headers["retry-after"] = "0"
        if self.fast_retries and (item.status in (408, 409, 429) or item.status >= 500):
            headers["retry-after-ms"] = "1"
        headers.update(item.headers)
        return Answer(item.status, item.body, headers)

    # -- what each fake API says

    @abc.abstractmethod
    def check_request(self, path: str, headers: dict[str, str], parsed: object) -> Answer | None:
        """The error answer for an invalid request (route, auth, body), or None when it is valid."""
        raise NotImplementedError

    @abc.abstractmethod
    def complete(self, response: dict[str, Any], request: Mapping[str, Any]) -> dict[str, Any]:
        """A scripted response with its missing fields filled in for ``request``."""
        raise NotImplementedError

    @abc.abstractmethod
    def stream_of(self, body: dict[str, Any], request: Mapping[str, Any]) -> list[bytes]:
        """``body`` as the encoded events of a stream answering ``request``."""
        raise NotImplementedError

    @abc.abstractmethod
    def error_body(self, message: str) -> dict[str, Any]:
        """The API's body for a server error (HTTP 500) with ``message``."""
        raise NotImplementedError

    @abc.abstractmethod
    def not_found(self, path: str) -> Answer:
        """The answer to a route the API does not serve."""
        raise NotImplementedError
