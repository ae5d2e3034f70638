"""Spend budgets that degrade instead of failing (routing/upstream/budgets.py; issue: trust).

Reservations and settlements on the real database (PostgreSQL under CI), threads racing one
budget, calls held and settled through ``stream_with_fallback`` with the real ``openai`` client
against the project's test server, and the shopper's and the gateway's view: past the soft share
no costliest tier, past the limit a polite notice and a person, never an upstream call. Two real
workers racing one verified shopper's budget are in tests/chat/test_budgets_across_workers.py.
"""

from __future__ import annotations

import dataclasses
import threading
import uuid
from dataclasses import replace
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from channels.db import database_sync_to_async
from django.db import connection
from django.test import AsyncClient
from django.utils import timezone

from chat.models import Conversation, ConversationStatus
from routing.decide.answers import budget_text
from routing.gateway.completions import api_key_issue
from routing.models import BudgetCounter, BudgetHold, UpstreamCall
from routing.providers.base import ChatRequest
from routing.types import Payer
from routing.upstream import budgets
from routing.upstream.budgets import BudgetRefused, Scope, Standing
from routing.upstream.ledger import CallContext, max_cost_usd
from tests.fake_openai import Behaviour
from tests.routing.test_ledger import call, run

pytestmark = [pytest.mark.django_db(transaction=True)]

PRODUCT_Q = "Does the walnut floor lamp come with a dimmer switch?"
REFUND_DENIED = "My refund was denied for the broken walnut lamp, what now?"  # rule refund_dispute: complex
CENT = Decimal("0.01")


@pytest.fixture(autouse=True)
def _limits(settings: Any, routing_guards: None) -> None:
    """Round limits for reading the figures: a shopper $1.00 a day and $10 a month, an address
    $3.00 a day, no tier caps, soft share 80%."""
    settings.KEFU_BUDGETS_ENABLED = True
    settings.KEFU_BUDGET_SHOPPER_DAY_USD = 1.0
    settings.KEFU_BUDGET_SHOPPER_MONTH_USD = 10.0
    settings.KEFU_BUDGET_ADDRESS_DAY_USD = 3.0
    settings.KEFU_BUDGET_ADDRESS_MONTH_USD = 0.0
    settings.KEFU_BUDGET_KEY_DAY_USD = 0.0
    settings.KEFU_BUDGET_KEY_MONTH_USD = 0.0
    settings.KEFU_BUDGET_SOFT_SHARE = 0.8
    settings.KEFU_TIERS = {t: replace(cfg, day_cap_usd=0.0) for t, cfg in settings.KEFU_TIERS.items()}
    budgets.forget_key_limits()


def counter(kind: str, key: str, period: str = "day") -> BudgetCounter | None:
    today = timezone.localdate()
    starts = today if period == "day" else today.replace(day=1)
    return BudgetCounter.objects.filter(kind=kind, key=key, period=period, starts_on=starts).first()


def spend(kind: str, key: str, usd: str, *, limit: str = "1.00", period: str = "day") -> None:
    """Record ``usd`` as already spent by a payer today (or this month)."""
    today = timezone.localdate()
    BudgetCounter.objects.create(
        kind=kind,
        key=key,
        period=period,
        starts_on=today if period == "day" else today.replace(day=1),
        spent_usd=Decimal(usd),
        limit_usd=Decimal(limit),
    )


# --------------------------------------------------------------------------- hold and settle


def test_a_hold_takes_the_maximum_on_every_budget_and_settling_replaces_it_by_the_cost() -> None:
    conv = uuid.uuid4()
    payer = Payer(conversation_id=conv, address_key="a" * 32)
    hold = budgets.reserve(payer, "simple", Decimal("0.30"))
    assert hold is not None and len(hold.counter_ids) == 3  # conversation day + month, address day
    for kind, key, period in (("conversation", str(conv), "day"), ("conversation", str(conv), "month")):
        row = counter(kind, key, period)
        assert row is not None and row.reserved_usd == Decimal("0.30") and row.spent_usd == 0
    address = counter("address", "a" * 32)
    assert address is not None and address.limit_usd == Decimal("3.00") and address.reserved_usd == Decimal("0.30")
    assert BudgetHold.objects.filter(hold=hold.hold_id).count() == 3

    budgets.settle(hold, Decimal("0.012345"))
    for kind, key, period in (("conversation", str(conv), "day"), ("address", "a" * 32, "day")):
        row = counter(kind, key, period)
        assert row is not None and row.reserved_usd == 0 and row.spent_usd == Decimal("0.012345")
    assert not BudgetHold.objects.exists()


def test_a_call_that_does_not_fit_one_budget_holds_nothing_anywhere() -> None:
    conv = uuid.uuid4()
    spend("address", "b" * 32, "2.90", limit="3.00")
    with pytest.raises(BudgetRefused) as refused:
        budgets.reserve(Payer(conversation_id=conv, address_key="b" * 32), "simple", Decimal("0.20"))
    assert refused.value.scope.kind == "address" and refused.value.scope.period == "day"
    assert abs(refused.value.share - 2.9 / 3) < 1e-9
    assert "address daily budget" in str(refused.value)
    # The conversation's own counters were made in the same transaction and rolled back with it.
    assert counter("conversation", str(conv)) is None
    assert counter("address", "b" * 32).reserved_usd == 0  # type: ignore[union-attr]
    assert not BudgetHold.objects.exists()
    # What still fits is held.
    assert budgets.reserve(Payer(conversation_id=conv, address_key="b" * 32), "simple", Decimal("0.10")) is not None


def test_a_verified_shopper_pays_by_customer_id_kept_only_as_a_keyed_hash() -> None:
    hold = budgets.reserve(Payer(customer_id="cust-42"), "simple", Decimal("0.05"))
    assert hold is not None
    keys = set(BudgetCounter.objects.values_list("kind", "key"))
    assert {k for k, _ in keys} == {"customer"}
    assert all("cust-42" not in key and len(key) == 32 for _, key in keys)
    # Another device of the same customer is the same budget.
    assert budgets.reserve(Payer(customer_id="cust-42"), "simple", Decimal("0.05")).counter_ids == hold.counter_ids  # type: ignore[union-attr]


def test_an_expired_hold_counts_as_spent_at_its_maximum_and_a_late_settle_corrects_it() -> None:
    conv = uuid.uuid4()
    payer = Payer(conversation_id=conv)
    hold = budgets.reserve(payer, "simple", Decimal("0.40"))
    assert hold is not None
    BudgetHold.objects.update(expires_at=timezone.now() - timedelta(seconds=1))  # its process died
    assert budgets.expire_holds() == 2
    row = counter("conversation", str(conv))
    assert row is not None and row.reserved_usd == 0 and row.spent_usd == Decimal("0.40")
    # The process was only slow: its settle replaces the maximum by the real cost.
    budgets.settle(hold, Decimal("0.03"))
    row.refresh_from_db()
    assert row.spent_usd == Decimal("0.03") and row.reserved_usd == 0


def test_threads_racing_for_one_budget_never_hold_more_than_it() -> None:
    """Eight threads, each its own database connection, ask for $0.30 of one $1.00 budget at the
    same moment: exactly three get it (LiteLLM's end-user budgets let them all through)."""
    conv = uuid.uuid4()
    barrier = threading.Barrier(8)
    won: list[budgets.Hold] = []
    refused: list[BudgetRefused] = []
    lock = threading.Lock()

    def ask() -> None:
        try:
            barrier.wait(30)
            try:
                hold = budgets.reserve(Payer(conversation_id=conv), "simple", Decimal("0.30"))
                with lock:
                    won.append(hold)  # type: ignore[arg-type]
            except BudgetRefused as e:
                with lock:
                    refused.append(e)
        finally:
            connection.close()

    threads = [threading.Thread(target=ask) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(won) == 3 and len(refused) == 5
    row = counter("conversation", str(conv))
    assert row is not None and row.reserved_usd == Decimal("0.90")


def test_the_most_a_call_can_cost_is_its_prompt_and_max_tokens_at_list_prices(settings: Any) -> None:
    settings.KEFU_TIERS = {
        **settings.KEFU_TIERS,
        "simple": settings.KEFU_TIERS["simple"].with_current(
            model="deepseek-chat",
            price_input_per_mtok=0.28,
            price_cached_input_per_mtok=0.028,
            price_output_per_mtok=0.42,
        ),
    }
    request = ChatRequest(messages=[{"role": "user", "content": "hello"}], model="x", max_tokens=1000)
    # simple (deepseek-chat): 1000 completion tokens x $0.42/M = $0.00042, plus a prompt of a few tokens x $0.28/M
    usd = max_cost_usd("simple", request)
    assert Decimal("0.000420") < usd < Decimal("0.000430")
    settings.KEFU_LLM_MAX_TOKENS = 100
    assert max_cost_usd("simple", ChatRequest(messages=request.messages, model="x")) < Decimal("0.00005")


# --------------------------------------------------------------------------- standing


def scope(kind: str = "conversation", limit: str = "1") -> Scope:
    return Scope(kind, "k", "day", timezone.localdate(), Decimal(limit))


def test_standing_keeps_the_costliest_tier_below_the_soft_share_only() -> None:
    tiers = ["simple", "medium", "complex"]
    assert Standing(share=0.79, scope=scope()).choose("complex", tiers) == "complex"
    soft = Standing(share=0.80, scope=scope())
    assert soft.choose("complex", tiers) == "medium" and soft.choose("simple", tiers) == "simple"
    assert soft.tiers_open(tiers) == ["simple", "medium"]
    assert "shopper daily budget at 80%" in soft.reason()
    spent = Standing(share=1.0, scope=scope())
    assert spent.choose("simple", tiers) is None and spent.tiers_open(tiers) == []


def test_store_tier_caps_send_questions_down_then_up_then_nowhere() -> None:
    tiers = ["simple", "medium", "complex"]
    # complex past 80% of its cap: a cheaper tier takes its questions
    assert Standing(tier_shares={"complex": 0.85}).choose("complex", tiers) == "medium"
    # simple's cap spent: its questions go up to medium
    assert Standing(tier_shares={"simple": 1.0}).choose("simple", tiers) == "medium"
    # simple past 80% has no cheaper tier: it keeps its questions until its cap is spent
    assert Standing(tier_shares={"simple": 0.9}).choose("simple", tiers) == "simple"
    every = Standing(tier_shares={"simple": 1.0, "medium": 1.0, "complex": 1.0})
    assert every.choose("medium", tiers) is None
    assert (
        every.reason()
        == "simple tier's daily cap at 100%, medium tier's daily cap at 100%, complex tier's daily cap at 100%"
    )


# --------------------------------------------------------------------------- through the tiers


@pytest.mark.asyncio
async def test_a_remote_call_is_held_and_settled_at_its_ledger_cost(remote: Any) -> None:
    remote.push(Behaviour(text="Yes.", prompt_tokens=1000, completion_tokens=200))
    conv = uuid.uuid4()
    text, done, error = await run(call(context=CallContext(payer=Payer(conversation_id=conv))))
    assert error is None and text == "Yes."
    row = await database_sync_to_async(counter)("conversation", str(conv))
    # deepseek-chat list prices: 1000 x $0.28/M + 200 x $0.42/M = $0.000364, the ledger's figure
    assert row is not None and row.spent_usd == Decimal("0.000364") and row.reserved_usd == 0
    ledger_row = await UpstreamCall.objects.aget()
    assert ledger_row.cost_usd == Decimal("0.000364")
    assert not await BudgetHold.objects.aexists()


@pytest.mark.asyncio
async def test_a_tier_whose_cap_is_spent_is_skipped_and_the_ledger_says_budget(remote: Any, settings: Any) -> None:
    settings.KEFU_TIERS = {
        t: replace(cfg, day_cap_usd=0.01 if t == "simple" else 0.0) for t, cfg in settings.KEFU_TIERS.items()
    }
    await database_sync_to_async(spend)("tier", "simple", "0.01", limit="0.01")
    text, _done, error = await run(call("simple"))
    assert error is None and text.startswith("Echo:")
    assert [r["model"] for r in remote.requests] == ["fake-medium"]
    rows = [r async for r in UpstreamCall.objects.order_by("id").values("tier", "outcome", "error_code")]
    assert rows == [
        {"tier": "simple", "outcome": "fell_back", "error_code": "budget"},
        {"tier": "medium", "outcome": "ok", "error_code": ""},
    ]


@pytest.mark.asyncio
async def test_no_fallback_into_a_tier_the_budget_closed(remote: Any) -> None:
    remote.push(*[Behaviour(status=500)] * 4)  # simple and medium, each tried twice
    c = dataclasses.replace(call("simple"), tiers_allowed=("simple", "medium"))
    _text, _done, error = await run(c)
    assert error is not None and error.code == "server"
    assert [r["model"] for r in remote.requests] == ["fake-simple"] * 2 + ["fake-medium"] * 2


# --------------------------------------------------------------------------- the shopper's view


def dedicated_tiers(settings: Any) -> None:
    """Let the tier classifier choose every tier (each configured on its own)."""
    settings.KEFU_TIERS = {t: replace(cfg, dedicated=True) for t, cfg in settings.KEFU_TIERS.items()}
    settings.KEFU_TIER_ROUTING = True


def deltas(frames: list[dict[str, Any]]) -> str:
    return "".join(f["text"] for f in frames if f["type"] == "stream.delta")


@pytest.mark.asyncio
async def test_past_the_soft_share_a_complex_question_goes_to_the_medium_tier(
    make_client: Any, faq: Any, remote: Any, settings: Any
) -> None:
    dedicated_tiers(settings)
    shopper = await make_client()
    first = await shopper.hello()
    conv = first["id"]
    await shopper.say(REFUND_DENIED)
    end = (await shopper.until("stream.end"))[-1]
    assert end["route"] == "llm.complex"  # the rule's tier while the budget is far from spent
    await database_sync_to_async(BudgetCounter.objects.filter(kind="conversation", key=conv, period="day").update)(
        spent_usd=Decimal("0.85")
    )
    await shopper.say("My refund was denied again for the same lamp")
    end = (await shopper.until("stream.end"))[-1]
    assert end["route"] == "llm.medium" and end["model"] == "fake-medium"
    assert remote.requests[-1]["model"] == "fake-medium"


@pytest.mark.asyncio
async def test_a_spent_shopper_is_told_politely_and_handed_to_a_person_with_no_upstream_call(
    make_client: Any, faq: Any, remote: Any
) -> None:
    shopper = await make_client()
    first = await shopper.hello()
    await database_sync_to_async(spend)("conversation", first["id"], "1.00")
    await shopper.say(PRODUCT_Q)
    frames = await shopper.until("status")
    end = next(f for f in frames if f["type"] == "stream.end")
    assert end["route"] == "handoff" and end["text"] == deltas(frames) == budget_text("en")
    assert frames[-1]["status"] == ConversationStatus.WAITING_AGENT
    assert remote.requests == []
    conv = await Conversation.objects.aget(pk=first["id"])
    assert conv.status == ConversationStatus.WAITING_AGENT
    # The FAQ still answers a question it knows, with no model.
    await shopper.say("How long does delivery take?")
    end = (await shopper.until("stream.end"))[-1]
    assert end["route"] == "faq" and remote.requests == []


@pytest.mark.asyncio
async def test_an_answer_that_lost_the_last_of_the_budget_since_it_was_chosen_gets_the_notice(
    make_client: Any, faq: Any, remote: Any, monkeypatch: Any
) -> None:
    """The standing read said there was room, but another answer held the rest before this one's
    call: the reservation refuses it, and the shopper reads the notice, not an upstream failure."""
    monkeypatch.setattr(budgets, "standing_async", _room_left)
    shopper = await make_client()
    first = await shopper.hello()
    await database_sync_to_async(spend)("conversation", first["id"], "0.999999")
    await shopper.say(PRODUCT_Q)
    end = next(f for f in await shopper.until("status") if f["type"] == "stream.end")
    assert end["route"] == "handoff" and end["text"] == budget_text("en") and remote.requests == []
    rows = [r async for r in UpstreamCall.objects.values_list("error_code", flat=True)]
    assert set(rows) == {"budget"}


async def _room_left(payer: Any, tiers: Any) -> Standing:
    return Standing()


# --------------------------------------------------------------------------- the gateway's view


@pytest.mark.asyncio
async def test_a_gateway_key_past_its_own_budget_gets_429_but_still_faq_answers(
    faq: Any, remote: Any, settings: Any
) -> None:
    key, raw = await database_sync_to_async(api_key_issue)(name="orders bot")
    key.budget_day_usd = Decimal("0.50")
    await key.asave()
    budgets.forget_key_limits()
    await database_sync_to_async(spend)("key", str(key.pk), "0.50", limit="0.50")

    async def ask(text: str, key: str = raw) -> Any:
        return await AsyncClient().post(
            "/v1/chat/completions",
            {"model": "kefu", "messages": [{"role": "user", "content": text}]},
            content_type="application/json",
            headers={"Authorization": f"Bearer {key}"},
        )

    refused = await ask(PRODUCT_Q)
    assert refused.status_code == 429
    error = refused.json()["error"]
    assert error["code"] == "budget_exceeded" and "key daily budget at 100%" in error["message"]
    assert remote.requests == []
    answered = await ask("How long does delivery take?")
    assert answered.status_code == 200 and answered["x-kefu-route"] == "faq"
    # Another key has its own budget (none set: no limit).
    _other, other_raw = await database_sync_to_async(api_key_issue)(name="search bot")
    other = await ask(PRODUCT_Q, other_raw)
    assert other.status_code == 200 and other["x-kefu-route"].startswith("llm.")
    row = await database_sync_to_async(counter)("key", str(_other.pk))
    assert row is None  # no limit for that key: nothing counted, nothing held
