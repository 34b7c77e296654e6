"""A stored run as a regression test: a pytest module and its recording, written side by side.

The module imports the agent under test (the run's tools module, system prompt and settings, or
an agent of the user's program named ``MODULE:ATTR``), replays the recording offline and asserts
the run's trajectory: the same tool calls with the same inputs in order, the same end (status,
answer, typed result). A change that matters (a tool's schema, the system prompt, a setting) fails
it with a diff. Secrets are scrubbed from both files by value, as everywhere tether prints or
stores text (:func:`tether.redact.scrub`).
"""

from __future__ import annotations

import json
import os
import re
import textwrap
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tether.errors import ConfigError
from tether.redact import scrub
from tether.testing.recording import Recording

SECRET_NAMES = re.compile(r"(KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIALS?)$", re.IGNORECASE)
"""Environment variables whose values are scrubbed from an exported recording (``ANTHROPIC_API_KEY``...)."""


def environment_secrets() -> list[str]:
    """The values of the environment variables named like secrets."""
    return [value for name, value in os.environ.items() if SECRET_NAMES.search(name)]


def scrubbed(value: Any, secrets: Iterable[str | None]) -> Any:
    """``value`` (free JSON) with every secret masked in each string, keys included."""
    known = list(secrets)
    if isinstance(value, str):
        return scrub(value, known)
    if isinstance(value, list):
        return [scrubbed(item, known) for item in value]
    if isinstance(value, dict):
        return {scrub(str(key), known): scrubbed(item, known) for key, item in value.items()}
    return value


def export_test(
    recording: Recording,
    path: str | Path,
    *,
    agent: str | None = None,
    secrets: Iterable[str | None] = (),
    overwrite: bool = False,
) -> tuple[Path, Path]:
    """Write the test module ``path`` and its recording beside it (same name, ``.json``).

    ``agent``: ``MODULE:ATTR`` naming the agent under test in the user's program (an agent, or a
    function making one); without it the agent is made as ``tether run`` made the run's, which a
    run started from Python cannot be.

    Returns:
        The test module's path and the recording's.

    Raises:
        ConfigError: ``path`` is not a ``.py`` file, either file exists (unless ``overwrite``), or the
            run was made in Python and no ``agent`` is given.
    """
    test = Path(path)
    if test.suffix != ".py":
        raise ConfigError(f"--as-test {test}: a test module's name ends with .py (e.g. tests/test_refund.py)")
    data = test.with_suffix(".json")
    existing = [str(file) for file in (test, data) if file.exists()]
    if existing and not overwrite:
        raise ConfigError(f"{' and '.join(existing)} already exist: pass --force to write over them")
    spec = recording.spec
    if agent is None and "tools" not in spec:
        raise ConfigError(
            f"run {recording.run_id} was started from Python, so its record names no tools module: "
            "name the agent under test with --agent MODULE:ATTR (an Agent, or a function making one)"
        )
    clean = Recording.from_json(scrubbed(recording.to_json(), [*secrets, *environment_secrets()]))
    test.parent.mkdir(parents=True, exist_ok=True)
    data.write_text(json.dumps(clean.to_json(), indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    test.write_text(_module(clean, data.name, test.parent.resolve(), agent), encoding="utf-8")
    return test, data


def _started_in(spec: dict[str, Any]) -> Path:
    """The directory the run was started from (its tools modules are there)."""
    return Path(str(spec.get("cwd") or os.getcwd())).resolve()


def _relative(directory: Path, base: Path) -> str:
    """``directory`` as a path from ``base`` (the test's folder), so the test runs from any checkout."""
    return Path(os.path.relpath(directory, base)).as_posix()


_IMPORT = "from tether.testing import Replay"


def _module(recording: Recording, data: str, test_dir: Path, agent: str | None) -> str:
    """The test module's text: a docstring saying what it checks, the agent under test, one test."""
    run = recording.run_id
    name = re.sub(r"\W", "_", run)
    calls = ", ".join(call.tool for call in recording.trajectory.calls) or "none"
    prompt = textwrap.shorten(recording.prompt, 200, placeholder="...")
    header = f'''\
"""Regression test of run {run} (`tether export --as-test`, {time.strftime("%Y-%m-%d")}).

The run was asked: {_docstring_safe(prompt)}
It called: {calls}; it ended {recording.trajectory.status}.

Replayed offline from its recording ({data}): the recorded model answers each call, and
refuses, with a diff, a request that differs from the recorded one (messages, system prompt, tools
offered, settings); the tools answer with the recorded results (STUB_TOOLS = False runs the real
ones). The replay must make the same tool calls with the same inputs, in order, and end the same
way. To accept a change on purpose, export the run again.
"""

from pathlib import Path

from tether.testing import Replay

HERE = Path(__file__).resolve().parent
RECORDING = HERE / {_python(data)}
AGENT_DIR = HERE / {_python(_relative(_started_in(recording.spec), test_dir))}
"""Where the run was started: the agent's modules are imported from there."""
STUB_TOOLS = True
'''
    if agent is not None:
        body = f'''AGENT = {_python(agent)}
"""The agent under test: an Agent, or a function making one."""


def test_{name}_replays_the_same() -> None:
    replay = Replay.load(RECORDING)
    replay.check(agent_at(AGENT, cwd=AGENT_DIR), stub_tools=STUB_TOOLS)
'''
        return header.replace(_IMPORT, f"{_IMPORT}\nfrom tether.testing.replaying import agent_at") + body
    spec = recording.spec
    policy = spec.get("policy")
    body = f"""
# The agent under test, as `tether run` made it (--tools, --system, the model's settings).
TOOLS = {_python(list(spec.get("tools") or []))}
SYSTEM = {_python(spec.get("system"))}
MODEL_SETTINGS = {_python(spec.get("model_settings"))}
"""
    given = '"tools": TOOLS, "system": SYSTEM, "model_settings": MODEL_SETTINGS'
    if policy:
        body += f"POLICY = HERE / {_python(_relative(Path(str(policy)).resolve(), test_dir))}\n"
        given += ', "policy": str(POLICY)'
    body += f"""

def test_{name}_replays_the_same() -> None:
    replay = Replay.load(RECORDING)
    given = {{{given}}}
    replay.check(replay.agent_from_spec(given, cwd=AGENT_DIR), stub_tools=STUB_TOOLS)
"""
    return header + body


def _python(value: Any) -> str:
    """``value`` (free JSON) as Python source, quoted as ruff and black quote it: the module is born formatted."""
    if isinstance(value, str):
        if '"' in value and "'" not in value:
            return repr(value)
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate: escaped
            return repr(value)
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list):
        return "[" + ", ".join(_python(item) for item in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_python(key)}: {_python(item)}" for key, item in value.items()) + "}"
    return repr(value)


def _docstring_safe(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"""', '\\"\\"\\"')


__all__ = ["SECRET_NAMES", "environment_secrets", "export_test", "scrubbed"]
