"""The canary page (/ops/canary/, /ops/api/canary): a tier's candidate beside its own model, and
staff's promote / roll back / resume (POST /ops/canary/<tier>/<action>, routing.views)."""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client

from chat.models import Conversation, Message
from routing.models import TierOverride, UpstreamCall
from routing.upstream import canary

pytestmark = pytest.mark.django_db


@pytest.fixture
def candidate(settings: Any) -> None:
    """The simple tier (fake-simple) with the candidate fake-candidate at 10%."""
    simple = settings.KEFU_TIERS["simple"].with_current(
        model="fake-simple", api_key="key", base_url="http://127.0.0.1:9/v1"
    )
    settings.KEFU_TIERS = {**settings.KEFU_TIERS, "simple": simple.with_canary(model="fake-candidate", share=0.1)}


@pytest.fixture
def traffic(candidate: None) -> None:
    """Current: 3 answers (ttft 100, 200, 300 ms; one rated down, two rated), 3 ledger rows at
    $0.0003. Candidate: 2 answers (ttft 150, 250 ms; one cut, one followed by a handoff), ledger
    rows $0.0010 + $0.0012 and a failed attempt (server) and a rate-limited one (not counted)."""
    seq = iter(range(1, 100))

    def bot(conv: Conversation, variant: str, ttft: float, **fields: Any) -> None:
        Message.objects.create(conversation=conv, seq=next(seq), role="shopper", text="q")
        Message.objects.create(
            conversation=conv,
            seq=next(seq),
            role="bot",
            text="a",
            route="llm.simple",
            model=f"fake-{'simple' if variant == 'current' else 'candidate'}",
            variant=variant,
            ttft_ms=ttft,
            **fields,
        )

    a = Conversation.objects.create(token_hash="a" * 64)
    b = Conversation.objects.create(token_hash="b" * 64)
    bot(a, "current", 100, rating="down")
    bot(a, "current", 200, rating="up")
    bot(a, "current", 300)
    bot(b, "candidate", 150, cut=True)
    bot(b, "candidate", 250)
    Message.objects.create(conversation=b, seq=next(seq), role="shopper", text="a person please")
    Message.objects.create(conversation=b, seq=next(seq), role="bot", text="someone comes", route="handoff")
    for variant, outcome, code, usd in [
        ("current", "ok", "", "0.000300"),
        ("current", "ok", "", "0.000300"),
        ("current", "ok", "", "0.000300"),
        ("candidate", "ok", "", "0.001000"),
        ("candidate", "ok", "", "0.001200"),
        ("candidate", "fell_back", "server", "0"),
        ("candidate", "fell_back", "rate_limited", "0"),
    ]:
        UpstreamCall.objects.create(
            tier="simple", variant=variant, model="m", outcome=outcome, error_code=code, cost_usd=Decimal(usd)
        )


def staff(name: str = "ops", *, perm: bool = True) -> User:
    user = User.objects.create_user(name, password="pw", is_staff=True)
    if perm:
        user.user_permissions.add(Permission.objects.get(codename="view_costs"))
    return User.objects.get(pk=user.pk)


def test_the_api_gives_current_and_candidate_side_by_side(client: Client, traffic: None) -> None:
    assert client.get("/ops/api/canary").status_code == 401
    client.force_login(staff())
    data = client.get("/ops/api/canary?hours=1").json()
    (tier,) = data["tiers"]
    assert {k: tier[k] for k in ("tier", "current", "candidate", "env_share", "state", "share", "decided_by")} == {
        "tier": "simple",
        "current": "fake-simple",
        "candidate": "fake-candidate",
        "env_share": 0.1,
        "state": "canary",
        "share": 0.1,
        "decided_by": "",
    }
    assert tier["figures"]["current"] == {
        "answers": 3,
        "ttft_ms": {"p50": 200.0, "p95": 300.0, "count": 3},
        "cost_usd": 0.0009,
        "cost_per_answer_usd": 0.0003,
        "thumbs_down": {"count": 1, "of": 3, "rate": 1 / 3, "rated": 2},
        "handoff": {"count": 0, "of": 3, "rate": 0.0},
        "cut": {"count": 0, "of": 3, "rate": 0.0},
        "errors": {"count": 0, "of": 3, "rate": 0.0},
    }
    assert tier["figures"]["candidate"] == {
        "answers": 2,
        "ttft_ms": {"p50": 150.0, "p95": 250.0, "count": 2},
        "cost_usd": 0.0022,
        "cost_per_answer_usd": 0.0011,
        "thumbs_down": {"count": 0, "of": 2, "rate": 0.0, "rated": 0},
        "handoff": {"count": 1, "of": 2, "rate": 0.5},
        "cut": {"count": 1, "of": 2, "rate": 0.5},
        "errors": {"count": 1, "of": 3, "rate": 1 / 3},  # the rate-limited attempt is neither
    }


def test_the_page_shows_both_with_their_counts_and_the_forms(client: Client, traffic: None) -> None:
    response = client.get("/ops/canary/")
    assert response.status_code == 302 and response["Location"].startswith("/console/login/")
    client.force_login(staff("agent", perm=False))
    assert client.get("/ops/canary/").status_code == 403
    client.force_login(staff())
    response = client.get("/ops/canary/?hours=1")
    html = response.content.decode()
    assert response.status_code == 200 and "script-src 'self'" in response["Content-Security-Policy"]
    assert "<script>" not in html and '<script src="/static/kefu/ops.js" defer></script>' in html
    assert "State: <strong>canary</strong>, the candidate answers 10% of the tier's conversations" in html
    rows = dict(
        (label, (current, candidate))
        for label, current, candidate in re.findall(
            r'<tr><th scope="row">([^<]+)</th><td>([^<]+)</td><td>([^<]+)</td></tr>', html
        )
    )
    assert rows["Answers"] == ("3", "2")
    assert rows["Time to first token p50 (ms)"] == ("200 (of 3)", "150 (of 2)")
    assert rows["Cost per answer (USD)"] == ("0.000300 (0.000900 over 3)", "0.001100 (0.002200 over 2)")
    assert rows["Thumbs down"] == ("33.3% (1 of 3), 2 rated", "0.0% (0 of 2), 0 rated")
    assert rows["Handed to a person next"] == ("0.0% (0 of 3)", "50.0% (1 of 2)")
    assert rows["Cut"] == ("0.0% (0 of 3)", "50.0% (1 of 2)")
    assert rows["Upstream errors (as the breaker counts)"] == ("0.0% (0 of 3)", "33.3% (1 of 3)")
    forms = re.findall(r'<form method="post" action="([^"]+)" data-confirm="([^"]+)">', html)
    assert [action for action, _ in forms] == ["/ops/canary/simple/promote", "/ops/canary/simple/rollback"]
    assert forms[1][1] == "Roll back fake-candidate: no conversation of the simple tier goes to it?"
    assert html.count('name="csrfmiddlewaretoken"') == 2
    assert 'href="/ops/canary/?hours=1"' in client.get("/ops/?hours=1").content.decode()


def test_no_candidate_no_tier(client: Client) -> None:
    client.force_login(staff())
    assert client.get("/ops/api/canary").json()["tiers"] == []
    assert 'id="no-canary"' in client.get("/ops/canary/").content.decode()


def test_decisions_need_staff_with_the_permission_a_post_and_the_csrf_token(candidate: None) -> None:
    client = Client(enforce_csrf_checks=True)
    assert client.post("/ops/canary/simple/rollback").status_code == 403  # no CSRF token
    client.force_login(staff("agent", perm=False))
    page = client.get("/ops/canary/")
    assert page.status_code == 403
    client.force_login(staff())
    html = client.get("/ops/canary/").content.decode()
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', html)
    assert token is not None
    assert client.get("/ops/canary/simple/rollback").status_code == 405
    assert client.post("/ops/canary/simple/rollback").status_code == 403  # a POST without the token
    response = client.post("/ops/canary/simple/rollback", {"csrfmiddlewaretoken": token[1], "reason": "  too   slow\n"})
    assert response.status_code == 303 and response["Location"] == "/ops/canary/"
    row = TierOverride.objects.get()
    assert (row.tier, row.state, row.by, row.user.username, row.candidate_model, row.reason) == (
        "simple",
        "rolled_back",
        "ops",
        "ops",
        "fake-candidate",
        "too slow",
    )
    standing = canary.status("simple")
    assert standing is not None and standing.share == 0.0
    html = client.get("/ops/canary/").content.decode()
    assert "State: <strong>rolled_back</strong>, the candidate answers 0% of the tier's conversations" in html
    assert "Last decision by <strong>ops</strong>" in html and ": too slow." in html
    assert re.findall(r'action="(/ops/canary/[^"]+)"', html) == [
        "/ops/canary/simple/promote",
        "/ops/canary/simple/resume",
    ]
    post = {"csrfmiddlewaretoken": token[1]}
    assert client.post("/ops/canary/medium/promote", post).status_code == 409  # no candidate
    assert client.post("/ops/canary/simple/pause", post).status_code == 404
    assert TierOverride.objects.count() == 1


def test_signed_out_decisions_are_refused(client: Client, candidate: None) -> None:
    assert client.post("/ops/canary/simple/promote").status_code == 401
    assert not TierOverride.objects.exists()
