"""The store's FAQ (``FaqEntry``), the gateway's API keys (``ApiKey``), the cost ledger
(``UpstreamCall``), the spend budgets (``BudgetCounter``, ``BudgetHold``) and staff's word on
the tiers' canary candidates (``TierOverride``) and what a shopper is doing across messages
(``ConversationTask``)."""

from __future__ import annotations

from decimal import Decimal

from django.conf import settings
from django.db import models
from django.utils import timezone


class FaqEntry(models.Model):
    """One FAQ entry: a canonical ``question``, other phrasings in ``variants`` (a JSON list of
    strings) and the ``answer``. (``intent``, ``locale``) identifies an entry: importing the same
    pair again updates it. ``answer`` may hold ``{{Placeholder}}`` names that are filled from the
    store settings when the answer is sent."""

    intent = models.SlugField(max_length=100)
    locale = models.CharField(max_length=8, default="en")
    question = models.TextField()
    variants = models.JSONField(default=list, blank=True)
    answer = models.TextField()
    active = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name = "FAQ entry"
        verbose_name_plural = "FAQ entries"
        ordering = ["intent", "locale"]
        constraints = [models.UniqueConstraint(fields=["intent", "locale"], name="faq_unique_intent_locale")]

    def __str__(self) -> str:
        return f"{self.intent} [{self.locale}]"

    @property
    def phrasings(self) -> list[str]:
        """The question followed by its variants, blanks and duplicates removed."""
        seen: dict[str, None] = {}
        for p in [self.question, *(self.variants or [])]:
            p = (p or "").strip()
            if p:
                seen.setdefault(p, None)
        return list(seen)


class ApiKey(models.Model):
    """A key for the OpenAI-compatible gateway (``POST /v1/chat/completions``), issued by staff in
    the admin. Only the SHA-256 of the key is stored (keys are 256-bit random, so a fast hash is
    enough: there is nothing to brute-force); the key itself is shown once, when it is made.
    ``prefix`` (the first characters) tells keys apart in lists and logs."""

    name = models.CharField(max_length=100, help_text="Who or what uses this key, e.g. 'order-status bot'.")
    prefix = models.CharField(max_length=16, editable=False)
    key_hash = models.CharField(max_length=64, unique=True, editable=False)
    active = models.BooleanField(default=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+", editable=False
    )
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True, editable=False)
    budget_day_usd = models.DecimalField(
        max_digits=12,
        decimal_places=2,
        null=True,
        blank=True,
        help_text="USD this key may spend per day (empty: KEFU_BUDGET_KEY_DAY_USD; 0: no limit).",
    )
    budget_month_usd = models.DecimalField(
        max_digits=12,
        decimal_places=2,
        null=True,
        blank=True,
        help_text="USD this key may spend per calendar month (empty: KEFU_BUDGET_KEY_MONTH_USD; 0: no limit).",
    )

    class Meta:
        verbose_name = "gateway API key"
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"


class Outcome(models.TextChoices):
    """How one upstream attempt ended (``UpstreamCall.outcome``)."""

    OK = "ok"  # the answer streamed to its end
    RETRIED = "retried"  # failed before its first token; the same tier was tried again
    FELL_BACK = "fell_back"  # failed before its first token, or skipped; the next tier was tried
    FAILED = "failed"  # failed and nothing else was tried: after the first token (cut), or the last tier


class Purpose(models.TextChoices):
    """What an upstream call was for (the ops view splits spending by it)."""

    ANSWER = "answer", "Answer to a shopper"
    TOOL = "tool", "Answer to a shopper, after a store tool's result"
    REWRITE = "rewrite", "Follow-up rewrite (answer cache key)"
    SUMMARY = "summary", "Rolling conversation summary"
    SUGGESTION = "suggestion", "Suggested reply for an agent"
    AUDIT = "audit", "Answer-cache audit"
    JUDGE = "judge", "Answer-cache promotion judge"
    REMAKE = "remake", "Answer-cache clean remake (no shopper history)"
    GATEWAY = "gateway", "Gateway (/v1/chat/completions)"
    TEST = "test", "Bot test (manage.py bot_test; counts in no budget)"


class Variant(models.TextChoices):
    """Which deployment of a tier answered or was called (routing.upstream.tiers, routing.upstream.canary)."""

    CURRENT = "current", "The tier's own model"
    CANDIDATE = "candidate", "The tier's canary candidate"


class UpstreamCall(models.Model):
    """The cost ledger: one row per attempt to call a remote tier (``routing.upstream.resilience``).

    A tier skipped without a request (open breaker, exhausted rate limit, concurrency) gets a row
    too, with ``error_code`` saying why and no tokens. Tokens come from the API's usage;
    ``estimated`` marks rows whose tokens kefu counted itself (no usage reported: a stream cut,
    a timeout). ``cost_usd`` is USD at the tier's list prices (``routing.upstream.ledger.cost_usd``).
    ``ttft_ms`` / ``latency_ms`` are from the attempt's request to its first text / its end.
    ``message`` is the shopper message being answered (chat), ``api_key`` the gateway key,
    ``purpose`` what the call was for (``Purpose``), ``variant`` which deployment of the tier was
    called: its own model (``current``) or its canary candidate (``candidate``, priced at the
    candidate's prices; routing.upstream.canary).
    """

    conversation = models.ForeignKey(
        "chat.Conversation", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    message = models.ForeignKey("chat.Message", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    api_key = models.ForeignKey(ApiKey, null=True, blank=True, on_delete=models.SET_NULL, related_name="calls")
    purpose = models.CharField(max_length=16, choices=Purpose.choices, default=Purpose.ANSWER, db_index=True)
    tier = models.CharField(max_length=16)
    variant = models.CharField(max_length=10, choices=Variant.choices, default=Variant.CURRENT)
    model = models.CharField(max_length=100, blank=True)
    attempt = models.PositiveSmallIntegerField(
        default=1, help_text="1 for the first try of this tier, 2 for its retry..."
    )
    prompt_tokens = models.PositiveIntegerField(default=0)
    cached_prompt_tokens = models.PositiveIntegerField(default=0)
    completion_tokens = models.PositiveIntegerField(default=0)
    cost_usd = models.DecimalField(max_digits=12, decimal_places=6, default=Decimal("0"))
    ttft_ms = models.FloatField(null=True, blank=True)
    latency_ms = models.FloatField(default=0)
    outcome = models.CharField(max_length=10, choices=Outcome.choices)
    error_code = models.CharField(max_length=32, blank=True)
    http_status = models.PositiveSmallIntegerField(null=True, blank=True)
    estimated = models.BooleanField(default=False)
    created_at = models.DateTimeField(default=timezone.now, db_index=True, help_text="When the attempt began.")

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [
            models.Index(fields=["tier", "created_at"], name="upstreamcall_tier_created"),
            # The canary's error rate (routing.upstream.canary): the candidate's recent calls of a tier.
            models.Index(
                fields=["tier", "created_at"],
                condition=models.Q(variant="candidate"),
                name="upstreamcall_candidate_created",
            ),
        ]
        permissions = [("view_costs", "Can see costs, savings and latency (ops dashboard)")]

    def __str__(self) -> str:
        return f"{self.tier}/{self.model} {self.outcome} ${self.cost_usd}"


class BudgetCounter(models.Model):
    """What one payer spent and holds in one period (``routing.upstream.budgets``): ``kind`` of payer
    (``customer``, ``conversation``, ``address``, ``key``, ``tier``), its ``key`` (a keyed hash for
    a customer id or an address, so no personal data is kept here; the conversation's UUID, the
    gateway key's id or the tier's name otherwise), the ``period`` (``day`` or ``month``) that
    starts on ``starts_on`` (in ``TIME_ZONE``), and in USD: ``spent_usd`` (settled calls, and
    reservations that expired unsettled, at their maximum), ``reserved_usd`` (calls in flight, at
    their maximum) and the ``limit_usd`` last applied."""

    kind = models.CharField(max_length=16)
    key = models.CharField(max_length=64)
    period = models.CharField(max_length=8)
    starts_on = models.DateField()
    limit_usd = models.DecimalField(max_digits=12, decimal_places=6, default=Decimal("0"))
    spent_usd = models.DecimalField(max_digits=12, decimal_places=6, default=Decimal("0"))
    reserved_usd = models.DecimalField(max_digits=12, decimal_places=6, default=Decimal("0"))
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name = "spend budget"
        ordering = ["-starts_on", "kind", "key"]
        constraints = [
            models.UniqueConstraint(fields=["kind", "key", "period", "starts_on"], name="budget_unique_scope_period")
        ]

    def __str__(self) -> str:
        return f"{self.kind}:{self.key} {self.period} {self.starts_on} ${self.spent_usd}+{self.reserved_usd}/{self.limit_usd}"


class BudgetHold(models.Model):
    """A reservation on one counter: the most a call in flight may cost (USD). One call's
    reservation (``hold``) spans every counter that pays for it; settling deletes its rows, and
    one that outlives ``expires_at`` (its process died) is counted as spent at that maximum."""

    hold = models.UUIDField(db_index=True)
    counter = models.ForeignKey(BudgetCounter, on_delete=models.CASCADE, related_name="holds")
    amount_usd = models.DecimalField(max_digits=12, decimal_places=6)
    expires_at = models.DateTimeField(db_index=True)


class CanaryState(models.TextChoices):
    """What staff (or the automatic rollback) decided about a tier's canary candidate."""

    CANARY = "canary", "Canary: the environment's share of conversations"
    PROMOTED = "promoted", "Promoted: every conversation of the tier"
    ROLLED_BACK = "rolled_back", "Rolled back: no conversation"


class TierOverride(models.Model):
    """A decision about one tier's canary candidate (``routing.upstream.canary``): promote it, roll it back,
    or resume the canary at the environment's share. Append-only: the newest row of a tier is in
    force while it names the candidate the environment configures (``candidate_model``; a new
    candidate starts from the environment again), and every row is the audit trail: who (``by``:
    a username, or ``auto`` for the automatic rollback), when, and why (``reason``, with the
    figures for an automatic one). With no row the environment decides."""

    tier = models.CharField(max_length=16)
    state = models.CharField(max_length=16, choices=CanaryState.choices)
    candidate_model = models.CharField(max_length=100, help_text="The candidate this decision is about.")
    by = models.CharField(max_length=150, help_text="A staff user's username, or 'auto' (the automatic rollback).")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    reason = models.TextField(blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        verbose_name = "canary decision"
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["tier", "-id"], name="tieroverride_tier_newest")]

    def __str__(self) -> str:
        return f"{self.tier} {self.candidate_model}: {self.state} by {self.by}"


class ConversationTask(models.Model):
    """What a shopper is trying to do across messages (``routing.orders.tasks``): one row per
    conversation, valid for the conversation session it was made in (``session_from_seq``, the
    chat's ``Conversation.session_from_seq``: a later visit starts without it).

    ``intent``: the store action (``cancel``, ``return``, ``change``, ``change_address``,
    ``status``, ``refund_status``); ``order_number`` and ``email``: what the shopper gave so far
    ("" for none; the e-mail proves an anonymous shopper's order); ``awaiting``: ``""`` (a piece
    is missing), ``confirm`` (kefu offered the change and waits for a yes/no) or ``recheck``
    (the task expired and kefu asked whether to check again); ``choices``: the order numbers kefu
    listed for "which one?" (a verified shopper with several orders the request could be about;
    "the second one" picks from them); ``source``: ``action`` (the
    template path) or ``tool`` (a remote model's tool call); ``expires_at``: now +
    ``KEFU_STORE_CONFIRM_TTL_S`` at each step."""

    conversation_id = models.UUIDField(unique=True)
    session_from_seq = models.PositiveIntegerField(default=0)
    intent = models.CharField(max_length=16)
    order_number = models.CharField(max_length=32, blank=True)
    email = models.CharField(max_length=254, blank=True)
    awaiting = models.CharField(max_length=16, blank=True)
    choices = models.JSONField(default=list, blank=True)
    source = models.CharField(max_length=8, default="action")
    updated_at = models.DateTimeField(auto_now=True)
    expires_at = models.DateTimeField()

    class Meta:
        verbose_name = "conversation task"

    def __str__(self) -> str:
        return f"{self.intent} {self.order_number or '?'} ({self.awaiting or 'pieces'})"
