"""Credentials: a token names its tenant (or none, for an operator); nothing else is believed."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from tether.errors import ConfigError
from tether.policy.access import MIN_TOKEN_LENGTH, Credentials, Grant, NamedToken, Role, bearer

ACME = "acme-token-0123456789"
GLOBEX = "globex-token-0123456789"
ROOT = "operator-token-0123456789"


def test_a_token_grants_its_tenant_and_nothing_else() -> None:
    credentials = Credentials({ACME: "acme", GLOBEX: "globex", ROOT: None})
    assert credentials.grant(ACME) == Grant("acme")
    assert credentials.grant(GLOBEX) == Grant("globex")
    assert credentials.grant(ROOT) == Grant(None)
    root, acme = credentials.grant(ROOT), credentials.grant(ACME)
    assert root is not None
    assert root.operator
    assert acme is not None
    assert not acme.operator
    for wrong in (None, "", ACME[:-1], ACME + "x", ACME.upper(), "acme"):
        assert credentials.grant(wrong) is None
    assert credentials.grant("\udcff" * 20) is None  # any text, even undecodable bytes, is just wrong


def test_bearer_reads_the_authorization_header() -> None:
    assert bearer(f"Bearer {ACME}") == ACME
    assert bearer(f"bearer   {ACME}  ") == ACME
    for header in (None, "", "Bearer", "Bearer ", f"Basic {ACME}", ACME):
        assert bearer(header) is None


@pytest.mark.parametrize(
    ("tokens", "problem"),
    [
        ({}, "no tokens"),
        ({"short": "acme"}, f"at least {MIN_TOKEN_LENGTH} characters"),
        ({"has space in it 0123456789": "acme"}, "spaces"),
        ({ACME: ""}, "empty tenant"),
        ({ACME: 7}, "tenant must be a string or null"),
    ],
)
def test_weak_or_malformed_tokens_are_refused(tokens: dict[str, object], problem: str) -> None:
    with pytest.raises(ConfigError, match=problem):
        Credentials(tokens)  # type: ignore[arg-type]


def test_the_error_names_a_token_by_its_place_among_several_only() -> None:
    with pytest.raises(ConfigError, match=r"^the token is too weak"):
        Credentials({"short": None})  # one token: --token
    with pytest.raises(ConfigError, match=r"^token 2 is too weak"):
        Credentials({ACME: "acme", "short": None})  # a --tokens file


def test_the_error_never_repeats_a_token() -> None:
    with pytest.raises(ConfigError) as refused:
        Credentials({"tiny-secret": "acme"})
    assert "tiny-secret" not in str(refused.value)


def test_generated_credentials_hold_one_strong_token() -> None:
    credentials, token = Credentials.generate(tenant="acme")
    assert len(token) >= 32
    assert credentials.grant(token) == Grant("acme")
    assert Credentials.generate()[1] != token


def test_tokens_from_a_json_file(tmp_path: Path) -> None:
    path = tmp_path / "tokens.json"
    path.write_text(json.dumps({ACME: "acme", ROOT: None}), encoding="utf-8")
    credentials = Credentials.from_file(path)
    assert credentials.grant(ACME) == Grant("acme")
    assert credentials.grant(ROOT) == Grant(None)
    assert credentials.tenants == {"acme", None}


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ("{not json", "not valid JSON"),
        ('["a list"]', "a JSON object of token: tenant .or null.; for named tokens with roles, write a .toml file"),
        ("{}", "no tokens"),
    ],
)
def test_a_bad_token_file_is_named(tmp_path: Path, content: str, problem: str) -> None:
    path = tmp_path / "tokens.json"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(ConfigError, match=problem) as refused:
        Credentials.from_file(path)
    assert str(path) in str(refused.value)


def test_a_missing_token_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        Credentials.from_file(tmp_path / "absent.json")


# Named tokens: who holds each, what it may do --------------------------------------------------
ALICE = "alice-token-0123456789"
BOB = "bob-token-0123456789abc"
NAMED = f"""
[[tokens]]
name = "alice"
token = "{ALICE}"
tenant = "acme"
role = "approver"

[[tokens]]
name = "bob"
sha256 = "{hashlib.sha256(BOB.encode()).hexdigest()}"
"""


def test_a_named_token_says_who_holds_it_and_whether_they_decide(tmp_path: Path) -> None:
    path = tmp_path / "tokens.toml"
    path.write_text(NAMED, encoding="utf-8")
    credentials = Credentials.from_file(path)
    alice, bob = credentials.grant(ALICE), credentials.grant(BOB)
    assert alice == Grant("acme", name="alice", role=Role.approver)
    assert alice.may_decide
    assert bob == Grant(None, name="bob", role=Role.viewer)  # only its hash was written; a viewer by default
    assert not bob.may_decide
    assert bob.operator
    assert credentials.grant(hashlib.sha256(BOB.encode()).hexdigest()) is None  # the hash is not the token
    assert Credentials({ACME: "acme"}).grant(ACME) == Grant("acme", name=None, role=Role.approver)  # unnamed: decides


def test_named_tokens_in_python() -> None:
    credentials = Credentials([NamedToken.of("alice", ALICE, role=Role.approver), NamedToken.of("bob", BOB)])
    assert credentials.grant(ALICE) == Grant(None, name="alice", role=Role.approver)
    assert credentials.grant(BOB) == Grant(None, name="bob", role=Role.viewer)
    with pytest.raises(ConfigError, match=r"^the token of 'carol' is too weak"):
        NamedToken.of("carol", "short")


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ("[[tokens]\n", "not valid TOML"),
        ("name = 'alice'\n", "must hold \\[\\[tokens\\]\\] tables"),
        ("tokens = []\n", "no tokens given"),
        (f"[[tokens]]\ntoken = '{ALICE}'\n", "token 1 has no name"),
        (f"[[tokens]]\nname = ' '\ntoken = '{ALICE}'\n", "token 1 has no name"),
        ("[[tokens]]\nname = 'alice'\n", r"token 1 \(alice\): give its token or its sha256, one of them"),
        (f"[[tokens]]\nname = 'alice'\ntoken = '{ALICE}'\nsha256 = '{'0' * 64}'\n", "one of them"),
        ("[[tokens]]\nname = 'alice'\ntoken = 'short'\n", r"token 1 \(alice\) is too weak"),
        ("[[tokens]]\nname = 'alice'\nsha256 = 'abc'\n", "64 hex digits"),
        (f"[[tokens]]\nname = 'alice'\ntoken = '{ALICE}'\nrole = 'admin'\n", "role must be viewer or approver"),
        (f"[[tokens]]\nname = 'alice'\ntoken = '{ALICE}'\ntennant = 'acme'\n", "unknown key 'tennant'"),
        (f"[[tokens]]\nname = 'alice'\ntoken = '{ALICE}'\ntenant = ''\n", "empty tenant"),
        (f'[[tokens]]\nname = "a\\u0007"\ntoken = "{ALICE}"\n', "printable characters"),
        (
            f"[[tokens]]\nname = 'alice'\ntoken = '{ALICE}'\n[[tokens]]\nname = 'alice'\ntoken = '{BOB}'\n",
            "tokens 1 and 2 are both named 'alice'",
        ),
        (
            f"[[tokens]]\nname = 'alice'\ntoken = '{ALICE}'\n[[tokens]]\nname = 'bob'\n"
            f"sha256 = '{hashlib.sha256(ALICE.encode()).hexdigest().upper()}'\n",
            "tokens 1 and 2 are the same token",
        ),
    ],
)
def test_a_bad_named_token_file_says_which_token_and_what(tmp_path: Path, content: str, problem: str) -> None:
    path = tmp_path / "tokens.toml"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(ConfigError, match=problem) as refused:
        Credentials.from_file(path)
    message = str(refused.value)
    assert message.startswith(f"the token file {path}: ")
    assert "\n" not in message
    assert ALICE not in message
    assert BOB not in message
