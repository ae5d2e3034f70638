"""The FAQ model's life cycle: train it from the database, keep it fresh, and write FAQ entries.

One ``FaqRegistry`` per process holds the current ``FaqModel`` and ``ScopeClassifier``. It is
retrained when the FAQ changes: writers call ``faq_changed()``, and a background poller (started
by the ASGI app) notices changes made by other processes (``count`` and latest ``updated_at``,
checked every ``KEFU_FAQ_POLL_S`` seconds). The old model keeps answering while a new one trains.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

from django.conf import settings
from django.db import close_old_connections
from django.db.models import Count, Max

from cache_layer.embeddings import get_embedder

from .faq_model import FaqModel, FaqTrainingEntry
from .models import FaqEntry
from .scope import ScopeClassifier

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FaqAnswerView:
    """What the router needs of an entry, detached from the ORM (safe to share across threads)."""

    entry_id: int
    intent: str
    locale: str
    question: str
    answer: str


class FaqRegistry:
    """Process-wide holder of the trained models. ``ready`` is True once a first model is loaded."""

    def __init__(self) -> None:
        self.model: FaqModel | None = None
        self.scope: ScopeClassifier | None = None
        self.entries: dict[int, FaqAnswerView] = {}
        self.by_intent: dict[tuple[str, str], FaqAnswerView] = {}
        self.fingerprint: tuple[int, str] | None = None
        self.error: str = ""
        # Set once the first model of this process was trained: from then on the router is ready
        # (later retrains swap a new model in while the old one keeps answering).
        self.loaded = False
        self._train_lock = threading.Lock()
        self._poller: threading.Thread | None = None

    @property
    def ready(self) -> bool:
        return self.model is not None and self.scope is not None

    @property
    def loading(self) -> bool:
        """True between :meth:`start_background` and the first model (or the first failure): a
        message routed now would meet a half-loaded router."""
        return self._poller is not None and not self.loaded and not self.error

    @staticmethod
    def _db_fingerprint() -> tuple[int, str]:
        agg = FaqEntry.objects.filter(active=True).aggregate(n=Count("id"), latest=Max("updated_at"))
        return int(agg["n"] or 0), str(agg["latest"] or "")

    def reload(self) -> None:
        """Train new models from the active FAQ entries and swap them in (blocking, thread-safe)."""
        with self._train_lock:
            fingerprint = self._db_fingerprint()
            rows = list(FaqEntry.objects.filter(active=True).order_by("id"))
            views = {r.pk: FaqAnswerView(r.pk, r.intent, r.locale, r.question, r.answer) for r in rows}
            training = [FaqTrainingEntry(r.pk, r.intent, r.locale, tuple(r.phrasings)) for r in rows]
            embedder = get_embedder()
            model = FaqModel.train(
                training,
                embedder,
                min_confidence=settings.KEFU_FAQ_MIN_CONFIDENCE,
                min_similarity=settings.KEFU_FAQ_MIN_SIMILARITY,
                single_entry_min_similarity=settings.KEFU_FAQ_SINGLE_ENTRY_MIN_SIMILARITY,
            )
            if self.scope is None or self.fingerprint != fingerprint:
                scope = ScopeClassifier.train(
                    embedder,
                    extra_in_scope=[p for t in training for p in t.phrasings],
                    threshold=settings.KEFU_SCOPE_THRESHOLD,
                )
            else:
                scope = self.scope
            self.model, self.scope, self.entries = model, scope, views
            self.by_intent = {(v.intent, v.locale): v for v in views.values()}
            self.fingerprint = fingerprint
            self.error = ""
            self.loaded = True
            log.info("FAQ model trained on %d entries (version %s)", len(rows), model.version)

    def reload_if_changed(self) -> bool:
        """Retrain when the database's FAQ differs from the loaded one; True when it retrained."""
        if self.ready and self._db_fingerprint() == self.fingerprint:
            return False
        self.reload()
        return True

    def start_background(self) -> None:
        """Load the first model and keep it fresh, in a daemon thread (idempotent)."""
        if self._poller is not None:
            return

        def run() -> None:
            while True:
                try:
                    close_old_connections()
                    self.reload_if_changed()
                except Exception as e:  # the thread's edge: keep serving the old model, retry later
                    self.error = f"{type(e).__name__}: {e}"
                    log.exception("FAQ model reload failed")
                finally:
                    close_old_connections()
                time.sleep(settings.KEFU_FAQ_POLL_S)

        self._poller = threading.Thread(target=run, name="faq-model", daemon=True)
        self._poller.start()


registry = FaqRegistry()


def faq_changed() -> None:
    """Call after writing FAQ entries: retrains this process's model now (other processes notice
    within ``KEFU_FAQ_POLL_S`` seconds)."""
    if registry.ready or registry._poller is not None:
        registry.reload()
