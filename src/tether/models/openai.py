"""The OpenAI-compatible adapter on the official ``openai`` SDK (Chat Completions), imported by its first call.

It serves OpenAI and the servers that speak its Chat Completions API (vLLM, Ollama,
LiteLLM...): point ``base_url`` (or ``OPENAI_BASE_URL``) at them. The engine speaks Messages
API blocks; :mod:`tether.models.chat_format` converts at this edge, both ways, so no
``openai`` type ever reaches tether. As with Claude, the SDK does the HTTP retries (429/5xx,
honouring Retry-After, each wait capped here); what remains becomes a
:class:`~tether.errors.ModelError`, translated once, in :mod:`tether.models.openai_client` (the
only module importing ``openai``).

Install with ``pip install 'tether[openai]'``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Iterator
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Literal

from tether.errors import ConfigError, ModelError
from tether.extras import require
from tether.models import ModelRequest, ModelResponse, ModelSettings, TextListener
from tether.models.chat_format import (
    SOURCE,
    ChunkFolder,
    chat_messages,
    chat_response,
    chat_tool_choice,
    chat_tools,
)
from tether.models.sdk import (
    DEFAULT_MAX_RETRIES,
    DEFAULT_MAX_RETRY_WAIT,
    DEFAULT_TIMEOUT,
    RetryWaitListener,
    SdkAdapter,
)

if TYPE_CHECKING:
    from tether.models.openai_client import AsyncClient, Client

MAX_STOP_SEQUENCES = 4
MaxTokensField = Literal["max_completion_tokens", "max_tokens"]


class OpenAIModel(SdkAdapter["Client", "AsyncClient"]):
    """One Chat Completions call per :meth:`complete`.

    Credentials and endpoint come from ``OPENAI_API_KEY`` / ``OPENAI_BASE_URL`` unless given
    (a local server that checks no key still needs one set: any value). ``max_tokens_field``
    names the request field for the answer's length: OpenAI's ``max_completion_tokens``, or
    ``max_tokens`` for servers that know only the older name.
    """

    def __init__(
        self,
        model: str,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        max_retries: int = DEFAULT_MAX_RETRIES,
        timeout: float = DEFAULT_TIMEOUT,
        max_retry_wait: float = DEFAULT_MAX_RETRY_WAIT,
        on_retry_wait: RetryWaitListener | None = None,
        stream_fallback: bool = True,
        max_tokens_field: MaxTokensField = "max_completion_tokens",
    ) -> None:
        require("openai", "the OpenAI adapter (tether.models.openai)")  # now, not at its first call
        super().__init__(
            api_key=api_key,
            base_url=base_url,
            max_retries=max_retries,
            timeout=timeout,
            max_retry_wait=max_retry_wait,
            on_retry_wait=on_retry_wait,
            stream_fallback=stream_fallback,
        )
        self.name = model
        self.max_tokens_field = max_tokens_field

    def new_client(self, options: dict[str, Any]) -> Client:
        """The sync ``openai`` client."""
        from tether.models.openai_client import Client

        return Client(**options)

    def new_async_client(self, options: dict[str, Any]) -> AsyncClient:
        """The async ``openai`` client."""
        from tether.models.openai_client import AsyncClient

        return AsyncClient(**options)

    def _params(self, request: ModelRequest) -> dict[str, Any]:
        params: dict[str, Any] = {
            "model": self.name,
            "messages": chat_messages(request.system, request.messages),
            self.max_tokens_field: request.max_tokens,
        }
        if request.tools:
            params["tools"] = chat_tools(request.tools)
            params.update(chat_tool_choice(request.tool_choice))
        settings = request.settings
        self.check_settings(settings)  # an agent checked them; a hand-made request may not have been
        if settings.temperature is not None:
            params["temperature"] = settings.temperature
        if settings.top_p is not None:
            params["top_p"] = settings.top_p
        if settings.stop_sequences:
            params["stop"] = list(settings.stop_sequences)
        return params

    def check_settings(self, settings: ModelSettings) -> None:
        """Refuse settings this API has no place for (an :class:`~tether.agent.Agent` calls this when made).

        Raises:
            ConfigError: ``thinking_budget`` (Claude's extended thinking), or more than 4 stop sequences.
        """
        if settings.thinking_budget is not None:
            raise ConfigError(
                f"thinking_budget is Claude's extended thinking; {self.name!r} on a Chat Completions API has "
                "no thinking budget (leave it unset)"
            )
        if len(settings.stop_sequences) > MAX_STOP_SEQUENCES:
            raise ConfigError(f"a Chat Completions API takes at most {MAX_STOP_SEQUENCES} stop sequences")

    def complete(self, request: ModelRequest) -> ModelResponse:
        """Make the call with the sync client."""
        params = self._params(request)
        with _translated_errors() as waits:
            completion = self._sync_client().chat.completions.create(**params)
        return _response(completion.model_dump(mode="json", warnings=False), waits)

    async def acomplete(self, request: ModelRequest) -> ModelResponse:
        """Make the call with the async client (one per event loop: connections belong to a loop)."""
        params = self._params(request)
        with _translated_errors() as waits:
            completion = await self._loop_client().chat.completions.create(**params)
        return _response(completion.model_dump(mode="json", warnings=False), waits)

    def stream(self, request: ModelRequest, on_text: TextListener) -> ModelResponse:
        """Make the same call streamed, telling ``on_text`` each piece of text; returns what :meth:`complete` would.

        The SDK retries a stream only until it starts; one that breaks after that on a
        transient error is made again once unstreamed (unless ``stream_fallback=False``).
        """
        folder, params = ChunkFolder(), self._streamed(request)
        try:
            with _translated_errors() as waits:
                chunks = self._sync_client().chat.completions.create(**params)
                for chunk in _dumped(chunks):
                    _tell(on_text, folder.fold(chunk))
                completion = _whole(folder)
        except ModelError as error:
            if not self._falls_back(folder.started, error):
                raise
            return self.complete(request)
        return _response(completion, waits)

    async def astream(self, request: ModelRequest, on_text: TextListener) -> ModelResponse:
        """Async twin of :meth:`stream`."""
        folder, params = ChunkFolder(), self._streamed(request)
        try:
            with _translated_errors() as waits:
                chunks = await self._loop_client().chat.completions.create(**params)
                async for chunk in _adumped(chunks):
                    _tell(on_text, folder.fold(chunk))
                completion = _whole(folder)
        except ModelError as error:
            if not self._falls_back(folder.started, error):
                raise
            return await self.acomplete(request)
        return _response(completion, waits)

    def _streamed(self, request: ModelRequest) -> dict[str, Any]:
        return {**self._params(request), "stream": True, "stream_options": {"include_usage": True}}


def _tell(on_text: TextListener, text: str) -> None:
    if text:
        on_text(text)


def _dumped(chunks: Any) -> Iterator[dict[str, Any]]:
    for chunk in chunks:
        yield chunk.model_dump(mode="json", warnings=False)


async def _adumped(chunks: Any) -> AsyncIterator[dict[str, Any]]:
    async for chunk in chunks:
        yield chunk.model_dump(mode="json", warnings=False)


def _whole(folder: ChunkFolder) -> dict[str, Any]:
    """The folded completion; never half of one taken for the whole."""
    if not folder.finished:
        raise ModelError("the response stream ended before the answer was complete", retryable=True)
    return folder.result()


def _response(completion: dict[str, Any], waits: list[float]) -> ModelResponse:
    """The completion as tether's response, checked (the SDK builds it from the JSON unvalidated)."""
    try:
        response = chat_response(completion, source=SOURCE)
    except ModelError as error:  # malformed: the waits before it were still spent on this call
        error.retry_waits = tuple(waits)
        raise
    return dataclasses.replace(response, retry_waits=tuple(waits))


def _translated_errors() -> AbstractContextManager[list[float]]:
    """Collect one call's SDK retry waits; turn what the SDK raises into :class:`ModelError` (imports the SDK)."""
    from tether.models.openai_client import translated_errors

    return translated_errors()
