"""The answer cache's settings, read from ``django.conf.settings`` once and validated.

Defaults live in one place, ``config/settings.py`` (read from the environment there); this module
only checks them. :func:`cache_config` is cached, and forgotten whenever a ``KEFU_CACHE_*``,
``KEFU_EMBED_*`` or ``REDIS_URL`` setting changes (Django's ``setting_changed`` signal: tests).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.dispatch import receiver


@dataclass(frozen=True)
class CacheConfig:
    """Every cache setting, with its unit and range (checked by :meth:`validate`).

    ``enabled``: the cache answers at all. ``ttl_s``: an entry's absolute lifetime, seconds (> 0).
    ``max_entries``: size bound over all scopes, oldest evicted first (> 0).
    ``semantic_threshold``: cosine (-1..1) for the strict lexical rule (measured,
    ``bench/cache_guard_eval.py``). ``guard_max_extra``: content words one question may add (>= 0,
    ``similarity.guard``). ``semantic_candidates``: nearest neighbours judged per lookup (>= 1).
    ``intent_cosine`` / ``intent_confidence``: the same-intent rule (``intent_model.py``; a
    confidence above 1 switches it off). ``slot_cosine``: the same-slots rule (both questions
    name the same answer-changing slot values, at least one; ``slots.py``; above 1: off).
    ``align_cosine``: the word-alignment rule (``alignment.py``: every word on which two questions
    differ is explained; every other rule needs it too; above 1: off, the rules before it).
    ``word_cosine``: the word-level cosine two differing words need to count as near-synonyms.
    ``promote_min_cosine``: the lowest cosine of a near miss a judge is asked about, and of a
    verified hit (``promotion.py``; above 1: off).
    ``ambiguity_margin``: cosine margin under which two
    candidates with different answers are both refused (>= 0). ``index_refresh_s``: how stale a
    scope's index may be about other workers' new entries, seconds (>= 0; the setting is
    ``KEFU_CACHE_INDEX_REFRESH_MS`` in ms). ``local_max_entries``: bound of the in-process exact
    store (> 0). ``hot_max_entries``: bound of the in-process layer of exact hits in front of Redis
    (``cache_layer.hot``; 0: no layer). ``redis_timeout_ms``: the Redis exact store's socket timeout, ms (> 0).
    ``audit_rate``: share of semantic hits re-answered (0..1). ``audit_same_cosine``: answer
    cosine at or above which an audit says ``same`` (-1..1). ``embed_batch_max`` (>= 1) and
    ``embed_batch_wait_ms`` (>= 0): the embedding batcher's bounds.
    """

    enabled: bool
    ttl_s: int
    max_entries: int
    semantic_threshold: float
    guard_max_extra: int
    semantic_candidates: int
    intent_cosine: float
    intent_confidence: float
    slot_cosine: float
    align_cosine: float
    word_cosine: float
    promote_min_cosine: float
    ambiguity_margin: float
    index_refresh_s: float
    local_max_entries: int
    hot_max_entries: int
    redis_timeout_ms: float
    audit_rate: float
    audit_same_cosine: float
    embed_batch_max: int
    embed_batch_wait_ms: float

    @classmethod
    def from_settings(cls) -> CacheConfig:
        """The configuration in ``django.conf.settings``. Raises ``ImproperlyConfigured`` naming
        the setting that is out of range."""
        config = cls(
            enabled=bool(settings.KEFU_CACHE_ENABLED),
            ttl_s=int(settings.KEFU_CACHE_TTL_S),
            max_entries=int(settings.KEFU_CACHE_MAX_ENTRIES),
            semantic_threshold=float(settings.KEFU_CACHE_SEMANTIC_THRESHOLD),
            guard_max_extra=int(settings.KEFU_CACHE_GUARD_MAX_EXTRA),
            semantic_candidates=int(settings.KEFU_CACHE_SEMANTIC_CANDIDATES),
            intent_cosine=float(settings.KEFU_CACHE_INTENT_COSINE),
            intent_confidence=float(settings.KEFU_CACHE_INTENT_CONFIDENCE),
            slot_cosine=float(settings.KEFU_CACHE_SLOT_COSINE),
            align_cosine=float(settings.KEFU_CACHE_ALIGN_COSINE),
            word_cosine=float(settings.KEFU_CACHE_WORD_COSINE),
            promote_min_cosine=float(settings.KEFU_CACHE_PROMOTE_MIN_COSINE),
            ambiguity_margin=float(settings.KEFU_CACHE_AMBIGUITY_MARGIN),
            index_refresh_s=float(settings.KEFU_CACHE_INDEX_REFRESH_MS) / 1000,
            local_max_entries=int(settings.KEFU_CACHE_LOCAL_MAX_ENTRIES),
            hot_max_entries=int(settings.KEFU_CACHE_HOT_MAX_ENTRIES),
            redis_timeout_ms=float(settings.KEFU_CACHE_REDIS_TIMEOUT_MS),
            audit_rate=float(settings.KEFU_CACHE_AUDIT_RATE),
            audit_same_cosine=float(settings.KEFU_CACHE_AUDIT_SAME_COSINE),
            embed_batch_max=int(settings.KEFU_EMBED_BATCH_MAX),
            embed_batch_wait_ms=float(settings.KEFU_EMBED_BATCH_WAIT_MS),
        )
        config.validate()
        return config

    def validate(self) -> None:
        """Raise ``ImproperlyConfigured`` for the first value out of its range (class docstring)."""
        checks: list[tuple[str, bool, str]] = [
            ("KEFU_CACHE_TTL_S", self.ttl_s > 0, "a positive number of seconds"),
            ("KEFU_CACHE_MAX_ENTRIES", self.max_entries > 0, "a positive number"),
            ("KEFU_CACHE_SEMANTIC_THRESHOLD", -1.0 <= self.semantic_threshold <= 1.0, "a cosine in -1..1"),
            ("KEFU_CACHE_GUARD_MAX_EXTRA", self.guard_max_extra >= 0, "0 or more words"),
            ("KEFU_CACHE_SEMANTIC_CANDIDATES", self.semantic_candidates >= 1, "1 or more"),
            ("KEFU_CACHE_INTENT_COSINE", -1.0 <= self.intent_cosine <= 1.0, "a cosine in -1..1"),
            ("KEFU_CACHE_SLOT_COSINE", -1.0 <= self.slot_cosine <= 1.01, "a cosine in -1..1 (above 1: off)"),
            ("KEFU_CACHE_ALIGN_COSINE", -1.0 <= self.align_cosine <= 1.01, "a cosine in -1..1 (above 1: off)"),
            ("KEFU_CACHE_WORD_COSINE", -1.0 <= self.word_cosine <= 1.0, "a cosine in -1..1"),
            (
                "KEFU_CACHE_PROMOTE_MIN_COSINE",
                -1.0 <= self.promote_min_cosine <= 1.01,
                "a cosine in -1..1 (above 1: off)",
            ),
            (
                "KEFU_CACHE_INTENT_CONFIDENCE",
                self.intent_confidence >= 0.0,
                "a probability (above 1 turns the rule off)",
            ),
            ("KEFU_CACHE_AMBIGUITY_MARGIN", self.ambiguity_margin >= 0.0, "0 or more"),
            ("KEFU_CACHE_INDEX_REFRESH_MS", self.index_refresh_s >= 0.0, "0 or more milliseconds"),
            ("KEFU_CACHE_LOCAL_MAX_ENTRIES", self.local_max_entries > 0, "a positive number"),
            ("KEFU_CACHE_HOT_MAX_ENTRIES", self.hot_max_entries >= 0, "0 (off) or a positive number"),
            ("KEFU_CACHE_REDIS_TIMEOUT_MS", self.redis_timeout_ms > 0.0, "a positive number of milliseconds"),
            ("KEFU_CACHE_AUDIT_RATE", 0.0 <= self.audit_rate <= 1.0, "a share in 0..1"),
            ("KEFU_CACHE_AUDIT_SAME_COSINE", -1.0 <= self.audit_same_cosine <= 1.0, "a cosine in -1..1"),
            ("KEFU_EMBED_BATCH_MAX", self.embed_batch_max >= 1, "1 or more"),
            ("KEFU_EMBED_BATCH_WAIT_MS", self.embed_batch_wait_ms >= 0.0, "0 or more milliseconds"),
        ]
        for name, ok, expected in checks:
            if not ok:
                raise ImproperlyConfigured(f"{name} must be {expected}")


@functools.cache
def cache_config() -> CacheConfig:
    """The process's :class:`CacheConfig` (read and validated on first use)."""
    return CacheConfig.from_settings()


@receiver(setting_changed)
def _forget(*, setting: str, **kwargs: Any) -> None:
    if setting.startswith(("KEFU_CACHE_", "KEFU_EMBED_")) or setting == "REDIS_URL":
        cache_config.cache_clear()
    if setting == "KEFU_CACHE_SLOTS_PATH":
        from . import slots

        slots.forget()
