"""Start-up warm-up of the router: pay every first-use cost before the first shopper does.

Measured with a sampling profiler on a fresh server (routing-overhead check): without it the
first remote-bound message imported the ``openai`` SDK on the event loop (~1.2 s, stalling every
open socket), loaded the tokenizer tables (2-3 s, in a thread), trained the tier classifier and
ran the embedding model's first, slow call. :func:`start` does all of that in one daemon thread
as the server starts; ``/healthz`` reports ``router: loading`` (HTTP 503) until it is done, like
``faq_model``, so a load balancer sends no traffic to a cold process.

What is warmed:

* the ``openai`` SDK and the provider module (imports);
* each tier's endpoint's ``GET /models`` (``routing.upstream.tiers.check_tiers``): the model each tier
  uses, and which tiers are off (logged once);
* the tokenizer of every configured tier's model (``routing.upstream.tokens.warm_tokenizer``), so prompt
  budgets are counted exactly from the first message;
* the tier classifier (``routing.decide.tier_classifier.get_classifier``: trains on the shipped labels);
* the answer cache's intent model and the embedder (one embedding);
* the language detector's models (``lib.text``).

A failure is tried again after each of :data:`RETRY_DELAYS_S`; the last one is logged and
reported as ``error: ...`` by :func:`status`; the server still serves (each part loads again
lazily at first use and raises there).
"""

from __future__ import annotations

import logging
import threading
import time

from django.db import close_old_connections

from cache_layer.embeddings import embed_batched
from cache_layer.intent_model import get_intent_model
from lib.text import configured_detector
from routing.decide import smalltalk
from routing.decide.tier_classifier import get_classifier
from routing.upstream import tokens
from routing.upstream.tiers import check_tiers, configured_tiers, tier_model

log = logging.getLogger(__name__)

_lock = threading.Lock()
_thread: threading.Thread | None = None
_state = "not started"  # "not started" | "loading" | "ok" | "error: ..."


def status() -> str:
    """``"ok"`` when warm (or when no warm-up was started: everything loads lazily then),
    ``"loading"`` while the warm-up runs, ``"error: <Type>: <message>"`` when a step failed."""
    return "ok" if _state == "not started" else _state


def start() -> None:
    """Warm the router up in a daemon thread (idempotent; returns at once)."""
    global _thread, _state
    with _lock:
        if _thread is not None:
            return
        _state = "loading"
        _thread = threading.Thread(target=_run, name="kefu-warm-up", daemon=True)
        _thread.start()


def wait(timeout_s: float | None = None) -> str:
    """Block until the warm-up started by :func:`start` ended (tests, tooling); its status."""
    thread = _thread
    if thread is not None:
        thread.join(timeout_s)
    return status()


#: Pauses before the warm-up is tried again after a failure, seconds: a transient failure (an
#: upstream's ``GET /models`` timing out, a file being replaced) must not leave a process reporting
#: ``error`` on ``/healthz`` for good, which a load balancer would read as "never send traffic".
RETRY_DELAYS_S: tuple[float, ...] = (1.0, 5.0)


def _run() -> None:
    global _state
    for attempt in range(len(RETRY_DELAYS_S) + 1):
        try:
            warm()
        except Exception as e:  # the thread's edge: report it; each part retries lazily and raises there
            if attempt < len(RETRY_DELAYS_S):
                log.warning("router warm-up failed (%s: %s); trying again", type(e).__name__, e)
                time.sleep(RETRY_DELAYS_S[attempt])
                continue
            log.exception("router warm-up failed")
            _state = f"error: {type(e).__name__}: {e}"
            return
        finally:
            close_old_connections()
        _state = "ok"
        return


def warm() -> None:
    """The warm-up itself (blocking, ~3-5 s on 2 cores the first time in a process)."""
    # The point of this import is its cost: the openai SDK (~1.2 s), paid here, not by a shopper.
    from routing.providers import openai_remote  # noqa: F401

    # Each endpoint's GET /models before any call (routing.upstream.listing): which model each
    # tier uses, which tiers are off; logged once.
    check_tiers()
    for tier in configured_tiers():
        tokens.warm_tokenizer(tier_model(tier))
    get_classifier()
    get_intent_model()
    smalltalk.classifier()  # ~1,500 seed texts, memoised on disk after the first start
    embed_batched(["warm up"])
    configured_detector().warm()  # lingua's language models, ~1-2 s
    log.info(
        "router warm: SDK imported, tokenizers loaded, tier classifier trained, small talk trained, language models loaded"
    )
