"""Whether a shopper has a socket open, in every process alike: when each conversation's shopper
was last seen connected.

Each process counts its own open shopper sockets per conversation and writes "seen now" for each
of them into the cache (shared by every process with ``REDIS_URL``; the one process's memory
otherwise) when a socket says ``hello``, when it closes, and on every sweep
(``chat.sweeper``, every ``KEFU_AGENT_SWEEP_S``, 5 s). So a shopper with a socket open anywhere was
seen within a sweep or two; one whose process was killed stops being seen, like an agent's lease.
:func:`last_seen` is what ``chat.mail`` asks: a reply is e-mailed only when nothing was seen for
``KEFU_EMAIL_OFFLINE_S`` (30 s), and carries only the messages written after the shopper was last
seen (the ones a live socket did not show).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import Counter

from django.core.cache import cache

log = logging.getLogger(__name__)

#: How long a "seen" mark is kept (seconds): a day; an older one reads as "not seen".
SEEN_TTL_S = 24 * 3600

_open: Counter[uuid.UUID] = Counter()


def _key(conversation_id: uuid.UUID) -> str:
    return f"kefu:shopper-seen:{conversation_id.hex}"


def _marks(conversation_ids: list[uuid.UUID]) -> dict[str, float]:
    now = time.time()
    return {_key(cid): now for cid in conversation_ids}


async def _amark(conversation_id: uuid.UUID) -> None:
    try:
        await cache.aset_many(_marks([conversation_id]), SEEN_TTL_S)
    except Exception:  # the cache is down: the socket still works; the next sweep marks it again
        log.warning("marking the shopper of %s as seen failed", conversation_id, exc_info=True)


async def socket_joined(conversation_id: uuid.UUID) -> None:
    """A shopper socket of this process now shows ``conversation_id`` (after its ``hello``)."""
    _open[conversation_id] += 1
    await _amark(conversation_id)


async def socket_left(conversation_id: uuid.UUID) -> None:
    """That socket closed: the shopper was seen until now."""
    _open[conversation_id] -= 1
    if _open[conversation_id] <= 0:
        del _open[conversation_id]
    await _amark(conversation_id)


def refresh() -> int:
    """Mark every conversation with a socket open in this process as seen now (the sweep;
    blocking); returns how many."""
    ids = list(_open)
    if ids:
        cache.set_many(_marks(ids), SEEN_TTL_S)
    return len(ids)


def last_seen(conversation_ids: list[uuid.UUID]) -> dict[uuid.UUID, float]:
    """When each of ``conversation_ids``' shoppers was last seen connected (Unix seconds); a
    conversation missing from the result was not seen in the last ``SEEN_TTL_S``."""
    found = cache.get_many([_key(cid) for cid in conversation_ids])
    return {cid: float(found[_key(cid)]) for cid in conversation_ids if _key(cid) in found}
