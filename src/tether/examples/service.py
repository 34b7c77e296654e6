"""An example web service: agents park at approval gates; people decide over HTTP.

Needs the ``service`` extra (``pip install 'tether[service]'``: Starlette and uvicorn)::

    python -m tether.examples.service --db sqlite:///service.db --port 8000 --tokens tokens.json

Every request carries a token (``Authorization: Bearer TOKEN``), and the token names its
tenant (``tokens.json`` holds ``{"TOKEN": "TENANT", ...}``, see :mod:`tether.policy.access`):
a caller cannot pick another tenant. Another tenant's run answers 404, exactly like a missing
one, so ids reveal nothing.

=======  ======================================  =================================================
POST     /runs                                   ``{"prompt": str, "wait": bool = true}`` → 201 run
                                                 (driven until done or parked); ``wait: false`` →
                                                 202 and the run is driven in the background
GET      /runs/{run_id}                          → 200 run (read from the run's row, no replay)
GET      /approvals?run_id=                      → 200 ``{"pending": [...]}`` (the tenant's calls)
POST     /runs/{run_id}/approvals/{call_id}      ``{"approve": bool, "reason": str, "input": {...},
                                                 "actor": str, "fingerprint": str,
                                                 "remember_for_run": bool}`` → the decision is
                                                 recorded, the run driven on: 200 run
POST     /runs/{run_id}/resume                   → the run driven on (a retry now due, a transient
                                                 failure): 200 run
GET      /runs/{run_id}/events                   → 200 ``text/event-stream``: the run's events as they
                                                 are recorded (see below); 204 once it has ended
=======  ======================================  =================================================

``GET /runs/{run_id}/events`` streams the run's events (:mod:`tether.facts.stream`) as server-sent
events, from its first, or after the cursor a ``Last-Event-ID`` header (or ``?after=``) gives:
``event:`` is the event's ``kind``, ``data:`` its JSON and ``id:`` its cursor, so a browser's
``EventSource`` that reconnects misses nothing and sees nothing twice. Text of the model's answer
arrives as ``text_delta`` events without an ``id`` (live only: they are not stored). The stream
closes after ``run_ended``; asked again after the run's end it answers 204, which tells an
``EventSource`` to stop reconnecting. (A browser's ``EventSource`` sends no ``Authorization``
header: there, read the stream with a fetch-based SSE client, which sends both headers.)
Whichever process drives the run, its events come: those this process drives at once, others
within ``poll`` seconds (see :func:`create_app`).

A request never sleeps long for a tool retry: one due later than ``max_wait`` seconds (see
:func:`create_app`) parks the run, answered with status ``waiting_retry`` and ``next_due_at``;
a worker or a client resumes it then (``tether runs --due`` lists such runs).

A run is its row: the keys ``tether run --json`` prints (``run_id, status, output, result,
error, steps, tool_calls, usage, pending_approvals``) and any the row adds. Errors are
``{"error": {"code": str, "message": str}}`` with: 400 a body that is not a JSON object;
401 no token, or an unknown one; 403 a ``?tenant=`` other than the token's; 404 unknown run, call or
route; 409 a decision that cannot apply (already decided, decided concurrently, the
fingerprint does not match the arguments, edited input a deny rule forbids, the run is not
parked); 422 a body field of the wrong type, or edited input the tool's schema rejects.

Decisions are safe from any number of processes: the store's optimistic concurrency
lets exactly one of two racing decisions through; the other gets 409.

Runs are driven on the server's event loop by :class:`~tether.drivers.runner.AsyncRunner` on an
:class:`~tether.stores.AsyncStore` (:class:`~tether.stores.sql.AsyncSQLStore` for a SQL URL): no
request waits for a thread, and one process serves many runs at once. The app closes its store
when it shuts down.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from typing import TYPE_CHECKING, Any

from tether.errors import MissingExtra
from tether.extras import needs

try:
    with needs("service", "the example service (tether.examples.service)"):
        import uvicorn
        from starlette.applications import Starlette
        from starlette.background import BackgroundTask
        from starlette.exceptions import HTTPException
        from starlette.requests import Request
        from starlette.responses import JSONResponse, Response, StreamingResponse
        from starlette.routing import Route
except MissingExtra as missing:
    if __name__ == "__main__":  # started as a program: the one line, no traceback
        raise SystemExit(f"error: {missing}") from None
    raise

from tether.agent import Agent
from tether.core.approvals import Approve, DecideLater, Decision, Deny
from tether.drivers import stream
from tether.drivers.runner import AsyncRunner, shown_status
from tether.drivers.telemetry import Telemetry
from tether.errors import (
    ApprovalError,
    ConfigError,
    InvalidEditedInput,
    NotAwaitingApproval,
    RunNotFound,
    StaleRun,
    TetherError,
    UnknownCall,
    UnknownCursor,
)
from tether.facts.stream import StreamEvent, to_json
from tether.heap import freeze_startup_heap
from tether.policy.access import Credentials, bearer
from tether.stores import AsyncStore, RunRecord, Store, open_async_store
from tether.stores.awaitable import as_async_store
from tether.views.pending import apending_approvals

if TYPE_CHECKING:
    from tether.drivers.otel import OpenTelemetry

TOKENS_ENV = "TETHER_SERVICE_TOKENS"
"""The token file ``main`` reads when ``--tokens`` is not given."""
AgentFactory = Callable[[str], Agent]
"""Builds the agent for a tenant; called per request, so cache it if it is costly."""

log = logging.getLogger(__name__)


class ServiceError(Exception):
    """An HTTP error answered as ``{"error": {"code", "message"}}``."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


def demo_agent(tenant: str) -> Agent:
    """The demo's tools (one gated) on the offline scripted model: runs with no API key."""
    from tether.drivers.loader import DEMO_MODEL, agent_from_spec
    from tether.examples import demo

    spec = {
        "tools": ["tether.examples.demo:TOOLS"],
        "system": demo.SYSTEM,
        "model": DEMO_MODEL,
        "max_steps": 10,
        "env": {demo.WORKSPACE_ENV: str(demo.workspace())},
    }
    return agent_from_spec(spec)


def run_json(record: RunRecord) -> dict[str, Any]:
    """A run's row: :meth:`tether.RunResult.to_dict`'s keys plus whatever else the row keeps."""
    return {"run_id": record.id, "status": shown_status(record), **record.summary}


class _Service:
    """The endpoints: every run is driven on the event loop, awaiting its store, model and tools."""

    def __init__(
        self,
        agent_factory: AgentFactory,
        store: AsyncStore,
        max_wait: float,
        credentials: Credentials,
        telemetry: Telemetry | None,
        *,
        poll: float,
    ) -> None:
        self.agent_factory = agent_factory
        self.store = store
        self.max_wait = max_wait
        self.poll = poll
        self.credentials = credentials
        self.telemetry = telemetry

    def tenant(self, request: Request) -> str:
        """The tenant the request's token is bound to: the only one it may reach."""
        grant = self.credentials.grant(bearer(request.headers.get("Authorization")))
        if grant is None or grant.tenant is None:
            raise ServiceError(401, "unauthorized", "send a valid token: Authorization: Bearer TOKEN")
        return grant.tenant

    def runner(self, tenant: str) -> AsyncRunner:
        # Decisions arrive over HTTP: a gated call (or one a crash left in doubt) parks the run.
        return AsyncRunner(self.agent_factory(tenant), self.store, approver=DecideLater(), telemetry=self.telemetry)

    # Endpoints ----------------------------------------------------------------------
    async def start_run(self, request: Request) -> Response:
        tenant = self.tenant(request)
        body = await _body(request)
        prompt = _field(body, "prompt", str, required=True)
        wait = _field(body, "wait", bool, default=True)
        if not prompt.strip():
            raise ServiceError(422, "invalid_body", "prompt must not be empty")
        runner = self.runner(tenant)
        state = await runner.create(prompt, tenant=tenant)
        headers = {"Location": f"/runs/{state.id}"}
        if not wait:
            record = await self.store.load_run(state.id, tenant=tenant)
            task = BackgroundTask(self._drive_quietly, runner, state.id, tenant)
            return JSONResponse(run_json(record), status_code=202, headers=headers, background=task)
        record = await self._drive(runner, state.id, tenant)
        return JSONResponse(run_json(record), status_code=201, headers=headers)

    async def get_run(self, request: Request) -> Response:
        tenant = self.tenant(request)
        record = await self.store.load_run(request.path_params["run_id"], tenant=tenant)
        return JSONResponse(run_json(record))

    async def resume(self, request: Request) -> Response:
        tenant = self.tenant(request)
        record = await self._drive(self.runner(tenant), request.path_params["run_id"], tenant)
        return JSONResponse(run_json(record))

    async def list_approvals(self, request: Request) -> Response:
        tenant = self.tenant(request)
        asked = request.query_params.get("tenant")
        if asked is not None and asked != tenant:
            raise ServiceError(403, "tenant_mismatch", f"?tenant={asked} is not the tenant of your token")
        run_id = request.query_params.get("run_id")
        pending = await apending_approvals(self.store, tenant=tenant, run_id=run_id)
        return JSONResponse({"pending": [p.to_dict() for p in pending]})

    async def decide(self, request: Request) -> Response:
        tenant = self.tenant(request)
        body = await _body(request)
        approve = _field(body, "approve", bool, required=True)
        reason = _field(body, "reason", str, default="")
        edited = _field(body, "input", dict, default=None)
        actor = _field(body, "actor", str, default="") or f"api ({tenant})"
        fingerprint = _field(body, "fingerprint", str, default=None)
        for_run = _field(body, "remember_for_run", bool, default=False)  # approve the tool for the rest of the run
        if (edited is not None or for_run) and not approve:
            raise ServiceError(422, "invalid_body", "input and remember_for_run go with an approval only")
        decision: Decision = (
            Approve(input=edited, actor=actor, remember_for_run=for_run) if approve else Deny(reason, actor=actor)
        )
        run_id, call_id = request.path_params["run_id"], request.path_params["call_id"]
        runner = self.runner(tenant)
        await runner.decide(run_id, call_id, decision, fingerprint=fingerprint, tenant=tenant)
        try:
            record = await self._drive(runner, run_id, tenant)
        except StaleRun:  # the decision stands; another request is driving the run on
            record = await self.store.load_run(run_id, tenant=tenant)
        return JSONResponse(run_json(record))

    async def events(self, request: Request) -> Response:
        tenant = self.tenant(request)
        after = _cursor(request)
        batches = stream.afollow(self.store, request.path_params["run_id"], tenant=tenant, after=after, poll=self.poll)
        try:
            first = await anext(batches)  # an unknown run or cursor is an error answer, not a stream
        except StopAsyncIteration:
            return Response(status_code=204)  # it ended at the cursor: an EventSource stops asking
        headers = {"cache-control": "no-cache", "x-accel-buffering": "no"}  # each event at once, through proxies
        return StreamingResponse(_sse(first, batches), media_type="text/event-stream", headers=headers)

    # Driving ---------------------------------------------------------------------------
    async def _drive(self, runner: AsyncRunner, run_id: str, tenant: str) -> RunRecord:
        """Drive until done or parked; answer from the row, so every response has one shape."""
        await runner.drive(run_id, tenant=tenant, max_wait=self.max_wait)
        return await self.store.load_run(run_id, tenant=tenant)

    async def _drive_quietly(self, runner: AsyncRunner, run_id: str, tenant: str) -> None:
        try:
            await runner.drive(run_id, tenant=tenant, max_wait=self.max_wait)
        except TetherError:  # after the response: log it; the run's row tells its status
            log.exception("background drive of %s failed", run_id)


DEFAULT_MAX_WAIT = 5.0
"""Seconds a request may sleep for a tool retry before it parks the run instead."""
HEARTBEAT = 15.0
"""Seconds of silence after which an event stream sends a comment, so proxies keep it open."""


def create_app(
    agent_factory: AgentFactory = demo_agent,
    store: AsyncStore | Store | None = None,
    *,
    max_wait: float = DEFAULT_MAX_WAIT,
    credentials: Credentials,
    telemetry: Telemetry | None = None,
    poll: float = stream.POLL,
) -> Starlette:
    """The service's ASGI app.

    Args:
        agent_factory: builds a tenant's agent (its tools must stay compatible with the
            runs it already has). Default: the demo's tools on the offline scripted model.
        store: where runs live; default ``$TETHER_DB`` or ``sqlite:///tether.db``, opened as an
            :class:`~tether.stores.sql.AsyncSQLStore`. Use a SQL store to decide from several
            processes. A sync store works too (its calls then run in worker threads).
        max_wait: seconds a request sleeps for a tool retry; a later one parks the run.
        credentials: the tokens requests carry, each bound to the tenant it acts for.
        telemetry: traces every run, drive, model call, tool call and decision the requests make
            (:class:`tether.drivers.otel.OpenTelemetry`); None: nothing is traced.
        poll: seconds between an event stream's reads of a run another process drives (one this
            process drives is heard of at once).

    Raises:
        ConfigError: a token bound to no tenant (the service acts for one tenant per request).
    """
    if None in credentials.tenants:
        raise ConfigError("the service acts for one tenant per request: every token must name a tenant")
    opened = as_async_store(store) if store is not None else open_async_store(os.environ.get("TETHER_DB"))
    service = _Service(agent_factory, opened, max_wait, credentials, telemetry, poll=poll)

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        yield
        await opened.close()  # its connections belong to this event loop

    routes = [
        Route("/runs", service.start_run, methods=["POST"]),
        Route("/runs/{run_id}", service.get_run, methods=["GET"]),
        Route("/approvals", service.list_approvals, methods=["GET"]),
        Route("/runs/{run_id}/approvals/{call_id}", service.decide, methods=["POST"]),
        Route("/runs/{run_id}/resume", service.resume, methods=["POST"]),
        Route("/runs/{run_id}/events", service.events, methods=["GET"]),
    ]
    handlers: dict[Any, Any] = {
        ServiceError: _service_error,
        TetherError: _tether_error,
        HTTPException: _http_error,
    }
    return Starlette(routes=routes, exception_handlers=handlers, lifespan=lifespan)


# Event streams -----------------------------------------------------------------------
def _cursor(request: Request) -> int | None:
    """Where the client's stream goes on from: ``Last-Event-ID`` (what an EventSource resends), else ``?after=``."""
    given = request.headers.get("last-event-id") or request.query_params.get("after")
    if not given:
        return None
    if not given.isdigit():
        raise ServiceError(400, "invalid_cursor", f"a cursor is an event's id (a number >= 0), not {given!r}")
    return int(given)


async def _sse(first: stream.Batch, batches: AsyncGenerator[stream.Batch, None]) -> AsyncIterator[str]:
    """The batches as server-sent events (``id:`` the cursor, none for a text delta), a comment when long idle."""
    said = time.monotonic()
    batch: stream.Batch | None = first
    async with contextlib.aclosing(batches):
        while batch is not None:
            if batch:
                said = time.monotonic()
                yield "".join(_sse_event(event) for event in batch)
            elif time.monotonic() - said >= HEARTBEAT:
                said = time.monotonic()
                yield ": still here\n\n"
            batch = await anext(batches, None)


def _sse_event(event: StreamEvent) -> str:
    lines = "" if event.cursor is None else f"id: {event.cursor}\n"
    return f"{lines}event: {event.kind}\ndata: {json.dumps(to_json(event), ensure_ascii=False)}\n\n"


# Requests and errors ---------------------------------------------------------------
async def _body(request: Request) -> dict[str, Any]:
    try:
        body = await request.json()
    except ValueError as error:
        raise ServiceError(400, "invalid_json", f"the body is not JSON: {error}") from error
    if not isinstance(body, dict):
        raise ServiceError(400, "invalid_json", "the body must be a JSON object")
    return body


def _field(body: dict[str, Any], name: str, kind: type, *, required: bool = False, default: Any = None) -> Any:
    if name not in body or body[name] is None:
        if required:
            raise ServiceError(422, "invalid_body", f"{name!r} is required")
        return default
    value = body[name]
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
        raise ServiceError(422, "invalid_body", f"{name!r} must be a {_JSON_NAMES.get(kind, kind.__name__)}")
    return value


_JSON_NAMES = {str: "string", bool: "boolean", dict: "JSON object"}


def _error(status: int, code: str, message: str) -> JSONResponse:
    return JSONResponse({"error": {"code": code, "message": message}}, status_code=status)


def _service_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ServiceError)
    answer = _error(exc.status, exc.code, exc.message)
    if exc.status == 401:
        answer.headers["WWW-Authenticate"] = "Bearer"
    return answer


_ANSWERS: tuple[tuple[type[TetherError], int, str], ...] = (
    (RunNotFound, 404, "run_not_found"),
    (UnknownCall, 404, "call_not_found"),
    (NotAwaitingApproval, 409, "not_pending"),
    (InvalidEditedInput, 422, "invalid_input"),
    (ApprovalError, 409, "decision_refused"),  # already decided, stale fingerprint, denied by policy
    (StaleRun, 409, "stale_run"),
    (UnknownCursor, 400, "unknown_cursor"),
)
"""The HTTP status and code of each error kind; the first that ``isinstance`` matches answers."""


def _tether_error(request: Request, exc: Exception) -> Response:
    for kind, status, code in _ANSWERS:
        if isinstance(exc, kind):
            return _error(status, code, str(exc))
    log.error("request failed: %s", exc, exc_info=exc)
    return _error(500, "internal", f"{type(exc).__name__}: {exc}")


def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    return _error(exc.status_code, "not_found" if exc.status_code == 404 else "http_error", str(exc.detail))


def main(argv: Sequence[str] | None = None) -> None:
    """Serve the demo agent: ``python -m tether.examples.service``."""
    parser = argparse.ArgumentParser(prog="python -m tether.examples.service", description="Serve the demo over HTTP.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--db", help="SQLAlchemy URL (default $TETHER_DB, else sqlite:///tether.db)")
    parser.add_argument("--tokens", metavar="FILE", help=f'JSON {{"TOKEN": "TENANT", ...}} (default ${TOKENS_ENV})')
    parser.add_argument(
        "--otel", action="store_true", help="trace with OpenTelemetry (tether[otel]; exporter: $OTEL_TRACES_EXPORTER)"
    )
    args = parser.parse_args(argv)
    tokens = args.tokens or os.environ.get(TOKENS_ENV)
    if not tokens:
        parser.error(f"give --tokens FILE (or ${TOKENS_ENV}): each token names the tenant it acts for")
    try:
        tracing = _telemetry() if args.otel else None
        app = create_app(
            store=open_async_store(args.db or os.environ.get("TETHER_DB")),
            credentials=Credentials.from_file(tokens),
            telemetry=tracing,
        )
    except (ConfigError, ImportError) as error:
        parser.error(str(error))
    freeze_startup_heap()  # this process is the service's: its imports stay out of the GC's full passes
    try:
        uvicorn.run(app, host=args.host, port=args.port)
    finally:
        if tracing is not None:
            tracing.close()  # flushes the spans


def _telemetry() -> OpenTelemetry:
    from tether.drivers.otel import from_environment  # ImportError: the otel extra is missing

    return from_environment()


if __name__ == "__main__":  # pragma: no cover
    main()
