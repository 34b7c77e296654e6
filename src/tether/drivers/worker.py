"""``tether worker``: drives the runs procrastinate dispatches, one job a run, until each parks or ends.

How runs are queued (in the same transactions as their writes) is :mod:`tether.drivers.queue`'s;
this is the other end: a worker takes a job, holds the run's lease, drives it with an
:class:`~tether.AsyncRunner` and says how it went (a :class:`WorkerNote`).
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tether.agent import Agent
from tether.core.approvals import DecideLater
from tether.drivers.loader import AgentFor, agent_from_spec
from tether.drivers.queue import (
    DEFAULT_QUEUE,
    DEFAULT_STALLED_AFTER,
    DISPATCH_KEY,
    DRIVE_TASK,
    RECOVER_TASK,
    drive_job,
    ensure_schema,
    is_postgres,
    libpq_url,
    log,
    procrastinate_module,
    queue_of,
)
from tether.drivers.runner import AsyncRunner
from tether.drivers.telemetry import Telemetry
from tether.errors import ConfigError, RunBusy, RunNotFound, StaleRun, StoreError
from tether.extras import require
from tether.facts.status import RunStatus
from tether.redact import scrub
from tether.stores import shown_url

if TYPE_CHECKING:
    from procrastinate import App


@dataclass(frozen=True)
class WorkerNote:
    """One thing a worker did with a run, for whoever watches it (``tether worker`` prints each)."""

    run_id: str
    what: str
    """``picked_up``; where the drive left the run (its shown status: ``done``, ``failed``,
    ``cancelled``, ``awaiting_approval``, ``waiting_retry``); ``requeued`` (the worker stopping),
    ``busy`` (another driver holds it: queued again for when its lease ends), ``changed`` (another
    process changed it meanwhile), ``deleted``, or ``error`` (the job failed; procrastinate retries it)."""
    detail: str = ""
    """The reason of a failure or an error; the calls a parked run waits on."""
    at: float | None = None
    """When a waiting run is due again (a retry, a busy run's lease end)."""


class Worker:
    """Drives submitted runs as procrastinate jobs: ``tether worker``, or in your own program.

    Args:
        url: the store's PostgreSQL URL (the queue lives in the same database and schema).
        queue: the queue to take jobs from.
        concurrency: runs driven at once by this process (one event loop).
        stalled_after: seconds without a heartbeat after which a worker is presumed dead: its
            jobs go back to the queue, and its runs' leases expire (they last this long).
        agent: the agent to drive every run with; by default each run's agent is rebuilt from
            its spec (the tools module and model it was started with), as ``tether resume`` does.
        telemetry: traces each drive (see :mod:`tether.drivers.otel`); None: nothing is traced.
        on_note: told each :class:`WorkerNote` (a run picked up, where its drive left it), on
            the worker's loop: keep it quick.
    """

    def __init__(
        self,
        url: str,
        *,
        queue: str = DEFAULT_QUEUE,
        concurrency: int = 4,
        stalled_after: float = DEFAULT_STALLED_AFTER,
        agent: Agent | AgentFor | None = None,
        telemetry: Telemetry | None = None,
        on_note: Callable[[WorkerNote], None] | None = None,
    ) -> None:
        if not is_postgres(url):
            raise ConfigError(f"tether worker needs PostgreSQL (the queue lives beside the runs), not {shown_url(url)}")
        if concurrency < 1 or stalled_after < 3:
            raise ConfigError("a worker needs concurrency >= 1 and stalled_after >= 3 seconds")
        require("worker", "a tether worker (tether.drivers.worker.Worker)")  # now, not when it starts taking jobs
        self.url = url
        self.queue = queue
        self.concurrency = concurrency
        self.stalled_after = stalled_after
        self._agent = agent
        self.on_note = on_note
        self.telemetry = telemetry
        """Traces each drive (``tether worker --otel``): a run's drives continue the trace it was submitted in."""
        self._agents: dict[str, Agent] = {}
        self.stopping = asyncio.Event()
        """Set by :meth:`stop`: each job finishes its current step, queues its run again, and ends."""
        self._task: asyncio.Task[None] | None = None

    def stop(self) -> None:
        """Stop taking jobs; running ones end after their current step (call from the worker's loop)."""
        self.stopping.set()
        if self._task is not None:
            self._task.cancel()  # procrastinate's graceful stop: running jobs are awaited, not cancelled

    async def run(self) -> None:
        """Take jobs until :meth:`stop` (creating the queue's tables on first use).

        A lost database connection (PostgreSQL restarting, a network cut) stops procrastinate's
        worker; it is started again after a pause (1 s, doubling up to 30 s) until :meth:`stop`.
        """
        procrastinate = procrastinate_module()
        from tether.stores.sql import AsyncSQLStore

        self._task = asyncio.current_task()
        await asyncio.to_thread(ensure_schema, self.url)
        self.store = AsyncSQLStore(self.url, pool_size=self.concurrency + 2)  # + the leases' heartbeats
        self.app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=libpq_url(self.url)))
        self.app.job_manager = _job_manager(procrastinate, self.app.connector)
        self._register(self.app, procrastinate)
        pause = 1.0
        try:
            while not self.stopping.is_set():
                try:
                    async with self.app.open_async():
                        await self.app.run_worker_async(**self._options())
                except asyncio.CancelledError:
                    if not self.stopping.is_set():
                        raise
                except Exception as error:  # noqa: BLE001 - whatever the connection's loss raised: start again
                    if self.stopping.is_set():
                        break
                    log.warning("tether worker: lost the database (%s); starting again in %g s", error, pause)
                    with suppress(asyncio.CancelledError):
                        await asyncio.sleep(pause)
                    pause = min(pause * 2, 30.0)
        finally:
            for agent in self._agents.values():  # the ones it made (one given to it stays its owner's)
                await agent.aclose()
            await self.store.close()

    def _options(self) -> dict[str, Any]:
        every = max(1, min(59, round(self.stalled_after / 3)))
        return {
            "queues": [self.queue],
            "concurrency": self.concurrency,
            "install_signal_handlers": False,
            "update_heartbeat_interval": self.stalled_after / 3,
            "stalled_worker_timeout": self.stalled_after,
            "fetch_job_polling_interval": min(1.0, every),  # finds scheduled retries within a second
            "delete_jobs": "successful",
            "name": f"tether-{socket.gethostname()}-{os.getpid()}",
        }

    def _register(self, app: App, procrastinate: Any) -> None:
        every = max(1, min(59, round(self.stalled_after / 3)))
        retry = procrastinate.RetryStrategy(max_attempts=30, wait=2, retry_exceptions={StoreError})  # a restart

        @app.task(name=DRIVE_TASK, retry=retry)
        async def drive(run_id: str) -> str:
            return await self.drive(run_id)

        @app.periodic(cron=f"* * * * * */{every}")
        @app.task(name=RECOVER_TASK, queue=self.queue, queueing_lock=RECOVER_TASK)
        async def recover(timestamp: int) -> int:
            return await self.recover_stalled()

    async def drive(self, run_id: str) -> str:
        """Drive one run until it parks or ends (a job's work); a word on how it went, for the job's log."""
        try:
            note = await self._drive(run_id)
        except Exception as error:
            from tether.stores.sql import url_secrets

            self._note(WorkerNote(run_id, "error", scrub(f"{type(error).__name__}: {error}", url_secrets(self.url))))
            raise
        self._note(note)
        return note.what if note.at is None else f"{note.what} until {note.at:.0f}"

    async def _drive(self, run_id: str) -> WorkerNote:
        try:
            record = await self.store.load_run(run_id)
            self._note(WorkerNote(run_id, "picked_up"))
            agent = self._agent_for(record.spec)
            runner = AsyncRunner(
                agent, self.store, approver=DecideLater(), lease_ttl=self.stalled_after, telemetry=self.telemetry
            )
            result = await runner.drive(run_id, max_wait=0, until=self.stopping.is_set)
        except RunNotFound:
            return WorkerNote(run_id, "deleted")
        except RunBusy as busy:  # another driver (or a dead one's lease): try when its lease ends
            at = busy.expires_at if busy.expires_at is not None else time.time() + self.stalled_after
            await self._requeue(run_id, record.spec, at)
            return WorkerNote(run_id, "busy", at=at)
        except StaleRun:  # changed by another process meanwhile: its write queued it if it must go on
            return WorkerNote(run_id, "changed")
        if self.stopping.is_set() and result.status in {RunStatus.thinking.shown, RunStatus.executing_tool.shown}:
            await self._requeue(run_id, record.spec, None)  # SIGTERM: left queued for another worker
            return WorkerNote(run_id, "requeued")
        waiting = ", ".join(f"{call.get('tool')} {call.get('call_id')}" for call in result.pending_approvals)
        return WorkerNote(run_id, result.status, result.error or waiting, result.next_due_at)

    def _note(self, note: WorkerNote) -> None:
        if self.on_note is not None:
            self.on_note(note)

    async def _requeue(self, run_id: str, spec: Mapping[str, Any], at: float | None) -> None:
        procrastinate = procrastinate_module()
        with suppress(procrastinate.exceptions.AlreadyEnqueued):
            await drive_job(self.app, run_id, queue_of(spec) or self.queue, at).defer_async(run_id=run_id)

    async def recover_stalled(self) -> int:
        """Send the jobs of workers whose heartbeat stopped back to the queue; how many."""
        procrastinate = procrastinate_module()
        manager = self.app.job_manager
        stalled = await manager.get_stalled_jobs(seconds_since_heartbeat=self.stalled_after)
        for job in stalled:
            try:
                await manager.retry_job(job)
            except procrastinate.exceptions.ConnectorException:
                # A job of that run already waits (its lock), or the job ended meanwhile: either will do.
                with suppress(procrastinate.exceptions.ConnectorException):
                    await manager.finish_job(job, status=procrastinate.jobs.Status.FAILED, delete_job=True)
                log.warning("job %s (%s) of a stalled worker: already queued or gone", job.id, job.task_kwargs)
                continue
            log.warning("job %s (%s) of a stalled worker was queued again", job.id, job.task_kwargs)
        return len(stalled)

    def _agent_for(self, spec: dict[str, Any]) -> Agent:
        if isinstance(self._agent, Agent):
            return self._agent
        if self._agent is not None:
            return self._agent(spec)
        key = json.dumps({k: v for k, v in spec.items() if k not in _PER_RUN}, sort_keys=True, default=str)
        agent = self._agents.get(key)
        if agent is None:
            agent = self._agents[key] = agent_from_spec(spec)
        return agent


_GONE = "Job was not found or not in"
"""How procrastinate's database functions refuse to finish or retry a job no longer this worker's."""


def _job_manager(procrastinate: Any, connector: Any) -> Any:
    """The job manager of procrastinate, except that a job gone meanwhile is one logged line.

    A worker whose heartbeat came late (a busy loop) is presumed stalled: the periodic recovery
    sends its job back to the queue (``retry_job``), and another worker may drive the run and
    delete the job, while this one still drives it under the run's lease (so nothing runs twice).
    When this one's drive ends, procrastinate finishes (or retries) a job that is no longer in
    ``doing``: the database refuses, and the exception ended the job's task unretrieved ("Task
    exception was never retrieved"). The run's outcome is in the store either way.
    """

    class JobManager(procrastinate.manager.JobManager):  # type: ignore[misc]  # procrastinate is loaded at run time
        async def finish_job(self, job: Any, status: Any, delete_job: bool) -> None:
            with _gone_meanwhile(procrastinate, job, "finished"):
                await super().finish_job(job, status, delete_job)

        async def retry_job(self, job: Any, *args: Any, **kwargs: Any) -> None:
            with _gone_meanwhile(procrastinate, job, "retried"):
                await super().retry_job(job, *args, **kwargs)

    return JobManager(connector)


@contextmanager
def _gone_meanwhile(procrastinate: Any, job: Any, what: str) -> Iterator[None]:
    try:
        yield
    except procrastinate.exceptions.ConnectorException as error:
        if _GONE not in str(error.__cause__ or error):
            raise
        log.warning(
            "job %s (%s) could not be %s here: it is no longer this worker's (a recovery queued it again "
            "meanwhile, this worker's heartbeat having come late, or it ended elsewhere); the run's outcome "
            "is in the store",
            job.id,
            job.task_kwargs,
            what,
        )


_PER_RUN = frozenset({"continued_from", "conversation", "parent", DISPATCH_KEY})
"""Spec keys that differ between runs of one agent (the agent is rebuilt once per the rest)."""
