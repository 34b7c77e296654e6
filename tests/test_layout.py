"""The packages show the layers, dependencies point down, and the old module paths still import.

``src/tether`` groups modules by layer (see :mod:`tether`'s docstring). These checks keep the
picture true as the code grows: a module in a lower layer that imports an upper one (even
lazily, inside a function) fails here, and every path a user may have imported before the
move resolves to the very module it names now, with a warning that says where it went.
"""

from __future__ import annotations

import ast
import importlib
import sys
from pathlib import Path

import pytest

import tether
from tether._moved import MOVED

SRC = Path(tether.__file__).parent
LOWER = ("core", "policy", "execution", "tools", "models", "stores", "toolsets")
"""The layers that decide and adapt: they know nothing of who drives or shows a run."""
UPPER = ("drivers", "views", "surfaces", "examples")


def _imported_modules(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every ``tether`` import in the file, at any depth."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "tether":
            if node.module == "tether":
                found.extend((node.lineno, f"tether.{alias.name}") for alias in node.names)
            else:
                found.append((node.lineno, node.module))
        elif isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names if alias.name.startswith("tether."))
    return found


def _layer(module: str) -> str | None:
    """The package ``tether.<layer>...`` names, or None for a top-level module."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and (SRC / parts[1]).is_dir() else None


@pytest.mark.parametrize("layer", LOWER)
def test_lower_layers_import_no_driver_view_or_surface(layer: str) -> None:
    upward = [
        f"{path.relative_to(SRC)}:{line}: imports {module}"
        for path in sorted((SRC / layer).rglob("*.py"))
        for line, module in _imported_modules(path)
        if _layer(module) in UPPER
    ]
    assert upward == []


def test_only_the_cli_entry_point_imports_the_surfaces() -> None:
    outside = [
        f"{path.relative_to(SRC)}:{line}: imports {module}"
        for path in sorted(SRC.rglob("*.py"))
        if path.relative_to(SRC).parts[0] not in {"surfaces", "__main__.py"}
        for line, module in _imported_modules(path)
        if _layer(module) == "surfaces"
    ]
    assert outside == []


def test_no_module_is_left_beside_the_packages() -> None:
    loose = sorted(path.name for path in SRC.glob("*.py"))
    assert loose == [
        "__about__.py",
        "__init__.py",
        "__main__.py",
        "_moved.py",
        "agent.py",
        "durations.py",
        "errors.py",
        "extras.py",
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
