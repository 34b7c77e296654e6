"""OneThread: AsyncSQLStore's SQLite thread runs calls in order and answers each to its own loop."""

from __future__ import annotations

import asyncio
import functools
import threading
import time

import pytest

from tether.stores.one_thread import ANSWERS_AT_ONCE, OneThread


async def test_calls_run_in_order_on_one_thread_and_each_gets_its_own_answer() -> None:
    one = OneThread("test-one")
    ran: list[tuple[int, str]] = []

    def work(i: int) -> int:
        ran.append((i, threading.current_thread().name))
        return i * i

    try:
        answers = await asyncio.gather(*(one.call(functools.partial(work, i)) for i in range(5 * ANSWERS_AT_ONCE)))
    finally:
        one.stop()
    assert answers == [i * i for i in range(5 * ANSWERS_AT_ONCE)]
    assert [i for i, _ in ran] == list(range(5 * ANSWERS_AT_ONCE))
    assert {name for _, name in ran} == {"test-one"}


async def test_an_exception_reaches_its_caller_only_and_the_thread_goes_on() -> None:
    one = OneThread("test-one")

    def fail() -> None:
        raise ValueError("no such row")

    try:
        failing, after = one.call(fail), one.call(lambda: "still here")
        with pytest.raises(ValueError, match="no such row"):
            await failing
        assert await after == "still here"
    finally:
        one.stop()


async def test_stop_lets_the_given_calls_finish_and_a_later_call_starts_a_new_thread() -> None:
    one = OneThread("test-one")

    def slow() -> str:
        time.sleep(0.05)
        return "slow"

    started = one.call(slow)
    one.stop()
    assert await started == "slow"
    again = await one.call(threading.get_ident)
    one.stop()
    assert again != threading.get_ident()


def test_callers_on_two_loops_each_hear_on_their_own() -> None:
    one = OneThread("test-one")
    heard: dict[str, list[str]] = {}

    def caller(name: str) -> None:
        async def ask() -> list[str]:
            return list(
                await asyncio.gather(*(one.call(functools.partial(str.__add__, name, str(i))) for i in range(20)))
            )

        heard[name] = asyncio.run(ask())

    threads = [threading.Thread(target=caller, args=(name,)) for name in ("a", "b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    one.stop()
    assert heard == {name: [f"{name}{i}" for i in range(20)] for name in ("a", "b")}


def test_a_loop_closed_before_its_answer_does_not_end_the_thread() -> None:
    one = OneThread("test-one")
    release = threading.Event()

    async def leave_early() -> None:
        one.call(release.wait)  # answered after this loop has closed

    asyncio.run(leave_early())
    release.set()

    async def ask_again() -> str:
        return await one.call(lambda: "answered")

    assert asyncio.run(ask_again()) == "answered"
    one.stop()
