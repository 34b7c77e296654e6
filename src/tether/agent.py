"""An agent: immutable configuration shared by all of its runs."""

from __future__ import annotations

import copy
import inspect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

import pydantic

from tether.core import results
from tether.core.compaction import HistoryProcessor, check_processors
from tether.errors import ConfigError
from tether.models import ModelAdapter, ModelSettings
from tether.policy.policies import Limits
from tether.policy.pricing import Price, price_for
from tether.policy.rules import Policy
from tether.tools import INTERRUPTED_POLICIES, OnInterrupted, Tool, tools_by_name
from tether.toolsets import Toolset

if TYPE_CHECKING:
    from tether.core.children import AgentTool
    from tether.core.handoffs import Handoff, HandoffTool
    from tether.policy.policies import ApprovalSetting, RetryPolicy

DEFAULT_MAX_CONCURRENT_TOOLS = 8
"""Enough for the parallel calls a model asks for in one turn, few enough to stay polite to the services they call."""


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
    model_name: str = "default"
    """Name sent as the request's ``model`` and stored with the run."""
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
    through an added final tool (see :mod:`tether.core.results`)."""
    history_processors: Sequence[HistoryProcessor] = ()
    """Run before each model call, in order, to keep a long run within the model's context
    (:class:`~tether.core.compaction.KeepLastTurns`, ``DropToolResults``, ``Summarise``)."""
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
        from tether.core.handoffs import handoff_tool

        return tuple(handoff_tool(handoff) for handoff in self.handoffs)

    @cached_property
    def reachable_agents(self) -> dict[str, Agent]:
        """This agent and every agent its handoffs reach, by name: whom a run of it can be handed to."""
        from tether.core.handoffs import reachable

        return reachable(self)

    @property
    def team(self) -> list[Agent]:
        """This agent and every agent a run of it may drive, each once: handed to, or serving calls as a tool.

        Whoever made them closes them all at the end (the CLI: each one's model and toolsets).
        Toolsets are not connected to find them.
        """
        from tether.core.children import AgentTool
        from tether.core.handoffs import handoffs_of

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

        For a child run, capped by its parent's remainder (:func:`tether.policy.budgets.child_limits`).
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
        from tether.core.children import agent_tool

        return agent_tool(self, name, description, approval=approval, retry=retry)
