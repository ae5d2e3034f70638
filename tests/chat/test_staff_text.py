"""The router's and the handoff's own words reach agents in their language (issue 31 item 5,
chat/staff_text.py): stored once in English, translated on the way out to a Chinese console
(socket frames) and a Chinese transcript page. Personas: ``alice`` (an agent with a Chinese
browser), a shopper who asked for a person.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.utils import translation

from chat import staff_text
from chat.models import Conversation, Message

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_console import HOST, make_user, session_cookie

PACKET = {
    "rule": "asked_for_person",
    "reason": "shopper asked for a person",
    "route": "handoff",
    "matched": "human",
    "shopper_request": {"seq": 3, "text": "can I talk to a human"},
    "summary": "2 shopper message(s), 1 bot answer(s).\nFirst asked: “do you ship abroad?”",
    "facts": {
        "shopper": 2,
        "bot": 1,
        "first": "do you ship abroad?",
        "latest": "can I talk to a human",
        "routes": ["faq"],
    },
    "bot_told": [],
    "at": "2026-12-07T10:00:00+00:00",
}


def test_reasons_and_packets_in_chinese_and_english() -> None:
    with translation.override("zh-hans"):
        assert staff_text.reason_text("shopper asked for a person") == "顾客要求转人工"
        assert staff_text.reason_text("remote model failed: timeout") == "远程模型失败：timeout"
        assert staff_text.reason_text("Alice left the conversation") == "Alice 离开了对话"
        assert staff_text.reason_text("faq payment_methods p=0.94") == "faq payment_methods p=0.94"  # technical
        packet = staff_text.packet_for_staff(PACKET)
        assert packet is not None
        assert packet["reason"] == "顾客要求转人工" and packet["rule_text"] == "顾客要求转人工"
        assert packet["rule"] == "asked_for_person"  # the code stays
        assert packet["summary"].splitlines() == [
            "顾客消息 2 条，机器人回答 1 条。",
            "首次提问：“do you ship abroad?”",
            "最新：“can I talk to a human”",
            "机器人回答途径：faq。",
        ]
    with translation.override("en"):
        packet = staff_text.packet_for_staff(PACKET)
        assert packet is not None and packet["summary"].splitlines()[0] == "2 shopper message(s), 1 bot answer(s)."
    # A packet stored before ``facts`` keeps its English summary.
    old = {k: v for k, v in PACKET.items() if k != "facts"}
    with translation.override("zh-hans"):
        assert (staff_text.packet_for_staff(old) or {})["summary"] == PACKET["summary"]


def test_a_sockets_language_is_the_cookie_then_the_browser_then_english() -> None:
    def scope(cookie: str = "", accept: str = "") -> dict[str, Any]:
        headers = [(b"accept-language", accept.encode())] if accept else []
        return {"cookies": {"django_language": cookie} if cookie else {}, "headers": headers}

    assert staff_text.scope_language(scope(accept="zh-CN,zh;q=0.9,en;q=0.8")) == "zh-hans"
    assert staff_text.scope_language(scope(cookie="en", accept="zh-CN")) == "en"
    assert staff_text.scope_language(scope(accept="fr-FR")) == "en"
    assert staff_text.scope_language(scope(cookie="xx-bogus")) == "en"
    assert staff_text.scope_language({}) == "en"


def make_waiting_with_packet() -> str:
    """A conversation waiting for an agent with PACKET and a handoff answer whose reason is English."""
    c = Conversation.objects.create(
        token_hash="x" * 64, status="waiting_agent", last_seq=2, handoff_packet=PACKET, handoff_reason=PACKET["reason"]
    )
    Message.objects.create(conversation=c, seq=1, role="shopper", text="can I talk to a human")
    Message.objects.create(
        conversation=c, seq=2, role="bot", text="A person will reply.", route="handoff", route_reason=PACKET["reason"]
    )
    return str(c.pk)


waiting_with_packet = database_sync_to_async(make_waiting_with_packet)


@pytest.mark.django_db(transaction=True)
async def test_a_chinese_console_gets_the_packet_and_the_route_reasons_in_chinese() -> None:
    from config.asgi import application

    cid = await waiting_with_packet()
    user = await database_sync_to_async(make_user)("alice", first_name="Alice")
    cookie = await database_sync_to_async(session_cookie)(user)
    headers = [*HOST, (b"origin", b"http://127.0.0.1:8000"), (b"cookie", cookie), (b"accept-language", b"zh-CN,zh")]
    comm = WebsocketCommunicator(application, "/ws/agent/", headers=headers)
    connected, _ = await comm.connect()
    assert connected
    try:
        while (await comm.receive_json_from(timeout=20))["type"] != "queue":
            pass
        await comm.send_json_to({"type": "open", "conversation": cid})
        while (history := await comm.receive_json_from(timeout=20))["type"] != "history":
            pass
        packet = history["info"]["packet"]
        assert (packet["reason"], packet["rule_text"]) == ("顾客要求转人工", "顾客要求转人工")
        assert packet["summary"].startswith("顾客消息 2 条")
        assert [m.get("reason") for m in history["messages"]] == [None, "顾客要求转人工"]
    finally:
        await comm.disconnect()
    # Stored as it was: English, once.
    stored = await database_sync_to_async(lambda: Conversation.objects.get(pk=cid).handoff_packet)()
    assert stored["reason"] == "shopper asked for a person"


@pytest.mark.django_db
def test_the_transcript_page_shows_the_packet_in_the_agents_language(client: Any) -> None:
    cid = make_waiting_with_packet()
    client.force_login(make_user("alice", first_name="Alice"))
    page = client.get(f"/console/conversations/{cid}/", HTTP_ACCEPT_LANGUAGE="zh-CN").content.decode()
    assert "顾客要求转人工" in page and "顾客消息 2 条" in page
    assert "shopper asked for a person" not in page
