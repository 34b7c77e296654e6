"""Rebuild an agent from a spec: what ``tether run`` was given, stored with each run.

A run remembers its tools spec (``module:attr``), its model spec, the directory it was
started from and its toolsets (MCP servers, OpenAPI specs: see :mod:`tether.toolsets`), so
``resume``, ``approve`` and ``deny`` in another process need none of them.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

from tether.agent import Agent
from tether.core import links
from tether.errors import ConfigError, ToolDefinitionError
from tether.models import ModelAdapter, ModelSettings, providers
from tether.policy.policies import Budget, Limits
from tether.policy.pricing import Price
from tether.policy.rules import Policy
from tether.stores import RunRecord, Store
from tether.tools import Tool, tools_by_name
from tether.toolsets import changes, from_record

AgentFor = Callable[[dict[str, Any]], Agent]
"""How a service, the inspector or a worker gets the agent of a stored run: a function of the run's spec."""
ENV_PREFIX = "TETHER_"
"""Only these environment settings are stored with a run: never credentials."""
PRIVATE_PREFIX = "_tether_tools_"
"""Start of the names tools modules loaded from a run's directory get in ``sys.modules``."""
DEMO_MODEL = "scripted-demo"
"""The demo's offline model: scripted replies that read the real tool results."""


def load_tools(specs: Sequence[str], *, cwd: str | None = None) -> list[Tool]:
    """Import ``module:attr`` specs; ``attr`` is a tool or a list of tools.

    The module is looked for in ``cwd`` (default: the current directory) first, then among
    installed modules (see :func:`import_tools_module`).
    """
    base = Path(cwd or os.getcwd()).resolve()
    found: list[Tool] = []
    for spec in specs:
        module_name, _, attribute = spec.partition(":")
        if not module_name or not attribute:
            raise ConfigError(f"--tools {spec!r}: expected MODULE:ATTR, e.g. mytools:TOOLS")
        try:
            module = import_tools_module(module_name, base)
        except Exception as error:
            raise ConfigError(f"--tools {spec!r}: cannot import {module_name!r}: {error}") from error
        except SystemExit as error:  # sys.exit() at import: a tools module cannot end the program (Ctrl-C still can)
            raise ConfigError(
                f"--tools {spec!r}: cannot import {module_name!r}: it called sys.exit() at import "
                f"(raised SystemExit: {error.code})"
            ) from error
        try:
            value = getattr(module, attribute)
        except AttributeError:
            raise ConfigError(f"--tools {spec!r}: module {module_name!r} has no {attribute!r}") from None
        items = value if isinstance(value, list | tuple) else [value]
        for item in items:
            if not isinstance(item, Tool):
                raise ConfigError(f"--tools {spec!r}: {item!r} is not a tool (decorate it with @tool)")
            found.append(item)
    return found


def import_tools_module(name: str, base: Path) -> ModuleType:
    """The module ``name`` (dotted or not) as the run's directory ``base`` holds it, else an installed one.

    A run's spec names its directory and module, and whoever can write the database writes
    the spec: loading must not let a file there stand in for any other module (a ``yaml.py``
    beside the tools module must not run when a YAML policy is read). So the module's file
    (``NAME.py`` or ``NAME/__init__.py`` for the first part of a dotted name) is loaded by its
    path under a private name, whatever standard or installed module it is named like, and
    ``base`` goes at the *end* of ``sys.path``: the tools module's own helper modules import,
    but nothing installed is ever shadowed.
    """
    if str(base) not in sys.path:
        sys.path.append(str(base))
    top, _, rest = name.partition(".")
    package = base / top / "__init__.py"
    file = package if package.is_file() else base / f"{top}.py"
    if not top.isidentifier() or not file.is_file():
        return importlib.import_module(name)
    private = f"{PRIVATE_PREFIX}{hashlib.sha256(str(file).encode()).hexdigest()[:12]}_{top}"
    if private not in sys.modules:
        locations = [str(file.parent)] if file == package else None
        found = importlib.util.spec_from_file_location(private, file, submodule_search_locations=locations)
        if found is None or found.loader is None:  # pragma: no cover - a .py file always has a loader
            raise ImportError(f"cannot load {file}")
        module = importlib.util.module_from_spec(found)
        sys.modules[private] = module  # before running it, as an import would (dataclasses, pydantic)
        try:
            found.loader.exec_module(module)
        except BaseException:
            del sys.modules[private]
            raise
    return importlib.import_module(f"{private}.{rest}") if rest else sys.modules[private]


def load_model(spec: str) -> ModelAdapter:
    """The offline demo model, or the adapter a model name stands for (see :mod:`tether.models.providers`)."""
    if spec == DEMO_MODEL:
        from tether.models.demo import DemoScript
        from tether.models.scripted import ScriptedModel

        return ScriptedModel(DemoScript(), name=DEMO_MODEL)
    return providers.model_for(spec)


def normalise_model_spec(spec: str | None) -> str:
    """Resolve the default model, check the provider, and make a scripted path absolute (resume may run elsewhere)."""
    if not spec:
        from tether.models.anthropic import default_model_name

        spec = default_model_name()
    return spec if spec == DEMO_MODEL else providers.normalise(spec)


NOT_FROM_SPEC = (
    "this run was started from Python, not by `tether run`: its record names no tools module, so its tools "
    "are the program's that started it. Resume or decide it there (Runner.drive, Runner.decide), or give that "
    "agent to what drives it: create_app(agent=...) for the inspector, Worker(url, agent=...) for a worker"
)
"""Why a run's agent cannot be rebuilt from its record (see :func:`made_in_python`)."""


def made_in_python(spec: dict[str, Any]) -> bool:
    """Whether ``spec`` is the record of a run whose agent was made in Python: its tools' schemas, but no tools module.

    ``tether run`` (and any agent made by :func:`agent_from_spec`) records a ``tools`` key, even empty.
    """
    return "tools" not in spec and "tool_schemas" in spec


def agent_spec(store: Store, run: RunRecord) -> dict[str, Any]:
    """The spec the agent driving ``run`` is rebuilt from: the run's own, or its tree's root's.

    A fork of a child run (``forked_from["agent_of"]``) records no tools module of its own: the
    child's agent is an agent tool's, reached from the agent of the tree it was forked from, whose
    root's spec is returned (read from ``store``; the drive then takes the child's agent from it).
    """
    link = links.agent_link(run.spec)
    if link is None or links.link_of(run.spec) is not None:  # a child run itself is driven by its root
        return run.spec
    root = (link.get("chain") or [link["run_id"]])[0]
    return store.load_run(str(root), tenant=run.tenant).spec


@contextmanager
def agent_for(
    given: Agent | AgentFor | None, spec: dict[str, Any], *, model: ModelAdapter | None = None
) -> Iterator[Agent]:
    """The agent for a run of ``spec``: ``given`` (an agent, or a function of the spec making one), else one rebuilt.

    A rebuilt agent (:func:`agent_from_spec`, with ``model``) is closed when the block ends: its
    toolsets' servers, its model's connections. A given agent is its owner's to close.
    """
    if isinstance(given, Agent):
        yield given
    elif given is not None:
        yield given(spec)
    else:
        agent = agent_from_spec(spec, model=model)
        try:
            yield agent
        finally:
            agent.close()


def agent_from_spec(spec: dict[str, Any], *, model: ModelAdapter | None = None) -> Agent:
    """The agent a run was started with.

    ``spec["env"]`` holds ``TETHER_*`` settings the tools read (e.g. the demo's workspace);
    they are restored so a run resumed from another directory behaves the same.
    ``spec["policy"]`` is an absolute rule file path, read again here: a missing or
    invalid file is a :class:`ConfigError`, never a run without its rules. The agent's
    spec carries the rules' digest, which a new run records (see :func:`policy_change`).
    ``spec["toolsets"]`` are toolsets' records or options: they are made again, not yet
    connected (the first use of the agent's tools connects; the run records them anew).

    Raises:
        ConfigError: a run made in Python (:data:`NOT_FROM_SPEC`), a tools module or rule file that fails to load.
    """
    if made_in_python(spec):
        raise ConfigError(NOT_FROM_SPEC)
    env = {k: str(v) for k, v in (spec.get("env") or {}).items() if k.startswith(ENV_PREFIX)}
    os.environ.update(env)
    model_spec = str(spec.get("model") or normalise_model_spec(None))
    tools = load_tools(spec.get("tools", []), cwd=spec.get("cwd"))
    try:
        tools_by_name(tools)
    except ToolDefinitionError as error:
        raise ConfigError(f"--tools: {error}") from error
    policy_file = spec.get("policy")
    policy = Policy.from_file(policy_file) if policy_file else None
    prices = spec.get("prices") or {}
    toolsets = [from_record(record) for record in spec.get("toolsets") or []]
    return Agent(
        model=model or load_model(model_spec),
        tools=tools,
        system=spec.get("system"),
        limits=limits_from_spec(spec),
        prices={name: Price.from_dict(price) for name, price in prices.items()},
        model_name=model_spec,
        settings=settings_from_spec(spec),
        spec={
            "tools": list(spec.get("tools", [])),
            "system": spec.get("system"),
            "cwd": spec.get("cwd") or os.getcwd(),
            **({"env": env} if env else {}),
            **({"policy": policy_file, "policy_digest": policy.digest} if policy is not None else {}),
            **({"prices": prices} if prices else {}),
        },
        policy=policy,
        toolsets=toolsets,
    )


class NoModel:
    """Stands in where runs are read, decided or stopped but no model is ever called."""

    def complete(self, request: Any) -> Any:
        """Refuse: whoever holds this agent does not drive runs."""
        raise ConfigError("this command does not call the model")


def reader_agent() -> Agent:
    """An agent to read, deny or cancel runs with: no tools imported, no model loaded."""
    return Agent(model=NoModel())


CONTINUED = (
    "tools",
    "cwd",
    "env",
    "model",
    "model_settings",
    "system",
    "policy",
    "max_steps",
    "max_tool_calls",
    "budget",
    "prices",
    "toolsets",
)
"""What a run continuing another keeps from the earlier run's spec, unless set anew."""
MERGED = ("budget", "model_settings")
"""What a continuing run's flags change setting by setting, keeping the earlier run's others."""


def continued_spec(earlier: dict[str, Any], given: dict[str, Any]) -> dict[str, Any]:
    """The spec of a run that continues ``earlier``: what ``given`` sets, the rest as ``earlier`` had it.

    Tools go with the directory they are loaded from (``given`` tools bring their own
    ``cwd``). A budget merges limit by limit, model settings setting by setting: setting one
    keeps the others.
    """
    spec = {key: earlier[key] for key in CONTINUED if earlier.get(key) is not None}
    for key, value in given.items():
        spec[key] = {**(spec.get(key) or {}), **value} if key in MERGED else value
    return spec


def policy_change(run_id: str, spec: dict[str, Any], agent: Agent) -> str | None:
    """A warning when the run's rule file no longer holds the rules the run started with.

    The current rules apply (tightening a rule file is how a person stops parked runs
    doing something); the warning says so. None when nothing changed or the run is too
    old to have recorded a digest.
    """
    recorded, policy = spec.get("policy_digest"), agent.policy
    if recorded is None or policy is None or policy.digest == recorded:
        return None
    return f"policy file {spec.get('policy')} changed since run {run_id} started: its current rules apply"


def toolset_changes(spec: dict[str, Any], agent: Agent) -> list[str]:
    """Warnings for the toolsets that offer other tools than when the run started (connecting to them).

    Whatever breaks the run is refused when it is loaded (:mod:`tether.core.compat`); these
    say what changed besides, as :func:`policy_change` does for rules.
    """
    return changes(spec.get("toolsets") or [], agent.toolsets)


def settings_from_spec(spec: dict[str, Any]) -> ModelSettings:
    """The model settings a run was started with (none stored: the APIs' defaults)."""
    return ModelSettings.from_dict(spec.get("model_settings"))


def limits_from_spec(spec: dict[str, Any]) -> Limits:
    """The limits a run was started with: ``max_steps``, ``max_tool_calls`` and its budget."""
    options: dict[str, Any] = {}
    for name in ("max_steps", "max_tool_calls"):
        if spec.get(name) is not None:
            options[name] = spec[name]
    if spec.get("budget"):
        try:
            options["budget"] = Budget.from_dict(dict(spec["budget"]))
        except (TypeError, ValueError) as error:
            raise ConfigError(f"invalid budget: {error}") from error
    return Limits(**options)
