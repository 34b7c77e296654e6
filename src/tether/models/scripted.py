"""A model that replays Messages API responses offline, for demos and tests.

It speaks the same types as the real adapter and records every request it got, so a test
can assert on exactly what would have been sent to the API. Streamed, it tells the text of
its reply word by word, so a live view shows offline what it shows with Claude.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tether.errors import ConfigError, ModelError
from tether.models import ModelRequest, ModelResponse, TextListener

Reply = dict[str, Any] | ModelResponse | BaseException
Script = Sequence[Reply] | Callable[[ModelRequest], Reply]


class ScriptedModel:
    """Answers from a list (indexed by the run's invocation count) or a function.

    A list is indexed by :attr:`ModelRequest.invocation`, not by how often this object was
    called, so a run resumed in another process continues the same script. An exception
    in the script is raised instead of answering (to simulate API errors).
    """

    def __init__(self, script: Script, *, name: str = "scripted") -> None:
        self.script = script
        self.name = name
        self.requests: list[ModelRequest] = []
        """Every request received, in order."""

    @classmethod
    def from_file(cls, path: str | Path) -> ScriptedModel:
        """Load a JSON list of Messages API response objects."""
        file = Path(path)
        try:
            data = json.loads(file.read_text(encoding="utf-8"))
        except (OSError, ValueError, RecursionError) as error:  # RecursionError: JSON nested thousands deep
            raise ConfigError(f"cannot read scripted model file {file}: {error}") from error
        if not isinstance(data, list) or not all(isinstance(item, dict) for item in data):
            raise ConfigError(f"{file}: expected a JSON list of Messages API response objects")
        return cls(data, name=f"scripted:{file}")

    def complete(self, request: ModelRequest) -> ModelResponse:
        """Answer with the next scripted reply."""
        self.requests.append(request)
        if callable(self.script):
            reply = self.script(request)
        else:
            if request.invocation >= len(self.script):
                raise ModelError(
                    f"scripted model has no reply #{request.invocation + 1} (the script holds {len(self.script)})"
                )
            reply = self.script[request.invocation]
        if isinstance(reply, BaseException):
            raise reply
        if isinstance(reply, ModelResponse):
            return reply
        return ModelResponse.from_dict(reply, source=f"scripted reply #{request.invocation + 1}")

    async def acomplete(self, request: ModelRequest) -> ModelResponse:
        """Same as :meth:`complete`; nothing to wait for."""
        return self.complete(request)

    def stream(self, request: ModelRequest, on_text: TextListener) -> ModelResponse:
        """Answer as :meth:`complete` does, telling ``on_text`` the reply's text a word at a time first."""
        response = self.complete(request)
        for block in response.content:
            if block.get("type") == "text":
                for piece in re.findall(r"\s*\S+|\s+$", str(block.get("text", ""))):
                    on_text(piece)
        return response

    async def astream(self, request: ModelRequest, on_text: TextListener) -> ModelResponse:
        """Same as :meth:`stream`; nothing to wait for."""
        return self.stream(request, on_text)
