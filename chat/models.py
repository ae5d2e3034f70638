"""Stored conversations and their messages. Nothing a shopper sends is ever lost: every shopper
message is a row before any answering starts (see ``chat.services.message_receive``)."""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models
from django.db.models.functions import Lower
from django.utils.translation import gettext_lazy as _


# The labels are the staff pages' words (translated: locale/); the values are what is stored.
class ConversationStatus(models.TextChoices):
    BOT = "bot", _("Bot answers")
    WAITING_AGENT = "waiting_agent", _("Waiting for an agent")
    AGENT = "agent", _("Agent")
    CLOSED = "closed", _("Closed")


class Role(models.TextChoices):
    SHOPPER = "shopper", _("Shopper")
    BOT = "bot", _("Bot")
    AGENT = "agent", _("Agent")
    SYSTEM = "system", _("System")


class Route(models.TextChoices):
    CACHE_EXACT = "cache.exact"
    CACHE_SEMANTIC = "cache.semantic"
    FAQ = "faq"
    ACTION = "action"  # the store's data in a template (routing.orders.actions), no model call
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
    # The shopper's time zone as the widget reported it when the conversation started (an IANA
    # name such as "Asia/Shanghai"; "" when unknown): names an anonymous visitor in the inbox.
    time_zone = models.CharField(max_length=64, blank=True, default="")
    # Highest seq handed out; seqs are allocated under a row lock (see services.conversations.next_seq).
    last_seq = models.PositiveIntegerField(default=0)
    # Highest shopper seq the bot has answered or deliberately skipped (agent held the chat).
    answered_seq = models.PositiveIntegerField(default=0)
    # The claim on shopper message ``answered_seq`` until its answer's row exists: a process that
    # dies in between (kill -9 right after the claim) leaves it to run out, and a live process's
    # sweep answers the message (chat.sweeper). None: no claim waiting for its answer.
    claim_until = models.DateTimeField(null=True, blank=True)
    # Fencing counter: bumped on every change of owner (take-over, hand-back, close). A bot
    # stream started under epoch N stops at the first chunk after the epoch moves on.
    owner_epoch = models.PositiveIntegerField(default=0)
    agent_name = models.CharField(max_length=150, blank=True)
    # The agent holding the conversation (status ``agent``); null otherwise.
    agent = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # The conversation's assignee (issue 32): the agent who owns it, which is not a take-over (the
    # conversation keeps waiting and the bot keeps helping until the assignee takes it over).
    # Set by an assignment (manual, transfer, "assign to me", round-robin: chat.assignment) and by
    # a take-over; cleared when the assignee goes away or their lease runs out. Null: Unassigned.
    assignee = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    assignee_name = models.CharField(max_length=150, blank=True)
    handoff_reason = models.CharField(max_length=200, blank=True)
    # When it entered the agents' queue (status ``waiting_agent``); the console lists the longest wait first.
    waiting_since = models.DateTimeField(null=True, blank=True)
    # When an agent last took it over from the queue: the queue's recent take-over rate, which
    # estimates a waiting shopper's wait (chat.availability).
    queue_taken_at = models.DateTimeField(null=True, blank=True, db_index=True)
    # An address the shopper left (the widget offers the form while no agent is online), for an
    # agent to reply to later; shown in the console. "" when none.
    contact_email = models.EmailField(max_length=254, blank=True)
    # Customer satisfaction, asked by the widget when the conversation closes: 1 (very
    # unsatisfied) to 5 (very satisfied), the latest answer wins; None: not given.
    csat_score = models.PositiveSmallIntegerField(null=True, blank=True)
    csat_comment = models.CharField(max_length=500, blank=True)
    csat_at = models.DateTimeField(null=True, blank=True)
    # The store's customer, when a signed identity token said who the shopper is (chat.identity):
    # their id in the store's system, and the name and e-mail the store sent, shown to agents.
    # "" for an anonymous shopper. A verified customer's conversations are theirs on any device.
    customer_id = models.CharField(max_length=255, blank=True, db_index=True)
    customer_name = models.CharField(max_length=150, blank=True)
    customer_email = models.CharField(max_length=254, blank=True)
    identity_verified_at = models.DateTimeField(null=True, blank=True)
    # A keyed hash of the network the conversation was started from (chat.identity.address_key:
    # the IPv4 address, an IPv6 /64): an anonymous shopper's spend budget is per conversation and
    # per address (routing.upstream.budgets), so a new conversation does not start a new budget. The
    # address itself is never stored.
    address_key = models.CharField(max_length=32, blank=True)
    # The escalation packet shown to agents (shape: chat.handoff.Packet): why, a summary, what the bot said.
    handoff_packet = models.JSONField(default=dict, blank=True)
    summary = models.TextField(blank=True, help_text="Rolling summary of turns older than the prompt window.")
    # The seq of the last message the summary covers (0: none); chat.summary.conversation_summarise.
    summary_upto_seq = models.PositiveIntegerField(default=0)
    # The current session holds the messages after this seq. A shopper message to a closed
    # conversation, or after KEFU_SESSION_IDLE_S without activity, starts a new session: the prompt,
    # the follow-up context, the summary and the handoff packet see only the current session
    # (services.conversations.next_seq); the transcript keeps everything.
    session_from_seq = models.PositiveIntegerField(default=0)
    # The shopper's last complaint about an answer (routing.decide.repeat): a thumbs-down
    # (``complaint_kind`` "down") or a "that's not what I asked" ("phrase"). ``complaint_at_seq``:
    # the conversation's last seq when it was made (0: none); ``complaint_question``: the question
    # the missed answer replied to. The same question asked again within
    # ``KEFU_REPEAT_TURNS`` turns hands off. Read with the answering claim (no extra query).
    complaint_at_seq = models.PositiveIntegerField(default=0)
    complaint_kind = models.CharField(max_length=8, blank=True)
    complaint_question = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        indexes = [
            models.Index(fields=["status", "updated_at"]),
            # Ops re-rolls the outcomes of conversations scored since its last run (ops.rollup).
            models.Index(fields=["csat_at"], condition=models.Q(csat_at__isnull=False), name="conversation_csat_at"),
            # Staff search finds a conversation by the shopper's e-mail, in any case (chat.search).
            models.Index(Lower("contact_email"), name="conversation_contact_email"),
            models.Index(Lower("customer_email"), name="conversation_customer_email"),
        ]
        permissions = [("handle_conversations", "Can answer shoppers in the agent console")]

    def __str__(self) -> str:
        return f"{self.id} ({self.status})"


class MessageState(models.TextChoices):
    DONE = "done"
    STREAMING = "streaming"


class Message(models.Model):
    """A stored message. ``seq`` orders messages within a conversation (1, 2, 3...).

    Bot messages also record how they were answered: ``route``, ``model`` (and ``variant``: the
    tier's own model or its canary candidate), token counts
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
    # Which deployment of its tier gave a remote answer: "current" (the tier's own model) or
    # "candidate" (the tier's canary candidate, routing.upstream.canary); "" for answers no model gave.
    # Ops compares the two (ratings, cuts, handoffs) per answer.
    variant = models.CharField(max_length=10, blank=True)
    prompt_tokens = models.PositiveIntegerField(default=0)
    completion_tokens = models.PositiveIntegerField(default=0)
    cost_usd = models.DecimalField(max_digits=12, decimal_places=6, default=0)
    saved_usd = models.DecimalField(max_digits=12, decimal_places=6, default=0)
    ttft_ms = models.FloatField(null=True, blank=True)
    latency_ms = models.FloatField(null=True, blank=True)
    usage_estimated = models.BooleanField(default=False)
    cut = models.BooleanField(default=False, help_text="The answer stopped before its end.")
    # A bot answer dropped before any of its text was shown because the shopper went on typing:
    # the next answer replies to all the fragments (chat.answering, burst debounce). Stored (its
    # seq keeps the conversation's seqs dense) with empty text; clients show nothing for it.
    superseded = models.BooleanField(default=False)
    faq_entry_id = models.BigIntegerField(null=True, blank=True)
    # Why the router chose the route, in its own words ("faq track_order p=0.93", "remote model,
    # rule refund_dispute"...): shown to agents in the transcript and the console, never to the
    # shopper.
    route_reason = models.CharField(max_length=200, blank=True)
    # The CachedAnswer a ``cache.*`` answer was served from. Not a foreign key: entries expire and
    # are evicted (an agent marking one wrong), and the message keeps the id it was served from.
    cache_entry_id = models.BigIntegerField(null=True, blank=True)
    reply_to_seq = models.PositiveIntegerField(null=True, blank=True)
    rating = models.CharField(max_length=4, blank=True)
    # When the shopper last rated it: Ops re-rolls the hours a late rating changes (ops.rollup).
    rated_at = models.DateTimeField(null=True, blank=True)
    # Signals about a shopper message, for agents: "prompt_injection" when it tried to override
    # the assistant's instructions (routing.decide.injection). Empty for nearly every message.
    flags = models.JSONField(default=list, blank=True)
    agent_name = models.CharField(max_length=150, blank=True)
    # A streaming bot answer's lease: the process streaming it renews it while it streams
    # (chat.answering); once it ran out, the process is taken for dead and the answer is an
    # orphan for any live process's sweep to finish (chat.sweeper). None: not streaming.
    lease_until = models.DateTimeField(null=True, blank=True)
    # Staff search's index keys of ``text`` (lib.search_terms.index_terms, space-separated),
    # computed in Python when the text is written: indexed by GIN on PostgreSQL and FTS5 on
    # SQLite (chat.search.index_ensure). "" for messages search does not show (the bot's own notices).
    search_terms = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["conversation", "seq"]
        # The sweeper looks for answers left streaming by a dead process (chat.sweeper): a small
        # index of the streaming rows only.
        indexes = [
            models.Index(
                fields=["created_at"], condition=models.Q(state="streaming"), name="message_streaming_created"
            ),
            # A shopper message is claimed only while no answer of its conversation streams (one
            # answer at a time per conversation, issue 29: services.messages): the claim's NOT
            # EXISTS looks up this conversation's streaming rows, a handful at most.
            models.Index(
                fields=["conversation"], condition=models.Q(state="streaming"), name="message_streaming_conversation"
            ),
            # Ops reads the answers and shopper messages of a time range (ops.cells.raw_cells: the
            # hours not rolled up yet, and each rollup run), which without it scans every message.
            models.Index(fields=["role", "created_at"], name="message_role_created"),
            # Ops finds the answers rated since its last run (ops.rollup): the rated rows only.
            models.Index(fields=["rated_at"], condition=models.Q(rated_at__isnull=False), name="message_rated_at"),
        ]
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


class CannedReply(models.Model):
    """A saved answer agents insert into their reply (then edit before sending). Edited in the admin."""

    title = models.CharField(max_length=100)
    text = models.TextField()
    locale = models.CharField(max_length=8, blank=True, help_text="en, zh... or blank for any language.")
    position = models.PositiveIntegerField(default=0, help_text="Lower comes first in the console.")
    active = models.BooleanField(default=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["position", "title"]
        verbose_name_plural = "canned replies"

    def __str__(self) -> str:
        return self.title


class InternalNote(models.Model):
    """A note agents leave on a conversation. Never a ``Message``: it is not part of the shopper's
    conversation, never replayed to the shopper and never published to the shopper's group."""

    conversation = models.ForeignKey(Conversation, on_delete=models.CASCADE, related_name="notes")
    author = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    author_name = models.CharField(max_length=150)
    text = models.TextField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["conversation", "created_at", "id"]

    def __str__(self) -> str:
        return f"{self.conversation_id} note by {self.author_name}"


class AgentLease(models.Model):
    """One open agent console socket, alive while its lease runs (``chat.presence``).

    The console heartbeats; each heartbeat moves ``expires_at`` ``KEFU_AGENT_LEASE_S`` ahead. A
    socket that closes keeps its lease until it expires (a reload of the console is not a leave),
    and a process killed with its sockets leaves leases that simply expire: "agents online" is the
    number of agents with a live lease, in every process alike."""

    channel_name = models.CharField(max_length=200, unique=True)
    agent = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    expires_at = models.DateTimeField(db_index=True)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"{self.agent_id} until {self.expires_at:%H:%M:%S}"


class AgentState(models.Model):
    """An agent's standing for assignment (chat.assignment): ``away`` (no assignments, no alerts;
    shown in presence) and ``last_assigned_at``, the round-robin's turn (the agent assigned longest
    ago comes first). Auto-assignment locks the rows of the candidates (``SELECT ... FOR UPDATE``)
    so two workers decide one after the other."""

    agent = models.OneToOneField(settings.AUTH_USER_MODEL, primary_key=True, on_delete=models.CASCADE, related_name="+")
    away = models.BooleanField(default=False)
    last_assigned_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"{self.agent_id}{' (away)' if self.away else ''}"


class UsedIdentityToken(models.Model):
    """A signed identity token already accepted (its ``jti``): a second ``hello`` with it is a
    replay (chat.identity). Kept until the token expired (``expires_at``, leeway included)."""

    jti = models.CharField(max_length=64, primary_key=True)
    expires_at = models.DateTimeField(db_index=True)


class SearchLog(models.Model):
    """One staff search (``GET /console/api/search``): who searched, when, how many conversations
    it found and how long it took (ms). ``query`` is the text searched, or "" when it held an
    e-mail address (a shopper's personal data stays out of the log)."""

    agent = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    query = models.CharField(max_length=200, blank=True)
    results = models.PositiveSmallIntegerField()
    took_ms = models.FloatField()
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.created_at:%Y-%m-%d %H:%M} {self.agent_id}: {self.results} results"
