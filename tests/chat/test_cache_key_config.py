"""The answer cache's key holds the model and the output limit (issue 29, item 6), in production
shape: Daphne workers on one PostgreSQL database and one private Redis (the exact store), real
WebSockets, the project's test upstream.

The trial of the issue: a worker restarted with another simple model and ``max_tokens`` 50 was
served, as ``cache.exact``, the answer the old configuration had made. Here a worker with the
original configuration answers a question and caches it (and serves it from the cache to the
next shopper); a worker started with another ``KEFU_SIMPLE_MODEL``, and one with another
``KEFU_LLM_MAX_TOKENS``, each ask their own model instead. Waits are for conditions, never fixed
sleeps.
"""

from __future__ import annotations

import json
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest
import websockets

from tests.sockets import frames_until

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fake_openai import Behaviour, running_fake_openai

pytestmark = pytest.mark.asyncio

QUESTION = "Does the walnut floor lamp come with a dimmer switch?"
FIRST = "Yes, an inline dimmer."
#: The longest wait for the answer to be stored in the cache, seconds (after its stream.end).
CACHED_WAIT_S = 60.0


async def asked(kefu: Any, text: str) -> dict[str, Any]:
    """A new shopper on ``kefu`` asks ``text``: the answer's ``stream.end``."""
    async with websockets.connect(kefu.ws, origin=kefu.base) as ws:
        await ws.send(json.dumps({"type": "hello"}))
        json.loads(await ws.recv())
        await ws.send(json.dumps({"type": "message", "client_id": str(uuid.uuid4()), "text": text}))
        return (await frames_until(ws, "stream.end", timeout=60))[-1]


def cached_answers(pg: str) -> list[tuple[str, str]]:
    with psycopg.connect(pg) as db:
        return [(str(q), str(a)) for q, a in db.execute("SELECT question, answer FROM cache_layer_cachedanswer")]


def asked_upstream(upstream: Any) -> list[dict[str, Any]]:
    """The upstream requests that carried :data:`QUESTION`."""
    return [r for r in upstream.requests if r["messages"][-1]["content"] == QUESTION]


# Three Daphne workers each migrate, import the FAQ and warm up before they are healthy (~60 s each
# on the 2-core machine under load).
@pytest.mark.timeout(600)
async def test_a_worker_with_another_model_or_output_limit_is_never_served_the_others_answer(
    live_kefu: Any, private_redis: Any, pg_database: str
) -> None:
    with running_fake_openai(default=Behaviour(text=FIRST)) as upstream:
        env = {
            "DATABASE_URL": pg_database,
            "REDIS_URL": private_redis.url,
            "OPENAI_API_KEY": "upstream-key",
            "OPENAI_BASE_URL": upstream.base_url,
            "KEFU_SIMPLE_MODEL": "fake-simple",
            "KEFU_MEDIUM_MODEL": "fake-medium",
            "KEFU_COMPLEX_MODEL": "fake-complex",
            "KEFU_TIER_ROUTING": "false",  # the simple tier answers
            "KEFU_LLM_MAX_TOKENS": "600",
        }
        # Started before any answer is cached: each start imports the FAQ.
        original = live_kefu(env=env)
        other_model = live_kefu(env={**env, "KEFU_SIMPLE_MODEL": "fake-small"})
        other_limit = live_kefu(env={**env, "KEFU_LLM_MAX_TOKENS": "50"})

        end = await asked(original, QUESTION)
        assert (end["route"], end["text"]) == ("llm.simple", FIRST), end
        deadline = time.monotonic() + CACHED_WAIT_S
        while cached_answers(pg_database) != [(QUESTION, FIRST)]:
            assert time.monotonic() < deadline, cached_answers(pg_database)
            time.sleep(0.1)
        again = await asked(original, QUESTION)  # the same configuration: served from the cache
        assert (again["route"], again["text"]) == ("cache.exact", FIRST), again
        assert [(r["model"], r["max_tokens"]) for r in asked_upstream(upstream)] == [("fake-simple", 600)]

        upstream.default = Behaviour(text="Yes: the small model's answer.")
        small = await asked(other_model, QUESTION)
        assert (small["route"], small["text"]) == ("llm.simple", "Yes: the small model's answer."), small
        assert small["model"] == "fake-small"

        upstream.default = Behaviour(text="Yes, dimmable.")
        short = await asked(other_limit, QUESTION)
        assert (short["route"], short["text"]) == ("llm.simple", "Yes, dimmable."), short

    assert [(r["model"], r["max_tokens"]) for r in asked_upstream(upstream)] == [
        ("fake-simple", 600),
        ("fake-small", 600),
        ("fake-simple", 50),
    ]
