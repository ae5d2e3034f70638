"""Ops' own tables: hourly rollups of the cost ledger and the answers (derived data, rebuilt from
chat's and the router's rows by ``ops.rollup``; nothing else writes them), and the agent queue's
length sampled once a minute (the one thing the other tables do not keep).

Hours are UTC, the start of the hour. Money is ``Decimal`` USD, 6 places, summed exactly.
Time-to-first-token and wait histograms are ``ops.histogram.Hist`` in three fields (``*_hist``:
``{bucket: count}``, ``*_count``, ``*_min``/``*_max`` in ms).
"""

from __future__ import annotations

from decimal import Decimal

from django.db import models


class RolledHour(models.Model):
    """One rolled-up hour, and the figures of that hour that are not split by route or tier.

    Its presence says the hour's other rollup rows are complete as of ``rolled_at``; an hour
    without it is read from the raw rows. Re-rolling an hour replaces this row and the hour's
    others in one transaction (``ops.rollup.hour_roll``).

    ``shopper_messages``: shopper messages stored in the hour. ``handoffs_replied`` and
    ``wait_*``: of the hour's handoff answers, those an agent has replied to since, and the time
    from the handoff answer to the agent's first message (ms). ``audit_*``: cache audits opened in
    the hour by verdict (``cache_layer.CacheAudit``). ``queue_*``: the minute samples of the agent
    queue taken in the hour (``QueueSample``): how many, the largest number of conversations
    waiting, and with an agent."""

    hour = models.DateTimeField(primary_key=True)
    rolled_at = models.DateTimeField()
    shopper_messages = models.PositiveIntegerField(default=0)
    handoffs_replied = models.PositiveIntegerField(default=0)
    wait_hist = models.JSONField(default=dict)
    wait_min = models.FloatField(null=True)
    wait_max = models.FloatField(null=True)
    audit_same = models.PositiveIntegerField(default=0)
    audit_different = models.PositiveIntegerField(default=0)
    audit_agent_wrong = models.PositiveIntegerField(default=0)
    audit_error = models.PositiveIntegerField(default=0)
    queue_samples = models.PositiveIntegerField(default=0)
    queue_waiting_max = models.PositiveIntegerField(default=0)
    queue_with_agent_max = models.PositiveIntegerField(default=0)

    class Meta:
        ordering = ["-hour"]

    def __str__(self) -> str:
        return f"{self.hour:%Y-%m-%d %H:00} UTC"


class AnswerRollup(models.Model):
    """Bot answers of one hour and one route (``chat.Message``, role ``bot``): how many, how many
    cut, USD spent (``cost_usd``) and saved (``saved_usd``), tokens, shoppers' ratings, and the
    time to first token (``ttft_*``, ms)."""

    hour = models.DateTimeField()
    route = models.CharField(max_length=16)
    answers = models.PositiveIntegerField(default=0)
    cut = models.PositiveIntegerField(default=0)
    cost_usd = models.DecimalField(max_digits=14, decimal_places=6, default=Decimal("0"))
    saved_usd = models.DecimalField(max_digits=14, decimal_places=6, default=Decimal("0"))
    prompt_tokens = models.PositiveBigIntegerField(default=0)
    completion_tokens = models.PositiveBigIntegerField(default=0)
    rated_up = models.PositiveIntegerField(default=0)
    rated_down = models.PositiveIntegerField(default=0)
    ttft_count = models.PositiveIntegerField(default=0)
    ttft_hist = models.JSONField(default=dict)
    ttft_min = models.FloatField(null=True)
    ttft_max = models.FloatField(null=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["hour", "route"], name="answerrollup_unique_hour_route")]


class CallRollup(models.Model):
    """Cost-ledger rows (``routing.UpstreamCall``) of one hour by tier, purpose, outcome and
    ``stop`` (``abandoned``: kefu stopped the attempt; ``budget``: a spend budget skipped the tier,
    no request sent; "" otherwise): attempts, tokens, USD and the upstream's time to first token."""

    hour = models.DateTimeField()
    tier = models.CharField(max_length=16)
    purpose = models.CharField(max_length=16)
    outcome = models.CharField(max_length=10)
    stop = models.CharField(max_length=10, blank=True)
    calls = models.PositiveIntegerField(default=0)
    prompt_tokens = models.PositiveBigIntegerField(default=0)
    cached_prompt_tokens = models.PositiveBigIntegerField(default=0)
    completion_tokens = models.PositiveBigIntegerField(default=0)
    cost_usd = models.DecimalField(max_digits=14, decimal_places=6, default=Decimal("0"))
    ttft_count = models.PositiveIntegerField(default=0)
    ttft_hist = models.JSONField(default=dict)
    ttft_min = models.FloatField(null=True)
    ttft_max = models.FloatField(null=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["hour", "tier", "purpose", "outcome", "stop"], name="callrollup_unique_hour_key"
            )
        ]


class FaqRollup(models.Model):
    """Bot answers of one hour given from one FAQ entry (``Message.faq_entry_id``), with the
    shoppers' ratings."""

    hour = models.DateTimeField()
    faq_entry_id = models.BigIntegerField()
    answers = models.PositiveIntegerField(default=0)
    rated_up = models.PositiveIntegerField(default=0)
    rated_down = models.PositiveIntegerField(default=0)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["hour", "faq_entry_id"], name="faqrollup_unique_hour_entry")]


class QueueSample(models.Model):
    """The agent queue at one moment (``ops.tasks.sample_queue``, every minute on the beat
    schedule): conversations waiting for an agent and held by one. Chat keeps only the present
    state, so the queue's past exists only as these samples."""

    at = models.DateTimeField(db_index=True)
    waiting = models.PositiveIntegerField()
    with_agent = models.PositiveIntegerField()

    class Meta:
        ordering = ["-at"]
