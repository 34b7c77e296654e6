"""Typed results: ``Agent(output_type=Model)`` makes a run's result a validated ``Model``.

The agent gets one more tool, :data:`OUTPUT_TOOL`, a ``final`` tool whose input is the
model: the model gives its result by calling it, its input is validated like any tool's (a
mistake comes back as an ``is_error`` result the model can fix), and the run ends with the
input as its result. The run stores the result as JSON, as it stores any final tool's input;
the drivers hand it back validated (:func:`typed_result`), after a resume too.

A model that answers in prose where a result is required is asked again (a recorded
``result_demanded`` step, see :func:`demand_prompt`) with the tool forced, at most
:data:`MAX_RESULT_DEMANDS` times; then the run fails saying so. With extended thinking on,
the API forbids forcing a tool: it is asked for without.
"""

from __future__ import annotations

from typing import Any

import pydantic

from tether.errors import IncompatibleRun
from tether.tools import Tool

OUTPUT_TOOL = "final_result"
"""The name of the tool a model gives a typed result with."""
MAX_RESULT_DEMANDS = 2
"""How many times a prose answer is asked again for the result before the run fails."""


def output_tool(output_type: type[pydantic.BaseModel]) -> Tool:
    """The final tool whose validated input is a result of ``output_type``."""
    doc = (output_type.__doc__ or "").strip().splitlines()
    description = f"Give the final result: {doc[0]}" if doc else "Give the final result."
    return Tool(name=OUTPUT_TOOL, description=description, function=_given, input_model=output_type, final=True)


def _given(**data: Any) -> None:
    """Never run: a final tool's input is the result."""


def demand_prompt(output_type: type[pydantic.BaseModel]) -> str:
    """What the model is told when it answered in prose where a result is required."""
    return (
        f"A result of type {output_type.__name__} is required: give it by calling the {OUTPUT_TOOL} tool, not as text."
    )


def prose_failure(output_type: type[pydantic.BaseModel], answers: int) -> str:
    """Why a run whose model kept answering in prose failed."""
    return (
        f"a result of type {output_type.__name__} was required, and the model answered in prose {answers} times "
        f"(asked again {answers - 1} times to call {OUTPUT_TOOL!r})"
    )


def typed_result(output_type: type[pydantic.BaseModel], data: Any, *, run_id: str) -> pydantic.BaseModel:
    """A run's stored result as an ``output_type`` instance.

    Raises:
        IncompatibleRun: the stored result no longer fits ``output_type`` (it changed since the run ended).
    """
    try:
        return output_type.model_validate(data)
    except pydantic.ValidationError as error:
        message = f"the run's result does not fit {output_type.__name__} (changed since?): {error}"
        raise IncompatibleRun(message, run_id=run_id) from error
