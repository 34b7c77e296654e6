"""Per-tool retries: backoff, exhaustion policies, timeouts, classification, durable schedules."""

from __future__ import annotations

import json
import random
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import httpx2
import pytest

from support import Cli, CliResult, clean_env, closed_port, flat, run_python
from tether import Agent, Approve, AsyncRunner, Deny, RetryPolicy, Runner, Tool, tool
from tether.errors import RunNotFound, StoreError
from tether.execution.faults import classify
from tether.stores import RunRecord
from tether.stores.memory import MemoryStore
from tether.stores.sql import SQLStore
from tether.testing import ScriptedModel
from tether.tools import ModelRetry, OutcomeUnknown


def use(call_id: str, name: str, arguments: dict[str, object] | None = None) -> dict[str, Any]:
    return {
        "content": [{"type": "tool_use", "id": call_id, "name": name, "input": arguments or {}}],
        "stop_reason": "tool_use",
    }


def answer(text: str = "ok") -> dict[str, Any]:
    return {"content": [{"type": "text", "text": text}], "stop_reason": "end_turn"}


def tool_results(runner: Runner, run_id: str) -> list[dict[str, object]]:
    messages = runner.load(run_id).messages
    return [b for m in messages if m["role"] == "user" for b in m["content"] if b.get("type") == "tool_result"]


def events_of(runner: Runner, run_id: str, kind: str) -> list[dict[str, object]]:
    return [e.data for e in runner.store.load_events(run_id) if e.type == kind]


def http_status_error(status: int) -> httpx.HTTPStatusError:
    """What httpx raises for a response with this status (``raise_for_status``)."""
    response = httpx.Response(status, request=httpx.Request("GET", "https://api.example.test/items"))
    try:
        response.raise_for_status()
    except httpx.HTTPStatusError as error:
        return error
    raise AssertionError(f"{status} did not raise")


def raised(call: Callable[[], object]) -> BaseException:
    """The exception a real library call raises."""
    try:
        call()
    except Exception as error:
        return error
    raise AssertionError("nothing was raised")


def test_flaky_tool_is_retried_with_backoff_and_succeeds() -> None:
    attempts: list[float] = []

    @tool(retry=RetryPolicy(max_attempts=3, initial_delay=0.05, multiplier=2))
    def flaky() -> str:
        """Fails twice."""
        attempts.append(time.monotonic())
        if len(attempts) < 3:
            raise ConnectionError("reset by peer")
        return "fine"

    runner = Runner(Agent(model=ScriptedModel([use("t1", "flaky"), answer()]), tools=[flaky]))
    result = runner.run("go")
    assert result.status == "done"
    assert tool_results(runner, result.run_id)[0]["content"] == "fine"
    assert len(attempts) == 3
    assert attempts[1] - attempts[0] >= 0.05
    assert attempts[2] - attempts[1] >= 0.1
    scheduled = events_of(runner, result.run_id, "retry_scheduled")
    assert [s["attempt"] for s in scheduled] == [1, 2]
    assert {s["error_class"] for s in scheduled} == {"retryable"}
    assert result.tool_calls == 3  # each attempt is its own step


def test_exhausted_error_gives_the_model_the_last_error() -> None:
    @tool(retry=RetryPolicy(max_attempts=2, initial_delay=0))
    def down() -> str:
        """Always fails."""
        raise TimeoutError("upstream timed out")

    runner = Runner(Agent(model=ScriptedModel([use("t1", "down"), answer()]), tools=[down]))
    result = runner.run("go")
    assert result.status == "done"
    (block,) = tool_results(runner, result.run_id)
    assert block["is_error"] is True
    assert "upstream timed out" in str(block["content"])
    assert "after 2 attempts" in str(block["content"])
    assert "(retryable)" in str(block["content"])


def test_exhausted_fail_fails_the_run() -> None:
    @tool(retry=RetryPolicy(max_attempts=2, initial_delay=0, on_exhausted="fail"))
    def down() -> str:
        """Always fails."""
        raise ConnectionError("no route")

    runner = Runner(Agent(model=ScriptedModel([use("t1", "down"), answer()]), tools=[down]))
    result = runner.run("go")
    assert result.status == "failed"
    assert result.error is not None
    assert "no route" in result.error
    assert "fails the run" in result.error


def test_exhausted_escalate_asks_a_person_then_retries_or_reports() -> None:
    calls: list[int] = []

    @tool(retry=RetryPolicy(max_attempts=2, initial_delay=0, on_exhausted="escalate"))
    def deploy() -> str:
        """Fails until the third attempt."""
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionError("registry unavailable")
        return "deployed"

    runner = Runner(Agent(model=ScriptedModel([use("t1", "deploy"), answer()]), tools=[deploy]))
    parked = runner.run("deploy")
    assert parked.status == "awaiting_approval"
    (pending,) = parked.pending_approvals
    assert "failed 2 time(s)" in pending["reason"]
    assert "registry unavailable" in pending["reason"]
    runner.decide(parked.run_id, "t1", Approve(actor="oncall"))
    result = runner.drive(parked.run_id)
    assert result.status == "done"
    assert tool_results(runner, result.run_id)[0]["content"] == "deployed"
    assert len(calls) == 3
    assert result.tool_calls == 3


def test_escalation_denied_reports_the_denial() -> None:
    @tool(retry=RetryPolicy(max_attempts=1, on_exhausted="escalate"))
    def deploy() -> str:
        """Always fails."""
        raise ConnectionError("registry unavailable")

    runner = Runner(Agent(model=ScriptedModel([use("t1", "deploy"), answer()]), tools=[deploy]))
    parked = runner.run("deploy")
    runner.decide(parked.run_id, "t1", Deny("stop trying", actor="oncall"))
    result = runner.drive(parked.run_id)
    (block,) = tool_results(runner, result.run_id)
    assert block["is_error"] is True
    assert "stop trying" in str(block["content"])


def test_an_escalated_call_whose_input_a_person_edited_is_asked_about_and_retried_with_that_input() -> None:
    calls: list[str] = []

    @tool(approval=True, retry=RetryPolicy(max_attempts=1, on_exhausted="escalate"))
    def deploy(tag: str) -> str:
        """Fails the first time."""
        calls.append(tag)
        if len(calls) == 1:
            raise ConnectionError("registry unavailable")
        return f"deployed {tag}"

    runner = Runner(Agent(model=ScriptedModel([use("t1", "deploy", {"tag": "latest"}), answer()]), tools=[deploy]))
    parked = runner.run("deploy")
    runner.decide(parked.run_id, "t1", Approve(input={"tag": "v1.2"}, actor="oncall"))
    escalated = runner.drive(parked.run_id)
    assert escalated.status == "awaiting_approval"
    (pending,) = escalated.pending_approvals
    assert pending["input"] == {"tag": "v1.2"}  # what a retry would run, not the model's "latest"
    runner.decide(parked.run_id, "t1", Approve(actor="oncall"), fingerprint=pending["fingerprint"])
    assert runner.drive(parked.run_id).status == "done"
    assert calls == ["v1.2", "v1.2"]


def test_hung_sync_tool_times_out_without_hanging_the_run() -> None:
    release = threading.Event()

    @tool(timeout=0.2, retry=RetryPolicy(max_attempts=2, initial_delay=0))
    def hang() -> str:
        """Never returns in time."""
        release.wait(10)
        return "late"

    runner = Runner(Agent(model=ScriptedModel([use("t1", "hang"), answer()]), tools=[hang]))
    result = runner.run("go")
    release.set()
    assert result.status == "done"
    (block,) = tool_results(runner, result.run_id)
    assert block["is_error"] is True
    assert "timed out after 0.2s" in str(block["content"])
    # not idempotent: it may still complete, so it is never re-run behind the model's back
    assert "may still complete" in str(block["content"])
    assert events_of(runner, result.run_id, "retry_scheduled") == []
    (finished,) = events_of(runner, result.run_id, "tool_finished")
    assert finished["in_doubt"] is True
    (warning,) = events_of(runner, result.run_id, "warning")
    assert warning["abandoned_thread"] is True
    assert warning["call_id"] == "t1"


def test_a_call_whose_outcome_is_unknown_is_in_doubt_and_not_run_again_unless_idempotent() -> None:
    """A remote server that died or went silent mid-call may have acted: never re-run it unasked."""
    calls: list[str] = []

    def remote(idempotent: bool) -> Tool:
        @tool(name=f"remote_{idempotent}", retry=RetryPolicy(max_attempts=2, initial_delay=0), idempotent=idempotent)
        def call() -> str:
            """Sent to a server that closes the connection before answering, the first time."""
            calls.append(f"idempotent={idempotent}")
            if len([c for c in calls if c == f"idempotent={idempotent}"]) == 1:
                raise OutcomeUnknown("the server closed the connection before answering")
            return "answered"

        return call

    script = [use("t1", "remote_False"), use("t2", "remote_True"), answer()]
    runner = Runner(Agent(model=ScriptedModel(script), tools=[remote(False), remote(True)]))
    result = runner.run("go")
    assert result.status == "done"
    assert calls == ["idempotent=False", "idempotent=True", "idempotent=True"]  # only the idempotent one again
    first, second = tool_results(runner, result.run_id)
    assert first["is_error"] is True
    assert "closed the connection before answering; it may still complete" in str(first["content"])
    assert second["content"] == "answered"
    finished = events_of(runner, result.run_id, "tool_finished")
    assert [(e["call_id"], e.get("in_doubt", False)) for e in finished] == [("t1", True), ("t2", False)]
    assert events_of(runner, result.run_id, "warning") == []  # no thread was abandoned


class Overlap:
    """Counts a tool's executions and how many ever ran at once; each blocks until released."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.running = 0
        self.most = 0
        self.started = 0
        self.effects = 0
        self.release = threading.Event()
        self.threads: list[threading.Thread] = []

    def run(self) -> str:
        """Block until released."""
        with self.lock:
            self.started += 1
            self.running += 1
            self.most = max(self.most, self.running)
            self.threads.append(threading.current_thread())
        self.release.wait(10)
        with self.lock:
            self.effects += 1  # the side effect, once the call completes
            self.running -= 1
        return "late"

    def finish(self) -> None:
        self.release.set()
        for thread in self.threads:
            thread.join(10)


@pytest.mark.parametrize("idempotent", [False, True])
def test_attempts_of_a_hung_sync_tool_never_overlap(idempotent: bool) -> None:
    work = Overlap()
    policy = RetryPolicy(max_attempts=3, initial_delay=0)
    hang = tool(name="hang", timeout=0.1, retry=policy, idempotent=idempotent)(work.run)
    runner = Runner(Agent(model=ScriptedModel([use("t1", "hang"), answer()]), tools=[hang]))
    result = runner.run("go")
    work.finish()
    assert result.status == "done"
    assert (work.started, work.most, work.effects) == (1, 1, 1)  # one thread, one side effect
    scheduled = events_of(runner, result.run_id, "retry_scheduled")
    (block,) = tool_results(runner, result.run_id)
    if idempotent:  # retried, but each retry waited for the thread still running instead of starting one
        assert len(scheduled) == 2
        assert "still running from an earlier attempt" in str(block["content"])
        assert "(after 3 attempts)" in str(block["content"])
    else:
        assert scheduled == []
        assert "may still complete" in str(block["content"])


async def test_attempts_of_a_hung_sync_tool_never_overlap_in_the_async_driver() -> None:
    work = Overlap()
    policy = RetryPolicy(max_attempts=3, initial_delay=0)
    hang = tool(name="hang", timeout=0.1, retry=policy, idempotent=True)(work.run)
    agent, store = Agent(model=ScriptedModel([use("t1", "hang"), answer()]), tools=[hang]), MemoryStore()
    result = await AsyncRunner(agent, store).run("go")
    work.finish()
    assert result.status == "done"
    assert (work.started, work.most, work.effects) == (1, 1, 1)
    assert len(events_of(Runner(agent, store), result.run_id, "retry_scheduled")) == 2


def test_a_timed_out_tool_gets_a_cancel_signal_and_a_retry_runs_once_it_stopped() -> None:
    seen: list[str] = []

    @tool(timeout=0.2, idempotent=True, retry=RetryPolicy(max_attempts=2, initial_delay=0))
    def crawl(url: str, cancel: threading.Event) -> str:
        """Stops early when its attempt is cancelled."""
        if not seen:
            seen.append("first")
            cancel.wait(10)
            seen.append("cancelled" if cancel.is_set() else "not cancelled")
            raise RuntimeError("stopped early")
        seen.append("second")
        return f"crawled {url}"

    assert "cancel" not in crawl.input_schema()["properties"]  # not the model's to give
    runner = Runner(Agent(model=ScriptedModel([use("t1", "crawl", {"url": "x"}), answer()]), tools=[crawl]))
    result = runner.run("go")
    assert result.status == "done"
    assert seen == ["first", "cancelled", "second"]  # the retry waited for the first attempt to end
    assert tool_results(runner, result.run_id)[0]["content"] == "crawled x"


def test_a_timeout_of_a_non_idempotent_tool_escalates_when_the_policy_says_so() -> None:
    work = Overlap()
    policy = RetryPolicy(max_attempts=3, initial_delay=0, on_exhausted="escalate")
    hang = tool(name="hang", timeout=0.1, retry=policy)(work.run)
    runner = Runner(Agent(model=ScriptedModel([use("t1", "hang"), answer()]), tools=[hang]))
    parked = runner.run("go")
    (pending,) = parked.pending_approvals
    assert "may still complete" in pending["reason"]
    work.finish()
    assert work.started == 1


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (http_status_error(429), "retryable"),
        (http_status_error(503), "retryable"),
        (http_status_error(408), "retryable"),
        (http_status_error(400), "user_fixable"),
        (http_status_error(404), "user_fixable"),
        (http_status_error(422), "user_fixable"),
        (http_status_error(401), "permission"),
        (http_status_error(403), "permission"),
        (http_status_error(409), "conflict"),
        (httpx.ConnectTimeout("connect timed out"), "retryable"),
        (httpx.ReadTimeout("read timed out"), "retryable"),
        (httpx.PoolTimeout("no connection free"), "retryable"),
        (httpx.ReadError("connection reset"), "retryable"),
        (httpx.RemoteProtocolError("server disconnected"), "retryable"),
        (httpx2.ReadTimeout("read timed out"), "retryable"),
        (TimeoutError(), "retryable"),
        (ConnectionResetError(), "retryable"),
        (socket.gaierror(-3, "Temporary failure in name resolution"), "retryable"),
        (OSError(113, "No route to host"), "retryable"),
        (PermissionError(), "permission"),
        (FileExistsError(), "conflict"),
        (FileNotFoundError(2, "No such file", "x.txt"), "user_fixable"),
        (TypeError("bug"), "fatal"),
        (AttributeError("bug"), "fatal"),
        (NameError("bug"), "fatal"),
        (NotImplementedError(), "fatal"),
        (ValueError("flaky"), "retryable"),
        (KeyError("missing"), "retryable"),
        (RuntimeError("odd"), "retryable"),
        (Exception("unknown"), "retryable"),
    ],
    ids=repr,
)
def test_errors_are_classified(error: BaseException, expected: str) -> None:
    assert classify(error) == expected


def test_errors_raised_by_real_httpx_calls_are_classified() -> None:
    port = closed_port()
    assert classify(raised(lambda: httpx.get(f"http://127.0.0.1:{port}/", timeout=5))) == "retryable"
    assert classify(raised(lambda: httpx.get("ftp://example.test/"))) == "user_fixable"  # UnsupportedProtocol
    assert classify(raised(lambda: httpx.get("http://a" + "b" * 70_000 + ".test/"))) == "user_fixable"  # InvalidURL
    assert classify(raised(lambda: httpx2.get("ftp://example.test/"))) == "user_fixable"

    def answer_with(status: int) -> httpx.Client:
        return httpx.Client(transport=httpx.MockTransport(lambda request: httpx.Response(status)))

    with answer_with(429) as client:
        assert classify(raised(lambda: client.get("https://api.example.test/").raise_for_status())) == "retryable"
    with answer_with(422) as client:
        assert classify(raised(lambda: client.get("https://api.example.test/").raise_for_status())) == "user_fixable"


def test_errors_raised_by_real_requests_calls_are_classified() -> None:
    requests = pytest.importorskip("requests")
    port = closed_port()
    assert classify(raised(lambda: requests.get(f"http://127.0.0.1:{port}/", timeout=5))) == "retryable"
    assert classify(raised(lambda: requests.get("not a url"))) == "user_fixable"  # MissingSchema
    assert classify(raised(lambda: requests.get("gopher://example.test/"))) == "user_fixable"  # InvalidSchema
    assert classify(requests.exceptions.ReadTimeout("read timed out")) == "retryable"
    for status, expected in [(503, "retryable"), (404, "user_fixable"), (403, "permission")]:
        response = requests.models.Response()
        response.status_code, response.url, response.reason = status, "https://api.example.test/", "x"
        assert classify(raised(response.raise_for_status)) == expected
    assert classify(requests.exceptions.RequestException("something else")) == "fatal"  # not OSError's default


def test_only_retryable_errors_are_retried_by_default() -> None:
    tried: dict[str, int] = {}
    failures = {
        "bug": TypeError("unsupported operand"),
        "odd": RuntimeError("unexpected state"),
        "bad_input": http_status_error(422),
        "network": httpx.ConnectError("connection refused"),
    }

    def failing(name: str) -> Tool:
        def run() -> str:
            tried[name] = tried.get(name, 0) + 1
            raise failures[name]

        return tool(name=name, description=name, retry=RetryPolicy(max_attempts=3, initial_delay=0))(run)

    uses = [block for name in failures for block in use(name, name)["content"]]
    script = [{"content": uses, "stop_reason": "tool_use"}, answer()]
    runner = Runner(Agent(model=ScriptedModel(script), tools=[failing(name) for name in failures]))
    result = runner.run("go")
    assert tried == {"bug": 1, "odd": 3, "bad_input": 1, "network": 3}
    contents = {b["tool_use_id"]: str(b["content"]) for b in tool_results(runner, result.run_id)}
    assert contents["bug"].startswith("Error (fatal)")
    assert contents["odd"].startswith("Error (retryable)")
    assert contents["bad_input"].startswith("Error (user_fixable)")
    assert contents["network"].startswith("Error (retryable)")


def test_classification_drives_the_default_retry_and_can_be_overridden() -> None:
    seen: list[str] = []

    @tool(retry=RetryPolicy(max_attempts=3, initial_delay=0))
    def forbidden() -> str:
        """Not allowed."""
        seen.append("forbidden")
        raise http_status_error(403)

    @tool(retry=RetryPolicy(max_attempts=3, initial_delay=0, classify=lambda e: "retryable"))
    def forbidden_but_retried() -> str:
        """The override says retry."""
        seen.append("overridden")
        raise http_status_error(403)

    script = [
        {
            "content": [*use("a", "forbidden")["content"], *use("b", "forbidden_but_retried")["content"]],
            "stop_reason": "tool_use",
        },
        answer(),
    ]
    runner = Runner(Agent(model=ScriptedModel(script), tools=[forbidden, forbidden_but_retried]))
    result = runner.run("go")
    assert seen.count("forbidden") == 1
    assert seen.count("overridden") == 3
    first, second = tool_results(runner, result.run_id)
    assert "(permission)" in str(first["content"])
    assert "(retryable)" in str(second["content"])
    finished = {e["call_id"]: e for e in events_of(runner, result.run_id, "tool_finished")}
    assert finished["a"]["error_class"] == "permission"


def test_model_retry_signal_reaches_the_model_verbatim_without_host_retries() -> None:
    runs: list[int] = []

    @tool(retry=RetryPolicy(max_attempts=3, initial_delay=0))
    def lookup(email: str) -> str:
        """Find a customer."""
        runs.append(1)
        raise ModelRetry(f"no customer with email {email}; ask the user for their customer id")

    runner = Runner(Agent(model=ScriptedModel([use("t1", "lookup", {"email": "x@y.z"}), answer()]), tools=[lookup]))
    result = runner.run("go")
    (block,) = tool_results(runner, result.run_id)
    assert block["content"] == "Error: no customer with email x@y.z; ask the user for their customer id"
    assert len(runs) == 1


DRIVER = textwrap.dedent(
    """
    import json, sys, time
    from pathlib import Path
    from tether import Agent, RetryPolicy, Runner, tool
    from tether.errors import RunBusy
    from tether.stores.sql import SQLStore
    from tether.testing import ScriptedModel

    workdir, run_id = Path(sys.argv[1]), sys.argv[2]

    @tool(retry=RetryPolicy(max_attempts=3, initial_delay=1.5, multiplier=1))
    def flaky() -> str:
        \"\"\"Fails on the first attempt only.\"\"\"
        with (workdir / "attempts.log").open("a") as log:
            log.write(f"{time.time()}\\n")
        if len((workdir / "attempts.log").read_text().split()) < 2:
            raise ConnectionError("flap")
        return "ok"

    script = [{"content": [{"type": "tool_use", "id": "t1", "name": "flaky", "input": {}}], "stop_reason": "tool_use"},
              {"content": [{"type": "text", "text": "done"}], "stop_reason": "end_turn"}]
    store = SQLStore(f"sqlite:///{workdir / 'runs.db'}")
    def note_wait(state, action):  # the due time this driver waits for, as it saw it
        if hasattr(action, "due_at"):
            with (workdir / "waits.log").open("a") as log:
                log.write(f"{action.due_at!r}\\n")

    runner = Runner(Agent(model=ScriptedModel(script), tools=[flaky]), store, on_action=note_wait, lease_ttl=0.3)
    try:
        store.load_run(run_id)
    except Exception:
        runner.create("go", run_id=run_id)
    while True:
        try:
            print(json.dumps(runner.drive(run_id).to_dict()))
            break
        except RunBusy:  # a killed driver's lease lasts until it expires (0.3 s here)
            time.sleep(0.02)
    """
)


def scheduled(store: SQLStore, run_id: str) -> bool:
    """Whether the run's retry_scheduled event is committed (polled from outside the driver)."""
    try:
        return any(event.type == "retry_scheduled" for event in store.load_events(run_id))
    except (RunNotFound, StoreError):  # not created yet (or the schema is being created)
        return False


@pytest.mark.slow
def test_retry_schedule_survives_kill_9(tmp_path: Path) -> None:
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    first = subprocess.Popen(
        [sys.executable, str(script), str(tmp_path), "run_retry"],
        env=clean_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    log = tmp_path / "attempts.log"
    store = SQLStore(f"sqlite:///{tmp_path / 'runs.db'}")
    deadline = time.monotonic() + 30
    while not scheduled(store, "run_retry") and time.monotonic() < deadline:
        time.sleep(0.02)
    store.close()
    assert first.poll() is None, "the driver ended before its retry was due"
    first.send_signal(signal.SIGKILL)  # the retry is committed; the driver is waiting for it
    first.communicate(timeout=10)
    (waits_log := tmp_path / "waits.log").unlink(missing_ok=True)  # what the killed driver waited for
    second = run_python(str(script), str(tmp_path), "run_retry")
    assert second.returncode == 0, second.stderr
    assert json.loads(second.stdout)["status"] == "done"
    store = SQLStore(f"sqlite:///{tmp_path / 'runs.db'}")
    (due_at,) = [e.data["due_at"] for e in store.load_events("run_retry") if e.type == "retry_scheduled"]
    store.close()
    first_attempt, second_attempt = (float(t) for t in log.read_text().split())
    # the persisted due time was kept: the resumer waited for exactly it (not a fresh delay of
    # its own), and the attempt did not run before it. On a loaded machine the resumer may
    # start after the due time: then it has nothing to wait for, and says no wait at all.
    waits = {float(line) for line in waits_log.read_text().split()} if waits_log.exists() else set()
    assert waits <= {due_at}
    assert second_attempt >= due_at >= first_attempt + 1.5


# Parking while a retry is due later ----------------------------------------------------
def failing_once(delay: float) -> tuple[list[int], Tool]:
    attempts: list[int] = []

    @tool(retry=RetryPolicy(max_attempts=2, initial_delay=delay, max_delay=delay))
    def flaky() -> str:
        """Fails on its first attempt."""
        attempts.append(1)
        if len(attempts) == 1:
            raise ConnectionError("reset")
        return "fine"

    return attempts, flaky


def test_a_drive_with_max_wait_parks_a_later_retry_and_a_later_drive_runs_it() -> None:
    now = [1000.0]
    attempts, flaky = failing_once(60.0)
    runner = Runner(Agent(model=ScriptedModel([use("t1", "flaky"), answer()]), tools=[flaky]), clock=lambda: now[0])

    parked = runner.run("go", max_wait=0)
    assert parked.status == "waiting_retry"
    assert parked.next_due_at == 1060.0
    assert len(attempts) == 1
    row = runner.store.load_run(parked.run_id)
    assert row.status == "executing_tool"
    assert row.summary["next_due_at"] == 1060.0  # persisted: any process can find it
    assert runner.store.list_due(1059.0) == []
    assert [r.id for r in runner.store.list_due(1060.0)] == [parked.run_id]

    now[0] = 1030.0  # too early: the drive parks again without running anything
    early = runner.drive(parked.run_id, max_wait=10)
    assert (early.status, early.next_due_at, len(attempts)) == ("waiting_retry", 1060.0, 1)

    now[0] = 1060.0
    done = runner.drive(parked.run_id, max_wait=0)
    assert done.status == "done"
    assert done.next_due_at is None
    assert len(attempts) == 2
    assert runner.store.load_run(parked.run_id).summary.get("next_due_at") is None  # no longer waiting
    assert runner.store.list_due(2000.0) == []


def test_the_jitter_comes_from_the_runners_random_source() -> None:
    """Seeded, the schedule repeats whatever the global ``random`` does; the engine draws nothing itself."""

    def due_at(seed: int, global_seed: int) -> float | None:
        @tool(retry=RetryPolicy(max_attempts=2, initial_delay=60, max_delay=600, jitter=1.0))
        def flaky() -> str:
            """Fails."""
            raise ConnectionError("reset")

        agent = Agent(model=ScriptedModel([use("t1", "flaky"), answer()]), tools=[flaky])
        runner = Runner(agent, clock=lambda: 1000.0, rng=random.Random(seed))
        random.seed(global_seed)
        return runner.run("go", max_wait=0).next_due_at

    assert due_at(7, global_seed=1) == due_at(7, global_seed=2)
    assert due_at(7, global_seed=1) != due_at(8, global_seed=1)


def test_a_retry_due_within_max_wait_is_waited_for() -> None:
    attempts, flaky = failing_once(0.01)
    runner = Runner(Agent(model=ScriptedModel([use("t1", "flaky"), answer()]), tools=[flaky]))
    result = runner.run("go", max_wait=30)
    assert result.status == "done"
    assert len(attempts) == 2


async def test_the_async_driver_parks_a_later_retry_too() -> None:
    now = [1000.0]
    attempts, flaky = failing_once(60.0)
    runner = AsyncRunner(
        Agent(model=ScriptedModel([use("t1", "flaky"), answer()]), tools=[flaky]), clock=lambda: now[0]
    )
    parked = await runner.run("go", max_wait=0)
    assert (parked.status, parked.next_due_at) == ("waiting_retry", 1060.0)
    now[0] = 1061.0
    assert (await runner.drive(parked.run_id, max_wait=0)).status == "done"
    assert len(attempts) == 2


WAITING_TOOLS = textwrap.dedent(
    '''
    from pathlib import Path

    from tether import RetryPolicy, tool


    def fails_first(name: str) -> None:
        counter = Path(name + ".count")
        calls = (int(counter.read_text()) if counter.exists() else 0) + 1
        counter.write_text(str(calls))
        if calls == 1:
            raise ConnectionError("flap")


    @tool(retry=RetryPolicy(max_attempts=2, initial_delay=0.5))
    def soon() -> str:
        """Fails once; retried half a second later."""
        fails_first("soon")
        return "soon ok"


    @tool(retry=RetryPolicy(max_attempts=2, initial_delay=3600, max_delay=3600))
    def later() -> str:
        """Fails once; retried an hour later."""
        fails_first("later")
        return "later ok"
    '''
)


def test_runs_by_status_finds_executing_runs_behind_a_hundred_waiting_ones(tmp_path: Path) -> None:
    """``runs --status executing_tool`` is not cut to the newest hundred runs stored that way."""
    store = SQLStore(f"sqlite:///{tmp_path / 'tether.db'}")
    summary = {"steps": 1, "tool_calls": 0}
    store.create_run(RunRecord(id="run_old", status="executing_tool", version=1, summary=summary, created_at=1.0), [])
    due_later = {**summary, "next_due_at": 9e9}
    for n in range(101):  # newer, and each waiting for a retry
        store.create_run(
            RunRecord(id=f"run_{n:03}", status="executing_tool", version=1, summary=due_later, created_at=2.0 + n), []
        )
    store.close()
    cli = Cli(tmp_path)

    executing, waiting = (cli("runs", "--status", name, "--json") for name in ("executing_tool", "waiting_retry"))
    assert [row["run_id"] for row in executing.data["runs"]] == ["run_old"]
    assert len(waiting.data["runs"]) == 100  # the listing's limit, all of them waiting
    assert {row["status"] for row in waiting.data["runs"]} == {"waiting_retry"}


@pytest.mark.slow
def test_the_cli_parks_a_long_retry_wait_and_runs_due_finds_it(tmp_path: Path) -> None:
    (tmp_path / "waiting.py").write_text(WAITING_TOOLS)
    for name in ("soon", "later"):
        turns = [use(f"t_{name}", name), answer(f"{name} done")]
        (tmp_path / f"{name}.json").write_text(json.dumps(turns))
    cli = Cli(tmp_path)

    def run(name: str, *extra: str) -> CliResult:
        return cli("run", "go", "--tools", f"waiting:{name}", "--model", f"scripted:{name}.json", *extra)

    later = run("later")  # the default --max-wait (30 s) is shorter than the hour
    assert later.returncode == 4, later
    assert "resume after" in flat(later.stdout)
    soon = run("soon", "--max-wait", "0", "--json")
    assert soon.returncode == 4, soon
    assert soon.data["status"] == "waiting_retry"
    due_at = soon.data["next_due_at"]
    assert isinstance(due_at, float)

    listed, waiting, executing = (
        cli(*command, "--json").data["runs"]
        for command in (["runs"], ["runs", "--status", "waiting_retry"], ["runs", "--status", "executing_tool"])
    )
    assert {r["status"] for r in listed} == {"waiting_retry"}
    assert sorted(r["run_id"] for r in waiting) == sorted(r["run_id"] for r in listed)  # each status runs shows
    assert executing == []  # waiting for a retry is shown as waiting_retry, and filtered as such
    time.sleep(max(0.0, due_at - time.time()))  # wait until the retry is due, not a timing check
    due = cli("runs", "--due", "--json").data["runs"]
    assert [r["run_id"] for r in due] == [soon.data["run_id"]]
    assert due[0]["next_due_at"] == due_at

    resumed = cli("resume", soon.data["run_id"], "--json")
    assert resumed.returncode == 0, resumed
    assert resumed.data["output"] == "soon done"
    assert cli("runs", "--due", "--json").data["runs"] == []
