"""Tasks that span messages (routing/orders/tasks.py) over /ws/chat/: the README's order demo
with the order number, the e-mail and the "yes" in separate messages, in English and Chinese;
a topic change in the middle; the expiry; a bare yes/no with nothing pending; a "yes" to a
question the remote model asked; an agent clearing the task. Real ASGI application and
sockets, the demo store on the test database."""

from __future__ import annotations

import json
import re
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from channels.db import database_sync_to_async
from django.utils import timezone

from chat.models import Conversation
from routing.models import ConversationTask
from store.models import DemoOrder, PendingAction

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from fake_openai import Behaviour
from queries import all_threads_queries
from test_order_actions import ORDER_FAQ, TEST_FAQ, ask, demo_orders, order_status, shopper

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

__all__ = ["demo_orders"]  # a fixture of the order actions' tests, used here too

ZH_ORDER_FAQ = [
    {
        "intent": "cancel_order",
        "locale": "zh",
        "question": "怎么取消订单？",
        "variants": ["我想取消订单", "取消我的订单", "帮我取消订单", "订单还能取消吗", "不想要了，取消订单"],
        "answer": "订单打包前可以免费取消。",
    },
]

MEI = "mei.chen@example.com"
DONE_EN = "Done: order KF-1002 is cancelled. A refund of 129.00 EUR is on its way to your original payment method."
OFFER_EN = (
    "Order KF-1002 (Oak table lamp, 129.00 EUR) has not been packed yet, so I can cancel it and refund 129.00 EUR "
    'to your original payment method. Shall I cancel it? Reply "yes" to confirm or "no" to keep it.'
)


@pytest.fixture
def order_faq(db: Any) -> Any:
    from routing.faq.importer import faq_import, validate
    from routing.faq.registry import registry

    records = [r for r in TEST_FAQ if r["intent"] != "return_policy"] + ORDER_FAQ + ZH_ORDER_FAQ
    faq_import([validate(r, i) for i, r in enumerate(records, 1)])
    registry.reload()
    yield registry
    registry.model = None


@database_sync_to_async
def refunds(number: str) -> list[dict[str, Any]]:
    return list(DemoOrder.objects.get(number=number).refunds)


@database_sync_to_async
def task_row(conversation: str) -> ConversationTask | None:
    return ConversationTask.objects.filter(conversation_id=conversation).first()


@database_sync_to_async
def conversation_status(conversation: str) -> str:
    return str(Conversation.objects.get(pk=conversation).status)


@database_sync_to_async
def age_task(conversation: str) -> None:
    """Make the conversation's task and offer older than ``KEFU_STORE_CONFIRM_TTL_S``."""
    past = timezone.now() - timedelta(seconds=1)
    ConversationTask.objects.filter(conversation_id=conversation).update(expires_at=past)
    PendingAction.objects.filter(conversation_id=conversation).update(expires_at=past)


# ------------------------------------------------------------------ the README's order demo


async def test_the_order_number_the_email_and_the_yes_in_three_messages_cancel_the_order_once(
    make_client, order_faq, demo_orders, remote
):
    client = await shopper(make_client)
    first = await ask(client, "I want to cancel my order KF-1002")
    assert first["route"] == "faq"
    assert first["text"].endswith("To look that order up, please also tell me the e-mail address you placed it with.")
    offer = await ask(client, MEI)  # the e-mail alone completes the task
    assert offer["route"] == "action" and offer["text"] == OFFER_EN
    assert await order_status("KF-1002") == "placed"
    done = await ask(client, "yes")
    assert done["route"] == "action" and done["text"] == DONE_EN
    assert await order_status("KF-1002") == "cancelled"
    again = await ask(client, "yes")  # nothing left to confirm: kefu's own short reply
    assert again["route"] == "decline" and again["text"] == "OK! Is there anything else I can help you with?"
    assert len(await refunds("KF-1002")) == 1
    assert remote.requests == []
    assert await task_row(client.conversation) is None


async def test_the_pieces_come_in_any_order_in_words(make_client, order_faq, demo_orders, remote):
    client = await shopper(make_client)
    ask_number = await ask(client, "cancel my order")
    assert ask_number["route"] == "faq"
    # The e-mail first, in a sentence: the number is still missing.
    missing = await ask(client, f"my e-mail is {MEI}")
    assert missing["route"] == "action"
    assert missing["text"] == "Please tell me the order number (like KF-1001), and I will take it from there."
    offer = await ask(client, "it's KF-1002")
    assert offer["text"] == OFFER_EN
    done = await ask(client, "go ahead")
    assert done["text"] == DONE_EN
    assert await order_status("KF-1002") == "cancelled" and len(await refunds("KF-1002")) == 1


async def test_the_chinese_order_demo_cancels_the_order_once(make_client, order_faq, demo_orders, remote):
    client = await shopper(make_client)
    first = await ask(client, "我想取消订单 KF-1002")
    assert first["route"] == "faq"
    assert first["text"] == "订单打包前可以免费取消。\n\n如需查询，请同时告诉我订单号和下单时使用的邮箱。"
    offer = await ask(client, f"我的邮箱是 {MEI}")
    assert offer["route"] == "action"
    assert offer["text"].startswith("订单 KF-1002（Oak table lamp，129.00 EUR）还没有打包，可以取消")
    done = await ask(client, "是的")
    assert done["route"] == "action" and done["text"] == "已取消订单 KF-1002，129.00 EUR 将原路退回。"
    assert await order_status("KF-1002") == "cancelled" and len(await refunds("KF-1002")) == 1
    assert remote.requests == []


async def test_a_chinese_no_keeps_the_order(make_client, order_faq, demo_orders, remote):
    client = await shopper(make_client)
    await ask(client, "我想取消订单 KF-1002")
    await ask(client, MEI)
    kept = await ask(client, "不用了")
    assert kept["route"] == "action" and kept["text"] == "好的，订单 KF-1002 保持不变。"
    assert await order_status("KF-1002") == "placed"
    assert await task_row(client.conversation) is None
    assert not await database_sync_to_async(PendingAction.objects.exists)()


async def test_a_wrong_email_does_not_prove_the_order(make_client, order_faq, demo_orders, remote):
    client = await shopper(make_client)
    await ask(client, "I want to cancel my order KF-1002")
    wrong = await ask(client, "sam.okafor@example.com")
    assert wrong["text"] == (
        "I couldn't find order KF-1002. Reply with the order number and the e-mail address the order was placed with."
    )
    assert (await ask(client, "yes"))["route"] != "action" or await order_status("KF-1002") == "placed"
    assert await order_status("KF-1002") == "placed"
    # The right e-mail then completes the same task.
    offer = await ask(client, MEI)
    assert offer["text"] == OFFER_EN


# ------------------------------------------------------------------ one task, kept, replaced, expired


async def test_an_unrelated_question_is_answered_and_the_task_waits(make_client, order_faq, demo_orders, remote):
    client = await shopper(make_client)
    await ask(client, "I want to cancel my order KF-1002")
    other = await ask(client, "How long does delivery take?")
    assert other["route"] == "faq" and other["text"].startswith("Orders ship within 1 business day")
    offer = await ask(client, MEI)  # the task was kept
    assert offer["text"] == OFFER_EN
    other = await ask(client, "Which payment methods do you accept?")
    assert other["text"] == "We accept Visa, Mastercard, PayPal and Apple Pay."
    done = await ask(client, "yes")
    assert done["text"] == DONE_EN and await order_status("KF-1002") == "cancelled"


async def test_a_new_task_replaces_the_pending_one(make_client, order_faq, demo_orders, remote):
    client = await shopper(make_client)
    await ask(client, "I want to cancel my order KF-1002")
    await ask(client, MEI)  # the cancellation is offered
    track = await ask(client, "Where is my order KF-1001?")  # a new task: KF-1001's status
    assert track["route"] == "action" and track["text"].startswith("Order KF-1001 (Stoneware mug")
    stray = await ask(client, "yes")  # the old offer was replaced: this yes cancels nothing
    assert stray["route"] == "decline"
    assert await order_status("KF-1002") == "placed"


async def test_an_expired_task_is_said_so_and_checked_again_on_a_yes(make_client, order_faq, demo_orders, remote):
    client = await shopper(make_client)
    await ask(client, "I want to cancel my order KF-1002")
    await ask(client, MEI)
    await age_task(client.conversation)
    expired = await ask(client, "yes")
    assert expired["route"] == "action"
    assert expired["text"] == 'That offer expired — shall I check again? Reply "yes" or "no".'
    assert await order_status("KF-1002") == "placed"  # the expired yes changed nothing
    again = await ask(client, "yes")  # check again: the offer is made afresh
    assert again["text"] == OFFER_EN
    done = await ask(client, "yes")
    assert done["text"] == DONE_EN and len(await refunds("KF-1002")) == 1


async def test_no_to_a_task_missing_a_piece_drops_it(make_client, order_faq, demo_orders, remote):
    client = await shopper(make_client)
    await ask(client, "I want to cancel my order KF-1002")
    dropped = await ask(client, "no")
    assert dropped["route"] == "action"
    assert dropped["text"] == "All right, I have set that aside. Is there anything else I can help with?"
    assert await task_row(client.conversation) is None
    # The e-mail now answers no task: nothing is offered.
    assert (await ask(client, MEI))["route"] != "action"


# ------------------------------------------------------------------ yes and no with nothing pending


@pytest.mark.parametrize(
    ("said", "reply"),
    [
        ("yes", "OK! Is there anything else I can help you with?"),
        ("ok", "OK! Is there anything else I can help you with?"),
        ("no", "All right. If you need anything else, just ask."),
        ("是的", "好的！还有什么可以帮您的吗？"),
        ("不用了", "好的。如果还需要帮助，随时告诉我。"),
    ],
)
async def test_a_bare_yes_or_no_with_nothing_pending_gets_kefus_own_reply(
    make_client, order_faq, demo_orders, remote, said, reply
):
    client = await shopper(make_client)
    end = await ask(client, said)
    assert end["route"] == "decline" and end["text"] == reply and end["model"] is None
    assert remote.requests == []  # no paid model
    assert await conversation_status(client.conversation) == "bot"  # no person


async def test_a_bare_yes_without_a_model_or_a_store_goes_to_no_person(make_client, order_faq):
    client = await shopper(make_client)
    end = await ask(client, "yes")
    assert end["route"] == "decline" and end["text"] == "OK! Is there anything else I can help you with?"
    assert await conversation_status(client.conversation) == "bot"


@pytest.mark.parametrize("said", ["yes please", "ok"])
async def test_a_yes_to_a_question_the_model_asked_goes_back_to_the_model_with_its_history(
    make_client, order_faq, demo_orders, remote, said
):
    remote.push(
        Behaviour(text="We have two lamps in oak. Would you like me to compare their sizes?"),
        Behaviour(text="The small one is 32 cm tall, the large one 48 cm."),
    )
    client = await shopper(make_client)
    asked = await ask(client, "I am looking for a lamp for my bedside table, something warm and not too bright")
    assert asked["route"] == "llm.simple"
    answered = await ask(client, said)
    assert answered["route"] == "llm.simple"
    assert answered["text"] == "The small one is 32 cm tall, the large one 48 cm."
    # One request for the yes: the model that asked, with the question in its history (no
    # rewrite into a standalone question, no cache: the answer rests on the history).
    assert len(remote.requests) == 2
    follow = remote.requests[-1]
    sent = json.dumps(follow["messages"], ensure_ascii=False)
    assert "Would you like me to compare their sizes?" in sent  # the question it answers
    assert follow["messages"][-1] == {"role": "user", "content": said}
    assert await conversation_status(client.conversation) == "bot"


async def test_a_yes_after_a_model_answer_that_asked_nothing_gets_kefus_own_reply(
    make_client, order_faq, demo_orders, remote
):
    remote.push(Behaviour(text="We have two lamps in oak, a small one and a large one."))
    client = await shopper(make_client)
    await ask(client, "I am looking for a lamp for my bedside table, something warm and not too bright")
    end = await ask(client, "ok")
    assert end["route"] == "decline" and end["text"] == "OK! Is there anything else I can help you with?"
    assert len(remote.requests) == 1


# ------------------------------------------------------------------ the console


def agent_user() -> Any:
    from django.contrib.auth.models import Permission, User

    user = User.objects.create_user("alice", password="pw-alice", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="handle_conversations"))
    return User.objects.get(pk=user.pk)


async def test_an_agent_sees_the_task_and_clears_it(make_client, order_faq, demo_orders, remote, client):
    shopper_client = await shopper(make_client)
    await ask(shopper_client, "I want to cancel my order KF-1002")
    await ask(shopper_client, MEI)
    user = await database_sync_to_async(agent_user)()
    await database_sync_to_async(client.force_login)(user)
    url = f"/console/conversations/{shopper_client.conversation}/task"
    seen = await database_sync_to_async(client.get)(url)
    assert seen.status_code == 200
    task = seen.json()["task"]
    assert (task["intent"], task["order_number"], task["email"], task["awaiting"]) == (
        "cancel",
        "KF-1002",
        MEI,
        "confirm",
    )
    cleared = await database_sync_to_async(client.post)(url, {"clear": "1"})
    assert cleared.status_code == 200 and cleared.json() == {"task": None, "cleared": True}
    assert (await database_sync_to_async(client.get)(url)).json() == {"task": None}
    stray = await ask(shopper_client, "yes")  # nothing is confirmed after the agent cleared it
    assert stray["route"] == "decline" and await order_status("KF-1002") == "placed"
    bad = await database_sync_to_async(client.post)(url, {})
    assert bad.status_code == 400 and "clear" in bad.json()["error"]["message"]


async def test_the_console_shows_the_task_panel_in_english_and_chinese(client, db):
    user = await database_sync_to_async(agent_user)()
    await database_sync_to_async(client.force_login)(user)
    en = (await database_sync_to_async(client.get)("/console/")).content.decode()
    assert "Shopper’s task" in en and 'data-intent-cancel="Cancel the order"' in en
    zh = (await database_sync_to_async(client.get)("/console/?lang=zh")).content.decode()
    assert "顾客的待办事项" in zh and 'data-intent-cancel="取消订单"' in zh and "清除待办事项" in zh
    by_header = await database_sync_to_async(client.get)("/console/", HTTP_ACCEPT_LANGUAGE="zh-CN,zh;q=0.9")
    assert "顾客的待办事项" in by_header.content.decode()


async def test_every_console_string_has_its_chinese_translation():
    po = (Path(__file__).resolve().parents[2] / "locale" / "zh_Hans" / "LC_MESSAGES" / "django.po").read_text()
    entries = re.findall(r'^msgid "(.+)"\nmsgstr "(.*)"$', po, flags=re.MULTILINE)
    assert len(entries) >= 18
    assert [msgid for msgid, msgstr in entries if not msgstr] == []


async def test_only_agents_reach_the_task_api(client, db, make_client, order_faq, demo_orders):
    from django.contrib.auth.models import User

    shopper_client = await shopper(make_client)
    url = f"/console/conversations/{shopper_client.conversation}/task"
    anonymous = await database_sync_to_async(client.get)(url)
    assert anonymous.status_code == 302 and "/console/login/" in anonymous["Location"]
    staff = await database_sync_to_async(User.objects.create_user)("bob", password="pw-bob", is_staff=True)
    await database_sync_to_async(client.force_login)(staff)
    assert (await database_sync_to_async(client.get)(url)).status_code == 403
    await database_sync_to_async(client.force_login)(await database_sync_to_async(agent_user)())
    missing = await database_sync_to_async(client.get)(
        "/console/conversations/00000000-0000-0000-0000-000000000000/task"
    )
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"


async def test_only_a_piece_costs_the_task_query(make_client, order_faq, demo_orders, remote):
    """The task is read for a message that may be a piece of it (a yes/no, an e-mail, an order
    number), never for any other: an FAQ question's statements are those of before."""
    client = await shopper(make_client)
    await ask(client, "Which payment methods do you accept?")  # warm
    with all_threads_queries() as captured:
        await ask(client, "Which payment methods do you accept?")
    assert [s.sql for s in captured.snapshot() if "routing_conversationtask" in s.sql] == []
    with all_threads_queries() as captured:
        await ask(client, "yes")
    reads = [s for s in captured.snapshot() if "routing_conversationtask" in s.sql]
    assert len(reads) == 1 and reads[0].sql.lstrip().upper().startswith("SELECT")


async def test_a_bare_yes_reads_the_last_turn_once(make_client, order_faq, demo_orders, remote):
    """A short "yes" is looked at by the accepted-offer check and by the task step, both on the
    last turn: one history load (its conversation SELECT and its messages SELECT), not one each."""
    client = await shopper(make_client)
    await ask(client, "Which payment methods do you accept?")
    with all_threads_queries() as captured:
        end = await ask(client, "yes")
    assert end["route"] == "decline"
    loads = [s.sql for s in captured.snapshot() if s.sql.lstrip().startswith("SELECT") and "summary_upto_seq" in s.sql]
    assert len(loads) == 1, loads


async def test_a_request_for_a_person_is_no_piece_of_the_task(make_client, order_faq, demo_orders, remote):
    client = await shopper(make_client)
    await ask(client, "I want to cancel my order KF-1002")
    end = await ask(client, f"{MEI} human please")
    assert end["route"] == "handoff"
    assert await order_status("KF-1002") == "placed"


async def test_the_second_one_picks_among_the_orders_kefu_listed(make_client, order_faq, demo_orders, remote):
    await database_sync_to_async(lambda: DemoOrder.objects.filter(number="KF-1001").update(status="placed"))()
    client = await shopper(make_client, "demo-mei")
    which = await ask(client, "cancel my order")
    assert which["route"] == "action"
    lines = which["text"].split("\n")
    assert lines[0] == "Which order do you mean?" and len(lines) == 4
    assert lines[1].startswith("1. KF-1002 (Oak table lamp, placed ") and lines[2].startswith("2. KF-1001 (")
    beyond = await ask(client, "the fourth one")
    assert beyond["text"] == "I listed 2 orders: please pick one from 1 to 2, or reply with the order number."
    offer = await ask(client, "the second one")
    assert offer["route"] == "action" and offer["text"].startswith("Order KF-1001 (")
    assert "Shall I cancel it?" in offer["text"]
    done = await ask(client, "yes")
    assert done["text"].startswith("Done: order KF-1001 is cancelled.")
    assert await order_status("KF-1001") == "cancelled" and await order_status("KF-1002") == "placed"


async def test_di_er_ge_picks_in_chinese(make_client, order_faq, demo_orders, remote):
    await database_sync_to_async(lambda: DemoOrder.objects.filter(number="KF-1001").update(status="placed"))()
    client = await shopper(make_client, "demo-mei")
    which = await ask(client, "我想取消订单")
    assert which["text"].startswith("您指的是哪一个订单？\n1. KF-1002（")
    offer = await ask(client, "第二个")
    assert offer["text"].startswith("订单 KF-1001（")
    done = await ask(client, "好的")
    assert done["text"].startswith("已取消订单 KF-1001")
    assert await order_status("KF-1002") == "placed"


async def test_the_tool_path_and_the_template_path_share_the_task(make_client, faq, demo_orders, remote):
    # No order intents in this FAQ: the request goes to the model, which calls the store's tool
    # without the e-mail an anonymous shopper must give.
    remote.push(
        Behaviour(tool_calls=[{"name": "order_cancel", "arguments": {"order_number": "KF-1002"}}]),
        Behaviour(text="Could you tell me the e-mail address you placed order KF-1002 with?"),
    )
    client = await shopper(make_client)
    asked = await ask(client, "I'd like to cancel KF-1002, the colour doesn't match my sofa after all")
    assert asked["route"] == "llm.simple"
    assert asked["text"] == "Could you tell me the e-mail address you placed order KF-1002 with?"
    row = await task_row(client.conversation)
    assert row is not None and (row.intent, row.order_number, row.source) == ("cancel", "KF-1002", "tool")
    offer = await ask(client, MEI)  # the e-mail alone: the template path finishes the model's task
    assert offer["route"] == "action" and offer["text"] == OFFER_EN
    assert len(remote.requests) == 2  # no third model call
    done = await ask(client, "yes")
    assert done["text"] == DONE_EN and await order_status("KF-1002") == "cancelled"


async def test_staff_list_the_tasks_in_the_admin(make_client, order_faq, demo_orders, remote, client):
    from django.contrib.auth.models import User

    shopper_client = await shopper(make_client)
    await ask(shopper_client, "I want to cancel my order KF-1002")
    root = await database_sync_to_async(User.objects.create_superuser)("root", password="pw-root")
    await database_sync_to_async(client.force_login)(root)
    page = await database_sync_to_async(client.get)("/admin/routing/conversationtask/")
    assert page.status_code == 200 and "KF-1002" in page.content.decode()
