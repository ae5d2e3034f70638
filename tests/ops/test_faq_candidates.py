"""FAQ candidates (ops/candidates.py): the questions that went to a person or a model, grouped by
meaning with the real embedder, largest group first, each with a draft for the admin's FAQ form;
requests for a person and questions with personal data left out."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from django.contrib.auth.models import Permission, User

from chat.models import Conversation, Message
from ops.candidates import faq_candidates

pytestmark = pytest.mark.django_db

GIFT = [
    "can you gift wrap my order",
    "do you offer gift wrapping for presents",
    "is gift wrapping available at checkout",
]
WARRANTY = ["what warranty do your lamps have", "how long is the guarantee on a lamp"]


def asked(text: str, *, route: str, answer: str = "", reason: str = "remote model, tier simple") -> None:
    conv = Conversation.objects.create(token_hash="x" * 64)
    Message.objects.create(conversation=conv, seq=1, role="shopper", text=text)
    Message.objects.create(
        conversation=conv, seq=2, role="bot", text=answer, route=route, reply_to_seq=1, route_reason=reason
    )


@pytest.fixture
def questions() -> None:
    for i, q in enumerate(GIFT):
        asked(q, route="llm.simple", answer=f"Yes: tick Gift wrap at checkout ({i}).")
    for q in WARRANTY:
        asked(q, route="handoff", reason="no FAQ answer and no remote model configured")
    asked("can I talk to a human please", route="handoff", reason="shopper asked for a person")
    asked("I need a human to help me, now", route="handoff", reason="shopper asked for a person")
    asked("my email is ada@example.com, gift wrap it", route="llm.simple", answer="ok")
    asked("do you ship to Norway", route="llm.simple", answer="Yes, we ship to Norway.")
    asked("do you accept paypal", route="faq", answer="We accept PayPal.")  # the bot answered it


def test_the_questions_the_bot_could_not_answer_are_grouped_largest_first(questions: None) -> None:
    groups = faq_candidates(hours=1)
    assert [(g["size"], g["handoffs"], g["model_answers"]) for g in groups] == [(3, 0, 3), (2, 2, 0)]
    gift, warranty = groups
    assert gift["question"] in GIFT and sorted([gift["question"], *gift["examples"]]) == sorted(GIFT)
    assert sorted([warranty["question"], *warranty["examples"]]) == sorted(WARRANTY)
    assert gift["draft_answer"].startswith("Yes: tick Gift wrap at checkout (")
    assert warranty["draft_answer"] == ""  # no model answered those: staff write it
    form = parse_qs(urlsplit(gift["draft_url"]).query)
    assert urlsplit(gift["draft_url"]).path == "/admin/routing/faqentry/add/"
    assert form["question"] == [gift["question"]] and form["locale"] == ["en"]
    assert json.loads(form["variants"][0]) == gift["examples"]
    assert form["answer"] == [gift["draft_answer"]]
    # Requests for a person, personal data and a question asked once are not candidates.
    everything = json.dumps(groups)
    assert "human" not in everything and "ada@example.com" not in everything and "Norway" not in everything


def test_the_page_and_the_api_are_for_staff_with_the_cost_permission(questions: None, client: Any) -> None:
    assert client.get("/ops/api/faq-candidates").status_code == 401
    user = User.objects.create_user("ops", password="pw", is_staff=True)
    client.force_login(user)
    assert client.get("/ops/faq-candidates/").status_code == 403
    user.user_permissions.add(Permission.objects.get(codename="view_costs"))
    client.force_login(User.objects.get(pk=user.pk))
    api = client.get("/ops/api/faq-candidates?hours=1").json()
    assert [g["size"] for g in api["groups"]] == [3, 2]
    page = client.get("/ops/faq-candidates/?hours=1")
    html = page.content.decode()
    assert page.status_code == 200 and html.count("Draft FAQ entry") == 2
    assert "script-src 'self'" in page["Content-Security-Policy"]


def test_the_draft_opens_the_admins_faq_form_filled(questions: None, client: Any) -> None:
    client.force_login(User.objects.create_superuser("boss", password="pw"))
    gift = faq_candidates(hours=1)[0]
    page = client.get(gift["draft_url"])
    assert page.status_code == 200
    form = page.context["adminform"].form
    assert form.initial["question"] == gift["question"]
    assert form.initial["variants"] == gift["examples"]  # a list, not a JSON string
    assert form.initial["answer"] == gift["draft_answer"]
