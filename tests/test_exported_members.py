"""The public names are pinned: adding or dropping one is a decision made here, on purpose.

As httpx's ``tests/test_exported_members.py``: ``__all__`` is sorted, lists exactly these
names, each importable, and ``tether`` exposes no other public name at its top level
(adapters stay in their submodules: ``tether.models.anthropic``, ``tether.stores.sql``, ...).
"""

from __future__ import annotations

import importlib
import types

import pytest

PUBLIC = {
    "tether": [
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
    ],
    "tether.testing": [
        "FakeChatCompletionsAPI",
        "FakeMessagesAPI",
        "Recording",
        "RecordingApprover",
        "Replay",
        "ReplayMismatch",
        "ScriptedModel",
        "replay",
        "validate_chat_request",
        "validate_messages_request",
    ],
    "tether.toolsets": [
        "KINDS",
        "Toolset",
        "asking",
        "changes",
        "describe",
        "fingerprint",
        "from_record",
        "included",
        "local_name",
        "recorded",
    ],
}


@pytest.mark.parametrize("module_name", sorted(PUBLIC))
def test_all_lists_exactly_the_public_names_sorted(module_name: str) -> None:
    module = importlib.import_module(module_name)
    assert module.__all__ == PUBLIC[module_name]
    assert module.__all__ == sorted(module.__all__)


@pytest.mark.parametrize(("module_name", "name"), [(m, n) for m, names in sorted(PUBLIC.items()) for n in names])
def test_every_exported_name_is_importable(module_name: str, name: str) -> None:
    namespace: dict[str, object] = {}
    exec(f"from {module_name} import {name}", namespace)  # the statement a user writes
    assert namespace[name] is getattr(importlib.import_module(module_name), name)


def test_tether_exposes_no_public_name_outside_all() -> None:
    tether = importlib.import_module("tether")
    public = {
        name
        for name, value in vars(tether).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType)  # submodules are reached by path
    }
    assert public == set(tether.__all__)


def test_the_package_says_it_is_typed() -> None:
    """PEP 561's marker: without it, a user's mypy or pyright treats every tether name as Any."""
    import importlib.resources

    assert importlib.resources.files("tether").joinpath("py.typed").is_file()
