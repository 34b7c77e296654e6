"""Without a PostgreSQL server its tests skip, unless TETHER_REQUIRE_PG says they must run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from support import clean_env, closed_port

pytestmark = pytest.mark.slow  # runs pytest in a subprocess

A_POSTGRES_TEST = "tests/test_sql_store.py::test_postgres_stores_json_queryable_as_jsonb"


def pytest_without_a_server(**env: str) -> subprocess.CompletedProcess[str]:
    nowhere = f"postgresql+psycopg://postgres@127.0.0.1:{closed_port()}/test"
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", A_POSTGRES_TEST],
        cwd=Path(__file__).parents[1],
        env=clean_env(TETHER_TEST_PG_URL=nowhere, **env),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_postgres_tests_skip_without_a_server_by_default() -> None:
    result = pytest_without_a_server()
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 skipped" in result.stdout


def test_postgres_tests_fail_without_a_server_when_required() -> None:
    result = pytest_without_a_server(TETHER_REQUIRE_PG="1")
    assert result.returncode != 0
    assert "TETHER_REQUIRE_PG is set: PostgreSQL unreachable" in result.stdout
    assert "1 error" in result.stdout
