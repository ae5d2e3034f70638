"""Stored conversations and their messages. Nothing a shopper sends is ever lost: every shopper
message is a row before any answering starts (see ``chat.services.message_receive``)."""

from __future__ import annotations

import uuid
from typing import Any

from django.conf import settings
from django.core.files.storage import storages
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
    PRODUCT = "product"  # the product catalog's data in a template (routing.decide.product_flow), no model call
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
    # When that conversation had entered the queue (its ``waiting_since`` then): the wait it had,
    # ``queue_taken_at - queue_waited_from``, caps the waits promised to others (chat.availability).
    queue_waited_from = models.DateTimeField(null=True, blank=True)
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
    # A bot test's conversation (``manage.py bot_test``, docs/bot-tests.md): answered through the
    # shopper's path in a sandbox, and shown in no queue, alert, search, ops figure or budget.
    sandbox = models.BooleanField(default=False)
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
    # The files sent with the message (chat.models.Attachment), as frames show them without their
    # link: ``[{"id", "name", "content_type", "size"}]`` (a copy, so replays and history pages read
    # no other table; the link is signed afresh for every frame: chat.attachments.attachment_json).
    attachments = models.JSONField(default=list, blank=True)
    # Product cards shown with the message (issue 36; docs/protocol.md, "Product cards"): a product
    # answer's or an agent's, as frames carry them (routing.types.ProductCard.as_json).
    cards = models.JSONField(default=list, blank=True)
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
    """A saved answer agents insert into their reply (then edit before sending): chosen from the
    console's list, or typed as ``/shortcut`` in the reply box (chat.canned). ``text`` is the
    reply in any language; ``texts`` holds per-locale versions (``{"zh": "...", "en": "..."}``),
    the conversation's language choosing one. ``{name}`` and ``{order_number}`` are filled from
    the conversation (chat.canned.fill). ``owner`` null: shared by every agent (editing those
    needs ``chat.manage_shared_replies``); else the owner's personal reply, seen by them only."""

    title = models.CharField(max_length=100)
    text = models.TextField()
    locale = models.CharField(max_length=8, blank=True, help_text="en, zh... or blank for any language.")
    # Typed after "/" in the console's reply box; "" for a reply chosen from the list only.
    shortcut = models.CharField(max_length=32, blank=True, default="")
    texts = models.JSONField(default=dict, blank=True, help_text='Per-locale texts: {"zh": "...", "en": "..."}.')
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.CASCADE, related_name="+"
    )
    position = models.PositiveIntegerField(default=0, help_text="Lower comes first in the console.")
    active = models.BooleanField(default=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["position", "title"]
        verbose_name_plural = "canned replies"
        permissions = [("manage_shared_replies", "Can edit the shared canned replies in the agent console")]
        constraints = [
            # One shortcut means one reply: among the shared ones, and among each agent's own.
            models.UniqueConstraint(
                fields=["shortcut"],
                condition=models.Q(owner__isnull=True) & ~models.Q(shortcut=""),
                name="canned_shared_shortcut",
            ),
            models.UniqueConstraint(
                fields=["owner", "shortcut"],
                condition=models.Q(owner__isnull=False) & ~models.Q(shortcut=""),
                name="canned_personal_shortcut",
            ),
        ]

    def __str__(self) -> str:
        return self.title


class Label(models.Model):
    """A store-defined label agents put on conversations ("refund", "VIP"...), shown in its
    colour (``#rrggbb``) on the console's rows; the inbox filters by it and Ops counts it
    (chat.labels). Defining labels needs ``chat.manage_labels``; any agent sets them."""

    name = models.CharField(max_length=40, unique=True)
    color = models.CharField(max_length=7, default="#6b7280")
    position = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["position", "name"]
        permissions = [("manage_labels", "Can define the store's conversation labels in the agent console")]

    def __str__(self) -> str:
        return self.name


class ConversationLabel(models.Model):
    """A label on a conversation: who set it and when."""

    conversation = models.ForeignKey(Conversation, on_delete=models.CASCADE, related_name="label_links")
    label = models.ForeignKey(Label, on_delete=models.CASCADE, related_name="links")
    set_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["conversation", "label"], name="conversation_label_once")]
        # The inbox's label view and Ops read a label's conversations.
        indexes = [models.Index(fields=["label", "conversation"], name="conversation_label_by_label")]

    def __str__(self) -> str:
        return f"{self.conversation_id}: {self.label_id}"


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


def _attachment_storage() -> Any:
    """The "attachments" storage of ``STORAGES`` (the file system by default; docs/configuration.md)."""
    return storages["attachments"]


def _attachment_path(instance: Attachment, filename: str) -> str:
    """Where a file is stored: ``<conversation id>/<attachment id>.<ext>`` (the shopper's file
    name never reaches the storage)."""
    extension = filename.rsplit(".", 1)[-1] if "." in filename else "bin"
    return f"{instance.conversation_id}/{instance.id}.{extension}"


def _attachment_id() -> str:
    return uuid.uuid4().hex


class Attachment(models.Model):
    """A file a shopper or an agent sent in a conversation (issue 33): an image re-encoded without
    metadata, or a PDF (chat.attachments.judge). Uploaded first (``message`` null), then linked to
    the one message that sends it (``chat.services.attachments``); served only through signed
    links. Deleted with its conversation, its file too (chat.retention)."""

    id = models.CharField(primary_key=True, max_length=32, default=_attachment_id, editable=False)
    conversation = models.ForeignKey(Conversation, on_delete=models.CASCADE, related_name="attachments")
    message = models.ForeignKey(
        Message, null=True, blank=True, on_delete=models.SET_NULL, related_name="attachment_rows"
    )
    file = models.FileField(storage=_attachment_storage, upload_to=_attachment_path, max_length=200)
    # The name shown (the sent name's stem, the stored kind's extension) and the stored kind.
    name = models.CharField(max_length=120)
    content_type = models.CharField(max_length=40)
    size = models.PositiveIntegerField(help_text="Bytes stored.")
    width = models.PositiveIntegerField(default=0)
    height = models.PositiveIntegerField(default=0)
    # Who sent it: "shopper" or "agent" (Role).
    role = models.CharField(max_length=8, choices=Role.choices)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["conversation", "created_at"]

    def __str__(self) -> str:
        return f"{self.id} ({self.content_type}, {self.size} bytes)"

    def meta(self) -> dict[str, Any]:
        """What a message keeps of it: ``{"id", "name", "content_type", "size"}``."""
        return {"id": self.id, "name": self.name, "content_type": self.content_type, "size": self.size}


class EmailKind(models.TextChoices):
    REPLY = "reply", _("Reply to a shopper")
    TRANSCRIPT = "transcript", _("Transcript")
    DIGEST = "digest", _("Agents' digest")


class EmailState(models.TextChoices):
    PENDING = "pending", _("Pending")
    SENDING = "sending", _("Sending")
    SENT = "sent", _("Sent")
    SKIPPED = "skipped", _("Not needed")
    FAILED = "failed", _("Failed")


class OutgoingEmail(models.Model):
    """One e-mail kefu owes someone (``chat.mail``): a burst of agent replies to a shopper who
    left, a transcript asked for, or the agents' digest. ``key`` is unique (``reply:<conv>:<first
    seq>``, ``transcript:<conv>:<seq>``, ``digest:<interval start>``), so a retry or a second
    worker never makes a second row; a row is sent by whoever claims it (``state`` ``sending``
    with ``claim_until``), so it leaves once. ``message_id`` is its stable ``Message-ID``."""

    key = models.CharField(max_length=120, unique=True)
    kind = models.CharField(max_length=12, choices=EmailKind.choices)
    conversation = models.ForeignKey(
        Conversation, null=True, blank=True, on_delete=models.CASCADE, related_name="emails"
    )
    # The agent messages a reply e-mail carries: seqs first_seq..last_seq (0 for other kinds).
    first_seq = models.PositiveIntegerField(default=0)
    last_seq = models.PositiveIntegerField(default=0)
    state = models.CharField(max_length=8, choices=EmailState.choices, default=EmailState.PENDING)
    due_at = models.DateTimeField()
    claim_until = models.DateTimeField(null=True, blank=True)
    attempts = models.PositiveSmallIntegerField(default=0)
    message_id = models.CharField(max_length=200, blank=True)
    # Why the last attempt failed (the server's answer, no address), for ops.
    error = models.CharField(max_length=300, blank=True)
    sent_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [
            # The sweep reads the rows due (chat.mail.due_emails): the pending and sending rows only.
            models.Index(fields=["due_at"], condition=models.Q(state__in=["pending", "sending"]), name="email_due"),
        ]

    def __str__(self) -> str:
        return f"{self.key} ({self.state})"


class ResumeCode(models.Model):
    """A single-use code of a resume link (``chat.mail``): the widget exchanges it for its
    conversation once, before ``expires_at``. Only its SHA-256 is stored, like a token."""

    code_hash = models.CharField(max_length=64, primary_key=True)
    conversation = models.ForeignKey(Conversation, on_delete=models.CASCADE, related_name="+")
    expires_at = models.DateTimeField(db_index=True)
    used_at = models.DateTimeField(null=True, blank=True)
