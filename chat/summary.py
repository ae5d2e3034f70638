"""The rolling summary's database half: turns of a conversation that left the prompt window are
folded into ``Conversation.summary`` after a remote answer whose prompt left them out, by the
Celery task ``chat.tasks.summarise_conversation`` (which takes the conversation's id only;
enqueued by ``chat.tasks.maybe_summarise_async``).

The router decides which turns left the window and writes the summary (``routing.services``:
``summary_turns_due``, ``summary_compose``); this module reads the turns and
stores the result with a compare-and-set on ``Conversation.summary_upto_seq`` (the seq up to
which the summary reaches), so two summaries of one conversation never overwrite each other.

A summary is asked for only after a remote answer whose prompt left out turns no summary covers
(``Answer.summary_due``, from the prompt's own history: no extra query); turns answered without a
model never cause one on their own. Its cost counts against the shopper's spend budgets like
their answers' (``SummaryWork.payer``: the verified customer, else the conversation and its
address; ``routing.upstream.budgets``); a spent budget means no summary.
"""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass

from django.conf import settings
from django.core.cache import cache
from django.db import OperationalError

from routing import services as router
from routing.types import Payer

from .models import Conversation, Message, MessageState, Role

log = logging.getLogger(__name__)

Turn = list[tuple[str, str]]

#: Tries of the summary's write when the database says it is locked (waits 0.05, 0.1, 0.2, 0.4 s).
SUMMARY_WRITE_TRIES = 5


@dataclass(frozen=True)
class SummaryWork:
    """Turns of a conversation that left the prompt window and are not summarised yet.

    ``previous``: the summary so far; ``upto_seq``: the seq it reaches (0: none);
    ``turns``: the turns to fold in, ``(role, text)`` oldest first; ``new_upto_seq``: the seq of
    their last message; ``locale``: the conversation's; ``payer``: whose spend budgets the summary
    call counts against (the shopper's, as for their answers: ``routing.types.Payer``)."""

    previous: str
    upto_seq: int
    turns: list[Turn]
    new_upto_seq: int
    locale: str
    payer: Payer | None = None


def summary_work(*, conversation_id: uuid.UUID) -> SummaryWork | None:
    """The turns of the conversation that left the prompt window (``routing.services.
    summary_turns_due``) and are not in ``Conversation.summary`` yet; None when fewer than
    ``KEFU_SUMMARY_MIN_TURNS`` (or the setting is 0). Finished, non-system messages only.
    Synchronous (ORM, tokenizer): not on the event loop."""
    if router.summary_min_turns() <= 0:
        return None
    conv = (
        Conversation.objects.filter(pk=conversation_id)
        .values("summary", "summary_upto_seq", "locale", "customer_id", "address_key")
        .first()
    )
    if conv is None:
        return None
    rows = list(
        Message.objects.filter(
            conversation_id=conversation_id, seq__gt=conv["summary_upto_seq"], state=MessageState.DONE
        )
        .exclude(role=Role.SYSTEM)
        .exclude(text="")
        .order_by("seq")
        .values_list("seq", "role", "text")
    )
    turns: list[list[tuple[int, str, str]]] = []
    for seq, role, body in rows:
        if role == Role.SHOPPER or not turns:
            turns.append([])
        turns[-1].append((seq, role, body))
    plain = [[(r, b) for _, r, b in t] for t in turns]
    older = turns[: router.summary_turns_due(turns=plain, summary=conv["summary"], locale=conv["locale"])]
    if not older or len(older) < router.summary_min_turns():
        return None
    return SummaryWork(
        previous=conv["summary"],
        upto_seq=conv["summary_upto_seq"],
        turns=plain[: len(older)],
        new_upto_seq=older[-1][-1][0],
        locale=conv["locale"],
        payer=(
            Payer(customer_id=conv["customer_id"])
            if conv["customer_id"]
            else Payer(conversation_id=conversation_id, address_key=conv["address_key"])
        ),
    )


def _claim_key(conversation_id: uuid.UUID, upto_seq: int) -> str:
    return f"kefu:summary-claim:{conversation_id.hex}:{upto_seq}"


def _claim(key: str) -> bool:
    """Take the claim ``key`` (Django's cache ``add``: atomic in Redis, shared by every worker);
    False when another task holds it. A claim lasts as long as a task may run
    (``KEFU_CELERY_TASK_TIME_LIMIT_S``): the task of a killed worker is handed out again only after
    the longer visibility timeout, and finds its claim gone. A cache that fails is no reason to
    skip a summary: True."""
    try:
        return bool(cache.add(key, 1, timeout=settings.KEFU_CELERY_TASK_TIME_LIMIT_S))
    except Exception:  # Redis down: proceed; at worst a summary is paid twice
        log.warning("claiming summary window %s failed; summarising anyway", key, exc_info=True)
        return True


def _unclaim(key: str) -> None:
    try:
        cache.delete(key)
    except Exception:  # it expires on its own
        log.warning("releasing summary window %s failed", key, exc_info=True)


def conversation_summarise(*, conversation_id: uuid.UUID) -> str | None:
    """Fold the turns that left the prompt window into ``Conversation.summary`` (with the
    previous summary) and move ``summary_upto_seq`` to their last message. Returns the new
    summary, or None when nothing was due, no tier is configured, the call failed or was cut,
    another task is summarising the same window now (a claim in the shared cache, so duplicate or
    redelivered tasks pay for one summary), the shopper's spend budget refused it, or another summary of the same conversation was stored
    meanwhile (compare-and-set on ``summary_upto_seq``). Never raises for upstream failures.
    Blocking."""
    if not router.summaries_on():
        return None  # no model: older turns are simply kept out of the prompt
    work = summary_work(conversation_id=conversation_id)
    if work is None:
        return None
    claim = _claim_key(conversation_id, work.upto_seq)
    if not _claim(claim):
        return None  # another task summarises this window now: it is paid once
    try:
        text = router.summary_compose(
            previous=work.previous,
            turns=work.turns,
            locale=work.locale,
            conversation_id=conversation_id,
            payer=work.payer,
        )
    finally:
        _unclaim(claim)
    if not text:
        return None
    # update(): no auto_now bump (the console orders by activity; a summary is none).
    for attempt in range(SUMMARY_WRITE_TRIES):
        try:
            stored = Conversation.objects.filter(pk=conversation_id, summary_upto_seq=work.upto_seq).update(
                summary=text, summary_upto_seq=work.new_upto_seq
            )
            return text if stored else None
        except OperationalError:
            # SQLite refuses a write while another connection writes the table ("database is
            # locked" past its busy timeout; at once in shared-cache mode): a background write
            # waits its turn instead of losing a paid summary.
            if attempt == SUMMARY_WRITE_TRIES - 1:
                raise
            time.sleep(0.05 * 2**attempt)
    return None
