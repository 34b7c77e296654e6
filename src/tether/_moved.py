"""Module paths from before the layer packages, still importable for one more release.

tether's modules once sat side by side in ``tether/``; they now live in packages by layer
(``core``, ``policy``, ``tools``, ``stores``, ``drivers``, ``views``, ``surfaces``). Code
that imports an old path (``from tether.pending import pending_approvals``) gets the very
same module object, with a :class:`DeprecationWarning` naming the new path.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
import warnings
from collections.abc import Sequence

MOVED: dict[str, str] = {
    "tether.approvals": "tether.core.approvals",
    "tether.attempts": "tether.execution.attempts",
    "tether.audit": "tether.views.audit",
    "tether.budgets": "tether.core.budgets",
    "tether.cache": "tether.core.cache",
    "tether.cli": "tether.surfaces.cli",
    "tether.compat": "tether.core.compat",
    "tether.core.compaction": "tether.policy.compaction",
    "tether.core.events": "tether.facts.events",
    "tether.core.history": "tether.facts.history",
    "tether.core.results": "tether.tools.output",
    "tether.core.status": "tether.facts.status",
    "tether.demo": "tether.examples.demo",
    "tether.diagram": "tether.views.diagram",
    "tether.engine": "tether.core.engine",
    "tether.events": "tether.facts.events",
    "tether.faults": "tether.execution.faults",
    "tether.flow": "tether.core.flow",
    "tether.history": "tether.facts.history",
    "tether.leases": "tether.stores.leases",
    "tether.loader": "tether.drivers.loader",
    "tether.machine": "tether.core.machine",
    "tether.pending": "tether.views.pending",
    "tether.policies": "tether.policy.policies",
    "tether.policy.budgets": "tether.core.budgets",
    "tether.pricing": "tether.policy.pricing",
    "tether.rules": "tether.policy.rules",
    "tether.runner": "tether.drivers.runner",
    "tether.state": "tether.core.state",
    "tether.status": "tether.facts.status",
    "tether.terminal": "tether.surfaces.terminal",
}
"""Old module path -> where the module lives now."""


class MovedModuleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Resolves an old module path to the moved module itself (never a copy)."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        """A spec for an old path; ``None`` lets every other name import as usual."""
        if fullname not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        """The moved module, imported under its new name."""
        new = MOVED[spec.name]
        warnings.warn(f"{spec.name} moved to {new}; import it from there", DeprecationWarning, stacklevel=2)
        return importlib.import_module(new)

    def exec_module(self, module: types.ModuleType) -> None:
        """Nothing to run: the module was executed when imported under its new name."""


def install() -> None:
    """Let old paths import; after every real finder, so only names with no file reach it."""
    if not any(isinstance(finder, MovedModuleFinder) for finder in sys.meta_path):
        sys.meta_path.append(MovedModuleFinder())
