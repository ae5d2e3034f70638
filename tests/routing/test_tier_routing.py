"""Tier routing end to end over /ws/chat/: the router chooses the tier (routing/decide/tier_classifier.py) and
the real ``openai`` client calls the project's streaming test server (tests/fake_openai.py)."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pytest
from channels.db import database_sync_to_async

from chat.models import Conversation

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from fake_openai import Behaviour
from sockets import status_frame

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

SIMPLE_Q = "Is the ceramic vase dishwasher safe?"
COMPLEX_Q = (
    "My order came a week late, the box was crushed, two of the plates inside were broken, and the "
    "replacement you sent is a different pattern. I've emailed twice without an answer. What now?"
)


@pytest.fixture
def tiers(settings, remote):
    """``remote`` with every tier configured on its own (``dedicated``), so the router may choose
    any of them up front; ``tiers(complex=False)`` leaves a tier unconfigured (no API key)."""
    from routing.decide.tier_classifier import reset_classifier

    def configure(**enabled: bool) -> None:
        settings.KEFU_TIERS = {
            tier: replace(cfg, dedicated=True).with_current(
                api_key=cfg.current.api_key if enabled.get(tier, True) else ""
            )
            for tier, cfg in settings.KEFU_TIERS.items()
        }

    reset_classifier()
    settings.KEFU_TIER_ROUTING = True  # the remote fixture turns it off
    configure()
    yield configure
    reset_classifier()


async def ask(make_client, text: str, until: str = "stream.end") -> list[dict]:
    shopper = await make_client()
    await shopper.hello()
    await shopper.say(text)
    frames = await shopper.until(until)
    frames.append({"conversation": shopper.conversation})
    return frames


def end_of(frames: list[dict]) -> dict:
    return next(f for f in frames if f.get("type") == "stream.end")


async def test_complex_message_goes_to_the_complex_tier(make_client, faq, remote, tiers):
    remote.push(
        Behaviour(
            text="I'm sorry about all of this. Here is what we will do.", prompt_tokens=800, completion_tokens=100
        )
    )
    end = end_of(await ask(make_client, COMPLEX_Q))
    assert end["route"] == "llm.complex" and end["model"] == "fake-complex"
    assert [r["model"] for r in remote.requests] == ["fake-complex"]
    # gpt-4.1 list prices: 800 x $2/M + 100 x $8/M
    assert end["usage"]["cost_usd"] == 0.0024


async def test_simple_question_stays_on_the_simple_tier(make_client, faq, remote, tiers):
    end = end_of(await ask(make_client, SIMPLE_Q))
    assert end["route"] == "llm.simple" and [r["model"] for r in remote.requests] == ["fake-simple"]


async def test_refund_dispute_rule_chooses_the_complex_tier(make_client, faq, remote, tiers):
    end = end_of(await ask(make_client, "You refused to refund me for the kettle."))
    assert end["route"] == "llm.complex" and [r["model"] for r in remote.requests] == ["fake-complex"]


async def test_legal_threat_is_handed_to_a_person(make_client, faq, remote, tiers):
    frames = await ask(make_client, "If this isn't fixed by Friday my lawyer will be in touch.", until="status")
    end = end_of(frames)
    assert end["route"] == "handoff" and "person" in end["text"]
    assert frames[-2] == status_frame("waiting_agent", position=1)
    assert remote.requests == []  # no model was asked
    conv = await database_sync_to_async(Conversation.objects.get)(pk=frames[-1]["conversation"])
    assert conv.status == "waiting_agent" and "legal_threat" in conv.handoff_reason


async def test_chinese_fraud_report_is_handed_to_a_person(make_client, faq, remote, tiers):
    frames = await ask(make_client, "我的银行卡在你们店被盗刷了三笔", until="status")
    assert end_of(frames)["route"] == "handoff" and frames[-2] == status_frame("waiting_agent", position=1)
    assert remote.requests == []


async def test_unconfigured_tier_falls_to_the_nearest_configured_one(make_client, faq, remote, tiers):
    tiers(complex=False)
    end = end_of(await ask(make_client, COMPLEX_Q))
    assert end["route"] == "llm.medium" and [r["model"] for r in remote.requests] == ["fake-medium"]


async def test_inherited_tiers_only_keep_everything_on_simple(make_client, faq, remote):
    # The ``remote`` fixture alone: every tier shares one base URL and key, none configured on its
    # own (as with only OPENAI_BASE_URL / OPENAI_API_KEY set): the simple tier answers.
    end = end_of(await ask(make_client, COMPLEX_Q))
    assert end["route"] == "llm.simple" and [r["model"] for r in remote.requests] == ["fake-simple"]


async def test_the_cache_scope_is_the_chosen_tier(make_client, faq, remote, tiers):
    first = end_of(await ask(make_client, COMPLEX_Q))
    again = end_of(await ask(make_client, COMPLEX_Q))
    assert first["route"] == "llm.complex" and again["route"] == "cache.exact"
    assert len(remote.requests) == 1
    from cache_layer.models import CachedAnswer

    rows = await database_sync_to_async(
        lambda: list(CachedAnswer.objects.filter(question=COMPLEX_Q).values_list("scope", "route", "model"))
    )()
    assert len(rows) == 1 and "|tier=complex|" in rows[0][0] and rows[0][1:] == ("llm.complex", "fake-complex")
