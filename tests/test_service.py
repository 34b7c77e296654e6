"""The example service over real HTTP: uvicorn on 127.0.0.1 in a thread, urllib as the client.

Runs use the demo's tools and offline scripted model; the store is SQLite, as a deployment
with several workers would share it. Covers parking, per-tenant listing and isolation,
approving with edited input, denying, refusals (409/422/404/400) and racing decisions.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("starlette", reason="the service example needs the 'service' extra: pip install -e '.[service]'")
uvicorn = pytest.importorskip(
    "uvicorn", reason="the service example needs the 'service' extra: pip install -e '.[service]'"
)

from support import serving_app  # noqa: E402 - after the skip: the service module needs the extra
from tether import Agent, RetryPolicy, tool  # noqa: E402
from tether.core.approvals import fingerprint  # noqa: E402
from tether.errors import ConfigError  # noqa: E402
from tether.examples.service import create_app  # noqa: E402
from tether.models.scripted import ScriptedModel  # noqa: E402
from tether.policy.access import Credentials  # noqa: E402
from tether.stores.sql import AsyncSQLStore, SQLStore  # noqa: E402

FIBONACCI = "0 1 1 2 3 5 8 13 21 34"
NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback only, whatever the env says
TOKENS = {"acme": "acme-token-0123456789", "globex": "globex-token-0123456789"}
"""Each tenant's credential: the service reads the tenant from it, never from a header."""
CREDENTIALS = Credentials({token: tenant for tenant, token in TOKENS.items()})


@dataclass
class Reply:
    status: int
    body: Any
    headers: dict[str, str]


@dataclass
class Service:
    base: str
    store: SQLStore
    workspace: Path

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        tenant: str | None = "acme",
        raw: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> Reply:
        """A request with ``tenant``'s token (None: no credential), plus any ``headers``."""
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        headers = {"Content-Type": "application/json", **(headers or {})}
        if tenant is not None:
            headers["Authorization"] = f"Bearer {TOKENS[tenant]}"
        request = urllib.request.Request(self.base + path, data=data, method=method, headers=headers)
        try:
            with NO_PROXY.open(request, timeout=30) as response:
                return Reply(response.status, json.loads(response.read()), dict(response.headers))
        except urllib.error.HTTPError as error:
            return Reply(error.code, json.loads(error.read()), dict(error.headers))

    def park(self, tenant: str = "acme") -> dict[str, Any]:
        """Start a demo run; it writes fib.py, then parks before running it."""
        reply = self.request("POST", "/runs", {"prompt": "Write and run fib.py."}, tenant=tenant)
        assert reply.status == 201, reply
        assert reply.body["status"] == "awaiting_approval", reply
        assert reply.headers["location"] == f"/runs/{reply.body['run_id']}"
        return dict(reply.body)

    def decide(self, run_id: str, body: dict[str, Any], *, tenant: str = "acme", call_id: str = "") -> Reply:
        return self.request("POST", f"/runs/{run_id}/approvals/{call_id or 'toolu_demo_run'}", body, tenant=tenant)


@contextlib.contextmanager
def serving(app: Any, store: SQLStore, workspace: Path) -> Iterator[Service]:
    """``app`` on uvicorn at a free loopback port, in a thread, until the block ends."""
    with serving_app(app) as url:
        yield Service(url, store, workspace)


@pytest.fixture
def service(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Service]:
    workspace = tmp_path / "workspace"
    monkeypatch.setenv("TETHER_DEMO_WORKSPACE", str(workspace))
    url = f"sqlite:///{tmp_path / 'service.db'}"
    store = SQLStore(url)  # the test reads what the service wrote through its own AsyncSQLStore
    try:
        with serving(create_app(store=AsyncSQLStore(url), credentials=CREDENTIALS), store, workspace) as running:
            yield running
    finally:
        store.close()


def test_run_parks_lists_per_tenant_then_approve_with_edited_input_finishes(service: Service) -> None:
    run = service.park()
    [call] = run["pending_approvals"]
    assert (call["call_id"], call["tool"], call["input"]) == ("toolu_demo_run", "run_python", {"path": "fib.py"})

    listed = service.request("GET", "/approvals")
    assert listed.status == 200
    [pending] = listed.body["pending"]
    assert (pending["run_id"], pending["call_id"], pending["tenant"]) == (run["run_id"], "toolu_demo_run", "acme")
    assert pending["fingerprint"] == fingerprint({"path": "fib.py"})
    assert service.request("GET", "/approvals?tenant=acme").body == listed.body
    assert service.request("GET", f"/approvals?run_id={run['run_id']}").body == listed.body

    # Another tenant sees nothing, cannot read the run, and cannot decide it.
    assert service.request("GET", "/approvals", tenant="globex").body == {"pending": []}
    hidden = service.request("GET", f"/runs/{run['run_id']}", tenant="globex")
    assert (hidden.status, hidden.body["error"]["code"]) == (404, "run_not_found")
    assert service.request("GET", f"/approvals?run_id={run['run_id']}", tenant="globex").status == 404
    assert service.decide(run["run_id"], {"approve": True}, tenant="globex").status == 404
    assert service.request("GET", "/approvals?tenant=acme", tenant="globex").status == 403

    # Approve, but run another program than the one the model asked for.
    (service.workspace / "other.py").write_text("print('edited input ran')\n", encoding="utf-8")
    decided = service.decide(
        run["run_id"],
        {"approve": True, "input": {"path": "other.py"}, "actor": "alice", "fingerprint": pending["fingerprint"]},
    )
    assert decided.status == 200, decided
    assert decided.body["status"] == "done"
    assert decided.body["output"] == "fib.py ran (exit code 0) and printed: edited input ran"
    assert decided.body["pending_approvals"] == []

    fetched = service.request("GET", f"/runs/{run['run_id']}")
    assert fetched.status == 200
    assert fetched.body == decided.body  # every response is the run's row
    assert {"run_id", "status", "output", "steps", "tool_calls", "usage", "pending_approvals"} <= set(fetched.body)
    assert service.request("GET", "/approvals").body == {"pending": []}


def test_approve_as_asked(service: Service) -> None:
    run = service.park()
    decided = service.decide(run["run_id"], {"approve": True})
    assert decided.status == 200, decided
    assert decided.body["output"] == f"fib.py ran (exit code 0) and printed: {FIBONACCI}"
    assert decided.body["tool_calls"] == 2


def test_deny_tells_the_model_why(service: Service) -> None:
    run = service.park()
    decided = service.decide(run["run_id"], {"approve": False, "reason": "no code today", "actor": "bob"})
    assert decided.status == 200, decided
    assert decided.body["status"] == "done"
    assert decided.body["output"].startswith("I did not get to run the program")
    assert "no code today" in decided.body["output"]
    assert decided.body["tool_calls"] == 1  # fib.py was written, never run


def test_a_second_decision_is_a_conflict(service: Service) -> None:
    run = service.park()
    assert service.decide(run["run_id"], {"approve": True}).status == 200
    again = service.decide(run["run_id"], {"approve": False})
    assert again.status == 409
    assert again.body["error"]["code"] == "decision_refused"
    assert "was already decided (approved by api (acme))" in again.body["error"]["message"]
    assert service.request("GET", f"/runs/{run['run_id']}").body["status"] == "done"


def test_approve_for_the_rest_of_the_run(service: Service) -> None:
    run = service.park()
    decided = service.decide(run["run_id"], {"approve": True, "remember_for_run": True, "actor": "alice"})
    assert decided.status == 200, decided
    assert decided.body["status"] == "done"
    [event] = [e for e in service.store.load_events(run["run_id"], tenant="acme") if e.type == "approval_decided"]
    assert (event.data["remember_for_run"], event.data["actor"]) == (True, "alice")


def test_a_stale_fingerprint_is_a_conflict_and_changes_nothing(service: Service) -> None:
    run = service.park()
    refused = service.decide(run["run_id"], {"approve": True, "fingerprint": "0123456789abcdef"})
    assert refused.status == 409
    assert refused.body["error"]["code"] == "decision_refused"
    assert "fingerprint" in refused.body["error"]["message"]
    assert len(service.request("GET", "/approvals").body["pending"]) == 1
    assert (
        service.decide(run["run_id"], {"approve": True, "fingerprint": fingerprint({"path": "fib.py"})}).status == 200
    )


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ({"approve": True, "input": {}}, "invalid_input"),  # path is required
        ({"approve": True, "input": {"path": 7}}, "invalid_input"),
        ({"approve": True, "input": ["fib.py"]}, "invalid_body"),
        ({"approve": "yes"}, "invalid_body"),
        ({"reason": "approve missing"}, "invalid_body"),
        ({"approve": False, "input": {"path": "fib.py"}}, "invalid_body"),
        ({"approve": False, "remember_for_run": True}, "invalid_body"),
        ({"approve": True, "remember_for_run": "yes"}, "invalid_body"),
    ],
)
def test_invalid_decisions_are_422_and_leave_the_call_pending(
    service: Service, body: dict[str, Any], code: str
) -> None:
    run = service.park()
    refused = service.decide(run["run_id"], body)
    assert (refused.status, refused.body["error"]["code"]) == (422, code), refused
    assert len(service.request("GET", "/approvals").body["pending"]) == 1


def test_unknown_run_call_and_route_are_404(service: Service) -> None:
    run = service.park()
    assert service.request("GET", "/runs/run_nope").status == 404
    assert service.decide("run_nope", {"approve": True}).status == 404
    unknown_call = service.decide(run["run_id"], {"approve": True}, call_id="toolu_nope")
    assert (unknown_call.status, unknown_call.body["error"]["code"]) == (404, "call_not_found")
    decided_call = service.decide(run["run_id"], {"approve": True}, call_id="toolu_demo_write")  # never gated
    assert (decided_call.status, decided_call.body["error"]["code"]) == (409, "not_pending")
    assert service.request("GET", "/nowhere").body["error"]["code"] == "not_found"


def test_requests_with_a_bad_body_are_400(service: Service) -> None:
    assert service.request("POST", "/runs", raw=b"{not json").status == 400
    assert service.request("POST", "/runs", ["a list"]).status == 400
    assert service.request("POST", "/runs", {"prompt": ""}).status == 422
    assert service.request("POST", "/runs", {}).status == 422


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"X-Tenant": "acme"},  # naming a tenant is no credential
        {"Authorization": "Bearer not-a-known-token-at-all"},
        {"Authorization": f"Basic {TOKENS['acme']}"},
    ],
)
def test_a_request_without_a_valid_token_is_401_and_does_nothing(service: Service, headers: dict[str, str]) -> None:
    run = service.park()
    for method, path, body in [
        ("GET", "/approvals", None),
        ("GET", f"/runs/{run['run_id']}", None),
        ("POST", "/runs", {"prompt": "Go."}),
        ("POST", f"/runs/{run['run_id']}/approvals/toolu_demo_run", {"approve": True}),
        ("POST", f"/runs/{run['run_id']}/resume", None),
    ]:
        refused = service.request(method, path, body, tenant=None, headers=headers)
        assert (refused.status, refused.body["error"]["code"]) == (401, "unauthorized"), (method, path)
        assert refused.headers["www-authenticate"] == "Bearer"
    assert len(service.store.list_runs()) == 1
    assert service.request("GET", f"/runs/{run['run_id']}").body["status"] == "awaiting_approval"


def test_the_tenant_comes_from_the_token_not_from_a_header(service: Service) -> None:
    run = service.park(tenant="acme")
    as_globex = {"X-Tenant": "acme"}  # globex's token, claiming to be acme: the header is not read
    listed = service.request("GET", "/approvals", tenant="globex", headers=as_globex)
    assert listed.body == {"pending": []}
    assert service.request("GET", f"/runs/{run['run_id']}", tenant="globex", headers=as_globex).status == 404
    assert service.decide(run["run_id"], {"approve": True}, tenant="globex").status == 404
    started = service.request("POST", "/runs", {"prompt": "Go.", "wait": False}, tenant="globex", headers=as_globex)
    assert service.store.load_run(started.body["run_id"]).tenant == "globex"


def test_every_service_token_names_a_tenant(tmp_path: Path) -> None:
    store = SQLStore(f"sqlite:///{tmp_path / 'service.db'}")
    try:
        with pytest.raises(ConfigError, match="every token must name a tenant"):
            create_app(store=store, credentials=Credentials({"operator-token-0123456789": None}))
    finally:
        store.close()


def test_background_drive_parks_the_run(service: Service) -> None:
    started = service.request("POST", "/runs", {"prompt": "Go.", "wait": False})
    assert started.status == 202, started
    assert started.headers["location"] == f"/runs/{started.body['run_id']}"
    deadline = time.monotonic() + 20
    status = started.body["status"]
    while status != "awaiting_approval":
        assert time.monotonic() < deadline, f"the run never parked (status {status})"
        time.sleep(0.05)
        status = service.request("GET", f"/runs/{started.body['run_id']}").body["status"]
    assert [p["run_id"] for p in service.request("GET", "/approvals").body["pending"]] == [started.body["run_id"]]


@pytest.mark.parametrize("round_", range(3))
def test_racing_decisions_exactly_one_wins(service: Service, round_: int) -> None:
    run = service.park()
    barrier = threading.Barrier(2)
    replies: list[Reply] = []
    lock = threading.Lock()

    def decide(approve: bool) -> None:
        barrier.wait(timeout=10)
        reply = service.decide(run["run_id"], {"approve": approve, "reason": "racing"})
        with lock:
            replies.append(reply)

    threads = [threading.Thread(target=decide, args=(approve,)) for approve in (True, False)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert sorted(r.status for r in replies) == [200, 409], replies
    [winner] = [r for r in replies if r.status == 200]
    [loser] = [r for r in replies if r.status == 409]
    # Lost at the service's check, the engine's, or the store's version check: all the same to a client.
    assert loser.body["error"]["code"] in {"not_pending", "decision_refused", "stale_run"}
    assert winner.body["status"] == "done"
    final = service.request("GET", f"/runs/{run['run_id']}").body
    assert final["output"] == winner.body["output"]


def test_a_retry_due_later_parks_the_run_and_resume_finishes_it(tmp_path: Path) -> None:
    """A request does not sleep for a distant retry: the run answers waiting_retry, then resumes."""
    attempts: list[int] = []

    @tool(retry=RetryPolicy(max_attempts=2, initial_delay=0.3))
    def fetch(key: str) -> str:
        """Fetch a value; the first attempt fails."""
        attempts.append(1)
        if len(attempts) == 1:
            raise ConnectionError("upstream reset")
        return f"value of {key}"

    script = [
        {
            "content": [{"type": "tool_use", "id": "toolu_f", "name": "fetch", "input": {"key": "k"}}],
            "stop_reason": "tool_use",
        },
        {"content": [{"type": "text", "text": "Got it."}], "stop_reason": "end_turn"},
    ]
    store = SQLStore(f"sqlite:///{tmp_path / 'service.db'}")
    agent = Agent(model=ScriptedModel(script), tools=[fetch])
    app = create_app(lambda tenant: agent, store=store, max_wait=0, credentials=CREDENTIALS)
    try:
        with serving(app, store, tmp_path) as running:
            started = running.request("POST", "/runs", {"prompt": "fetch k"})
            assert started.status == 201, started
            assert started.body["status"] == "waiting_retry"
            assert started.body["next_due_at"] > time.time() - 1
            assert attempts == [1]
            run_id = started.body["run_id"]
            assert running.request("GET", f"/runs/{run_id}").body["status"] == "waiting_retry"

            early = running.request("POST", f"/runs/{run_id}/resume")  # not due yet: parks again
            assert (early.status, early.body["status"]) == (200, "waiting_retry")
            time.sleep(max(0.0, started.body["next_due_at"] - time.time()) + 0.05)
            done = running.request("POST", f"/runs/{run_id}/resume")
            assert (done.status, done.body["status"], done.body["output"]) == (200, "done", "Got it.")
            assert attempts == [1, 1]
            assert running.request("POST", "/runs/run_nope/resume").status == 404
    finally:
        store.close()


def test_the_service_will_not_start_without_tokens(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from tether.examples.service import main

    monkeypatch.delenv("TETHER_SERVICE_TOKENS", raising=False)
    with pytest.raises(SystemExit) as stopped:
        main(["--db", f"sqlite:///{tmp_path / 'service.db'}"])
    assert stopped.value.code == 2
    assert "--tokens FILE" in capsys.readouterr().err


def test_runs_are_driven_on_the_server_s_event_loop_not_in_a_thread_pool(tmp_path: Path) -> None:
    seen: list[str] = []

    class LoopModel(ScriptedModel):
        async def acomplete(self, request: Any) -> Any:
            asyncio.get_running_loop()  # awaited on a loop: raises if called from a worker thread
            seen.append(threading.current_thread().name)
            return self.complete(request)

    @tool
    async def lookup(key: str) -> str:
        """Look a key up."""
        seen.append(threading.current_thread().name)
        return f"value of {key}"

    script = [
        {
            "content": [{"type": "tool_use", "id": "t1", "name": "lookup", "input": {"key": "k"}}],
            "stop_reason": "tool_use",
        },
        {"content": [{"type": "text", "text": "Found."}], "stop_reason": "end_turn"},
    ]
    url = f"sqlite:///{tmp_path / 'service.db'}"
    app = create_app(
        lambda tenant: Agent(model=LoopModel(script), tools=[lookup]), store=AsyncSQLStore(url), credentials=CREDENTIALS
    )
    reader = SQLStore(url)
    try:
        with serving(app, reader, tmp_path) as running:
            reply = running.request("POST", "/runs", {"prompt": "look k up"})
    finally:
        reader.close()
    assert (reply.status, reply.body["status"], reply.body["output"]) == (201, "done", "Found.")
    assert seen == ["uvicorn"] * 3  # the model twice and the tool, all on the server's one thread
