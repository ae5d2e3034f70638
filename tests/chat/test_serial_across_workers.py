"""One answer at a time per conversation, across workers (issue 29 item 6): two messages of one
conversation sent through two workers 50 ms apart are answered one after the other, and the
second prompt has the first answer in it (question 1, answer 1, question 2). Before, both were
answered at once and the second prompt lacked the first answer.

Two real Daphne processes on PostgreSQL and a private Redis; the shopper has a socket on each
(two tabs); the test upstream (tests/fake_openai.py) echoes each question slowly and records
every prompt and the moment each chunk of each answer was written. A second test kills (SIGKILL)
the worker streaming the first answer: the waiting message is answered once a sweep finished the
dead worker's answer and answered its question again (chat.sweeper)."""

from __future__ import annotations

import asyncio
import json
import sys
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest
import websockets

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fake_openai import Behaviour, running_fake_openai

pytestmark = pytest.mark.asyncio

Q1 = "Does the walnut floor lamp come with a dimmer switch?"
Q2 = "Is the linen armchair cover machine washable?"


async def recv(ws: Any, timeout: float = 60) -> dict[str, Any]:
    return json.loads(await asyncio.wait_for(ws.recv(), timeout))


async def until_answered(ws: Any, timeout: float = 120) -> list[dict[str, Any]]:
    """Frames of ``ws`` up to the ``stream.end`` of full (not cut) answers echoing both ``Q1``
    and ``Q2``, in whichever order they come."""
    frames = []
    left = {Q1, Q2}
    async with asyncio.timeout(timeout):
        while left:
            f = json.loads(await ws.recv())
            frames.append(f)
            if f["type"] == "stream.end" and not f.get("cut"):
                left -= {q for q in left if q in f["text"]}
    return frames


def text_of(content: object) -> str:
    if isinstance(content, str):
        return content
    return "".join(str(p.get("text", "")) for p in content or [] if isinstance(p, dict))  # type: ignore[attr-defined]


def prompt_of(upstream: Any, question: str) -> list[tuple[str, str]]:
    """(role, text) of the last chat request's messages whose last message asks ``question``."""
    for body in reversed(upstream.requests):
        messages = body.get("messages") or []
        if messages and question in text_of(messages[-1].get("content")):
            return [(m["role"], text_of(m.get("content"))) for m in messages]
    raise AssertionError(f"no prompt asked {question!r}")


def chunk_times(upstream: Any, question: str) -> list[float]:
    """When each answer chunk to ``question`` was written (monotonic s), in order."""
    return [t for last, _written, t in upstream.chunk_log if question in last]


def rows(pg: str, conversation: str) -> list[tuple[int, str, str, int | None, bool, str]]:
    with psycopg.connect(pg) as db:
        return [
            tuple(r)
            for r in db.execute(
                "SELECT seq, role, state, reply_to_seq, cut, text FROM chat_message"
                " WHERE conversation_id = %s ORDER BY seq",
                (uuid.UUID(conversation),),
            ).fetchall()
        ]


def stored_answers(pg: str, conversation: str) -> list[tuple[str, str, bool, str]]:
    """The conversation's bot rows in seq order: (the question it replies to, state, cut, text).
    (Which seqs they took depends on when each row was written, not on the order of answers.)"""
    stored = rows(pg, conversation)
    questions = {seq: text for seq, role, _state, _reply, _cut, text in stored if role == "shopper"}
    assert sorted(questions.values()) == sorted([Q1, Q2])
    return [(questions[reply], state, cut, text) for _seq, role, state, reply, cut, text in stored if role == "bot"]


def assert_in_order(prompt: list[tuple[str, str]], *texts: str) -> None:
    """Each of ``texts`` is in a message of ``prompt``, in this order."""
    at = -1
    for text in texts:
        found = [i for i, (_role, content) in enumerate(prompt) if text in content and i > at]
        assert found, f"{text!r} is not in the prompt after message {at}: {prompt}"
        at = found[0]


async def ask_both(a: Any, b: Any) -> None:
    """``Q1`` through socket ``a``, then ``Q2`` through ``b`` as soon as ``Q1`` is stored (its
    acknowledgement: stored and claimed in one transaction), while its answer is being prepared:
    the trial's two messages 50 ms apart, in an order a loaded machine cannot swap."""
    await a.send(json.dumps({"type": "message", "client_id": "q-1", "text": Q1}))
    while not ((f := await recv(a))["type"] == "message" and f.get("client_id") == "q-1"):
        pass
    await b.send(json.dumps({"type": "message", "client_id": "q-2", "text": Q2}))


async def two_tabs(first: Any, second: Any) -> tuple[Any, Any, dict[str, Any]]:
    """A conversation started on worker ``first`` and resumed on worker ``second``: both sockets."""
    a = await websockets.connect(first.ws, origin=first.base)
    await a.send(json.dumps({"type": "hello"}))
    conv = await recv(a)
    assert conv["type"] == "conversation"
    b = await websockets.connect(second.ws, origin=second.base)
    await b.send(json.dumps({"type": "hello", "conversation": conv["id"], "token": conv["token"], "after": 0}))
    assert (await recv(b))["type"] == "conversation"
    return a, b, conv


async def test_two_messages_through_two_workers_are_answered_one_after_the_other(
    live_kefu: Any, private_redis: Any, pg_database: str
) -> None:
    slow = Behaviour(chunks=12, ttft_ms=50, token_ms=80)  # an echo of the question, about 1 s
    with running_fake_openai(default=slow) as upstream:
        upstream.chunk_log = []
        env = {
            "DATABASE_URL": pg_database,
            "REDIS_URL": private_redis.url,
            "OPENAI_API_KEY": "upstream-key",
            "OPENAI_BASE_URL": upstream.base_url,
        }
        first = live_kefu(env=env)
        second = live_kefu(env=env, faq_path=None)
        a, b, conv = await two_tabs(first, second)
        try:
            await ask_both(a, b)
            frames = await until_answered(a)
        finally:
            await a.close()
            await b.close()

    kinds = [f["type"] for f in frames if f["type"] in ("stream.start", "stream.end")]
    assert kinds == ["stream.start", "stream.end", "stream.start", "stream.end"]  # never two at once
    ends = [f for f in frames if f["type"] == "stream.end"]
    answer_1 = ends[0]["text"]
    assert Q1 in answer_1 and Q2 in ends[1]["text"]
    # The second prompt: question 1, answer 1, question 2.
    assert_in_order(prompt_of(upstream, Q2), Q1, answer_1, Q2)
    # The upstream wrote the second answer's first chunk after the first answer's last one.
    assert chunk_times(upstream, Q2)[0] > chunk_times(upstream, Q1)[-1]
    assert stored_answers(pg_database, conv["id"]) == [
        (Q1, "done", False, answer_1),
        (Q2, "done", False, ends[1]["text"]),
    ]


async def test_a_message_waiting_for_a_killed_workers_answer_is_answered_after_it_was_answered_again(
    live_kefu: Any, private_redis: Any, pg_database: str
) -> None:
    slow = Behaviour(chunks=30, ttft_ms=50, token_ms=150)  # about 4.5 s of stream
    with running_fake_openai(default=slow) as upstream:
        upstream.chunk_log = []
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
        a, b, conv = await two_tabs(doomed, survivor)
        try:
            await ask_both(a, b)
            got = ""
            while len(got) < 10:  # the first answer streams (seen through the other worker)
                f = await recv(b)
                if f["type"] == "stream.delta":
                    got += f["text"]
            doomed.proc.kill()  # SIGKILL mid-answer: its claim and lease are left to run out
            doomed.proc.wait(10)
            frames = await until_answered(b)
        finally:
            await a.close()
            await b.close()

    ends = [f for f in frames if f["type"] == "stream.end"]
    assert ends[0]["cut"] is True  # the killed worker's answer, ended by the sweep
    again, second = ends[-2], ends[-1]
    assert Q1 in again["text"] and not again.get("cut") and Q2 in second["text"]  # answered in order
    # Never two answers at once: each stream.start after the stream.end before it.
    kinds = [f["type"] for f in frames if f["type"] in ("stream.start", "stream.end")]
    assert kinds == ["stream.end"] + ["stream.start", "stream.end"] * 2  # the killed answer's end, then two
    # The waiting message was answered only after its question was answered again, and saw it.
    assert chunk_times(upstream, Q2)[0] > chunk_times(upstream, Q1)[-1]
    assert_in_order(prompt_of(upstream, Q2), Q1, again["text"], Q2)
    assert stored_answers(pg_database, conv["id"]) == [
        (Q1, "done", True, ends[0]["text"]),
        (Q1, "done", False, again["text"]),
        (Q2, "done", False, second["text"]),
    ]
