"""A Celery worker killed (SIGKILL) in the middle of a task loses nothing (issue: faults): the task
was acknowledged only when done (late acks), so a second worker gets it once the visibility
timeout passed and the summary is stored, paid for by the one call that completed. Real worker
processes on a private Redis and PostgreSQL; the upstream is the project's test server."""

from __future__ import annotations

import os
import signal
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg

from tests.processes import celery_worker as worker
from tests.processes import manage

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
from fake_openai import Behaviour, running_fake_openai  # noqa: E402

SUMMARY = "The shopper asked whether the oak side table is solid wood; it is solid oak."
TURNS = [
    ("shopper", "Is the oak side table solid wood?"),
    ("bot", "Yes, solid oak."),
    ("shopper", "Is the linen sofa cover machine washable?"),
    ("bot", "Yes, at 30 degrees."),
    ("shopper", "Does the walnut floor lamp come with a dimmer switch?"),
    ("bot", "Yes, an inline dimmer."),
]


def summary_of(pg: str, conversation: str) -> tuple[str, int]:
    with psycopg.connect(pg) as db:
        row = db.execute(
            "SELECT summary, summary_upto_seq FROM chat_conversation WHERE id = %s", (uuid.UUID(conversation),)
        ).fetchone()
    assert row is not None
    return str(row[0]), int(row[1])


def test_a_task_of_a_killed_worker_is_run_by_the_next_one(private_redis: Any, pg_database: str, tmp_path: Path) -> None:
    with running_fake_openai(default=Behaviour(hang_before_headers_ms=60_000)) as upstream:
        env = {
            **os.environ,
            "DATABASE_URL": pg_database,
            "REDIS_URL": private_redis.url,
            "OPENAI_API_KEY": "upstream-key",
            "OPENAI_BASE_URL": upstream.base_url,
            "KEFU_CONTEXT_TURNS": "2",
            "KEFU_SUMMARY_MIN_TURNS": "1",
            "KEFU_LLM_FIRST_TOKEN_TIMEOUT_S": "4",
            "KEFU_CELERY_TASK_TIME_LIMIT_S": "10",
            "KEFU_CELERY_VISIBILITY_TIMEOUT_S": "11",
            "PYTHONUNBUFFERED": "1",
        }
        env.pop("DJANGO_SETTINGS_MODULE", None)
        manage(env, "migrate", "--noinput")
        rows = ",".join(f"({role!r}, {text!r})" for role, text in TURNS)
        conversation = manage(
            env,
            "shell",
            "-c",
            "from chat.models import Conversation, Message\n"
            "c = Conversation.objects.create(token_hash='2' * 64)\n"
            f"for seq, (role, text) in enumerate([{rows}], 1):\n"
            "    Message.objects.create(conversation=c, seq=seq, role=role, text=text, state='done')\n"
            "from chat.tasks import summarise_conversation\n"
            "summarise_conversation.delay(str(c.pk))\n"
            "print('conversation', c.pk)\n",
        )
        conversation = [line.split()[1] for line in conversation.splitlines() if line.startswith("conversation ")][0]

        first = worker(env, tmp_path / "worker-1.log")
        try:
            deadline = time.monotonic() + 60
            while not upstream.requests:  # the task runs: its summary call hangs upstream
                assert time.monotonic() < deadline and first.poll() is None, (tmp_path / "worker-1.log").read_text()
                time.sleep(0.1)
        finally:
            os.killpg(first.pid, signal.SIGKILL)
            first.wait(10)
        upstream.default = Behaviour(text=SUMMARY)

        second = worker(env, tmp_path / "worker-2.log")
        try:
            deadline = time.monotonic() + 90
            while summary_of(pg_database, conversation)[0] != SUMMARY:
                assert time.monotonic() < deadline and second.poll() is None, (tmp_path / "worker-2.log").read_text()
                time.sleep(0.3)
        finally:
            second.terminate()
            second.wait(20)
    assert summary_of(pg_database, conversation) == (SUMMARY, 2)  # the first turn left the window of 2
    # the hung call (killed with its worker) and the one that completed
    assert len(upstream.requests) == 2
