"""`tether ui`'s defences in a real browser: what Chromium does with the cookie, links and streams.

The servers are the real command over HTTPS (a self-signed certificate the browser is told to
accept, as a person clicks through the warning once) with named tokens: alice approves, bob
views. A person signs in and decides under their token's name; a viewer sees no form; a link on
another site's page (another host, or another port of this one) cannot swap the signed-in
session; signing out in one tab stops the live page in another; an idle session times out and
the open page says so; two inspectors on one host keep their own sessions.

Screenshots go to the test's directory, or to ``$TETHER_UI_SCREENSHOTS``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tether.stores.sql import SQLStore
from ui_runs import Project
from ui_servers import ALICE, BOB, TOKENS_TOML, UiServer, self_signed, ui_server

pytestmark = pytest.mark.slow


@dataclass
class Secured:
    """A ``tether ui`` over TLS with named tokens, and its parked runs."""

    server: UiServer
    base: str
    """``https://localhost:PORT/``: the name the certificate was made for."""
    parked: list[str]


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    root = tmp_path_factory.mktemp("secured")
    project = Project.make(root / "project", echoed="Checking the invoice.", quoted="")
    cert, key = self_signed(root)
    tokens = root / "tokens.toml"
    tokens.write_text(TOKENS_TOML, encoding="utf-8")
    url = f"sqlite:///{root / 'runs.db'}"
    store = SQLStore(url)
    try:
        parked = [project.park(store, prompt=f"Refund INV-7, run {n}.").run_id for n in range(4)]
    finally:
        store.close()
    options = ["--certfile", str(cert), "--keyfile", str(key), "--tokens", str(tokens)]
    with ui_server(url, root / "ui.log", *options) as server:
        yield Secured(server, f"https://localhost:{server.port}/", parked)


@pytest.fixture(scope="module")
def idle(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UiServer]:
    """A plain-HTTP inspector on loopback whose sessions end after 2 s without a person's request."""
    root = tmp_path_factory.mktemp("idle")
    url = f"sqlite:///{root / 'runs.db'}"
    store = SQLStore(url)
    try:
        Project.make(root / "project").park(store)
    finally:
        store.close()
    with ui_server(url, root / "ui.log", "--session-idle", "2s") as server:
        yield server


@pytest.fixture
def tls_context(browser: Any) -> Iterator[Any]:
    """A fresh profile that accepts the self-signed certificate, as a person who clicked through once."""
    from playwright.sync_api import expect

    from support import BROWSER_WAIT_MS

    expect.set_options(timeout=BROWSER_WAIT_MS)
    made = browser.new_context(viewport={"width": 1280, "height": 860}, ignore_https_errors=True)
    yield made
    made.close()


def sign_in(context: Any, base: str, token: str, page_path: str = "inbox") -> Any:
    """A page signed in with the form, on ``page_path``."""
    from playwright.sync_api import expect

    page = context.new_page()
    page.goto(base + page_path)
    expect(page.get_by_role("heading", name="Sign in")).to_be_visible()
    page.get_by_label("Token").fill(token)
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_test_id("who")).to_be_visible()
    return page


def test_an_approver_signs_in_over_tls_and_decides_under_the_tokens_name(
    secured: Secured, tls_context: Any, shots: Path
) -> None:
    from playwright.sync_api import expect

    page = tls_context.new_page()
    page.goto(secured.base + "inbox")
    page.screenshot(path=shots / "ui-sign-in.png")
    page = sign_in(tls_context, secured.base, ALICE)
    assert page.url == secured.base + "inbox"  # the page it asked for
    expect(page.get_by_test_id("who")).to_have_text("alice · every tenant")
    [cookie] = tls_context.cookies()
    assert cookie["name"] == f"__Host-tether_ui_{secured.server.port}"
    assert (cookie["secure"], cookie["httpOnly"], cookie["sameSite"], cookie["path"]) == (True, True, "Strict", "/")
    assert ALICE not in cookie["value"]

    run = secured.parked[0]
    card = page.locator(f"section.turn[data-run='{run}'] article.pending")
    expect(card.get_by_test_id("deciding-as")).to_have_text("Deciding as alice")
    expect(card.get_by_label("Decided by")).to_have_count(0)
    page.screenshot(path=shots / "ui-inbox-named.png", full_page=True)
    card.get_by_role("button", name="Approve", exact=True).click()
    expect(page.get_by_role("status")).to_contain_text("Decision recorded for toolu_refund")
    page.goto(f"{secured.base}runs/{run}")
    expect(page.get_by_test_id("run-status")).to_have_text("done")
    expect(page.locator("table.timeline")).to_contain_text("refund approved by alice")


def test_a_viewer_sees_what_waits_and_no_way_to_decide(secured: Secured, tls_context: Any, shots: Path) -> None:
    from playwright.sync_api import expect

    page = sign_in(tls_context, secured.base, BOB)
    expect(page.get_by_test_id("who")).to_have_text("bob · every tenant · viewer")
    expect(page.get_by_test_id("viewer-only").first).to_be_visible()
    expect(page.get_by_role("button", name="Approve", exact=True)).to_have_count(0)
    page.screenshot(path=shots / "ui-inbox-viewer.png", full_page=True)


@pytest.mark.parametrize("elsewhere", ["https://evil.test/", "https://localhost:4443/"])
def test_a_link_on_another_sites_page_cannot_swap_the_signed_in_session(
    secured: Secured, tls_context: Any, shots: Path, elsewhere: str
) -> None:
    from playwright.sync_api import expect

    page = sign_in(tls_context, secured.base, ALICE, page_path="")
    lure = f'<a id="lure" href="{secured.base}inbox?token={BOB}">Your inbox</a>'  # bob's own token
    tls_context.route(elsewhere + "**", lambda route: route.fulfill(content_type="text/html", body=lure))
    page.goto(elsewhere)
    page.click("#lure")
    expect(page.get_by_role("alert")).to_contain_text("opened from another site's page, so it signed nobody in")
    if "evil" in elsewhere:
        page.screenshot(path=shots / "ui-login-csrf-refused.png")
    page.goto(secured.base)
    expect(page.get_by_test_id("who")).to_have_text("alice · every tenant")  # still alice's session


def test_a_token_address_opened_by_the_person_never_replaces_another_session(
    secured: Secured, tls_context: Any
) -> None:
    from playwright.sync_api import expect

    page = sign_in(tls_context, secured.base, ALICE, page_path="")
    page.goto(f"{secured.base}?token={BOB}")  # typed: the browser says nobody else sent it
    expect(page.get_by_role("alert")).to_contain_text("You are signed in as alice; this address signs in as bob.")
    page.get_by_role("button", name="Sign out").click()
    page.goto(f"{secured.base}?token={BOB}")
    expect(page.get_by_test_id("who")).to_have_text("bob · every tenant · viewer")
    assert "token" not in page.url


def test_signing_out_in_one_tab_stops_the_live_page_in_another(secured: Secured, tls_context: Any) -> None:
    from playwright.sync_api import expect

    watching = sign_in(tls_context, secured.base, ALICE)
    main = watching.locator("main")
    expect(main).to_have_attribute("data-state", "live")  # listening to the inbox's stream
    other = tls_context.new_page()
    other.goto(f"{secured.base}runs/{secured.parked[1]}")
    other.get_by_role("button", name="Sign out").click()
    expect(other.get_by_role("heading", name="Sign in")).to_be_visible()
    expect(main).to_have_attribute("data-state", "signed-out")  # its stream said so and closed
    assert watching.evaluate("getComputedStyle(document.querySelector('main'), '::before').content") == (
        '"signed out: reload the page to sign in again"'
    )
    watching.reload()
    expect(watching.get_by_role("heading", name="Sign in")).to_be_visible()


def test_an_idle_session_times_out_and_the_open_page_says_so(idle: UiServer, context: Any, shots: Path) -> None:
    from playwright.sync_api import expect

    page = context.new_page()
    page.goto(idle.address)
    page.goto(idle.base + "inbox")
    main = page.locator("main")
    expect(main).to_have_attribute("data-state", "live")
    expect(main).to_have_attribute("data-state", "signed-out")  # 2 s later: its stream kept nothing alive
    page.screenshot(path=shots / "ui-signed-out.png")
    page.reload()
    expect(page.get_by_role("heading", name="Sign in")).to_be_visible()


def test_two_inspectors_on_one_host_keep_their_own_sessions(secured: Secured, idle: UiServer, tls_context: Any) -> None:
    from playwright.sync_api import expect

    on_tls = sign_in(tls_context, secured.base, ALICE, page_path="")
    on_plain = tls_context.new_page()
    on_plain.goto(idle.address.replace("127.0.0.1", "localhost"))  # the same host name, another port
    expect(on_plain.get_by_test_id("who")).to_have_text("every tenant")
    names = sorted(cookie["name"] for cookie in tls_context.cookies())
    assert names == sorted([f"__Host-tether_ui_{secured.server.port}", f"tether_ui_{idle.port}"])
    on_plain.get_by_role("button", name="Sign out").click()
    on_tls.reload()
    expect(on_tls.get_by_test_id("who")).to_have_text("alice · every tenant")  # the other one stays signed in
