"""A worker whose job was taken from it meanwhile says so in one line, and nothing else breaks.

A worker whose heartbeat comes late (its loop busy with many runs) is presumed stalled: the
periodic recovery queues its job again, and another worker may drive the run and delete the
job, while the first still drives it under the run's lease. When the first one's drive ends,
procrastinate cannot finish a job that is gone: that was an unretrieved task exception ("Task
exception was never retrieved ... Job was not found or not in 'doing' or 'todo' status").
"""

from __future__ import annotations

import asyncio
import gc
import logging
from typing import Any

import psycopg
import pytest

from support import PgSchema, libpq_dsn, model_reply, tool_use, tool_use_turn
from tether import Agent, AsyncRunner, tool
from tether.drivers import worker as workers
from tether.stores.sql import AsyncSQLStore
from tether.testing import ScriptedModel

pytestmark = pytest.mark.postgres

DONE = model_reply([{"type": "text", "text": "done"}], "end_turn")


def _take_the_job_away(url: str, run_id: str) -> int:
    """What a recovery and another worker leave: the run's drive job is no longer in the table."""
    with psycopg.connect(libpq_dsn(url)) as connection:
        return connection.execute("DELETE FROM procrastinate_jobs WHERE args->>'run_id' = %s", (run_id,)).rowcount


class StopOnWarning(logging.Handler):
    """Stops the worker once it has said that its job is gone (what the test waits for)."""

    def __init__(self, worker: workers.Worker, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(logging.WARNING)
        self.worker, self.loop = worker, loop
        self.said: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.said.append(record.getMessage())
        if "could not be finished here" in record.getMessage():
            self.loop.call_soon_threadsafe(self.worker.stop)


async def test_a_job_gone_when_its_drive_ends_is_one_logged_line(pg_schema: PgSchema) -> None:
    run_id = ""
    taken: list[int] = []

    @tool
    async def work() -> str:
        """Meanwhile, the job is taken from this worker."""
        taken.append(await asyncio.to_thread(_take_the_job_away, pg_schema.url, run_id))
        return "worked"

    the_agent = Agent(model=ScriptedModel([tool_use_turn(tool_use("call_1", "work", {})), DONE]), tools=[work])
    worker = workers.Worker(pg_schema.url, agent=the_agent, stalled_after=3)
    loop = asyncio.get_running_loop()
    unhandled: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _loop, context: unhandled.append(context))
    watch = StopOnWarning(worker, loop)
    logging.getLogger("tether.drivers.queue").addHandler(watch)
    store = AsyncSQLStore(pg_schema.url)
    try:
        run_id = await AsyncRunner(the_agent, store).submit("go")
        await asyncio.wait_for(worker.run(), timeout=60)
        assert (await store.load_run(run_id)).status == "done"
    finally:
        logging.getLogger("tether.drivers.queue").removeHandler(watch)
        await store.close()
    gc.collect()  # an exception no one retrieved is reported when its task is collected
    await asyncio.sleep(0)
    assert taken == [1]
    [said] = [line for line in watch.said if "could not be" in line]
    assert said.startswith("job ")
    assert "could not be finished here: it is no longer this worker's (a recovery queued it again" in said
    assert unhandled == []
