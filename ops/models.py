"""Ops' own tables: hourly rollups of the cost ledger and the answers (derived data, rebuilt from
chat's and the router's rows by ``ops.rollup``; nothing else writes them), and the agent queue's
length sampled once a minute (the one thing the other tables do not keep).

``hour`` is the hour's start in UTC epoch seconds (a multiple of 3600): an integer, so that a
30-day read converts nothing per row. Money is integer micro-dollars (``*_micro_usd``): the
ledger's USD has six places, so the sums are exact on every database (SQLite keeps a
``DecimalField`` as a float). Time-to-first-token and wait histograms are ``ops.histogram.Hist``
in four fields (``*_hist``: its bytes, ``Hist.to_bytes``, NULL when empty; ``*_count``;
``*_min``/``*_max`` in ms).
"""

from __future__ import annotations

from datetime import UTC, datetime

from django.db import models

HOUR_HELP = "start of the hour, UTC epoch seconds"


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

    hour = models.BigIntegerField(primary_key=True, help_text=HOUR_HELP)
    rolled_at = models.DateTimeField()
    shopper_messages = models.PositiveIntegerField(default=0)
    handoffs_replied = models.PositiveIntegerField(default=0)
    wait_hist = models.BinaryField(null=True)
    wait_min = models.FloatField(null=True)
    wait_max = models.FloatField(null=True)
    audit_same = models.PositiveIntegerField(default=0)
    audit_different = models.PositiveIntegerField(default=0)
    audit_agent_wrong = models.PositiveIntegerField(default=0)
    audit_error = models.PositiveIntegerField(default=0)
    queue_samples = models.PositiveIntegerField(default=0)
    queue_waiting_max = models.PositiveIntegerField(default=0)
    queue_with_agent_max = models.PositiveIntegerField(default=0)
    # The satisfaction scores (1-5) of the conversations started in the hour, and when the
    # hour's outcomes (these and ``OutcomeRollup``) were last read from the rows.
    csat_1 = models.PositiveIntegerField(default=0)
    csat_2 = models.PositiveIntegerField(default=0)
    csat_3 = models.PositiveIntegerField(default=0)
    csat_4 = models.PositiveIntegerField(default=0)
    csat_5 = models.PositiveIntegerField(default=0)
    outcomes_at = models.DateTimeField(null=True)

    class Meta:
        ordering = ["-hour"]

    def __str__(self) -> str:
        return f"{datetime.fromtimestamp(self.hour, tz=UTC):%Y-%m-%d %H:00} UTC"


class AnswerRollup(models.Model):
    """Bot answers of one hour and one route (``chat.Message``, role ``bot``): how many, how many
    cut, USD spent (``cost_micro_usd``) and saved (``saved_micro_usd``), tokens, shoppers' ratings, and the
    time to first token (``ttft_*``, ms)."""

    hour = models.BigIntegerField(help_text=HOUR_HELP)
    route = models.CharField(max_length=16)
    answers = models.PositiveIntegerField(default=0)
    cut = models.PositiveIntegerField(default=0)
    cost_micro_usd = models.BigIntegerField(default=0)
    saved_micro_usd = models.BigIntegerField(default=0)
    prompt_tokens = models.PositiveBigIntegerField(default=0)
    completion_tokens = models.PositiveBigIntegerField(default=0)
    rated_up = models.PositiveIntegerField(default=0)
    rated_down = models.PositiveIntegerField(default=0)
    ttft_count = models.PositiveIntegerField(default=0)
    ttft_hist = models.BinaryField(null=True)
    ttft_min = models.FloatField(null=True)
    ttft_max = models.FloatField(null=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["hour", "route"], name="answerrollup_unique_hour_route")]


class CallRollup(models.Model):
    """Cost-ledger rows (``routing.UpstreamCall``) of one hour by tier, purpose, outcome and
    ``stop`` (``abandoned``: kefu stopped the attempt; ``budget``: a spend budget skipped the tier,
    no request sent; "" otherwise): attempts, tokens and USD."""

    hour = models.BigIntegerField(help_text=HOUR_HELP)
    tier = models.CharField(max_length=16)
    purpose = models.CharField(max_length=16)
    outcome = models.CharField(max_length=10)
    stop = models.CharField(max_length=10, blank=True)
    calls = models.PositiveIntegerField(default=0)
    prompt_tokens = models.PositiveBigIntegerField(default=0)
    cached_prompt_tokens = models.PositiveBigIntegerField(default=0)
    completion_tokens = models.PositiveBigIntegerField(default=0)
    cost_micro_usd = models.BigIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["hour", "tier", "purpose", "outcome", "stop"], name="callrollup_unique_hour_key"
            )
        ]


class TierRollup(models.Model):
    """The upstream's time to first token in one hour for one tier: every ledger row of the tier
    with a first token, whatever its purpose or outcome (``UpstreamCall.ttft_ms``). Kept apart
    from ``CallRollup`` so that a histogram is read per tier, not per outcome and purpose."""

    hour = models.BigIntegerField(help_text=HOUR_HELP)
    tier = models.CharField(max_length=16)
    ttft_count = models.PositiveIntegerField(default=0)
    ttft_hist = models.BinaryField(null=True)
    ttft_min = models.FloatField(null=True)
    ttft_max = models.FloatField(null=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["hour", "tier"], name="tierrollup_unique_hour_tier")]


class FaqRollup(models.Model):
    """Bot answers of one hour given from one FAQ entry (``Message.faq_entry_id``), with the
    shoppers' ratings."""

    hour = models.BigIntegerField(help_text=HOUR_HELP)
    faq_entry_id = models.BigIntegerField()
    answers = models.PositiveIntegerField(default=0)
    rated_up = models.PositiveIntegerField(default=0)
    rated_down = models.PositiveIntegerField(default=0)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["hour", "faq_entry_id"], name="faqrollup_unique_hour_entry")]


class OutcomeRollup(models.Model):
    """Outcomes of the conversations started in one hour (``chat.outcomes.OutcomeTally``): how
    many have each ``state`` (``resolved_confirmed``, ``resolved_assumed``, ``unresolved``) with
    its ``reasons`` (comma-joined, unresolved only) and, for a resolution still open when the
    hour was rolled, when it ``settles`` (UTC epoch seconds; 0: unresolved, or settled already).
    Whether a resolution is open is decided when the figures are read, from ``settles``."""

    hour = models.BigIntegerField(help_text=HOUR_HELP)
    state = models.CharField(max_length=24)
    reasons = models.CharField(max_length=64, blank=True)
    settles = models.BigIntegerField(default=0)
    conversations = models.PositiveIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["hour", "state", "reasons", "settles"], name="outcomerollup_unique_hour_key"
            )
        ]


class ConversationOutcome(models.Model):
    """One conversation's outcome as last rolled up (``chat.outcomes.conversation_verdicts``),
    filed under the ``hour`` it started: ``state``, ``reasons`` (comma-joined, unresolved only)
    and when a resolution ``settles`` (UTC epoch seconds; 0 for unresolved). A late change to a
    few conversations re-scores those alone and re-groups their hours' ``OutcomeRollup`` rows
    from these (``ops.rollup.conversations_rescore``). A conversation with no bot answer has
    none."""

    conversation_id = models.UUIDField(primary_key=True)
    hour = models.BigIntegerField(db_index=True, help_text=HOUR_HELP)
    state = models.CharField(max_length=24)
    reasons = models.CharField(max_length=64, blank=True)
    settles = models.BigIntegerField(default=0)


class QueueSample(models.Model):
    """The agent queue at one moment (``ops.tasks.sample_queue``, every minute on the beat
    schedule): conversations waiting for an agent and held by one. Chat keeps only the present
    state, so the queue's past exists only as these samples."""

    at = models.DateTimeField(db_index=True)
    waiting = models.PositiveIntegerField()
    with_agent = models.PositiveIntegerField()

    class Meta:
        ordering = ["-at"]
