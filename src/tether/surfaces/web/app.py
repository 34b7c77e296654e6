"""The inspector's routes: pages, the diagram, live streams, sign-in, and decisions.

=====  ==========================  ==============================================================
GET    /                           runs, newest first (``?status=&tenant=&q=``)
GET    /inbox                      every call waiting for a decision, with its form
GET    /runs/{run_id}              one run: diagram, timeline, tool calls, messages, its pending calls
GET    /runs/{run_id}/diagram.svg  the machine with the run's path and current state (Graphviz)
GET    /runs/{run_id}/live         server-sent events: ``changed`` as the run moves, ``end``
GET    /live                       server-sent events: ``changed`` as any visible run moves
POST   /decide                     approve, deny or edit one call (form, CSRF-checked), then
                                   back to the page it came from
POST   /fork                       a new run from one step of a run, one message's text optionally
                                   edited (form, CSRF-checked), driven on; then the new run's page
GET    /login, POST /login         sign in with a token; ``?token=`` on any page does the same
                                   (opened by the person, not from another site's page)
POST   /logout                     end the session: its cookie and its open streams
=====  ==========================  ==============================================================

Every route but ``/static`` and ``/login`` needs a token (see :mod:`tether.surfaces.web.guard`);
every page is rendered by Jinja2 with autoescaping on, so text from a model, a tool or a
person is shown as text. Forms are read up to a limit as they arrive, so an endless body is
refused after that many bytes, never held.
"""

from __future__ import annotations

import datetime
import logging
import re
import shutil
import time
from collections.abc import AsyncGenerator, AsyncIterator, Iterable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, quote, unquote, urlencode, urlsplit

import jinja2
from markupsafe import Markup  # Jinja2's own dependency
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from statemachine.contrib.diagram.graphviz import GraphvizNotFoundError

from tether.agent import Agent
from tether.drivers.loader import AgentFor
from tether.drivers.telemetry import Telemetry
from tether.errors import (
    ApprovalError,
    ConfigError,
    InvalidEditedInput,
    InvalidForkPoint,
    RunEnded,
    RunNotFound,
    StaleRun,
    TetherError,
    UnknownCall,
)
from tether.policy.access import Credentials, Grant
from tether.stores import Store
from tether.surfaces.web import live, pages, sessions
from tether.surfaces.web.confirm import CONFIRMED, CONTROLS, Question, question
from tether.surfaces.web.decisions import (
    TURN_ACTIONS,
    BadFields,
    BadForm,
    Decider,
    DecisionForm,
    InProcess,
    Resume,
    TurnForm,
)
from tether.surfaces.web.fields import KIND, fields_of
from tether.surfaces.web.guard import (
    CSRF_FIELD,
    TOKEN_PARAM,
    Guard,
    SecurityHeaders,
    Throttled,
    Viewer,
    cross_site,
)
from tether.surfaces.web.inbox import Turn, inbox_page, turns_below
from tether.surfaces.web.listen import AllowedHosts
from tether.surfaces.web.markdown import markdown  # markdown-it-py
from tether.views import diagram
from tether.views.printable import printable

log = logging.getLogger(__name__)

HERE = Path(__file__).parent
MAX_FORM_BYTES = 1_000_000
"""A decision or fork form larger than this is refused: unread if it says so, else once it gets there."""
MAX_SIGN_IN_BYTES = 8_192
"""The sign-in form (a token, where to go next): anyone may send it, so it is held to little."""
FROM_ELSEWHERE = (
    "This sign-in address was opened from another site's page, so it signed nobody in: it might "
    "not be yours. Open it yourself (paste it into the address bar, or from the terminal), or sign in below."
)
DIAGRAM_CSP = "default-src 'none'; style-src 'unsafe-inline'"
"""Graphviz's SVG needs its inline styles; nothing in it may run, even opened on its own."""
INBOX = "/inbox"


class _SignIn(Exception):
    """No valid token or session: answer with the sign-in page."""

    def __init__(self, problem: str = "") -> None:
        super().__init__(problem)
        self.problem = problem


class _TokenInAddress(Exception):
    """``?token=`` on a page: trade it for the session cookie, then show the page without it."""

    def __init__(self, token: str) -> None:
        super().__init__("token in the address")
        self.token = token


class _Refused(Exception):
    """A request refused before anything was read or done (another site, an expired form)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class _Inspector:
    """The handlers, sharing the store, the guard, the decider and the templates."""

    def __init__(self, store: Store, guard: Guard, decider: Decider, *, poll: float) -> None:
        self.store = store
        self.guard = guard
        self.decider = decider
        self.poll = poll
        self.templates = _templates()

    # Who is asking --------------------------------------------------------------------------
    def viewer(self, request: Request) -> Viewer:
        token = request.query_params.get(TOKEN_PARAM)
        if token is not None:
            raise _TokenInAddress(token)
        viewer = self.guard.viewer(request)
        if viewer is None:
            raise _SignIn()
        return viewer

    def render(self, request: Request, name: str, viewer: Viewer | None, status: int = 200, **context: Any) -> Response:
        """A page; text that cannot be encoded (a lone surrogate) is shown as its escape, never a 500."""
        html = self.templates.get_template(name).render(viewer=viewer, path=request.url.path, **context)
        return HTMLResponse(html.encode("utf-8", errors="backslashreplace"), status_code=status)

    # Pages ----------------------------------------------------------------------------------
    async def runs(self, request: Request) -> Response:
        viewer = self.viewer(request)
        wanted = pages.RunsFilter.of(dict(request.query_params))
        listed, digest, waiting = await run_in_threadpool(self._runs, viewer, wanted)
        return self.render(
            request,
            "runs.html",
            viewer,
            listed=listed,
            rows=listed.rows,
            wanted=wanted,
            statuses=pages.STATUSES,
            suggest={name: pages.suggestions(listed.rows, name) for name in ("tenant", "agent", "model")},
            digest=digest,
            waiting=waiting,
        )

    def _runs(self, viewer: Viewer, wanted: pages.RunsFilter) -> tuple[pages.RunsList, str, int]:
        listed = pages.runs(self.store, viewer.tenant, wanted)
        return listed, pages.digest(self.store, viewer.tenant), pages.waiting(self.store, viewer.tenant)

    async def inbox(self, request: Request) -> Response:
        viewer = self.viewer(request)
        return await self._inbox(request, viewer)

    async def _inbox(
        self, request: Request, viewer: Viewer, status: int = 200, problem: _Problem | None = None
    ) -> Response:
        number = _int(request.query_params.get("page")) or 1
        box = await run_in_threadpool(inbox_page, self.store, viewer.tenant, number)
        digest = await run_in_threadpool(pages.digest, self.store, viewer.tenant)
        waiting = await run_in_threadpool(pages.waiting, self.store, viewer.tenant)
        problem = problem or _Problem()
        return self.render(
            request,
            "inbox.html",
            viewer,
            status,
            box=box,
            digest=digest,
            waiting=waiting,
            decided=request.query_params.get("decided"),
            decided_run=request.query_params.get("run"),
            problem=problem,
            error_on_card=problem.on_a_card(box.turns),
        )

    async def run(self, request: Request) -> Response:
        viewer = self.viewer(request)
        return await self._run(request, viewer, request.path_params["run_id"])

    async def _run(
        self,
        request: Request,
        viewer: Viewer,
        run_id: str,
        status: int = 200,
        problem: _Problem | None = None,
        *,
        fork_error: str | None = None,
        control_error: str | None = None,
    ) -> Response:
        page = await run_in_threadpool(pages.run_page, self.store, run_id, viewer.tenant)
        turns = await run_in_threadpool(self._turns, run_id, viewer.tenant)
        waiting = await run_in_threadpool(pages.waiting, self.store, viewer.tenant)
        problem = problem or _Problem()
        return self.render(
            request,
            "run.html",
            viewer,
            status,
            page=page,
            run=page.state,
            waiting=waiting,
            graphviz=shutil.which("dot") is not None,
            graphviz_hint=diagram.GRAPHVIZ_HINT,
            decided=request.query_params.get("decided"),
            turns=turns,
            problem=problem,
            error_on_card=problem.on_a_card(turns),
            fork_error=fork_error,
            control_error=control_error,
            acted=request.query_params.get("acted"),
        )

    def _turns(self, run_id: str, tenant: str | None) -> list[Turn]:
        """What the run waits on a person for: its own calls, and its children's."""
        try:
            return turns_below(self.store, self.store.load_run(run_id, tenant=tenant), tenant)
        except RunNotFound:  # deleted since its page was read
            return []

    async def diagram_svg(self, request: Request) -> Response:
        viewer = self.viewer(request)
        run_id = request.path_params["run_id"]
        try:
            svg = await run_in_threadpool(self._svg, run_id, viewer.tenant)
        except GraphvizNotFoundError as error:
            return PlainTextResponse(str(error), status_code=503)
        headers = {"content-security-policy": DIAGRAM_CSP, "x-content-type-options": "nosniff"}
        return Response(svg, media_type="image/svg+xml", headers=headers)

    def _svg(self, run_id: str, tenant: str | None) -> bytes:
        record = self.store.load_run(run_id, tenant=tenant)
        events = self.store.load_events(run_id, tenant=tenant)
        children = diagram.ChildNote.of_run(self.store, run_id, tenant=tenant)  # the runs its agent tools started
        drawn = diagram.build(events=events, tools=diagram.ToolNote.of_run(record.spec), children=children)
        return diagram.graphviz(diagram.render_dot(drawn), "svg")

    # Live -----------------------------------------------------------------------------------
    async def run_live(self, request: Request) -> Response:
        viewer = self.viewer(request)
        run_id = request.path_params["run_id"]
        await run_in_threadpool(self.store.load_run, run_id, tenant=viewer.tenant)  # 404 before streaming
        since = _int(request.query_params.get("since"))
        gone = self._gone(request, viewer)
        return self._events(
            viewer, live.run_changes(self.store, run_id, viewer.tenant, since, poll=self.poll, gone=gone)
        )

    async def list_live(self, request: Request) -> Response:
        viewer = self.viewer(request)
        since = request.query_params.get("since")
        gone = self._gone(request, viewer)
        return self._events(viewer, live.list_changes(self.store, viewer.tenant, since, poll=self.poll, gone=gone))

    def _gone(self, request: Request, viewer: Viewer) -> live.Disconnected:
        """A stream stops when its page closes or its session ends (signed out, timed out)."""

        async def gone() -> bool:
            return not self.guard.signed_in(viewer) or await request.is_disconnected()

        return gone

    def _events(self, viewer: Viewer, stream: AsyncGenerator[str, None]) -> Response:
        said = live.while_signed_in(stream, lambda: self.guard.signed_in(viewer))
        return StreamingResponse(said, media_type="text/event-stream", headers={"x-accel-buffering": "no"})

    # Decisions ------------------------------------------------------------------------------
    async def decide(self, request: Request) -> Response:
        viewer = self.deciding(request)
        fields = await self.form(request, viewer)
        run_id, call_id = fields.get("run_id", ""), fields.get("call_id", "")
        page = _page_of(fields.get("next", ""), run_id)
        if fields.get("action") in TURN_ACTIONS:
            return await self._decide_turn(request, viewer, fields, page)
        try:
            form = DecisionForm.of(fields)
            if viewer.name is not None:  # a named token's decisions are its holder's, whatever the form says
                form = replace(form, by=viewer.name)
            await run_in_threadpool(self.decider.decide, run_id, call_id, form, tenant=viewer.tenant)
        except (ConfigError, ApprovalError, StaleRun) as error:  # ConfigError: BadForm, or tools that cannot load
            problem = _Problem(run_id, call_id, str(error), fields, _by_field(error))
            return await self._refused(request, viewer, page, _status_of(error), problem)
        return _decided(run_id, call_id, page)

    async def _decide_turn(
        self, request: Request, viewer: Viewer, fields: dict[str, str], page: str | None
    ) -> Response:
        """Every call of one turn decided at once; a refusal says which were decided before it."""
        run_id = fields.get("run_id", "")
        try:
            form = TurnForm.of(fields)
            if viewer.name is not None:  # a named token's decisions are its holder's, whatever the form says
                form = replace(form, by=viewer.name)
        except BadForm as error:
            return await self._refused(request, viewer, page, 422, _Problem(run_id, None, str(error)))
        decided, refused = await run_in_threadpool(self.decider.decide_turn, run_id, form, tenant=viewer.tenant)
        if refused is not None:
            before = f"{', '.join(decided)} decided; " if decided else "nothing decided: "
            problem = _Problem(run_id, None, before + str(refused))
            return await self._refused(request, viewer, page, _status_of(refused), problem)
        return _decided(run_id, ", ".join(decided), page)

    async def _refused(
        self, request: Request, viewer: Viewer, page: str | None, status: int, problem: _Problem
    ) -> Response:
        """The page the refused form came from (a run's, or the inbox), the problem beside its call or atop it."""
        if page is None:
            return await self._inbox(request, viewer, status, problem)
        return await self._run(request, viewer, page, status, problem)

    async def fork(self, request: Request) -> Response:
        viewer = self.deciding(request)
        fields = await self.form(request, viewer)
        run_id = fields.get("run_id", "")
        if fields.get(CONFIRMED) != "1":
            return self._confirm(request, viewer, "/fork", fields, question("fork", run_id, fields.get("at", "")))
        try:
            fork = await run_in_threadpool(
                self.decider.fork,
                run_id,
                fields.get("at", ""),
                tenant=viewer.tenant,
                text=fields.get("text", ""),
                message=fields.get("message", ""),
            )
        except (BadForm, InvalidForkPoint) as error:
            return await self._run(request, viewer, run_id, 422, fork_error=str(error))
        return RedirectResponse(f"/runs/{quote(fork.id, safe='')}", status_code=303)

    async def control(self, request: Request) -> Response:
        """Cancel, resume or retry a run, once the person said yes (the page's dialog, or the page this answers)."""
        viewer = self.deciding(request)
        fields = await self.form(request, viewer)
        run_id, action = fields.get("run_id", ""), fields.get("action", "")
        if action not in CONTROLS:
            raise _Refused(422, f"unknown action {action!r}: {', '.join(CONTROLS)}")
        if fields.get(CONFIRMED) != "1":
            return self._confirm(request, viewer, "/control", fields, question(action, run_id))
        try:
            if action == "cancel":
                await run_in_threadpool(
                    partial(self.decider.cancel, tenant=viewer.tenant, reason=fields.get("reason", "").strip()),
                    run_id,
                    by=viewer.name or fields.get("by", "").strip(),
                )
                acted = f"run {run_id} is cancelled"
            else:
                acted = await run_in_threadpool(partial(self.decider.go_on, tenant=viewer.tenant), run_id)
        except (ConfigError, RunEnded, StaleRun) as error:
            return await self._run(request, viewer, run_id, 409, control_error=str(error))
        return RedirectResponse(f"/runs/{quote(run_id, safe='')}?{urlencode({'acted': acted})}", status_code=303)

    def _confirm(
        self, request: Request, viewer: Viewer, action: str, fields: Mapping[str, str], asked: Question
    ) -> Response:
        """The question a form's effect needs a yes to, on a page of its own (the page's dialog did not ask)."""
        kept = {name: value for name, value in fields.items() if name not in (CSRF_FIELD, CONFIRMED)}
        return self.render(request, "confirm.html", viewer, action=action, fields=kept, asked=asked, waiting=0)

    def deciding(self, request: Request) -> Viewer:
        """The viewer of a request that decides or forks, refused (403, unread) if their token only views."""
        viewer = self.viewer(request)
        if not viewer.may_decide:
            who = f"{viewer.name}'s token" if viewer.name else "this token"
            raise _Refused(403, f"refused: {who} is a viewer's: it shows runs but decides and forks nothing")
        return viewer

    async def form(self, request: Request, viewer: Viewer | None, limit: int = MAX_FORM_BYTES) -> dict[str, str]:
        """A posted form, once the request is known to come from our own page (CSRF-checked)."""
        if cross_site(request.headers, scheme=request.url.scheme, host=request.headers.get("host", "")):
            raise _Refused(403, "refused: the form was sent from another site")
        body = await _body(request, limit)
        pairs = parse_qsl(body.decode("utf-8", errors="replace"), keep_blank_values=True)
        fields = {name: value.replace("\r\n", "\n") for name, value in pairs}  # a text area's lines come as CRLF
        if viewer is not None and not Guard.csrf_ok(viewer, fields.get(CSRF_FIELD)):
            raise _Refused(403, "refused: this form has expired (the server restarted?): reload the page and try again")
        return fields

    # Signing in and out -------------------------------------------------------------------------
    async def login_page(self, request: Request) -> Response:
        return self.login_form(request, 401, next_page=_local(request.query_params.get("next")))

    def login_form(self, request: Request, status: int, *, problem: str = "", next_page: str = "/") -> Response:
        """The sign-in page; from another site's link, it offers that page too (a signed-in browser opens it)."""
        elsewhere = request.method == "GET" and cross_site(
            request.headers, scheme=request.url.scheme, host=request.headers.get("host", "")
        )
        return self.render(
            request, "login.html", None, status, problem=problem, next_page=next_page, offer_next=elsewhere
        )

    async def login(self, request: Request) -> Response:
        fields = await self.form(request, None, MAX_SIGN_IN_BYTES)
        next_page = _local(fields.get("next"))
        try:
            grant = self.guard.check(fields.get("token", "").strip(), request)
        except Throttled as error:
            return self.slow_down(request, error, next_page)
        if grant is None:
            return self.login_form(request, 401, problem="That token is not valid.", next_page=next_page)
        return self.signed_in(request, grant, next_page)

    async def logout(self, request: Request) -> Response:
        viewer = self.viewer(request)
        await self.form(request, viewer)
        answer = RedirectResponse("/login", status_code=303)
        self.guard.sign_out(request, answer)
        return answer

    # Errors ---------------------------------------------------------------------------------
    async def sign_in(self, request: Request, exc: Exception) -> Response:
        problem = exc.problem if isinstance(exc, _SignIn) else ""
        if _wants_html(request):
            answer = self.login_form(request, 401, problem=problem, next_page=_back(request))
        else:
            answer = PlainTextResponse("sign in: send Authorization: Bearer TOKEN", status_code=401)
        answer.headers["www-authenticate"] = "Bearer"
        return answer

    async def token_in_address(self, request: Request, exc: Exception) -> Response:
        """Trade a ``?token=`` for a session, if the person opened the address; then drop it from the address."""
        assert isinstance(exc, _TokenInAddress)
        rest = [(k, v) for k, v in request.query_params.multi_items() if k != TOKEN_PARAM]
        here = request.url.path + (f"?{urlencode(rest)}" if rest else "")
        if cross_site(request.headers, scheme=request.url.scheme, host=request.headers.get("host", "")):
            return self.login_form(request, 403, problem=FROM_ELSEWHERE, next_page=_local(here))
        try:
            grant = self.guard.check(exc.token, request)
            current = self.guard.viewer(request)
        except Throttled as error:
            return self.slow_down(request, error, _local(here))
        if grant is None:
            return await self.sign_in(request, _SignIn("The token in that address is not valid."))
        if current is None or current.session is None:
            return self.signed_in(request, grant, here)
        if current.grant != grant:  # another token's session is open: it stays, until its holder signs out
            message = (
                f"You are signed in as {_who(current.grant)}; this address signs in as {_who(grant)}. "
                "To switch, sign out first, then open the address again."
            )
            return self.render(
                request, "error.html", current, 409, title="Already signed in", message=message, waiting=0
            )
        return RedirectResponse(here, status_code=303)

    def signed_in(self, request: Request, grant: Grant, to: str) -> Response:
        """Go to ``to`` with a new session's cookie set (see :func:`~tether.surfaces.web.guard.cookie_name`)."""
        answer = RedirectResponse(to, status_code=303)
        self.guard.sign_in(request, answer, grant)
        return answer

    async def throttled(self, request: Request, exc: Exception) -> Response:
        assert isinstance(exc, Throttled)
        return self.slow_down(request, exc, _back(request))

    def slow_down(self, request: Request, exc: Throttled, next_page: str) -> Response:
        """429: the address sent too many wrong tokens; it may try again after ``Retry-After`` seconds."""
        seconds = "1 second" if exc.wait == 1 else f"{exc.wait} seconds"
        message = f"Too many wrong tokens from your address: wait {seconds}, then try again."
        if _wants_html(request):
            answer = self.login_form(request, 429, problem=message, next_page=next_page)
        else:
            answer = PlainTextResponse(message, status_code=429)
        answer.headers["retry-after"] = str(exc.wait)
        return answer

    async def refused(self, request: Request, exc: Exception) -> Response:
        assert isinstance(exc, _Refused)
        return self.render(request, "error.html", None, exc.status, title="Refused", message=exc.message)

    async def not_found(self, request: Request, exc: Exception) -> Response:
        message = str(exc) if isinstance(exc, RunNotFound) else "There is no such page."
        if not _wants_html(request):
            return PlainTextResponse(message, status_code=404)
        return self.render(request, "error.html", None, 404, title="Not found", message=message)

    async def failed(self, request: Request, exc: Exception) -> Response:
        log.error("tether ui: %s failed: %s", request.url.path, exc, exc_info=exc)
        message = f"{type(exc).__name__}: {exc}"
        return self.render(request, "error.html", None, 500, title="Something went wrong", message=message)


def create_app(
    store: Store,
    credentials: Credentials,
    *,
    resume: Resume | None = None,
    agent: Agent | AgentFor | None = None,
    max_wait: float = 5.0,
    poll: float = 0.5,
    telemetry: Telemetry | None = None,
    session_idle: float = sessions.IDLE,
    session_lifetime: float = sessions.LIFETIME,
    allowed_hosts: Iterable[str] | None = None,
) -> Starlette:
    """The inspector's ASGI app.

    Args:
        store: where the runs are; the inspector only reads it, and records decisions through
            :meth:`tether.Runner.decide`.
        credentials: the tokens that let people in, each bound to the tenant it shows (or None:
            every tenant's).
        resume: drives a run on once its decisions are made; default: in this process, in
            background threads (:class:`~tether.surfaces.web.decisions.InProcess`), sleeping at
            most ``max_wait`` seconds for a tool retry. Pass a function that queues the run to
            your worker instead where one is configured.
        agent: the agent of the runs shown (or a function making it from a run's spec), to check
            approvals and drive runs on; default: rebuilt from each run's record, as ``tether
            resume`` does. A service whose runs were started in Python passes its own: their
            records name no tools module (without it, their approvals are refused with that
            reason, and their denials recorded for the service to resume).
        max_wait: seconds the default resume sleeps for a tool retry before parking the run.
        poll: seconds between the live streams' reads of the store.
        telemetry: traces the decisions, forks and drives made here (see :mod:`tether.drivers.otel`).
        session_idle: seconds a browser's session lasts without a person's request (30 minutes).
        session_lifetime: seconds a session lasts at most, however busy (8 hours).
        allowed_hosts: the host names requests may be addressed to (others are refused, against DNS
            rebinding); None: any, for an app whose server or proxy checks them.

    Raises:
        ConfigError: a session time that is not positive.
    """
    in_process = InProcess(store, max_wait=max_wait, agent=agent, telemetry=telemetry) if resume is None else None
    decider = Decider(store, resume or in_process or _never, agent=agent, telemetry=telemetry)
    guard = Guard(credentials, sessions=sessions.Sessions(idle=session_idle, lifetime=session_lifetime))
    inspector = _Inspector(store, guard, decider, poll=poll)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        if in_process is not None:
            await run_in_threadpool(in_process.close)

    routes = [
        Route("/", inspector.runs),
        Route("/inbox", inspector.inbox),
        Route("/live", inspector.list_live),
        Route("/runs/{run_id}", inspector.run),
        Route("/runs/{run_id}/diagram.svg", inspector.diagram_svg),
        Route("/runs/{run_id}/live", inspector.run_live),
        Route("/decide", inspector.decide, methods=["POST"]),
        Route("/fork", inspector.fork, methods=["POST"]),
        Route("/control", inspector.control, methods=["POST"]),
        Route("/login", inspector.login_page, methods=["GET"]),
        Route("/login", inspector.login, methods=["POST"]),
        Route("/logout", inspector.logout, methods=["POST"]),
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
    ]
    handlers: dict[Any, Any] = {
        _SignIn: inspector.sign_in,
        _TokenInAddress: inspector.token_in_address,
        Throttled: inspector.throttled,
        _Refused: inspector.refused,
        RunNotFound: inspector.not_found,
        404: inspector.not_found,
        TetherError: inspector.failed,
    }
    middleware = [Middleware(SecurityHeaders)]
    if allowed_hosts is not None:
        middleware.append(Middleware(AllowedHosts, hosts=allowed_hosts))
    return Starlette(routes=routes, exception_handlers=handlers, middleware=middleware, lifespan=lifespan)


_STATUS: dict[type[Exception], int] = {BadForm: 422, InvalidEditedInput: 422, UnknownCall: 404}
"""The status of a refused decision's page; any other refusal is a conflict (409)."""


def _page_of(next_page: str, run_id: str) -> str | None:
    """The run whose page a decision form came from (its ``next``: a parent's page shows its child's calls).

    None: the inbox. Anything else than those two is the decided run's own page.
    """
    if next_page == INBOX:
        return None
    found = re.fullmatch(r"/runs/([^/?#]+)", next_page)
    return unquote(found.group(1)) if found else run_id


def _decided(run_id: str, call_ids: str, page: str | None) -> Response:
    """Back to the page the form came from, saying what was decided (and, in the inbox, in which run)."""
    back = INBOX if page is None else f"/runs/{quote(page, safe='')}"
    where = {"decided": call_ids, **({"run": run_id} if page is None else {})}
    return RedirectResponse(f"{back}?{urlencode(where)}", status_code=303)


def _status_of(refusal: Exception) -> int:
    return next((status for kind, status in _STATUS.items() if isinstance(refusal, kind)), 409)


@dataclass(frozen=True)
class _Problem:
    """A refused decision: shown beside its call's form, or atop the page when no card there shows that call."""

    run: str | None = None
    call: str | None = None
    error: str | None = None
    draft: dict[str, str] | None = None
    """The refused form as posted, shown again in its fields."""
    fields: dict[str, str] = field(default_factory=dict)
    """The problems by the input's field."""

    def on_a_card(self, turns: Iterable[Turn]) -> bool:
        """Whether one of these turns' cards shows the refused call (then the error shows beside its form)."""
        return any(card.call.run_id == self.run and card.call.call_id == self.call for t in turns for card in t.cards)


def _never(run_id: str, tenant: str | None) -> None:  # pragma: no cover - create_app always has one
    raise AssertionError("no resume configured")


def _templates() -> jinja2.Environment:
    """Autoescaping on for every template: what a model or a tool wrote is always text."""
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(HERE / "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        finalize=_shown,
    )
    env.filters["when"] = _when
    env.filters["iso"] = _iso
    env.globals["zone"] = _zone()
    env.filters["clock"] = lambda at: time.strftime("%H:%M:%S", time.localtime(at)) + f".{int(at * 1000) % 1000:03d}"
    env.filters["pretty"] = pages.pretty
    env.filters["seconds"] = lambda value: "" if value is None else f"{value:.3f} s"
    env.filters["usd"] = lambda value: "unknown" if value is None else f"${value:.6f}"
    env.filters["segment"] = lambda value: quote(str(value), safe="")
    env.filters["markdown"] = markdown
    env.globals["fields_of"] = fields_of
    env.globals["question"] = question
    env.globals["posted_fields"] = lambda posted: any(name.startswith(KIND) for name in posted)
    return env


def _shown(value: Any) -> Any:
    """Every text a page shows, with control and invisible characters as their JSON escapes (not markup: a macro's)."""
    return printable(value) if isinstance(value, str) and not isinstance(value, Markup) else value


def _when(at: float | None) -> str:
    """A moment as people read it, with its time zone (the server's): ``2026-11-28 14:03:22 CET``."""
    return time.strftime("%Y-%m-%d %H:%M:%S ", time.localtime(at)) + _zone(at) if at else ""


def _iso(at: float | None) -> str:
    """A moment as a machine reads it (an HTML ``<time datetime>``), with its UTC offset."""
    return datetime.datetime.fromtimestamp(at).astimezone().isoformat(timespec="milliseconds") if at else ""


def _zone(at: float | None = None) -> str:
    """The server's time zone at ``at`` (now by default): its name, else its UTC offset (``+01:00``)."""
    moment = time.localtime(at)
    name = time.strftime("%Z", moment)
    if name.isalpha():
        return name
    offset = time.strftime("%z", moment)
    return f"UTC{offset[:3]}:{offset[3:]}"


def _by_field(error: Exception) -> dict[str, str]:
    """A refused edit's problems by the input's field, where it says them so."""
    if isinstance(error, BadFields):
        return error.problems
    if isinstance(error, InvalidEditedInput):
        return error.by_field
    return {}


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def _wants_html(request: Request) -> bool:
    return "text/html" in request.headers.get("accept", "") or request.method == "POST"


async def _body(request: Request, limit: int) -> bytes:
    """The request's body, refused (413) once past ``limit`` bytes, as declared or as it arrives (chunked)."""
    refused = _Refused(413, f"refused: this form may hold at most {limit} bytes")
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise refused
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise refused
    return bytes(body)


def _local(page: str | None) -> str:
    """``page`` if it is a path of this server, else ``/``: a sign-in never sends anyone to another site."""
    if not page or not page.startswith("/") or page.startswith(("//", "/\\")):
        return "/"
    return page


def _back(request: Request) -> str:
    """Where signing in leads back to: the page asked for, or for a form the page that sent it (``Referer``)."""
    if request.method == "GET":
        return _local(request.url.path + (f"?{request.url.query}" if request.url.query else ""))
    sender = urlsplit(request.headers.get("referer") or "")
    if sender.netloc != request.headers.get("host"):
        return "/"
    return _local(sender.path + (f"?{sender.query}" if sender.query else ""))


def _who(grant: Grant) -> str:
    if grant.name is not None:
        return grant.name
    return f"tenant {grant.tenant}'s token" if grant.tenant is not None else "an operator's token"


__all__ = ["create_app"]
