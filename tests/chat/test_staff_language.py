"""Staff pages in the agent's language and time zone (issue 31, item 5; config/staff_locale.py):
the login and ops pages follow Accept-Language or the agent's choice made with Django's
set_language view; the transcript shows its times in the browser's time zone (``kefu_tz``) and the
language's formats; the shopper's storefront keeps its own ``?lang``."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client

from chat import services
from chat.models import Conversation, Message
from tests.queries import all_threads_queries

pytestmark = [pytest.mark.django_db]

ZH = {"HTTP_ACCEPT_LANGUAGE": "zh-CN,zh;q=0.9"}


def staff(name: str, codename: str) -> User:
    user = User.objects.create_user(name, password="pw", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename=codename))
    return User.objects.get(pk=user.pk)


def page(response: Any) -> str:
    assert response.status_code == 200, response.status_code
    return response.content.decode()


def choose(client: Client, language: str, next_url: str) -> None:
    """The agent's choice through the language switch (Django's set_language view)."""
    r = client.post("/console/i18n/setlang/", {"language": language, "next": next_url})
    assert r.status_code == 302 and r["Location"] == next_url


def test_login_is_english_by_default_and_chinese_for_a_chinese_browser():
    html = page(Client().get("/console/login/"))
    assert '<html lang="en">' in html and ">Sign in</button>" in html and "Username" in html
    html = page(Client().get("/console/login/", **ZH))
    assert '<html lang="zh-hans">' in html
    assert ">登录</button>" in html and "用户名" in html and "密码" in html and "Sign in" not in html


def test_the_agents_choice_beats_the_browsers_language():
    client = Client()
    choose(client, "zh-hans", "/console/login/")
    html = page(client.get("/console/login/", HTTP_ACCEPT_LANGUAGE="en-US"))
    assert ">登录</button>" in html
    assert '<option value="zh-hans" selected>简体中文</option>' in html
    choose(client, "en", "/console/login/")
    assert ">Sign in</button>" in page(client.get("/console/login/", **ZH))


def test_ops_dashboard_in_chinese_by_browser_and_by_choice_and_english_by_default():
    client = Client()
    client.force_login(staff("ops", "view_costs"))
    html = page(client.get("/ops/"))
    assert "Cost and savings (USD)" in html and "Spend budgets now" in html
    html = page(client.get("/ops/", **ZH))
    assert "花费与节省（美元）" in html and "当前花费预算" in html and "Spend budgets now" not in html
    # The page's scripts get their strings from the catalog, in the page's language.
    assert '<script src="/console/i18n/js/" defer></script>' in html
    choose(client, "zh-hans", "/ops/")
    assert "当前花费预算" in page(client.get("/ops/", HTTP_ACCEPT_LANGUAGE="en"))
    assert "金丝雀发布" in page(client.get("/ops/canary/", HTTP_ACCEPT_LANGUAGE="en"))
    assert "FAQ 候选" in page(client.get("/ops/faq-candidates/"))


def test_the_javascript_catalog_follows_the_staff_language():
    wanted = json.dumps("每日花费与节省（美元）")  # the catalog is JSON, non-ASCII escaped
    assert wanted in page(Client().get("/console/i18n/js/", **ZH))
    english = page(Client().get("/console/i18n/js/"))
    assert wanted not in english and "django.gettext" in english


def test_the_storefront_keeps_its_own_lang():
    response = Client().get("/", **ZH)
    assert '<html lang="en">' in page(response)
    assert not response.has_header("Content-Language") and "Accept-Language" not in response.get("Vary", "")
    staff_page = Client().get("/console/login/", **ZH)
    assert staff_page["Content-Language"] == "zh-hans" and "Accept-Language" in staff_page["Vary"]
    assert '<html lang="zh">' in page(Client().get("/?lang=zh", HTTP_ACCEPT_LANGUAGE="en"))


def conversation_at(when: datetime) -> uuid.UUID:
    conversation = services.conversation_start(locale="zh")[0].pk
    services.message_receive(conversation_id=conversation, client_id=uuid.uuid4().hex, text="我的包裹在哪里")
    Message.objects.filter(conversation_id=conversation).update(created_at=when)
    Conversation.objects.filter(pk=conversation).update(created_at=when)
    return conversation


def test_transcript_times_are_in_the_agents_time_zone_and_locale():
    conversation = conversation_at(datetime(2026, 12, 7, 18, 5, 9, 123456, tzinfo=UTC))
    client = Client()
    client.force_login(staff("alice", "handle_conversations"))
    url = f"/console/conversations/{conversation}/"
    html = page(client.get(url))
    assert ">7 Dec 2026, 18:05:09</time>" in html and ">2026-12-07T18:05:09.123456+00:00<" not in html
    client.cookies["kefu_tz"] = "Asia/Shanghai"
    html = page(client.get(url, **ZH))
    assert '<time datetime="2026-12-07T18:05:09.123456+00:00">2026年12月8日 02:05:09</time>' in html
    assert "对话 " in html and "消息" in html and "时间为 Asia/Shanghai。" in html
    assert "<td>顾客</td>" in html and "状态： <strong>机器人回答</strong>" in html
    for bad in ("Not/AZone", "../../etc/passwd", "Asia", "x" * 200):
        client.cookies["kefu_tz"] = bad  # UTC, and the page still shows
        assert "7 Dec 2026, 18:05:09" in page(client.get(url))


def test_the_language_and_time_zone_cost_no_query():
    conversation = conversation_at(datetime(2026, 12, 7, 18, 5, 9, tzinfo=UTC))
    client = Client()
    client.force_login(staff("alice", "handle_conversations"))
    url = f"/console/conversations/{conversation}/"
    page(client.get(url))  # the session and the user, loaded once
    with all_threads_queries() as english:
        page(client.get(url))
    client.cookies["kefu_tz"] = "Asia/Shanghai"
    choose(client, "zh-hans", url)
    with all_threads_queries() as chinese:
        assert "2026年12月8日 02:05:09" in page(client.get(url))
    assert len(chinese) == len(english), chinese.report()


def test_the_ops_page_costs_the_same_queries_in_either_language():
    client = Client()
    client.force_login(staff("ops", "view_costs"))
    page(client.get("/ops/"))
    with all_threads_queries() as english:
        page(client.get("/ops/"))
    client.cookies["kefu_tz"] = "Asia/Shanghai"
    choose(client, "zh-hans", "/ops/")
    with all_threads_queries() as chinese:
        assert "当前花费预算" in page(client.get("/ops/"))
    assert len(chinese) == len(english), chinese.report()


def test_the_agents_language_and_zone_end_with_the_request():
    from django.utils import timezone, translation

    client = Client()
    client.cookies["kefu_tz"] = "Asia/Shanghai"
    assert "用户名" in page(client.get("/console/login/", **ZH))
    assert translation.get_language() == "en" and timezone.get_current_timezone_name() == "UTC"
