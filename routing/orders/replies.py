"""The templates of the ``action`` route: what the bot says about an order, in English and
Chinese (other languages get the English text, as the other fixed answers do).

Pure functions of ``store.types`` values: no store call, no database. Dates are shown as dates
(UTC), money as the amount and its ISO 4217 currency code ("86.00 EUR").
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from decimal import Decimal

from store.services import ActionResult
from store.types import Address, Order, StoreError

__all__ = [
    "address_ask",
    "address_offer",
    "change_ask",
    "done",
    "kept",
    "no_order_for",
    "not_possible",
    "offer",
    "offer_lookup",
    "pick",
    "possible",
    "refund",
    "status",
    "store_error",
]


def _zh(locale: str) -> bool:
    return locale.split("-")[0].lower() == "zh"


def _date(when: datetime | None, locale: str) -> str:
    if when is None:
        return ""
    return (
        f"{when.year}年{when.month}月{when.day}日" if _zh(locale) else f"{when.day} {when.strftime('%b')} {when.year}"
    )


def _money(amount: Decimal, currency: str) -> str:
    return f"{amount.quantize(Decimal('0.01'))} {currency}"


def _items(order: Order, locale: str) -> str:
    titles = [line.title for line in order.lines if line.title]
    if not titles:
        return ""
    if len(titles) > 2:
        rest = len(titles) - 2
        return (
            "、".join(titles[:2]) + f" 等 {len(titles)} 件"
            if _zh(locale)
            else f"{', '.join(titles[:2])} and {rest} more"
        )
    return ("、" if _zh(locale) else " and ").join(titles)


def pick(orders: Sequence[Order], action: str) -> Order | None:
    """Which of a verified shopper's ``orders`` (newest first) an action without an order
    number means: for ``status`` the newest order still on its way (placed, packed, shipped),
    else the newest; for ``refund_status`` the newest with a refund, or cancelled or returned;
    for ``cancel``/``change_address`` the newest not yet packed, else the newest on its way;
    for ``return`` the newest delivered. None when there is none to speak of."""
    if not orders:
        return None
    open_ = [o for o in orders if o.status in ("placed", "packed", "shipped")]
    if action == "status":
        return open_[0] if open_ else orders[0]
    if action == "refund_status":
        return next((o for o in orders if o.refunds or o.status in ("cancelled", "returned")), None)
    if action in ("cancel", "change", "change_address"):
        placed = [o for o in orders if o.status == "placed"]
        return placed[0] if placed else (open_[0] if open_ else None)
    if action == "return":
        return next((o for o in orders if o.status == "delivered"), None)
    return orders[0]


def status(order: Order, locale: str) -> str:
    """Where ``order`` is: its state, and for a shipped order the carrier, tracking number and
    link, and the expected delivery date."""
    zh = _zh(locale)
    items = _items(order, locale)
    what = (
        (f"订单 {order.number}（{items}）" if items else f"订单 {order.number}")
        if zh
        else (f"Order {order.number} ({items})" if items else f"Order {order.number}")
    )
    placed = _date(order.placed_at, locale)
    ship = order.shipments[-1] if order.shipments else None
    if order.status == "placed":
        if zh:
            return f"{what}已于 {placed} 下单，正在等待打包。打包前仍可修改或取消。"
        return f"{what} was placed on {placed} and is waiting to be packed. It can still be changed or cancelled until then."
    if order.status == "packed":
        if zh:
            return f"{what}正在打包，很快就会发出。现在已无法修改或取消。"
        return f"{what} is being packed and will ship soon. It can no longer be changed or cancelled."
    if order.status == "shipped" and ship is not None:
        lines = (
            [f"{what}已于 {_date(ship.shipped_at, locale)} 由 {ship.carrier} 发出。", f"运单号：{ship.tracking_number}"]
            if zh
            else [
                f"{what} shipped on {_date(ship.shipped_at, locale)} with {ship.carrier}.",
                f"Tracking number: {ship.tracking_number}",
            ]
        )
        if ship.tracking_url:
            lines.append(f"{'物流跟踪' if zh else 'Track it here'}: {ship.tracking_url}")
        if ship.estimated_delivery is not None:
            eta = _date(ship.estimated_delivery, locale)
            lines.append(f"预计送达：{eta}" if zh else f"Expected delivery: {eta}.")
        return "\n".join(lines)
    if order.status == "delivered":
        when = _date(ship.delivered_at if ship is not None else None, locale)
        text = (
            (f"{what}已于 {when} 送达。" if when else f"{what}已送达。")
            if zh
            else (f"{what} was delivered on {when}." if when else f"{what} was delivered.")
        )
        open_return = next((r for r in order.returns if r.status in ("requested", "received")), None)
        if open_return is not None:
            text += (
                f" 退货申请 {open_return.return_id} 处理中。"
                if zh
                else f" Its return {open_return.return_id} is {open_return.status}."
            )
        return text
    if order.status in ("cancelled", "returned"):
        done_word = ("已取消" if order.status == "cancelled" else "已退货") if zh else order.status
        head = f"{what}{done_word}。" if zh else f"{what} was {done_word}."
        return f"{head}\n{refund(order, locale)}" if order.refunds else head
    return f"{what}：{order.status}" if zh else f"{what}: {order.status}."


def refund(order: Order, locale: str) -> str:
    """Where the refunds of ``order`` stand (each one's amount, date and state), or that it has
    none."""
    zh = _zh(locale)
    if not order.refunds:
        if order.status in ("cancelled", "returned"):
            return (
                f"订单 {order.number} 的退款正在准备中，发出后我们会发邮件通知您。"
                if zh
                else f"The refund for order {order.number} is being prepared; we will e-mail you when it is sent."
            )
        return f"订单 {order.number} 没有退款。" if zh else f"There is no refund on order {order.number}."
    lines = []
    for r in order.refunds:
        amount, issued = _money(r.amount, r.currency), _date(r.created_at, locale)
        if r.status == "succeeded":
            settled = _date(r.processed_at, locale) or issued
            lines.append(
                f"{amount} 的退款已于 {settled} 退回您的原付款方式。"
                if zh
                else f"A refund of {amount} was paid back to your original payment method on {settled}."
            )
        elif r.status == "failed":
            lines.append(
                f"{issued} 发起的 {amount} 退款未成功，我们的同事会跟进。"
                if zh
                else f"The refund of {amount} issued on {issued} did not go through; a member of our team will follow it up."
            )
        else:
            lines.append(
                f"{amount} 的退款已于 {issued} 发起，银行通常需要 3-10 个工作日到账。"
                if zh
                else f"A refund of {amount} was issued on {issued}; banks usually take 3-10 business days to show it."
            )
    return "\n".join(lines)


def possible(order: Order, action: str) -> tuple[bool, str]:
    """Whether ``action`` can be done to ``order`` now, and if not, why (for the log)."""
    if action in ("cancel", "change", "change_address"):
        return order.changeable, "" if order.changeable else order.status
    if action == "return":
        if order.returnable:
            return True, ""
        return False, "return open" if order.status == "delivered" else order.status
    return True, ""


def not_possible(order: Order, action: str, locale: str) -> str:
    """Why ``action`` cannot be done to ``order``, and what the shopper can do instead."""
    zh, n = _zh(locale), order.number
    if action == "cancel":
        if order.status == "cancelled":
            return (
                f"订单 {n} 已经取消了。\n{refund(order, locale)}"
                if zh
                else f"Order {n} is already cancelled.\n{refund(order, locale)}"
            )
        if zh:
            return f"订单 {n} 已{_state_zh(order.status)}，无法再取消。收到商品后，您可以在退货期内申请退货并获得全额退款。"
        return (
            f"Order {n} has already been {order.status}, so it can no longer be cancelled. "
            "Once it arrives you can return it for a full refund."
        )
    if action == "change":
        if zh:
            return f"订单 {n} 已{_state_zh(order.status)}，无法再修改。收到商品后，您可以在退货期内申请退货或换货。"
        return (
            f"Order {n} has already been {order.status}, so it can no longer be changed. "
            "Once it arrives you can return or exchange it."
        )
    if action == "change_address":
        if zh:
            return f"订单 {n} 已{_state_zh(order.status)}，无法再修改收货地址。如需帮助，可以请人工客服联系快递公司。"
        return (
            f"Order {n} has already been {order.status}, so its delivery address can no longer be changed. "
            "A member of our team can ask the carrier to redirect it: just ask for a person."
        )
    if action == "return":
        open_return = next((r for r in order.returns if r.status in ("requested", "received")), None)
        if open_return is not None:
            return (
                f"订单 {n} 的退货申请 {open_return.return_id} 已在处理中。"
                if zh
                else f"A return for order {n} is already open ({open_return.return_id}, {open_return.status})."
            )
        if order.status in ("placed", "packed", "shipped"):
            return (
                f"订单 {n} 还没有送达，收到后即可申请退货。"
                if zh
                else f"Order {n} has not been delivered yet; you can return it once it arrives."
            )
        return (
            f"订单 {n} 无法退货（{_state_zh(order.status)}）。"
            if zh
            else f"Order {n} cannot be returned: it is {order.status}."
        )
    return status(order, locale)


def _state_zh(state: str) -> str:
    return {
        "placed": "下单",
        "packed": "打包",
        "shipped": "发货",
        "delivered": "送达",
        "cancelled": "取消",
        "returned": "退货",
    }.get(state, state)


def offer(order: Order, action: str, locale: str) -> str:
    """What the bot will do to ``order`` and the question that asks the shopper to confirm it."""
    zh, n, total = _zh(locale), order.number, _money(order.total, order.currency)
    items = _items(order, locale)
    if action == "cancel":
        if zh:
            return f"订单 {n}（{items}，{total}）还没有打包，可以取消，{total} 将原路退回。确认取消吗？请回复“是”确认，或回复“不”保留订单。"
        return (
            f"Order {n} ({items}, {total}) has not been packed yet, so I can cancel it and refund {total} "
            'to your original payment method. Shall I cancel it? Reply "yes" to confirm or "no" to keep it.'
        )
    if action == "return":
        if zh:
            return f"订单 {n}（{items}）已送达，可以退货。要为它申请退货吗？我们会把预付退货面单发到您的邮箱。请回复“是”确认或“不”取消。"
        return (
            f"Order {n} ({items}) has been delivered, so you can return it. Shall I open a return for it? "
            'We will e-mail you a prepaid return label. Reply "yes" to confirm or "no" to leave it.'
        )
    return status(order, locale)


def address_offer(order: Order, address: Address, locale: str) -> str:
    """The offer to send ``order`` to ``address``, and the question that confirms it."""
    where = f"{address.name}, {address.one_line()}"
    if _zh(locale):
        return (
            f"订单 {order.number} 还没有打包，可以改寄到：{where}。确认修改吗？请回复“是”确认，或回复“不”保留原地址。"
        )
    return (
        f"Order {order.number} has not been packed yet, so I can send it to: {where}. "
        'Shall I change the address? Reply "yes" to confirm or "no" to keep the old one.'
    )


def change_ask(order: Order, locale: str) -> str:
    """The order can still be changed: what the shopper should say."""
    if _zh(locale):
        return f"订单 {order.number} 还没有打包，仍可修改。请告诉我您想改什么：新的收货地址我可以直接为您修改；商品或数量的修改会由同事为您处理。"
    return (
        f"Order {order.number} has not been packed yet, so it can still be changed. Tell me what you would like "
        "to change: a new delivery address I can set right here; for other items or quantities a member of our "
        "team will take it from there."
    )


def address_ask(order: Order, locale: str) -> str:
    """The order can still go elsewhere: what the shopper should send."""
    if _zh(locale):
        return f"订单 {order.number} 还没有打包，可以修改收货地址。请发送完整的新地址：收件人、街道门牌、邮编、城市和国家。"
    return (
        f"Order {order.number} has not been packed yet, so I can still send it to another address. "
        "Please send the full new address: name, street, postcode, city and country."
    )


def done(result: ActionResult, locale: str) -> str:
    """What a confirmed change did."""
    zh = _zh(locale)
    if result.action == "return" and result.return_request is not None:
        rid = result.return_request.return_id
        if zh:
            return f"已为您申请退货（{rid}）。预付退货面单已发到您的邮箱，收到退货后 5 个工作日内退款。"
        return (
            f"Done: your return {rid} is open. We have e-mailed you a prepaid return label; "
            "we refund you within 5 business days of receiving the parcel."
        )
    order = result.order
    if order is None:
        return "已完成。" if zh else "Done."
    if result.action == "cancel":
        if zh:
            return f"已取消订单 {order.number}，{_money(order.total, order.currency)} 将原路退回。"
        return (
            f"Done: order {order.number} is cancelled. A refund of {_money(order.total, order.currency)} "
            "is on its way to your original payment method."
        )
    if result.action == "change_address" and order.shipping_address is not None:
        where = order.shipping_address.one_line()
        return (
            f"已修改：订单 {order.number} 将寄往 {where}。"
            if zh
            else f"Done: order {order.number} will now go to {where}."
        )
    return status(order, locale)


def kept(action: str, number: str, locale: str) -> str:
    """The shopper said no to an offered change."""
    return f"好的，订单 {number} 保持不变。" if _zh(locale) else f"All right, I have left order {number} as it is."


def offer_lookup(locale: str, *, number_given: bool = False) -> str:
    """The line added to an order FAQ answer when the order is not known yet."""
    if _zh(locale):
        return (
            "如需查询，请同时告诉我订单号和下单时使用的邮箱。"
            if number_given
            else "如果您告诉我订单号和下单时使用的邮箱，我可以帮您查询订单。"
        )
    if number_given:
        return "To look that order up, please also tell me the e-mail address you placed it with."
    return (
        "If you tell me your order number and the e-mail address you placed it with, I can look the order up for you."
    )


def no_order_for(action: str, locale: str) -> str:
    """A verified shopper has no order the action could be about."""
    zh = _zh(locale)
    if action == "status":
        return "您的账户里还没有订单。" if zh else "I can't see any orders on your account yet."
    if action == "refund_status":
        return "您的订单目前没有退款。" if zh else "None of your recent orders has a refund."
    if action == "return":
        return (
            "您最近没有已送达、可以退货的订单。"
            if zh
            else "None of your recent orders has been delivered yet, so there is nothing to return."
        )
    return "您最近没有可以修改或取消的订单。" if zh else "None of your recent orders can still be changed or cancelled."


def store_error(error: StoreError, locale: str, *, number: str = "") -> str:
    """A store failure in the shopper's words, with what they can do next."""
    zh = _zh(locale)
    if error.code == "not_found":
        if zh:
            return f"我没有找到{'订单 ' + number if number else '这个订单'}。请确认订单号和下单邮箱。"
        head = f"I couldn't find order {number}." if number else "I couldn't find that order."
        return f"{head} {error.next_step}".strip()
    if error.code in ("not_allowed", "invalid"):
        return (
            f"这个操作现在无法完成。{error.next_step}"
            if zh
            else f"I couldn't do that: {error.message}. {error.next_step}".strip()
        )
    if zh:
        return "暂时无法连接订单系统，请稍后再试，或请人工客服帮您处理。"
    return "I couldn't reach our order system just now. Please try again in a minute, or ask for a person."


def task_expired(locale: str) -> str:
    """A reply to a task that waited longer than ``KEFU_STORE_CONFIRM_TTL_S``: nothing is done
    before the shopper says to check again."""
    if _zh(locale):
        return "这个请求已经过期了——要我再帮您查一次吗？请回复“是”或“不”。"
    return 'That offer expired — shall I check again? Reply "yes" or "no".'


def task_dropped(locale: str) -> str:
    """The shopper said no to a task that was still missing a piece (or to checking again)."""
    if _zh(locale):
        return "好的，这件事先放下。还有什么可以帮您的吗？"
    return "All right, I have set that aside. Is there anything else I can help with?"


def task_missing(action: str, locale: str, *, number: str = "", email: str = "") -> str:
    """What the shopper still has to send for ``action``: the order number, the e-mail address
    the order was placed with, or both."""
    zh = _zh(locale)
    if number and not email:
        if zh:
            return f"请告诉我订单 {number} 下单时使用的邮箱，我来帮您处理。"
        return f"Please tell me the e-mail address order {number} was placed with, and I will take it from there."
    if email and not number:
        if zh:
            return "请告诉我订单号（例如 KF-1001），我来帮您处理。"
        return "Please tell me the order number (like KF-1001), and I will take it from there."
    if zh:
        return "请告诉我订单号和下单时使用的邮箱，我来帮您处理。"
    return "Please tell me the order number and the e-mail address it was placed with, and I will take it from there."


def nothing_pending(yes: bool, locale: str) -> str:
    """kefu's own short reply to a bare "yes"/"ok" or "no" when nothing waits for one."""
    if _zh(locale):
        return "好的！还有什么可以帮您的吗？" if yes else "好的。如果还需要帮助，随时告诉我。"
    return (
        "OK! Is there anything else I can help you with?" if yes else "All right. If you need anything else, just ask."
    )


def candidates(orders: Sequence[Order], action: str) -> list[Order]:
    """Of a verified shopper's ``orders`` (newest first), those a change could be about: not yet
    packed for ``cancel``/``change``/``change_address``, delivered and returnable for
    ``return``; none for look-ups (they take the newest, :func:`pick`)."""
    if action in ("cancel", "change", "change_address"):
        return [o for o in orders if o.status == "placed"]
    if action == "return":
        return [o for o in orders if o.returnable]
    return []


_ORDINALS_ZH = "一二三四五"


def which_order(orders: Sequence[Order], locale: str) -> str:
    """ "Which one?" between ``orders``, numbered as the shopper may answer ("the second one",
    "第二个", or the order number)."""
    zh = _zh(locale)
    lines = [
        f"{i}. {o.number}（{_items(o, locale)}，{_date(o.placed_at, locale)}）"
        if zh
        else f"{i}. {o.number} ({_items(o, locale)}, placed {_date(o.placed_at, locale)})"
        for i, o in enumerate(orders, 1)
    ]
    if zh:
        return "您指的是哪一个订单？\n" + "\n".join(lines) + "\n请回复订单号，或“第一个”“第二个”。"
    return (
        "Which order do you mean?\n"
        + "\n".join(lines)
        + '\nReply with its number, or "the first one", "the second one".'
    )


def is_which_order(text: str) -> bool:
    """Whether a bot answer read back from the conversation is a :func:`which_order` question
    (so a later "the first one" can tell which "which one?" is the newer)."""
    return text.startswith(("Which order do you mean?\n", "您指的是哪一个订单？\n"))


def pick_again(count: int, locale: str) -> str:
    """The shopper picked a position kefu did not list ("the fourth one" of two)."""
    if _zh(locale):
        return f"我只列出了 {count} 个订单，请回复序号（1 到 {count}）或订单号。"
    return f"I listed {count} orders: please pick one from 1 to {count}, or reply with the order number."
