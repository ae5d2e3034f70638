"""Labels and canned replies over the console's socket (issue 32; docs/protocol.md): the
``queue`` rows carry their labels, a label set by one agent reaches every console as
``conversation.update`` with ``labels``, and ``ready`` lists the shared replies and the agent's
own, never another agent's. WebsocketCommunicator on the real ASGI application (SQLite,
in-memory channel layer), as tests/chat/test_console.py. Personas: ``alice``, ``bob`` (agents)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from channels.db import database_sync_to_async
from django.test import Client

from chat.models import CannedReply, Conversation, ConversationLabel, Label, Message

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_console import make_agent, make_user  # noqa: F401 (make_agent: a fixture)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


@database_sync_to_async
def seed() -> tuple[str, int, int]:
    refund = Label.objects.create(name="Refund", color="#d97706")
    vip = Label.objects.create(name="VIP", color="#2563eb")
    c = Conversation.objects.create(token_hash="x" * 64, status="waiting_agent", last_seq=1)
    Message.objects.create(conversation=c, seq=1, role="shopper", text="refund please")
    ConversationLabel.objects.create(conversation=c, label=vip)
    bob = make_user("bob", first_name="Bob")
    CannedReply.objects.create(title="Shared", text="Hello", shortcut="hi")
    CannedReply.objects.create(title="Bob's own", text="Bye", shortcut="bye", owner=bob)
    return str(c.pk), refund.pk, vip.pk


@database_sync_to_async
def set_label(username: str, cid: str, label: int, on: bool) -> Any:
    client = Client()
    client.force_login(make_user(username))
    return client.post(
        f"/console/api/conversations/{cid}/labels",
        data=json.dumps({"label": label, "on": on}),
        content_type="application/json",
    )


async def test_a_label_reaches_every_console_and_rows_carry_labels(make_agent: Any) -> None:  # noqa: F811
    cid, refund, vip = await seed()
    alice = await make_agent("alice", "Alice")
    bob = await make_agent("bob", "Bob")
    (row,) = [r for r in bob.queue["conversations"] if r["id"] == cid]
    assert row["labels"] == [vip]
    assert {c["title"] for c in alice.ready["canned"]} == {"Shared"}
    assert {c["title"]: c["shared"] for c in bob.ready["canned"]} == {"Shared": True, "Bob's own": False}

    response = await set_label("alice", cid, refund, True)
    assert response.status_code == 200
    for sock in (alice, bob):
        frames = await sock.until("conversation.update", cid)
        assert frames[-1]["labels"] == sorted([refund, vip])
