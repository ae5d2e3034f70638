"""One object per running event loop, made on first use.

Async clients (redis.asyncio, the rate limiter's storage) hold connections that belong to the
loop that made them; a process has one loop under Daphne, but tests and management commands run
several in turn. Entries go away with their loop (weak keys).
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class PerLoop(Generic[T]):
    """``PerLoop(factory).get()`` returns this loop's object, calling ``factory()`` the first time."""

    def __init__(self, factory: Callable[[], T]) -> None:
        self._factory = factory
        self._objects: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, T] = weakref.WeakKeyDictionary()

    def get(self) -> T:
        loop = asyncio.get_running_loop()
        obj = self._objects.get(loop)
        if obj is None:
            obj = self._objects[loop] = self._factory()
        return obj

    def clear(self) -> None:
        """Forget every loop's object (after a settings change, in tests)."""
        self._objects.clear()
