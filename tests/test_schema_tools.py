"""Tools described by a raw JSON schema (as MCP servers and OpenAPI operations describe theirs).

``schema_tool`` builds an ordinary :class:`tether.tools.Tool` whose input is checked against
the schema it was given (with ``jsonschema``), whose definition shows that very schema, and
whose function receives the validated arguments as one dict: rules, approvals, edits and the
engine treat it like any other tool.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pydantic
import pytest

from support import DONE, tool_use, tool_use_turn
from tether import Agent, Approve, AsyncRunner, InvalidEditedInput, Policy, Rule, Runner
from tether.core.approvals import DecideLater
from tether.errors import ToolDefinitionError
from tether.models.scripted import ScriptedModel
from tether.tools import plain_errors, tool, tools_by_name
from tether.tools.schema import schema_tool

ORDER_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "customer": {"type": "string", "minLength": 1},
        "items": {"type": "array", "items": {"$ref": "#/$defs/Line"}},
        "amount": {"type": "number"},
    },
    "required": ["customer", "items"],
    "additionalProperties": False,
    "$defs": {
        "Line": {
            "type": "object",
            "properties": {"sku": {"type": "string"}, "qty": {"type": "integer", "minimum": 1}},
            "required": ["sku", "qty"],
        }
    },
}
ORDER = {"customer": "ada", "items": [{"sku": "A-1", "qty": 2}], "amount": 12.5}


def order_tool(seen: list[tuple[dict[str, Any], str]], **options: Any) -> Any:
    def place_order(arguments: dict[str, Any], tool_use_id: str) -> dict[str, Any]:
        seen.append((arguments, tool_use_id))
        return {"order": "o-1", "lines": len(arguments["items"])}

    return schema_tool(place_order, ORDER_SCHEMA, name="place_order", description="Place an order.", **options)


def test_the_definition_is_the_schema_given_and_the_tool_has_its_name_and_description() -> None:
    built = order_tool([])
    assert built.definition() == {"name": "place_order", "description": "Place an order.", "input_schema": ORDER_SCHEMA}
    built.input_schema()["properties"].clear()  # a copy each time: the tool's own schema stays whole
    assert built.input_schema() == ORDER_SCHEMA


def test_valid_arguments_reach_the_function_as_one_dict_with_the_call_id() -> None:
    seen: list[tuple[dict[str, Any], str]] = []
    built = order_tool(seen)
    assert built.execute(built.validate(ORDER), "toolu_1") == '{"order": "o-1", "lines": 1}'
    assert seen == [(ORDER, "toolu_1")]
    assert built.validate(ORDER).model_dump(mode="json") == ORDER  # what rules, fingerprints and the cache read


def test_arguments_the_schema_refuses_raise_a_validation_error_naming_each_place() -> None:
    built = order_tool([])
    with pytest.raises(pydantic.ValidationError) as caught:
        built.validate({"items": [{"sku": "A-1", "qty": 0}, {"sku": 7, "qty": 1}], "extra": True})
    assert plain_errors(caught.value).split("; ") == [
        "input: 'customer' is a required property",
        "input: Additional properties are not allowed ('extra' was unexpected)",
        "items.0.qty: 0 is less than the minimum of 1",
        "items.1.sku: 7 is not of type 'string'",
    ]
    with pytest.raises(pydantic.ValidationError, match="is not of type 'object'"):
        built.validate(["not", "an", "object"])


def test_a_schema_that_is_not_a_valid_json_schema_is_refused_naming_the_tool_and_the_place() -> None:
    broken = {"type": "object", "properties": {"qty": {"type": "integer", "minimum": "one"}}}
    with pytest.raises(ToolDefinitionError, match=r"tool 'bad': invalid input schema at properties\.qty\.minimum"):
        schema_tool(lambda arguments: None, broken, name="bad")


def test_the_schema_root_must_be_an_object_as_the_messages_api_requires() -> None:
    with pytest.raises(ToolDefinitionError, match="tool 'bad': the input schema's root must be of type 'object'"):
        schema_tool(lambda arguments: None, {"type": "string"}, name="bad")


def test_options_are_those_of_tool_and_are_checked_alike() -> None:
    built = order_tool([], approval=True, tags={"mutates"}, idempotent=True, timeout=5.0, source="shop API")
    assert (built.approval, built.tags, built.idempotent, built.timeout) == (True, frozenset({"mutates"}), True, 5.0)
    with pytest.raises(ToolDefinitionError, match="unknown option"):
        order_tool([], aproval=True)
    with pytest.raises(ToolDefinitionError, match="must match"):
        schema_tool(lambda arguments: None, ORDER_SCHEMA, name="has space")


def test_two_tools_of_one_name_are_refused_naming_where_each_comes_from() -> None:
    @tool
    def place_order(customer: str) -> str:
        """A local tool of the same name."""
        return customer

    with pytest.raises(ToolDefinitionError) as caught:
        tools_by_name([place_order, order_tool([], source="MCP server 'shop'")])
    message = str(caught.value)
    assert "two tools are named 'place_order'" in message
    assert "MCP server 'shop'" in message
    assert "test_schema_tools" in message  # the Python function's module


def test_a_run_calls_it_and_a_mistake_is_an_error_result_the_model_reads() -> None:
    seen: list[tuple[dict[str, Any], str]] = []
    script = [
        tool_use_turn(tool_use("toolu_bad", "place_order", {"customer": "ada", "items": [{"sku": "A"}]})),
        tool_use_turn(tool_use("toolu_ok", "place_order", ORDER)),
        DONE,
    ]
    runner = Runner(Agent(model=ScriptedModel(script), tools=[order_tool(seen)]))
    result = runner.run("order")
    assert result.status == "done"
    assert seen == [(ORDER, "toolu_ok")]
    first, second = [m["content"][0] for m in runner.load(result.run_id).messages if m["role"] == "user"][1:]
    assert first["is_error"] is True
    assert "items.0\n  'qty' is a required property" in first["content"]
    assert second == {"type": "tool_result", "tool_use_id": "toolu_ok", "content": '{"order": "o-1", "lines": 1}'}


def test_rules_match_its_fields_and_an_edit_is_checked_against_its_schema() -> None:
    seen: list[tuple[dict[str, Any], str]] = []
    policy = Policy([Rule(tool="place_order", when={"amount": {"gt": 100}}, action="require_approval")])
    big = {**ORDER, "amount": 500}
    script = [tool_use_turn(tool_use("toolu_1", "place_order", big)), DONE]
    agent = Agent(model=ScriptedModel(script), tools=[order_tool(seen)], policy=policy)
    runner = Runner(agent, approver=DecideLater())
    parked = runner.run("order")
    assert parked.status == "awaiting_approval"
    with pytest.raises(InvalidEditedInput) as caught:
        runner.decide(parked.run_id, "toolu_1", Approve(input={**big, "items": [{"sku": "A", "qty": "two"}]}))
    assert caught.value.problems == "items.0.qty: 'two' is not of type 'integer'"
    runner.decide(parked.run_id, "toolu_1", Approve(input={**big, "amount": 90}))
    assert runner.drive(parked.run_id).status == "done"
    assert seen == [({**big, "amount": 90}, "toolu_1")]


def test_an_async_function_is_awaited_by_the_async_runner() -> None:
    seen: list[dict[str, Any]] = []

    async def lookup(arguments: dict[str, Any]) -> str:
        await asyncio.sleep(0)
        seen.append(arguments)
        return f"found {arguments['customer']}"

    built = schema_tool(lookup, ORDER_SCHEMA, name="lookup")
    assert built.is_async
    script = [tool_use_turn(tool_use("toolu_1", "lookup", ORDER)), DONE]
    result = asyncio.run(AsyncRunner(Agent(model=ScriptedModel(script), tools=[built])).run("look"))
    assert result.status == "done"
    assert seen == [ORDER]
