"""Helpers for tests that talk to a live kefu over real WebSockets (the ``websockets`` client)."""

from __future__ import annotations

import asyncio
import json
from typing import Any


async def frames_until(ws: Any, kind: str, timeout: float = 30) -> list[dict[str, Any]]:
    """The JSON frames received on ``ws`` up to and including the first of type ``kind``; raises
    ``TimeoutError`` after ``timeout`` seconds."""
    frames = []
    async with asyncio.timeout(timeout):
        while True:
            f = json.loads(await ws.recv())
            frames.append(f)
            if f["type"] == kind:
                return frames


def status_frame(
    status: str,
    *,
    agent: str | None = None,
    online: int = 0,
    position: int | None = None,
    wait_s: int | None = None,
    contact_saved: bool = False,
) -> dict[str, Any]:
    """The ``status`` frame a shopper socket should get (docs/protocol.md §4.4, §4.6): ``online``
    agents, the queue ``position`` and expected wait ``wait_s`` (``None`` unless waiting)."""
    frame: dict[str, Any] = {"type": "status", "status": status}
    if agent is not None:
        frame["agent"] = agent
    frame["availability"] = {
        "agents_online": online,
        "queue_position": position,
        "expected_wait_s": wait_s,
        "contact_saved": contact_saved,
    }
    return frame
