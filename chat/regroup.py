"""Group memberships survive a Redis restart or failover.

channels-redis keeps each group's members in Redis. A Redis that restarts without persistence, or
a replica promoted by a failover, has none of them: every open socket would stay connected and
receive nothing published to its conversation again. Each process therefore watches the identity
of the Redis server its layer talks to (``INFO server`` ``run_id``, new at every start and on every
server) every ``KEFU_REGROUP_POLL_S`` seconds (2) from its first socket; when it changes, every
socket of the process joins its groups again (``FrameSocket.rejoin``). Frames published between
the loss and the re-join are not delivered live; they are stored, and a socket catches up from the
stored messages when it next resumes (``hello`` with ``after``).

Nothing runs on the in-memory layer (no ``REDIS_URL``) or when ``KEFU_REGROUP_POLL_S`` is 0.

While the layer cannot be reached at all, :func:`deliver_locally` hands a group's event to the
members of the group that this process serves (``chat.events`` does so when ``group_send``
failed): an answer streamed by a process still reaches the sockets it serves itself.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from typing import Any, Protocol

from django.conf import settings

from lib.loops import PerLoop
from lib.redis_conn import redis_options, tracked

log = logging.getLogger(__name__)


class Rejoins(Protocol):
    groups_joined: set[str]

    async def rejoin(self) -> None: ...

    async def dispatch(self, message: dict[str, Any]) -> None: ...


_sockets: weakref.WeakSet[Any] = weakref.WeakSet()
_watchers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Task[None]] = weakref.WeakKeyDictionary()


def _make_client() -> Any:
    import redis.asyncio as aioredis

    options = redis_options(asyncio=True, socket_timeout_s=2.0, retries=1, purpose="regroup")
    return tracked(aioredis.Redis.from_url(settings.REDIS_URL, **options), "regroup")


_clients: PerLoop[Any] = PerLoop(_make_client)

#: The ``run_id`` last seen by this process (None before the first successful look).
_seen: dict[str, str | None] = {"run_id": None}


def register(socket: Rejoins) -> None:
    """Follow ``socket`` (a consumer with ``rejoin()``) and make sure this loop's watcher runs."""
    _sockets.add(socket)
    poll = float(settings.KEFU_REGROUP_POLL_S)
    if not settings.REDIS_URL or poll <= 0:
        return
    loop = asyncio.get_running_loop()
    task = _watchers.get(loop)
    if task is None or task.done():
        _watchers[loop] = loop.create_task(_watch(poll), name="kefu-regroup")


def unregister(socket: Rejoins) -> None:
    _sockets.discard(socket)


def sockets() -> list[Any]:
    """The sockets this process serves now."""
    return list(_sockets)


async def deliver_locally(group: str, event: dict[str, Any]) -> int:
    """Hand ``event`` (a channel-layer event) to this process's sockets in ``group``, as the layer
    would have; returns how many got it. A socket's handler failing is logged and skipped."""
    members = [s for s in list(_sockets) if group in s.groups_joined]
    for socket in members:
        try:
            await socket.dispatch(event)
        except Exception:  # one socket's failure must not stop the others
            log.exception("local delivery to a socket of %s failed", group)
    return len(members)


async def server_run_id() -> str:
    """The ``run_id`` of the Redis server at ``REDIS_URL``. Raises ``redis.RedisError`` when it
    cannot be reached."""
    info = await _clients.get().info("server")
    return str(info["run_id"])


async def check() -> int:
    """Look at the server once; when it is not the one seen before, every followed socket joins
    its groups again. Returns how many sockets re-joined (0 when nothing changed). Raises
    ``redis.RedisError`` when Redis cannot be reached (nothing is changed then)."""
    run_id = await server_run_id()
    before, _seen["run_id"] = _seen["run_id"], run_id
    if before is None or before == run_id:
        return 0
    sockets = list(_sockets)
    log.warning("Redis server changed (restart or failover): %d sockets join their groups again", len(sockets))
    results = await asyncio.gather(*(s.rejoin() for s in sockets), return_exceptions=True)
    failed = [r for r in results if isinstance(r, BaseException)]
    if failed:
        # Try again at the next poll: forget the run id so that the change is seen once more.
        _seen["run_id"] = before
        log.warning("%d sockets could not join their groups again (%r); retrying", len(failed), failed[0])
    return len(sockets) - len(failed)


async def _watch(poll_s: float) -> None:
    while True:
        try:
            await check()
        except Exception as e:  # the task's edge: Redis down is reported by /healthz; look again later
            log.debug("regroup check failed: %r", e)
        await asyncio.sleep(poll_s)


async def stop() -> None:
    """Stop this loop's watcher (tests, shutdown)."""
    task = _watchers.pop(asyncio.get_running_loop(), None)
    if task is not None:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
