"""Stored conversations and their messages. Nothing a shopper sends is ever lost: every shopper
message is a row before any answering starts (see ``chat.services.message_receive``)."""
from __future__ import annotations

import uuid

from django.db import models


class ConversationStatus(models.TextChoices):
    BOT = "bot", "Bot answers"
    WAITING_AGENT = "waiting_agent", "Waiting for an agent"
    AGENT = "agent", "Agent"
    CLOSED = "closed", "Closed"


class Role(models.TextChoices):
    SHOPPER = "shopper", "Shopper"
    BOT = "bot", "Bot"
    AGENT = "agent", "Agent"
    SYSTEM = "system", "System"


class Route(models.TextChoices):
    CACHE_EXACT = "cache.exact"
    CACHE_SEMANTIC = "cache.semantic"
    FAQ = "faq"
    LLM_SIMPLE = "llm.simple"
    LLM_MEDIUM = "llm.medium"
    LLM_COMPLEX = "llm.complex"
    DECLINE = "decline"
    HANDOFF = "handoff"


class Conversation(models.Model):
    """One shopper's chat. The shopper proves ownership with a bearer token; only its SHA-256
    is stored (``token_hash``), so a database leak does not leak live tokens."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    token_hash = models.CharField(max_length=64)
    status = models.CharField(max_length=16, choices=ConversationStatus.choices, default=ConversationStatus.BOT)
    locale = models.CharField(max_length=8, default="en")
    # Highest seq handed out; seqs are allocated under a row lock (see services._next_seq).
    last_seq = models.PositiveIntegerField(default=0)
    # Highest shopper seq the bot has answered or deliberately skipped (agent held the chat).
    answered_seq = models.PositiveIntegerField(default=0)
    # Fencing counter: bumped on every change of owner (take-over, hand-back, close). A bot
    # stream started under epoch N stops at the first chunk after the epoch moves on.
    owner_epoch = models.PositiveIntegerField(default=0)
    agent_name = models.CharField(max_length=150, blank=True)
    handoff_reason = models.CharField(max_length=200, blank=True)
    summary = models.TextField(blank=True, help_text="Rolling summary of turns older than the prompt window.")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        indexes = [models.Index(fields=["status", "updated_at"])]

    def __str__(self) -> str:
        return f"{self.id} ({self.status})"


class MessageState(models.TextChoices):
    DONE = "done"
    STREAMING = "streaming"


class Message(models.Model):
    """A stored message. ``seq`` orders messages within a conversation (1, 2, 3...).

    Bot messages also record how they were answered: ``route``, ``model``, token counts
    (``prompt_tokens``/``completion_tokens``, from the API's usage or estimated), ``cost_usd``
    and ``saved_usd`` (USD, 6 decimals), ``ttft_ms`` (time to first token) and ``latency_ms``
    (time to the end of the answer), both measured from the shopper's message being stored.
    """

    conversation = models.ForeignKey(Conversation, on_delete=models.CASCADE, related_name="messages")
    seq = models.PositiveIntegerField()
    role = models.CharField(max_length=8, choices=Role.choices)
    text = models.TextField(blank=True)
    client_id = models.CharField(max_length=64, null=True, blank=True)
    state = models.CharField(max_length=10, choices=MessageState.choices, default=MessageState.DONE)
    route = models.CharField(max_length=16, choices=Route.choices, blank=True)
    model = models.CharField(max_length=100, blank=True)
    prompt_tokens = models.PositiveIntegerField(default=0)
    completion_tokens = models.PositiveIntegerField(default=0)
    cost_usd = models.DecimalField(max_digits=12, decimal_places=6, default=0)
    saved_usd = models.DecimalField(max_digits=12, decimal_places=6, default=0)
    ttft_ms = models.FloatField(null=True, blank=True)
    latency_ms = models.FloatField(null=True, blank=True)
    usage_estimated = models.BooleanField(default=False)
    cut = models.BooleanField(default=False, help_text="The answer stopped before its end.")
    faq_entry_id = models.BigIntegerField(null=True, blank=True)
    reply_to_seq = models.PositiveIntegerField(null=True, blank=True)
    rating = models.CharField(max_length=4, blank=True)
    agent_name = models.CharField(max_length=150, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["conversation", "seq"]
        constraints = [
            models.UniqueConstraint(fields=["conversation", "seq"], name="message_unique_seq"),
            models.UniqueConstraint(
                fields=["conversation", "client_id"],
                condition=models.Q(client_id__isnull=False),
                name="message_unique_client_id",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.conversation_id}#{self.seq} {self.role}: {self.text[:40]}"
