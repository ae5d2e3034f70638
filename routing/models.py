"""The store's FAQ: entries the local FAQ model is trained on (see ``routing.faq_model``)."""
from __future__ import annotations

from django.db import models


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
