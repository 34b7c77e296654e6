"""`tether ui` over HTTP (Starlette's TestClient): who gets in, what each page shows, decisions.

The runs are real (tools from a module on disk, a scripted model, a rule file; see ui_runs.py)
in SQLite. Decisions resume the run synchronously here (``resume=`` the in-process driver's own
``drive``), so a test sees the run's end without waiting; the default, a background thread, is
checked through the live stream, which ends when the run does.
"""

from __future__ import annotations

import asyncio
import html
import re
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from tether import Agent, Runner, tool
from tether.core.approvals import DecideLater
from tether.errors import ConfigError
from tether.facts.events import ApprovalDecided, ToolFinished
from tether.policy.access import Credentials
from tether.stores import RunRecord, holders
from tether.stores.sql import SQLStore
from tether.surfaces.web import live, pages
from tether.surfaces.web.app import create_app
from tether.surfaces.web.decisions import TWO_EDITS, UNCONFIRMED_EDIT, InProcess
from tether.surfaces.web.listen import check_bind, is_loopback
from tether.testing import ScriptedModel
from ui_runs import SHOWN_FINGERPRINT, Project, two_calls

OPERATOR = "operator-token-0123456789"
ACME = "acme-token-0123456789"
CREDENTIALS = Credentials({OPERATOR: None, ACME: "acme"})
HTML = {"Accept": "text/html"}
YES = {"confirmed": "1"}
"""What a form whose effect is hard to take back carries once the person said yes to the page's question."""
TEMPLATES = Path(__file__).resolve().parent.parent / "src" / "tether" / "surfaces" / "web" / "templates"


@pytest.fixture
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SQLStore]:
    """SQLite, or a fresh PostgreSQL schema for the tests marked ``ON_BOTH``."""
    backend = getattr(request, "param", "sqlite")
    url = f"sqlite:///{tmp_path / 'runs.db'}" if backend == "sqlite" else request.getfixturevalue("pg_schema").url
    opened = SQLStore(url)
    yield opened
    opened.close()


ON_BOTH = pytest.mark.parametrize(
    "store", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True
)
"""Run a test on SQLite and on PostgreSQL: what the inspector reads must not depend on the backend."""


@pytest.fixture
def project(tmp_path: Path) -> Project:
    return Project.make(tmp_path / "project")


@pytest.fixture
def app(store: SQLStore) -> Any:
    return create_app(store, CREDENTIALS, resume=InProcess(store, max_wait=0).drive)


def client(app: Any, token: str | None = OPERATOR) -> TestClient:
    """A browser signed in with ``token`` through the printed address (None: not signed in)."""
    browser = TestClient(app, follow_redirects=False)
    if token is not None:
        signed = browser.get(f"/?token={token}")
        assert signed.status_code == 303, signed.text
    return browser


def csrf_of(page: str) -> str:
    found = re.search(r'name="csrf" value="([0-9a-f]+)"', page)
    assert found is not None, "the page has no form with a CSRF token"
    return found.group(1)


def decide(browser: TestClient, run_id: str, page: str, **fields: str) -> Any:
    """Post the decision form as the page rendered it, with ``fields`` filled in."""
    form = {
        "csrf": csrf_of(page),
        "run_id": run_id,
        "call_id": "toolu_refund",
        "fingerprint": SHOWN_FINGERPRINT,
        "next": "/inbox",
        **fields,
    }
    return browser.post("/decide", data=form)


# Who gets in ------------------------------------------------------------------------------------
def test_every_page_needs_a_token(app: Any, store: SQLStore, project: Project) -> None:
    run = project.park(store)
    stranger = client(app, token=None)
    for path in ("/", "/inbox", f"/runs/{run.run_id}", f"/runs/{run.run_id}/diagram.svg", "/live"):
        page = stranger.get(path, headers=HTML)
        assert page.status_code == 401, path
        assert page.headers["www-authenticate"] == "Bearer"
        assert "Sign in" in page.text
    assert stranger.get(f"/runs/{run.run_id}/live").status_code == 401
    refused = stranger.post("/decide", data={"run_id": run.run_id, "call_id": "toolu_refund", "action": "approve"})
    assert refused.status_code == 401
    assert store.load_run(run.run_id).status == "awaiting_approval"
    assert stranger.get("/static/ui.css").status_code == 200  # the sign-in page needs its style


def test_the_printed_address_signs_in_then_drops_the_token(app: Any) -> None:
    browser = TestClient(app, follow_redirects=False)
    signed = browser.get(f"/inbox?token={ACME}&x=1")
    assert signed.status_code == 303
    assert signed.headers["location"] == "/inbox?x=1"  # the token leaves the address bar and the history
    cookie = signed.headers["set-cookie"]
    assert "HttpOnly" in cookie
    assert "SameSite=strict" in cookie
    assert ACME not in cookie  # the session is a random id, not the token
    assert browser.get("/inbox").status_code == 200

    wrong = TestClient(app, follow_redirects=False).get("/?token=not-the-token-at-all", headers=HTML)
    assert wrong.status_code == 401
    assert "The token in that address is not valid." in wrong.text
    assert "set-cookie" not in wrong.headers


def test_signing_in_with_the_form_and_out_again(app: Any) -> None:
    browser = TestClient(app, follow_redirects=False)
    refused = browser.post("/login", data={"token": "not-the-token-at-all"})
    assert refused.status_code == 401
    assert "That token is not valid." in refused.text
    signed = browser.post("/login", data={"token": ACME})
    assert (signed.status_code, signed.headers["location"]) == (303, "/")
    page = browser.get("/")
    assert page.status_code == 200
    assert "tenant acme" in page.text
    kept = dict(browser.cookies)  # a copy of the cookie, as another tab or a thief might hold it
    out = browser.post("/logout", data={"csrf": csrf_of(page.text)})
    assert out.status_code == 303
    assert browser.get("/", headers=HTML).status_code == 401
    assert TestClient(app, follow_redirects=False, cookies=kept).get("/", headers=HTML).status_code == 401  # ended
    again = TestClient(app, follow_redirects=False)
    assert again.post("/login", data={"token": ACME}).status_code == 303  # a new session for the same token
    assert again.get("/").status_code == 200


def test_a_script_uses_the_bearer_header_and_needs_no_csrf(app: Any, store: SQLStore, project: Project) -> None:
    run = project.park(store)
    script = TestClient(app, follow_redirects=False, headers={"Authorization": f"Bearer {OPERATOR}"})
    assert script.get(f"/runs/{run.run_id}").status_code == 200
    form = {"run_id": run.run_id, "call_id": "toolu_refund", "fingerprint": SHOWN_FINGERPRINT, "action": "approve"}
    assert script.post("/decide", data=form).status_code == 303
    assert store.load_run(run.run_id).status == "done"
    wrong = TestClient(app, headers={"Authorization": "Bearer not-the-token-at-all"})
    assert wrong.get("/").status_code == 401


@ON_BOTH
def test_a_tenant_token_reaches_its_tenant_only(app: Any, store: SQLStore, project: Project) -> None:
    mine = project.park(store, tenant="acme")
    theirs = project.park(store, tenant="globex")
    acme = client(app, ACME)
    listed = acme.get("/?tenant=globex").text  # the filter cannot widen what the token reaches
    assert mine.run_id in listed
    assert theirs.run_id not in listed
    assert 'name="tenant"' not in listed  # no tenant filter to offer
    inbox = acme.get("/inbox").text
    assert mine.run_id in inbox
    assert theirs.run_id not in inbox
    for path in (f"/runs/{theirs.run_id}", f"/runs/{theirs.run_id}/diagram.svg", f"/runs/{theirs.run_id}/live"):
        assert acme.get(path).status_code == 404, path
    hidden = decide(acme, theirs.run_id, inbox, action="approve")
    assert hidden.status_code == 404
    assert store.load_run(theirs.run_id).status == "awaiting_approval"

    everyone = client(app, OPERATOR).get("/").text
    assert mine.run_id in everyone
    assert theirs.run_id in everyone


# What the pages show ----------------------------------------------------------------------------
@ON_BOTH
def test_the_runs_list_filters_by_status_tenant_and_search(app: Any, store: SQLStore, project: Project) -> None:
    parked = project.park(store, tenant="acme")
    other = project.park(store, tenant="globex", prompt="Refund another.")
    browser = client(app)
    decide(browser, other.run_id, browser.get("/inbox").text, action="deny", reason="not today")
    assert store.load_run(other.run_id).status == "done"

    def listed(query: str) -> set[str]:
        page = browser.get(f"/?{query}")
        assert page.status_code == 200
        return set(re.findall(r'data-run="([^"]+)"', page.text))

    assert listed("") == {parked.run_id, other.run_id}
    assert listed("status=awaiting_approval") == {parked.run_id}
    assert listed("status=done") == {other.run_id}
    assert listed("tenant=globex") == {other.run_id}
    assert listed("q=REFUND handled") == {other.run_id}  # the answer, any case
    assert listed(f"q={parked.run_id[-6:]}") == {parked.run_id}
    assert listed("q=refund") == {parked.run_id, other.run_id}  # the pending call's tool too
    assert listed("q=nothing+like+this") == set()
    assert listed("status=no_such_status") == {parked.run_id, other.run_id}  # an unknown status filters nothing
    said = browser.get("/?status=no_such_status&since=yesterday").text
    assert "status &#39;no_such_status&#39; is not one of" in said  # and says so
    assert "the date from &#39;yesterday&#39; is not a date (YYYY-MM-DD)" in said


def test_the_runs_list_pages_over_every_run_with_its_filters(app: Any, store: SQLStore) -> None:
    day = 1_800_000_000.0  # 2027-01-15, in any zone
    for n in range(120):
        spec = {"agent": "researcher" if n % 2 else "writer", "model": "claude-sonnet-4-5", "prompt": f"Task {n}"}
        created = day + n * 3600.0
        store.create_run(RunRecord(id=f"run_{n:03d}", status="done", version=1, spec=spec, created_at=created), [])
    browser = client(app)

    def listed(query: str) -> tuple[list[str], str]:
        page = browser.get(f"/?{query}").text
        count = re.search(r'data-testid="count">(.*?)</p>', page, re.S)
        assert count is not None
        return re.findall(r'data-run="([^"]+)"', page), " ".join(html.unescape(count.group(1)).split())

    first, count = listed("")
    assert (first[0], first[-1], len(first)) == ("run_119", "run_070", pages.PER_PAGE)
    assert count.startswith("1\N{EN DASH}50 of 120 runs")
    third, count = listed("page=3")
    assert (third[0], third[-1]) == ("run_019", "run_000")
    assert count.startswith("101\N{EN DASH}120 of 120 runs")
    agents, count = listed("agent=RESEARCH&q=task+1")  # part of the agent's name; the prompt
    assert set(agents) == {f"run_{n:03d}" for n in range(120) if n % 2 and f"Task {n}".startswith("Task 1")}
    assert "matching these filters" in count
    some_day = time.strftime("%Y-%m-%d", time.localtime(day + 50 * 3600.0))
    that_day, _ = listed(f"since={some_day}&until={some_day}")
    assert that_day
    assert all(time.strftime("%Y-%m-%d", time.localtime(day + int(run[4:]) * 3600.0)) == some_day for run in that_day)
    page = browser.get("/?agent=writer&page=2").text
    assert 'href="/?agent=writer" rel="prev"' in page  # the pager keeps the filters


def test_the_runs_list_tells_executing_from_waiting_before_its_limit(store: SQLStore) -> None:
    """A run waiting for a retry is stored executing tools: the filter must not spend the list's limit on it."""
    store.create_run(RunRecord(id="run_executing", status="executing_tool", version=1, created_at=1.0), [])
    for n in range(3):
        waiting = {"next_due_at": 9e9}
        store.create_run(
            RunRecord(id=f"run_w{n}", status="executing_tool", version=1, summary=waiting, created_at=2.0 + n), []
        )

    def listed(status: str) -> list[str]:
        return [row.id for row in pages.runs(store, None, pages.RunsFilter(status=status), per_page=2).rows]

    assert listed("executing_tool") == ["run_executing"]
    assert listed("waiting_retry") == ["run_w2", "run_w1"]


def test_the_runs_list_says_which_run_a_child_serves(app: Any, store: SQLStore) -> None:
    link = {"run_id": "run_root", "call_id": "toolu_1", "tool": "review", "depth": 1, "chain": ["run_root"]}
    store.create_run(RunRecord(id="run_root", status="executing_tool", version=1, created_at=1.0), [])
    store.create_run(RunRecord(id="run_child", status="done", version=1, spec={"parent": link}, created_at=2.0), [])
    page = client(app).get("/").text
    child_row = page[page.index('data-run="run_child"') :].split("</tr>")[0]
    root_row = page[page.index('data-run="run_root"') :].split("</tr>")[0]
    assert 'child of <a href="/runs/run_root">' in child_row
    assert "child of" not in root_row


def test_the_run_page_shows_the_timeline_calls_and_messages(app: Any, store: SQLStore, project: Project) -> None:
    run = project.park(store)
    page = client(app).get(f"/runs/{run.run_id}")
    assert page.status_code == 200
    text = html.unescape(page.text)
    assert 'data-testid="run-status">awaiting_approval<' in text
    assert "step 1" in text  # the one model call, with its tokens
    assert "1 / 1 / 0 / 0" in text
    assert "approval requested" in text
    assert "refund (the tool is marked approval=True)" in text  # why it waits
    assert "echo ok" in text  # the echo call's result in the timeline
    assert '"invoice": "INV-7"' in text  # the full input of every call
    assert SHOWN_FINGERPRINT in text  # the pending call's form carries what it shows
    assert "Refund INV-7." in text  # the prompt, in the messages
    assert f'src="/runs/{run.run_id}/diagram.svg?v=' in text
    assert f'data-live="/runs/{run.run_id}/live?since=' in text  # still moving: the page listens


def test_text_from_models_and_tools_stays_text(app: Any, store: SQLStore, project: Project) -> None:
    run = project.park(store)
    browser = client(app)
    decide(browser, run.run_id, browser.get("/inbox").text, action="approve")
    page = browser.get(f"/runs/{run.run_id}")
    assert page.status_code == 200
    assert "<script>window" not in page.text
    assert "<img src=x" not in page.text
    assert "&lt;script&gt;window.__xss = 1&lt;/script&gt;" in page.text  # shown, as text
    assert "script-src 'self'" in page.headers["content-security-policy"]  # and nothing inline could run anyway
    assert page.headers["x-frame-options"] == "DENY"
    assert page.headers["x-content-type-options"] == "nosniff"


def test_invisible_characters_in_a_calls_input_are_shown_as_escapes(app: Any, store: SQLStore, tmp_path: Path) -> None:
    """The approver must see the input that runs: a right-to-left override would reorder what is shown."""
    hidden = "INV-\u202e7-\u200bx\x1b[2J"
    project = Project.make(tmp_path / "hidden", echoed=hidden)
    run = project.park(store)
    page = client(app).get(f"/runs/{run.run_id}").text
    assert "\u202e" not in page
    assert "\u200b" not in page
    assert "\x1b" not in page
    assert r"INV-\u202e7-\u200bx\u001b[2J" in page  # the tool's input and output, and the model's request


def test_templates_never_turn_escaping_off() -> None:
    for template in TEMPLATES.glob("*.html"):
        text = template.read_text(encoding="utf-8")
        assert "|safe" not in text.replace(" ", ""), template.name
        assert "autoescape false" not in text, template.name


def test_undecodable_text_is_shown_escaped(app: Any, store: SQLStore, tmp_path: Path) -> None:
    binary = Project.make(
        tmp_path / "binary", echoed="bytes \udcff\udcfe end"
    )  # a lone surrogate, as a binary file gives
    run = binary.park(store)
    page = client(app).get(f"/runs/{run.run_id}")
    assert page.status_code == 200
    assert "bytes \\udcff\\udcfe end" in page.text


def test_an_unknown_run_is_404(app: Any) -> None:
    page = client(app).get("/runs/run_nope", headers=HTML)
    assert page.status_code == 404
    assert "run_nope" in page.text


def test_the_diagram_is_svg_that_runs_nothing(app: Any, store: SQLStore, project: Project, graphviz: None) -> None:
    run = project.park(store)
    svg = client(app).get(f"/runs/{run.run_id}/diagram.svg")
    assert svg.status_code == 200
    assert svg.headers["content-type"] == "image/svg+xml"
    assert svg.headers["content-security-policy"] == "default-src 'none'; style-src 'unsafe-inline'"
    assert svg.content.startswith(b"<?xml")
    assert b"Awaiting approval" in svg.content
    assert b"#40E0D0" in svg.content.upper()  # the current state, highlighted


def test_the_diagram_notes_the_child_runs_of_a_tree(app: Any, store: SQLStore, graphviz: None) -> None:
    from tether.examples import writer_reviewer

    result, *_ = writer_reviewer.run(store)  # parked at the writer's publish, after the reviewer's child run
    svg = client(app).get(f"/runs/{result.run_id}/diagram.svg")
    assert svg.status_code == 200
    assert b"Child runs" in svg.content
    assert b"(reviewer): done" in svg.content


# Decisions ------------------------------------------------------------------------------------
@ON_BOTH
def test_approving_in_the_inbox_runs_the_call_and_the_run_ends(app: Any, store: SQLStore, project: Project) -> None:
    run = project.park(store)
    browser = client(app)
    inbox = browser.get("/inbox").text
    assert '"amount": 20' in html.unescape(inbox)
    decided = decide(browser, run.run_id, inbox, action="approve", by="alice")
    assert decided.status_code == 303
    assert decided.headers["location"] == f"/inbox?decided=toolu_refund&run={run.run_id}"
    assert store.load_run(run.run_id).status == "done"
    events = store.load_events(run.run_id)
    [approval] = [e.fact for e in events if isinstance(e.fact, ApprovalDecided)]
    assert (approval.approved, approval.actor, approval.fingerprint) == (True, "alice", SHOWN_FINGERPRINT)
    results = {e.fact.call_id: e.fact.content for e in events if isinstance(e.fact, ToolFinished)}
    assert results["toolu_refund"] == "refunded 20.0 on INV-7"
    after = browser.get(decided.headers["location"]).text
    assert f'Decision recorded for <code>toolu_refund</code> of run <a href="/runs/{run.run_id}">' in after
    assert "Nothing waits for a decision." in after


def test_denying_tells_the_model_why(app: Any, store: SQLStore, project: Project) -> None:
    run = project.park(store)
    browser = client(app)
    page = browser.get(f"/runs/{run.run_id}").text
    decided = decide(browser, run.run_id, page, action="deny", reason="no refunds today", next=f"/runs/{run.run_id}")
    assert decided.headers["location"] == f"/runs/{run.run_id}?decided=toolu_refund"
    events = store.load_events(run.run_id)
    [approval] = [e.fact for e in events if isinstance(e.fact, ApprovalDecided)]
    assert (approval.approved, approval.reason, approval.actor) == (False, "no refunds today", "tether ui")
    results = {e.fact.call_id: e.fact for e in events if isinstance(e.fact, ToolFinished)}
    assert results["toolu_refund"].is_error
    assert "no refunds today" in results["toolu_refund"].content


@pytest.mark.parametrize(
    ("edited", "status", "said"),
    [
        ("{not json", 422, "the edited input is not valid JSON"),
        ('["a list"]', 422, "the edited input must be a JSON object"),
        ('{"invoice": "INV-7", "amount": "lots"}', 422, "amount"),
        ('{"invoice": "INV-7", "amount": 500}', 409, "rule 1 (deny-large-refunds): refunds over 100 need a manager"),
    ],
)
def test_an_edit_the_schema_or_the_rules_refuse_changes_nothing(
    app: Any, store: SQLStore, project: Project, edited: str, status: int, said: str
) -> None:
    run = project.park(store)
    browser = client(app)
    refused = decide(browser, run.run_id, browser.get("/inbox").text, action="edit", input=edited)
    assert refused.status_code == status
    [error] = re.findall(r'data-testid="decision-error">([^<]*)<', refused.text)
    assert said in error.replace("&#39;", "'")
    assert f">{_escaped(edited)}</textarea>" in refused.text  # what they typed is kept, to fix
    assert store.load_run(run.run_id).status == "awaiting_approval"
    assert not [e for e in store.load_events(run.run_id) if isinstance(e.fact, ApprovalDecided)]


def test_an_edit_within_the_rules_runs_with_the_edited_input(app: Any, store: SQLStore, project: Project) -> None:
    run = project.park(store)
    browser = client(app)
    edited = '{"invoice": "INV-7", "amount": 15}'
    assert decide(browser, run.run_id, browser.get("/inbox").text, action="edit", input=edited).status_code == 303
    results = {
        e.fact.call_id: e.fact.content for e in store.load_events(run.run_id) if isinstance(e.fact, ToolFinished)
    }
    assert results["toolu_refund"].endswith("edited the input before running the tool.)\nrefunded 15.0 on INV-7")
    page = browser.get(f"/runs/{run.run_id}").text
    edited_at, asked_at = page.index("Input as edited by a person (what ran)"), page.index("Input the model asked for")
    assert edited_at < asked_at  # what ran first, as `tether audit` shows it


def test_approve_with_an_edited_input_in_the_form_is_refused_not_run_as_shown(
    app: Any, store: SQLStore, project: Project
) -> None:
    """The page's "Approve" sends the input field too: if it no longer holds what was shown, nothing is decided."""
    run = project.park(store)
    browser = client(app)
    inbox = browser.get("/inbox").text
    for typed in ('{"invoice": "INV-7", "amount": 5}', "{not json"):
        refused = decide(browser, run.run_id, inbox, action="approve", input=typed)
        assert refused.status_code == 422
        [error] = re.findall(r'data-testid="decision-error">([^<]*)<', refused.text)
        assert html.unescape(error) == UNCONFIRMED_EDIT
        assert f">{_escaped(typed)}</textarea>" in refused.text
    assert not [e for e in store.load_events(run.run_id) if isinstance(e.fact, ApprovalDecided)]

    same = '{\n  "amount": 20,\n  "invoice": "INV-7"\n}'  # what was shown, laid out otherwise
    assert decide(browser, run.run_id, inbox, action="approve", input=same).status_code == 303
    [approval] = [e.fact for e in store.load_events(run.run_id) if isinstance(e.fact, ApprovalDecided)]
    assert (approval.approved, approval.input) == (True, None)


def test_an_edit_in_the_fields_and_another_in_the_raw_json_is_refused(
    app: Any, store: SQLStore, project: Project
) -> None:
    """Without the page's script both ways of editing are sent: they must say one input."""
    run = project.park(store)
    browser = client(app)
    inbox = browser.get("/inbox").text
    fields = {"f.invoice": "INV-7", "t.invoice": "string", "f.amount": "5", "t.amount": "number"}
    refused = decide(browser, run.run_id, inbox, action="edit", input='{"invoice": "INV-7", "amount": 6}', **fields)
    assert refused.status_code == 422
    assert TWO_EDITS in html.unescape(refused.text)
    unreadable = decide(browser, run.run_id, inbox, action="edit", **{**fields, "f.amount": "lots"})
    assert unreadable.status_code == 422
    [beside] = re.findall(r'data-testid="field-error">([^<]*)<', unreadable.text)
    assert html.unescape(beside) == "'lots' is not a number"
    assert not [e for e in store.load_events(run.run_id) if isinstance(e.fact, ApprovalDecided)]

    agreed = decide(browser, run.run_id, inbox, action="edit", input='{"amount": 5, "invoice": "INV-7"}', **fields)
    assert agreed.status_code == 303
    [approval] = [e.fact for e in store.load_events(run.run_id) if isinstance(e.fact, ApprovalDecided)]
    assert approval.input == {"invoice": "INV-7", "amount": 5}


def test_deciding_a_turn_at_once_stops_at_a_refusal_and_says_what_was_decided(store: SQLStore, tmp_path: Path) -> None:
    app = create_app(store, CREDENTIALS, resume=InProcess(store, max_wait=0).drive)
    run = Project.make(tmp_path / "pair", turns=two_calls()).park(store)
    browser = client(app)
    page = browser.get(f"/runs/{run.run_id}").text
    assert 'data-testid="decide-all"' in page
    form = {
        "csrf": csrf_of(page),
        "run_id": run.run_id,
        "next": f"/runs/{run.run_id}",
        "all.toolu_refund": SHOWN_FINGERPRINT,
        "all.toolu_ship": "0123456789abcdef",  # not what was shown
        "action": "approve-all",
    }
    refused = browser.post("/decide", data=form)
    assert refused.status_code == 409
    [error] = re.findall(r'data-testid="decision-error">([^<]*)<', refused.text)
    assert html.unescape(error).startswith("toolu_refund decided; ")
    assert "fingerprint" in error
    decided = [e.fact.call_id for e in store.load_events(run.run_id) if isinstance(e.fact, ApprovalDecided)]
    assert decided == ["toolu_refund"]  # each decision is its own: the first stays
    assert browser.post("/decide", data={**form, "action": "maybe"}).status_code == 422


def test_cancel_and_fork_need_a_yes_and_say_what_they_will_do(app: Any, store: SQLStore, project: Project) -> None:
    run = project.park(store, tenant="acme")
    browser = client(app)
    page = browser.get(f"/runs/{run.run_id}").text
    assert 'data-testid="control-cancel"' in page
    assert 'data-testid="control-resume"' not in page  # it waits for a person: nothing to drive on
    form = {"csrf": csrf_of(page), "run_id": run.run_id, "action": "cancel", "reason": "withdrawn"}
    asked = browser.post("/control", data=form)
    assert asked.status_code == 200
    assert f"Cancel run {run.run_id}?" in asked.text
    assert 'name="confirmed" value="1"' in asked.text
    assert 'name="reason" value="withdrawn"' in asked.text  # the yes sends the same form again
    assert store.load_run(run.run_id).status == "awaiting_approval"

    other = client(app, ACME)
    mine = {**form, "csrf": csrf_of(other.get(f"/runs/{run.run_id}").text), **YES}
    assert client(app, ACME).post("/control", data={**mine, "run_id": "run_nope"}).status_code == 403  # csrf
    done = other.post("/control", data=mine)
    assert done.status_code == 303
    assert store.load_run(run.run_id).status == "cancelled"
    assert "withdrawn" in str(store.load_run(run.run_id).summary["error"])
    again = other.post("/control", data=mine)
    assert again.status_code == 409
    assert "control-error" in again.text
    assert other.post("/control", data={**mine, "action": "explode"}).status_code == 422

    fork = {"csrf": csrf_of(page), "run_id": run.run_id, "at": "1"}
    asked = browser.post("/fork", data=fork)
    assert asked.status_code == 200
    assert "tools that need no approval run right away" in html.unescape(asked.text)
    assert len(store.list_runs()) == 1  # no fork was made


@ON_BOTH
def test_resume_is_offered_only_while_no_live_process_drives_the_run(app: Any, store: SQLStore) -> None:
    run_id = Runner(Agent(model=ScriptedModel([])), store).create("Say hi.").id  # thinking, driven by nobody
    browser = client(app)

    def offered() -> bool:
        return 'data-testid="control-resume"' in browser.get(f"/runs/{run_id}").text

    assert offered()
    me = holders.this_process()
    store.claim_run(run_id, "retry:1", now=time.time(), ttl=60, holder=me)  # a retry under way, in a live process
    assert not offered()
    store.claim_run(run_id, "retry:1", now=time.time() - 120, ttl=60, holder=me)  # its lease ran out
    assert offered()
    gone = replace(me, started=(me.started or 0) + 1)  # this pid, started at another time: that process is gone
    store.claim_run(run_id, "dead:1", now=time.time(), ttl=60, force=True, holder=gone)
    assert offered()
    store.release_run(run_id, "dead:1")
    assert store.lease_of(run_id) is None
    assert offered()


def test_a_decision_is_bound_to_what_was_shown_and_made_once(app: Any, store: SQLStore, project: Project) -> None:
    run = project.park(store)
    browser = client(app)
    inbox = browser.get("/inbox").text
    stale = decide(browser, run.run_id, inbox, action="approve", fingerprint="0123456789abcdef")
    assert stale.status_code == 409
    assert "fingerprint" in stale.text
    assert decide(browser, run.run_id, inbox, action="approve").status_code == 303
    again = decide(browser, run.run_id, inbox, action="deny")  # a second tab, still showing the call
    assert again.status_code == 409
    assert [e.fact.approved for e in store.load_events(run.run_id) if isinstance(e.fact, ApprovalDecided)] == [True]


def _cards(page: str) -> dict[str, str]:
    """Each pending call's card on a page, by its run's id."""
    cards = re.findall(r'<article class="pending card" id="pending-(run_[0-9a-f]+)-[^"]*".*?</article>', page, re.S)
    bodies = re.findall(r'<article class="pending card".*?</article>', page, re.S)
    return dict(zip(cards, bodies, strict=True))


def test_a_refusal_shows_on_its_own_runs_card_when_two_runs_wait_on_one_call_id(
    app: Any, store: SQLStore, project: Project
) -> None:
    """Call ids are the model's (a fork keeps its original's): the error names one run's call, not every card's."""
    first, second = project.park(store), project.park(store)
    browser = client(app)
    inbox = browser.get("/inbox").text
    refused = decide(browser, first.run_id, inbox, action="edit", input='{"invoice": "INV-7"}')
    assert refused.status_code == 422
    cards = _cards(refused.text)
    assert "decision-error" in cards[first.run_id]
    assert "decision-error" not in cards[second.run_id]
    assert "{&#34;invoice&#34;: &#34;INV-7&#34;}" in cards[first.run_id]  # the draft, kept beside its own form
    assert "{&#34;invoice&#34;: &#34;INV-7&#34;}" not in cards[second.run_id]


def test_a_refusal_about_a_call_no_longer_shown_is_said_atop_the_page(
    app: Any, store: SQLStore, project: Project
) -> None:
    decided, waiting = project.park(store), project.park(store)
    browser = client(app)
    inbox = browser.get("/inbox").text
    assert decide(browser, decided.run_id, inbox, action="approve").status_code == 303
    again = decide(browser, decided.run_id, inbox, action="deny")  # a second tab, still showing the call
    assert again.status_code == 409
    assert list(_cards(again.text)) == [waiting.run_id]
    [problem] = re.findall(r'<p class="problem" role="alert" data-testid="decision-error">(.*?)</p>', again.text, re.S)
    assert "already decided" in html.unescape(problem)


def _service_agent() -> Agent:
    """A service's agent, made in Python: its runs' records name no tools module for the inspector to load."""
    from ui_runs import script

    @tool(approval=True)
    def refund(invoice: str, amount: float) -> str:
        """Refund an invoice."""
        return f"refunded {amount} on {invoice}"

    @tool
    def echo(text: str) -> str:
        """Say the text back."""
        return text

    return Agent(ScriptedModel(script("checking", "")), tools=[echo, refund])


def test_a_run_made_in_python_is_approved_with_the_agent_given_to_the_inspector(store: SQLStore) -> None:
    agent = _service_agent()
    run = Runner(agent, store, approver=DecideLater()).run("Refund INV-7.")
    app = create_app(store, CREDENTIALS, agent=agent, resume=InProcess(store, max_wait=0, agent=agent).drive)
    browser = client(app)
    assert decide(browser, run.run_id, browser.get("/inbox").text, action="approve").status_code == 303
    assert store.load_run(run.run_id).status == "done"
    results = {
        e.fact.call_id: e.fact.content for e in store.load_events(run.run_id) if isinstance(e.fact, ToolFinished)
    }
    assert results["toolu_refund"] == "refunded 20.0 on INV-7"


def test_without_its_agent_a_python_runs_approval_is_refused_saying_why_and_a_denial_waits_for_its_program(
    app: Any, store: SQLStore
) -> None:
    run = Runner(_service_agent(), store, approver=DecideLater()).run("Refund INV-7.")
    browser = client(app)
    refused = decide(browser, run.run_id, browser.get("/inbox").text, action="approve")
    assert refused.status_code == 409
    assert "started from Python" in html.unescape(refused.text)
    assert store.load_run(run.run_id).status == "awaiting_approval"

    denied = decide(browser, run.run_id, browser.get("/inbox").text, action="deny", reason="no")
    assert denied.status_code == 303
    assert store.load_run(run.run_id).status == "executing_tool"  # decided, not driven: its program resumes it
    later = Runner(_service_agent(), store).drive(run.run_id)
    assert later.status == "done"


@pytest.mark.parametrize(
    ("csrf", "headers"),
    [
        ("", {}),
        ("0" * 32, {}),
        (None, {"Origin": "http://evil.example"}),
        (None, {"Sec-Fetch-Site": "cross-site"}),
        (None, {"Sec-Fetch-Site": "same-site"}),  # another port of the same host is another site's page
    ],
)
def test_a_forged_decision_is_refused_unread(
    app: Any, store: SQLStore, project: Project, csrf: str | None, headers: dict[str, str]
) -> None:
    run = project.park(store)
    browser = client(app)
    page = browser.get("/inbox").text
    form = {
        "csrf": csrf_of(page) if csrf is None else csrf,
        "run_id": run.run_id,
        "call_id": "toolu_refund",
        "fingerprint": SHOWN_FINGERPRINT,
        "action": "approve",
    }
    refused = browser.post("/decide", data=form, headers=headers)
    assert refused.status_code == 403
    assert store.load_run(run.run_id).status == "awaiting_approval"


def test_an_unknown_action_or_a_form_without_fingerprint_is_422(app: Any, store: SQLStore, project: Project) -> None:
    run = project.park(store)
    browser = client(app)
    inbox = browser.get("/inbox").text
    assert decide(browser, run.run_id, inbox, action="maybe").status_code == 422
    assert decide(browser, run.run_id, inbox, action="approve", fingerprint="").status_code == 422
    assert decide(browser, run.run_id, inbox, action="approve", call_id="toolu_nope").status_code == 404
    assert store.load_run(run.run_id).status == "awaiting_approval"


# Live updates -----------------------------------------------------------------------------------
def test_by_default_a_decided_run_is_driven_in_the_background_and_its_stream_ends(
    store: SQLStore, project: Project
) -> None:
    run = project.park(store)
    with TestClient(create_app(store, CREDENTIALS), follow_redirects=False) as browser:  # lifespan: the pool closes
        browser.get(f"/?token={OPERATOR}")
        page = browser.get(f"/runs/{run.run_id}").text
        version = re.search(r"live\?since=(\d+)", page)
        assert version is not None
        assert decide(browser, run.run_id, page, action="approve").status_code == 303
        with browser.stream("GET", f"/runs/{run.run_id}/live?since={version.group(1)}") as stream:
            assert stream.headers["content-type"].startswith("text/event-stream")
            said = "".join(stream.iter_text())  # the stream ends when the run does
    assert "event: changed" in said
    version_now = _version(store, run.run_id)
    assert said.rstrip().endswith(f'event: end\ndata: {{"version": {version_now}, "status": "done"}}')
    assert store.load_run(run.run_id).status == "done"


@ON_BOTH
def test_the_list_stream_says_when_any_visible_run_moves(store: SQLStore, project: Project) -> None:
    first = project.park(store, tenant="acme")
    project.park(store, tenant="globex")

    async def listen(since: str | None, tenant: str | None, polls: int) -> list[str]:
        left = [polls]

        async def gone() -> bool:
            left[0] -= 1
            return left[0] < 0

        return [m async for m in live.list_changes(store, tenant, since, poll=0, gone=gone)]

    said = asyncio.run(listen(None, "acme", 1))
    assert len(said) == 1
    assert said[0].startswith("event: changed\n")
    digest = re.search(r'"digest": "([0-9a-f]+)"', said[0])
    assert digest is not None
    assert asyncio.run(listen(digest.group(1), "acme", 3)) == []  # nothing moved
    project.park(store, tenant="globex")
    assert asyncio.run(listen(digest.group(1), "acme", 3)) == []  # another tenant's run moved
    store.append(*_touch(store, first.run_id))
    assert len(asyncio.run(listen(digest.group(1), "acme", 3))) == 1


# Binding and the command ------------------------------------------------------------------------
@pytest.mark.parametrize("host", ["127.0.0.1", "127.8.9.10", "localhost", "::1", "[::1]"])
def test_loopback_addresses(host: str) -> None:
    assert is_loopback(host)
    check_bind(host, token_given=False, tls=False)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.5", "example.com"])
def test_another_address_needs_a_token_given_for_it_and_tls(host: str) -> None:
    assert not is_loopback(host)
    with pytest.raises(ConfigError, match="give it a token"):
        check_bind(host, token_given=False, tls=True)
    with pytest.raises(ConfigError, match="in clear: give --certfile and --keyfile"):
        check_bind(host, token_given=True, tls=False)
    check_bind(host, token_given=True, tls=True)
    check_bind(host, token_given=True, tls=False, insecure=True)  # another layer encrypts, the person says


def test_tether_ui_refuses_an_open_bind_without_a_token(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from tether.surfaces.cli import main

    monkeypatch.delenv("TETHER_UI_TOKEN", raising=False)
    db = f"sqlite:///{tmp_path / 'runs.db'}"
    SQLStore(db).list_runs()  # the inspector opens an existing database only
    assert main(["ui", "--db", db, "--host", "0.0.0.0"]) == 2
    assert "--host 0.0.0.0 lets other machines reach the inspector: give it a token" in capsys.readouterr().err
    assert main(["ui", "--db", db, "--tokens", str(tmp_path / "absent.json")]) == 2
    assert "cannot read the token file" in capsys.readouterr().err
    monkeypatch.setenv("TETHER_UI_TOKEN", "short")
    assert main(["ui", "--db", db]) == 2
    assert "too weak" in capsys.readouterr().err
    monkeypatch.delenv("TETHER_UI_TOKEN")
    assert main(["ui", "--db", db, "--tokens", "t.json", "--tenant", "acme"]) == 2
    assert "give it alone" in capsys.readouterr().err


def _version(store: SQLStore, run_id: str) -> int:
    return store.load_run(run_id).version


def _touch(store: SQLStore, run_id: str) -> tuple[Any, int, list[Any]]:
    """A row rewritten at the next version (what any step does to a run), for the list stream to see."""
    from dataclasses import replace

    record = store.load_run(run_id)
    return replace(record, version=record.version + 1, updated_at=record.updated_at + 1), record.version, []


def _escaped(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&#34;")


def test_the_timeline_says_each_kind_of_fact_with_its_measures() -> None:
    from tether.facts.events import (
        BudgetExhausted,
        CacheHit,
        CallAbandoned,
        Event,
        Fact,
        ModelResponded,
        RetryScheduled,
        RunFinished,
        Warned,
    )
    from tether.models import Usage
    from tether.surfaces.web.pages import timeline

    facts: list[Fact] = [
        ModelResponded(
            content=[{"type": "text", "text": "Let me look."}, {"type": "tool_use", "id": "t1", "name": "fetch"}],
            stop_reason="tool_use",
            usage=Usage(10, 5, 3, 2),
            cost_usd=0.0012,
            latency=0.25,
        ),
        RetryScheduled("t1", "fetch", 1, 0.5, "ConnectionError", 99.0, "upstream reset", "retryable"),
        CacheHit("t2", "fetch", "key"),
        Warned("80% of max_steps used", limit="max_steps"),
        BudgetExhausted("max_cost_usd", 1.2, 1.0, "answer now"),
        CallAbandoned("t3", "host:1:a", "host:2:b", "resumed with --force"),
        RunFinished("failed", "the model API failed: 529", None, None, True),
    ]
    rows = timeline([Event(seq, 100.0 + seq, fact) for seq, fact in enumerate(facts)])
    said = [(row.kind, row.detail, row.tone, row.call_id) for row in rows]
    assert said == [
        ("step 1", "Let me look. · asks for fetch · stop: tool_use", "model", None),
        ("retry scheduled", "fetch: upstream reset", "warning", "t1"),
        ("cache hit", "fetch", "tool", "t2"),
        ("warning", "80% of max_steps used", "warning", None),
        ("budget reached", "max_cost_usd: 1.2 of 1", "warning", None),
        ("call abandoned", "by host:2:b: resumed with --force", "warning", "t3"),
        ("run failed", "the model API failed: 529", "error", None),
    ]
    assert (rows[0].usage, rows[0].cost_usd, rows[0].seconds) == (Usage(10, 5, 3, 2), 0.0012, 0.25)
    assert rows[1].seconds == 0.5


# Forks ------------------------------------------------------------------------------------------
def fork(browser: TestClient, run_id: str, page: str, at: str) -> Any:
    """Post a timeline row's fork form as the page rendered it."""
    return browser.post("/fork", data={"csrf": csrf_of(page), "run_id": run_id, "at": at, "confirmed": "1"})


def test_every_step_of_the_timeline_offers_a_fork_that_is_driven_on(
    app: Any, store: SQLStore, project: Project
) -> None:
    run = project.park(store, tenant="acme")
    before = store.load_events(run.run_id)
    browser = client(app)
    page = browser.get(f"/runs/{run.run_id}").text
    assert page.count('action="/fork"') == page.count("<tr class=") == len(pages.timeline(before))
    assert 'data-testid="fork-1"' in page
    assert ">fork at #1</button>" in page  # a row mid-turn forks from the nearest step before it

    made = fork(browser, run.run_id, page, "1")

    assert made.status_code == 303
    fork_id = made.headers["location"].removeprefix("/runs/")
    forked = store.load_run(fork_id)
    assert (forked.tenant, forked.spec["forked_from"]) == ("acme", {"run_id": run.run_id, "step": 1})
    assert forked.status == "awaiting_approval"  # driven on: the model asked for the refund again
    shown = browser.get(made.headers["location"]).text
    assert f'forked from <a href="/runs/{run.run_id}">{run.run_id}</a> at #1' in shown
    assert store.load_events(run.run_id) == before  # the original is untouched


def test_a_fork_may_edit_the_last_messages_text(app: Any, store: SQLStore, project: Project) -> None:
    from tether.facts.events import RunStarted

    run = project.park(store, tenant="acme")
    browser = client(app, ACME)
    page = browser.get(f"/runs/{run.run_id}").text
    assert 'data-testid="fork-text-1"' in page
    token = csrf_of(page)

    made = browser.post("/fork", data={"csrf": token, "run_id": run.run_id, "at": "1", "text": "Refund INV-9.", **YES})

    assert made.status_code == 303
    started = store.load_events(made.headers["location"].removeprefix("/runs/"), tenant="acme")[0].fact
    assert isinstance(started, RunStarted)
    assert started.messages == [{"role": "user", "content": [{"type": "text", "text": "Refund INV-9."}]}]
    blank = browser.post("/fork", data={"csrf": token, "run_id": run.run_id, "at": "1", "text": "  ", **YES})
    assert blank.status_code == 303  # a blank text edits nothing
    kept = store.load_events(blank.headers["location"].removeprefix("/runs/"), tenant="acme")[0].fact
    assert isinstance(kept, RunStarted)
    assert kept.messages == [{"role": "user", "content": [{"type": "text", "text": "Refund INV-7."}]}]
    mid_turn = browser.post("/fork", data={"csrf": token, "run_id": run.run_id, "at": "2", "text": "hi", **YES})
    assert mid_turn.status_code == 422  # refused, edited or not


def test_a_fork_after_tool_results_edits_the_prompt_by_default_or_by_its_number(
    app: Any, store: SQLStore, project: Project
) -> None:
    """There the last message holds only tool results: the form's message number reaches the prompt."""
    from tether.core import forks
    from tether.facts.events import RunStarted

    run = project.park(store, tenant="acme")
    browser = client(app, ACME)
    approved = decide(browser, run.run_id, browser.get("/inbox").text, action="approve", by="ann")
    assert approved.status_code == 303
    assert store.load_run(run.run_id).status == "done"
    after_results = forks.fork_points(store.load_events(run.run_id))[-1]
    page = browser.get(f"/runs/{run.run_id}").text
    assert f'data-testid="fork-message-{after_results}"' in page
    token, at = csrf_of(page), str(after_results)

    def post(**fields: str) -> Any:
        return browser.post("/fork", data={"csrf": token, "run_id": run.run_id, "at": at, **fields, **YES})

    made = post(message="0", text="Refund INV-9.")

    assert made.status_code == 303
    started = store.load_events(made.headers["location"].removeprefix("/runs/"), tenant="acme")[0].fact
    assert isinstance(started, RunStarted)
    assert started.messages[0] == {"role": "user", "content": [{"type": "text", "text": "Refund INV-9."}]}
    assert started.messages[1:] == forks.state_at(run.run_id, store.load_events(run.run_id), after_results).messages[1:]
    by_default = post(text="Refund INV-10.")  # the form's blank number: the prompt, the last user text
    assert by_default.status_code == 303
    forked = store.load_events(by_default.headers["location"].removeprefix("/runs/"), tenant="acme")[0].fact
    assert isinstance(forked, RunStarted)
    assert forked.messages[0] == {"role": "user", "content": [{"type": "text", "text": "Refund INV-10."}]}
    refused = {
        "last": post(message="-1", text="hi"),  # the tool results: no text to edit
        "far": post(message="7", text="hi"),
        "nan": post(message="first", text="hi"),
    }
    assert {name: answer.status_code for name, answer in refused.items()} == {"last": 422, "far": 422, "nan": 422}
    assert "holds no text to edit" in html.unescape(refused["last"].text)
    assert "has messages 0 to 2, not 7" in html.unescape(refused["far"].text)
    assert "must be a number (0 the first, -1 the last)" in html.unescape(refused["nan"].text)


def test_a_fork_mid_turn_forged_or_of_another_tenant_makes_nothing(app: Any, store: SQLStore, project: Project) -> None:
    mine = project.park(store, tenant="acme")
    theirs = project.park(store, tenant="globex")
    acme = client(app, ACME)
    page = acme.get(f"/runs/{mine.run_id}").text

    refused = fork(acme, mine.run_id, page, "2")
    assert refused.status_code == 422
    assert "cannot be forked at event 2: the model&#39;s tool calls" in refused.text
    assert fork(acme, mine.run_id, page, "two").status_code == 422
    assert fork(acme, theirs.run_id, page, "1").status_code == 404
    assert acme.post("/fork", data={"run_id": mine.run_id, "at": "1"}).status_code == 403  # no CSRF token
    assert {record.id for record in store.list_runs()} == {mine.run_id, theirs.run_id}
