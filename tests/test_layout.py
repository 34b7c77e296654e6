"""The packages show the layers, and the old module paths still import.

Which layer may import which is checked by import-linter's contracts (``[tool.importlinter]`` in
pyproject.toml, run by scripts/test as ``lint-imports``). These checks keep the rest of the
picture true: nothing loose beside the packages, and every path a user may have imported
before a move resolves to the very module it names now, with a warning that says where it went.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

import tether
from tether._moved import MOVED

SRC = Path(tether.__file__).parent


def test_no_module_is_left_beside_the_packages() -> None:
    loose = sorted(path.name for path in SRC.glob("*.py"))
    assert loose == [
        "__about__.py",
        "__init__.py",
        "__main__.py",
        "_moved.py",
        "agent.py",
        "canonical.py",
        "durations.py",
        "errors.py",
        "extras.py",
        "heap.py",
        "redact.py",
    ]


@pytest.mark.parametrize(("old", "new"), sorted(MOVED.items()))
def test_an_old_module_path_imports_the_moved_module_with_a_warning(old: str, new: str) -> None:
    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning, match=f"{old} moved to {new}"):
        module = importlib.import_module(old)
    assert module is importlib.import_module(new)
    assert Path(module.__file__ or "").is_relative_to(SRC / new.split(".")[1])


def test_the_readme_example_of_an_old_import_still_works() -> None:
    sys.modules.pop("tether.pending", None)
    namespace: dict[str, object] = {}
    with pytest.warns(DeprecationWarning, match="tether.pending moved to tether.views.pending"):
        exec("from tether.pending import pending_approvals", namespace)  # what a service wrote before
    from tether.views.pending import pending_approvals

    assert namespace["pending_approvals"] is pending_approvals


def test_a_path_that_never_existed_still_fails_to_import() -> None:
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("tether.no_such_module")
