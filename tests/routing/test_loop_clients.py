"""No Redis connection outlives the event loop that opened it (issue 29, item 5).

Each Celery task that calls a tier runs its call on a fresh event loop
(``routing.upstream.complete.complete_blocking``: ``async_to_sync`` in a new thread). The per-loop
Redis clients it used (the tier's rate budget, the shared upstream blocks) were never closed: one
idle connection per task stayed open in Redis until ``maxclients``. Production shape: a real Celery
worker process on a private Redis and PostgreSQL runs 1,000 summary tasks, each a call of the
``simple`` tier to the project's test upstream, and Redis' own ``CLIENT LIST`` must stay flat."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import psycopg
import pytest

from lib.loops import PerLoop
from tests.processes import celery_worker, manage

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
from fake_openai import Behaviour, running_fake_openai  # noqa: E402

TASKS = 400
SUMMARY = "The shopper asked about the oak side table and the linen sofa cover."

SEED = f"""
from chat.models import Conversation, Message
from chat.tasks import summarise_conversation
turns = [("shopper", "Is the oak side table solid wood?"), ("bot", "Yes, solid oak."),
         ("shopper", "Is the linen sofa cover machine washable?"), ("bot", "Yes, at 30 degrees."),
         ("shopper", "Does the walnut lamp have a dimmer?"), ("bot", "Yes, an inline dimmer.")]
conversations = Conversation.objects.bulk_create(
    [Conversation(token_hash=f"{{i:064x}}", last_seq=len(turns), answered_seq=len(turns)) for i in range({TASKS})]
)
Message.objects.bulk_create(
    [Message(conversation=c, seq=seq, role=role, text=text, state="done")
     for c in conversations for seq, (role, text) in enumerate(turns, 1)]
)
for c in conversations:
    summarise_conversation.delay(str(c.pk))
print("seeded", len(conversations))
"""


def summarised(pg: str) -> int:
    with psycopg.connect(pg) as db:
        row = db.execute("SELECT count(*) FROM chat_conversation WHERE summary <> ''").fetchone()
    assert row is not None
    return int(row[0])


def clients(redis: Any) -> list[dict[str, Any]]:
    """Every normal client of the private Redis but the test's own connection."""
    return [c for c in redis.client_list(_type="normal") if c.get("name") != "loop-clients-test"]


@pytest.mark.timeout(900)
def test_a_celery_worker_holds_the_same_redis_connections_after_400_tier_calls(
    private_redis: Any, pg_database: str, tmp_path: Path
) -> None:
    with running_fake_openai(default=Behaviour(text=SUMMARY)) as upstream:
        env = {
            **os.environ,
            "DATABASE_URL": pg_database,
            "REDIS_URL": private_redis.url,
            "OPENAI_API_KEY": "upstream-key",
            "OPENAI_BASE_URL": upstream.base_url,
            "KEFU_CONTEXT_TURNS": "2",
            "KEFU_SUMMARY_MIN_TURNS": "1",
            # A client-side rate budget on the tier: every call asks Redis (the per-loop limiter).
            "KEFU_SIMPLE_RPM": "1000000",
            "PYTHONUNBUFFERED": "1",
        }
        env.pop("DJANGO_SETTINGS_MODULE", None)
        manage(env, "migrate", "--noinput")
        assert f"seeded {TASKS}" in manage(env, "shell", "-c", SEED)

        log = tmp_path / "worker.log"
        worker = celery_worker(env, log, loglevel="WARNING")
        redis = private_redis.client()
        redis.client_setname("loop-clients-test")
        try:

            def wait_for(done: int) -> None:
                deadline = time.monotonic() + 600
                while summarised(pg_database) < done:
                    assert time.monotonic() < deadline and worker.poll() is None, log.read_text()[-3000:]
                    time.sleep(0.5)

            wait_for(100)  # warmed up: the worker's broker and pool connections are all open
            after_100 = clients(redis)
            opened_100 = redis.info("stats")["total_connections_received"]
            wait_for(TASKS)
            after_all = clients(redis)
            opened_all = redis.info("stats")["total_connections_received"]
        finally:
            os.killpg(worker.pid, signal.SIGTERM)
            worker.wait(30)
        assert len(upstream.requests) >= TASKS  # every task called the tier
        assert private_redis.client().keys("kefu-tiers*")  # and asked the tier's rate budget in Redis
    names = Counter(str(c.get("name") or "(unnamed)") for c in after_all)
    counts = f"{len(after_100)} clients after 100 tasks, {len(after_all)} after {TASKS}: {dict(names)}"
    # Each task opened its own connections (the tier's rate budget on the task's event loop)...
    assert opened_all - opened_100 >= TASKS - 100, counts
    # ...and closed them: 300 more tasks left no connection open (before the fix: one more per task,
    # ~300; a leak of one connection in 150 tasks still fails here).
    assert len(after_all) <= len(after_100) + 2, counts
    assert len(after_all) <= 20, counts


def test_per_loop_objects_are_closed_when_their_loop_ends() -> None:
    closed: list[object] = []

    class Client:
        async def aclose(self) -> None:
            closed.append(self)

    clients = PerLoop(Client)

    async def use() -> object:
        return clients.get()

    made = [asyncio.run(use()) for _ in range(3)]
    assert closed == made  # each closed as its loop shut down (asyncio.run's shutdown_asyncgens)
    assert clients.live() == 0

    # A hand-made loop closed without the shutdown hook: its entry is dropped at the next ask.
    loop = asyncio.new_event_loop()
    loop.run_until_complete(use())
    loop.close()
    assert clients.live() == 1
    asyncio.run(use())
    assert clients.live() == 0


@pytest.mark.parametrize("purpose", ["upstream-blocks"])
def test_a_per_loop_redis_client_is_named_and_counted(purpose: str, private_redis: Any, settings: Any) -> None:
    from lib import metrics
    from routing.upstream import blocks

    settings.REDIS_URL = private_redis.url
    blocks._clients.clear()
    blocks.forget()
    seen: dict[str, int] = {}

    async def call() -> None:
        await blocks.blocked_for_s(("http://127.0.0.1:9/v1", "key", "fake-simple"))
        metrics.refresh_redis_connections()
        seen.update(metrics_value(purpose))
        named = [c for c in private_redis.client().client_list() if c.get("name") == f"kefu-{purpose}"]
        seen["server"] = len(named)

    asyncio.run(call())
    assert seen == {"gauge": 1, "server": 1}  # open while its loop runs
    metrics.refresh_redis_connections()
    assert metrics_value(purpose) == {"gauge": 0}  # closed with it
    deadline = time.monotonic() + 10
    while any(c.get("name") == f"kefu-{purpose}" for c in private_redis.client().client_list()):
        assert time.monotonic() < deadline
        time.sleep(0.05)


def metrics_value(purpose: str) -> dict[str, int]:
    from prometheus_client import REGISTRY

    value = REGISTRY.get_sample_value("kefu_redis_connections", {"purpose": purpose})
    return {"gauge": int(value or 0)}
