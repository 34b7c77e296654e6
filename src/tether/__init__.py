"""tether: an explicit state-machine orchestrator for LLM agents; the host runs the tools.

One model invocation is one step; every step is a transition of
:class:`tether.core.machine.AgentMachine` and one committed write. The packages follow the
layers, dependencies pointing down (import-linter's contracts in pyproject.toml keep them so):

- ``surfaces`` (the CLI, the terminal, the web inspector); ``examples`` and ``testing``;
- ``views`` (audit, pending, diagrams), read-only;
- ``drivers``: the runners that perform I/O for a flow, the queue and its worker, tracing;
- ``core``: the machine, the state and the decisions (no I/O), with the extensions beside the
  flow (agents as tools, handoffs) and forks;
- ``stores`` (``tether.stores.sql``, ``tether.stores.memory``);
- ``agent``: an agent's configuration, plain data;
- ``toolsets`` (``tether.toolsets.mcp``, ``tether.toolsets.openapi``: tools from MCP servers
  and OpenAPI services), ``tools`` (run by ``execution``), ``policy`` (rules, retries, limits,
  pricing, compaction) and ``models`` (``tether.models.anthropic``, ...);
- ``facts``: the words every layer speaks (statuses, the Messages API history, usage, events);
- ``errors`` and small helpers (``redact``, ``durations``, ``canonical``); ``extras``, what each
  optional extra brings; ``__about__``, the version.
"""

from tether import _moved
from tether.__about__ import __version__ as __version__
from tether.agent import Agent
from tether.core.approvals import ApprovalRequest, Approve, AutoApprover, CallbackApprover, Deny
from tether.core.handoffs import Handoff
from tether.core.machine import AgentMachine
from tether.drivers.runner import AsyncRunner, Runner, RunResult
from tether.errors import (
    AlreadyDecided,
    ApprovalError,
    ConfigError,
    DeniedByPolicy,
    InvalidEditedInput,
    ModelError,
    NotAwaitingApproval,
    RunNotFound,
    StaleFingerprint,
    StaleRun,
    StoreError,
    TetherError,
    UnknownCall,
)
from tether.heap import freeze_startup_heap
from tether.policy.policies import ApprovalVerdict, Limits, RetryPolicy
from tether.policy.rules import Policy, Rule
from tether.tools import RetryLater, Tool, tool

_moved.install()

__all__ = [
    "Agent",
    "AgentMachine",
    "AlreadyDecided",
    "ApprovalError",
    "ApprovalRequest",
    "ApprovalVerdict",
    "Approve",
    "AsyncRunner",
    "AutoApprover",
    "CallbackApprover",
    "ConfigError",
    "DeniedByPolicy",
    "Deny",
    "Handoff",
    "InvalidEditedInput",
    "Limits",
    "ModelError",
    "NotAwaitingApproval",
    "Policy",
    "RetryLater",
    "RetryPolicy",
    "Rule",
    "RunNotFound",
    "RunResult",
    "Runner",
    "StaleFingerprint",
    "StaleRun",
    "StoreError",
    "TetherError",
    "Tool",
    "UnknownCall",
    "freeze_startup_heap",
    "tool",
]
