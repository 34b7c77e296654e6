"""Keep a service's long-lived heap out of the garbage collector's full passes: freeze it.

A process that has imported the ``anthropic`` and ``openai`` SDKs holds about 250,000 container
objects (classes, functions, pydantic schemas) that live as long as it does. CPython's cyclic
collector traverses every one of them in each full collection, which it starts every few hundred
thousand allocations: 150-400 ms each, on the event loop, the lag spikes of a service driving
many runs. :func:`gc.freeze` moves every object tracked now into a permanent generation the
collector never traverses again (in constant time); what is allocated later is collected as usual.

The trade-off: the cyclic collector never frees a frozen object, so a reference cycle among
objects alive at the freeze that later becomes garbage stays until the process ends (reference
counting still frees everything else). Collecting just before freezing keeps that to objects
that were alive then: module-level data, which lives as long as the process anyway.

Where tether owns the process (``tether worker``, ``tether ui``, ``tether.examples.service``) it
freezes once its imports are done; :class:`~tether.AsyncRunner` freezes once per process when
the first one is made (``freeze_heap=False`` opts out), and an SDK imported later, at a model's
first call, is frozen too once it is imported (:func:`freeze_late_import`).
"""

from __future__ import annotations

import gc

_frozen = False
"""Whether this process froze its startup heap (through this module)."""


def freeze_startup_heap() -> int:
    """Collect, then freeze every object alive now (see the module's docstring); the number frozen.

    Call it once the process has imported what it needs and before it serves (a host that made
    its :class:`~tether.AsyncRunner` with ``freeze_heap=False``, or that wants it earlier). Calling
    it again freezes what was allocated since, after collecting that.
    """
    global _frozen  # noqa: PLW0603 - one flag for the process, as gc's own state is
    gc.collect()
    gc.freeze()
    _frozen = True
    return gc.get_freeze_count()


def freeze_once() -> None:
    """:func:`freeze_startup_heap` unless this process did already (each AsyncRunner asks; one freezes)."""
    if not _frozen:
        freeze_startup_heap()


def freeze_late_import() -> None:
    """After a late import (an SDK at a model's first call): freeze it too, if the process froze its heap.

    A process that never froze (``freeze_heap=False``, a script) is left alone.
    """
    if _frozen:
        freeze_startup_heap()


__all__ = ["freeze_late_import", "freeze_once", "freeze_startup_heap"]
