"""Policy rules: which tool calls an agent may make, and which need a person first.

A :class:`Policy` is an ordered list of :class:`Rule` s, declared in Python or loaded from a
TOML or YAML file, and held by an :class:`~tether.agent.Agent` (so agents sharing tools can
hold different permissions). For each call the rules are read in order:

- a matching ``warn`` rule records a ``warning`` event (also logged on the ``tether.policy``
  logger once committed) and reading goes on (like a firewall's LOG target, a warning never
  grants or takes away permission);
- the first matching ``allow``, ``require_approval`` or ``deny`` rule decides;
- when none decides, the tool's own ``approval=`` setting does.

A rule matches on the tool's name (:mod:`fnmatch` globs), its tags (any or all of a set),
and its validated input's top-level fields (a callable, or declarative predicates). A rule
file, in TOML (YAML has the same shape)::

    [[rules]]
    name = "deny-large-refunds"
    tool = "refund*"                  # a glob or a list of globs
    when = { amount = { gt = 100 } }  # equals, in, not_in, gt, gte, lt, lte, matches, contains
    action = "deny"
    message = "Refunds over 100 need a manager."

Everything is checked when the rule is built, so a bad file fails at load time with a
:class:`~tether.errors.ConfigError` naming the file, the rule and the problem — never
halfway through a run. Nothing here does I/O but :meth:`Policy.from_file`.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import logging
import operator
import os
import re
import tomllib
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any, Final, Literal, Protocol, get_args

import pydantic

from tether.errors import ConfigError
from tether.facts.events import Event, Warned
from tether.policy.policies import ApprovalContext, ApprovalSetting, ApprovalVerdict, Verdict, decide_approval


class RuledTool(Protocol):
    """What rules read of a tool (a :class:`tether.Tool`): its name, its tags and its own approval setting."""

    @property
    def name(self) -> str: ...  # noqa: D102 - the fields of Tool
    @property
    def tags(self) -> frozenset[str]: ...  # noqa: D102
    @property
    def approval(self) -> ApprovalSetting: ...  # noqa: D102


Action = Literal["allow", "require_approval", "deny", "warn"]
ACTIONS: Final[tuple[str, ...]] = get_args(Action)
Predicate = Callable[[Mapping[str, Any]], bool]
"""Called with the call's validated input as JSON-like data; True when the rule applies."""
Conditions = Mapping[str, Mapping[str, Any]]
"""``{field: {operator: operand, ...}, ...}``; every condition must hold."""

DEFAULT_MESSAGES: Final[Mapping[str, str]] = {
    "allow": "allowed",
    "require_approval": "a person must approve this call",
    "deny": "this call is not allowed",
    "warn": "flagged",
}
VERDICTS: Final[Mapping[str, Verdict]] = {"allow": "allow", "require_approval": "require_approval", "deny": "deny"}
RULE_KEYS: Final = ("name", "tool", "tags", "tags_all", "when", "action", "message", "description")
"""Keys a rule in a file may have (a typo is an error, not a rule that never matches)."""
YAML_SUFFIXES: Final = (".yaml", ".yml")
POLICY_LOG = logging.getLogger("tether.policy")
"""Where committed ``warn``-rule warnings are logged (level WARNING), beside their events."""


# Argument predicates ---------------------------------------------------------------------
def _compare(compare: Callable[[Any, Any], bool]) -> Callable[[Any, Any], bool]:
    """An ordering test that is simply False across types (a string is never > 100)."""

    def test(value: Any, operand: Any) -> bool:
        if isinstance(value, bool) or not isinstance(value, int | float | str):
            return False
        try:
            return bool(compare(value, operand))
        except TypeError:
            return False

    return test


def _contains(value: Any, operand: Any) -> bool:
    try:
        return operand in value
    except TypeError:
        return False


def _matches(value: Any, operand: re.Pattern[str]) -> bool:
    return isinstance(value, str) and operand.search(value) is not None


OPERATORS: Final[Mapping[str, Callable[[Any, Any], bool]]] = {
    "equals": operator.eq,
    "in": lambda value, operand: value in operand,
    "not_in": lambda value, operand: value not in operand,
    "gt": _compare(operator.gt),
    "gte": _compare(operator.ge),
    "lt": _compare(operator.lt),
    "lte": _compare(operator.le),
    "matches": _matches,
    "contains": _contains,
}
"""Declarative predicates on one input field; ``matches`` is :func:`re.search`."""


def _operand(name: str, operand: Any, where: str) -> Any:
    """Check (and compile) one operand, so a bad one fails when the rule is built."""
    if name in ("in", "not_in"):
        if not isinstance(operand, list | tuple | set | frozenset):
            raise ConfigError(f"{where}: {name!r} needs a list, not {operand!r}")
        return list(operand)
    if name in ("gt", "gte", "lt", "lte"):
        if isinstance(operand, bool) or not isinstance(operand, int | float | str):
            raise ConfigError(f"{where}: {name!r} needs a number or a string, not {operand!r}")
        return operand
    if name == "matches":
        if not isinstance(operand, str):
            raise ConfigError(f"{where}: 'matches' needs a regular expression string, not {operand!r}")
        try:
            return re.compile(operand)
        except re.error as error:
            raise ConfigError(f"{where}: bad regular expression {operand!r}: {error}") from None
    if operand is None and name == "contains":
        raise ConfigError(f"{where}: 'contains' needs a value")
    return operand


@dataclass(frozen=True)
class _Check:
    field: str
    operator: str
    operand: Any

    def __call__(self, arguments: Mapping[str, Any]) -> bool:
        """A field the input does not have never matches."""
        if self.field not in arguments:
            return False
        return OPERATORS[self.operator](arguments[self.field], self.operand)


def _compile_conditions(conditions: Mapping[Any, Any]) -> tuple[_Check, ...]:
    checks = []
    for name, tests in conditions.items():
        if not isinstance(name, str) or not name:
            raise ConfigError(f"'when': field names must be strings, not {name!r}")
        if not isinstance(tests, Mapping) or not tests:
            raise ConfigError(
                f"'when': field {name!r} needs a table of predicates, e.g. {{equals = ...}}, not {tests!r}"
            )
        for test, operand in tests.items():
            if test not in OPERATORS:
                raise ConfigError(
                    f"'when': field {name!r}: unknown predicate {test!r} (expected one of {', '.join(OPERATORS)})"
                )
            checks.append(_Check(name, test, _operand(test, operand, f"'when': field {name!r}")))
    return tuple(checks)


def _strings(value: Any, key: str, *, what: str) -> tuple[str, ...]:
    """A string or a collection of strings, as a tuple (one string is one item, not letters)."""
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list | tuple | set | frozenset) or not all(isinstance(i, str) and i for i in items):
        raise ConfigError(f"{key!r} must be {what} or a list of them, not {value!r}")
    return tuple(items)


# Rules and policies ------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class Rule:
    """One line of a policy: what it matches and what happens then.

    Matchers left out match everything, so ``Rule(action="require_approval")`` last in a
    policy asks about every call the earlier rules did not decide.
    """

    action: Action
    """``allow`` / ``require_approval`` / ``deny`` decide; ``warn`` records and reads on."""
    tool: str | Sequence[str] | None = None
    """Glob(s) on the tool's name (``delete_*``); any may match."""
    tags: Collection[str] = frozenset()
    """Matches a tool carrying ANY of these tags."""
    tags_all: Collection[str] = frozenset()
    """Matches a tool carrying ALL of these tags."""
    when: Predicate | Conditions | None = None
    """On the validated input: a callable, or ``{field: {predicate: operand}}``."""
    message: str = ""
    """Shown to the person (require_approval), the model (deny) or the log (warn)."""
    name: str | None = None
    """Names the rule in reasons and errors: ``rule 2 (deny-large-refunds)``."""
    description: str = ""
    """Markdown shown to the person deciding a call this rule sends to them (what to check, whom to ask)."""
    _globs: tuple[str, ...] = field(default=(), init=False, repr=False, compare=False)
    _checks: tuple[_Check, ...] = field(default=(), init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.action not in ACTIONS:
            raise ConfigError(f"unknown action {self.action!r} (expected one of {', '.join(ACTIONS)})")
        if self.tool is not None:
            object.__setattr__(self, "_globs", _strings(self.tool, "tool", what="a glob string"))
        object.__setattr__(self, "tags", frozenset(_strings(self.tags, "tags", what="a tag")))
        object.__setattr__(self, "tags_all", frozenset(_strings(self.tags_all, "tags_all", what="a tag")))
        if isinstance(self.when, Mapping):
            object.__setattr__(self, "_checks", _compile_conditions(self.when))
        elif self.when is not None and not callable(self.when):
            raise ConfigError(f"'when' must be a callable or a table of field predicates, not {self.when!r}")
        if not isinstance(self.message, str):
            raise ConfigError(f"'message' must be a string, not {self.message!r}")
        if not isinstance(self.description, str):
            raise ConfigError(f"'description' must be a string, not {self.description!r}")
        if self.name is not None and (not isinstance(self.name, str) or not self.name):
            raise ConfigError(f"'name' must be a non-empty string, not {self.name!r}")

    def matches(self, tool: RuledTool, arguments: Mapping[str, Any]) -> bool:
        """Whether this rule applies to a call of ``tool`` with these (validated) arguments."""
        if self._globs and not any(fnmatchcase(tool.name, glob) for glob in self._globs):
            return False
        if self.tags and tool.tags.isdisjoint(self.tags):
            return False
        if self.tags_all and not tool.tags.issuperset(self.tags_all):
            return False
        if callable(self.when):
            return bool(self.when(arguments))
        return all(check(arguments) for check in self._checks)


@dataclass(frozen=True)
class RuleMatch:
    """A rule that matched a call, with its 1-based position (how people count rules)."""

    index: int
    rule: Rule

    @property
    def label(self) -> str:
        """``rule 2 (deny-large-refunds)``, or ``rule 2`` when unnamed."""
        return f"rule {self.index} ({self.rule.name})" if self.rule.name else f"rule {self.index}"

    @property
    def reason(self) -> str:
        """The label and the rule's message: what a person (or the model) is shown."""
        return f"{self.label}: {self.rule.message or DEFAULT_MESSAGES[self.rule.action]}"


@dataclass(frozen=True)
class CallDecision:
    """What a policy and the tool's own setting say about one call."""

    verdict: ApprovalVerdict
    rule: RuleMatch | None = None
    """The deciding rule; None when the tool's ``approval=`` setting decided."""
    warnings: tuple[RuleMatch, ...] = ()
    """``warn`` rules that matched before the decision, in order."""


@dataclass(frozen=True)
class Policy:
    """An ordered list of rules; the first deciding match wins."""

    rules: Sequence[Rule] = ()
    source: str | None = None
    """The file it was loaded from, if any (for messages)."""
    digest: str | None = None
    """SHA-256 of the rules as loaded (layout and comments aside); None for rules built in Python.

    A run started with ``--policy`` records it, so a later command can tell the file changed.
    """

    def __post_init__(self) -> None:
        object.__setattr__(self, "rules", tuple(self.rules))
        for index, rule in enumerate(self.rules, start=1):
            if not isinstance(rule, Rule):
                raise ConfigError(f"policy rule {index}: {rule!r} is not a Rule")

    def evaluate(self, tool: RuledTool, arguments: Mapping[str, Any]) -> tuple[RuleMatch | None, tuple[RuleMatch, ...]]:
        """The deciding rule (or None) and the warn rules matched before it."""
        warnings: list[RuleMatch] = []
        for index, rule in enumerate(self.rules, start=1):
            if not rule.matches(tool, arguments):
                continue
            if rule.action == "warn":
                warnings.append(RuleMatch(index, rule))
                continue
            return RuleMatch(index, rule), tuple(warnings)
        return None, tuple(warnings)

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> Policy:
        """Load a ``.toml``, ``.yaml`` or ``.yml`` rule file; every problem is a ConfigError."""
        file = Path(path)
        suffix = file.suffix.lower()
        if suffix != ".toml" and suffix not in YAML_SUFFIXES:
            shown = suffix or "(no suffix)"
            raise ConfigError(f"policy file {file}: unknown format {shown!r}; use .toml, .yaml or .yml")
        try:
            text = file.read_text(encoding="utf-8")
        except OSError as error:
            raise ConfigError(f"cannot read policy file {file}: {error.strerror or error}") from None
        except UnicodeDecodeError as error:
            byte = error.object[error.start : error.start + 1].hex()
            raise ConfigError(
                f"policy file {file} is not UTF-8 text (byte 0x{byte} at offset {error.start}): save it as UTF-8"
            ) from None
        try:
            if suffix == ".toml":
                try:
                    data: Any = tomllib.loads(text)
                except tomllib.TOMLDecodeError as error:
                    raise ConfigError(f"policy file {file}: invalid TOML: {error}") from None
            else:
                data = _load_yaml(text, file)
            return cls.from_dict(data, source=str(file))
        except RecursionError:  # the parsers and the digest recurse: thousands of nested brackets
            raise ConfigError(f"policy file {file}: nested too deeply to be a rule file") from None

    @classmethod
    def from_dict(cls, data: Any, *, source: str = "<dict>") -> Policy:
        """Build from parsed file data: ``{"rules": [{...}, ...]}``."""
        where = f"policy file {source}"
        if not isinstance(data, Mapping) or "rules" not in data:
            raise ConfigError(f"{where}: expected a top-level 'rules' list")
        unknown = sorted(str(key) for key in data if key != "rules")
        if unknown:
            raise ConfigError(f"{where}: unknown top-level key(s) {', '.join(unknown)} (only 'rules' is allowed)")
        items = data["rules"]
        if not isinstance(items, list):
            raise ConfigError(f"{where}: 'rules' must be a list of rules, not {items!r}")
        rules = []
        for index, item in enumerate(items, start=1):
            rules.append(_rule_from_dict(item, f"{where}: rule {index}"))
        canonical = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
        return cls(rules, source=source, digest=hashlib.sha256(canonical.encode()).hexdigest())


def _rule_from_dict(item: Any, where: str) -> Rule:
    if not isinstance(item, Mapping):
        raise ConfigError(f"{where}: expected a table of {', '.join(RULE_KEYS)}, not {item!r}")
    name = item.get("name")
    if isinstance(name, str) and name:
        where = f"{where} ({name})"
    unknown = sorted(str(key) for key in item if key not in RULE_KEYS)
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(unknown)} (expected {', '.join(RULE_KEYS)})")
    if "action" not in item:
        raise ConfigError(f"{where}: missing 'action' (one of {', '.join(ACTIONS)})")
    when = item.get("when")
    if when is not None and not isinstance(when, Mapping):
        raise ConfigError(f"{where}: 'when' must be a table of field predicates, not {when!r}")
    try:
        return Rule(**{key: value for key, value in item.items() if value is not None})  # YAML's empty = unset
    except ConfigError as error:
        raise ConfigError(f"{where}: {error}") from None


def _load_yaml(text: str, file: Path) -> Any:
    """Parse YAML with PyYAML, imported here only: TOML needs nothing beyond the stdlib."""
    try:
        yaml = importlib.import_module("yaml")  # untyped; kept to this one function
    except ImportError:
        raise ConfigError(
            f"policy file {file}: reading YAML needs PyYAML: pip install pyyaml (or write the rules in TOML)"
        ) from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise ConfigError(_yaml_problem(error, file)) from None


def _yaml_problem(error: Any, file: Path) -> str:
    """PyYAML's several-line message as one line, where editors and compilers put it: ``file:line:col: ...``.

    Its marks count from 0; lines and columns here count from 1, as an editor does.
    """
    mark, problem = getattr(error, "problem_mark", None), getattr(error, "problem", None)
    if mark is None or problem is None:  # not a parse error with a place (an unreadable character...)
        return f"policy file {file}: invalid YAML: {' '.join(str(error).split())}"
    said = f"policy file {file}:{mark.line + 1}:{mark.column + 1}: invalid YAML: {' '.join(str(problem).split())}"
    context, started = getattr(error, "context", None), getattr(error, "context_mark", None)
    if context:
        begun = f" begun at {started.line + 1}:{started.column + 1}" if started is not None else ""
        said += f" ({' '.join(str(context).split())}{begun})"
    return said


def decide_call(
    policy: Policy | None, tool: RuledTool, arguments: pydantic.BaseModel, context: ApprovalContext
) -> CallDecision:
    """The policy's first deciding rule, else the tool's ``approval=`` setting; pure.

    Rules see the validated input as JSON-like data (defaults filled in, the same shape a
    rule file speaks), so one rule can span tools with different input models.
    """
    match, warnings = (None, ()) if policy is None else policy.evaluate(tool, arguments.model_dump(mode="json"))
    if match is None:
        return CallDecision(decide_approval(tool.approval, arguments, context), None, warnings)
    verdict = ApprovalVerdict(VERDICTS[match.rule.action], match.reason, note=match.rule.description)
    return CallDecision(verdict, match, warnings)


def denial(
    policy: Policy | None, tool: RuledTool, arguments: pydantic.BaseModel, context: ApprovalContext
) -> str | None:
    """Why the policy (or the tool's approval callable) denies this call; None when it does not.

    Asked again of edited input, which must pass the same rules as the model's.
    """
    verdict = decide_call(policy, tool, arguments, context).verdict
    if verdict.verdict != "deny":
        return None
    return verdict.reason or f"the approval gate of {tool.name!r} denies it"


def log_warnings(run_id: str, events: Sequence[Event]) -> None:
    """Log the ``warn``-rule warnings among a step's committed events on :data:`POLICY_LOG`.

    Called by the drivers after each commit, so a warning is logged once, whichever process
    made it; the record's ``extra`` fields (run_id, call_id, tool, rule, rule_name) suit
    structured log handlers.
    """
    for event in events:
        match event.fact:
            case Warned(rule=int(rule), message=message, call_id=call_id, tool=tool, rule_name=rule_name):
                fields = {"call_id": call_id, "tool": tool, "rule": rule, "rule_name": rule_name}
                POLICY_LOG.warning(
                    "run %s, call %s (%s): %s", run_id, call_id, tool, message, extra={"run_id": run_id, **fields}
                )
