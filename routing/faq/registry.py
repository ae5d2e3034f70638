"""The FAQ model's life cycle: train it from the database, keep it fresh, and write FAQ entries.

One ``FaqRegistry`` per process holds the current ``FaqModel`` and ``ScopeClassifier``. It is
retrained when the FAQ changes: writers call ``faq_changed()``, and a background poller (started
by the ASGI app) notices changes made by other processes (``count`` and latest ``updated_at``,
checked every ``KEFU_FAQ_POLL_S`` seconds). The old model keeps answering while a new one trains.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass, field, replace
from functools import cached_property

from django.conf import settings
from django.db import close_old_connections, transaction
from django.db.models import Count, Max

from lib.text import language_code
from routing.faq import trainer
from routing.faq.model import FaqModel, FaqTrainingEntry
from routing.faq.scope import ScopeClassifier
from routing.models import FaqEntry

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FaqAnswerView:
    """What the router needs of an entry, detached from the ORM (safe to share across threads)."""

    entry_id: int
    intent: str
    locale: str
    question: str
    answer: str


@dataclass(frozen=True)
class FaqSnapshot:
    """One trained state of the FAQ, swapped in whole: a reader that takes ``registry.snapshot``
    once sees a model, a scope classifier and the entries they were trained on together, never a
    new model with the old entries."""

    model: FaqModel | None = None
    scope: ScopeClassifier | None = None
    entries: dict[int, FaqAnswerView] = field(default_factory=dict)
    by_intent: dict[tuple[str, str], FaqAnswerView] = field(default_factory=dict)
    fingerprint: tuple[int, str] | None = None
    # What the models learnt from (training entries, thresholds): equal means no retrain is needed.
    trained_on: tuple[object, ...] | None = None

    @cached_property
    def locales(self) -> frozenset[str]:
        """The languages (ISO 639-1) the FAQ has entries in: the FAQ answers only in these."""
        return frozenset(language_code(v.locale) for v in self.entries.values())


class FaqRegistry:
    """Process-wide holder of the trained models. ``ready`` is True once a first model is loaded.

    ``snapshot`` is replaced in one assignment when a retrain ends; ``model``, ``scope``,
    ``entries`` and ``by_intent`` read the current one (use ``snapshot`` to read several together)."""

    def __init__(self) -> None:
        self.snapshot = FaqSnapshot()
        self.error: str = ""
        # Set once the first model of this process was trained: from then on the router is ready
        # (later retrains swap a new model in while the old one keeps answering).
        self.loaded = False
        self._train_lock = threading.Lock()
        self._poller: threading.Thread | None = None
        self._retrain = threading.Event()  # set by faq_changed(): retrain in the background
        self._retrainer: threading.Thread | None = None
        self._retrainer_lock = threading.Lock()
        # The pid of the process that trained the current models (routing.faq.trainer); 0 before any.
        self.trained_by = 0

    @property
    def model(self) -> FaqModel | None:
        return self.snapshot.model

    @model.setter
    def model(self, model: FaqModel | None) -> None:  # tests unload the model this way
        self.snapshot = replace(self.snapshot, model=model)

    @property
    def scope(self) -> ScopeClassifier | None:
        return self.snapshot.scope

    @property
    def entries(self) -> dict[int, FaqAnswerView]:
        return self.snapshot.entries

    @property
    def by_intent(self) -> dict[tuple[str, str], FaqAnswerView]:
        return self.snapshot.by_intent

    @property
    def fingerprint(self) -> tuple[int, str] | None:
        return self.snapshot.fingerprint

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

    def reload(self, *, in_trainer: bool = False) -> None:
        """Bring the models up to date with the active FAQ entries and swap them in (blocking,
        thread-safe). Models are trained only when what they learn from changed (the entries'
        ids, intents, locales and phrasings, and the thresholds): an edit of an answer's text
        alone swaps in the new entries and keeps the trained models. ``in_trainer``: a retrain
        (a model is loaded already) trains in the trainer process (``routing.faq.trainer``), off
        this process's cores and GIL; the first model is trained here."""
        with self._train_lock:
            fingerprint = self._db_fingerprint()
            rows = list(FaqEntry.objects.filter(active=True).order_by("id"))
            views = {r.pk: FaqAnswerView(r.pk, r.intent, r.locale, r.question, r.answer) for r in rows}
            training = [FaqTrainingEntry(r.pk, r.intent, r.locale, tuple(r.phrasings)) for r in rows]
            thresholds = (
                settings.KEFU_FAQ_MIN_CONFIDENCE,
                settings.KEFU_FAQ_MIN_SIMILARITY,
                settings.KEFU_FAQ_SINGLE_ENTRY_MIN_SIMILARITY,
                settings.KEFU_SCOPE_THRESHOLD,
            )
            trained_on = (tuple(training), thresholds)
            current = self.snapshot
            if current.model is not None and current.scope is not None and current.trained_on == trained_on:
                model, scope = current.model, current.scope
                log.info("FAQ entries reloaded (%d); the models were trained on the same phrasings", len(rows))
            elif in_trainer and current.model is not None:
                model, scope, pid = trainer.train(training, thresholds)
                self.trained_by = pid
                log.info("FAQ model trained on %d entries (version %s, process %d)", len(rows), model.version, pid)
            else:
                model, scope = trainer.train_here(training, thresholds)
                self.trained_by = os.getpid()
                log.info("FAQ model trained on %d entries (version %s)", len(rows), model.version)
            self.snapshot = FaqSnapshot(
                model=model,
                scope=scope,
                entries=views,
                by_intent={(v.intent, v.locale): v for v in views.values()},
                fingerprint=fingerprint,
                trained_on=trained_on,
            )
            self.error = ""
            self.loaded = True

    def reload_if_changed(self) -> bool:
        """Retrain when the database's FAQ differs from the loaded one (a loaded model: in the
        trainer process); True when it retrained."""
        if self.ready and self._db_fingerprint() == self.fingerprint:
            return False
        self.reload(in_trainer=self.ready)
        return True

    def start_background(self) -> None:
        """Load the first model and keep it fresh, in a daemon thread (idempotent)."""
        if self._poller is not None:
            return

        def run() -> None:
            _lower_this_threads_priority()
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

    def retrain_soon(self) -> None:
        """Retrain in a background thread and return at once. Calls while a retrain runs are
        coalesced into one more retrain after it (the last write is always trained on). The old
        model answers until the new one is swapped in."""
        self._retrain.set()
        with self._retrainer_lock:
            if self._retrainer is not None and self._retrainer.is_alive():
                return
            self._retrainer = threading.Thread(target=self._retrain_loop, name="faq-retrain", daemon=True)
            self._retrainer.start()

    def _retrain_loop(self) -> None:
        _lower_this_threads_priority()
        while self._retrain.is_set():
            self._retrain.clear()
            try:
                close_old_connections()
                self.reload(in_trainer=True)
            except Exception as e:  # the thread's edge: the old model keeps answering
                self.error = f"{type(e).__name__}: {e}"
                log.exception("FAQ model retrain failed")
            finally:
                close_old_connections()
        with self._retrainer_lock:
            if self._retrain.is_set():  # a write came in as the loop ended: go round once more
                self._retrainer = threading.Thread(target=self._retrain_loop, name="faq-retrain", daemon=True)
                self._retrainer.start()

    def wait_retrained(self, timeout_s: float | None = None) -> bool:
        """Block until no background retrain is pending or running (tests, tooling); False on timeout."""
        thread = self._retrainer
        if thread is not None:
            thread.join(timeout_s)
            return not thread.is_alive()
        return True


def _lower_this_threads_priority() -> None:
    """Give the calling thread the lowest CPU priority (Linux: a nice value per thread), so that a
    retrain takes the cores the chats leave over. Measured with bench/faq_retrain.py. Elsewhere,
    or without the right, nothing."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
    except (AttributeError, OSError):
        pass


registry = FaqRegistry()


def faq_changed() -> None:
    """Call after writing FAQ entries: this process retrains in the background, off the caller's
    thread (an admin save returns at once, and the server's one sync thread, through which every
    chat's database work goes, is never held by a training); other processes notice within
    ``KEFU_FAQ_POLL_S`` seconds. Nothing when no model was ever loaded here (a management command
    that writes the FAQ for a server to load)."""
    if registry.ready or registry._poller is not None:
        # After the write commits: the retrain reads the entries from another connection.
        transaction.on_commit(registry.retrain_soon)
