"""The example service's event stream over real HTTP: server-sent events honouring Last-Event-ID.

uvicorn serves the app on 127.0.0.1 in a thread and urllib reads the stream line by line, as
any SSE client would. The run is driven by the service in the background (``wait: false``); its
tool holds each call until the test lets it go, so the client can leave mid-run and come back.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.client import HTTPResponse
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("starlette", reason="the service example needs the 'service' extra: pip install -e '.[service]'")
pytest.importorskip("uvicorn", reason="the service example needs the 'service' extra: pip install -e '.[service]'")

from support import serving_app, tool_use, tool_use_turn
from tether import Agent, tool
from tether.examples.service import create_app
from tether.facts.stream import stream_event
from tether.models import ModelRequest, ModelResponse, TextListener
from tether.policy.access import Credentials
from tether.stores.sql import SQLStore
from tether.testing import ScriptedModel

NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))
TOKENS = {"acme": "acme-token-0123456789", "globex": "globex-token-0123456789"}
STEPS = 3
SCRIPT = [
    *(tool_use_turn(tool_use(f"toolu_{n}", "step", {"n": n})) for n in range(STEPS)),
    {"content": [{"type": "text", "text": "All three done."}], "stop_reason": "end_turn"},
]


class Work:
    """The agent's model and tool, each held by the test: a call runs once let go, the answer's text in two pieces."""

    def __init__(self) -> None:
        self.calls = threading.Semaphore(0)
        self.text = threading.Event()
        self.script = ScriptedModel(SCRIPT)

    def agent(self, tenant: str) -> Agent:
        @tool
        def step(n: int) -> str:
            """One step of the work."""
            assert self.calls.acquire(timeout=30)
            return f"step {n} done"

        return Agent(model=self, tools=[step])

    def complete(self, request: ModelRequest) -> ModelResponse:
        return self.script.complete(request)

    async def astream(self, request: ModelRequest, on_text: TextListener) -> ModelResponse:
        response = self.script.complete(request)
        if response.stop_reason == "end_turn":
            on_text("All three")
            assert await asyncio.to_thread(self.text.wait, 30)
            on_text(" done.")
        return response


@dataclass
class Sse:
    """One server-sent event as read off the wire."""

    event: str
    data: dict[str, Any]
    id: int | None = None


@dataclass
class Service:
    base: str
    store: SQLStore
    work: Work
    streams: list[HTTPResponse] = field(default_factory=list)

    def request(self, method: str, path: str, body: Any = None, *, tenant: str = "acme") -> tuple[int, Any]:
        headers = {"Content-Type": "application/json", "Authorization": f"Bearer {TOKENS[tenant]}"}
        data = json.dumps(body).encode() if body is not None else None
        try:
            with NO_PROXY.open(urllib.request.Request(self.base + path, data, headers, method=method)) as response:
                raw = response.read()
                return response.status, json.loads(raw) if raw else None
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read())

    def events(self, run_id: str, *, last: int | None = None, tenant: str = "acme") -> HTTPResponse:
        headers = {"Authorization": f"Bearer {TOKENS[tenant]}", "Accept": "text/event-stream"}
        if last is not None:
            headers["Last-Event-ID"] = str(last)
        response: HTTPResponse = NO_PROXY.open(
            urllib.request.Request(f"{self.base}/runs/{run_id}/events", headers=headers)
        )
        self.streams.append(response)
        assert response.headers["content-type"].startswith("text/event-stream")
        return response


def read(response: HTTPResponse) -> Iterator[Sse]:
    """The events of a stream, as they arrive, until the server closes it (comments skipped)."""
    fields: dict[str, str] = {}
    for raw in response:
        line = raw.decode().rstrip("\n")
        if line.startswith(":"):
            continue
        if line:
            name, _, value = line.partition(": ")
            fields[name] = value
            continue
        if fields:
            yield Sse(fields["event"], json.loads(fields["data"]), int(fields["id"]) if "id" in fields else None)
        fields = {}


@pytest.fixture
def service(tmp_path: Path) -> Iterator[Service]:
    url = f"sqlite:///{tmp_path / 'service.db'}"
    store = SQLStore(url)
    work = Work()
    credentials = Credentials({token: tenant for tenant, token in TOKENS.items()})
    app = create_app(work.agent, SQLStore(url), credentials=credentials, poll=0.05)
    with serving_app(app) as base:
        running = Service(base, store, work)
        yield running
        for _ in range(STEPS):  # whatever the test left held goes on, so the server can stop
            work.calls.release()
        work.text.set()
        for response in running.streams:
            response.close()
    store.close()


def stored_cursors(store: SQLStore, run_id: str) -> list[int]:
    return [event.seq for event in store.load_events(run_id) if stream_event(run_id, event) is not None]


def test_a_client_that_reconnects_with_last_event_id_misses_nothing_and_sees_nothing_twice(service: Service) -> None:
    status, run = service.request("POST", "/runs", {"prompt": "work", "wait": False})
    assert status == 202
    run_id = run["run_id"]

    first: list[Sse] = []
    stream = service.events(run_id)
    for sse in read(stream):
        first.append(sse)
        if sse.event == "tool_call_started":
            break
    stream.close()  # gone mid-run, while the first call is held

    for _ in range(2):  # meanwhile two calls finish and the third starts
        service.work.calls.release()
    deadline = time.monotonic() + 30
    while sum(e.type == "tool_started" for e in service.store.load_events(run_id)) < STEPS:
        assert time.monotonic() < deadline, "the run did not go on"
        time.sleep(0.05)

    last = first[-1].id
    assert last is not None
    second: list[Sse] = []
    for sse in read(service.events(run_id, last=last)):
        second.append(sse)
        if sse.event == "tool_call_started":
            service.work.calls.release()
        if sse.event == "text_delta":
            service.work.text.set()  # the first piece came while the model was still writing

    together = [sse.id for sse in first + second if sse.id is not None]
    assert together == stored_cursors(service.store, run_id)  # nothing missed, nothing twice, in order
    assert all(sse.data["cursor"] == sse.id for sse in first + second if sse.id is not None)
    deltas = [sse for sse in second if sse.event == "text_delta"]
    assert [(sse.id, sse.data["text"]) for sse in deltas] == [(None, "All three"), (None, " done.")]  # no id: live
    answered = next(i for i, sse in enumerate(second) if sse.event == "model_step_done" and sse.data["text"])
    assert second.index(deltas[-1]) < answered
    assert second[-1].event == "run_ended"
    assert second[-1].data["status"] == "done"

    # Asked again after the end, the answer is 204: an EventSource stops reconnecting.
    request = urllib.request.Request(
        f"{service.base}/runs/{run_id}/events",
        headers={"Authorization": f"Bearer {TOKENS['acme']}", "Last-Event-ID": str(second[-1].id)},
    )
    with NO_PROXY.open(request) as ended:
        assert ended.status == 204


def test_a_finished_run_streams_whole_from_the_start(service: Service) -> None:
    for _ in range(STEPS):
        service.work.calls.release()
    service.work.text.set()
    status, run = service.request("POST", "/runs", {"prompt": "work"})
    assert (status, run["status"]) == (201, "done")
    replayed = list(read(service.events(run["run_id"])))
    assert [sse.id for sse in replayed] == stored_cursors(service.store, run["run_id"])
    assert [sse.event for sse in replayed][-2:] == ["status_changed", "run_ended"]


def test_another_tenant_s_run_a_bad_cursor_and_an_unknown_one_are_refused(service: Service) -> None:
    for _ in range(STEPS):
        service.work.calls.release()
    service.work.text.set()
    _, run = service.request("POST", "/runs", {"prompt": "work"})
    path = f"/runs/{run['run_id']}/events"
    status, body = service.request("GET", path, tenant="globex")
    assert (status, body["error"]["code"]) == (404, "run_not_found")
    status, body = service.request("GET", f"{path}?after=abc")
    assert (status, body["error"]["code"]) == (400, "invalid_cursor")
    status, body = service.request("GET", f"{path}?after=999")
    assert (status, body["error"]["code"]) == (400, "unknown_cursor")
    assert "has no event 999" in body["error"]["message"]
