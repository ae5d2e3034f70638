"""Readiness: a message that arrives while the router is still loading is stored and acknowledged
at once, the shopper is told (a ``notice`` frame), and it is answered once the router is ready —
never routed by a half-loaded model (which used to hand every such message to a person).
``/livez`` answers whatever ``/healthz`` says."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from channels.db import database_sync_to_async

from chat.models import Message
from routing import warmup
from routing.faq.registry import registry

SHIPPING_EN = "Orders ship within 1 business day and arrive in 2-4 business days."


@pytest.fixture
def starting(faq: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The router as ``router_start`` leaves it while the first FAQ model trains: started, not loaded."""
    monkeypatch.setattr(registry, "_poller", threading.Thread(target=lambda: None))
    monkeypatch.setattr(registry, "loaded", False)
    monkeypatch.setattr(registry, "error", "")
    monkeypatch.setattr(warmup, "_state", "ok")
    yield


@database_sync_to_async
def stored(conversation_id: str) -> list[tuple[str, str, str]]:
    return list(
        Message.objects.filter(conversation_id=conversation_id).order_by("seq").values_list("role", "route", "text")
    )


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_a_message_during_start_up_is_acknowledged_told_and_answered_once_ready(make_client, starting):
    shopper = await make_client()
    await shopper.hello()
    client_id = await shopper.say("how long does delivery take?")

    ack = await shopper.recv()
    assert ack["type"] == "message" and ack["client_id"] == client_id and ack["role"] == "shopper"
    notice = await shopper.recv()
    assert notice == {
        "type": "notice",
        "code": "starting",
        "message": "We're just starting up. Your message is saved and we'll answer it in a moment.",
    }
    assert await shopper.comm.receive_nothing(timeout=0.5)  # no answer from a half-loaded router
    assert await stored(shopper.conversation) == [("shopper", "", "how long does delivery take?")]

    registry.loaded = True  # the first model is in
    frames = await shopper.until("stream.end")
    assert [f["type"] for f in frames][0] == "stream.start"
    end = frames[-1]
    assert end["route"] == "faq" and end["text"].startswith(SHIPPING_EN)  # the FAQ, not a person
    rows = await stored(shopper.conversation)
    assert [(role, route) for role, route, _ in rows] == [("shopper", ""), ("bot", "faq")]


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_the_notice_speaks_the_conversations_language(make_client, starting):
    shopper = await make_client()
    await shopper.hello(locale="zh")
    await shopper.say("多久能送到？")
    frames = await shopper.until("notice")
    assert frames[-1]["message"] == "系统正在启动，您的消息已保存，稍后马上为您解答。"
    registry.loaded = True
    end = (await shopper.until("stream.end"))[-1]
    assert end["route"] == "faq" and end["text"] == "订单在一个工作日内发货，2到4个工作日送达。"


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_a_ready_router_sends_no_notice(make_client, faq):
    shopper = await make_client()
    await shopper.hello()
    await shopper.say("how long does delivery take?")
    frames = await shopper.until("stream.end")
    assert "notice" not in [f["type"] for f in frames]


def test_livez_is_200_while_healthz_says_the_router_is_loading(client, starting):
    live = client.get("/livez")
    assert live.status_code == 200 and live.json() == {"status": "ok"}
    registry.model = None
    health = client.get("/healthz")
    assert health.status_code == 503 and health.json()["faq_model"] == "loading"
