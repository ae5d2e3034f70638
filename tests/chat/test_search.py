"""Staff search: ``GET /console/api/search?q=`` (CONTRACT.md, "Staff search"; chat.search) on the
embedded database (SQLite + FTS5), messages written through the services as in production.

Personas: ``alice`` (an agent), ``mallory`` (staff without the agents' permission); shoppers are
conversations written through ``chat.services``.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from chat import services
from chat.models import Conversation, ConversationStatus, Message, SearchLog
from chat.retention import shopper_erase
from chat.search import LIMIT, index_ensure

pytestmark = [pytest.mark.django_db]

URL = "/console/api/search"


def make_user(username: str, *, agent: bool = True) -> Any:
    from django.contrib.auth.models import Permission, User

    user = User.objects.create_user(username, password="pw-" + username, is_staff=True)
    if agent:
        user.user_permissions.add(Permission.objects.get(codename="handle_conversations"))
    return User.objects.get(pk=user.pk)


@pytest.fixture
def alice() -> Client:
    c = Client()
    c.force_login(make_user("alice"))
    return c


def shopper_says(*texts: str, conversation: uuid.UUID | None = None) -> uuid.UUID:
    """A conversation (new unless given) in which the shopper wrote ``texts``."""
    if conversation is None:
        conversation = services.conversation_start(locale="en")[0].pk
    for text in texts:
        services.message_receive(conversation_id=conversation, client_id=uuid.uuid4().hex, text=text)
    return conversation


def ids(response: Any) -> list[str]:
    assert response.status_code == 200, response.content
    return [r["conversation"] for r in response.json()["results"]]


def test_the_answer_has_the_contract_shape_newest_first(alice):
    older = shopper_says("my parcel never arrived")
    newer = shopper_says("hello", "the parcel is damaged, can I get a refund?")
    shopper_says("nothing to see here")
    body = alice.get(URL, {"q": "Parcel"}).json()
    assert [r["conversation"] for r in body["results"]] == [str(newer), str(older)]
    first = body["results"][0]
    assert set(first) == {"conversation", "status", "last_message_at", "snippet"}
    assert first["status"] == "bot"
    assert first["snippet"] == "the parcel is damaged, can I get a refund?"
    last = Message.objects.filter(conversation_id=newer).order_by("-seq").first()
    assert datetime.fromisoformat(first["last_message_at"]) == last.created_at


def test_an_order_number_in_any_spelling(alice):
    named = shopper_says("Where is order KF-1042? It is late")
    shopper_says("Where is order KF-1043?")
    for q in ("KF-1042", "#1042", "kf1042", "1042"):
        assert ids(alice.get(URL, {"q": q})) == [str(named)], q


def test_the_e_mail_left_in_the_widget_the_verified_one_and_one_written(alice):
    left = shopper_says("hi")
    services.contact_save(conversation_id=left, email="Ann.Lee@Example.com")
    verified = shopper_says("hello")
    Conversation.objects.filter(pk=verified).update(customer_id="cus_77", customer_email="ann.lee@example.com")
    written = shopper_says("please mail me at ann.lee@example.com")
    shopper_says("mail bob.lee@example.com")
    found = ids(alice.get(URL, {"q": "ANN.LEE@example.com"}))
    assert sorted(found) == sorted([str(left), str(verified), str(written)])
    assert ids(alice.get(URL, {"q": "cus_77"})) == [str(verified)]


def test_one_and_two_character_chinese_words(alice):
    refund = shopper_says("你好，我想退货，可以吗？")
    shopper_says("我想换货")
    assert ids(alice.get(URL, {"q": "退货"})) == [str(refund)]
    assert ids(alice.get(URL, {"q": "退"})) == [str(refund)]
    both = ids(alice.get(URL, {"q": "货"}))
    assert len(both) == 2
    # A four-character word: bigrams, then the word itself in the text.
    policy = shopper_says("请问退货政策是什么")
    shopper_says("退货 货政 政策")
    assert ids(alice.get(URL, {"q": "退货政策"})) == [str(policy)]


def test_closed_conversations_are_found_erased_ones_never(alice):
    agent = make_user("bob")
    closed = shopper_says("the zipper broke")
    services.conversation_take_over(conversation_id=closed, agent=agent)
    services.agent_message_send(conversation_id=closed, agent=agent, text="Sorry about the zipper!")
    services.conversation_close(conversation_id=closed, agent=agent)
    assert Conversation.objects.get(pk=closed).status == ConversationStatus.CLOSED
    body = alice.get(URL, {"q": "zipper"}).json()
    assert [(r["conversation"], r["status"]) for r in body["results"]] == [(str(closed), "closed")]
    assert body["results"][0]["snippet"] == "Sorry about the zipper!"

    erased = shopper_says("my zipper again")
    services.contact_save(conversation_id=erased, email="zed@example.com")
    assert str(erased) in ids(alice.get(URL, {"q": "zipper"}))
    shopper_erase(conversation_id=erased)
    assert ids(alice.get(URL, {"q": "zipper"})) == [str(closed)]
    assert ids(alice.get(URL, {"q": "zed@example.com"})) == []


def test_only_agents_may_search():
    shopper_says("secret parcel")
    anonymous = Client().get(URL, {"q": "parcel"})
    assert anonymous.status_code == 302 and "/console/login/" in anonymous["Location"]
    mallory = Client()
    mallory.force_login(make_user("mallory", agent=False))
    assert mallory.get(URL, {"q": "parcel"}).status_code == 403
    assert not SearchLog.objects.exists()


def test_bad_queries_get_a_clear_400(alice):
    for q, code in (("   ", "invalid"), ("x" * 201, "too_long")):
        r = alice.get(URL, {"q": q})
        assert r.status_code == 400 and r.json()["error"]["code"] == code and r.json()["error"]["message"]


def test_each_search_is_logged_without_an_e_mail(alice):
    shopper_says("parcel")
    alice.get(URL, {"q": "parcel"})
    alice.get(URL, {"q": "ann@example.com"})
    alice.get(URL, {"q": "kein Ergebnis"})
    logs = list(SearchLog.objects.order_by("pk").values_list("agent__username", "query", "results"))
    assert logs == [("alice", "parcel", 1), ("alice", "", 0), ("alice", "kein Ergebnis", 0)]
    assert not SearchLog.objects.filter(query__contains="@").exists()


def test_at_most_fifty_results_in_a_bounded_number_of_queries(alice):
    for _ in range(LIMIT + 5):
        shopper_says("where is my parcel")
    with CaptureQueriesContext(connection) as captured:
        body = alice.get(URL, {"q": "parcel"}).json()
    assert len(body["results"]) == LIMIT
    # the session, the user, their permissions (2), then the search, the snippets' messages and
    # the log row: the same for 1 result as for 50
    assert len(captured) <= 7, "\n".join(q["sql"][:90] for q in captured)


def test_writing_a_message_costs_no_extra_query():
    conversation = shopper_says("first")
    with CaptureQueriesContext(connection) as captured:
        shopper_says("a second message", conversation=conversation)
    # the seq (UPDATE ... RETURNING), the INSERT, inside one transaction: terms are computed in Python
    writes = [q["sql"] for q in captured if not q["sql"].startswith(("SAVEPOINT", "RELEASE", "BEGIN", "COMMIT"))]
    assert len(writes) == 2, writes
    assert Message.objects.get(conversation_id=conversation, seq=2).search_terms == "a second message"


def test_the_index_comes_back_after_a_table_rebuild_dropped_its_triggers(alice):
    before = shopper_says("velvet curtains")
    with connection.cursor() as cursor:
        cursor.execute("DROP TRIGGER chat_message_fts_ai")
    assert index_ensure() is True
    after = shopper_says("more velvet")
    assert sorted(ids(alice.get(URL, {"q": "velvet"}))) == sorted([str(before), str(after)])
    assert index_ensure() is False


def test_the_search_box_in_english_and_chinese(alice):
    page = alice.get("/console/").content.decode()
    assert 'id="search-q"' in page and "console_search.js" in page
    assert "Search words, e-mail, order, customer (press /)" in page
    # The console takes the agent's language from her browser (Accept-Language), per request.
    page = alice.get("/console/", HTTP_ACCEPT_LANGUAGE="zh-CN,zh;q=0.9").content.decode()
    assert '<html lang="zh-hans">' in page
    assert "搜索文字、邮箱、订单号、客户（按 /）" in page and 'data-status-closed="已关闭"' in page


def test_every_staff_string_is_translated_in_english_and_chinese():
    import gettext
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "locale"
    for lang in ("en", "zh_Hans"):
        po = (root / lang / "LC_MESSAGES" / "django.po").read_text(encoding="utf-8")
        pairs = re.findall(r'^msgid "(.+)"\nmsgstr "(.*)"$', po, flags=re.M)
        assert pairs, lang
        assert [m for m, s in pairs if not s] == [], lang
        with (root / lang / "LC_MESSAGES" / "django.mo").open("rb") as mo:
            compiled = gettext.GNUTranslations(mo)
        stale = [m for m, s in pairs if compiled.gettext(m) != s]
        assert stale == [], f"{lang}: compile the messages (manage.py compilemessages)"


def test_an_old_match_is_found_past_the_newest_slices(alice, monkeypatch):
    from chat import search as search_module

    monkeypatch.setattr(search_module, "SLICES", (3, 6, None))
    old = shopper_says("an antique lamp")
    for n in range(10):
        shopper_says(f"message {n}")
    recent = shopper_says("another antique")
    assert ids(alice.get(URL, {"q": "antique"})) == [str(recent), str(old)]


@pytest.mark.django_db(transaction=True)
def test_the_migration_fills_the_terms_of_existing_messages():
    from django.core.management import call_command
    from django.db.migrations.executor import MigrationExecutor

    call_command("migrate", "chat", "0019", verbosity=0)
    try:
        old = MigrationExecutor(connection).loader.project_state(("chat", "0019_message_rated_at")).apps
        conv = old.get_model("chat", "Conversation").objects.create(token_hash="0" * 64)
        old.get_model("chat", "Message").objects.create(
            conversation=conv, seq=1, role="shopper", text="旧的退货 KF-7001"
        )
        old.get_model("chat", "Message").objects.create(
            conversation=conv, seq=2, role="system", text="No one is online"
        )
    finally:
        call_command("migrate", "chat", verbosity=0)
    terms = dict(Message.objects.filter(conversation_id=conv.pk).values_list("seq", "search_terms"))
    assert "退货" in terms[1].split() and "kf7001" in terms[1].split()
    assert terms[2] == ""  # the bot's own notices are not indexed
    c = Client()
    c.force_login(make_user("alice"))
    assert ids(c.get(URL, {"q": "KF-7001"})) == [str(conv.pk)]
