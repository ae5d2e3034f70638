"""A worker killed (SIGKILL) while it streams a remote answer loses nothing (issue: faults). Two
real Daphne processes share PostgreSQL and a private Redis; the shopper's worker is killed
mid-answer and the shopper resumes on the other one, which gets the text so far, then (once the
dead worker's lease on the answer ran out) the partial answer ended as cut and the question
answered again in full. The killed call's cost is in the ledger, estimated."""

from __future__ import annotations

import asyncio
import json
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
ANSWER = (
    "Yes: the walnut floor lamp has a foot dimmer on its cable, with three brightness steps, "
    "and it works with any warm white bulb up to ten watts."
)


async def frames_until(ws: Any, kind: str, timeout: float = 60) -> list[dict[str, Any]]:
    """``tests.sockets.frames_until`` waiting up to 60 s (answers here outlast a dead worker)."""
    return await _frames_until(ws, kind, timeout)


def ledger(pg: str, conversation: str, expected: int) -> list[tuple[str, str, str, bool]]:
    """(tier, outcome, error_code, estimated) of the conversation's ledger rows, once there are
    ``expected`` of them (rows are written in the background), oldest first."""
    deadline = time.monotonic() + 30
    while True:
        with psycopg.connect(pg) as db:
            rows = db.execute(
                "SELECT tier, outcome, error_code, estimated FROM routing_upstreamcall"
                " WHERE conversation_id = %s ORDER BY id",
                (uuid.UUID(conversation),),
            ).fetchall()
        if len(rows) >= expected or time.monotonic() > deadline:
            return [tuple(r) for r in rows]
        time.sleep(0.2)


async def test_a_worker_killed_mid_answer_is_answered_again_on_the_other(
    live_kefu: Any, private_redis: Any, pg_database: str
) -> None:
    slow = Behaviour(text=ANSWER, chunks=30, ttft_ms=50, token_ms=150)  # about 4.5 s of stream
    with running_fake_openai(default=slow) as upstream:
        env = {
            "DATABASE_URL": pg_database,
            "REDIS_URL": private_redis.url,
            "OPENAI_API_KEY": "upstream-key",
            "OPENAI_BASE_URL": upstream.base_url,
            "KEFU_ANSWER_LEASE_S": "3",
            "KEFU_AGENT_SWEEP_S": "0.5",
        }
        doomed = live_kefu(env=env)
        survivor = live_kefu(env=env, faq_path=None)

        async with websockets.connect(doomed.ws, origin=doomed.base) as ws:
            await ws.send(json.dumps({"type": "hello"}))
            conv = json.loads(await ws.recv())
            await ws.send(json.dumps({"type": "message", "client_id": "q-1", "text": QUESTION}))
            seen = await frames_until(ws, "stream.start")
            assert seen[0]["type"] == "message" and seen[-1]["route"].startswith("llm.")
            answer_id = seen[-1]["id"]
            got = ""
            while len(got) < 20:
                f = json.loads(await asyncio.wait_for(ws.recv(), 30))
                if f["type"] == "stream.delta":
                    got += f["text"]
            doomed.proc.kill()  # SIGKILL mid-answer: no finally, no ledger row, no stream.end
            doomed.proc.wait(10)

        async with websockets.connect(survivor.ws, origin=survivor.base) as ws:
            await ws.send(json.dumps({"type": "hello", "conversation": conv["id"], "token": conv["token"], "after": 1}))
            assert json.loads(await ws.recv())["type"] == "conversation"
            frames = await frames_until(ws, "stream.end")
            # resumed mid-answer: the text so far (at least what this socket had), then its end as cut
            assert frames[0] == {
                "type": "stream.start",
                "id": answer_id,
                "seq": 2,
                "role": "bot",
                "route": frames[0]["route"],
            }
            resumed = "".join(f["text"] for f in frames if f["type"] == "stream.delta")
            end = frames[-1]
            assert end["id"] == answer_id and end["cut"] is True
            assert end["text"] == resumed and resumed.startswith(got) and ANSWER.startswith(resumed)
            error = json.loads(await asyncio.wait_for(ws.recv(), 30))
            assert error["type"] == "error" and error["code"] == "unavailable"
            again = await frames_until(ws, "stream.end")
            assert again[0]["type"] == "stream.start" and again[0]["id"] != answer_id
            assert again[-1]["text"] == ANSWER and not again[-1].get("cut")

    with psycopg.connect(pg_database) as db:
        rows = db.execute(
            "SELECT seq, role, state, cut, text FROM chat_message WHERE conversation_id = %s ORDER BY seq",
            (uuid.UUID(conv["id"]),),
        ).fetchall()
    assert [(r[0], r[1], r[2], r[3]) for r in rows] == [
        (1, "shopper", "done", False),
        (2, "bot", "done", True),
        (3, "bot", "done", False),
    ]
    assert rows[1][4] == resumed and rows[2][4] == ANSWER
    calls = ledger(pg_database, conv["id"], 2)
    assert ("simple", "failed", "process_died", True) in calls  # the killed call, estimated
    assert ("simple", "ok", "", False) in calls  # the answer given again
