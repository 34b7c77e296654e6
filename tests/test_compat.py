"""A stored run refuses to resume with tools whose inputs changed incompatibly, saying how."""

from __future__ import annotations

import enum
import inspect
from typing import Annotated, Any, Literal

import pydantic
import pytest

from tether import Agent, Approve, Runner, tool
from tether.core.compat import schema_changes
from tether.core.machine import MACHINE_VERSION
from tether.errors import IncompatibleRun
from tether.stores import SCHEMA_VERSION
from tether.stores.memory import MemoryStore
from tether.testing import ScriptedModel
from tether.tools import make_tool


def gated_script() -> list[dict[str, object]]:
    return [
        {
            "content": [{"type": "tool_use", "id": "t1", "name": "refund", "input": {"invoice": "A1", "amount": 5}}],
            "stop_reason": "tool_use",
        },
        {"content": [{"type": "text", "text": "done"}], "stop_reason": "end_turn"},
    ]


@tool(approval=True)
def refund(invoice: str, amount: int) -> str:
    """Refund (version 1)."""
    return f"refunded {amount}"


def parked_run(store: MemoryStore) -> str:
    result = Runner(Agent(model=ScriptedModel(gated_script()), tools=[refund]), store).run("refund A1")
    assert result.status == "awaiting_approval"
    return result.run_id


def test_compatible_changes_resume() -> None:
    @tool(name="refund", approval=True)
    def refund_v2(invoice: str, amount: int, note: str = "") -> str:
        """Refund (version 2: an optional field)."""
        return f"refunded {amount}"

    @tool
    def extra() -> str:
        """A new tool."""
        return "x"

    store = MemoryStore()
    run_id = parked_run(store)
    runner = Runner(Agent(model=ScriptedModel(gated_script()), tools=[refund_v2, extra]), store)
    assert runner.drive(run_id).status == "awaiting_approval"


@pytest.mark.parametrize(
    ("changed", "says"),
    [
        ("removed", "tool 'refund' is no longer available"),
        ("field_removed", "tool 'refund': field 'amount' was removed"),
        ("new_required", "tool 'refund': field 'reason' is now required"),
        ("type_changed", "tool 'refund': field 'amount' changed type from integer to string"),
    ],
)
def test_incompatible_changes_are_refused_naming_the_tool_and_change(changed: str, says: str) -> None:
    @tool(name="refund")
    def without_amount(invoice: str) -> str:
        """Refund."""
        return "x"

    @tool(name="refund")
    def with_reason(invoice: str, amount: int, reason: str) -> str:
        """Refund."""
        return "x"

    @tool(name="refund")
    def amount_as_text(invoice: str, amount: str) -> str:
        """Refund."""
        return "x"

    tools = {
        "removed": [],
        "field_removed": [without_amount],
        "new_required": [with_reason],
        "type_changed": [amount_as_text],
    }[changed]
    store = MemoryStore()
    run_id = parked_run(store)
    runner = Runner(Agent(model=ScriptedModel(gated_script()), tools=tools), store)
    with pytest.raises(IncompatibleRun, match=says):
        runner.drive(run_id)
    with pytest.raises(IncompatibleRun):
        runner.decide(run_id, "t1", Approve())
    assert store.load_run(run_id).status == "awaiting_approval"  # nothing was changed


@pytest.mark.parametrize(("key", "current"), [("machine_version", MACHINE_VERSION), ("schema_version", SCHEMA_VERSION)])
def test_a_run_from_a_newer_tether_is_refused(key: str, current: int) -> None:
    store = MemoryStore()
    run_id = parked_run(store)
    runner = Runner(Agent(model=ScriptedModel(gated_script()), tools=[refund]), store)
    state = runner.load(run_id)
    assert state.spec[key] == current  # each run records the versions it was started under
    state.spec[key] = current + 1
    with pytest.raises(IncompatibleRun, match=f"newer tether .* version {current + 1} > {current}"):
        runner.drive(state)


def test_schema_changes_lists_only_incompatible_differences() -> None:
    old = {"properties": {"a": {"type": "integer"}, "b": {"type": "string"}}, "required": ["a"]}
    new = {
        "properties": {"a": {"type": "integer"}, "b": {"type": "string"}, "c": {"type": "string"}},
        "required": ["a"],
    }
    assert schema_changes(old, new) == []
    assert schema_changes(new, old) == ["field 'c' was removed"]


# The comparison, table-driven: real tool input schemas built from type hints -------------------
def input_schema(**parameters: Any) -> dict[str, Any]:
    """The input schema of a tool taking these parameters: ``name=hint`` or ``name=(hint, default)``."""
    signature = []
    for name, spec in parameters.items():
        hint, default = spec if isinstance(spec, tuple) else (spec, inspect.Parameter.empty)
        signature.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=hint))

    def function(**arguments: Any) -> str:
        """A tool."""
        return ""

    function.__signature__ = inspect.Signature(signature)  # type: ignore[attr-defined]
    function.__annotations__ = {p.name: p.annotation for p in signature}
    return make_tool(function, name="t").input_schema()


class Point(pydantic.BaseModel):
    x: int
    y: int


class PointWithLabel(pydantic.BaseModel):
    x: int
    y: int
    label: str = ""


class PointWithZ(pydantic.BaseModel):
    x: int
    y: int
    z: int


class TextPoint(pydantic.BaseModel):
    x: str
    y: int


class Tree(pydantic.BaseModel):
    value: int
    children: list[Tree] = []


class TextTree(pydantic.BaseModel):
    value: str
    children: list[TextTree] = []


class Colour(enum.Enum):
    RED = "red"
    BLUE = "blue"


class Red(enum.Enum):
    RED = "red"


COMPATIBLE = [
    ("unchanged", {"a": int}, {"a": int}),
    ("optional field added", {"a": int}, {"a": int, "b": (str, "")}),
    ("required field made optional", {"a": int}, {"a": (int, 0)}),
    ("int widened to float", {"a": int}, {"a": float}),
    ("int widened to int | None", {"a": int}, {"a": int | None}),
    ("int | None widened to int | str | None", {"a": (int | None, None)}, {"a": (int | str | None, None)}),
    ("Literal widened", {"m": Literal["a"]}, {"m": Literal["a", "b"]}),
    ("Literal widened to str", {"m": Literal["a", "b"]}, {"m": str}),
    ("enum widened", {"c": Red}, {"c": Colour}),
    ("list items widened", {"xs": list[int]}, {"xs": list[float]}),
    ("typed to Any", {"a": int}, {"a": Any}),
    ("nested optional field added", {"p": Point}, {"p": PointWithLabel}),
    ("nested model made optional", {"p": Point}, {"p": (Point | None, None)}),
    ("bound loosened", {"n": Annotated[int, pydantic.Field(le=5)]}, {"n": Annotated[int, pydantic.Field(le=10)]}),
    ("recursive model unchanged", {"t": Tree}, {"t": Tree}),
]

INCOMPATIBLE = [
    (
        "Optional[int] to Optional[str]",
        {"a": (int | None, None)},
        {"a": (str | None, None)},
        ["field 'a' changed type from integer or null to string or null"],
    ),
    (
        "int | None narrowed to int",
        {"a": (int | None, None)},
        {"a": (int, 0)},
        ["field 'a' changed type from integer or null to integer"],
    ),
    ("float narrowed to int", {"a": float}, {"a": int}, ["field 'a' changed type from number to integer"]),
    ("Any narrowed to int", {"a": Any}, {"a": int}, ["field 'a' changed type from any value to integer"]),
    ("Literal narrowed", {"m": Literal["a", "b"]}, {"m": Literal["a"]}, ["field 'm' no longer accepts 'b'"]),
    (
        "Optional Literal narrowed",
        {"m": (Literal["a", "b"] | None, None)},
        {"m": (Literal["a"] | None, None)},
        ["field 'm' no longer accepts 'b'"],
    ),
    ("enum narrowed", {"c": Colour}, {"c": Red}, ["field 'c' no longer accepts 'blue'"]),
    ("str narrowed to a Literal", {"m": str}, {"m": Literal["a"]}, ["field 'm' now only accepts 'a'"]),
    ("nested field changed type", {"p": Point}, {"p": TextPoint}, ["field 'p.x' changed type from integer to string"]),
    (
        "nested field changed type inside Optional",
        {"p": (Point | None, None)},
        {"p": (TextPoint | None, None)},
        ["field 'p.x' changed type from integer to string"],
    ),
    ("nested field now required", {"p": Point}, {"p": PointWithZ}, ["field 'p.z' is now required"]),
    ("nested field removed", {"p": PointWithLabel}, {"p": Point}, ["field 'p.label' was removed"]),
    (
        "list items changed type",
        {"xs": list[int]},
        {"xs": list[str]},
        ["field 'xs[]' changed type from integer to string"],
    ),
    (
        "list of models changed inside",
        {"ps": list[Point]},
        {"ps": list[TextPoint]},
        ["field 'ps[].x' changed type from integer to string"],
    ),
    (
        "dict values changed type",
        {"d": dict[str, int]},
        {"d": dict[str, str]},
        ["field 'd.<key>' changed type from integer to string"],
    ),
    (
        "tuple item changed type",
        {"t": tuple[int, str]},
        {"t": tuple[int, int]},
        ["field 't[1]' changed type from string to integer"],
    ),
    ("recursive model changed", {"t": Tree}, {"t": TextTree}, ["field 't.value' changed type from integer to string"]),
    (
        "bound tightened",
        {"n": Annotated[int, pydantic.Field(le=10)]},
        {"n": Annotated[int, pydantic.Field(le=5)]},
        ["field 'n': maximum lowered from 10 to 5"],
    ),
    (
        "length bound added",
        {"s": str},
        {"s": Annotated[str, pydantic.Field(max_length=3)]},
        ["field 's': maxLength lowered from none to 3"],
    ),
    (
        "field removed and another now required",
        {"a": int, "b": (int, 0)},
        {"b": int},
        ["field 'a' was removed", "field 'b' is now required"],
    ),
]


@pytest.mark.parametrize(("old", "new"), [case[1:] for case in COMPATIBLE], ids=[case[0] for case in COMPATIBLE])
def test_compatible_changes_are_accepted(old: dict[str, Any], new: dict[str, Any]) -> None:
    assert schema_changes(input_schema(**old), input_schema(**new)) == []


@pytest.mark.parametrize(
    ("old", "new", "changes"), [case[1:] for case in INCOMPATIBLE], ids=[case[0] for case in INCOMPATIBLE]
)
def test_incompatible_changes_say_which_field_and_how(
    old: dict[str, Any], new: dict[str, Any], changes: list[str]
) -> None:
    assert schema_changes(input_schema(**old), input_schema(**new)) == changes


def test_a_nested_change_stops_a_resume_naming_tool_and_field() -> None:
    @tool(name="refund", approval=True)
    def refund_with_point(invoice: str, amount: int, at: Point | None = None) -> str:
        """Refund."""
        return "x"

    @tool(name="refund", approval=True)
    def refund_with_text_point(invoice: str, amount: int, at: TextPoint | None = None) -> str:
        """Refund."""
        return "x"

    store = MemoryStore()
    parked = Runner(Agent(model=ScriptedModel(gated_script()), tools=[refund_with_point]), store).run("refund A1")
    runner = Runner(Agent(model=ScriptedModel(gated_script()), tools=[refund_with_text_point]), store)
    with pytest.raises(IncompatibleRun, match=r"tool 'refund': field 'at\.x' changed type from integer to string"):
        runner.drive(parked.run_id)
