"""Frozen policy data and the pure decisions made from it.

Nothing here does I/O: a policy answers "retry after how long?" or "does this call need a
person?", and the engine turns the answer into a step.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any, Literal, get_args

from tether.errors import ConfigError
from tether.execution.faults import Classifier, ErrorClass, classify

RetryOn = tuple[type[BaseException], ...] | Callable[[BaseException], bool]
OnExhausted = Literal["error", "fail", "escalate"]


class RetryLater(Exception):
    """Raised by a tool to ask for another attempt; the message is kept for the model.

    A signal, not an error: every :class:`RetryPolicy` retries it while attempts remain,
    whatever its ``retry_on`` or ``classify`` say.
    """


@dataclass(frozen=True)
class RetryDecision:
    """What :meth:`RetryPolicy.decide` says about one failed attempt."""

    retry_in: float | None
    """Seconds until the next attempt; None when none is made (attempts spent, or not retried)."""
    otherwise: OnExhausted
    """What happens when no attempt is made: ``on_exhausted`` for an error the policy retries,
    ``"error"`` (the model gets it) for one it does not. The engine also applies it when a
    timed-out call that may still be running cannot be retried safely."""


@dataclass(frozen=True)
class RetryPolicy:
    """How one tool is retried when it raises.

    Each attempt is its own step; the due time of the next attempt is persisted, so a
    restarted process keeps the schedule.
    """

    max_attempts: int = 1
    """Attempts in all, the first included (1 = never retry)."""
    initial_delay: float = 0.5
    """Seconds before the second attempt."""
    max_delay: float = 30.0
    """Upper bound for any one delay, in seconds."""
    multiplier: float = 2.0
    """Each further delay is the previous one times this."""
    jitter: float = 0.0
    """Up to this fraction of the delay is added at random (0.1 = up to +10%)."""
    retry_on: RetryOn | None = None
    """Exception types that are retried, or a predicate; None: errors classed ``retryable``."""
    on_exhausted: OnExhausted = "error"
    """When attempts run out: ``error`` gives the model an is_error result with the last
    error; ``fail`` fails the run; ``escalate`` asks a person whether to try again."""
    classify: Classifier | None = None
    """Overrides :func:`tether.execution.faults.classify` for this tool (return None to defer)."""

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ConfigError("RetryPolicy.max_attempts must be at least 1")
        if self.initial_delay < 0 or self.max_delay < 0 or self.multiplier < 1 or self.jitter < 0:
            raise ConfigError("RetryPolicy delays must be >= 0, multiplier >= 1, jitter >= 0")
        if self.on_exhausted not in ("error", "fail", "escalate"):
            raise ConfigError("RetryPolicy.on_exhausted must be 'error', 'fail' or 'escalate'")

    def decide(self, error: BaseException, attempt: int, *, rng: Callable[[], float]) -> RetryDecision:
        """The one answer to "try again?" after attempt number ``attempt`` (1-based) raised ``error``.

        ``rng`` draws the jitter (a number in [0, 1)): the driver's seedable random source.
        """
        wanted = self.matches(error)  # once: a retry_on predicate is the user's code
        retry_in = self.delay(attempt, rng) if wanted and attempt < self.max_attempts else None
        return RetryDecision(retry_in, self.on_exhausted if wanted else "error")

    def should_retry(self, error: BaseException, attempt: int) -> bool:
        """Whether ``error`` raised by attempt number ``attempt`` (1-based) is retried (see :meth:`decide`)."""
        return self.decide(error, attempt, rng=lambda: 0.0).retry_in is not None

    def matches(self, error: BaseException) -> bool:
        """Whether ``error`` is the kind this policy retries (attempts aside)."""
        if isinstance(error, RetryLater):
            return True
        if self.retry_on is None:
            return classify(error, self.classify) == "retryable"
        if isinstance(self.retry_on, tuple):
            return isinstance(error, self.retry_on)
        return bool(self.retry_on(error))

    def error_class(self, error: BaseException) -> ErrorClass:
        """The class of ``error`` under this policy's classifier (a :class:`RetryLater` is retryable)."""
        return "retryable" if isinstance(error, RetryLater) else classify(error, self.classify)

    def delay(self, attempt: int, rng: Callable[[], float]) -> float:
        """Seconds to wait after attempt number ``attempt`` failed; ``rng`` draws the jitter."""
        base = min(self.initial_delay * self.multiplier ** (attempt - 1), self.max_delay)
        return min(base * (1 + self.jitter * rng()), self.max_delay)


NO_RETRY = RetryPolicy()

Verdict = Literal["allow", "require_approval", "deny"]
VERDICT_VALUES: tuple[Verdict, ...] = get_args(Verdict)


@dataclass(frozen=True)
class ApprovalVerdict:
    """What an approval policy says about one call.

    Checked when built: a mistyped verdict (``"denied"``) is an error, never a silent allow.
    """

    verdict: Verdict
    """allow: run it; require_approval: park for a person; deny: answer with an error."""
    reason: str = ""
    """Why (shown to the person, or to the model on a denial)."""
    note: str = ""
    """Markdown a person deciding the call is shown beside the reason (what to check, whom to ask)."""

    def __post_init__(self) -> None:
        if self.verdict not in VERDICT_VALUES:
            raise ConfigError(
                f"unknown approval verdict {self.verdict!r} (expected one of {', '.join(map(repr, VERDICT_VALUES))})"
            )
        if not isinstance(self.reason, str):
            raise ConfigError(f"ApprovalVerdict.reason must be a string, not {self.reason!r}")
        if not isinstance(self.note, str):
            raise ConfigError(f"ApprovalVerdict.note must be a string, not {self.note!r}")


ALLOW = ApprovalVerdict("allow")
REQUIRE_APPROVAL = ApprovalVerdict("require_approval", "the tool is marked approval=True")


@dataclass(frozen=True)
class ApprovalContext:
    """What an approval callable may look at besides the validated input."""

    run_id: str
    tool: str
    call_id: str
    tenant: str | None = None
    agent: str | None = None
    """The agent's ``name``, so one callable can treat agents differently."""


ApprovalCallable = Callable[[Any, ApprovalContext], "ApprovalVerdict | bool"]
ApprovalSetting = bool | ApprovalCallable


def decide_approval(setting: ApprovalSetting, args: Any, context: ApprovalContext) -> ApprovalVerdict:
    """Apply a tool's ``approval=`` setting to one call.

    A callable answers with an :class:`ApprovalVerdict` or a bool (True: ask a person). Any
    other answer (a forgotten ``return`` gives None, a string like ``"deny"``) never allows:
    a person is asked, and told why.
    """
    if setting is True:
        return REQUIRE_APPROVAL
    if setting is False:
        return ALLOW
    answer = setting(args, context)
    if isinstance(answer, ApprovalVerdict):
        return answer
    if isinstance(answer, bool):
        return REQUIRE_APPROVAL if answer else ALLOW
    shown = repr(answer)
    if len(shown) > 60:
        shown = f"a {type(answer).__name__}"
    return ApprovalVerdict(
        "require_approval",
        f"the approval gate of {context.tool!r} returned {shown}, not an ApprovalVerdict or a bool",
    )


@dataclass(frozen=True)
class Limits:
    """Caps on one run: reaching ``max_steps`` or ``max_tool_calls`` ends the run failed.

    The error names the limit; a warning comes first, at the budget's ``warn_at`` (default
    80%). For a graceful stop (one last answer without tools) use a :class:`Budget`.
    """

    max_steps: int | None = 50
    """Model invocations in all (across resumes)."""
    max_tool_calls: int | None = None
    """Tool executions in all."""
    max_tokens: int = 4096
    """``max_tokens`` of each model call."""
    max_tokens_ceiling: int = 32000
    """How far ``max_tokens`` may be raised when a tool_use was cut off."""
    max_result_chars: int | None = 20000
    """Longer tool results (errors included) reach the model cut to this many characters, with a
    note saying so; the full value stays in the ``tool_finished`` event (``full_content``). None = no cap."""
    budget: Budget | None = None
    """Token, cost, call and time budgets for the run (and its conversation)."""
    max_depth: int = 4
    """How deep this agent's calls of agent tools may start child runs (its own run at depth 0
    or deeper, its children one deeper): a call that would go deeper gets an error result."""
    max_handoffs: int = 10
    """How many handoffs a run may record in all (A to B and back to A is two), so agents handing
    the conversation back and forth stop: a handoff beyond it gets an error result."""


@dataclass(frozen=True)
class Budget:
    """Spending limits; at ``warn_at`` of any of them a warning, at the limit a graceful stop.

    Run limits count this run (across resumes); ``conversation_*`` limits also count every
    earlier run it continues. Input tokens include cache writes and reads. Tool-call and
    time limits are also checked before each tool call: calls left when one is reached are
    not run (the model is told), then the stop happens.
    """

    max_input_tokens: int | None = None
    max_output_tokens: int | None = None
    max_total_tokens: int | None = None
    """Input plus output tokens (cache included)."""
    max_cost_usd: float | None = None
    """Needs a priced model (see :mod:`tether.policy.pricing`); an Agent refuses it otherwise."""
    max_seconds: float | None = None
    """Wall-clock seconds since the run was created."""
    max_model_calls: int | None = None
    """Model invocations; unlike ``Limits.max_steps`` the run then gets its final answer."""
    max_tool_calls: int | None = None
    """Tool executions (each attempt counts)."""
    conversation_max_tokens: int | None = None
    """Input plus output tokens over the whole conversation."""
    conversation_max_cost_usd: float | None = None
    conversation_max_model_calls: int | None = None
    conversation_max_tool_calls: int | None = None
    conversation_max_seconds: float | None = None
    """Wall-clock seconds since the conversation's first run was created."""
    warn_at: float = 0.8
    """Fraction of a limit at which a ``warning`` event is recorded (once per limit)."""
    on_limit: Literal["final_answer", "fail"] = "final_answer"
    """final_answer: one last model call with tools disabled asking for an answer; fail: fail."""

    def __post_init__(self) -> None:
        if not 0 < self.warn_at <= 1:
            raise ConfigError("Budget.warn_at must be in (0, 1]")
        if self.on_limit not in ("final_answer", "fail"):
            raise ConfigError("Budget.on_limit must be 'final_answer' or 'fail'")
        for name, value in self.limits().items():
            if not (value > 0 and math.isfinite(value)):  # inf is no limit, which None says (and JSON cannot hold)
                raise ConfigError(f"Budget.{name} must be positive and finite (None: no limit), not {value!r}")

    def limits(self) -> dict[str, float]:
        """The limits set, by field name."""
        return {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if f.name not in ("warn_at", "on_limit") and getattr(self, f.name) is not None
        }

    @property
    def counts_cost(self) -> bool:
        """Whether a cost limit is set (so model calls must be priced)."""
        return self.max_cost_usd is not None or self.conversation_max_cost_usd is not None

    def to_dict(self) -> dict[str, Any]:
        """JSON form, stored in a run's spec so ``resume`` in another process keeps it."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Budget:
        """Read :meth:`to_dict`'s form; unknown keys are an error (not a silently dropped limit)."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"unknown budget field(s): {', '.join(unknown)}")
        return cls(**data)
