"""`tether ui`'s defences, as an attacker and as a careless setup would test them.

Sessions that end (signed out, idle, too old) and the streams they opened; a cookie scoped to
its server; a ``?token=`` address that signs in only when the person opened it; forms read up
to a limit, chunked ones too; named tokens whose holder is the decider and whose viewers decide
nothing; wrong tokens slowed down; a Host allow-list; TLS or an explicit ``--insecure`` beyond
loopback, and never a token on the command line.

Most tests speak HTTP to the app in process (Starlette's TestClient); what only a real server
shows (its socket, its memory, TLS, a stream cut at sign-out) is tried on ``tether ui`` itself.
"""

from __future__ import annotations

import asyncio
import html
import os
import re
import socket
import ssl
import threading
import time
from collections.abc import AsyncGenerator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.testclient import TestClient

from tether.errors import ConfigError
from tether.facts.events import ApprovalDecided
from tether.policy.access import Credentials
from tether.stores.sql import SQLStore
from tether.surfaces.web import live
from tether.surfaces.web.app import MAX_SIGN_IN_BYTES, create_app
from tether.surfaces.web.decisions import InProcess
from tether.surfaces.web.listen import default_hosts, host_of
from tether.surfaces.web.sessions import Sessions
from tether.surfaces.web.throttle import Throttle
from ui_runs import SHOWN_FINGERPRINT, Project
from ui_servers import ALICE, BOB, TOKENS_TOML, UiServer, peak_memory, self_signed, ui_server

OPERATOR = "operator-token-0123456789"
ACME = "acme-token-0123456789"
HTML = {"Accept": "text/html"}
FROM_ELSEWHERE = {"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "navigate"}
"""What Chromium says of a navigation a link on another site's page started."""


class Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SQLStore]:
    opened = SQLStore(f"sqlite:///{tmp_path / 'runs.db'}")
    yield opened
    opened.close()


@pytest.fixture
def project(tmp_path: Path) -> Project:
    return Project.make(tmp_path / "project")


def app_of(store: SQLStore, credentials: Credentials | None = None, **options: Any) -> Any:
    credentials = credentials or Credentials({OPERATOR: None, ACME: "acme"})
    return create_app(store, credentials, resume=InProcess(store, max_wait=0).drive, **options)


def signed_in(app: Any, token: str = OPERATOR, base_url: str = "http://testserver") -> TestClient:
    browser = TestClient(app, follow_redirects=False, base_url=base_url)
    assert browser.post("/login", data={"token": token}).status_code == 303
    return browser


def csrf_of(page: str) -> str:
    found = re.search(r'name="csrf" value="([0-9a-f]+)"', page)
    assert found is not None, "the page has no form with a CSRF token"
    return found.group(1)


def who(browser: TestClient) -> str:
    found = re.search(r'data-testid="who">([^<]*)<', browser.get("/", headers=HTML).text)
    return found.group(1) if found else "nobody"


# Sessions end ------------------------------------------------------------------------------------
def test_a_session_ends_when_unused_for_its_idle_time_and_at_its_lifetime_however_used() -> None:
    clock = Clock()
    sessions = Sessions(idle=60, lifetime=300, clock=clock)
    grant = Credentials({OPERATOR: None}).grant(OPERATOR)
    assert grant is not None
    session = sessions.open(grant)
    clock.now += 50
    assert sessions.grant(session, used=True) == grant  # a person opened a page: 60 s from now
    clock.now += 50
    assert sessions.grant(session, used=False) == grant  # a stream asks: it keeps nothing alive
    clock.now += 10
    assert sessions.grant(session, used=True) is None  # 60 s since the person's last request
    assert sessions.grant(session, used=True) is None  # and it stays ended

    busy = sessions.open(grant)
    for _ in range(5):
        clock.now += 55
        assert sessions.grant(busy, used=True) == grant
    clock.now += 25  # 300 s since it opened
    assert sessions.grant(busy, used=True) is None
    with pytest.raises(ConfigError, match="must be positive"):
        Sessions(idle=0, lifetime=300)


def test_sessions_past_their_lifetime_are_forgotten_and_the_oldest_goes_at_capacity() -> None:
    clock = Clock()
    grant = Credentials({OPERATOR: None}).grant(OPERATOR)
    assert grant is not None
    sessions = Sessions(idle=10, lifetime=10, clock=clock, capacity=2)
    first, second = sessions.open(grant), sessions.open(grant)
    third = sessions.open(grant)  # at capacity: the oldest ends
    assert sessions.grant(first, used=False) is None
    assert sessions.grant(second, used=False) == grant
    clock.now += 10
    sessions.open(grant)
    assert sessions.grant(third, used=False) is None


def test_an_old_session_is_refused_over_http(store: SQLStore) -> None:
    browser = signed_in(app_of(store, session_idle=1.5, session_lifetime=1.5))
    assert browser.get("/").status_code == 200
    time.sleep(1.6)
    page = browser.get("/", headers=HTML)
    assert page.status_code == 401
    assert "Sign in" in page.text


def test_a_stream_says_signed_out_and_ends_once_its_session_ends() -> None:
    signed = [True]

    async def changes() -> AsyncGenerator[str, None]:
        for number in range(3):
            if number == 1:
                signed[0] = False  # signed out while the stream had its next message ready
            yield live.message("changed", {"n": number})

    async def read() -> list[str]:
        return [said async for said in live.while_signed_in(changes(), lambda: signed[0])]

    said = asyncio.run(read())
    assert said == [live.message("changed", {"n": 0}), live.message("signed-out", {})]


# The cookie -------------------------------------------------------------------------------------
def test_the_cookie_is_named_for_its_port_and_holds_a_session_not_the_token(store: SQLStore) -> None:
    app = app_of(store)
    answer = TestClient(app, follow_redirects=False, base_url="http://testserver:8321").post(
        "/login", data={"token": ACME}
    )
    cookie = answer.headers["set-cookie"]
    assert cookie.startswith("tether_ui_8321=")
    assert ACME not in cookie
    for attribute in ("HttpOnly", "Path=/", "SameSite=strict", f"Max-Age={8 * 3600}"):
        assert attribute in cookie
    assert "Secure" not in cookie  # plain HTTP: a Secure cookie would never come back
    assert "Domain" not in cookie  # this host name only

    other = TestClient(app, follow_redirects=False, base_url="http://testserver:9000")
    other.cookies.set("tether_ui_8321", cookie.split(";")[0].split("=", 1)[1])
    assert other.get("/", headers=HTML).status_code == 401  # under its own port's name only


def test_over_tls_the_cookie_is_secure_and_host_prefixed(store: SQLStore) -> None:
    browser = TestClient(app_of(store), follow_redirects=False, base_url="https://testserver:8443")
    answer = browser.post("/login", data={"token": ACME})
    cookie = answer.headers["set-cookie"]
    assert cookie.startswith("__Host-tether_ui_8443=")
    assert "Secure" in cookie
    assert "Path=/" in cookie
    assert "Domain" not in cookie
    page = browser.get("/")
    assert page.status_code == 200
    gone = browser.post("/logout", data={"csrf": csrf_of(page.text)})
    assert gone.headers["set-cookie"].startswith('__Host-tether_ui_8443=""')  # dropped with the same attributes
    assert "Secure" in gone.headers["set-cookie"]


# A token in the address --------------------------------------------------------------------------
@pytest.mark.parametrize(
    "headers",
    [
        FROM_ELSEWHERE,
        {"Sec-Fetch-Site": "same-site", "Sec-Fetch-Mode": "navigate"},  # a page on another port of this host
        {"Referer": "http://evil.example/page"},  # a browser that predates Sec-Fetch-Site
        {"Origin": "http://127.0.0.1:9000"},
    ],
)
def test_an_address_with_a_token_opened_from_another_site_signs_nobody_in(
    store: SQLStore, headers: dict[str, str]
) -> None:
    app = app_of(store)
    victim = signed_in(app, ACME)
    answer = victim.get(f"/inbox?token={OPERATOR}", headers={**HTML, **headers})
    assert answer.status_code == 403
    assert "opened from another site's page, so it signed nobody in" in html.unescape(answer.text)
    assert "set-cookie" not in answer.headers
    assert who(victim) == "tenant acme"  # still the victim's own session

    stranger = TestClient(app, follow_redirects=False)
    assert stranger.get(f"/?token={OPERATOR}", headers={**HTML, **headers}).status_code == 403
    assert stranger.get("/", headers=HTML).status_code == 401


@pytest.mark.parametrize(
    "headers",
    [
        {"Sec-Fetch-Site": "none", "Sec-Fetch-Mode": "navigate"},  # typed, a bookmark, opened from the terminal
        {"Sec-Fetch-Site": "same-origin", "Sec-Fetch-Mode": "navigate"},
        {},  # a script, or a browser that says nothing
    ],
)
def test_an_address_with_a_token_the_person_opened_signs_in_and_leaves_the_address(
    store: SQLStore, headers: dict[str, str]
) -> None:
    browser = TestClient(app_of(store), follow_redirects=False)
    answer = browser.get(f"/inbox?token={ACME}&x=1", headers=headers)
    assert answer.status_code == 303
    assert answer.headers["location"] == "/inbox?x=1"
    assert who(browser) == "tenant acme"


def test_an_address_with_another_token_never_replaces_an_open_session(store: SQLStore) -> None:
    browser = signed_in(app_of(store), ACME)
    cookie = dict(browser.cookies)
    other = browser.get(f"/?token={OPERATOR}", headers=HTML)
    assert other.status_code == 409
    said = html.unescape(other.text)
    assert "You are signed in as tenant acme's token; this address signs in as an operator's token" in said
    assert "Sign out" in other.text
    same = browser.get(f"/inbox?token={ACME}")
    assert (same.status_code, same.headers["location"]) == (303, "/inbox")
    assert "set-cookie" not in same.headers  # the session it has
    assert dict(browser.cookies) == cookie
    assert who(browser) == "tenant acme"


def test_the_sign_in_form_sent_from_another_site_is_refused(store: SQLStore) -> None:
    browser = TestClient(app_of(store), follow_redirects=False)
    for headers in ({"Origin": "http://evil.example"}, {"Sec-Fetch-Site": "cross-site"}):
        refused = browser.post("/login", data={"token": ACME}, headers=headers)
        assert refused.status_code == 403
        assert "set-cookie" not in refused.headers


def test_signing_in_goes_back_to_the_page_asked_for_and_only_ours(store: SQLStore) -> None:
    browser = TestClient(app_of(store), follow_redirects=False)
    page = browser.get("/inbox?x=1", headers=HTML)
    assert page.status_code == 401
    assert 'name="next" value="/inbox?x=1"' in page.text
    assert "Signed in already?" not in page.text  # offered only to a link from another site
    answer = browser.post("/login", data={"token": ACME, "next": "/inbox?x=1"})
    assert answer.headers["location"] == "/inbox?x=1"
    for elsewhere in ("//evil.example/", "https://evil.example/", "/\\evil.example", ""):
        answer = TestClient(app_of(store), follow_redirects=False).post(
            "/login", data={"token": ACME, "next": elsewhere}
        )
        assert answer.headers["location"] == "/", elsewhere

    expired = TestClient(app_of(store), follow_redirects=False)  # a form sent once the session had ended
    sent = expired.post("/decide", data={"action": "approve"}, headers={"Referer": "http://testserver/runs/run_1"})
    assert 'name="next" value="/runs/run_1"' in sent.text  # back to the page the form was on
    sent = expired.post("/decide", data={"action": "approve"}, headers={"Referer": "http://evil.example/x"})
    assert 'name="next" value="/"' in sent.text

    linked = TestClient(app_of(store), follow_redirects=False).get("/inbox", headers={**HTML, **FROM_ELSEWHERE})
    assert linked.status_code == 401
    assert "Signed in already? A link from another site does not bring your session along" in linked.text
    assert '<a href="/inbox">open /inbox</a>' in linked.text


# Named tokens ------------------------------------------------------------------------------------
@pytest.fixture
def named(tmp_path: Path) -> Credentials:
    path = tmp_path / "tokens.toml"
    path.write_text(TOKENS_TOML, encoding="utf-8")
    return Credentials.from_file(path)


def test_a_named_approvers_decision_is_recorded_under_the_tokens_name(
    store: SQLStore, project: Project, named: Credentials
) -> None:
    run = project.park(store)
    alice = signed_in(app_of(store, named), ALICE)
    inbox = alice.get("/inbox").text
    assert 'data-testid="deciding-as">Deciding as <strong>alice</strong>' in inbox
    assert 'name="by"' not in inbox  # nobody types who they are
    assert who(alice) == "alice · every tenant"
    form = {
        "csrf": csrf_of(inbox),
        "run_id": run.run_id,
        "call_id": "toolu_refund",
        "fingerprint": SHOWN_FINGERPRINT,
        "action": "approve",
        "by": "mallory",  # a forged field changes nothing
    }
    assert alice.post("/decide", data=form).status_code == 303
    decided = [event.fact for event in store.load_events(run.run_id) if isinstance(event.fact, ApprovalDecided)]
    assert [fact.actor for fact in decided] == ["alice"]
    assert store.load_run(run.run_id).status == "done"


def test_a_viewer_sees_the_waiting_call_but_cannot_decide_or_fork(
    store: SQLStore, project: Project, named: Credentials
) -> None:
    run = project.park(store)
    bob = signed_in(app_of(store, named), BOB)
    inbox = bob.get("/inbox").text
    assert run.run_id in inbox
    assert "Your token is a viewer's: it shows this call and decides nothing." in html.unescape(inbox)
    assert 'action="/decide"' not in inbox
    assert who(bob) == "bob · every tenant · viewer"
    page = bob.get(f"/runs/{run.run_id}").text
    assert 'action="/fork"' not in page
    assert 'action="/control"' not in page  # no cancel, resume or retry either
    form = {"csrf": csrf_of(inbox), "run_id": run.run_id, "call_id": "toolu_refund", "action": "approve"}
    refused = bob.post("/decide", data={**form, "fingerprint": SHOWN_FINGERPRINT}, headers=HTML)
    assert refused.status_code == 403
    assert "bob's token is a viewer's: it shows runs but decides and forks nothing" in html.unescape(refused.text)
    assert bob.post("/fork", data={"csrf": form["csrf"], "run_id": run.run_id, "at": "1"}).status_code == 403
    cancel = {"csrf": form["csrf"], "run_id": run.run_id, "action": "cancel", "confirmed": "1"}
    assert bob.post("/control", data=cancel).status_code == 403
    script = TestClient(app_of(store, named), headers={"Authorization": f"Bearer {BOB}"}, follow_redirects=False)
    assert script.post("/decide", data={**form, "fingerprint": SHOWN_FINGERPRINT}).status_code == 403
    assert store.load_run(run.run_id).status == "awaiting_approval"
    assert len(store.list_runs()) == 1  # no fork either


# Wrong tokens slow their sender down ---------------------------------------------------------------
def test_after_a_few_wrong_tokens_each_one_doubles_the_wait_up_to_a_limit() -> None:
    clock = Clock()
    throttle = Throttle(free=3, first_wait=1, max_wait=8, forget=600, clock=clock)
    waits = [throttle.failed("203.0.113.5") for _ in range(8)]
    assert waits == [0, 0, 0, 1, 2, 4, 8, 8]
    assert throttle.wait("203.0.113.5") == 8
    assert throttle.wait("203.0.113.6") == 0  # another address
    clock.now += 8
    assert throttle.wait("203.0.113.5") == 0
    throttle.succeeded("203.0.113.5")
    assert throttle.failed("203.0.113.5") == 0  # a right token forgave the mistakes

    for _ in range(4):
        throttle.failed("2001:db8::1")
    assert throttle.wait("2001:db8::ffff") == 1  # one IPv6 /64 is one client
    assert throttle.wait("2001:db8:0:1::1") == 0
    for _ in range(4):
        throttle.failed("::ffff:198.51.100.7")
    assert throttle.wait("198.51.100.7") == 1  # an IPv4 client of a dual-stack socket is itself
    clock.now += 600
    assert throttle.failed("2001:db8::1") == 0  # forgotten after a quiet while


def test_sign_in_answers_429_after_too_many_wrong_tokens_whichever_way_they_come(store: SQLStore) -> None:
    app = app_of(store)
    guesser = TestClient(app, follow_redirects=False, client=("203.0.113.5", 50000))
    for number in range(6):  # five are free; the sixth earns a second's wait (each further one doubles it)
        assert guesser.post("/login", data={"token": f"wrong-token-{number:012d}"}).status_code == 401
    attempts = [
        guesser.post("/login", data={"token": OPERATOR, "next": "/inbox"}, headers=HTML),  # the right one, too soon
        guesser.get(f"/?token={OPERATOR}", headers=HTML),
        guesser.get("/", headers={"Authorization": f"Bearer {OPERATOR}"}),
    ]
    for refused in attempts:
        assert refused.status_code == 429
        assert refused.headers["retry-after"] == "1"
        assert "Too many wrong tokens from your address: wait 1 second, then try again." in refused.text
        assert "set-cookie" not in refused.headers
    assert 'name="next" value="/inbox"' in attempts[0].text  # the form still leads where it was going
    elsewhere = TestClient(app, follow_redirects=False, client=("198.51.100.7", 50000))
    assert elsewhere.post("/login", data={"token": OPERATOR}).status_code == 303  # the others are not slowed


# Bodies are read up to a limit -------------------------------------------------------------------
def test_a_form_too_large_is_refused_declared_or_chunked(store: SQLStore) -> None:
    browser = TestClient(app_of(store), follow_redirects=False)
    form = {"content-type": "application/x-www-form-urlencoded"}
    assert browser.post("/login", content="token=" + "x" * MAX_SIGN_IN_BYTES, headers=form).status_code == 413

    def chunks() -> Iterator[bytes]:
        yield b"token="
        for _ in range(MAX_SIGN_IN_BYTES // 1000 + 1):
            yield b"x" * 1000

    refused = browser.post("/login", content=chunks(), headers=form)
    assert refused.status_code == 413
    assert f"this form may hold at most {MAX_SIGN_IN_BYTES} bytes" in refused.text


# Names and addresses -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("header", "host"),
    [
        ("localhost:8321", "localhost"),
        ("LOCALHOST.", "localhost"),
        ("[::1]:8321", "::1"),
        ("127.0.0.1", "127.0.0.1"),
        ("", ""),
    ],
)
def test_the_host_a_request_names(header: str, host: str) -> None:
    assert host_of(header) == host


def test_a_server_answers_to_its_own_names_only(store: SQLStore) -> None:
    assert default_hosts("127.0.0.1") == {"localhost", "127.0.0.1", "::1"}
    assert "192.168.1.5" in default_hosts("192.168.1.5")
    assert socket.gethostname().lower() in default_hosts("0.0.0.0")
    app = app_of(store, allowed_hosts=default_hosts("127.0.0.1"))
    ours = TestClient(app, follow_redirects=False, base_url="http://localhost:8321")
    assert ours.get(f"/?token={OPERATOR}").status_code == 303
    rebound = TestClient(app, follow_redirects=False, base_url="http://attacker.example:8321")
    refused = rebound.get(f"/?token={OPERATOR}")
    assert refused.status_code == 400
    assert refused.text == (
        "refused: this server answers to 127.0.0.1, ::1, localhost, not to 'attacker.example'; "
        "open it by one of those names\n"
    )
    assert refused.headers["x-frame-options"] == "DENY"  # and still every security header


# The command -------------------------------------------------------------------------------------
def test_tether_ui_takes_no_token_on_its_command_line_and_reads_a_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from tether.surfaces.cli import main

    monkeypatch.delenv("TETHER_UI_TOKEN", raising=False)
    db = f"sqlite:///{tmp_path / 'runs.db'}"
    SQLStore(db).list_runs()
    assert main(["ui", "--db", db, "--token", OPERATOR]) == 2
    err = capsys.readouterr().err
    assert "--token puts the token where every user of this machine can read it (ps)" in err
    assert OPERATOR not in err
    assert main(["ui", "--db", db, "--token-file", str(tmp_path / "absent")]) == 2
    assert "cannot read the token file" in capsys.readouterr().err
    (tmp_path / "token").write_text("short\n", encoding="utf-8")
    assert main(["ui", "--db", db, "--token-file", str(tmp_path / "token")]) == 2
    assert "too weak" in capsys.readouterr().err
    assert main(["ui", "--db", db, "--session-idle", "5m"]) == 2
    assert "is ambiguous: write 5min for minutes" in capsys.readouterr().err
    assert main(["ui", "--db", db, "--session-lifetime", "0s"]) == 2
    assert "a session must last some time" in capsys.readouterr().err
    assert main(["ui", "--db", db, "--certfile", "cert.pem"]) == 2
    assert "--certfile and --keyfile go together" in capsys.readouterr().err
    (tmp_path / "token").write_text(OPERATOR + "\n", encoding="utf-8")
    assert main(["ui", "--db", db, "--host", "0.0.0.0", "--token-file", str(tmp_path / "token")]) == 2
    assert "in clear: give --certfile and --keyfile (TLS), or --insecure" in capsys.readouterr().err
    missing = ["--certfile", str(tmp_path / "no.pem"), "--keyfile", str(tmp_path / "no.key")]
    assert main(["ui", "--db", db, *missing]) == 2
    assert f"cannot read --certfile {tmp_path / 'no.pem'}: No such file or directory" in capsys.readouterr().err
    cert, key = self_signed(tmp_path)
    assert main(["ui", "--db", db, "--certfile", str(key), "--keyfile", str(key)]) == 2
    assert f"--certfile {key} holds no PEM certificate" in capsys.readouterr().err
    assert main(["ui", "--db", db, "--certfile", str(cert), "--keyfile", str(cert)]) == 2
    assert f"--keyfile {cert} holds no PEM private key" in capsys.readouterr().err
    (tmp_path / "other").mkdir()
    _, other_key = self_signed(tmp_path / "other")
    assert main(["ui", "--db", db, "--certfile", str(cert), "--keyfile", str(other_key)]) == 2
    assert f"the key in --keyfile {other_key} is not the certificate's" in capsys.readouterr().err


# On a real server ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UiServer]:
    root = tmp_path_factory.mktemp("served")
    url = f"sqlite:///{root / 'runs.db'}"
    created = SQLStore(url)
    created.list_runs()  # the inspector opens an existing database only
    created.close()
    with ui_server(url, root / "ui.log") as server:
        yield server


@pytest.mark.slow  # a real `tether ui` process
def test_an_endless_chunked_sign_in_is_refused_without_the_server_holding_it(served: UiServer) -> None:
    before = peak_memory(served.process.pid)
    sent = 64 * 1024 * 1024  # 8,000 times the sign-in form's limit
    with socket.create_connection(("127.0.0.1", served.port), timeout=60) as connection:
        connection.sendall(
            b"POST /login HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/x-www-form-urlencoded\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
        )
        answer = bytearray()
        reader = threading.Thread(target=lambda: answer.extend(connection.recv(65536)), daemon=True)
        reader.start()
        chunk = b"%x\r\n%s\r\n" % (1 << 20, b"x" * (1 << 20))
        for _ in range(sent >> 20):
            try:
                connection.sendall(chunk)
            except OSError:  # the server may close once it answered
                break
        reader.join(timeout=60)
    assert answer.startswith(b"HTTP/1.1 413 "), bytes(answer[:200])
    assert peak_memory(served.process.pid) - before < sent // 4  # (the bytes were never held)


@pytest.mark.slow  # a real `tether ui` process
def test_a_declared_oversize_body_is_refused_unread(served: UiServer) -> None:
    with socket.create_connection(("127.0.0.1", served.port), timeout=30) as connection:
        connection.sendall(
            b"POST /login HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/x-www-form-urlencoded\r\n"
            b"Content-Length: 1000000000\r\n\r\ntoken="
        )
        assert connection.recv(65536).startswith(b"HTTP/1.1 413 ")


@pytest.mark.slow  # a real `tether ui` process
def test_signing_out_ends_the_streams_the_session_opened(served: UiServer) -> None:
    assert served.token is not None
    with httpx.Client(base_url=served.base, timeout=30, follow_redirects=True) as browser:
        assert browser.get(f"/?token={served.token}").status_code == 200  # (redirected, signed in)
        page = browser.get("/inbox").text
        with browser.stream("GET", "/live", headers={"Sec-Fetch-Mode": "cors"}) as stream:
            lines = stream.iter_lines()
            assert next(lines) == "event: changed"
            with httpx.Client(base_url=served.base, cookies=browser.cookies, timeout=30) as other_tab:
                assert other_tab.post("/logout", data={"csrf": csrf_of(page)}).status_code == 303
            rest = list(lines)  # the stream ends
        assert "event: signed-out" in rest
        assert "event: changed" not in rest
        assert browser.get("/live").status_code == 401


@pytest.mark.slow  # a real `tether ui` process
def test_the_real_server_refuses_another_host_name(served: UiServer) -> None:
    with socket.create_connection(("127.0.0.1", served.port), timeout=30) as connection:
        connection.sendall(b"GET / HTTP/1.1\r\nHost: rebound.attacker.example:80\r\nConnection: close\r\n\r\n")
        answer = b""
        while chunk := connection.recv(65536):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 400 ")
    assert b"not to 'rebound.attacker.example'" in answer


@pytest.mark.slow  # a real `tether ui` process
def test_over_tls_with_named_tokens(tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path)
    tokens = tmp_path / "tokens.toml"
    tokens.write_text(TOKENS_TOML, encoding="utf-8")
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    created = SQLStore(url)
    created.list_runs()  # the inspector opens an existing database only
    created.close()
    tls = ["--certfile", str(cert), "--keyfile", str(key), "--tokens", str(tokens)]
    with ui_server(url, tmp_path / "ui.log", *tls) as server:
        assert server.base.startswith("https://127.0.0.1:")
        assert server.token is None  # the named tokens are the way in
        trusted = ssl.create_default_context(cafile=str(cert))
        with httpx.Client(base_url=server.base, verify=trusted, follow_redirects=False, timeout=30) as browser:
            answer = browser.post("/login", data={"token": ALICE})
            assert answer.status_code == 303
            cookie = answer.headers["set-cookie"]
            assert cookie.startswith(f"__Host-tether_ui_{server.port}=")
            assert "Secure" in cookie
            assert "alice · every tenant" in browser.get("/").text
        with pytest.raises(httpx.TransportError):  # no plain HTTP on that port
            httpx.get(server.base.replace("https://", "http://"), timeout=30).raise_for_status()


# What the docs show -----------------------------------------------------------------------------
GUIDE = Path(__file__).resolve().parent.parent / "docs" / "guides" / "inspector.md"


def readme_block(opening: str) -> str:
    """The inspector guide's code block that begins with ``opening`` (its fence line included), without the fences."""
    text = GUIDE.read_text(encoding="utf-8")
    start = text.index(opening)
    body = start + len(opening.split("\n", 1)[0]) + 1
    return text[body : text.index("```\n", body)]


def test_the_readmes_tokens_file_is_one_tether_ui_reads(tmp_path: Path) -> None:
    block = readme_block("```toml\n  # tokens.toml\n")  # (in a list item: indented)
    path = tmp_path / "tokens.toml"
    path.write_text("\n".join(line.removeprefix("  ") for line in block.splitlines()), encoding="utf-8")
    credentials = Credentials.from_file(path)
    alice, bob = credentials.grant("alice-token-at-least-16-chars"), credentials.grant("bob-token-at-least-16-chars")
    assert alice is not None
    assert (alice.name, alice.tenant, alice.may_decide) == ("alice", None, True)
    assert bob is not None
    assert (bob.name, bob.tenant, bob.may_decide) == ("bob", "acme", False)


def test_the_readmes_create_app_serves_named_tokens(store: SQLStore, project: Project) -> None:
    found: dict[str, Any] = {}
    block = readme_block("```python\nimport os\n\nfrom tether.policy.access import Credentials, NamedToken")
    os.environ.update(TETHER_DB=store.url, ALICE_TOKEN=ALICE, BOB_TOKEN=BOB)
    try:
        exec(compile(block, str(GUIDE), "exec"), found)
    finally:
        for name in ("TETHER_DB", "ALICE_TOKEN", "BOB_TOKEN"):
            os.environ.pop(name)
    run = project.park(store, tenant="globex")
    app = create_app(store, found["credentials"], allowed_hosts=["inspector.example.com"])
    ours = TestClient(app, follow_redirects=False, base_url="https://inspector.example.com")
    assert ours.post("/login", data={"token": BOB}).status_code == 303
    assert run.run_id not in ours.get("/").text  # bob sees acme's runs only
    assert TestClient(app, base_url="http://localhost").get("/").status_code == 400  # not one of its names
