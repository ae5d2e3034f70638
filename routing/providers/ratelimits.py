"""What an upstream says about its own rate limits, and a book of the upstreams that said "none left".

OpenAI (and most OpenAI-compatible APIs) send, with every response including a 429::

    x-ratelimit-limit-requests: 500         x-ratelimit-limit-tokens: 200000
    x-ratelimit-remaining-requests: 0       x-ratelimit-remaining-tokens: 1520
    x-ratelimit-reset-requests: 120ms       x-ratelimit-reset-tokens: 6m0s

(OpenAI's "Rate limits" guide, section "Rate limits in headers"). The reset values are Go-style
durations; some compatible servers send plain seconds instead. `parse_rate_limit_headers` reads
both. When an upstream says 0 requests (or 0 tokens) remain, `UpstreamLimitBook` remembers until
when, so that no request is sent to it before the reset (the router falls back to another tier
instead of collecting a 429).

Nothing here knows about Django or the SDK: `openai_remote` feeds the book, the router reads it.
Times are `time.monotonic()` seconds; durations are seconds (`*_s`).
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

__all__ = [
    "UpstreamKey",
    "UpstreamLimitBook",
    "UpstreamRateLimits",
    "book",
    "parse_duration_s",
    "parse_rate_limit_headers",
]

# (base URL, API key, model): OpenAI's limits are per organisation (key) and per model.
UpstreamKey = tuple[str, str, str]

# A block shorter than this is no block: asyncio may wake a sleeper up to its clock resolution
# early, and a retry that slept exactly until the reset must not be refused for a millisecond.
_MIN_BLOCK_S = 0.01

_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")


@dataclass(frozen=True)
class UpstreamRateLimits:
    """The `x-ratelimit-*` headers of one response. None where the header was absent or unreadable.

    `remaining_*` are counts (requests, tokens); `reset_*_s` are seconds from the response until
    the corresponding budget is full again.
    """

    remaining_requests: int | None = None
    remaining_tokens: int | None = None
    reset_requests_s: float | None = None
    reset_tokens_s: float | None = None

    def exhausted_for_s(self) -> float:
        """Seconds until a request may be sent again: the reset of every budget at 0 (the
        longest), 0.0 when none is at 0. A budget at 0 without a reset header counts as 1 s
        (the shortest window OpenAI uses), rather than forever."""
        waits = [0.0]
        if self.remaining_requests is not None and self.remaining_requests <= 0:
            waits.append(self.reset_requests_s if self.reset_requests_s is not None else 1.0)
        if self.remaining_tokens is not None and self.remaining_tokens <= 0:
            waits.append(self.reset_tokens_s if self.reset_tokens_s is not None else 1.0)
        return max(waits)


def parse_duration_s(value: str | None) -> float | None:
    """Seconds in a reset header: a Go duration (`"1s"`, `"6m0s"`, `"120ms"`, `"1h2m3.5s"`) or a
    plain number of seconds (`"0.5"`). None for anything else."""
    if value is None:
        return None
    text = value.strip().lower()
    if not text:
        return None
    try:
        return max(0.0, float(text))
    except ValueError:
        pass
    pos, total = 0, 0.0
    for match in _DURATION_PART.finditer(text):
        if match.start() != pos:
            return None
        number, unit = float(match.group(1)), match.group(2)
        total += number * {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}[unit]
        pos = match.end()
    return total if pos == len(text) and pos > 0 else None


def _int_header(headers: Mapping[str, str], name: str) -> int | None:
    value = headers.get(name)
    if value is None:
        return None
    try:
        return int(float(value.strip()))
    except ValueError:
        return None


def parse_rate_limit_headers(headers: Mapping[str, str]) -> UpstreamRateLimits | None:
    """The rate-limit state in `headers` (case-insensitive mapping, e.g. `httpx.Headers`), or
    None when the response carried no `x-ratelimit-remaining-*` header at all."""
    remaining_requests = _int_header(headers, "x-ratelimit-remaining-requests")
    remaining_tokens = _int_header(headers, "x-ratelimit-remaining-tokens")
    if remaining_requests is None and remaining_tokens is None:
        return None
    return UpstreamRateLimits(
        remaining_requests=remaining_requests,
        remaining_tokens=remaining_tokens,
        reset_requests_s=parse_duration_s(headers.get("x-ratelimit-reset-requests")),
        reset_tokens_s=parse_duration_s(headers.get("x-ratelimit-reset-tokens")),
    )


class UpstreamLimitBook:
    """Until when each upstream said it has no budget left (per process, thread-safe).

    `observe` is called with every response's limits; `blocked_for_s` says how long to hold off.
    A later response with budget left clears the block (the upstream knows best).
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._until: dict[UpstreamKey, float] = {}
        self._lock = threading.Lock()

    def observe(self, key: UpstreamKey, limits: UpstreamRateLimits | None) -> None:
        """Record one response's limits for `key` (None: the response said nothing; ignored)."""
        if limits is None:
            return
        wait = limits.exhausted_for_s()
        with self._lock:
            if wait > 0:
                self._until[key] = self._clock() + wait
            else:
                self._until.pop(key, None)

    def blocked_for_s(self, key: UpstreamKey) -> float:
        """Seconds until `key` may be called again; 0.0 when it may be called now."""
        with self._lock:
            until = self._until.get(key)
            if until is None:
                return 0.0
            left = until - self._clock()
            if left < _MIN_BLOCK_S:
                del self._until[key]
                return 0.0
            return left

    def block(self, key: UpstreamKey, seconds: float) -> None:
        """Hold off `key` for `seconds` from now (a `retry-after` too long to wait for); a longer
        block already recorded stays."""
        with self._lock:
            until = self._clock() + max(0.0, seconds)
            self._until[key] = max(until, self._until.get(key, until))

    def clear(self) -> None:
        """Forget every block (tests)."""
        with self._lock:
            self._until.clear()


# The process's book, fed by `routing.providers.openai_remote`, read by `routing.upstream.resilience`.
book = UpstreamLimitBook()
