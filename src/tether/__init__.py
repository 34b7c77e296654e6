"""tether: an explicit state-machine orchestrator for LLM agents; the host runs the tools.

One model invocation is one step; every step is a transition of
:class:`tether.machine.AgentMachine` and one committed write. Adapters live in submodules:
``tether.models.anthropic``, ``tether.models.scripted``, ``tether.stores.sql``, ...
"""

from tether.agent import Agent
from tether.approvals import ApprovalRequest, Approve, AutoApprover, CallbackApprover, Deny
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
from tether.machine import AgentMachine
from tether.policies import ApprovalVerdict, Limits, RetryPolicy
from tether.rules import Policy, Rule
from tether.runner import AsyncRunner, Runner, RunResult
from tether.tools import RetryLater, Tool, tool

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
    "tool",
]
