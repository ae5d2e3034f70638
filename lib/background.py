"""Blocking work handed to a worker thread that nothing waits for, and a way to wait for it.

The answering loop hands summaries and cache audits off this way, so the shopper's next message
never waits for them; tests and shutdown call :meth:`Background.drain`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from django.db import close_old_connections

log = logging.getLogger(__name__)


class Background:
    """Runs blocking callables in the event loop's default executor without waiting for them.

    Each call runs between two ``close_old_connections()`` (a worker thread keeps its own database
    connection), and an exception is logged with ``what``, never raised: background work is an
    optimisation or a measurement, never part of an answer."""

    def __init__(self, what: str) -> None:
        self.what = what
        self._pending: set[asyncio.Future[None]] = set()

    def start(self, work: Callable[[], object]) -> None:
        """Run ``work()`` in a worker thread of the running loop; returns at once."""

        def run() -> None:
            close_old_connections()
            try:
                work()
            except Exception:  # the thread's edge: logged, never shown to a shopper
                log.exception("%s failed", self.what)
            finally:
                close_old_connections()

        future = asyncio.get_running_loop().run_in_executor(None, run)
        self._pending.add(future)
        future.add_done_callback(self._pending.discard)

    def busy(self) -> bool:
        """Whether work started on the running loop has not ended yet."""
        loop = asyncio.get_running_loop()
        return any(f.get_loop() is loop and not f.done() for f in self._pending)

    async def drain(self) -> None:
        """Wait until every piece of work started on this loop has ended."""
        loop = asyncio.get_running_loop()
        while pending := [f for f in self._pending if f.get_loop() is loop and not f.done()]:
            await asyncio.gather(*pending, return_exceptions=True)
