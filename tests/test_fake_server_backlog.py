"""The shipped fake APIs serve as many fresh clients at once as a service-scale test opens.

With the standard library's listen backlog of 5, 128 clients connecting together saw 39-56
connection errors: the kernel refused what the accept loop had not taken yet. The fakes listen
with room for 1024 waiting connections.
"""

from __future__ import annotations

import json
import threading
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from tether.testing import FakeChatCompletionsAPI, FakeMessagesAPI
from tether.testing.fake_server import FakeServer

CLIENTS = 256


def messages_request(api: FakeServer) -> urllib.request.Request:
    body = {"model": "claude-test", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]}
    headers = {"content-type": "application/json", "x-api-key": "k", "anthropic-version": "2023-06-01"}
    return urllib.request.Request(f"{api.origin}/v1/messages", data=json.dumps(body).encode(), headers=headers)


def chat_request(api: FakeServer) -> urllib.request.Request:
    body = {"model": "gpt-test", "messages": [{"role": "user", "content": "hi"}]}
    headers = {"content-type": "application/json", "authorization": "Bearer k"}
    return urllib.request.Request(f"{api.origin}/v1/chat/completions", data=json.dumps(body).encode(), headers=headers)


@pytest.mark.parametrize(
    ("make", "request_for"),
    [(FakeMessagesAPI, messages_request), (FakeChatCompletionsAPI, chat_request)],
    ids=["messages", "chat-completions"],
)
def test_256_fresh_clients_at_once_are_all_served(
    make: Callable[[], Any], request_for: Callable[[FakeServer], urllib.request.Request]
) -> None:
    start = threading.Barrier(CLIENTS)

    def one_client(api: FakeServer) -> int:
        request = request_for(api)
        start.wait()  # every client connects at the same moment, each on a new connection
        with urllib.request.urlopen(request, timeout=60) as response:
            return int(response.status)

    with make() as api:
        for n in range(CLIENTS):
            api.reply_text(f"answer {n}")
        with ThreadPoolExecutor(CLIENTS) as pool:
            statuses = list(pool.map(lambda _: one_client(api), range(CLIENTS)))
        assert statuses == [200] * CLIENTS
        assert len(api.requests) == CLIENTS
