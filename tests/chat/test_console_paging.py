"""The agent console on a busy day (issue 31 item 4; docs/console.md#paging): the list and a
conversation's history come in pages, and no frame the server sends is over the WebSocket size
limit, which the server sets explicitly (``KEFU_WS_MAX_MESSAGE_BYTES``).

Over a real socket: kefu served by Daphne in a subprocess on a SQLite file holding 10,000
conversations waiting for an agent and one conversation of 20,000 messages (bulk-loaded by
``tests/console_seed.py``). The console's client is the ``websockets`` client with its default
``max_size`` (1 MiB, the server's limit): a bigger frame would close the socket with 1009.
Before paging, the ``queue`` frame of 10,000 rows (~6 MB) closed every console right after
``ready``, and the 20,000-message ``history`` frame (~7 MB) could not be received at all.

Persona: ``alice`` (an agent).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import websockets

# Seeding 30,000 rows and starting Daphne take a minute or more on a loaded 2-core machine.
pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]
LIMIT = 1024 * 1024  # KEFU_WS_MAX_MESSAGE_BYTES' default, bytes
PAGE = 50  # KEFU_CONSOLE_PAGE's default
WAITING = 10_000
LONG = 20_000


def manage_shell(env: dict[str, str], code: str) -> str:
    return subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", code],
        cwd=ROOT,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout


def agent_cookie(env: dict[str, str]) -> str:
    """Create agent alice in the live server's database and sign her in: her session cookie."""
    out = manage_shell(
        env,
        "from django.contrib.auth.models import Permission, User\n"
        "from django.test import Client\n"
        "u = User.objects.create_user('alice', password='pw', is_staff=True, first_name='Alice')\n"
        "u.user_permissions.add(Permission.objects.get(codename='handle_conversations'))\n"
        "c = Client()\n"
        "c.force_login(User.objects.get(pk=u.pk))\n"
        "print('session', c.cookies['sessionid'].value)\n",
    )
    return [line.split()[1] for line in out.splitlines() if line.startswith("session ")][0]


def seed(env: dict[str, str], *, waiting: int, long_messages: int) -> dict[str, Any]:
    out = manage_shell(
        env, f"from tests.console_seed import seed\nseed(waiting={waiting}, long_messages={long_messages})\n"
    )
    return json.loads(out.strip().splitlines()[-1])


class Console:
    """Alice's console socket; every frame received is kept with its size in bytes."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self.sizes: list[tuple[str, int]] = []

    async def recv(self, timeout: float = 60) -> dict[str, Any]:
        raw = await asyncio.wait_for(self.ws.recv(), timeout)
        frame = json.loads(raw)
        self.sizes.append((frame["type"], len(raw.encode("utf-8") if isinstance(raw, str) else raw)))
        return frame

    async def until(self, kind: str) -> dict[str, Any]:
        while (f := await self.recv())["type"] != kind:
            pass
        return f

    async def send(self, frame: dict[str, Any]) -> None:
        await self.ws.send(json.dumps(frame))


@pytest.fixture
def busy_kefu(live_kefu: Any) -> Any:
    kefu = live_kefu()
    kefu.seeded = seed(kefu.env, waiting=WAITING, long_messages=LONG)
    kefu.cookie = agent_cookie(kefu.env)
    return kefu


def console(kefu: Any) -> Any:
    return websockets.connect(
        kefu.ws.replace("/ws/chat/", "/ws/agent/"),
        origin=kefu.base,
        additional_headers={"Cookie": f"sessionid={kefu.cookie}"},
        max_size=LIMIT,  # the websockets client's default, spelled out: the server's limit
    )


async def test_ten_thousand_waiting_the_console_gets_ready_and_pages_of_the_list(busy_kefu: Any) -> None:
    async with console(busy_kefu) as ws:
        alice = Console(ws)
        assert (await alice.recv())["type"] == "ready"
        queue = await alice.recv()
        assert queue["type"] == "queue"
        assert queue["counts"] == {
            "waiting_agent": WAITING,
            "agent": 0,
            "bot": 1,
            "open": WAITING + 1,
            "mine": 0,
            "closed": 0,
        }
        assert queue["page_size"] == PAGE
        waiting = [r for r in queue["conversations"] if r["status"] == "waiting_agent"]
        # The longest wait first: the seeded order.
        assert len(waiting) == PAGE
        assert waiting[0]["id"] == busy_kefu.seeded["first_waiting"]
        assert [r["last_message"]["text"].split(":")[0] for r in waiting] == [
            f"Waiting shopper {i}" for i in range(PAGE)
        ]
        assert [r["status"] for r in queue["conversations"] if r["status"] == "bot"] == ["bot"]
        assert queue["next"]["bot"] is None and queue["next"]["agent"] is None

        # The next pages, on request: in order, no row twice, none skipped.
        seen = [r["id"] for r in waiting]
        cursor = queue["next"]["waiting_agent"]
        for page in range(1, 4):
            await alice.send({"type": "queue.more", "status": "waiting_agent", "after": cursor})
            more = await alice.until("queue.page")
            assert more["status"] == "waiting_agent" and more["counts"]["waiting_agent"] == WAITING
            texts = [r["last_message"]["text"].split(":")[0] for r in more["conversations"]]
            assert texts == [f"Waiting shopper {i}" for i in range(page * PAGE, (page + 1) * PAGE)]
            seen += [r["id"] for r in more["conversations"]]
            cursor = more["next"]["waiting_agent"]
        assert len(set(seen)) == 4 * PAGE

        # A cursor the server did not make is refused with an error frame; the socket stays open.
        await alice.send({"type": "queue.more", "status": "waiting_agent", "after": "not-a-cursor"})
        err = await alice.until("error")
        assert err["code"] == "invalid"
        await alice.send({"type": "queue.more", "status": "waiting_agent", "after": cursor})
        assert len((await alice.until("queue.page"))["conversations"]) == PAGE

    assert max(size for _, size in alice.sizes) < LIMIT, alice.sizes


async def test_a_twenty_thousand_message_conversation_opens_newest_first_and_older_on_request(
    busy_kefu: Any,
) -> None:
    long_id = busy_kefu.seeded["long"]
    async with console(busy_kefu) as ws:
        alice = Console(ws)
        await alice.until("queue")
        await alice.send({"type": "open", "conversation": long_id})
        history = await alice.until("history")
        assert history["conversation"] == long_id
        assert [m["seq"] for m in history["messages"]] == list(range(LONG - PAGE + 1, LONG + 1))
        assert history["more"] is True and history["before"] == LONG - PAGE + 1
        assert history["info"]["id"] == long_id and history["notes"] == []

        # Older pages on request, each just before the last one.
        before = history["before"]
        for _ in range(3):
            await alice.send({"type": "history.more", "conversation": long_id, "before": before})
            page = await alice.until("history.page")
            assert page["conversation"] == long_id
            assert [m["seq"] for m in page["messages"]] == list(range(before - PAGE, before))
            assert page["more"] is True
            before = page["before"]

        # The first page of the conversation says it is the end.
        await alice.send({"type": "history.more", "conversation": long_id, "before": PAGE + 1})
        first = await alice.until("history.page")
        assert [m["seq"] for m in first["messages"]] == list(range(1, PAGE + 1))
        assert first["more"] is False and first["before"] == 1
        assert first["messages"][0]["role"] == "shopper" and first["messages"][1]["route"] == "faq"

        await alice.send({"type": "history.more", "conversation": long_id, "before": 0})
        assert (await alice.until("error"))["code"] == "invalid"

    assert max(size for _, size in alice.sizes) < LIMIT, alice.sizes


async def test_the_server_enforces_the_size_limit_it_is_given(live_kefu: Any) -> None:
    """``KEFU_WS_MAX_MESSAGE_BYTES`` is the server's own limit, not left to Daphne's default
    (1 MiB): at 64 KiB, a 70 KB message gets the close frame 1009 (message too big)."""
    kefu = live_kefu(env={"KEFU_WS_MAX_MESSAGE_BYTES": str(64 * 1024)})
    async with websockets.connect(kefu.ws, origin=kefu.base) as ws:
        await ws.send(json.dumps({"type": "hello"}))
        assert json.loads(await ws.recv())["type"] == "conversation"
        await ws.send(json.dumps({"type": "message", "client_id": "big", "text": "x" * 70_000}))
        with pytest.raises(websockets.ConnectionClosed) as closed:
            while True:
                await asyncio.wait_for(ws.recv(), 20)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1009
