"""A local stand-in for an OpenAI-compatible Chat Completions API, for testing agents offline.

Why: the OpenAI adapter must be exercised through the real ``openai`` client (request
building, error mapping, retries, streaming) without network access or cost, and a test
must fail when tether sends a conversation the API would refuse: an assistant message with
``tool_calls`` not answered by one ``tool`` message per call id right after it, a ``tool``
message answering nothing, a role out of place. Servers that speak this API (OpenAI, vLLM,
Ollama, LiteLLM) differ in what they forgive; this fake forgives nothing.

Usage::

    from tether import Agent, Runner
    from tether.models.openai import OpenAIModel
    from tether.testing import FakeChatCompletionsAPI

    with FakeChatCompletionsAPI() as api:
        api.reply_tool_calls(("add", {"a": 2, "b": 3}))
        api.reply_text("5")
        model = OpenAIModel("gpt-test", api_key="k", base_url=api.url, max_retries=0)
        result = Runner(Agent(model=model, tools=[add])).run("2 + 3?")
        assert api.requests[1]["messages"][-1]["role"] == "tool"

Only ``POST /v1/chat/completions`` is served. A request with ``"stream": true`` gets the
same scripted reply as chunks (see :func:`stream_chunks`), ending ``data: [DONE]``, with a
usage chunk when ``stream_options.include_usage`` asks for one; :meth:`reply_chunks`
scripts a stream chunk by chunk (an ``error`` mid-stream, a dropped connection); :meth:`fail`
scripts an HTTP error in the API's ``{"error": {...}}`` shape.
"""

from __future__ import annotations

import copy
import itertools
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any, NoReturn, cast

from tether.testing.fake_server import Answer, Failure, FakeServer, Reply, Stream

__all__ = ["FakeChatCompletionsAPI", "ToolCall", "stream_chunks", "validate_chat_request"]

ToolCall = tuple[str, Mapping[str, Any] | str] | tuple[str, Mapping[str, Any] | str, str]
"""``(name, arguments)`` or ``(name, arguments, id)``: arguments as an object, or as raw JSON text."""

PATH = "/v1/chat/completions"
_DEFAULT_USAGE: Mapping[str, int] = {"prompt_tokens": 10, "completion_tokens": 5}
_TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
_MAX_TOOLS = 128
_MAX_STOP = 4
_ARGUMENT_CHUNK = 12  # characters of a call's arguments per delta: several even for small inputs
_FIELDS = frozenset(
    {
        "audio",
        "frequency_penalty",
        "function_call",
        "functions",
        "logit_bias",
        "logprobs",
        "max_completion_tokens",
        "max_tokens",
        "messages",
        "metadata",
        "modalities",
        "model",
        "moderation",
        "n",
        "parallel_tool_calls",
        "prediction",
        "presence_penalty",
        "prompt_cache_key",
        "prompt_cache_options",
        "prompt_cache_retention",
        "reasoning_effort",
        "response_format",
        "safety_identifier",
        "seed",
        "service_tier",
        "stop",
        "store",
        "stream",
        "stream_options",
        "temperature",
        "tool_choice",
        "tools",
        "top_logprobs",
        "top_p",
        "user",
        "verbosity",
        "web_search_options",
    }
)
"""The request fields of ``chat.completions.create``; anything else is refused, as the API does."""
_MESSAGE_FIELDS: Mapping[str, frozenset[str]] = {
    "system": frozenset({"role", "content", "name"}),
    "developer": frozenset({"role", "content", "name"}),
    "user": frozenset({"role", "content", "name"}),
    "assistant": frozenset({"role", "content", "name", "tool_calls", "refusal", "audio", "function_call"}),
    "tool": frozenset({"role", "content", "tool_call_id"}),
}
_USER_PARTS = frozenset({"text", "image_url", "input_audio", "file"})
_UNANSWERED = (
    "An assistant message with 'tool_calls' must be followed by tool messages responding to each 'tool_call_id'."
)
_UNASKED = "messages with role 'tool' must be a response to a preceding message with 'tool_calls'."


# --------------------------------------------------------------------------- validation


class _Invalid(Exception):
    """Carries the first validation error (and the parameter it concerns) up to the caller."""

    def __init__(self, message: str, param: str | None) -> None:
        super().__init__(message)
        self.param = param


def _reject(message: str, param: str | None = None) -> NoReturn:
    raise _Invalid(message, param)


def _string(value: object, where: str) -> str:
    if not isinstance(value, str):
        _reject(f"Invalid type for '{where}': expected a string, but got {_kind(value)} instead.", where)
    return value


def _kind(value: object) -> str:
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null"}
    if isinstance(value, int | float) and not isinstance(value, bool):
        return "a number"
    return names.get(type(value), type(value).__name__)


def _number(body: Mapping[str, Any], key: str, low: float, high: float) -> None:
    value = body.get(key)
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int | float):
        _reject(f"Invalid type for '{key}': expected a number, but got {_kind(value)} instead.", key)
    if not low <= value <= high:
        _reject(f"Invalid '{key}': number must be between {low:g} and {high:g}, got {value}.", key)


def _text_parts(content: object, where: str, allowed: frozenset[str] = frozenset({"text"})) -> None:
    """``content`` is a string, or a non-empty list of parts of the ``allowed`` types."""
    if isinstance(content, str):
        return
    if not isinstance(content, list):
        _reject(f"Invalid type for '{where}': expected one of a string or array of objects, but got {_kind(content)}.")
    if not content:
        _reject(f"Invalid '{where}': empty array. Expected an array with minimum length 1.", where)
    for index, part in enumerate(content):
        path = f"{where}[{index}]"
        if not isinstance(part, dict) or part.get("type") not in allowed:
            kinds = ", ".join(f"'{kind}'" for kind in sorted(allowed))
            _reject(f"Invalid value: '{path}.type'. Supported values are: {kinds}.", f"{path}.type")
        if part["type"] == "text":
            _string(part.get("text"), f"{path}.text")
        elif part["type"] == "image_url":
            image = part.get("image_url")
            if not isinstance(image, dict):
                _reject(f"Missing required parameter: '{path}.image_url'.", f"{path}.image_url")
            _string(image.get("url"), f"{path}.image_url.url")


def _tools(value: object) -> set[str]:
    if not isinstance(value, list):
        _reject(f"Invalid type for 'tools': expected an array, but got {_kind(value)} instead.", "tools")
    if not value:
        _reject("Invalid 'tools': empty array. Expected an array with minimum length 1.", "tools")
    if len(value) > _MAX_TOOLS:
        _reject(f"Invalid 'tools': array too long. Expected an array with maximum length {_MAX_TOOLS}.", "tools")
    names: set[str] = set()
    for index, tool in enumerate(value):
        where = f"tools[{index}]"
        if not isinstance(tool, dict) or tool.get("type") != "function":
            _reject(f"Invalid value: '{where}.type'. Supported values are: 'function'.", f"{where}.type")
        function = tool.get("function")
        if not isinstance(function, dict):
            _reject(f"Missing required parameter: '{where}.function'.", f"{where}.function")
        if set(function) - {"name", "description", "parameters", "strict"}:
            extra = sorted(set(function) - {"name", "description", "parameters", "strict"})[0]
            _reject(f"Unrecognized request argument supplied: {where}.function.{extra}", f"{where}.function")
        name = _string(function.get("name"), f"{where}.function.name")
        if not _TOOL_NAME.match(name):
            _reject(
                f"Invalid '{where}.function.name': string does not match pattern. "
                "Expected a string that matches the pattern '^[a-zA-Z0-9_-]+$'.",
                f"{where}.function.name",
            )
        if "description" in function:
            _string(function["description"], f"{where}.function.description")
        parameters = function.get("parameters")
        if parameters is not None and (not isinstance(parameters, dict) or parameters.get("type") != "object"):
            _reject(
                f"Invalid schema for function '{name}': schema must be a JSON Schema of 'type: \"object\"'.",
                f"{where}.function.parameters",
            )
        if name in names:
            _reject(f"Invalid 'tools': duplicate function name '{name}'.", "tools")
        names.add(name)
    return names


def _tool_choice(value: object, names: set[str] | None) -> None:
    if names is None:
        _reject(
            "Invalid value for 'tool_choice': 'tool_choice' is only allowed when 'tools' are specified.", "tool_choice"
        )
    if isinstance(value, str):
        if value not in ("none", "auto", "required"):
            _reject(f"Invalid value: '{value}'. Supported values are: 'none', 'auto', and 'required'.", "tool_choice")
        return
    if not isinstance(value, dict) or value.get("type") != "function":
        _reject("Invalid value for 'tool_choice': expected 'none', 'auto', 'required' or a function.", "tool_choice")
    function = value.get("function")
    name = _string(function.get("name") if isinstance(function, dict) else None, "tool_choice.function.name")
    if name not in names:
        _reject(f"Invalid value for 'tool_choice': no function named '{name}' was specified in 'tools'.", "tool_choice")


def _tool_calls(value: object, where: str, seen: set[str]) -> list[str]:
    if not isinstance(value, list) or not value:
        _reject(f"Invalid '{where}': expected a non-empty array of tool calls.", where)
    ids: list[str] = []
    for index, call in enumerate(value):
        path = f"{where}[{index}]"
        if not isinstance(call, dict) or call.get("type") != "function":
            _reject(f"Invalid value: '{path}.type'. Supported values are: 'function'.", f"{path}.type")
        call_id = _string(call.get("id"), f"{path}.id")
        if not call_id:
            _reject(f"Invalid '{path}.id': empty string. Expected a string with minimum length 1.", f"{path}.id")
        if call_id in seen:
            _reject(f"Invalid '{path}.id': duplicate tool call id '{call_id}'.", f"{path}.id")
        seen.add(call_id)
        function = call.get("function")
        if not isinstance(function, dict):
            _reject(f"Missing required parameter: '{path}.function'.", f"{path}.function")
        _string(function.get("name"), f"{path}.function.name")
        arguments = _string(function.get("arguments"), f"{path}.function.arguments")
        try:  # stricter than some servers: what a model sent back must be the JSON object it wrote
            parsed = json.loads(arguments)
        except ValueError:
            parsed = None
        if not isinstance(parsed, dict):
            _reject(f"Invalid '{path}.function.arguments': expected a JSON object.", f"{path}.function.arguments")
        ids.append(call_id)
    return ids


def _messages(value: object) -> None:
    if not isinstance(value, list):
        _reject(f"Invalid type for 'messages': expected an array, but got {_kind(value)} instead.", "messages")
    if not value:
        _reject("Invalid 'messages': empty array. Expected an array with minimum length 1.", "messages")
    pending: list[str] = []  # ids the last assistant turn asked for, not answered yet
    answered: set[str] = set()
    seen: set[str] = set()
    for index, message in enumerate(value):
        where = f"messages[{index}]"
        if not isinstance(message, dict):
            _reject(f"Invalid type for '{where}': expected an object, but got {_kind(message)} instead.", where)
        role = message.get("role")
        if not isinstance(role, str) or role not in _MESSAGE_FIELDS:
            roles = ", ".join(f"'{name}'" for name in _MESSAGE_FIELDS)
            _reject(f"Invalid value: '{role}'. Supported values are: {roles}.", f"{where}.role")
        for key in message:
            if key not in _MESSAGE_FIELDS[role]:
                _reject(f"Unrecognized request argument supplied: {where}.{key}", f"{where}.{key}")
        if role != "tool" and pending:
            _reject(f"{_UNANSWERED} The following tool_call_ids did not have response messages: {', '.join(pending)}")
        if role == "tool":
            call_id = _string(message.get("tool_call_id"), f"{where}.tool_call_id")
            if call_id not in pending:
                again = " (it was answered already)" if call_id in answered else ""
                _reject(f"Invalid parameter: {_UNASKED} Unknown tool_call_id '{call_id}'{again}.", f"{where}.role")
            pending.remove(call_id)
            answered.add(call_id)
            _text_parts(message.get("content"), f"{where}.content")
        elif role == "assistant":
            calls = message.get("tool_calls")
            content = message.get("content")
            if calls is not None:
                pending = _tool_calls(calls, f"{where}.tool_calls", seen)
            if content is None and calls is None:
                _reject(f"Invalid value for '{where}.content': expected a string, got null.", f"{where}.content")
            if content is not None:
                _text_parts(content, f"{where}.content", frozenset({"text", "refusal"}))
        else:
            if "content" not in message:
                _reject(f"Missing required parameter: '{where}.content'.", f"{where}.content")
            parts = _USER_PARTS if role == "user" else frozenset({"text"})
            _text_parts(message["content"], f"{where}.content", parts)
    if pending:
        _reject(f"{_UNANSWERED} The following tool_call_ids did not have response messages: {', '.join(pending)}")


def _validate(value: object) -> None:
    if not isinstance(value, dict):
        _reject("We could not parse the JSON body of your request. Expected a JSON object.")
    body = cast(dict[str, Any], value)
    for key in body:
        if key not in _FIELDS:
            _reject(f"Unrecognized request argument supplied: {key}", key)
    if "model" not in body:
        _reject("you must provide a model parameter", "model")
    if not _string(body["model"], "model"):
        _reject("Invalid 'model': empty string. Expected a string with minimum length 1.", "model")
    if "messages" not in body:
        _reject("Missing required parameter: 'messages'.", "messages")
    if body.get("max_tokens") is not None and body.get("max_completion_tokens") is not None:
        _reject("max_tokens and max_completion_tokens cannot both be set.", "max_tokens")
    for key in ("max_tokens", "max_completion_tokens"):
        limit = body.get(key)
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
            _reject(f"Invalid '{key}': integer below minimum value. Expected a value >= 1, got {limit}.", key)
    _number(body, "temperature", 0, 2)
    _number(body, "top_p", 0, 1)
    stop = body.get("stop")
    if stop is not None and not isinstance(stop, str):
        if not isinstance(stop, list) or not all(isinstance(item, str) for item in stop):
            _reject("Invalid type for 'stop': expected a string or an array of strings.", "stop")
        if len(stop) > _MAX_STOP:
            _reject(f"Invalid 'stop': array too long. Expected an array with maximum length {_MAX_STOP}.", "stop")
    if body.get("stream_options") is not None and body.get("stream") is not True:
        _reject("The 'stream_options' parameter is only allowed when 'stream' is enabled.", "stream_options")
    names = _tools(body["tools"]) if body.get("tools") is not None else None
    if body.get("tool_choice") is not None:
        _tool_choice(body["tool_choice"], names)
    if body.get("parallel_tool_calls") is not None and names is None:
        _reject(
            "Invalid value for 'parallel_tool_calls': only allowed when 'tools' are specified.", "parallel_tool_calls"
        )
    _messages(body["messages"])


def validate_chat_request(body: object) -> str | None:
    """Check a Chat Completions request body the way a strict server does.

    Why: lets tests assert offline that tether builds valid requests; the fake server
    applies the same check before answering.

    Returns:
        The error message the API would answer with (HTTP 400 ``invalid_request_error``),
        or ``None`` if the request is acceptable.
    """
    try:
        _validate(body)
    except _Invalid as error:
        return str(error)
    return None


# --------------------------------------------------------------------------- streaming


def stream_chunks(completion: Mapping[str, Any], *, include_usage: bool = False) -> list[dict[str, Any]]:
    """The chunks the API streams for ``completion``, a whole chat completion object.

    Why: a ``stream: true`` call must rebuild, in the client, exactly what the same reply
    gives unstreamed. The flow is the API's: a first chunk with the role, the content in
    word-sized deltas, each tool call opened with its id and name then its arguments in
    pieces, a last chunk with the finish reason, and (when asked for) a usage chunk with no
    choices. Every chunk but the usage one has ``"usage": null`` when usage is asked for.
    """
    base = {key: completion.get(key) for key in ("id", "created", "model", "system_fingerprint")}
    base["object"] = "chat.completion.chunk"
    choice = (completion.get("choices") or [{}])[0]
    message = choice.get("message") or {}
    deltas: list[dict[str, Any]] = [{"role": "assistant", "content": ""}]
    deltas += [{"content": piece} for piece in re.findall(r"\s*\S+|\s+$", message.get("content") or "")]
    if message.get("refusal"):
        deltas.append({"refusal": message["refusal"]})
    for index, call in enumerate(message.get("tool_calls") or []):
        function = call.get("function") or {}
        opened = {"index": index, "id": call.get("id"), "type": "function"}
        deltas.append({"tool_calls": [{**opened, "function": {"name": function.get("name"), "arguments": ""}}]})
        raw = str(function.get("arguments") or "")
        for start in range(0, len(raw), _ARGUMENT_CHUNK):
            piece = raw[start : start + _ARGUMENT_CHUNK]
            deltas.append({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
    chunks = [{**base, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]} for delta in deltas]
    chunks.append({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": choice.get("finish_reason")}]})
    if include_usage:
        for chunk in chunks:
            chunk["usage"] = None
        chunks.append({**base, "choices": [], "usage": completion.get("usage")})
    return chunks


def _encoded(chunks: Sequence[Mapping[str, Any]], *, done: bool) -> list[bytes]:
    """Each chunk as a ``data:`` line, then ``data: [DONE]`` when the stream ends normally."""
    lines = [f"data: {json.dumps(chunk)}\n\n".encode() for chunk in chunks]
    return [*lines, b"data: [DONE]\n\n"] if done else lines


# --------------------------------------------------------------------------- server


_ERROR_TYPES: Mapping[int, str] = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    403: "permission_error",
    404: "invalid_request_error",
    429: "rate_limit_exceeded",
    500: "server_error",
    503: "server_error",
}


def _error(
    message: str, error_type: str = "invalid_request_error", *, param: str | None = None, code: Any = None
) -> dict[str, Any]:
    return {"error": {"message": message, "type": error_type, "param": param, "code": code}}


class FakeChatCompletionsAPI(FakeServer):
    """A scripted, strict Chat Completions API on ``127.0.0.1`` for the real ``openai`` client.

    Each valid ``POST /v1/chat/completions`` consumes the next scripted item (FIFO). Invalid
    requests get HTTP 400 and consume nothing. With the script used up, a valid request gets
    500 so the test fails loudly. ``url`` ends in ``/v1``, as the client's ``base_url`` does.

    Attributes:
        requests: Parsed JSON bodies received, in order, including rejected ones.
        headers: Request headers (lower-cased names), parallel to ``requests``.
        paths: Request paths, parallel to ``requests``.
    """

    request_id_prefix = "req_fakechat_"

    def __init__(self, *, fast_retries: bool = True) -> None:
        """Start serving on a free port.

        Args:
            fast_retries: Answer retryable errors with ``retry-after-ms: 1`` so the client's
                retry loop does not sleep its default back-off; timing only, never behaviour.
        """
        self._completion_ids = itertools.count(1)
        self._call_ids = itertools.count(1)
        super().__init__(name="FakeChatCompletionsAPI", fast_retries=fast_retries)

    @property
    def url(self) -> str:
        """Base URL to pass as ``base_url`` to ``openai.OpenAI`` (or :class:`~tether.models.openai.OpenAIModel`)."""
        return f"{self.origin}/v1"

    # -- scripting

    def reply(self, response: Mapping[str, Any]) -> None:
        """Queue a chat completion; missing fields get defaults.

        Defaults: ``id`` ``chatcmpl-fake-N``, ``object``, ``created``, ``model`` from the request,
        a usage of 10 prompt / 5 completion tokens (``total_tokens`` their sum). Choices are
        served as given: build them with :meth:`reply_message`, :meth:`reply_text` or
        :meth:`reply_tool_calls`, or give malformed ones on purpose.
        """
        self.enqueue(Reply(copy.deepcopy(dict(response))))

    def reply_message(self, message: Mapping[str, Any], *, finish_reason: str | None = "stop", **fields: Any) -> None:
        """Queue a completion whose one choice is ``message`` (``role`` defaults to assistant)."""
        choice = {
            "index": 0,
            "message": {"role": "assistant", **message},
            "finish_reason": finish_reason,
            "logprobs": None,
        }
        self.reply({"choices": [choice], **fields})

    def reply_text(self, text: str | None, *, finish_reason: str = "stop", **fields: Any) -> None:
        """Queue an answer in prose (``finish_reason`` ``stop`` unless given)."""
        self.reply_message({"content": text}, finish_reason=finish_reason, **fields)

    def reply_tool_calls(
        self, *calls: ToolCall, text: str | None = None, finish_reason: str = "tool_calls", **fields: Any
    ) -> list[str]:
        """Queue a turn calling tools (arguments as objects, or raw text); returns the call ids in order."""
        ids: list[str] = []
        tool_calls = []
        for call in calls:
            name, arguments = call[0], call[1]
            call_id = str(call[2]) if len(call) > 2 else f"call_fake_{next(self._call_ids)}"
            raw = arguments if isinstance(arguments, str) else json.dumps(dict(arguments))
            tool_calls.append({"id": call_id, "type": "function", "function": {"name": name, "arguments": raw}})
            ids.append(call_id)
        self.reply_message({"content": text, "tool_calls": tool_calls}, finish_reason=finish_reason, **fields)
        return ids

    def fail(
        self,
        status: int,
        message: str,
        *,
        error_type: str | None = None,
        code: str | None = None,
        param: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        """Queue an HTTP error in the API's ``{"error": {"message", "type", "param", "code"}}`` shape.

        A 429 carries ``retry-after: 0`` unless ``headers`` say otherwise.
        """
        kind = error_type or _ERROR_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
        self.enqueue(Failure(status, _error(message, kind, param=param, code=code), headers or {}))

    def reply_chunks(self, chunks: list[dict[str, Any]], *, drop_connection: bool = False) -> None:
        """Queue a stream served exactly as given (build it with :func:`stream_chunks`).

        A chunk ``{"error": {...}}`` is how the API reports an error mid-stream.
        ``drop_connection`` closes the connection after the chunks without ``[DONE]`` or the
        end of the HTTP body. A non-streaming request meeting this item gets a 500.
        """
        self.enqueue(Stream(_encoded(copy.deepcopy(chunks), done=not drop_connection), drop_connection))

    def reset_counters(self) -> None:
        """Restart the completion and call ids (see :meth:`FakeServer.reset`)."""
        self._completion_ids = itertools.count(1)
        self._call_ids = itertools.count(1)

    # -- serving

    def not_found(self, path: str) -> Answer:
        """Answer like the API does for unknown routes."""
        return Answer(404, _error(f"Invalid URL (POST {path})"))

    def check_request(self, path: str, headers: dict[str, str], parsed: object) -> Answer | None:
        """Route, key and the body as :func:`validate_chat_request` judges it."""
        if path.rstrip("/") != PATH:
            return self.not_found(path)
        if not headers.get("authorization", "").lower().startswith("bearer "):
            message = "You didn't provide an API key. You need to provide your API key in an Authorization header."
            return Answer(401, _error(message, code="invalid_api_key"))
        if parsed is None:
            return Answer(400, _error("We could not parse the JSON body of your request."))
        try:
            _validate(parsed)
        except _Invalid as error:
            return Answer(400, _error(str(error), param=error.param))
        return None

    def error_body(self, message: str) -> dict[str, Any]:
        """A ``server_error`` body."""
        return _error(message, "server_error")

    def stream_of(self, body: dict[str, Any], request: Mapping[str, Any]) -> list[bytes]:
        """The completion as chunks (see :func:`stream_chunks`), with usage when the request asked for it."""
        include_usage = bool((request.get("stream_options") or {}).get("include_usage"))
        return _encoded(stream_chunks(body, include_usage=include_usage), done=True)

    def complete(self, response: dict[str, Any], request: Mapping[str, Any]) -> dict[str, Any]:
        """Fill a completion's missing fields (see :meth:`reply`)."""
        with self._lock:
            n = next(self._completion_ids)
        response.setdefault("id", f"chatcmpl-fake-{n}")
        response.setdefault("object", "chat.completion")
        response.setdefault("created", 1_700_000_000 + n)
        response.setdefault("model", request.get("model", "fake-model"))
        response.setdefault("choices", [])
        usage = response.get("usage") or {}
        if isinstance(usage, Mapping):  # anything else is a malformed usage scripted on purpose
            usage = {**_DEFAULT_USAGE, **usage}
            usage.setdefault("total_tokens", int(usage["prompt_tokens"]) + int(usage["completion_tokens"]))
            response["usage"] = usage
        return response
