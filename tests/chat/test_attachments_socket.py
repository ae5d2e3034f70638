"""Attachments in the conversation (issue 33): a shopper's ``message`` frame naming uploaded files,
the stored and replayed frames with freshly signed links, foreign and reused ids refused, and the
bot's answer to a photo alone (never asked of the router)."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from channels.db import database_sync_to_async
from django.test import AsyncClient

from chat import answering, attachments, selectors
from chat.models import Attachment, Message
from tests.chat import attachment_files as files

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


async def upload(shopper: Any, data: bytes | None = None, name: str = "photo.jpg") -> dict[str, Any]:
    from django.core.files.uploadedfile import SimpleUploadedFile

    response = await AsyncClient().post(
        "/api/chat/attachments",
        {"file": SimpleUploadedFile(name, data or files.image_bytes("JPEG"))},
        headers={"X-Kefu-Conversation": shopper.conversation, "X-Kefu-Token": shopper.token},
    )
    assert response.status_code == 201, response.content
    return response.json()


async def send(shopper: Any, ids: list[str], text: str = "") -> str:
    client_id = str(uuid.uuid4())
    await shopper.send({"type": "message", "client_id": client_id, "text": text, "attachments": ids})
    return client_id


@database_sync_to_async
def stored(conversation_id: str) -> list[Message]:
    return list(Message.objects.filter(conversation_id=conversation_id).order_by("seq"))


def signed_id(url: str) -> str:
    return attachments.link_open(url.rsplit("/", 1)[1])


async def test_a_photo_alone_is_stored_linked_and_acknowledged_without_the_router(make_client, faq, monkeypatch):
    async def no_router(**kwargs: Any) -> Any:
        raise AssertionError("a file-only message must never reach the router")

    monkeypatch.setattr(answering.router, "answer_open", no_router)
    shopper = await make_client()
    await shopper.hello()
    sent = await upload(shopper)
    client_id = await send(shopper, [sent["id"]])
    frames = await shopper.until("stream.end")
    ack, end = frames[0], frames[-1]
    assert ack["type"] == "message" and ack["client_id"] == client_id and ack["text"] == ""
    [info] = ack["attachments"]
    assert {k: info[k] for k in ("id", "name", "content_type", "size")} == {
        k: sent[k] for k in ("id", "name", "content_type", "size")
    }
    assert signed_id(info["url"]) == sent["id"]
    assert end["route"] == "decline" and end["model"] is None
    assert "What can we help you with" in end["text"]
    rows = await stored(shopper.conversation)
    assert rows[0].attachments == [{k: sent[k] for k in ("id", "name", "content_type", "size")}]
    assert (await database_sync_to_async(Attachment.objects.get)(pk=sent["id"])).message_id == rows[0].pk


async def test_a_photo_about_a_named_order_goes_to_a_person(make_client, faq):
    shopper = await make_client()
    await shopper.hello()
    await shopper.say("my lamp from order KF-1001 arrived broken")
    await shopper.until("stream.end")
    sent = await upload(shopper)
    await send(shopper, [sent["id"]])
    frames = await shopper.until("stream.end")
    assert frames[-1]["route"] == "handoff"
    assert "passing it to a person" in frames[-1]["text"]
    status = [f for f in await shopper.until("status") if f["type"] == "status"]
    assert status[-1]["status"] == "waiting_agent"


async def test_text_with_a_photo_is_answered_as_text(make_client, faq):
    shopper = await make_client()
    await shopper.hello()
    sent = await upload(shopper, files.image_bytes("PNG"), "r.png")
    await send(shopper, [sent["id"]], text="how many days do I have to send an item back?")
    end = (await shopper.until("stream.end"))[-1]
    assert end["route"] == "faq" and "return unused items" in end["text"]


async def test_a_foreign_or_reused_attachment_is_forbidden_and_nothing_is_stored(make_client, faq):
    shopper = await make_client()
    await shopper.hello()
    other = await make_client()
    await other.hello()
    theirs = await upload(other)
    client_id = await send(shopper, [theirs["id"]], text="look")
    error = await shopper.recv()
    assert (error["type"], error["code"], error["client_id"]) == ("error", "forbidden", client_id)
    assert await stored(shopper.conversation) == []

    mine = await upload(shopper)
    await send(shopper, [mine["id"]], text="first")
    await shopper.until("stream.end")
    again = await send(shopper, [mine["id"]], text="again")
    error = await shopper.recv()
    assert (error["type"], error["code"], error["client_id"]) == ("error", "forbidden", again)
    assert [m.text for m in await stored(shopper.conversation) if m.role == "shopper"] == ["first"]
    unknown = await send(shopper, ["0" * 32])
    assert (await shopper.recv())["code"] == "forbidden" and unknown


async def test_a_resend_of_a_message_with_files_is_acknowledged_again(make_client, faq):
    shopper = await make_client()
    await shopper.hello()
    sent = await upload(shopper)
    client_id = str(uuid.uuid4())
    frame = {"type": "message", "client_id": client_id, "text": "see", "attachments": [sent["id"]]}
    await shopper.send(frame)
    await shopper.until("stream.end")
    await shopper.send(frame)
    ack = await shopper.recv()
    assert ack["type"] == "message" and ack["client_id"] == client_id and ack["attachments"][0]["id"] == sent["id"]
    assert len([m for m in await stored(shopper.conversation) if m.role == "shopper"]) == 1


async def test_replay_and_console_history_carry_freshly_signed_links(make_client, faq, monkeypatch):
    shopper = await make_client()
    await shopper.hello()
    sent = await upload(shopper)
    await send(shopper, [sent["id"]])
    first = (await shopper.until("stream.end"))[0]["attachments"][0]["url"]

    now = [10_000_000.0]
    monkeypatch.setattr(attachments.time, "time", lambda: now[0])
    again = await make_client()
    await again.hello(conversation=shopper.conversation, token=shopper.token, after=0)
    replayed = await again.recv()
    assert replayed["type"] == "message" and replayed["seq"] == 1
    url = replayed["attachments"][0]["url"]
    assert url != first and attachments.link_open(url.rsplit("/", 1)[1], now=now[0] + 599) == sent["id"]

    page = await database_sync_to_async(selectors.console_history)(
        conversation_id=uuid.UUID(shopper.conversation), before=None, limit=50
    )
    assert page is not None
    [item] = [m for m in page["messages"] if m.get("attachments")]
    assert item["attachments"][0]["id"] == sent["id"] and signed_id(item["attachments"][0]["url"]) == sent["id"]


async def test_bad_attachments_fields_are_invalid(make_client, faq):
    shopper = await make_client()
    await shopper.hello()
    for bad in ("abc", [1], ["x"] * 11):
        await shopper.send({"type": "message", "client_id": "c1", "text": "hi", "attachments": bad})
        assert (await shopper.recv())["code"] == "invalid"
    await shopper.send({"type": "message", "client_id": "c2", "text": "", "attachments": []})
    assert (await shopper.recv())["code"] == "invalid"  # no text and no file
