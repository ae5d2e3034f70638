"""Auto-assignment decided across two workers (issue 32): two real Daphne processes on PostgreSQL
and a private Redis, both sweeping every 0.2 s, assign twelve waiting conversations round-robin
to Alice (worker 1) and Bob (worker 2) under a limit of 3 while Carol (away, so never picked)
takes four of them over at the same moment. No conversation is auto-assigned twice, nobody's
open conversations exceed the limit, and a take-over wins over an assignment."""

from __future__ import annotations

import asyncio
import itertools
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest
import websockets

pytestmark = pytest.mark.asyncio

ROOT = Path(__file__).resolve().parents[2]

AGENTS = """
from django.contrib.auth.models import Permission, User
from django.test import Client
perm = Permission.objects.get(codename='handle_conversations')
for name in ('alice', 'bob', 'carol'):
    u = User.objects.create_user(name, password='pw', is_staff=True, first_name=name.title())
    u.user_permissions.add(perm)
    c = Client()
    c.force_login(User.objects.get(pk=u.pk))
    print('session', name, u.pk, c.cookies['sessionid'].value)
"""

WAITING = """
from datetime import timedelta
from django.utils import timezone
from chat.models import Conversation
now = timezone.now()
for i in range(12):
    c = Conversation.objects.create(token_hash='x' * 64, status='waiting_agent', last_seq=1,
                                    waiting_since=now + timedelta(milliseconds=i))
    print('conv', c.pk)
"""


def shell(env: dict[str, str], code: str) -> list[list[str]]:
    out = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", code],
        cwd=ROOT,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return [line.split() for line in out.splitlines() if line.startswith(("session ", "conv "))]


async def recv(ws: Any, timeout: float = 30) -> dict[str, Any]:
    return json.loads(await asyncio.wait_for(ws.recv(), timeout))


async def test_two_workers_never_assign_one_conversation_twice_nor_past_the_limit(
    live_kefu: Any, private_redis: Any, pg_database: str
) -> None:
    env = {
        "DATABASE_URL": pg_database,
        "REDIS_URL": private_redis.url,
        "KEFU_AUTO_ASSIGN": "1",
        "KEFU_ASSIGN_LIMIT": "3",
        "KEFU_AGENT_SWEEP_S": "0.2",
    }
    one = live_kefu(env=env)
    two = live_kefu(env=env, faq_path=None)
    agents = {row[1]: (int(row[2]), row[3]) for row in shell({**one.env, **env}, AGENTS)}

    def connect(server: Any, name: str) -> Any:
        return websockets.connect(
            server.ws.replace("/ws/chat/", "/ws/agent/"),
            origin=server.base,
            additional_headers={"Cookie": f"sessionid={agents[name][1]}"},
        )

    frames: list[dict[str, Any]] = []
    async with connect(one, "carol") as carol, connect(one, "alice") as alice, connect(two, "bob") as bob:
        for ws in (carol, alice, bob):
            assert (await recv(ws))["type"] == "ready"
        await carol.send(json.dumps({"type": "away", "away": True}))
        while True:  # her console hears that she is away
            f = await recv(carol)
            if f["type"] == "team" and any(a["away"] for a in f["agents"]):
                break

        convs = [row[1] for row in shell({**one.env, **env}, WAITING)]
        for cid in convs[:4]:  # at once, while both workers' sweeps assign
            await carol.send(json.dumps({"type": "take_over", "conversation": cid}))

        # Carol's console gets every assignment frame, from both workers (one Redis layer).
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                f = await recv(carol, timeout=2)
            except TimeoutError:
                f = {}
            if f.get("type") == "assignment":
                frames.append(f)
            with psycopg.connect(pg_database) as db:
                rows = db.execute(
                    "SELECT id::text, status, agent_id, assignee_id FROM chat_conversation ORDER BY waiting_since"
                ).fetchall()
            held = [r for r in rows if r[1] == "agent"]
            owned = {a: sum(1 for r in rows if r[3] == agents[a][0]) for a in ("alice", "bob")}
            if len(held) == 4 and owned == {"alice": 3, "bob": 3}:
                break
        else:
            pytest.fail(f"not settled: {rows}")

    # Carol holds and owns what she took over, whoever it had been assigned to meanwhile.
    assert sorted(r[0] for r in held) == sorted(convs[:4])
    assert all(r[2] == r[3] == agents["carol"][0] for r in held)
    # Alice and Bob: three each (the sweeps went on: one more would be there had the limit not
    # held), and two conversations wait Unassigned.
    assert sum(1 for r in rows if r[3] is None) == 2
    auto = [f for f in frames if f["reason"] == "auto"]
    per_conversation: dict[str, int] = {}
    for f in auto:
        per_conversation[f["conversation"]] = per_conversation.get(f["conversation"], 0) + 1
    assert max(per_conversation.values()) == 1, per_conversation  # never assigned twice
    # Round-robin: the first automatic assignments alternate between the two.
    names = [f["assignee"]["name"] for f in auto]
    assert all(a != b for a, b in itertools.pairwise(names[:4])), names
