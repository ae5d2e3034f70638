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
