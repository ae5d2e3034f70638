"""One object per running event loop, made on first use and closed when that loop shuts down.

Async clients (redis.asyncio, the rate limiter's storage) hold connections that belong to the
loop that made them; a process has one loop under Daphne, but Celery tasks, tests and management
commands run a fresh loop per call (``asyncio.run``, asgiref's ``async_to_sync``, which runs
``asyncio.run`` in a thread). Every such loop that used a client used to leave its connections open
for the life of the process (issue 29: about one idle Redis connection per Celery task that called
a tier): the objects were kept in a ``WeakKeyDictionary`` keyed by the loop, but an object holding
connections holds its loop too (transport -> loop), so the weak key never died, and nothing ever
closed the client.

The fix is at the root, in :class:`PerLoop`, so that every user gets it:

- **Closed with the loop.** The first ``get()`` on a loop starts a tiny async generator on it that
  waits at its ``yield``. Python's own end-of-loop hook (PEP 525, ``loop.shutdown_asyncgens()``,
  which ``asyncio.run`` and so ``async_to_sync`` call before ``loop.close()``) closes every open
  async generator of the loop *while the loop still runs*; the generator's ``finally`` then awaits
  the close of the loop's objects (``aclose`` of a redis client: its sockets are closed and Redis
  sees the client go). Chosen over wrapping ``loop.close`` (monkeypatching a loop instance, which
  uvloop's loops refuse) and over running Celery's async work on one long-lived loop (it would fix
  Celery only, and the one-shot calls run on a private loop on purpose, see
  ``routing.upstream.complete.complete_blocking``).
- **Backstop.** A loop closed without ``shutdown_asyncgens`` (a hand-made loop) cannot run a clean
  close any more: its entry is dropped when another loop next asks, which frees the client and the
  closed loop, and the garbage collector closes their sockets.

Entries are therefore kept in a plain dict (a strong reference, removed at the loop's end), and
the number of live objects is bounded by the number of loops running now (:meth:`PerLoop.live`).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncGenerator, Awaitable, Callable, Coroutine
from typing import Any, Generic, TypeVar

T = TypeVar("T")

log = logging.getLogger(__name__)


def _step(awaitable: Coroutine[Any, Any, Any]) -> None:
    """Run ``awaitable`` up to its first suspension point, synchronously (it must not suspend)."""
    try:
        awaitable.send(None)
    except StopIteration:
        return
    raise RuntimeError("the loop watcher suspended before its yield")  # pragma: no cover


class PerLoop(Generic[T]):
    """``PerLoop(factory, close=...).get()`` returns this loop's object, calling ``factory()`` the
    first time on each loop; ``close(obj)`` (async) is awaited when that loop shuts down.

    ``close`` None: the object's own ``aclose()`` when it has one, else nothing. A failing close
    is logged (warning) and never raised into the loop's shutdown. Thread-safe: loops of several
    threads may ask at once."""

    def __init__(self, factory: Callable[[], T], *, close: Callable[[T], Awaitable[None]] | None = None) -> None:
        self._factory = factory
        self._close = close
        self._lock = threading.Lock()
        self._objects: dict[asyncio.AbstractEventLoop, T] = {}
        # Every object made on a loop still running, each with the generator that closes it at the
        # loop's end (objects forgotten by ``clear`` included: they are closed all the same).
        self._watchers: dict[asyncio.AbstractEventLoop, dict[int, AsyncGenerator[None, None]]] = {}
        self._made = 0

    def get(self) -> T:
        """This loop's object. Must be called on a running loop (``RuntimeError`` otherwise)."""
        loop = asyncio.get_running_loop()
        obj = self._objects.get(loop)
        if obj is not None:
            return obj
        self._drop_closed_loops()
        obj = self._factory()
        with self._lock:
            self._made += 1
            token = self._made
        watcher = self._until_loop_ends(loop, obj, token)
        # Advances the generator to its ``yield`` now: its first step registers it with the running
        # loop (the loop's ``firstiter`` hook), so ``shutdown_asyncgens`` will close it.
        _step(watcher.asend(None))
        with self._lock:
            self._objects[loop] = obj
            self._watchers.setdefault(loop, {})[token] = watcher
        return obj

    def live(self) -> int:
        """How many objects are open now: those of running loops, and those of loops closed
        without their shutdown hook until the next ``get`` drops them."""
        with self._lock:
            return sum(len(w) for w in self._watchers.values())

    def clear(self) -> None:
        """Forget every loop's object (after a settings change, in tests): the next ``get`` makes
        a new one. The forgotten objects are still closed when their loops end."""
        with self._lock:
            self._objects.clear()

    async def _until_loop_ends(self, loop: asyncio.AbstractEventLoop, obj: T, token: int) -> AsyncGenerator[None, None]:
        try:
            yield
        finally:
            with self._lock:
                if self._objects.get(loop) is obj:
                    del self._objects[loop]
                watchers = self._watchers.get(loop, {})
                watchers.pop(token, None)
                if not watchers:
                    self._watchers.pop(loop, None)
            if not loop.is_closed():
                await self._close_object(obj)

    async def _close_object(self, obj: T) -> None:
        try:
            if self._close is not None:
                await self._close(obj)
            elif hasattr(obj, "aclose"):
                await obj.aclose()
        except Exception as e:
            log.warning("closing %r at the end of its event loop failed: %r", obj, e)

    def _drop_closed_loops(self) -> None:
        with self._lock:
            closed = [loop for loop in self._watchers if loop.is_closed()]
            dropped = [w for loop in closed for w in self._watchers.pop(loop).values()]
            for loop in closed:
                self._objects.pop(loop, None)
        for watcher in dropped:
            # Finish the generator here (its loop is closed, so its ``finally`` awaits nothing):
            # left to the garbage collector, its finaliser would ask the closed loop to close it.
            _step(watcher.aclose())
