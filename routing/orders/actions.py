"""The ``action`` route: order questions answered from the store's own data, with no model call.

When the FAQ model resolves an order intent ("where is my order?", "cancel my order") and the
order is known, the router asks the store (``store.services``, the store part's door: it checks
who may see which order) and answers from a template (:mod:`routing.orders.replies`). An order is
known when:

* the shopper is verified (signed identity) — their own orders, the one named in the message or
  the one the intent points at (the newest open order for "where is my order?", the newest
  unpacked one for a cancellation...);
* the message names an order number *and* the e-mail address it was placed with;
* the conversation proved an order earlier (``store.services.orders_known``).

Otherwise the FAQ answer is given as before (route ``faq``) with an offer to look the order up.
A message naming an order (number and e-mail) that matched no FAQ intent is taken as "where is
it?" (the shopper is answering that offer).

Changes (cancel, return, new address) are never made on the first message: the bot says what it
will do and asks for a "yes" (``store.services.pending_offer``); a "yes" within
``KEFU_STORE_CONFIRM_TTL_S`` makes the change once (its idempotency key), a "no" forgets it.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass

from asgiref.sync import sync_to_async
from django.conf import settings

from routing.orders import replies, task_state
from routing.types import Question
from store import services as store
from store.types import Order, Owner, StoreError

log = logging.getLogger(__name__)

__all__ = [
    "ActionReply",
    "ChooseOrder",
    "answer_order",
    "ask_which",
    "confirm_decision",
    "email_in",
    "find_order",
    "intent_action",
    "intent_decision",
    "order_number_in",
    "reference_decision",
    "yes_or_no",
]

# An e-mail address as shoppers type it (not RFC 5322's full grammar: enough to find one in a message).
_EMAIL = re.compile(r"[A-Za-z0-9._%+\-]+@[A-Za-z0-9\-]+(?:\.[A-Za-z0-9\-]+)*\.[A-Za-z]{2,}")

_YES = re.compile(
    r"^\s*(?:yes|yeah|yep|yup|y|sure|ok(?:ay)?|confirm(?:ed)?|please do|go ahead|do it|"
    r"yes,? please|please|correct|that'?s right|是|是的|好|好的|确认|可以|对|对的|嗯|行|要|好啊|没问题)\s*[.!。！,，]*\s*$",
    re.IGNORECASE,
)
_NO = re.compile(
    r"^\s*(?:no|nope|nah|n|don'?t|do not|no,? thanks?|no thank you|never ?mind|leave it|keep it|"
    r"not now|no need|不|不要了?|不用了?|不需要了?|不了|算了|不是|别|没事了?|不用了?谢谢|不了谢谢)\s*[.!。！,，]*\s*$",
    re.IGNORECASE,
)


def order_number_in(text: str) -> str | None:
    """The order number a message names, by ``KEFU_ORDER_NUMBER_PATTERN`` (the first non-empty
    group of its first match), or None. The default finds ``KF-1001``, ``#1001`` and
    ``order 1001`` / ``订单号 1001`` (3-12 digits), not a bare number (a phone, a postcode)."""
    for m in re.finditer(settings.KEFU_ORDER_NUMBER_PATTERN, text):
        for group in m.groups() or (m.group(0),):
            if group:
                return group.strip()
    return None


def email_in(text: str) -> str | None:
    """The first e-mail address in ``text``, or None."""
    m = _EMAIL.search(text)
    return m.group(0) if m else None


def yes_or_no(text: str) -> bool | None:
    """True for a short "yes" (English or Chinese: "yes", "ok", "go ahead", "好的", "确认"),
    False for a short "no", None for anything else (a longer message is a new question)."""
    if len(text) > 40:
        return None
    if _YES.match(text):
        return True
    if _NO.match(text):
        return False
    return None


# A reply that only names an order ("it's #1003, mei@example.com", "where is my order KF-1001?
# my e-mail is ...") has at most this many words besides the order number, the e-mail and the
# words of asking where an order is (_REFERENCE_WORDS). A longer message asks something about
# the order, which the remote model answers with the store's tools (routing.orders.tools).
REFERENCE_MAX_WORDS = 3
_REFERENCE_WORDS = frozenset(
    [
        "a",
        "about",
        "address",
        "an",
        "and",
        "any",
        "at",
        "can",
        "check",
        "could",
        "e",
        "email",
        "for",
        "have",
        "hello",
        "hi",
        "i",
        "is",
        "it",
        "it's",
        "its",
        "look",
        "mail",
        "me",
        "my",
        "no",
        "number",
        "of",
        "on",
        "order",
        "orders",
        "package",
        "parcel",
        "please",
        "placed",
        "s",
        "status",
        "tell",
        "thank",
        "thanks",
        "the",
        "this",
        "to",
        "track",
        "tracking",
        "under",
        "up",
        "what",
        "where",
        "with",
        "was",
        "you",
        "your",
    ]
)


def only_a_reference(text: str) -> bool:
    """Whether ``text`` does little more than name an order (its number, an e-mail and at most
    ``REFERENCE_MAX_WORDS`` words other than those of asking where an order is; in Chinese, at
    most 8 characters besides 订单, 邮箱 and the like)."""
    rest = _EMAIL.sub(" ", re.sub(settings.KEFU_ORDER_NUMBER_PATTERN, " ", text))
    words = [w for w in re.findall(r"[a-z']+", rest.lower()) if w not in _REFERENCE_WORDS]
    han = re.sub(r"订单|邮箱|号码|单号|我的|查询|查一下|在哪|哪里|状态|请|是", "", rest)
    return len(words) <= REFERENCE_MAX_WORDS and len(re.findall(r"[\u4e00-\u9fff]", han)) <= 8


def without_references(text: str) -> str:
    """``text`` without its e-mail addresses, which the FAQ model reads as the words "mei",
    "chen", "example", "com" (an appended e-mail took its confidence on Bitext's order questions
    from 46% to 35%, bench/order_actions_eval.py). Order numbers stay: the model masks digits,
    and its phrasings hold numbers too (taking them out cost the Bitext FAQ check 2 of 196
    answers). ``text`` itself when nothing is left."""
    rest = re.sub(r"\s+", " ", _EMAIL.sub(" ", text)).strip()
    return rest if re.search(r"\w", rest) else text


def intent_action(intent: str) -> str | None:
    """The store action an FAQ intent asks for (``KEFU_ACTION_INTENTS``: ``track_order`` ->
    ``status``...), or None."""
    action = settings.KEFU_ACTION_INTENTS.get(intent)
    return action if isinstance(action, str) else None


@dataclass(frozen=True, slots=True)
class ActionReply:
    """A whole answer from the store's data or a change's outcome (frozen): ``text`` in the
    shopper's language, ``reason`` in the router's own words, ``route`` ``action`` (or ``faq``:
    the FAQ answer with a store note or an offer to look the order up) and the FAQ entry it
    came from (``faq_entry_id``, None for none). ``routing.decide.strategy`` makes it a decision,
    never shareable: an order's answer is its shopper's alone (no cache, no single flight)."""

    text: str
    reason: str
    route: str = "action"
    faq_entry_id: int | None = None


def _reply(text: str, reason: str, *, route: str = "action", faq_entry_id: int | None = None) -> ActionReply:
    return ActionReply(text=text, reason=reason, route=route, faq_entry_id=faq_entry_id)


def _actor(question: Question, purpose: str = "action") -> store.Actor:
    return store.Actor(
        kind="bot", purpose=purpose, conversation_id=question.conversation_id, message_id=question.message_id
    )


async def confirm_decision(question: Question, locale: str) -> ActionReply | None:
    """A short "yes"/"no" to a change the bot offered in this conversation: make the change (or
    forget it) and say so (route ``action``). None when the message is not a yes/no, or there
    is no offer waiting (one indexed query, only for a yes/no)."""
    answer = yes_or_no(question.text)
    if answer is None or question.conversation_id is None or not store.store_on():
        return None
    cid = question.conversation_id
    if not answer:
        pending = await sync_to_async(store.pending_peek, thread_sensitive=False)(cid)
        if pending is None:
            return None
        await sync_to_async(store.pending_drop, thread_sensitive=False)(cid)
        return _reply(replies.kept(pending.action, pending.order_number, locale), f"action {pending.action} declined")
    taken = await sync_to_async(store.pending_take, thread_sensitive=False)(cid)
    if taken is None:
        return None
    try:
        result = await store.action_run_async(
            taken.owner,
            taken.action,
            taken.order_number,
            actor=_actor(question, "confirm"),
            idempotency_key=taken.idempotency_key,
            arguments=taken.arguments,
        )
    except StoreError as e:
        log.info("confirmed %s of an order failed: %s", taken.action, e.code)
        return _reply(replies.store_error(e, locale, number=taken.order_number), f"action {taken.action} {e.code}")
    return _reply(replies.done(result, locale), f"action {taken.action} done{' (repeat)' if result.repeated else ''}")


#: At most this many orders are listed for "which one?".
MAX_CHOICES = 5


class ChooseOrder(Exception):
    """A verified shopper's change could be about several of their ``orders`` (newest first):
    the shopper is asked which one (``replies.which_order``)."""

    def __init__(self, orders: tuple[Order, ...]) -> None:
        super().__init__(f"{len(orders)} orders to choose from")
        self.orders = orders


async def ask_which(question: Question, locale: str, action: str, orders: tuple[Order, ...]) -> ActionReply:
    """Ask which of ``orders`` ``action`` is about; the task keeps them as its choices, so "the
    second one" or an order number completes it."""
    cid = question.conversation_id
    if cid is not None:
        await sync_to_async(store.pending_drop, thread_sensitive=False)(cid)
        task = task_state.Task(intent=action, choices=tuple(o.number for o in orders))
        await task_state.task_save_async(cid, question.session_from_seq, task)
    return _reply(replies.which_order(orders, locale), f"action {action}: which of {len(orders)} orders")


async def _order_for(
    question: Question, action: str, number: str | None, email: str | None
) -> tuple[Order, Owner] | None:
    """The order ``action`` is about and its owner, or None when the order is not known (the
    caller offers to look it up). Raises ``StoreError`` (not found, upstream)."""
    actor = _actor(question)
    if question.customer_id:
        owner = Owner(customer_id=question.customer_id)
        if number:
            return await store.order_view_async(owner, number, actor=actor, action=_read(action)), owner
        orders = await store.orders_list_async(owner, actor=actor)
        several = replies.candidates(orders, action)
        if len(several) > 1:
            raise ChooseOrder(tuple(several[:MAX_CHOICES]))
        chosen = replies.pick(orders, action)
        return (chosen, owner) if chosen is not None else None
    if number and email:
        owner = Owner(email=email)
        return await store.order_view_async(owner, number, actor=actor, action=_read(action)), owner
    if question.conversation_id is None:
        return None
    known = await sync_to_async(store.orders_known, thread_sensitive=False)(question.conversation_id)
    for known_number, owner in known:
        if number is None or known_number == number:
            return await store.order_view_async(owner, known_number, actor=actor, action=_read(action)), owner
    return None


async def find_order(
    question: Question, action: str, number: str | None, email: str | None
) -> tuple[Order, Owner] | None:
    """The order ``action`` is about, with its owner: a verified shopper's own (named, or the one
    the action points at), an order number with the e-mail it was placed with, or an order the
    conversation proved earlier; None when it is not known yet (a piece is missing). Raises
    ``StoreError`` (``not_found`` for a wrong number or e-mail, ``upstream``...), or
    :class:`ChooseOrder` when a verified shopper's change could be about several orders."""
    return await _order_for(question, action, number, email)


def _read(action: str) -> str:
    """The audit log's name for the look-up behind ``action``."""
    return "refund_status" if action == "refund_status" else "status"


async def intent_decision(
    question: Question, locale: str, *, action: str, faq_text: str, faq_entry_id: int | None
) -> ActionReply:
    """The answer to an order intent (``action``, see :func:`intent_action`): from the store when
    the order is known (route ``action``), else ``faq_text`` with an offer to look the order up
    (route ``faq``). A store that fails or does not answer in time gives the FAQ answer and a
    note to try again (route ``faq``). Never raises for the store's failures."""
    number, email = order_number_in(question.text), email_in(question.text)
    try:
        found = await _order_for(question, action, number, email)
    except ChooseOrder as several:
        return await ask_which(question, locale, action, several.orders)
    except StoreError as e:
        if e.code == "not_found":
            return _reply(replies.store_error(e, locale, number=number or ""), f"action {action} not_found")
        log.warning("store lookup for %s failed: %s", action, e.code)
        text = f"{faq_text}\n\n{replies.store_error(e, locale)}"
        return _reply(text, f"faq, store {e.code}", route="faq", faq_entry_id=faq_entry_id)
    if found is None:
        if question.customer_id:
            # Nothing of that kind on their account ("where is my refund?" with none): the
            # store's general answer, and what their orders show.
            text = f"{faq_text}\n\n{replies.no_order_for(action, locale)}"
            return _reply(text, f"faq, no order for {action}", route="faq", faq_entry_id=faq_entry_id)
        # The task waits for the missing pieces (routing.orders.tasks): the next message may
        # bring only the e-mail, or only the order number. It replaces any earlier task.
        await _task_start(question, action, number, email)
        text = f"{faq_text}\n\n{replies.offer_lookup(locale, number_given=bool(number))}"
        return _reply(text, f"faq, order unknown for {action}", route="faq", faq_entry_id=faq_entry_id)
    order, owner = found
    return await _answer(question, locale, action, order, owner)


async def reference_decision(question: Question, locale: str) -> ActionReply | None:
    """A message that only names an order the shopper may see (a number and its e-mail, or a
    verified shopper's number; :func:`only_a_reference`) and matched no FAQ intent: its status
    (route ``action``). None when the message names no order, says more than that, or no store
    is configured."""
    if not store.store_on():
        return None
    number = order_number_in(question.text)
    if number is None or not only_a_reference(question.text):
        return None
    email = email_in(question.text)
    if not question.customer_id and email is None:
        return None
    action = reference_action(question.text)
    try:
        found = await _order_for(question, action, number, email)
    except StoreError as e:
        return _reply(replies.store_error(e, locale, number=number), f"action {action} {e.code}")
    if found is None:
        return None
    return await _answer(question, locale, action, *found)


_REFERENCE_ACTIONS = (
    ("refund_status", re.compile(r"refund|money back|reimburs|退款|退钱", re.IGNORECASE)),
    ("cancel", re.compile(r"cancel|取消|don'?t want|不要了", re.IGNORECASE)),
    ("return", re.compile(r"\breturn|send (?:it )?back|退货|退回", re.IGNORECASE)),
    ("change", re.compile(r"\bchange|modify|amend|修改|更改", re.IGNORECASE)),
)


def reference_action(text: str) -> str:
    """What a short message naming an order asks for, by its words: ``refund_status``
    ("refund", "退款"), ``cancel``, ``return``, ``change``, else ``status``."""
    for action, words in _REFERENCE_ACTIONS:
        if words.search(text):
            return action
    return "status"


async def _task_start(question: Question, action: str, number: str | None, email: str | None) -> None:
    """Make ``action`` the conversation's task, waiting for its missing pieces; an offer waiting
    from an earlier task is forgotten (a "yes" now answers this one)."""
    cid = question.conversation_id
    if cid is None:
        return
    await sync_to_async(store.pending_drop, thread_sensitive=False)(cid)
    task = task_state.Task(intent=action, order_number=number or "", email=email or "")
    await task_state.task_save_async(cid, question.session_from_seq, task)


async def _task_end(question: Question) -> None:
    """The conversation's task is over (answered, refused, or handed on): forget it and any
    offer left from it."""
    cid = question.conversation_id
    if cid is None:
        return
    if await task_state.task_drop_async(cid):
        await sync_to_async(store.pending_drop, thread_sensitive=False)(cid)


async def answer_order(question: Question, locale: str, action: str, order: Order, owner: Owner) -> ActionReply:
    """What ``action`` on ``order`` (which ``owner`` proved) gives: the status or refund
    (route ``action``, the task ends), why it cannot be done (the task ends), what to send for a
    change, or the offer of a change waiting for a yes (the task then awaits ``confirm``)."""
    return await _answer(question, locale, action, order, owner)


async def _answer(question: Question, locale: str, action: str, order: Order, owner: Owner) -> ActionReply:
    cid = question.conversation_id
    if cid is not None:
        await sync_to_async(store.order_remember, thread_sensitive=False)(cid, owner, order.number)
    if action not in ("cancel", "return") or not replies.possible(order, action)[0]:
        await _task_end(question)
    if action in ("status", "refund_status"):
        text = replies.refund(order, locale) if action == "refund_status" else replies.status(order, locale)
        return _reply(text, f"action {action} {order.number}")
    possible, why = replies.possible(order, action)
    if not possible:
        return _reply(replies.not_possible(order, action, locale), f"action {action} refused: {why}")
    if action in ("change", "change_address"):
        # What to change comes in the shopper's own words (a new address, other items): the
        # remote model's tool call or a person reads it; the bot says it can still be done.
        text = replies.address_ask(order, locale) if action == "change_address" else replies.change_ask(order, locale)
        return _reply(text, f"action {action} ask {order.number}")
    if cid is None:
        return _reply(replies.status(order, locale), f"action {action}: no conversation to confirm in")
    await sync_to_async(store.pending_offer, thread_sensitive=False)(cid, owner, action, order.number)
    task = task_state.Task(
        intent=action, order_number=order.number, email="" if owner.customer_id else owner.email, awaiting="confirm"
    )
    await task_state.task_save_async(cid, question.session_from_seq, task)
    return _reply(replies.offer(order, action, locale), f"action {action} offered {order.number}")
