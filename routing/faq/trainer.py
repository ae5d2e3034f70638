"""Retraining the FAQ model and the scope classifier in a process of their own.

A retrain is seconds of CPU, most of it Python holding the GIL (fitting) or numpy and ONNX
Runtime using every core (embedding). In a thread of the server's process it stalled every chat
of that process: the first-delta p99 of 8 chatting shoppers rose 3.7× while a phrasing was saved
every 3 s (bench/faq_retrain.py, in the README). Here it runs in one long-lived child process
started with ``spawn`` (no fork of a process with threads), at the lowest CPU priority (nice 19),
with its own embedder: the server's process only sends the training entries and thresholds and
unpickles the trained models (milliseconds), which :func:`train` gives the server's embedder
(the same model: vectors are the same). The child keeps its embedder's cache between retrains,
so after its first retrain an edit embeds only the new phrasings.

The first model of a process is trained in the process itself (nothing chats before the router
is ready, and a child would add its start-up to the time to ready); every later retrain goes
through here. When the child cannot be started or dies, the retrain runs in the calling thread,
as before, and a warning is logged; the next retrain starts a new child.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

from django.conf import settings

from lib.fit_memo import fit_key, load_or_fit
from routing.faq import model as model_module
from routing.faq import scope as scope_module
from routing.faq.model import FaqModel, FaqTrainingEntry
from routing.faq.scope import SEED_PATH, ScopeClassifier

log = logging.getLogger(__name__)

#: (min_confidence, min_similarity, single_entry_min_similarity, scope threshold)
Thresholds = tuple[float, float, float, float]

_pool: ProcessPoolExecutor | None = None
_pool_lock = threading.Lock()


#: How often the trainer process checks that the server's process is still alive, seconds.
PARENT_CHECK_S = 1.0


def _exit_with_parent(parent: int) -> None:
    """In the child: exit once the process that started it is gone (kill -9 of a server leaves
    no trainer behind; PR_SET_PDEATHSIG would follow the starting *thread*, which ends after a
    retrain). An orphan's parent pid changes to its new reaper's."""
    while True:
        time.sleep(PARENT_CHECK_S)
        if os.getppid() != parent:
            os._exit(0)


def _child_init(parent: int) -> None:
    """In the child: follow the server's process, lowest CPU priority, then Django (settings
    name the embedder)."""
    threading.Thread(target=_exit_with_parent, args=(parent,), name="trainer-parent", daemon=True).start()
    try:
        os.nice(19)
    except OSError:
        pass
    import django

    django.setup()


#: The code and data that define both fits: part of the memo key (lib.fit_memo).
_FIT_FILES = (Path(model_module.__file__), Path(scope_module.__file__), SEED_PATH)


def train_here(training: Sequence[FaqTrainingEntry], thresholds: Thresholds) -> tuple[FaqModel, ScopeClassifier]:
    """Train both models in the calling thread with this process's embedder (blocking), or load
    them from ``KEFU_MODEL_CACHE_DIR`` when a process trained them on equal entries, thresholds,
    embedder and code before (``lib.fit_memo``: a restart is ready seconds sooner)."""
    from cache_layer.embeddings import get_embedder

    embedder = get_embedder()
    entries = tuple(training)

    def fit() -> tuple[FaqModel, ScopeClassifier]:
        model = FaqModel.train(
            list(entries),
            embedder,
            min_confidence=thresholds[0],
            min_similarity=thresholds[1],
            single_entry_min_similarity=thresholds[2],
        )
        scope = ScopeClassifier.train(
            embedder, extra_in_scope=[p for t in entries for p in t.phrasings], threshold=thresholds[3]
        )
        return model, scope

    embedder_name = getattr(embedder, "name", "")
    if not embedder_name:  # a stand-in without a model name (tests) is never memoised
        model, scope = fit()
    else:
        key = fit_key((entries, thresholds, embedder_name), _FIT_FILES)
        model, scope = load_or_fit(settings.KEFU_MODEL_CACHE_DIR, "faq", key, fit)
    return model.attach(embedder), scope.attach(embedder)


def _train_in_child(
    training: Sequence[FaqTrainingEntry], thresholds: Thresholds
) -> tuple[FaqModel, ScopeClassifier, int]:
    model, scope = train_here(training, thresholds)
    return model, scope, os.getpid()


def _executor() -> ProcessPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ProcessPoolExecutor(
                max_workers=1,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=_child_init,
                initargs=(os.getpid(),),
            )
        return _pool


def _discard(pool: ProcessPoolExecutor) -> None:
    global _pool
    with _pool_lock:
        if _pool is pool:
            _pool = None
    pool.shutdown(wait=False, cancel_futures=True)


def train(training: Sequence[FaqTrainingEntry], thresholds: Thresholds) -> tuple[FaqModel, ScopeClassifier, int]:
    """Train the FAQ model and the scope classifier on ``training`` with ``thresholds`` in the
    trainer process (module docstring); blocking, for a background thread. Returns both models,
    attached to this process's embedder, and the pid of the process that trained them (this
    process's when the child failed and they were trained here). Raises what training raises
    (``ValueError`` for bad thresholds)."""
    from cache_layer.embeddings import get_embedder

    pool = _executor()
    try:
        model, scope, pid = pool.submit(_train_in_child, list(training), thresholds).result()
    except (BrokenProcessPool, OSError, RuntimeError) as e:
        log.warning("the trainer process failed (%s: %s); retraining in this process", type(e).__name__, e)
        _discard(pool)
        model, scope = train_here(training, thresholds)
        return model, scope, os.getpid()
    embedder = get_embedder()
    return model.attach(embedder), scope.attach(embedder), pid


def shutdown() -> None:
    """Stop the trainer process, if any (tests, tooling; a server's exit stops it too)."""
    global _pool
    with _pool_lock:
        pool, _pool = _pool, None
    if pool is not None:
        pool.shutdown(wait=True, cancel_futures=True)
