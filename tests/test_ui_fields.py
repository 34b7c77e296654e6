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
def book(
    guest: str,
    room: Literal["single", "double"],
    breakfast: bool,
    nights: Annotated[int, pydantic.Field(ge=1, description="How many nights")],
    rate: float,
    extras: list[dict[str, int]],
    billing: Address,
    note: str | None = None,
    floor: Literal[1, 2] | None = None,
) -> str:
    """Book a room."""
    return guest


SCHEMA = book.input_schema()
SHOWN = {
    "guest": "Ana",
    "room": "double",
    "breakfast": False,
    "nights": 2,
    "rate": 2.0,
    "extras": [{"cot": 1}],
    "billing": {"street": "1 Main St", "city": "Springfield"},
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
    assert (found["guest"].control, found["guest"].value, found["guest"].required) == ("input", "Ana", True)
    assert found["room"].control == "select"
    assert found["room"].options == (('"single"', "single"), ('"double"', "double"))
    assert found["breakfast"].options == (("true", "true"), ("false", "false"))
    nights = found["nights"]
    assert (nights.control, nights.step, nights.description) == ("number", "1", "How many nights")
    assert (found["rate"].control, found["rate"].value) == ("number", "2.0")
    assert (found["extras"].control, found["extras"].kind) == ("textarea", "json")  # nested: raw JSON
    assert found["billing"].kind == "json"  # a model ($ref) too
    assert (found["note"].kind, found["note"].required) == ("string?", False)  # blank leaves it out
    assert found["floor"].options[0] == ("", "— leave out")
    assert ("null", "null") in found["floor"].options


@pytest.mark.parametrize(
    "shown",
    [
        SHOWN,
        {**SHOWN, "note": "two\nlines", "floor": 2},
        {**SHOWN, "note": None, "floor": None},
        {**SHOWN, "guest": "tab\tand a right-to-left \u202e override", "note": ""},
        {**SHOWN, "guest": "carriage\r\nreturn", "nights": 12345678901234567890},
        {**SHOWN, "note": "\n leading line break", "extra": {"not": "in the schema"}},
        {**SHOWN, "room": "suite", "breakfast": "yes", "nights": "two"},  # not what the schema says
        {"guest": "Ana"},
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
    form = sent(
        fields, nights="3", rate="2.5", room='"single"', breakfast="true", note="late arrival", extras='[{"cot": 2}]'
    )
    changed = {
        "nights": 3,
        "rate": 2.5,
        "room": "single",
        "breakfast": True,
        "extras": [{"cot": 2}],
        "note": "late arrival",
    }
    assert input_of(form) == ({**SHOWN, **changed}, {})


def test_a_field_that_cannot_be_read_is_a_problem_of_that_field() -> None:
    fields = fields_of(SCHEMA, SHOWN)
    assert fields is not None
    said, problems = input_of(sent(fields, nights="2.5", rate="cheap", extras="[{"))
    assert set(problems) == {"nights", "rate", "extras"}
    assert problems["nights"] == "'2.5' is not a whole number"
    assert problems["rate"] == "'cheap' is not a number"
    assert problems["extras"].startswith("not valid JSON")
    assert said is not None
    assert said["guest"] == "Ana"  # the others are read


def test_blank_numbers_and_json_leave_their_key_out_for_the_schema_to_judge() -> None:
    fields = fields_of(SCHEMA, SHOWN)
    assert fields is not None
    said, problems = input_of(sent(fields, nights="", extras=" "))
    assert problems == {}
    assert said is not None
    assert "nights" not in said
    assert "extras" not in said


def test_no_fields_without_an_object_schema_or_an_object_input() -> None:
    assert fields_of(None, SHOWN) is None
    assert fields_of({"type": "object"}, SHOWN) is None  # no properties: raw JSON only
    assert fields_of(SCHEMA, ["not", "an", "object"]) is None
    assert input_of({"input": "{}", "action": "edit"}) == (None, {})  # a form without fields
