"""Which model a deployment may call: its endpoint's ``GET /models``, read before the first call.

A deployment (routing.upstream.config.Deployment) is not called until its endpoint's first
``GET /models`` answered (:func:`check`; routing.upstream.tiers.check_tiers runs it for every
tier at start-up in the router's warm-up thread, and before the first call of a process, off the
event loop). What the answer means for a tier (:func:`resolve`):

* ``listed`` (HTTP 200): a model named by ``KEFU_<TIER>_MODEL`` answers only when the list has it;
  a tier without one uses the first model of its preference list (routing.upstream.catalog) the
  list has. Neither: the tier is **off**, and says which variable to set and to what.
* ``refused`` (401 / 403): the key is refused; the tier is **off**, said the same way.
* ``unknown`` (404, 5xx, a timeout, no connection: many compatible servers have no
  ``/models``): the tier stays **on, unverified**, with its named model (or its list's first),
  and the endpoint is asked again every ``KEFU_MODELS_RECHECK_S`` seconds, in the background.

The answers are kept per process, keyed by (base URL, SHA-256 of the key): each process asks for
itself, once at start and again on the schedule above. Not shared through Redis on purpose: one
``GET /models`` per process and endpoint is nothing next to a chat call, a process must not call
an endpoint on the word of another that may reach it differently (another key in its
environment, another network), and the call path would otherwise depend on Redis to start.
Tests that change ``settings.KEFU_TIERS`` call :func:`forget` (tests/conftest.py).
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from dataclasses import dataclass

from django.conf import settings

from routing.providers.base import ModelList, ProviderConfig
from routing.upstream.config import Deployment

log = logging.getLogger(__name__)

#: (base URL, SHA-256 hex digest of the API key): what an answer of ``GET /models`` is kept under.
EndpointKey = tuple[str, str]

#: How many of an endpoint's models a report names before "and N more".
SHOWN_MODELS = 20


@dataclass(frozen=True)
class Listing:
    """An endpoint's last ``GET /models`` answer (routing.providers.base.ModelList) and when it
    came (``checked_at``, ``time.monotonic()`` seconds)."""

    answer: ModelList
    checked_at: float


@dataclass(frozen=True)
class Resolution:
    """What a deployment may call now.

    ``state``: ``unchecked`` (no answer yet: call :func:`check` first), ``on`` (the model is
    listed), ``unverified`` (the list could not be read: on, not verified), ``off`` (not to be
    called). ``model``: the model to send (for ``off``, the one that was asked for). ``detail``:
    for people (the log, ``/healthz``, the ops page), naming the variable to set and the models
    the endpoint offers; empty for ``on``.
    """

    state: str
    model: str
    detail: str = ""

    @property
    def callable(self) -> bool:
        """Whether the deployment may be called (after its check: ``unchecked`` counts, the
        caller checks first)."""
        return self.state != "off"


_listings: dict[EndpointKey, Listing] = {}
_locks: dict[EndpointKey, threading.Lock] = {}
_rechecking: set[EndpointKey] = set()
_guard = threading.Lock()
_reported: set[tuple[str, str]] = set()  # (who, detail) already logged: each is logged once


def endpoint_key(d: Deployment) -> EndpointKey:
    """Where ``d``'s answer is kept: its base URL and the SHA-256 of its key (never the key)."""
    return (d.base_url, hashlib.sha256(d.api_key.encode()).hexdigest())


def listing(d: Deployment) -> Listing | None:
    """The last answer of ``d``'s endpoint in this process, None before the first. An ``unknown``
    answer older than ``KEFU_MODELS_RECHECK_S`` starts a re-check in the background (the old
    answer holds meanwhile)."""
    key = endpoint_key(d)
    found = _listings.get(key)
    due = found is not None and time.monotonic() - found.checked_at >= settings.KEFU_MODELS_RECHECK_S
    if found is not None and found.answer.state == "unknown" and due:
        _recheck_in_background(d, key)
    return found


def check(d: Deployment, *, force: bool = False) -> Listing:
    """Ask ``d``'s endpoint for its models (blocking, at most ``KEFU_MODELS_CHECK_TIMEOUT_S``
    seconds): once per endpoint and process, or again with ``force``. Threads asking for the same
    endpoint at once share one request. Never raises."""
    key = endpoint_key(d)
    with _guard:
        lock = _locks.setdefault(key, threading.Lock())
    asked_at = time.monotonic()
    with lock:
        found = _listings.get(key)
        if found is not None and (not force or found.checked_at >= asked_at):
            return found
        # Imported here: the provider module imports the openai SDK (~1.2 s), which the
        # warm-up pays in its thread; nothing imports it on the event loop.
        from routing.providers.openai_remote import list_models

        answer = list_models(
            ProviderConfig(
                base_url=d.base_url or None,
                api_key=d.api_key,
                connect_timeout_s=settings.KEFU_LLM_CONNECT_TIMEOUT_S,
            ),
            timeout_s=settings.KEFU_MODELS_CHECK_TIMEOUT_S,
        )
        found = Listing(answer=answer, checked_at=time.monotonic())
        _listings[key] = found
        return found


def forget(d: Deployment | None = None) -> None:
    """Drop what this process knows of ``d``'s endpoint (None: of every endpoint), so the next
    call checks again first: a canary promoted or rolled back, tests changing the tiers."""
    with _guard:
        if d is None:
            _listings.clear()
            _reported.clear()
        else:
            _listings.pop(endpoint_key(d), None)


def resolve(d: Deployment, *, preferences: tuple[str, ...], variable: str, key_variable: str) -> Resolution:
    """What ``d`` may call given its endpoint's answer (module docstring). ``preferences``: the
    tier's preference list, empty when ``variable`` (e.g. ``KEFU_SIMPLE_MODEL``) named
    ``d.model``; ``key_variable`` names the key's variable(s) for a refused key."""
    if not d.api_key:
        return Resolution("off", d.model, f"no API key: set {key_variable}")
    found = listing(d)
    if found is None:
        return Resolution("unchecked", d.model)
    answer = found.answer
    where = d.base_url or "the OpenAI endpoint"
    if answer.state == "refused":
        return Resolution("off", d.model, f"{where} refused the API key ({answer.detail}): set {key_variable}")
    if answer.state != "listed":
        every = f"{settings.KEFU_MODELS_RECHECK_S:g}"
        return Resolution(
            "unverified",
            d.model,
            f"unverified: GET /models of {where} failed ({answer.detail}); {d.model} is called "
            f"unchecked and the list asked for again every {every} s",
        )
    offered = set(answer.models)
    if not preferences:
        if d.model in offered:
            return Resolution("on", d.model)
        return Resolution("off", d.model, f"{variable}={d.model} is not listed by {where}: {_offer(variable, answer)}")
    chosen = next((m for m in preferences if m in offered), None)
    if chosen is not None:
        return Resolution("on", chosen)
    return Resolution(
        "off",
        d.model,
        f"{where} lists none of kefu's preference list ({', '.join(preferences)}): {_offer(variable, answer)}",
    )


def report(who: str, resolution: Resolution) -> None:
    """Log ``resolution`` of ``who`` (e.g. ``"the simple tier"``) once per process and detail:
    a warning when it is off, info when unverified, nothing when on."""
    if resolution.state not in ("off", "unverified"):
        return
    with _guard:
        if (who, resolution.detail) in _reported:
            return
        _reported.add((who, resolution.detail))
    if resolution.state == "off":
        log.warning("%s is off: %s", who, resolution.detail)
    else:
        log.info("%s is on, %s", who, resolution.detail)


def _offer(variable: str, answer: ModelList) -> str:
    if not answer.models:
        return f"it lists no model; set {variable} to a model it serves"
    shown = ", ".join(answer.models[:SHOWN_MODELS])
    more = len(answer.models) - SHOWN_MODELS
    return f"set {variable} to one of {shown}" + (f" (and {more} more)" if more > 0 else "")


def _recheck_in_background(d: Deployment, key: EndpointKey) -> None:
    with _guard:
        if key in _rechecking:
            return
        _rechecking.add(key)

    def run() -> None:
        try:
            check(d, force=True)
        finally:
            with _guard:
                _rechecking.discard(key)

    threading.Thread(target=run, name="kefu-models-recheck", daemon=True).start()
