"""Supervision of a client's background work: nothing it runs in the background dies silently.

A consumer runs loops beside the application's calls (heartbeats, rebalancing, route refresh,
offset persistence, lock renewal, one pull loop per owned queue), and a producer runs its
own heartbeats and route refresh.  Each loop is a *step* the :class:`Supervisor` calls over
and over.  A step survives the failures it expects, those of the network and the brokers
(:class:`~evq.client.errors.ClientError`, :class:`~evq.net.transport.TransportError`): it
logs them and the next step comes as usual.  Anything else is a bug or an input nobody
foresaw (a user's allocation strategy that raises, say), and before supervision it ended the
loop without a word, leaving a consumer that looked alive but no longer heartbeated or pulled.
Now the supervisor logs it with its traceback (``background_step_failed``), waits a bounded
backoff and calls the step again.  A loop whose steps fail ``max_failures`` times in a row is
not going to recover by itself: the supervisor gives up (``background_loop_gave_up``), stops
every loop of its owner, and the owner's waiting calls (``PushConsumer.wait``, a pull
consumer's ``poll``, a producer's ``send``) raise :class:`~evq.client.errors.BackgroundFailed`
with the last error as its cause, so the application learns its client is dead instead of
waiting on it forever.

One-shot tasks (a listener call, an orderly queue's run of messages, an answer to a
transaction check) are not restarted, since running them again would repeat what they did;
an unexpected failure of one is logged with its traceback.

Cancellation is how the owner stops its loops: :class:`asyncio.CancelledError` is never
caught, counted or logged here.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Final

import attrs

from evq import logs
from evq.client.errors import BackgroundFailed, ClientError
from evq.net.transport import TransportError

log = logs.get_logger(__name__)

Step = Callable[[], Awaitable[bool]]
"""One round of a loop; it answers False when the loop is done (its queue was released)."""

MAX_FAILURES: Final = 8
FIRST_BACKOFF_S: Final = 0.1
MAX_BACKOFF_S: Final = 10.0


@attrs.frozen(slots=True, kw_only=True)
class SupervisionPolicy:
    """How long a failing loop is retried: after the n-th failure in a row it waits
    ``first_backoff_s * 2**(n-1)`` (at most ``max_backoff_s``); the ``max_failures``-th fails
    its owner.  The defaults give a loop that fails at once about 13 s before that."""

    max_failures: int = attrs.field(default=MAX_FAILURES, validator=attrs.validators.ge(1))
    first_backoff_s: float = FIRST_BACKOFF_S
    max_backoff_s: float = MAX_BACKOFF_S

    def backoff(self, failures: int) -> float:
        return min(self.first_backoff_s * 2 ** (failures - 1), self.max_backoff_s)


def periodic(seconds: float, work: Callable[[], Awaitable[None]]) -> Step:
    """The step of a periodic chore (heartbeat, persist, ...): wait ``seconds``, then do
    ``work``; a network or broker failure is logged and the next round comes as usual."""

    async def step() -> bool:
        await asyncio.sleep(seconds)
        try:
            await work()
        except (ClientError, TransportError) as exc:
            log.warning("periodic work failed", work=getattr(work, "__name__", "?"),
                        error=str(exc))
        return True

    return step


@attrs.frozen(slots=True)
class _Failure:
    loop: str
    failures: int
    cause: Exception


class Supervisor:
    """The background tasks of one client (``owner`` names it in logs and errors)."""

    def __init__(self, owner: str, policy: SupervisionPolicy | None = None) -> None:
        self.owner = owner
        self.policy = policy or SupervisionPolicy()
        self._loops: set[asyncio.Task[None]] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._ended = asyncio.Event()
        self._failure: _Failure | None = None
        self.failed = False
        """Whether a loop has failed for good (:meth:`check` raises then): a plain attribute,
        since a producer reads it before every send."""

    def loop(self, name: str, step: Step) -> asyncio.Task[None]:
        """Call ``step`` until it answers False or the task is cancelled."""
        return self._start(self._loops, name, self._run(name, step))

    def task(self, name: str, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """Run ``work`` once; an unexpected failure is logged, not retried."""
        return self._start(self._tasks, name, self._once(name, work))

    def _start(self, tasks: set[asyncio.Task[None]], name: str,
               coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(coro, name=f"{self.owner}: {name}")
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        return task

    async def _run(self, name: str, step: Step) -> None:
        failures = 0
        while True:
            try:
                if not await step():
                    return
                failures = 0
            except Exception as exc:  # CancelledError is not an Exception: it stops the loop
                failures += 1
                log.error("background_step_failed", owner=self.owner, loop=name,
                          failures=failures, exc_info=exc)
                if failures >= self.policy.max_failures:
                    self._give_up(_Failure(name, failures, exc))
                    return
                await asyncio.sleep(self.policy.backoff(failures))

    async def _once(self, name: str, work: Coroutine[Any, Any, None]) -> None:
        try:
            await work
        except Exception as exc:
            log.error("background_task_failed", owner=self.owner, task=name, exc_info=exc)

    def _give_up(self, failure: _Failure) -> None:
        log.error("background_loop_gave_up", owner=self.owner, loop=failure.loop,
                  failures=failure.failures, error=repr(failure.cause))
        self._failure = failure
        self.failed = True
        me = asyncio.current_task()
        for task in self._loops:
            if task is not me:
                task.cancel()
        self._ended.set()

    def check(self) -> None:
        """Raise :class:`BackgroundFailed` if a loop has failed for good."""
        if (f := self._failure) is not None:
            raise BackgroundFailed(
                f"{self.owner}: background loop {f.loop!r} failed {f.failures} times in a row "
                f"and was given up; last error: {f.cause!r}") from f.cause

    async def wait(self) -> None:
        """Until :meth:`close`; raises :class:`BackgroundFailed` once a loop failed for good."""
        await self._ended.wait()
        self.check()

    async def close(self) -> None:
        """Cancel every loop and wait until they have stopped (one-shot tasks are left to
        finish: the owner decides how long to wait for them)."""
        loops = [task for task in self._loops if task is not asyncio.current_task()]
        for task in loops:
            task.cancel()
        if loops:
            await asyncio.wait(loops)
        self._ended.set()
