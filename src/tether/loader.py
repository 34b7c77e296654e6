"""Rebuild an agent from a spec: what ``tether run`` was given, stored with each run.

A run remembers its tools spec (``module:attr``), its model spec and the directory it was
started from, so ``resume``, ``approve`` and ``deny`` in another process need none of them.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tether.agent import Agent
from tether.errors import ConfigError, ToolDefinitionError
from tether.models import ModelAdapter
from tether.policies import Budget, Limits
from tether.pricing import Price
from tether.rules import Policy
from tether.tools import Tool, tools_by_name

SCRIPTED_PREFIX = "scripted:"
ENV_PREFIX = "TETHER_"
"""Only these environment settings are stored with a run: never credentials."""
DEMO_MODEL = "scripted-demo"
"""The demo's offline model: scripted replies that read the real tool results."""


def load_tools(specs: Sequence[str], *, cwd: str | None = None) -> list[Tool]:
    """Import ``module:attr`` specs; ``attr`` is a tool or a list of tools.

    ``cwd`` (default: the current directory) goes on ``sys.path`` first, so a tools
    module next to the user's files is importable.
    """
    base = str(Path(cwd or os.getcwd()).resolve())
    if base not in sys.path:
        sys.path.insert(0, base)
    found: list[Tool] = []
    for spec in specs:
        module_name, _, attribute = spec.partition(":")
        if not module_name or not attribute:
            raise ConfigError(f"--tools {spec!r}: expected MODULE:ATTR, e.g. mytools:TOOLS")
        try:
            module = importlib.import_module(module_name)
        except Exception as error:
            raise ConfigError(f"--tools {spec!r}: cannot import {module_name!r}: {error}") from error
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


def load_model(spec: str) -> ModelAdapter:
    """``scripted:PATH`` replays a JSON file offline; anything else names a Claude model."""
    if spec == DEMO_MODEL:
        from tether.demo import DemoScript
        from tether.models.scripted import ScriptedModel

        return ScriptedModel(DemoScript(), name=DEMO_MODEL)
    if spec.startswith(SCRIPTED_PREFIX):
        from tether.models.scripted import ScriptedModel

        return ScriptedModel.from_file(spec[len(SCRIPTED_PREFIX) :])
    from tether.models.anthropic import AnthropicModel

    return AnthropicModel(spec)


def normalise_model_spec(spec: str | None) -> str:
    """Resolve the default model and make a scripted path absolute (resume may run elsewhere)."""
    if not spec:
        from tether.models.anthropic import default_model_name

        return default_model_name()
    if spec.startswith(SCRIPTED_PREFIX):
        return SCRIPTED_PREFIX + str(Path(spec[len(SCRIPTED_PREFIX) :]).resolve())
    return spec


def agent_from_spec(
    spec: dict[str, Any], *, model: ModelAdapter | None = None
) -> Agent:
    """The agent a run was started with.

    ``spec["env"]`` holds ``TETHER_*`` settings the tools read (e.g. the demo's workspace);
    they are restored so a run resumed from another directory behaves the same.
    ``spec["policy"]`` is an absolute rule file path, read again here: a missing or
    invalid file is a :class:`ConfigError`, never a run without its rules. The agent's
    spec carries the rules' digest, which a new run records (see :func:`policy_change`).
    """
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
    return Agent(
        model=model or load_model(model_spec),
        tools=tools,
        system=spec.get("system"),
        limits=limits_from_spec(spec),
        prices={name: Price.from_dict(price) for name, price in prices.items()},
        model_name=model_spec,
        spec={
            "tools": list(spec.get("tools", [])),
            "system": spec.get("system"),
            "cwd": spec.get("cwd") or os.getcwd(),
            **({"env": env} if env else {}),
            **({"policy": policy_file, "policy_digest": policy.digest} if policy is not None else {}),
            **({"prices": prices} if prices else {}),
        },
        policy=policy,
    )


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
