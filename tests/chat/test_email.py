"""E-mail to a shopper who left (chat.mail, docs/email.md): an agent's reply e-mailed once per
burst, threaded, in the conversation's language, with a resume code that works once; nothing
while the shopper is connected; a refused send logged and counted, never failing the reply."""

from __future__ import annotations

import asyncio
import json
import re
import smtplib
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from channels.db import database_sync_to_async
from django.core import mail as outbox
from django.utils import timezone

from chat import mail, tasks
from chat.models import Conversation, EmailState, Message, OutgoingEmail

sys.path.insert(0, str(Path(__file__).resolve().parent))
import test_console
from test_console import held_by_alice

pytestmark = [pytest.mark.django_db(transaction=True)]

make_agent = test_console.make_agent  # the console tests' fixture: an agent console socket

CODE = re.compile(r"#kefu-resume=([\w-]+)")


@pytest.fixture(autouse=True)
def _prompt(settings: Any) -> None:
    # No waiting in unit tests: a burst is due when a test says so (due_now), and a shopper
    # counts as gone as soon as their socket closed.
    settings.KEFU_EMAIL_BURST_S = 3600.0
    settings.KEFU_EMAIL_OFFLINE_S = 0.0
    settings.KEFU_RESUME_URL = "https://shop.example/help"
    settings.KEFU_EMAIL_FROM = "Lantern & Loom <help@shop.example>"


@database_sync_to_async
def due_now() -> int:
    """Every pending e-mail falls due, and the sweep sends what it may; returns how many it claimed."""
    OutgoingEmail.objects.filter(state=EmailState.PENDING).update(due_at=timezone.now() - timedelta(seconds=1))
    return tasks.dispatch_due_emails()


@database_sync_to_async
def rows() -> list[tuple[str, int, int, str]]:
    return list(OutgoingEmail.objects.order_by("pk").values_list("kind", "first_seq", "last_seq", "state"))


async def reply(alice: Any, conversation: str, text: str, client_id: str) -> None:
    """Alice writes ``text``; returns once it is stored."""
    await alice.send({"type": "message", "conversation": conversation, "text": text, "client_id": client_id})
    stored = database_sync_to_async(Message.objects.filter(conversation_id=conversation, client_id=client_id).exists)
    async with asyncio.timeout(20):
        while not await stored():
            await asyncio.sleep(0.02)


async def left_an_address_and_closed_the_tab(make_client: Any, make_agent: Any, *, locale: str = "en") -> Any:
    ask = "我要找人工客服" if locale == "zh" else "can I talk to a human please"
    shopper, alice = await held_by_alice(make_client, make_agent, locale=locale, ask=ask)
    await shopper.send({"type": "contact", "email": "mei@example.com"})
    await shopper.until("contact.saved")
    await shopper.close()
    return shopper, alice


async def test_the_reply_to_a_shopper_who_left_is_emailed_threaded_in_their_language_with_a_code_that_works_once(
    make_client, make_agent, faq, client
):
    shopper, alice = await left_an_address_and_closed_the_tab(make_client, make_agent, locale="zh")
    await reply(alice, shopper.conversation, "您好，您的订单已经发出了。", "a1")
    await reply(alice, shopper.conversation, "单号是 SF123。", "a2")
    assert await due_now() == 1
    assert len(outbox.outbox) == 1
    sent = outbox.outbox[0]
    assert sent.to == ["mei@example.com"]
    assert sent.from_email == "Lantern & Loom <help@shop.example>"
    assert sent.subject == "您与Lantern & Loom的对话"
    root = f"<kefu.conversation.{shopper.conversation.replace('-', '')}@shop.example>"
    assert sent.extra_headers["In-Reply-To"] == root and sent.extra_headers["References"] == root
    assert sent.extra_headers["Message-ID"].endswith("@shop.example>")
    assert "您好，您的订单已经发出了。" in sent.body and "单号是 SF123。" in sent.body  # one e-mail, the burst
    assert "链接仅可使用一次" in sent.body
    assert shopper.token not in sent.body
    code = CODE.search(sent.body).group(1)
    assert "https://shop.example/help#kefu-resume=" + code in sent.body

    # The widget exchanges the code once for its conversation; the token it gets opens it.
    response = await database_sync_to_async(client.post)(
        "/api/chat/resume", json.dumps({"code": code}), content_type="application/json"
    )
    assert response.status_code == 200
    body = response.json()
    assert body["conversation"] == shopper.conversation and body["token"] != shopper.token
    again = await make_client()
    frame = await again.hello(conversation=body["conversation"], token=body["token"])
    assert frame["type"] == "conversation" and frame["id"] == shopper.conversation
    used = await database_sync_to_async(client.post)(
        "/api/chat/resume", json.dumps({"code": code}), content_type="application/json"
    )
    assert used.status_code == 403 and used.json()["error"]["code"] == "resume_invalid"
    bad = await database_sync_to_async(client.post)("/api/chat/resume", "{", content_type="application/json")
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid"

    # A later reply is a new e-mail of the same thread: same subject, answering the first.
    await again.close()
    await reply(alice, shopper.conversation, "还有别的问题吗？", "a3")
    assert await due_now() == 1
    second = outbox.outbox[1]
    assert second.subject == sent.subject
    assert second.extra_headers["In-Reply-To"] == sent.extra_headers["Message-ID"]
    assert second.extra_headers["References"] == f"{root} {sent.extra_headers['Message-ID']}"
    assert "单号是 SF123。" not in second.body and "还有别的问题吗？" in second.body
    assert await rows() == [("reply", 3, 4, "sent"), ("reply", 5, 5, "sent")]
    assert await due_now() == 0 and len(outbox.outbox) == 2  # each sent once


async def test_an_expired_code_does_not_open_the_conversation(make_client, make_agent, faq, client):
    shopper, alice = await left_an_address_and_closed_the_tab(make_client, make_agent)
    await reply(alice, shopper.conversation, "Your parcel left today.", "a1")
    await due_now()
    sent = outbox.outbox[0]
    assert sent.subject == "Your conversation with Lantern & Loom" and "Your parcel left today." in sent.body
    assert "the link works once" in sent.body
    from chat.models import ResumeCode

    await database_sync_to_async(ResumeCode.objects.update)(expires_at=timezone.now() - timedelta(seconds=1))
    response = await database_sync_to_async(client.post)(
        "/api/chat/resume", json.dumps({"code": CODE.search(sent.body).group(1)}), content_type="application/json"
    )
    assert response.status_code == 403


async def test_no_email_while_the_shopper_is_connected_nor_of_what_their_socket_showed(
    make_client, make_agent, faq, settings
):
    settings.KEFU_EMAIL_OFFLINE_S = 30.0
    shopper, alice = await held_by_alice(make_client, make_agent)
    await shopper.send({"type": "contact", "email": "mei@example.com"})
    await shopper.until("contact.saved")
    await reply(alice, shopper.conversation, "Seen live.", "a1")
    assert await due_now() == 1
    assert outbox.outbox == []
    assert (await rows())[0][3] == "pending"  # waits while the shopper is connected
    await shopper.close()
    settings.KEFU_EMAIL_OFFLINE_S = 0.0  # as if 30 s had passed
    await due_now()
    assert outbox.outbox == []  # the socket showed it: nothing to e-mail
    assert (await rows())[0][3] == "skipped"


async def test_a_refused_send_is_logged_without_the_address_and_tried_again_and_the_reply_still_arrives(
    make_client, make_agent, faq, monkeypatch, settings, caplog
):
    settings.KEFU_EMAIL_MAX_ATTEMPTS = 2

    def refuse(self: Any, messages: Any) -> int:
        raise smtplib.SMTPRecipientsRefused({"mei@example.com": (550, b"mailbox unavailable")})

    monkeypatch.setattr("django.core.mail.backends.locmem.EmailBackend.send_messages", refuse)
    shopper, alice = await left_an_address_and_closed_the_tab(make_client, make_agent)
    await reply(alice, shopper.conversation, "Your parcel left today.", "a1")  # stored and shown as usual
    before = mail.EMAILS.labels("reply", "failed")._value.get()
    await due_now()
    row = await database_sync_to_async(OutgoingEmail.objects.get)()
    assert row.state == "pending" and row.attempts == 1 and "SMTPRecipientsRefused" in row.error
    assert "mei@example.com" not in row.error and "mei@example.com" not in caplog.text
    await due_now()
    row = await database_sync_to_async(OutgoingEmail.objects.get)()
    assert row.state == "failed" and row.attempts == 2
    assert mail.EMAILS.labels("reply", "failed")._value.get() == before + 2
    now = timezone.now()
    counts = await database_sync_to_async(mail.email_counts)(start=now - timedelta(hours=1), end=now)
    assert counts == {"sent": 0, "refused": 1, "given_up": 1}


async def test_a_row_is_claimed_by_one_sender_only(make_client, make_agent, faq):
    shopper, alice = await left_an_address_and_closed_the_tab(make_client, make_agent)
    await reply(alice, shopper.conversation, "Hello again.", "a1")
    row = await database_sync_to_async(OutgoingEmail.objects.get)()
    await database_sync_to_async(OutgoingEmail.objects.update)(due_at=timezone.now())
    first = await database_sync_to_async(mail.email_claim)(row.pk)
    assert first == 1
    assert await database_sync_to_async(mail.email_claim)(row.pk) is None  # another worker: nothing
    assert (await database_sync_to_async(mail.email_send)(row.pk, first)).outcome == "sent"
    assert (await database_sync_to_async(mail.email_send)(row.pk, first)).outcome == "lost"  # a retry
    assert len(outbox.outbox) == 1


async def test_agents_get_one_digest_per_interval_while_conversations_wait_with_nobody_online(
    make_client, faq, settings
):
    settings.KEFU_DIGEST_AFTER_S = 600.0

    @database_sync_to_async
    def staff() -> None:
        test_console.make_user("alice", first_name="Alice").__class__.objects.filter(username="alice").update(
            email="alice@shop.example"
        )
        bob = test_console.make_user("bob", agent=False)  # staff, not an agent: not told
        bob.email = "bob@shop.example"
        bob.save()

    await staff()
    shopper = await make_client()
    await shopper.hello()
    await shopper.say("can I talk to a human please")
    await shopper.until("status")
    assert await due_now() == 0  # waiting, but not for 10 minutes yet
    await database_sync_to_async(Conversation.objects.filter(pk=shopper.conversation).update)(
        waiting_since=timezone.now() - timedelta(minutes=11)
    )
    assert await due_now() == 1
    assert await due_now() == 0  # one per interval, however often the sweep runs
    assert len(outbox.outbox) == 1
    digest = outbox.outbox[0]
    assert digest.to == ["alice@shop.example"]
    assert "1 conversation(s) waiting for a person" in digest.body and shopper.conversation in digest.body
    assert "waiting 11 min" in digest.body


# --- replies by e-mail (Mailgun's inbound route, django-anymail) ------------------------------------

SIGNING_KEY = "key-7f3a9c1e2b"


def mailgun_post(*, recipient: str, text: str, key: str = SIGNING_KEY, message_id: str = "<r1@mail.example>") -> dict:
    """A Mailgun inbound ``forward()`` post, fully parsed, as Mailgun documents it: the signature
    is HMAC-SHA256 of ``timestamp + token`` under the webhook signing key."""
    import hashlib
    import hmac
    import time as _time

    timestamp, token = str(int(_time.time())), "a8ce0edb2dd8301dee6c2405235584e45aa91d1e9f979f3de0"
    headers = [
        ["From", "Mei <mei@example.com>"],
        ["To", recipient],
        ["Subject", "Re: Your conversation with Lantern & Loom"],
        ["Message-Id", message_id],
    ]
    return {
        "recipient": recipient,
        "sender": "mei@example.com",
        "from": "Mei <mei@example.com>",
        "subject": "Re: Your conversation with Lantern & Loom",
        "body-plain": text,
        "message-headers": json.dumps(headers),
        "timestamp": timestamp,
        "token": token,
        "signature": hmac.new(key.encode(), f"{timestamp}{token}".encode(), hashlib.sha256).hexdigest(),
    }


async def test_an_emailed_reply_with_a_good_signature_is_the_shoppers_message_without_the_quote(
    make_client, make_agent, faq, settings
):
    from django.test import AsyncClient

    settings.KEFU_MAILGUN_WEBHOOK_SIGNING_KEY = SIGNING_KEY
    settings.KEFU_EMAIL_REPLY_TO = "reply@in.shop.example"
    shopper, alice = await left_an_address_and_closed_the_tab(make_client, make_agent)
    await reply(alice, shopper.conversation, "Which colour would you like?", "a1")
    await due_now()
    sent = outbox.outbox[0]
    (reply_to,) = sent.reply_to
    assert reply_to.startswith(f"reply+{shopper.conversation.replace('-', '')}.") and "@in.shop.example" in reply_to
    body = (
        "The blue one, please.\n\nMei\n-- \nMei Chen, Shanghai\n\n"
        "On Mon, 7 Dec 2026 at 10:00, Lantern & Loom <help@shop.example> wrote:\n> Which colour would you like?\n"
    )
    await alice.send({"type": "open", "conversation": shopper.conversation})  # Alice follows it
    await alice.until("history")
    web = AsyncClient()
    response = await web.post("/api/email/inbound/mailgun", mailgun_post(recipient=reply_to, text=body))
    assert response.status_code == 200
    again = await web.post("/api/email/inbound/mailgun", mailgun_post(recipient=reply_to, text=body))  # a retry
    assert again.status_code == 200
    msgs = await database_sync_to_async(
        lambda: list(Message.objects.filter(conversation_id=shopper.conversation).values_list("role", "text"))
    )()
    assert msgs[-1] == ("shopper", "The blue one, please.\n\nMei")  # once, no signature, no quote
    assert [t for r, t in msgs if r == "shopper"].count("The blue one, please.\n\nMei") == 1
    # Alice, who holds the conversation, sees it like any message of the shopper's.
    seen = (await alice.until("message", shopper.conversation, role="shopper"))[-1]
    assert seen["text"] == "The blue one, please.\n\nMei"


async def test_an_inbound_post_with_a_bad_signature_or_a_forged_address_stores_nothing(
    make_client, make_agent, faq, settings
):
    from django.test import AsyncClient

    settings.KEFU_MAILGUN_WEBHOOK_SIGNING_KEY = SIGNING_KEY
    settings.KEFU_EMAIL_REPLY_TO = "reply@in.shop.example"
    shopper, alice = await left_an_address_and_closed_the_tab(make_client, make_agent)
    before = await database_sync_to_async(Message.objects.filter(conversation_id=shopper.conversation).count)()
    web = AsyncClient()
    tagged = mail.inbound.reply_address(uuid_of(shopper.conversation))
    forged = mailgun_post(recipient=tagged, text="Cancel everything", key="not-the-key")
    assert (await web.post("/api/email/inbound/mailgun", forged)).status_code == 400
    wrong_tag = f"reply+{shopper.conversation.replace('-', '')}.{'0' * 20}@in.shop.example"
    assert (
        await web.post("/api/email/inbound/mailgun", mailgun_post(recipient=wrong_tag, text="hi"))
    ).status_code == 200
    after = await database_sync_to_async(Message.objects.filter(conversation_id=shopper.conversation).count)()
    assert after == before
    settings.KEFU_MAILGUN_WEBHOOK_SIGNING_KEY = ""
    assert (await web.post("/api/email/inbound/mailgun", mailgun_post(recipient=tagged, text="hi"))).status_code == 404


def uuid_of(conversation: str) -> Any:
    import uuid

    return uuid.UUID(conversation)


async def test_a_closed_conversations_transcript_is_emailed_on_request_once(make_client, make_agent, faq, client):
    shopper, alice = await held_by_alice(make_client, make_agent)
    await reply(alice, shopper.conversation, "Anything else?", "a1")
    await alice.send({"type": "close", "conversation": shopper.conversation})
    await shopper.until("status")

    def ask(email: object, token: str | None = None) -> Any:
        return client.post(
            "/api/chat/transcript",
            json.dumps({"email": email}),
            content_type="application/json",
            headers={"X-Kefu-Conversation": shopper.conversation, "X-Kefu-Token": token or shopper.token},
        )

    assert (await database_sync_to_async(ask)("mei@example.com", token="wrong")).status_code == 403
    bad = await database_sync_to_async(ask)("not an address")
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid"
    first = await database_sync_to_async(ask)("mei@example.com")
    assert first.status_code == 202 and first.json() == {"status": "queued"}
    assert (await database_sync_to_async(ask)("mei@example.com")).json() == {"status": "already_queued"}
    assert await due_now() == 1
    (sent,) = outbox.outbox
    assert sent.to == ["mei@example.com"] and sent.subject == "Your conversation with Lantern & Loom: the transcript"
    assert "You:\ncan I talk to a human please" in sent.body and "Alice:\nAnything else?" in sent.body
