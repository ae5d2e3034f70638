"""A circuit breaker per upstream deployment: stop calling an upstream that keeps failing.

The classic three states (Michael Nygard, "Release It!", 2nd ed., ch. 5 "Circuit Breaker";
Martin Fowler, "CircuitBreaker", 2014):

- **closed**: calls go through; each failure counts, a success resets the count. After
  ``failure_threshold`` consecutive failures the breaker **opens**.
- **open**: no call goes through for ``cooldown_s`` seconds; the router skips the tier at once
  (falls back to the next one) instead of waiting for yet another timeout.
- **half-open**: after the cooldown exactly one trial call goes through; its success closes the
  breaker, its failure opens it for another cooldown. Other calls are refused meanwhile.

Why not a library: the async candidates (``aiobreaker``, ``purgatory``) wrap a coroutine call,
while an answer here is a stream whose verdict comes at its end (or never, when the shopper
leaves); this class takes the verdict from whoever holds the trial, which is what the stream
needs, in 80 lines.

Breakers are per process and per (base URL, API key, model): a provider's models fail apart
(one overloaded, another fine), as LiteLLM's per-deployment cooldowns assume too. Times are
``time.monotonic()`` seconds.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Literal

from django.conf import settings

from routing.providers.ratelimits import UpstreamKey

__all__ = ["BREAKER_FAILURES", "BreakerState", "CircuitBreaker", "breaker_for", "reset_breakers"]

BreakerState = Literal["closed", "open", "half_open"]

# Failures (``ProviderError.code``) that say the deployment is unwell and count towards opening its
# breaker (routing.upstream.resilience gives the verdicts; routing.upstream.canary counts a candidate's the same way).
# Not `rate_limited` (the rate-limit headers and `retry-after` handle that, for exactly as long as
# the upstream asks) nor `bad_request` (this request's fault, not the upstream's).
BREAKER_FAILURES = frozenset({"server", "connection", "timeout", "malformed", "auth"})


class CircuitBreaker:
    """One upstream's breaker (thread-safe). Use::

    if not breaker.allow():      # open, or half-open with its trial taken: skip the tier
        ...
    try: ... call ...
    except failure: breaker.record_failure()
    else: breaker.record_success()
    # a call abandoned without a verdict (the caller went away): breaker.release()
    """

    def __init__(
        self, *, failure_threshold: int, cooldown_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        """``failure_threshold`` >= 1 consecutive failures open it for ``cooldown_s`` seconds."""
        if failure_threshold < 1:
            raise ValueError("failure_threshold must be at least 1")
        self.failure_threshold = failure_threshold
        self.cooldown_s = cooldown_s
        self._clock = clock
        self._lock = threading.Lock()
        self._failures = 0
        self._opened_at: float | None = None
        self._trial_taken = False

    @property
    def state(self) -> BreakerState:
        """``closed``, ``open`` (cooldown running) or ``half_open`` (cooldown over)."""
        with self._lock:
            return self._state()

    def _state(self) -> BreakerState:
        if self._opened_at is None:
            return "closed"
        if self._clock() - self._opened_at < self.cooldown_s:
            return "open"
        return "half_open"

    def retry_in_s(self) -> float:
        """Seconds until the breaker lets a trial through; 0.0 when it is not open."""
        with self._lock:
            if self._opened_at is None:
                return 0.0
            return max(0.0, self.cooldown_s - (self._clock() - self._opened_at))

    def allow(self) -> bool:
        """May a call go through now? In half-open state the first caller takes the trial (and
        must then report ``record_success``, ``record_failure`` or ``release``)."""
        with self._lock:
            state = self._state()
            if state == "closed":
                return True
            if state == "open" or self._trial_taken:
                return False
            self._trial_taken = True
            return True

    def record_success(self) -> None:
        """A call succeeded: close the breaker and reset the count."""
        with self._lock:
            self._failures = 0
            self._opened_at = None
            self._trial_taken = False

    def record_failure(self) -> None:
        """A call failed: count it; open (again) at the threshold or when the trial failed."""
        with self._lock:
            self._failures += 1
            if self._opened_at is not None or self._failures >= self.failure_threshold:
                self._opened_at = self._clock()
            self._trial_taken = False

    def release(self) -> None:
        """A call ended without a verdict (abandoned): give the half-open trial back."""
        with self._lock:
            self._trial_taken = False


_breakers: dict[UpstreamKey, CircuitBreaker] = {}
_breakers_lock = threading.Lock()


def breaker_for(key: UpstreamKey) -> CircuitBreaker:
    """The process's breaker for ``key``, made on first use from ``KEFU_BREAKER_FAILURES`` and
    ``KEFU_BREAKER_COOLDOWN_S``."""
    with _breakers_lock:
        breaker = _breakers.get(key)
        if breaker is None:
            breaker = _breakers[key] = CircuitBreaker(
                failure_threshold=settings.KEFU_BREAKER_FAILURES, cooldown_s=settings.KEFU_BREAKER_COOLDOWN_S
            )
        return breaker


def reset_breakers() -> None:
    """Forget every breaker (after a settings change; tests)."""
    with _breakers_lock:
        _breakers.clear()
