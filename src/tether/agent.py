"""An agent: immutable configuration shared by all of its runs.

Plain data, below the core: an :class:`Agent`, the :class:`Handoff` s it may hand a conversation
to and the agents it uses as tools (:class:`AgentTool`). What a run *does* with them is the core's
(:mod:`tether.core.flow` and its extensions :mod:`tether.core.handoffs` and
:mod:`tether.core.children`); nothing here imports the core.
"""

from __future__ import annotations

import copy
import inspect
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from functools import cached_property
from typing import TYPE_CHECKING, Any

import pydantic

from tether.errors import ConfigError, IncompatibleRun, ToolDefinitionError
from tether.facts.history import Message
from tether.models import ModelAdapter, ModelSettings
from tether.policy.compaction import HistoryProcessor, check_processors
from tether.policy.policies import Limits
from tether.policy.pricing import Price, price_for
from tether.policy.rules import Policy
from tether.tools import INTERRUPTED_POLICIES, OnInterrupted, Tool, make_tool, tools_by_name
from tether.tools import output as results
from tether.toolsets import Toolset

if TYPE_CHECKING:
    from tether.policy.policies import ApprovalSetting, RetryPolicy

DEFAULT_MAX_CONCURRENT_TOOLS = 8
"""Enough for the parallel calls a model asks for in one turn, few enough to stay polite to the services they call."""


def _name_of(model: ModelAdapter) -> str:
    """The model an adapter calls, as it names it (its ``name``); ``"default"`` when it names none."""
    name = getattr(model, "name", None)
    return name if isinstance(name, str) and name else "default"


@dataclass(frozen=True)
class Agent:
    """A model, a system prompt, tools and limits.

    ``spec`` records how to rebuild the agent in another process (e.g. the CLI's
    ``--tools`` and ``--model`` values); it is stored with each run so ``resume`` needs
    neither. ``toolsets`` (MCP servers, OpenAPI services: see :mod:`tether.toolsets`) add
    their tools to ``tools`` and their records to what a run stores.
    """

    model: ModelAdapter
    tools: Sequence[Tool] = ()
    system: str | None = None
    limits: Limits = field(default_factory=Limits)
    prices: Mapping[str, Price] | None = None
    """Overrides and additions to :data:`tether.policy.pricing.PRICES`, by model name prefix."""
    model_name: str = ""
    """The model's name, stored with the run: what prices its calls, what traces call
    ``gen_ai.request.model``. Left out, the adapter's own ``name`` (``AnthropicModel``'s and
    ``OpenAIModel``'s model, ``ScriptedModel``'s ``"scripted"``), else ``"default"``."""
    spec: dict[str, Any] = field(default_factory=dict)
    policy: Policy | None = None
    """Rules over this agent's tool calls (deny, ask, allow, warn); tools' own settings otherwise."""
    name: str | None = None
    """Who this agent is; approval callables see it as ``ApprovalContext.agent``."""
    settings: ModelSettings = field(default_factory=ModelSettings)
    """How each model call is made (temperature, stop sequences, tool choice, thinking...); a run
    stores them in its spec."""
    output_type: type[pydantic.BaseModel] | None = None
    """When set, a run's result is a validated instance of this model, given by the model
    through an added final tool (see :mod:`tether.tools.output`)."""
    history_processors: Sequence[HistoryProcessor] = ()
    """Run before each model call, in order, to keep a long run within the model's context
    (:class:`~tether.policy.compaction.KeepLastTurns`, ``DropToolResults``, ``Summarise``)."""
    on_interrupted: OnInterrupted = "ask"
    """A call a crash left in doubt, of a tool that is not idempotent and sets nothing itself:
    ``"ask"`` a person whether to run it again (with no one to ask, as ``"error"``), or
    ``"error"``: the model gets an ``is_error`` result saying it was interrupted and not re-run."""
    concurrent_tools: bool = False
    """Whether the calls of one model turn may run at the same time, for tools that set no
    ``concurrent`` of their own (see :meth:`runs_concurrently`)."""
    max_concurrent_tools: int = DEFAULT_MAX_CONCURRENT_TOOLS
    """At most this many attempts of one run's concurrent calls run at once (threads for sync
    tools, tasks for async ones on :class:`~tether.AsyncRunner`); further calls start as they end."""
    toolsets: Sequence[Toolset] = ()
    """Tools from outside the program, listed when first needed (connecting to their servers)."""
    handoffs: Sequence[Agent | Handoff | str] = ()
    """Agents the model may hand the conversation to (one ``transfer_to_<name>`` tool each), by
    agent, by :class:`~tether.core.handoffs.Handoff` (with options) or by name (an agent among the
    run's agents, e.g. handing back to the first): see :mod:`tether.core.handoffs`."""

    def __post_init__(self) -> None:
        if not self.model_name:
            object.__setattr__(self, "model_name", _name_of(self.model))
        if isinstance(self.max_concurrent_tools, bool) or not (
            isinstance(self.max_concurrent_tools, int) and self.max_concurrent_tools >= 1
        ):
            raise ConfigError(f"Agent.max_concurrent_tools must be at least 1, not {self.max_concurrent_tools!r}")
        for toolset in self.toolsets:
            if not isinstance(toolset, Toolset):
                raise ConfigError(f"{toolset!r} is not a toolset (tether.toolsets: MCPToolset, OpenAPIToolset...)")
        if self.on_interrupted not in INTERRUPTED_POLICIES:
            raise ConfigError(f"Agent.on_interrupted must be 'ask' or 'error', not {self.on_interrupted!r}")
        if self.output_type is not None:
            if any(item.name == results.OUTPUT_TOOL for item in self.tools):
                raise ConfigError(f"a tool is already named {results.OUTPUT_TOOL!r}: the output_type tool's name")
            object.__setattr__(self, "tools", (*self.tools, results.output_tool(self.output_type)))
        object.__setattr__(self, "history_processors", tuple(self.history_processors))
        object.__setattr__(self, "handoffs", tuple(self.handoffs))
        clashing = {item.name for item in self.tools} & {item.name for item in self.handoff_tools}
        if clashing:  # the others are found when the tools are first listed (toolsets connect then)
            raise ConfigError(f"a tool is already named {sorted(clashing)[0]!r}: a handoff tool's name")
        check_processors(self.history_processors)
        if self.settings.tool_choice is not None:  # names a tool: list them (toolsets connect only then)
            self.settings.check_tools(self.tool_index)
        budget_tokens = self.settings.thinking_budget
        if budget_tokens is not None and self.max_tokens <= budget_tokens:
            raise ConfigError(
                f"max_tokens ({self.max_tokens}) must be above thinking_budget ({budget_tokens}): "
                "raise max_tokens in the model settings or the limits"
            )
        check_settings = getattr(self.model, "check_settings", None)
        if callable(check_settings):  # an adapter refuses what its API does not have, before any run
            check_settings(self.settings)
        budget = self.limits.budget
        if budget is not None and budget.counts_cost and price_for(self.model_name, self.prices) is None:
            # A cost budget that cannot count would never stop anything: refuse it up front.
            raise ConfigError(
                f"a cost budget needs the model's price, and {self.model_name!r} has none in "
                "tether.policy.pricing.PRICES: pass Agent(prices={...}) (tether run: --price INPUT,OUTPUT) "
                "or drop the cost limit"
            )

    def runs_concurrently(self, tool: Tool) -> bool:
        """Whether ``tool``'s calls may run beside the other concurrent calls of their turn.

        The tool's own ``concurrent`` setting wins; a tool that sets none follows ``concurrent_tools``.
        """
        return self.concurrent_tools if tool.concurrent is None else tool.concurrent

    @cached_property
    def all_tools(self) -> tuple[Tool, ...]:
        """``tools``, the handoffs', then each toolset's (listed once: the first use connects to their servers)."""
        toolsets = (tool for toolset in self.toolsets for tool in toolset.tools())
        return (*self.tools, *self.handoff_tools, *toolsets)

    @cached_property
    def handoff_tools(self) -> tuple[HandoffTool, ...]:
        """One ``transfer_to_<name>`` tool per handoff (see :mod:`tether.core.handoffs`)."""
        if not self.handoffs:
            return ()
        return tuple(handoff_tool(handoff) for handoff in self.handoffs)

    @cached_property
    def reachable_agents(self) -> dict[str, Agent]:
        """This agent and every agent its handoffs reach, by name: whom a run of it can be handed to."""
        return reachable(self)

    @property
    def team(self) -> list[Agent]:
        """This agent and every agent a run of it may drive, each once: handed to, or serving calls as a tool.

        Whoever made them closes them all at the end (the CLI: each one's model and toolsets).
        Toolsets are not connected to find them.
        """
        found: dict[int, Agent] = {}
        queue: list[Agent] = [self]
        while queue:
            agent = queue.pop(0)
            if found.setdefault(id(agent), agent) is not agent:
                continue
            queue.extend(tool.child_agent for tool in agent.tools if isinstance(tool, AgentTool))
            queue.extend(t.target.agent for t in handoffs_of(agent) if not isinstance(t.target.agent, str))
        return list(found.values())

    def close(self) -> None:
        """Let go of what the team holds: each toolset's servers, each model's pooled connections.

        For whoever made the agent (the CLI, the inspector's drives). A model's async clients are
        :meth:`aclose`'s. Each one is closed once, even when agents share it; used again, it reconnects.
        """
        for closing in self._closers("close"):
            closing()

    async def aclose(self) -> None:
        """:meth:`close`, and the async closers too (on the loop that used them: a worker's).

        An async closer is an ``aclose`` method, or a ``close`` that is itself a coroutine function
        (as a user's own model or toolset may have it), which :meth:`close` cannot await.
        """
        self.close()
        for closing in self._closers("aclose", asynchronous=True) + self._closers("close", asynchronous=True):
            await closing()

    def _closers(self, name: str, *, asynchronous: bool = False) -> list[Any]:
        """The team's toolsets' and models' ``name`` methods, coroutine functions or not, one per object."""
        found: dict[int, Any] = {}
        for member in self.team:
            for held in (*member.toolsets, member.model):
                closing = getattr(held, name, None)
                if callable(closing) and inspect.iscoroutinefunction(closing) == asynchronous:
                    found.setdefault(id(held), closing)
        return list(found.values())

    @property
    def max_tokens(self) -> int:
        """``max_tokens`` of each model call: the settings', else the limits'."""
        return self.settings.max_tokens or self.limits.max_tokens

    @cached_property
    def tool_index(self) -> dict[str, Tool]:
        """Tools by name, validated once (never per step)."""
        return tools_by_name(self.all_tools)

    def tool_schemas(self) -> dict[str, dict[str, Any]]:
        """Each tool's input schema by name, fresh copies: what a run records to check a later resume against."""
        return {tool.name: tool.input_schema() for tool in self.all_tools}

    @cached_property
    def tool_definitions(self) -> list[dict[str, Any]]:
        """The Messages API ``tools`` list, built once."""
        return [tool.definition() for tool in self.all_tools]

    @cached_property
    def recorded_spec(self) -> dict[str, Any]:
        """What a run stores of this agent: ``spec``, and each toolset's record (how to reach it, what it gave)."""
        if not self.toolsets:
            return dict(self.spec)
        return {**self.spec, "toolsets": [toolset.record() for toolset in self.toolsets]}

    def with_limits(self, limits: Limits) -> Agent:
        """This agent with other limits; its tools, listed once, are shared.

        For a child run, capped by its parent's remainder (:func:`tether.core.budgets.child_limits`).
        A copy, not :func:`dataclasses.replace`: that would check the agent again, add the typed
        result's tool a second time and list the toolsets anew.
        """
        if limits == self.limits:
            return self
        limited = copy.copy(self)
        object.__setattr__(limited, "limits", limits)
        return limited

    def as_tool(
        self,
        name: str,
        description: str,
        *,
        approval: ApprovalSetting = False,
        retry: RetryPolicy | None = None,
    ) -> AgentTool:
        """This agent as another agent's tool: each call hands its ``task`` to a child run of this agent.

        The child run has this agent's own tools, policy and limits, and is linked to the
        calling run (parent run, call, depth); its answer (or typed result) is the call's
        result, a failed child an ``is_error`` result under ``retry``. A gated call in the
        child parks both runs until it is decided. See :mod:`tether.core.children`.
        """
        return agent_tool(self, name, description, approval=approval, retry=retry)


# Handoffs and agents as tools: configuration only (the core's extensions drive them) ----------
HistoryFilter = Callable[[list[Message]], list[Message]]
"""What the agent taken over sees of the history: the messages so far in, the messages to go on with out."""
TOOL_PREFIX = "transfer_to_"


@dataclass(frozen=True)
class Handoff:
    """A handoff with options: to ``agent`` (or the agent of that name among the run's agents)."""

    agent: Agent | str
    """The agent handed to, or its name (an agent among the run's agents, e.g. the one handing back to)."""
    description: str | None = None
    """Tells the model when to hand off (the tool's description)."""
    input_filter: HistoryFilter | None = None
    """Changes the history the agent taking over goes on with (see :func:`without_tool_calls`)."""
    tool_name: str | None = None
    """Replaces ``transfer_to_<name>``."""

    def __post_init__(self) -> None:
        if not self.target:
            raise ConfigError(
                "a handoff's agent needs a name: the run records whom it was handed to and a resume finds it by name"
            )

    @property
    def target(self) -> str:
        """The name of the agent handed to."""
        return self.agent if isinstance(self.agent, str) else self.agent.name or ""


@dataclass(frozen=True)
class HandoffTool(Tool):
    """The tool the model calls to hand off (see :class:`Handoff`); a drive answers it, never runs it."""

    handoff: Handoff | None = None
    """Never None once made by :func:`handoff_tool`."""

    @property
    def target(self) -> Handoff:
        """The handoff this tool makes."""
        assert self.handoff is not None  # handoff_tool always sets it
        return self.handoff


def handoff_tool(handoff: Agent | Handoff | str) -> HandoffTool:
    """The tool handing the conversation to ``handoff``'s agent (what an agent's ``handoffs`` become)."""
    if not isinstance(handoff, Handoff):
        handoff = Handoff(handoff)
    target = handoff.target
    name = handoff.tool_name or (TOOL_PREFIX + re.sub(r"[^a-zA-Z0-9_-]+", "_", target).strip("_").lower())[:64]
    description = handoff.description or f"Hand the conversation over to the {target} agent, which takes it from here."

    def transfer() -> str:
        """Never called: a drive answers the call and hands the run over."""
        raise ToolDefinitionError(f"tool {name!r} hands a run over to {target!r}: drive its caller with a Runner")

    base = make_tool(transfer, name=name, description=description, concurrent=False)
    return HandoffTool(**{field.name: getattr(base, field.name) for field in fields(Tool)}, handoff=handoff)


def handoffs_of(agent: Agent) -> list[HandoffTool]:
    """The agent's handoff tools: its ``handoffs``', and any among its ``tools`` (a tools module's, for the CLI)."""
    return [tool for tool in (*agent.tools, *agent.handoff_tools) if isinstance(tool, HandoffTool)]


def reachable(root: Agent) -> dict[str, Agent]:
    """``root`` and every agent its handoffs reach, by name (breadth first; unnamed ones cannot be handed to).

    Raises:
        ConfigError: two different agents have the same name, so a run handed to it could not tell which.
    """
    found: dict[str, Agent] = {}
    seen: set[int] = set()
    queue = [root]
    while queue:
        agent = queue.pop(0)
        if id(agent) in seen:
            continue
        seen.add(id(agent))
        if agent.name and found.setdefault(agent.name, agent) is not agent:
            raise ConfigError(f"two different agents are named {agent.name!r} among the agents handoffs reach")
        queue.extend(tool.target.agent for tool in handoffs_of(agent) if not isinstance(tool.target.agent, str))
    return found


def named(root: Agent, name: str, *, run_id: str) -> Agent:
    """The agent called ``name`` among ``root``'s (itself and those its handoffs reach)."""
    agent = root.reachable_agents.get(name)
    if agent is None:
        known = ", ".join(repr(name) for name in root.reachable_agents) or "none has a name"
        raise IncompatibleRun(
            f"run {run_id} was handed off to agent {name!r}, which the agent driving it cannot reach through its "
            f"handoffs (its agents: {known}): drive it with the agent it started with, whose handoffs lead to {name!r}",
            run_id=run_id,
        )
    return agent


@dataclass(frozen=True)
class AgentTool(Tool):
    """A tool whose calls are served by child runs of ``agent`` (see :meth:`tether.Agent.as_tool`)."""

    agent: Agent | None = None
    """The agent each call starts a child run of (never None once made by :func:`agent_tool`)."""

    @property
    def child_agent(self) -> Agent:
        """The child's agent."""
        assert self.agent is not None  # agent_tool always sets it
        return self.agent

    def settings(self) -> dict[str, Any]:
        """The tool's settings, and whose child runs serve its calls (``tether diagram --run`` says so)."""
        return {**super().settings(), "agent": self.child_agent.name or self.name}


def agent_tool(
    agent: Agent, name: str, description: str, *, approval: ApprovalSetting = False, retry: RetryPolicy | None = None
) -> AgentTool:
    """A tool that hands ``task`` to ``agent`` in a child run (what :meth:`tether.Agent.as_tool` returns)."""

    def delegate(task: str) -> str:
        """Never called: a driver serves the call with a child run."""
        raise ToolDefinitionError(
            f"tool {name!r} runs agent {agent.name or name!r} as a child run: drive its caller with a Runner",
            tool=name,
        )

    base = make_tool(delegate, name=name, description=description, approval=approval, retry=retry, concurrent=False)
    settings = {field.name: getattr(base, field.name) for field in fields(Tool)}
    # idempotent: a resumed call finds its child by id and drives it on; nothing runs twice
    return AgentTool(**{**settings, "idempotent": True}, agent=agent)
