"""Tasks that span messages: a shopper's order request completed piece by piece.

A task (``routing.orders.task_state``, one per conversation session) is what the shopper is
trying to do (cancel, return, change, track, refund status), the order number and e-mail given
so far, and what kefu waits for: a missing piece, a yes/no to a change it offered (``confirm``),
or a yes/no to checking an expired task again (``recheck``). The template path
(``routing.orders.actions``) and the remote model's tool path (``routing.orders.tools``) both
start and advance it; agents see and clear it in the console.

:func:`continue_task` runs before anything else of the router's own (after the handoff checks):
a message that only supplies a piece — an e-mail address, an order number, "the second one" (of
the orders kefu listed), "yes"/"ok"/"是的", "no"/"不用了" — completes the pending task, the pieces in any order. Today's safety rules hold:
an anonymous shopper proves the order with the e-mail it was placed with (the store's door
checks it), and a change is made only after an explicit yes, once (the offer's idempotency key,
``store.services.pending_take``). Any other message leaves the task as it is (an unrelated
question is answered without dropping it); a new order request replaces it; a task older than
``KEFU_STORE_CONFIRM_TTL_S`` is not continued but announced as expired ("shall I check again?");
"no" drops it. With nothing pending, a bare yes/no is answered by kefu itself (route
``decline``), unless the last bot answer was a remote model's question: then it goes back to
that route, with its history.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass

from asgiref.sync import sync_to_async

from routing.orders import actions, replies, task_state
from routing.orders.actions import ActionReply
from routing.types import HistoryLoader, Question
from store import services as store
from store.types import StoreError

log = logging.getLogger(__name__)

__all__ = ["TaskStep", "asks_a_question", "continue_task"]

# A bot answer "asks a question" when a question mark ends it or one of its last sentences.
_ASKS = re.compile(r"[?？][^?？]{0,80}$")


# "The second one", "2nd", "the last one", "第二个", "最后一个": a pick among the orders kefu listed.
_ORDINAL_EN = {"first": 0, "1st": 0, "second": 1, "2nd": 1, "third": 2, "3rd": 2, "fourth": 3, "4th": 3}
_ORDINAL = re.compile(
    r"^\s*(?:the\s+)?(first|1st|second|2nd|third|3rd|fourth|4th|last)(?:\s+(?:one|order))?(?:,?\s*please)?\s*[.!]*\s*$"
    r"|^\s*(?:是)?(?:第([一二三四1-4])|(最后))(?:个|一个)?(?:订单)?\s*[。！!.]*\s*$",
    re.IGNORECASE,
)


def ordinal_in(text: str) -> int | None:
    """The position a short message picks ("the second one" -> 1, "第一个" -> 0, "the last one"
    -> -1), or None. Only for a message that says nothing else."""
    m = _ORDINAL.match(text)
    if m is None:
        return None
    word, zh, last = m.group(1), m.group(2), m.group(3)
    if (word or "").lower() == "last" or last:
        return -1
    if word:
        return _ORDINAL_EN[word.lower()]
    return int(zh) - 1 if zh.isdigit() else "一二三四".index(zh)


# A piece that asks where an order is ("where is KF-1001?") starts a status task of its own.
_ASKS_STATUS = re.compile(r"\bwhere\b|\btrack|\bstatus\b|\bshipped\b|\barriv|在哪|物流|状态|到哪", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class TaskStep:
    """What :func:`continue_task` made of a message (frozen): ``reply`` the whole answer (route
    ``action``, or ``decline`` for a bare yes/no with nothing pending), or ``follow_up_route``
    the route of the last bot answer, whose question this yes/no answers (``"llm.simple"``...:
    the router sends the message there, with its history)."""

    reply: ActionReply | None = None
    follow_up_route: str = ""


def asks_a_question(text: str) -> bool:
    """Whether a bot answer ends by asking the shopper something (a ``?``/``？`` in its last
    ~80 characters)."""
    return bool(_ASKS.search(text.strip()))


def _reply(text: str, reason: str, route: str = "action") -> TaskStep:
    return TaskStep(reply=ActionReply(text=text, reason=reason, route=route))


async def continue_task(question: Question, locale: str, history: HistoryLoader) -> TaskStep | None:
    """Continue the conversation's task with ``question`` (see the module docstring), or None
    when the message is not a piece of one (the router goes on as usual). Costs one indexed
    query for a piece (a yes/no, an e-mail or an order number with little else) and none for
    any other message; a bare yes/no with nothing pending also loads the last turn (``history``).
    Never raises for the store's failures (said in the reply); raises what ``history`` raises."""
    text = question.text
    yes = actions.yes_or_no(text)
    number, email = actions.order_number_in(text), actions.email_in(text)
    pick = ordinal_in(text)
    piece = yes is not None or pick is not None or ((number or email) is not None and actions.only_a_reference(text))
    if not piece:
        return None
    cid = question.conversation_id
    task = None
    if cid is not None and store.store_on():
        task = await task_state.task_get_async(cid, question.session_from_seq)
    if task is not None and task.intent == "product":
        return None  # an earlier version's "which one?" between products: no order task
    if task is not None:
        if pick is not None and number is None and task.choices:
            number = task.choices[pick] if -len(task.choices) <= pick < len(task.choices) else None
            if number is None:
                return _reply(replies.pick_again(len(task.choices), locale), f"task {task.intent}: no such pick")
        elif pick is not None and yes is None and number is None and email is None:
            return None  # "the second one" with nothing listed: not this task's piece
        return await _advance(question, locale, task, yes, number, email)
    if yes is None:
        return None  # an order named with nothing pending: routing.orders.actions.reference_decision
    if question.seq > 1:
        past = await history(before_seq=question.seq, turns=1)
        last = past.turns[-1] if past.turns else None
        if past.last_route.startswith("llm.") and last is not None and last[0] == "bot" and asks_a_question(last[1]):
            return TaskStep(follow_up_route=past.last_route)
    return _reply(replies.nothing_pending(yes, locale), "yes/no with nothing pending", route="decline")


async def _advance(
    question: Question,
    locale: str,
    task: task_state.Task,
    yes: bool | None,
    number: str | None,
    email: str | None,
) -> TaskStep:
    cid = question.conversation_id
    assert cid is not None
    session = question.session_from_seq
    if yes is False:
        await task_state.task_drop_async(cid)
        await sync_to_async(store.pending_drop, thread_sensitive=False)(cid)
        if task.awaiting == "confirm" and task.order_number:
            return _reply(replies.kept(task.intent, task.order_number, locale), f"task {task.intent} declined")
        return _reply(replies.task_dropped(locale), f"task {task.intent} dropped")
    if task.expired and task.awaiting != "recheck":
        # Nothing is done on an old task: the order may have moved on. Checking again needs a yes.
        await sync_to_async(store.pending_drop, thread_sensitive=False)(cid)
        kept = task_state.Task(
            intent=task.intent,
            order_number=number or task.order_number,
            email=email or task.email,
            awaiting="recheck",
            source=task.source,
        )
        await task_state.task_save_async(cid, session, kept)
        return _reply(replies.task_expired(locale), f"task {task.intent} expired")
    if yes is True and task.awaiting == "confirm":
        confirmed = await actions.confirm_decision(question, locale)
        if confirmed is not None:
            await task_state.task_drop_async(cid)
            return TaskStep(reply=confirmed)
        # The offer was taken (another socket confirmed it) or has expired: nothing more is done.
        again = task_state.Task(
            intent=task.intent, order_number=task.order_number, email=task.email, awaiting="recheck"
        )
        await task_state.task_save_async(cid, session, again)
        return _reply(replies.task_expired(locale), f"task {task.intent} offer gone")
    intent = task.intent
    if yes is None:
        # A piece: a new number replaces the old one; what the words ask for ("refund ...",
        # "where is ...") replaces the intent; a bare number or e-mail keeps the task's own.
        asked = actions.reference_action(question.text)
        if asked == "status" and not _ASKS_STATUS.search(question.text):
            asked = task.intent
        intent = asked
    return await _attempt(question, locale, intent, number or task.order_number, email or task.email)


async def _attempt(question: Question, locale: str, intent: str, number: str, email: str) -> TaskStep:
    """Look the task's order up with the pieces given so far; answer it, or ask for what is
    still missing."""
    cid = question.conversation_id
    assert cid is not None
    try:
        found = await actions.find_order(question, intent, number or None, email or None)
    except actions.ChooseOrder as several:
        return TaskStep(reply=await actions.ask_which(question, locale, intent, several.orders))
    except StoreError as e:
        # A wrong number or e-mail: the task keeps the number and waits for the right pair.
        if e.code == "not_found":
            await task_state.task_save_async(
                cid, question.session_from_seq, task_state.Task(intent=intent, order_number=number)
            )
        else:
            log.warning("store lookup for a task's %s failed: %s", intent, e.code)
        return _reply(replies.store_error(e, locale, number=number), f"task {intent} {e.code}")
    if found is None:
        if question.customer_id:
            await task_state.task_drop_async(cid)
            return _reply(replies.no_order_for(intent, locale), f"task {intent}: no order for it")
        await task_state.task_save_async(
            cid, question.session_from_seq, task_state.Task(intent=intent, order_number=number, email=email)
        )
        return _reply(replies.task_missing(intent, locale, number=number, email=email), f"task {intent} waits")
    order, owner = found
    return TaskStep(reply=await actions.answer_order(question, locale, intent, order, owner))
