"""Issue 28: the model a store configured is the one that answers (routing.upstream.listing).

Every test runs the real router and the real ``openai`` client against the project's test
upstream (routing/management/fake_upstream.py) serving a given ``GET /v1/models`` list or status,
and asserts what was sent to it: which model, and that nothing was sent when a tier is off.
"""

from __future__ import annotations

import logging
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.contrib.auth.models import Permission, User
from django.test import AsyncClient

from routing.upstream import canary, catalog, listing
from routing.upstream.resilience import fallback_tiers
from routing.upstream.tiers import check_tiers, deployment, tier_states

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from conftest import REMOTE_PRICES
from fake_openai import Behaviour

PRODUCT_Q = "Does the walnut floor lamp come with a dimmer switch?"
CHAT = "/v1/chat/completions"


def by_preference(settings: Any, server: Any, **prices: float) -> None:
    """Every tier on ``server`` with no model named (kefu's preference lists), as a store with only
    ``OPENAI_BASE_URL`` / ``OPENAI_API_KEY`` set; ``prices``: ``KEFU_SIMPLE_PRICE_*`` set."""
    tiers = {}
    for tier, cfg in settings.KEFU_TIERS.items():
        first = catalog.first_choice(tier)
        listed = dict(
            zip(
                ("price_input_per_mtok", "price_cached_input_per_mtok", "price_output_per_mtok"),
                catalog.PRICES[first],
                strict=True,
            )
        )
        named = prices if tier == "simple" else {}
        current = replace(cfg.current, model=first, base_url=server.base_url, api_key="test-key", **{**listed, **named})
        tiers[tier] = replace(
            cfg, current=current, preferences=catalog.PREFERENCES[tier], named_prices=frozenset(named), dedicated=False
        )
    settings.KEFU_TIERS = tiers
    settings.KEFU_LLM_FIRST_TOKEN_TIMEOUT_S = 6.0
    settings.KEFU_LLM_TOTAL_TIMEOUT_S = 20.0


def paths(server: Any) -> list[str]:
    return [path for path, _ in server.peers]


async def healthz() -> tuple[int, dict[str, Any]]:
    response = await AsyncClient().get("/healthz")
    return response.status_code, response.json()


async def ask(make_client: Any, question: str = PRODUCT_Q) -> dict[str, Any]:
    shopper = await make_client()
    await shopper.hello()
    await shopper.say(question)
    frames = await shopper.until("stream.end")
    end: dict[str, Any] = frames[-1]
    return end


def wait_until(condition: Any, *, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


def test_every_preferred_model_has_a_list_price() -> None:
    for tier, models in catalog.PREFERENCES.items():
        assert models, tier
        for model in models:
            assert model in catalog.PRICES, f"{tier}: {model} has no price"
            assert all(p >= 0 for p in catalog.PRICES[model])


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_a_listed_default_is_chosen_at_its_list_prices(make_client, faq, fake_openai, settings):
    # Gemini's OpenAI-compatible endpoint names its models "models/<id>".
    fake_openai.models = ("models/text-embedding-004", "models/gemini-2.5-flash", "models/gemini-2.5-flash-lite")
    by_preference(settings, fake_openai)
    fake_openai.push(Behaviour(text="Yes, it dims.", prompt_tokens=1000, completion_tokens=200))
    end = await ask(make_client)
    assert end["route"] == "llm.simple" and end["model"] == "gemini-2.5-flash-lite"
    assert [r["model"] for r in fake_openai.requests] == ["gemini-2.5-flash-lite"]
    # No call before the check: the endpoint's list was asked for before the first chat request.
    assert CHAT in paths(fake_openai) and paths(fake_openai).index("/v1/models") < paths(fake_openai).index(CHAT)
    # gemini-2.5-flash-lite's list prices, not gpt-4.1-nano's (the first choice): 1000 x $0.10/M
    # + 200 x $0.40/M = $0.00018.
    assert end["usage"]["cost_usd"] == 0.00018
    _, body = await healthz()
    assert body["tiers"]["simple"] == "ok: gemini-2.5-flash-lite"
    assert body["tiers"]["medium"] == "ok: gemini-2.5-flash"  # medium's list: its first listed


@pytest.mark.django_db
def test_a_price_set_explicitly_wins_over_the_chosen_models(fake_openai, settings):
    fake_openai.models = ("qwen-plus", "qwen-turbo")
    by_preference(settings, fake_openai, price_output_per_mtok=9.0)
    check_tiers()
    d = deployment("simple")
    # qwen-turbo (the simple list has it before qwen-plus), its input prices, the set output price.
    assert (d.model, d.price_input_per_mtok, d.price_cached_input_per_mtok, d.price_output_per_mtok) == (
        "qwen-turbo",
        0.05,
        0.01,
        9.0,
    )


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_an_explicit_unlisted_model_is_refused_and_reported(make_client, faq, remote, caplog):
    remote.models = ("gpt-4o-mini", "gpt-4o")  # not fake-simple, which the tier names
    listing.forget()  # a process starting now: its first message waits for the check
    with caplog.at_level(logging.WARNING, logger="routing.upstream.listing"):
        first = await ask(make_client)
        second = await ask(make_client, "Is the walnut lamp made in Portugal?")
    assert first["route"] == second["route"] == "handoff"
    assert remote.requests == []  # no chat request to any model
    _, body = await healthz()
    assert body["tiers"]["simple"] == (
        f"off: KEFU_SIMPLE_MODEL=fake-simple is not listed by {remote.base_url}: "
        "set KEFU_SIMPLE_MODEL to one of gpt-4o-mini, gpt-4o"
    )
    offs = [r.getMessage() for r in caplog.records if "the simple tier is off" in r.getMessage()]
    assert len(offs) == 1 and "KEFU_SIMPLE_MODEL=fake-simple" in offs[0]  # logged once


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_none_listed_hands_off_with_no_request_to_any_model(make_client, faq, fake_openai, settings):
    fake_openai.models = ("llama-3.1-8b-instruct",)
    by_preference(settings, fake_openai)
    end = await ask(make_client)
    assert end["route"] == "handoff" and "person" in end["text"]
    assert fake_openai.requests == [] and CHAT not in paths(fake_openai)
    _, body = await healthz()
    detail = body["tiers"]["simple"]
    assert detail.startswith(f"off: {fake_openai.base_url} lists none of kefu's preference list (gpt-4.1-nano, ")
    assert detail.endswith("set KEFU_SIMPLE_MODEL to one of llama-3.1-8b-instruct")
    # The ops page says the same.
    staff = await sync_to_async(User.objects.create_user)("ops", password="pw", is_staff=True)
    perm = await sync_to_async(Permission.objects.get)(codename="view_costs")
    await sync_to_async(staff.user_permissions.add)(perm)
    client = AsyncClient()
    await sync_to_async(client.force_login)(staff)
    page = (await client.get("/ops/")).content.decode()
    assert "Remote models now" in page and "set KEFU_SIMPLE_MODEL to one of llama-3.1-8b-instruct" in page


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_healthz_stays_200_with_a_tier_off(faq, remote):
    remote.models = ()
    listing.forget()
    await sync_to_async(check_tiers)()
    status, body = await healthz()
    assert body["tiers"]["simple"].startswith("off: KEFU_SIMPLE_MODEL=fake-simple is not listed")
    assert {k: v for k, v in body.items() if k != "tiers"} == {
        "status": "ok",
        "database": "ok",
        "channel_layer": "ok",
        "cache": "ok",
        "faq_model": "ok",
        "router": "ok",
    }
    assert status == 200


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
@pytest.mark.parametrize("code", [401, 403])
async def test_a_refused_key_turns_the_tier_off(make_client, faq, remote, code):
    remote.models_status = code
    listing.forget()
    end = await ask(make_client)
    assert end["route"] == "handoff"
    assert remote.requests == []
    _, body = await healthz()
    assert body["tiers"]["simple"] == (
        f"off: {remote.base_url} refused the API key (HTTP {code}): set KEFU_SIMPLE_API_KEY or OPENAI_API_KEY"
    )


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_models_404_leaves_the_tier_on_unverified_and_asks_again(make_client, faq, remote, settings):
    remote.models_status = 404  # a compatible server without /models
    listing.forget()
    end = await ask(make_client)
    assert end["route"] == "llm.simple" and [r["model"] for r in remote.requests] == ["fake-simple"]
    _, body = await healthz()
    assert body["tiers"]["simple"] == (
        f"unverified: GET /models of {remote.base_url} failed (HTTP 404); fake-simple is called "
        "unchecked and the list asked for again every 300 s"
    )
    # The endpoint gets a /models later and it does not list the model: the re-check turns it off.
    settings.KEFU_MODELS_RECHECK_S = 0.2
    remote.models_status = 200
    remote.models = ("gpt-4o-mini",)
    asked = remote.models_requests
    await sync_to_async(wait_until)(
        lambda: tier_states()["simple"].startswith("off:") and remote.models_requests > asked
    )
    end = await ask(make_client, "Is the walnut lamp made in Portugal?")
    assert end["route"] == "handoff" and [r["model"] for r in remote.requests] == ["fake-simple"]


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_a_models_timeout_leaves_the_tier_on_unverified(make_client, faq, remote, settings):
    settings.KEFU_MODELS_CHECK_TIMEOUT_S = 0.5
    remote.models_delay_s = 5.0
    listing.forget()
    end = await ask(make_client)
    assert end["route"] == "llm.simple" and [r["model"] for r in remote.requests] == ["fake-simple"]
    assert paths(remote).index("/v1/models") < paths(remote).index(CHAT)
    _, body = await healthz()
    assert body["tiers"]["simple"].startswith(
        f"unverified: GET /models of {remote.base_url} failed (timed out after 0.5 s)"
    )


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_no_fallback_to_a_tier_not_configured_on_its_own(make_client, faq, remote, settings):
    # Only the medium tier is configured on its own; complex only inherits the endpoint and key.
    settings.KEFU_TIERS = {**settings.KEFU_TIERS, "complex": replace(settings.KEFU_TIERS["complex"], dedicated=False)}
    assert fallback_tiers("simple") == ["simple", "medium"]
    remote.push(*[Behaviour(status=500)] * 6)
    end = await ask(make_client)
    assert end["route"] == "handoff"
    assert [r["model"] for r in remote.requests] == ["fake-simple"] * 2 + ["fake-medium"] * 2


@pytest.mark.django_db
def test_the_simple_tier_alone_has_no_fallback(remote, settings):
    # Only OPENAI_* set: neither medium nor complex was chosen by the store.
    settings.KEFU_TIERS = {t: replace(cfg, dedicated=False) for t, cfg in settings.KEFU_TIERS.items()}
    assert fallback_tiers("simple") == ["simple"]
    assert fallback_tiers("medium") == ["medium"]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("state", ["promoted", "rolled_back"])
def test_a_canary_decision_checks_the_models_again(remote, settings, state):
    settings.KEFU_TIERS = {
        **settings.KEFU_TIERS,
        "simple": settings.KEFU_TIERS["simple"].with_canary(model="fake-candidate", share=0.5),
    }
    check_tiers()
    assert tier_states()["simple candidate"] == "ok: fake-candidate"
    asked = remote.models_requests
    # The endpoint no longer serves the candidate: the decision's re-check finds out.
    remote.models = ("fake-simple",)
    canary.decide("simple", state=state, by="alice")
    wait_until(lambda: remote.models_requests > asked and "simple candidate" in tier_states())
    wait_until(lambda: tier_states()["simple candidate"].startswith("off: KEFU_SIMPLE_CANARY_MODEL=fake-candidate"))
    assert tier_states()["simple"] == "ok: fake-simple"


def test_no_key_asks_nothing(fake_openai, settings):
    settings.KEFU_TIERS = {
        tier: cfg.with_current(base_url=fake_openai.base_url, api_key="") for tier, cfg in settings.KEFU_TIERS.items()
    }
    assert check_tiers() == {}
    assert fake_openai.models_requests == 0
    assert tier_states()["simple"] == "not configured: no API key (KEFU_SIMPLE_API_KEY or OPENAI_API_KEY)"
    assert listing.listing(deployment("simple")) is None


def test_remote_prices_are_the_catalogs() -> None:
    # The remote fixture's prices are list prices of real models (tests' costs are worked out from them).
    assert REMOTE_PRICES["simple"] == catalog.PRICES["deepseek-chat"]
    assert REMOTE_PRICES["medium"] == catalog.PRICES["gemini-2.5-flash"]
    assert REMOTE_PRICES["complex"] == catalog.PRICES["gpt-4.1"]


@pytest.mark.django_db(transaction=True)
def test_a_decision_made_by_another_process_checks_the_models_again(remote, settings):
    from routing.models import TierOverride

    settings.KEFU_CANARY_REFRESH_S = 0.0  # every read goes to the database
    settings.KEFU_TIERS = {
        **settings.KEFU_TIERS,
        "simple": settings.KEFU_TIERS["simple"].with_canary(model="fake-candidate", share=0.5),
    }
    check_tiers()
    assert canary.status("simple") is not None  # this process's copy: no decision yet
    asked = remote.models_requests
    remote.models = ("fake-simple",)
    # Another process (its own memory) promotes the candidate: only the row is shared.
    TierOverride.objects.create(tier="simple", state="promoted", candidate_model="fake-candidate", by="bob")
    assert canary.status("simple").state == "promoted"
    wait_until(lambda: remote.models_requests > asked and "simple candidate" in tier_states())
    wait_until(lambda: tier_states()["simple candidate"].startswith("off: KEFU_SIMPLE_CANARY_MODEL=fake-candidate"))
