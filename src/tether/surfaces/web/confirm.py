"""What the inspector asks before a form whose effect is hard to take back: cancel, resume, retry, fork.

The page asks in a ``<dialog>`` (``data-confirm`` on the form, read by the page's script) and sends
the form with ``confirmed=1``; a form that comes without it (no script) is answered with a page asking
the same question, whose yes sends it again with ``confirmed=1``. Either way, nothing happens
before the person has read the question and said yes.
"""

from __future__ import annotations

from dataclasses import dataclass

CONFIRMED = "confirmed"
"""The field saying the person said yes to the question."""
CONTROLS = ("cancel", "resume", "retry")
"""What a run's page may do to it."""


@dataclass(frozen=True)
class Question:
    """A question a form's effect needs a yes to."""

    title: str
    text: str
    yes: str
    """The yes button's words (what it does)."""
    tone: str = "approve"
    """How the yes button is styled: ``approve`` or ``deny`` (a red one, for what cannot be undone)."""


def question(action: str, run_id: str, at: str = "") -> Question:
    """The question for ``action`` (a control, or ``fork`` at event ``at``) on ``run_id``."""
    if action == "cancel":
        return Question(
            f"Cancel run {run_id}?",
            "It stops for good, and its child runs with it. A tool another process is running now is not "
            "stopped, but what it returns is not used.",
            "Cancel the run",
            "deny",
        )
    if action == "resume":
        return Question(
            f"Resume run {run_id}?",
            "It is driven on now, from where it stopped: the model is called, and its tools that need no "
            "approval run at once (a child run is driven by the run it belongs to).",
            "Resume the run",
        )
    if action == "retry":
        return Question(
            f"Retry run {run_id}?",
            "It failed in a way a new try may mend. It is driven on again from its last step: the model is "
            "called, and its tools that need no approval run at once.",
            "Retry the run",
        )
    return Question(
        f"Fork run {run_id} at event #{at}?",
        "A new run starts with this run's history as of that event and is driven on at once: the model is "
        "asked again, and tools that need no approval run right away (those that need one wait for a person). "
        "This run stays as it is.",
        "Fork and run it",
    )


__all__ = ["CONFIRMED", "CONTROLS", "Question", "question"]
