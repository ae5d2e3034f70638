"""Client-side limits per tier: concurrent streams, requests per minute, tokens per minute.

Set per tier (``KEFU_<TIER>_MAX_CONCURRENCY``, ``_RPM``, ``_TPM``; 0 = no limit) to stay under
the upstream account's limits instead of collecting 429s. Requests and tokens per minute use the
``limits`` library's moving window, in Redis when ``REDIS_URL`` is set (all processes share one
budget), in memory otherwise; the concurrency count is per process.

A request's tokens are estimated before it is sent the way OpenAI's rate limiter counts them
(OpenAI "Rate limits" guide: a request counts as its estimated prompt tokens plus its
``max_tokens``): prompt characters / 4 (OpenAI's rule of thumb for English) plus ``max_tokens``.
The exact count would need the tokenizer, whose first load takes seconds: not on this path.

``admit`` never waits: a tier over a limit is refused at once with the seconds until it would
have room, and the router decides (fall back, or wait when no other tier is left).

A tier's canary candidate (routing.upstream.canary) is limited with the tier's numbers but counted apart
(its own slots and windows): providers limit each model on its own.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, Literal

from limits import RateLimitItemPerMinute
from redis.exceptions import RedisError

from lib.ratelimit import moving_window
from routing.upstream.tiers import tier_settings

log = logging.getLogger(__name__)

__all__ = ["Refusal", "admit", "estimate_tokens", "release", "reset"]

RefusalReason = Literal["concurrency", "local_rpm", "local_tpm"]


@dataclass(frozen=True)
class Refusal:
    """Why a tier may not be called now, and in how many seconds it may (None: unknown, e.g.
    when a concurrent stream has to end first)."""

    reason: RefusalReason
    retry_in_s: float | None


_in_flight: Counter[str] = Counter()
_in_flight_lock = threading.Lock()


_limiters = moving_window(key_prefix="kefu-tiers")


def estimate_tokens(messages: list[dict[str, Any]], max_tokens: int | None) -> int:
    """Tokens a request counts against a tokens-per-minute limit: ceil(prompt characters / 4)
    + ``max_tokens`` (0 when unset). Content parts other than text are not counted."""
    chars = 0
    for message in messages:
        content = message.get("content")
        if isinstance(content, str):
            chars += len(content)
        elif isinstance(content, list):
            chars += sum(len(str(p.get("text", ""))) for p in content if isinstance(p, dict))
    return math.ceil(chars / 4) + (max_tokens or 0)


def _lane(tier: str, variant: str) -> str:
    """What a deployment's slots and windows are counted under: the tier, or ``<tier>:candidate``."""
    return tier if variant == "current" else f"{tier}:{variant}"


async def admit(tier: str, *, tokens: int, variant: str = "current") -> Refusal | None:
    """Take a slot of ``tier`` (its own model, or its ``variant`` ``candidate``) for one request
    of ``tokens`` estimated tokens, or say why not.

    On None (admitted) the caller holds one concurrency slot and must ``release(tier, variant)``
    when the stream ends, whatever the outcome. On a ``Refusal`` nothing was taken.
    """
    cfg = tier_settings(tier)
    max_concurrency, rpm, tpm = cfg.max_concurrency, cfg.rpm, cfg.tpm
    lane = _lane(tier, variant)
    with _in_flight_lock:
        if max_concurrency and _in_flight[lane] >= max_concurrency:
            return Refusal("concurrency", None)
        _in_flight[lane] += 1
    try:
        if rpm or tpm:
            limiter = _limiters.get()
            # (reason, limit, key, cost); the key names the budget, so equal numbers never share one.
            checks: list[tuple[RefusalReason, RateLimitItemPerMinute, str, int]] = []
            if rpm:
                checks.append(("local_rpm", RateLimitItemPerMinute(rpm), "requests", 1))
            if tpm:
                # A request larger than the whole budget could never pass: count it as the budget.
                checks.append(("local_tpm", RateLimitItemPerMinute(tpm), "tokens", min(tokens, tpm)))
            for reason, item, budget, cost in checks:
                if not await limiter.test(item, "tier", lane, budget, cost=cost):
                    stats = await limiter.get_window_stats(item, "tier", lane, budget)
                    release(tier, variant)
                    return Refusal(reason, max(0.0, stats.reset_time - time.time()))
            for _reason, item, budget, cost in checks:
                await limiter.hit(item, "tier", lane, budget, cost=cost)
    except RedisError as e:
        # Fails open: the shared budget's Redis is unreachable even after its retries. The
        # upstream's own 429s (and the breaker) still protect the account meanwhile.
        log.warning("tier %s rate budget unavailable (%r); request admitted", tier, e)
    except BaseException:
        release(tier, variant)
        raise
    return None


def release(tier: str, variant: str = "current") -> None:
    """Give back the concurrency slot taken by a successful ``admit``."""
    lane = _lane(tier, variant)
    with _in_flight_lock:
        _in_flight[lane] -= 1
        if _in_flight[lane] <= 0:
            del _in_flight[lane]


def in_flight(tier: str, variant: str = "current") -> int:
    """Streams of ``tier`` (its ``variant``) running in this process now."""
    with _in_flight_lock:
        return _in_flight[_lane(tier, variant)]


def reset() -> None:
    """Forget the per-loop limiters (after a settings change; tests). Counts in flight stay."""
    _limiters.clear()
