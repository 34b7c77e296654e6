"""The inspector's edit form: fields made from a tool's JSON schema, read back into the input.

A form sent untouched must say exactly the input shown (or the decision would silently be about
another input); a field changed says the change; what cannot be read is a problem of that field.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import pydantic
import pytest

from tether import tool
from tether.surfaces.web.fields import Field, fields_of, input_of


class Address(pydantic.BaseModel):
    street: str
    city: str


@tool(approval=True)
def ship(
    order: str,
    carrier: Literal["ups", "dhl"],
    express: bool,
    boxes: Annotated[int, pydantic.Field(ge=1, description="How many boxes")],
    weight: float,
    items: list[dict[str, int]],
    to: Address,
    note: str | None = None,
    level: Literal[1, 2] | None = None,
) -> str:
    """Ship an order."""
    return order


SCHEMA = ship.input_schema()
SHOWN = {
    "order": "A-1",
    "carrier": "dhl",
    "express": False,
    "boxes": 2,
    "weight": 2.0,
    "items": [{"sku": 1}],
    "to": {"street": "1 Main St", "city": "Springfield"},
}


def sent(fields: list[Field], **changed: str) -> dict[str, str]:
    """The form as a browser posts it: each field's value (text areas with CRLF line breaks) and kind."""
    form: dict[str, str] = {}
    for field in fields:
        value = changed.get(field.key, field.value)
        form[field.name] = value.replace("\n", "\r\n") if field.control == "textarea" else value
        form[field.kind_name] = field.kind
    return form


def by_key(fields: list[Field]) -> dict[str, Field]:
    return {field.key: field for field in fields}


def test_each_property_gets_the_field_its_type_calls_for() -> None:
    fields = fields_of(SCHEMA, SHOWN)
    assert fields is not None
    found = by_key(fields)
    assert [field.key for field in fields] == list(SCHEMA["properties"])  # the schema's order
    assert (found["order"].control, found["order"].value, found["order"].required) == ("input", "A-1", True)
    assert found["carrier"].control == "select"
    assert found["carrier"].options == (('"ups"', "ups"), ('"dhl"', "dhl"))
    assert found["express"].options == (("true", "true"), ("false", "false"))
    boxes = found["boxes"]
    assert (boxes.control, boxes.step, boxes.description) == ("number", "1", "How many boxes")
    assert (found["weight"].control, found["weight"].value) == ("number", "2.0")
    assert (found["items"].control, found["items"].kind) == ("textarea", "json")  # nested: raw JSON
    assert found["to"].kind == "json"  # a model ($ref) too
    assert (found["note"].kind, found["note"].required) == ("string?", False)  # blank leaves it out
    assert found["level"].options[0] == ("", "— leave out")
    assert ("null", "null") in found["level"].options


@pytest.mark.parametrize(
    "shown",
    [
        SHOWN,
        {**SHOWN, "note": "two\nlines", "level": 2},
        {**SHOWN, "note": None, "level": None},
        {**SHOWN, "order": "tab\tand a right-to-left \u202e override", "note": ""},
        {**SHOWN, "order": "carriage\r\nreturn", "boxes": 12345678901234567890},
        {**SHOWN, "note": "\n leading line break", "extra": {"not": "in the schema"}},
        {**SHOWN, "carrier": "fedex", "express": "yes", "boxes": "two"},  # not what the schema says
        {"order": "A-1"},
    ],
)
def test_a_form_sent_untouched_says_exactly_the_input_shown(shown: dict[str, Any]) -> None:
    fields = fields_of(SCHEMA, shown)
    assert fields is not None
    assert input_of(sent(fields)) == (shown, {})
    said, _ = input_of(sent(fields))
    assert said is not None
    assert {key: type(value) for key, value in said.items()} == {key: type(value) for key, value in shown.items()}


def test_a_changed_field_says_the_change() -> None:
    fields = fields_of(SCHEMA, SHOWN)
    assert fields is not None
    form = sent(fields, boxes="3", weight="2.5", carrier='"ups"', express="true", note="fragile", items='[{"sku": 2}]')
    changed = {"boxes": 3, "weight": 2.5, "carrier": "ups", "express": True, "items": [{"sku": 2}], "note": "fragile"}
    assert input_of(form) == ({**SHOWN, **changed}, {})


def test_a_field_that_cannot_be_read_is_a_problem_of_that_field() -> None:
    fields = fields_of(SCHEMA, SHOWN)
    assert fields is not None
    said, problems = input_of(sent(fields, boxes="2.5", weight="heavy", items="[{"))
    assert set(problems) == {"boxes", "weight", "items"}
    assert problems["boxes"] == "'2.5' is not a whole number"
    assert problems["weight"] == "'heavy' is not a number"
    assert problems["items"].startswith("not valid JSON")
    assert said is not None
    assert said["order"] == "A-1"  # the others are read


def test_blank_numbers_and_json_leave_their_key_out_for_the_schema_to_judge() -> None:
    fields = fields_of(SCHEMA, SHOWN)
    assert fields is not None
    said, problems = input_of(sent(fields, boxes="", items=" "))
    assert problems == {}
    assert said is not None
    assert "boxes" not in said
    assert "items" not in said


def test_no_fields_without_an_object_schema_or_an_object_input() -> None:
    assert fields_of(None, SHOWN) is None
    assert fields_of({"type": "object"}, SHOWN) is None  # no properties: raw JSON only
    assert fields_of(SCHEMA, ["not", "an", "object"]) is None
    assert input_of({"input": "{}", "action": "edit"}) == (None, {})  # a form without fields
