"""Retention and one shopper's data on request (chat/retention.py and its commands)."""

from __future__ import annotations

import json
import uuid
from datetime import timedelta
from decimal import Decimal
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils import timezone

from cache_layer.models import CacheAudit
from chat import retention
from chat.errors import NotFound
from chat.models import Conversation, ConversationStatus, InternalNote, Message, Role
from routing.models import UpstreamCall

pytestmark = pytest.mark.django_db


def conversation(*, days_idle: float, status: str = ConversationStatus.BOT, customer: str = "", texts=("hi",)):
    conv = Conversation.objects.create(token_hash="x" * 64, status=status, customer_id=customer)
    for seq, text in enumerate(texts, 1):
        Message.objects.create(conversation=conv, seq=seq, role=Role.SHOPPER if seq % 2 else Role.BOT, text=text)
    Conversation.objects.filter(pk=conv.pk).update(updated_at=timezone.now() - timedelta(days=days_idle))
    return conv


def test_conversations_idle_past_the_period_go_with_their_messages_and_notes(settings):
    settings.KEFU_RETENTION_DAYS = 30
    old = conversation(days_idle=40, texts=("my address is 12 Garden Road", "Thanks, noted."))
    InternalNote.objects.create(conversation=old, author_name="ana", text="called back")
    recent = conversation(days_idle=5)
    held = conversation(days_idle=90, status=ConversationStatus.AGENT)
    waiting = conversation(days_idle=90, status=ConversationStatus.WAITING_AGENT)
    shopper_message = Message.objects.get(conversation=old, seq=1)
    call = UpstreamCall.objects.create(
        conversation=old, message=shopper_message, tier="simple", cost_usd=Decimal("0.000364"), outcome="ok"
    )
    audit = CacheAudit.objects.create(
        message_id=shopper_message.pk, question="my address is 12 Garden Road", cached_question="q", verdict="same"
    )

    removed = retention.conversations_purge()

    assert removed == retention.Removed(conversations=1, messages=2, notes=1)
    assert set(Conversation.objects.values_list("pk", flat=True)) == {recent.pk, held.pk, waiting.pk}
    assert not Message.objects.filter(conversation_id=old.pk).exists()
    call.refresh_from_db()  # the ledger keeps the money, not the link
    assert call.cost_usd == Decimal("0.000364") and call.conversation_id is None and call.message_id is None
    audit.refresh_from_db()  # the audit keeps its verdict, not the shopper's words
    assert (audit.question, audit.message_id, audit.verdict) == ("", None, "same")


def test_a_dry_run_counts_and_deletes_nothing(settings):
    conversation(days_idle=40, texts=("a", "b", "c"))
    out = StringIO()
    call_command("purge_conversations", "--older-than-days", "30", "--dry-run", stdout=out)
    assert out.getvalue().strip() == "would delete 1 conversation idle over 30 days (3 messages, 0 notes)"
    assert Conversation.objects.count() == 1


def test_without_a_period_nothing_is_purged_and_the_command_says_why(settings):
    settings.KEFU_RETENTION_DAYS = 0
    conversation(days_idle=4000)
    assert retention.conversations_purge() == retention.Removed()
    with pytest.raises(CommandError, match="no retention period"):
        call_command("purge_conversations")
    assert Conversation.objects.count() == 1


def test_a_customers_data_is_exported_whole(tmp_path):
    first = conversation(days_idle=3, customer="cust-42", texts=("Where is my lamp?", "On its way."))
    second = conversation(days_idle=1, customer="cust-42", texts=("Thanks!",))
    conversation(days_idle=1, customer="someone-else", texts=("not theirs",))
    out = tmp_path / "export.json"

    call_command("shopper_data", "export", "--customer", "cust-42", "--out", str(out), stderr=StringIO())

    data = json.loads(out.read_text())
    assert data["customer_id"] == "cust-42"
    assert [c["id"] for c in data["conversations"]] == [str(first.pk), str(second.pk)]
    assert [m["text"] for m in data["conversations"][0]["messages"]] == ["Where is my lamp?", "On its way."]
    assert "not theirs" not in out.read_text()


def test_a_conversation_is_erased_on_request_and_nothing_else():
    gone = conversation(days_idle=1, texts=("my phone is 13800138000",))
    kept = conversation(days_idle=1)
    out = StringIO()
    call_command("shopper_data", "erase", "--conversation", str(gone.pk), "--yes", stdout=out)
    assert out.getvalue().strip() == "erased 1 conversation (1 message, 0 notes)"
    assert list(Conversation.objects.values_list("pk", flat=True)) == [kept.pk]


def test_an_unknown_shopper_is_an_error_not_an_empty_answer():
    with pytest.raises(NotFound):
        retention.shopper_export(customer_id="nobody")
    with pytest.raises(CommandError, match="no conversation of customer 'nobody'"):
        call_command("shopper_data", "erase", "--customer", "nobody", "--yes")
    with pytest.raises(CommandError, match="is not a UUID"):
        call_command("shopper_data", "export", "--conversation", "not-a-uuid")
    missing = uuid.uuid4()
    with pytest.raises(CommandError, match=f"no conversation of conversation {missing}"):
        call_command("shopper_data", "export", "--conversation", str(missing))


def test_erase_without_a_terminal_needs_yes(monkeypatch):
    conv = conversation(days_idle=1)
    monkeypatch.setattr("sys.stdin", StringIO())
    with pytest.raises(CommandError, match="pass --yes"):
        call_command("shopper_data", "erase", "--conversation", str(conv.pk))
    assert Conversation.objects.filter(pk=conv.pk).exists()
