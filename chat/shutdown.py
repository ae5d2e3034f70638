"""A web process asked to stop (SIGTERM) leaves nothing half done.

Daphne, like most servers, stops at once on SIGTERM: every socket drops and every answer still
streaming dies with the process (its lease then runs out and another process's sweep finishes it
as cut, 20 s later). Here the process takes SIGTERM over, from its first socket, and drains:

1. every socket it serves is closed with 4012 ("restarting"), so the widgets reconnect at once
   to another process and resume there (the conversation, the text so far, the live deltas);
2. the answers it is streaming go on, for up to ``KEFU_SHUTDOWN_GRACE_S`` seconds (10): their
   deltas reach the resumed sockets through the channel layer, and each ends as usual;
3. an answer still streaming at the deadline is stopped, and its lease ended at once, so that the
   next sweep of a live process (``KEFU_AGENT_SWEEP_S``) finishes it as cut and answers the
   question again;
4. the ledger rows still being written are flushed; then the server is stopped.

``KEFU_SHUTDOWN_GRACE_S=0`` leaves SIGTERM to the server. A second SIGTERM while draining is
ignored (send SIGKILL to stop at once).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import weakref
from typing import Any

from channels.db import database_sync_to_async
from django.conf import settings

from lib import metrics
from routing import services as router

from . import answering, regroup, services

log = logging.getLogger(__name__)

#: Close code of a socket whose process is restarting: reconnect now (kefu's own, like 4403/4429).
CLOSE_RESTARTING = 4012

_installed: weakref.WeakSet[asyncio.AbstractEventLoop] = weakref.WeakSet()
_state = {"draining": False}


def install() -> None:
    """Take SIGTERM over on this event loop (idempotent; nothing when ``KEFU_SHUTDOWN_GRACE_S`` is
    0, or off the main thread, as in tests)."""
    if settings.KEFU_SHUTDOWN_GRACE_S <= 0:
        return
    loop = asyncio.get_running_loop()
    if loop in _installed:
        return
    try:
        loop.add_signal_handler(signal.SIGTERM, _on_sigterm, loop)
    except (NotImplementedError, RuntimeError, ValueError):  # not the main thread, or no signals here
        return
    _installed.add(loop)


def draining() -> bool:
    """True once this process was asked to stop."""
    return _state["draining"]


def _on_sigterm(loop: asyncio.AbstractEventLoop) -> None:
    if _state["draining"]:
        return
    _state["draining"] = True
    log.warning("SIGTERM: draining (closing sockets, finishing answers for up to %g s)", settings.KEFU_SHUTDOWN_GRACE_S)
    loop.create_task(_drain_then_stop())


async def drain(grace_s: float) -> tuple[int, int]:
    """Steps 1-4 of the module docstring, without stopping the server. Returns (answers that
    ended within the grace, answers left to other processes)."""
    sockets = list(regroup.sockets())
    await asyncio.gather(*(s.close(code=CLOSE_RESTARTING) for s in sockets), return_exceptions=True)
    deadline = asyncio.get_running_loop().time() + grace_s
    finished: set[asyncio.Task[Any]] = set()
    left: set[asyncio.Task[Any]] = set()
    # Answers started meanwhile (a message that came in as the sockets closed) are waited for too.
    while (running := answering.running() - finished) and (wait := deadline - asyncio.get_running_loop().time()) > 0:
        done, left = await asyncio.wait(running, timeout=wait)
        finished |= done
    left = answering.running() - finished
    if left:
        ids = answering.streaming_answers()
        if ids:
            await database_sync_to_async(services.answer_leases_end)(message_ids=sorted(ids))
        for task in left:
            task.cancel()
        await asyncio.gather(*left, return_exceptions=True)
    await router.router_drain()
    metrics.process_ended()  # its open-socket count leaves the workers' sum now
    log.warning("drained: %d answers finished, %d left to other processes", len(finished), len(left))
    return len(finished), len(left)


async def _drain_then_stop() -> None:
    try:
        await drain(settings.KEFU_SHUTDOWN_GRACE_S)
    except Exception:  # stop anyway: what is left is finished by the other processes' sweeps
        log.exception("draining failed")
    finally:
        _stop_server()


def _stop_server() -> None:
    """Stop the ASGI server: Daphne's Twisted reactor when it runs, else SIGTERM's default."""
    try:
        from twisted.internet import reactor as twisted_reactor

        reactor: Any = twisted_reactor
        if reactor.running:
            reactor.stop()
            return
    except ImportError:
        pass
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)
