"""OpenAPI services as toolsets, against a real HTTP application serving its own spec.

The application (tests/fixtures/pets_api.py) runs on uvicorn on a loopback port, in a thread;
the toolset reads ``/openapi.json`` from it and calls it with httpx. What the application
received is read from its own record of requests, not from tether's word.
"""

from __future__ import annotations

import asyncio
import json
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fixtures.pets_api import SPEC, TOKEN, make_app, spec_30
from support import DONE, asks, closed_port, parked_with, results_by_call, serving_app, tool_use, tool_use_turn
from tether import Agent, Approve, AsyncRunner, AutoApprover, Policy, Rule, Runner
from tether.errors import IncompatibleRun, ToolsetError
from tether.models.scripted import ScriptedModel
from tether.stores.sql import SQLStore
from tether.toolsets import from_record
from tether.toolsets.openapi import OpenAPIToolset


class Api:
    """The running application: its base URL and what it received."""

    def __init__(self, url: str, app: Any) -> None:
        self.url = url
        self.spec_url = f"{url}/openapi.json"
        self.app = app

    @property
    def seen(self) -> list[tuple[str, str, str, Any]]:
        return [(method, path, query, body) for method, path, query, body, _ in self.app.state.seen]

    def headers(self, index: int) -> dict[str, str]:
        return dict(self.app.state.seen[index][4])


def reopened(record: dict[str, Any]) -> OpenAPIToolset:
    """The toolset a run recorded, as resuming makes it (from_record is typed as any Toolset)."""
    toolset = from_record(record)
    assert isinstance(toolset, OpenAPIToolset)
    return toolset


def serve(spec: dict[str, Any] | None = None) -> Iterator[Api]:
    app = make_app(spec)
    with serving_app(app) as url:
        yield Api(url, app)


@pytest.fixture
def api() -> Iterator[Api]:
    yield from serve()


@pytest.fixture
def toolset(api: Api) -> Iterator[OpenAPIToolset]:
    with OpenAPIToolset(api.spec_url) as made:
        yield made


def run(toolset: OpenAPIToolset, *uses: dict[str, Any], **options: Any) -> tuple[Runner, str]:
    """A run calling each of ``uses`` in a turn of its own, in order, then done."""
    script = [*(tool_use_turn(use) for use in uses), DONE]
    agent = Agent(model=ScriptedModel(script), toolsets=[toolset], policy=options.pop("policy", None))
    runner = Runner(agent, **{"approver": AutoApprover(approve=True), **options})
    return runner, runner.run("go").run_id


def finished(runner: Runner, run_id: str) -> dict[str, dict[str, Any]]:
    return {e.data["call_id"]: e.data for e in runner.store.load_events(run_id) if e.type == "tool_finished"}


# Tools from a spec -------------------------------------------------------------------------
def test_one_tool_per_operation_named_by_operation_id_else_method_and_path(toolset: OpenAPIToolset) -> None:
    names = [tool.name for tool in toolset.tools()]
    assert names == [
        "listPets",
        "createPet",
        "get_pets_petId",
        "deletePet",
        "adoptPet",
        "addNote",
        "readSecret",
        "busy",
        "broken",
        "slowRead",
        "slowWrite",
    ]
    shown = {tool.name: tool for tool in toolset.tools()}["get_pets_petId"]
    assert shown.description == "Show one pet.\n\nGET /pets/{petId}"


def test_include_keeps_the_operations_whose_names_match(api: Api) -> None:
    with OpenAPIToolset(api.spec_url, include=["*Pet*", "get_*"]) as toolset:
        names = [tool.name for tool in toolset.tools()]
    assert names == ["listPets", "createPet", "get_pets_petId", "deletePet", "adoptPet"]


def test_parameters_and_body_make_one_input_schema_with_refs_in_defs(toolset: OpenAPIToolset) -> None:
    tools = {tool.name: tool.input_schema() for tool in toolset.tools()}
    assert tools["listPets"] == {
        "type": "object",
        "properties": {
            "limit": {"type": "integer", "minimum": 1},
            "tags": {"type": "array", "items": {"type": "string"}},
            "session": {"type": "string"},
        },
        "additionalProperties": False,
    }
    assert tools["deletePet"]["properties"] == {"petId": {"type": "integer"}, "X-Reason": {"type": "string"}}
    assert tools["deletePet"]["required"] == ["petId"]
    create = tools["createPet"]
    assert create["properties"] == {"body": {"$ref": "#/$defs/Pet"}}
    assert create["required"] == ["body"]
    pet = create["$defs"]["Pet"]
    assert "id" not in pet["properties"]  # read-only: the server writes it
    assert pet["required"] == ["name"]
    assert create["$defs"]["Category"]["properties"]["parent"] == {"$ref": "#/$defs/Category"}  # recursive
    assert "$defs" not in tools["listPets"]  # only the schemas an operation reaches


def test_openapi_30_words_become_json_schema(api: Api) -> None:
    app_spec = spec_30()
    api.app.state.spec = app_spec
    with OpenAPIToolset(api.spec_url) as toolset:
        tools = {tool.name: tool for tool in toolset.tools()}
    assert tools["listPets"].input_schema()["properties"]["limit"] == {"type": "integer", "exclusiveMinimum": 0}
    status = tools["createPet"].input_schema()["$defs"]["Pet"]["properties"]["status"]
    assert status == {"type": ["string", "null"], "enum": ["available", "sold", None]}
    tools["createPet"].validate({"body": {"name": "Rex", "status": None}})  # null is allowed, as nullable said


def test_reading_methods_run_ungated_and_changing_ones_ask_first(toolset: OpenAPIToolset) -> None:
    tools = {tool.name: tool for tool in toolset.tools()}
    seen = {name: (asks(t), sorted(t.tags), t.idempotent) for name, t in tools.items()}
    assert seen["listPets"] == (None, ["network", "openapi", "read_only"], True)
    why = f"POST /pets changes things on the service ({toolset.source})"
    assert seen["createPet"] == (why, ["mutates", "network", "openapi"], False)
    why = f"DELETE /pets/{{petId}} changes things on the service ({toolset.source})"
    assert seen["deletePet"] == (why, ["destructive", "mutates", "network", "openapi"], False)


# Calls -----------------------------------------------------------------------------------------
def test_arguments_go_where_the_spec_puts_them_and_answers_come_back(toolset: OpenAPIToolset, api: Api) -> None:
    runner, run_id = run(
        toolset,
        tool_use("t_create", "createPet", {"body": {"name": "Rex", "category": {"name": "dogs"}}}),
        tool_use("t_list", "listPets", {"limit": 5, "tags": ["a", "b"], "session": "s 1"}),
        tool_use("t_get", "get_pets_petId", {"petId": 1}),
        tool_use("t_note", "addNote", {"body": {"text": "hello"}}),
        tool_use("t_delete", "deletePet", {"petId": 1, "X-Reason": "adopted"}),
    )
    got = results_by_call(runner, run_id)
    assert json.loads(got["t_create"]["content"]) == {"id": 1, "name": "Rex", "category": {"name": "dogs"}}
    assert json.loads(got["t_list"]["content"]) == [{"id": 1, "name": "Rex", "category": {"name": "dogs"}}]
    assert json.loads(got["t_get"]["content"])["name"] == "Rex"
    assert got["t_note"]["content"] == "noted: hello"
    assert got["t_delete"]["content"] == "HTTP 204 No Content"
    assert api.seen == [
        ("POST", "/v1/pets", "", {"name": "Rex", "category": {"name": "dogs"}}),
        ("GET", "/v1/pets", "limit=5&tags=a&tags=b", None),
        ("GET", "/v1/pets/1", "", None),
        ("POST", "/v1/notes", "", {"text": "hello"}),
        ("DELETE", "/v1/pets/1", "", None),
    ]
    assert api.headers(1)["cookie"] == "session=s%201"
    assert api.headers(4)["x-reason"] == "adopted"


def test_http_errors_are_classed_by_status(toolset: OpenAPIToolset) -> None:
    runner, run_id = run(
        toolset,
        tool_use("t404", "get_pets_petId", {"petId": 99}),
        tool_use("t401", "readSecret", {}),
        tool_use("t409", "adoptPet", {"petId": 1}),
        tool_use("t429", "busy", {}),
        tool_use("t503", "broken", {}),
    )
    classes = {call: event["error_class"] for call, event in finished(runner, run_id).items()}
    assert classes == {
        "t404": "user_fixable",
        "t401": "permission",
        "t409": "conflict",
        "t429": "retryable",
        "t503": "retryable",
    }
    got = results_by_call(runner, run_id)
    assert got["t404"]["is_error"] is True
    assert "HTTP 404 Not Found from GET " in got["t404"]["content"]
    assert '{"detail":"no pet 99"}' in got["t404"]["content"]  # the service's own words reach the model


def test_a_bearer_token_comes_from_the_named_variable_and_is_never_stored(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PETS_TOKEN", TOKEN)
    with OpenAPIToolset(api.spec_url, bearer="PETS_TOKEN") as toolset:
        runner, run_id = run(toolset, tool_use("t1", "readSecret", {}))
    assert results_by_call(runner, run_id)["t1"]["content"] == "the secret"
    (record,) = runner.load(run_id).spec["toolsets"]
    assert record["bearer"] == "PETS_TOKEN"
    assert TOKEN not in json.dumps(runner.load(run_id).spec)


def test_a_rule_can_lift_the_gate_of_a_changing_method(toolset: OpenAPIToolset, api: Api) -> None:
    policy = Policy([Rule(tool="createPet", action="allow")])
    runner, run_id = run(toolset, tool_use("t1", "createPet", {"body": {"name": "Rex"}}), policy=policy, approver=None)
    assert runner.load(run_id).status == "done"
    assert [call[:2] for call in api.seen] == [("POST", "/v1/pets")]


def test_the_async_runner_awaits_the_requests(toolset: OpenAPIToolset, api: Api) -> None:
    script = [tool_use_turn(tool_use("t1", "listPets", {"limit": 2})), DONE]
    result = asyncio.run(AsyncRunner(Agent(model=ScriptedModel(script), toolsets=[toolset])).run("go"))
    assert result.status == "done"
    assert api.seen == [("GET", "/v1/pets", "limit=2", None)]


@pytest.mark.slow  # the service sleeps past the client's timeout
def test_a_write_left_unanswered_is_in_doubt_and_a_read_is_only_retryable(api: Api) -> None:
    with OpenAPIToolset(api.spec_url, timeout=0.3) as toolset:
        runner, run_id = run(toolset, tool_use("t_write", "slowWrite", {}), tool_use("t_read", "slowRead", {}))
    events = finished(runner, run_id)
    assert events["t_write"]["in_doubt"] is True
    assert "may have taken effect" in events["t_write"]["content"]
    assert "in_doubt" not in events["t_read"]
    assert events["t_read"]["error_class"] == "retryable"


# Durability ------------------------------------------------------------------------------------
def test_a_parked_run_resumes_with_the_toolset_its_spec_records(api: Api, tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'runs.db'}"
    with OpenAPIToolset(api.spec_url) as toolset:
        runner, parked = parked_with(toolset, tool_use("t1", "createPet", {"body": {"name": "Rex"}}), db)
    assert api.seen == []
    (record,) = runner.load(parked.run_id).spec["toolsets"]
    assert (record["kind"], record["spec"], record["base_url"]) == ("openapi", api.spec_url, None)
    with reopened(record) as again:
        resumed = Runner(Agent(model=runner.agent.model, toolsets=[again]), SQLStore(db))
        resumed.decide(parked.run_id, "t1", Approve(actor="ada"))
        assert resumed.drive(parked.run_id).status == "done"
    assert api.seen == [("POST", "/v1/pets", "", {"name": "Rex"})]


def test_a_spec_changed_incompatibly_since_the_run_started_is_refused(api: Api, tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'runs.db'}"
    with OpenAPIToolset(api.spec_url) as toolset:
        runner, parked = parked_with(toolset, tool_use("t1", "createPet", {"body": {"name": "Rex"}}), db)
    changed = json.loads(json.dumps(SPEC))
    changed["components"]["schemas"]["Pet"]["required"] = ["id", "name", "owner"]
    api.app.state.spec = changed
    with reopened(runner.load(parked.run_id).spec["toolsets"][0]) as again:
        resumed = Runner(Agent(model=runner.agent.model, toolsets=[again]), SQLStore(db))
        with pytest.raises(IncompatibleRun, match=r"tool 'createPet': field 'body.owner' is now required"):
            resumed.drive(parked.run_id)
    assert api.seen == []


# Bad specs -------------------------------------------------------------------------------------
def write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return str(path)


MINIMAL = """\
    openapi: 3.1.0
    info: {title: t, version: "1"}
    servers: [{url: "http://127.0.0.1:9/api"}]
    paths:
      /things:
        get:
          operationId: listThings
          parameters:
            - {name: kind, in: %s, schema: {type: string}}
          responses: {"200": {description: ok}}
"""


def test_an_invalid_spec_is_refused_naming_the_place(tmp_path: Path) -> None:
    spec = write(tmp_path, "api.yaml", MINIMAL % "body")
    with pytest.raises(ToolsetError) as refused:
        OpenAPIToolset(spec).tools()
    assert refused.value.path == "paths./things.get.parameters.0"
    assert str(refused.value) == (
        f"OpenAPI spec {spec} at paths./things.get.parameters.0: "
        "'in' must be one of path, query, header, cookie, not 'body'"
    )


def test_a_ref_that_points_at_nothing_is_refused_naming_where_it_is(tmp_path: Path) -> None:
    spec = write(tmp_path, "api.yaml", (MINIMAL % "query").replace("{type: string}", "{$ref: '#/components/x/Nope'}"))
    with pytest.raises(ToolsetError, match=r"paths\./things\.get\.parameters\(query kind\)\.schema: \$ref "):
        OpenAPIToolset(spec).tools()


def test_refs_into_another_file_are_followed(tmp_path: Path) -> None:
    write(tmp_path, "kinds.yaml", "Kind: {type: string, enum: [a, b]}\n")
    spec = write(tmp_path, "api.yaml", (MINIMAL % "query").replace("{type: string}", "{$ref: 'kinds.yaml#/Kind'}"))
    (tool,) = OpenAPIToolset(spec).tools()
    assert tool.input_schema()["properties"]["kind"] == {"$ref": "#/$defs/Kind"}
    assert tool.input_schema()["$defs"] == {"Kind": {"type": "string", "enum": ["a", "b"]}}
    write(tmp_path, "colour.json", '{"type": "string", "enum": ["red"]}')  # a whole file is the schema
    spec = write(tmp_path, "api.yaml", (MINIMAL % "query").replace("{type: string}", "{$ref: colour.json}"))
    (tool,) = OpenAPIToolset(spec).tools()
    assert tool.input_schema()["$defs"] == {"colour": {"type": "string", "enum": ["red"]}}


def test_a_spec_that_is_not_openapi_3_is_refused(tmp_path: Path) -> None:
    swagger = write(tmp_path, "old.json", '{"swagger": "2.0", "paths": {}}')
    with pytest.raises(ToolsetError, match=r"Swagger 2\.0 is not read: convert the spec to OpenAPI 3 first"):
        OpenAPIToolset(swagger).tools()
    garbage = write(tmp_path, "bad.yaml", "openapi: [unclosed\n")
    with pytest.raises(ToolsetError, match="is neither JSON nor YAML"):
        OpenAPIToolset(garbage).tools()


def test_a_spec_that_cannot_be_had_is_an_error_naming_it(tmp_path: Path) -> None:
    missing = str(tmp_path / "missing.yaml")
    with pytest.raises(ToolsetError, match=r"cannot read file://.*missing\.yaml: \[Errno 2\]"):
        OpenAPIToolset(missing).tools()
    url = f"http://127.0.0.1:{closed_port()}/openapi.json"
    with pytest.raises(ToolsetError, match=f"cannot fetch {url}: ConnectError"):
        OpenAPIToolset(url).tools()


def test_a_spec_without_a_server_needs_a_base_url(tmp_path: Path) -> None:
    spec = write(
        tmp_path, "api.yaml", (MINIMAL % "query").replace('    servers: [{url: "http://127.0.0.1:9/api"}]\n', "")
    )
    with pytest.raises(ToolsetError, match="no base URL: the spec names no http"):
        OpenAPIToolset(spec).tools()
    (tool,) = OpenAPIToolset(spec, base_url="http://127.0.0.1:9/api").tools()
    assert tool.name == "listThings"


def test_an_operation_whose_name_the_messages_api_refuses_is_named_in_the_error(tmp_path: Path) -> None:
    long = "x" * 70
    spec = write(tmp_path, "api.yaml", (MINIMAL % "query").replace("listThings", long))
    with pytest.raises(ToolsetError, match=f"tool '{long}' cannot be named '{long}': names must match"):
        OpenAPIToolset(spec).tools()
