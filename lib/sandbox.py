"""The bot tests' sandbox (``bottest``, docs/bot-tests.md): a context in which a shopper's
answer runs through the real path but changes nothing a store, an agent or the ops figures see.

A :class:`Sandbox` is entered with :func:`entered` around one scenario; the answering loop's tasks
and the threads they hand work to (``asyncio.to_thread``, ``database_sync_to_async``) copy the
context, so every part that asks :func:`current` sees it:

* the store's door (``store.services``) reads the configured store but simulates its changes,
  writing them to :attr:`Sandbox.writes` and answering later reads of the order with the changed
  copy (:attr:`Sandbox.orders`); nothing reaches the store, nor its audit log;
* the router's ledger writes the calls with purpose ``test``, and no spend budget or spending
  cap holds or counts them (``routing.upstream.budgets``);
* the answer cache is read, never written (no new entry, no hit counted, no audit or promotion).

Chat marks the conversation itself (``Conversation.sandbox``), which keeps it out of the agents'
queue, alerts, search and the ops figures. Lib imports nothing of kefu's, so the state is plain:
the store keeps its own values in the dicts.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

#: The purpose the ledger gives a call made inside a sandbox (``routing.models.Purpose.TEST``).
LEDGER_PURPOSE = "test"


@dataclass
class Sandbox:
    """One scenario's sandbox. ``writes``: the simulated store changes in order, each
    ``{"action": "cancel" | "return" | "change_address", "order": NUMBER, "repeated": bool,
    "outcome": "ok" | error code}``; ``orders``: order number -> the store's order value as the
    simulated changes left it (``store.types.Order``); ``keys``: idempotency keys that already
    changed an order in the sandbox; ``calls``: every store call in order, read or change, as the
    audit log would have had it: ``{"action": "status" | "orders" | "cancel" | ..., "order":
    NUMBER or "", "purpose": "action" | "tool" | "confirm", "outcome": "ok" | error code}``."""

    writes: list[dict[str, Any]] = field(default_factory=list)
    calls: list[dict[str, Any]] = field(default_factory=list)
    orders: dict[str, Any] = field(default_factory=dict)
    keys: set[str] = field(default_factory=set)

    def writes_of(self, action: str, number: str) -> list[dict[str, Any]]:
        """The simulated writes of ``action`` on order ``number`` that changed it (outcome
        ``ok``, not a repeat of the same key), oldest first."""
        return [
            w
            for w in self.writes
            if w["action"] == action and w["order"] == number and w["outcome"] == "ok" and not w["repeated"]
        ]


_current: contextvars.ContextVar[Sandbox | None] = contextvars.ContextVar("kefu_sandbox", default=None)


def current() -> Sandbox | None:
    """The sandbox the running code is in, or None (a real shopper's answer)."""
    return _current.get()


def active() -> bool:
    """Whether the running code is in a sandbox."""
    return _current.get() is not None


@contextmanager
def entered(box: Sandbox | None = None) -> Iterator[Sandbox]:
    """Run the block inside ``box`` (a new :class:`Sandbox` when None); yields it. Tasks created
    and threads started inside the block keep it after the block ends."""
    box = box if box is not None else Sandbox()
    token = _current.set(box)
    try:
        yield box
    finally:
        _current.reset(token)
