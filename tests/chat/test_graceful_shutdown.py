"""A worker asked to stop (SIGTERM) drains (issue: faults): its sockets are closed with 4012, the
shopper resumes on the other worker mid-answer, the answer the stopping worker streams ends there
in full, and the worker exits cleanly. An answer longer than the grace period is left to the
other worker, which ends it as cut and answers the question again. Two real Daphne processes on
PostgreSQL and a private Redis; the upstream is the project's test server."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest
import websockets

from tests.sockets import frames_until as _frames_until

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fake_openai import Behaviour, running_fake_openai

pytestmark = pytest.mark.asyncio

QUESTION = "Does the walnut floor lamp come with a dimmer switch?"
ANSWER = "".join(f"part{i:02d} " for i in range(30))


async def frames_until(ws: Any, kind: str, timeout: float = 60) -> list[dict[str, Any]]:
    """``tests.sockets.frames_until`` waiting up to 60 s (answers here outlast a dead worker)."""
    return await _frames_until(ws, kind, timeout)


def ledger(pg: str, conversation: str) -> list[tuple[str, str]]:
    with psycopg.connect(pg) as db:
        rows = db.execute(
            "SELECT outcome, error_code FROM routing_upstreamcall WHERE conversation_id = %s ORDER BY id",
            (uuid.UUID(conversation),),
        ).fetchall()
    return [(str(r[0]), str(r[1])) for r in rows]


async def start_answer_then_stop(kefu: Any) -> tuple[dict[str, Any], int, str]:
    """A shopper on ``kefu`` asks; a few deltas in, the worker gets SIGTERM. Returns the
    conversation frame, the answer's id and the text the shopper had; asserts the 4012 close."""
    async with websockets.connect(kefu.ws, origin=kefu.base) as ws:
        await ws.send(json.dumps({"type": "hello"}))
        conv = json.loads(await ws.recv())
        await ws.send(json.dumps({"type": "message", "client_id": "q-1", "text": QUESTION}))
        start = (await frames_until(ws, "stream.start"))[-1]
        got = ""
        while len(got) < 14:
            f = json.loads(await asyncio.wait_for(ws.recv(), 30))
            if f["type"] == "stream.delta":
                got += f["text"]
        kefu.proc.send_signal(signal.SIGTERM)
        with pytest.raises(websockets.ConnectionClosed) as closed:
            while True:
                f = json.loads(await asyncio.wait_for(ws.recv(), 10))
                if f["type"] == "stream.delta":
                    got += f["text"]
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 4012
    return conv, start["id"], got


async def test_a_stopping_worker_finishes_its_answer_for_the_shopper_resumed_elsewhere(
    live_kefu: Any, private_redis: Any, pg_database: str
) -> None:
    with running_fake_openai(default=Behaviour(text=ANSWER, chunks=30, ttft_ms=50, token_ms=100)) as upstream:
        env = {
            "DATABASE_URL": pg_database,
            "REDIS_URL": private_redis.url,
            "OPENAI_API_KEY": "upstream-key",
            "OPENAI_BASE_URL": upstream.base_url,
            "KEFU_SHUTDOWN_GRACE_S": "15",
        }
        stopping = live_kefu(env=env)
        other = live_kefu(env=env, faq_path=None)
        conv, answer_id, got = await start_answer_then_stop(stopping)

        async with websockets.connect(other.ws, origin=other.base) as ws:
            await ws.send(json.dumps({"type": "hello", "conversation": conv["id"], "token": conv["token"], "after": 1}))
            assert json.loads(await ws.recv())["type"] == "conversation"
            frames = await frames_until(ws, "stream.end")
        started = time.monotonic()
        assert stopping.proc.wait(20) == 0  # it exited by itself, cleanly
        assert time.monotonic() - started < 20
    assert frames[0]["type"] == "stream.start" and frames[0]["id"] == answer_id
    end = frames[-1]
    assert end["id"] == answer_id and not end.get("cut") and end["text"] == ANSWER
    assert "".join(f["text"] for f in frames if f["type"] == "stream.delta") == ANSWER  # resumed, nothing lost
    assert ANSWER.startswith(got)
    assert ledger(pg_database, conv["id"]) == [("ok", "")]


async def test_an_answer_longer_than_the_grace_is_answered_again_by_the_other_worker(
    live_kefu: Any, private_redis: Any, pg_database: str
) -> None:
    slow = Behaviour(text=ANSWER, chunks=30, ttft_ms=50, token_ms=400)  # 12 s: twice the grace
    with running_fake_openai(default=slow) as upstream:
        env = {
            "DATABASE_URL": pg_database,
            "REDIS_URL": private_redis.url,
            "OPENAI_API_KEY": "upstream-key",
            "OPENAI_BASE_URL": upstream.base_url,
            # The shopper below must be back on the other worker before the grace ends, or the
            # sweep finishes and answers again before it subscribes, and it sees both only as
            # replayed messages: with 1 s a loaded machine lost that race (CI, 2026-12-03), and
            # with 3 s once more at the end of a full run (2026-12-08).
            "KEFU_SHUTDOWN_GRACE_S": "6",
            "KEFU_AGENT_SWEEP_S": "0.5",
        }
        stopping = live_kefu(env=env)
        other = live_kefu(env=env, faq_path=None)
        conv, answer_id, _got = await start_answer_then_stop(stopping)
        upstream.default = Behaviour(text=ANSWER, chunks=30, ttft_ms=50, token_ms=10)
        async with websockets.connect(other.ws, origin=other.base) as ws:
            await ws.send(json.dumps({"type": "hello", "conversation": conv["id"], "token": conv["token"], "after": 1}))
            assert json.loads(await ws.recv())["type"] == "conversation"
            first = await frames_until(ws, "stream.end")
            assert first[-1]["id"] == answer_id and first[-1]["cut"] is True
            error = json.loads(await asyncio.wait_for(ws.recv(), 30))
            assert error["type"] == "error" and error["code"] == "unavailable"
            again = await frames_until(ws, "stream.end")
        assert stopping.proc.wait(20) == 0
    assert again[-1]["id"] != answer_id and again[-1]["text"] == ANSWER and not again[-1].get("cut")
    # the stopped call recorded itself (abandoned), so the sweep estimates nothing twice
    assert ledger(pg_database, conv["id"]) == [("failed", "abandoned"), ("ok", "")]
