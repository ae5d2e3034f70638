"""Canary rollout (routing.upstream.canary, docs/routing.md "Canary rollout"): a tier's candidate model
answers a share of its conversations, chosen by a hash of the conversation id; staff promote or
roll it back (TierOverride, audited); too many failures roll it back by themselves.

Over the real router (``routing.services.answer_open`` ... ``finish``) and real HTTP: the tier's
own model is the ``remote`` fake upstream, the candidate a second fake upstream of its own."""

from __future__ import annotations

import asyncio
import logging
import sys
import uuid
from dataclasses import replace
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from channels.db import database_sync_to_async
from django.contrib.auth.models import Permission, User

from chat.models import Conversation
from routing import services as router
from routing.models import TierOverride, UpstreamCall
from routing.types import CallContext, History, Question
from routing.upstream import canary, ledger
from routing.upstream.config import Canary
from routing.upstream.resilience import deployments

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from fake_openai import Behaviour, running_fake_openai

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

PRODUCT_Q = "Does the walnut floor lamp come with a dimmer switch?"
# The candidate's prices (USD per million tokens): not the simple tier's 0.28 / 0.028 / 0.42.
CANDIDATE_PRICES = {"price_input_per_mtok": 1.0, "price_cached_input_per_mtok": 0.1, "price_output_per_mtok": 4.0}


def conversation_ids(n: int) -> list[uuid.UUID]:
    """``n`` fixed conversation ids (the same in every run): the counts below are exact."""
    return [uuid.uuid5(uuid.NAMESPACE_URL, f"https://kefu.test/conversation/{i}") for i in range(n)]


async def no_history(*, before_seq: int, turns: int) -> History:
    return History()


@pytest.fixture
def candidate(settings: Any, remote: Any, routing_guards: None) -> Any:
    """The simple tier's candidate ``fake-candidate`` on a fake upstream of its own (key
    ``candidate-key``, CANDIDATE_PRICES), with the whole share: every conversation is its."""
    with running_fake_openai() as server:
        canary = Canary(
            model="fake-candidate", base_url=server.base_url, api_key="candidate-key", **CANDIDATE_PRICES, share=1.0
        )
        settings.KEFU_TIERS = {**settings.KEFU_TIERS, "simple": replace(settings.KEFU_TIERS["simple"], canary=canary)}
        settings.KEFU_BUDGETS_ENABLED = False  # not what these tests are about: fewer queries an answer
        # The candidate's first token must not be late on a loaded machine (25 answers at once):
        # a late one would fall back and change the counts.
        settings.KEFU_LLM_FIRST_TOKEN_TIMEOUT_S = 10.0
        yield server


def set_share(settings: Any, share: float) -> None:
    settings.KEFU_TIERS = {**settings.KEFU_TIERS, "simple": settings.KEFU_TIERS["simple"].with_canary(share=share)}


@database_sync_to_async
def conversations(ids: list[uuid.UUID]) -> None:
    """The conversations' rows (the ledger's rows point at them)."""
    Conversation.objects.bulk_create([Conversation(id=cid, token_hash=cid.hex * 2) for cid in ids])


async def answer(cid: uuid.UUID, text: str = PRODUCT_Q) -> tuple[router.Answer, Any]:
    """One shopper answer through the router's door, streamed to its end."""
    question = Question(conversation_id=cid, message_id=None, seq=1, text=text, locale="en")
    opened = await router.answer_open(question=question, history=no_history)
    pieces = [piece async for piece in opened.stream()]
    record = await opened.finish(text="".join(pieces), ttft_ms=1.0, latency_ms=2.0, cut=False)
    return opened, record


@database_sync_to_async
def ledger_rows() -> list[tuple[str, str, str, str, str, Decimal]]:
    return [
        (r.tier, r.variant, r.model, r.outcome, r.error_code, r.cost_usd)
        for r in UpstreamCall.objects.order_by("created_at", "id")
    ]


# --- Who gets the candidate -----------------------------------------------------------------------


async def test_assignment_is_a_stable_hash_of_tier_and_conversation() -> None:
    ids = conversation_ids(1000)
    tenth = {cid for cid in ids if canary.point("simple", cid) < 0.1}
    assert len(tenth) == 96  # 9.6%: within 10% +- 2%
    # The same ids again (a string or a UUID alike): the same conversations.
    assert {cid for cid in ids if canary.point("simple", str(cid)) < 0.1} == tenth
    # A larger share keeps every conversation a smaller one had; the tiers draw apart.
    fifth = {cid for cid in ids if canary.point("simple", cid) < 0.2}
    assert tenth < fifth and len(fifth) == 209
    assert {cid for cid in ids if canary.point("medium", cid) < 0.1} != tenth
    assert canary.point("simple", ids[0]) == canary.point("simple", ids[0])


async def test_a_tenth_of_1000_conversations_reach_the_candidate(settings, faq, remote, candidate) -> None:
    """The issue's check: share 0.1, 1,000 conversations, 10% +- 2% of them answered by the
    candidate's upstream (and model), the rest by the tier's own; the same conversations again
    reach the same model."""
    set_share(settings, 0.1)
    settings.KEFU_SINGLE_FLIGHT = False  # every conversation its own call, even asked at once
    ids = conversation_ids(1000)
    await conversations(ids)

    async def batch(chunk: list[uuid.UUID]) -> list[str]:
        return [record.model for _, record in await asyncio.gather(*(answer(cid) for cid in chunk))]

    models: list[str] = []
    for start in range(0, len(ids), 25):
        models += await batch(ids[start : start + 25])
    await ledger.flush()
    assert models.count("fake-candidate") == 96 and models.count("fake-simple") == 904  # 9.6%
    assert len(candidate.requests) == 96 and {r["model"] for r in candidate.requests} == {"fake-candidate"}
    assert len(remote.requests) == 904 and {r["model"] for r in remote.requests} == {"fake-simple"}
    variants = [row[1] for row in await ledger_rows()]
    assert variants.count("candidate") == 96 and variants.count("current") == 904
    # Sticky: ten of the candidate's conversations and ten of the others, asked again.
    theirs = [cid for cid, model in zip(ids, models, strict=True) if model == "fake-candidate"][:10]
    others = [cid for cid, model in zip(ids, models, strict=True) if model == "fake-simple"][:10]
    again = await batch(theirs + others)
    assert again == ["fake-candidate"] * 10 + ["fake-simple"] * 10


async def test_only_a_shoppers_answer_in_a_conversation_may_reach_the_candidate(candidate) -> None:
    cid = uuid.uuid4()
    steps = await deployments(["simple", "medium"], CallContext(conversation_id=cid))
    assert steps == [("simple", "candidate"), ("simple", "current"), ("medium", "current")]
    assert await deployments(["simple"], CallContext(conversation_id=cid, purpose="tool")) == [
        ("simple", "candidate"),
        ("simple", "current"),
    ]
    for purpose in ("rewrite", "summary", "suggestion", "audit", "judge", "gateway"):
        assert await deployments(["simple"], CallContext(conversation_id=cid, purpose=purpose)) == [
            ("simple", "current")
        ]
    assert await deployments(["simple"], CallContext()) == [("simple", "current")]  # the gateway: no conversation


# --- The candidate as a deployment of its own -------------------------------------------------------


async def test_the_candidate_answers_with_its_own_upstream_key_and_prices(faq, remote, candidate) -> None:
    cid = uuid.uuid4()
    await conversations([cid])
    candidate.push(
        Behaviour(text="Yes, it dims.", prompt_tokens=100_000, completion_tokens=20_000, cached_prompt_tokens=10_000)
    )
    opened, record = await answer(cid)
    await ledger.flush()
    assert record.text == "Yes, it dims." and record.route == "llm.simple"
    assert record.model == "fake-candidate" and record.variant == "candidate"
    # 90,000 x $1.00/M + 10,000 x $0.10/M + 20,000 x $4.00/M = $0.09 + $0.001 + $0.08
    assert record.cost_usd == Decimal("0.171000")
    assert remote.requests == [] and len(candidate.requests) == 1
    assert candidate.requests[0]["model"] == "fake-candidate"
    assert candidate.request_headers[0]["authorization"] == "Bearer candidate-key"
    assert await ledger_rows() == [("simple", "candidate", "fake-candidate", "ok", "", Decimal("0.171000"))]
    assert "canary candidate fake-candidate" in opened.reason


async def test_the_candidate_has_its_own_throttle_slots_and_breaker(settings, candidate) -> None:
    from routing.upstream import breaker, throttle
    from routing.upstream.resilience import upstream_key
    from routing.upstream.tiers import provider_for

    settings.KEFU_TIERS = {**settings.KEFU_TIERS, "simple": replace(settings.KEFU_TIERS["simple"], max_concurrency=1)}
    assert await throttle.admit("simple", tokens=1) is None
    assert await throttle.admit("simple", tokens=1, variant="candidate") is None  # a slot of its own
    refused = await throttle.admit("simple", tokens=1, variant="candidate")
    assert refused is not None and refused.reason == "concurrency"
    throttle.release("simple", "candidate")
    throttle.release("simple")
    assert throttle.in_flight("simple") == throttle.in_flight("simple", "candidate") == 0
    own = upstream_key("simple", provider_for("simple"), "fake-simple")
    theirs = upstream_key("simple", provider_for("simple", "candidate"), "fake-candidate", "candidate")
    assert theirs == (candidate.base_url, "candidate-key", "fake-candidate") and own[2] == "fake-simple"
    assert breaker.breaker_for(own) is not breaker.breaker_for(theirs)


async def test_over_the_shopper_socket_the_answer_is_stored_with_its_variant(make_client, faq, remote, candidate):
    from chat.models import Message

    candidate.push(Behaviour(text="Yes, it dims.", prompt_tokens=100_000, completion_tokens=20_000))
    shopper = await make_client()
    await shopper.hello()
    await shopper.say(PRODUCT_Q)
    end = (await shopper.until("stream.end"))[-1]
    assert end["route"] == "llm.simple" and end["model"] == "fake-candidate" and end["text"] == "Yes, it dims."
    # 100,000 x $1.00/M + 20,000 x $4.00/M
    assert end["usage"]["cost_usd"] == 0.18
    row = await database_sync_to_async(Message.objects.get)(pk=end["id"])
    assert (row.variant, row.model, row.cost_usd) == ("candidate", "fake-candidate", Decimal("0.180000"))
    await ledger.flush()
    assert await ledger_rows() == [("simple", "candidate", "fake-candidate", "ok", "", Decimal("0.180000"))]


async def test_a_candidate_failing_before_its_first_token_falls_back_to_the_tiers_own_model(
    faq, remote, candidate
) -> None:
    cid = uuid.uuid4()
    await conversations([cid])
    candidate.push(Behaviour(status=500))
    remote.push(Behaviour(text="From the simple tier.", prompt_tokens=1000, completion_tokens=200))
    _, record = await answer(cid)
    await ledger.flush()
    assert record.text == "From the simple tier." and record.model == "fake-simple" and record.variant == "current"
    # deepseek-chat list prices: 1000 x $0.28/M + 200 x $0.42/M
    assert record.cost_usd == Decimal("0.000364")
    assert len(candidate.requests) == 1  # one attempt, never retried: the tier's own model at once
    assert await ledger_rows() == [
        ("simple", "candidate", "fake-candidate", "fell_back", "server", Decimal("0")),
        ("simple", "current", "fake-simple", "ok", "", Decimal("0.000364")),
    ]


@pytest.fixture
def demo_orders(transactional_db: Any, settings: Any) -> None:
    from django.core.management import call_command

    settings.KEFU_STORE_ADAPTER = "demo"
    call_command("load_demo_orders", "--reset", verbosity=0)


ORDER_Q = "Quick one about KF-1001 (mei.chen@example.com): did the napkins go in the same box as the mugs?"
TOOL_CALL = Behaviour(
    tool_calls=[{"name": "order_status", "arguments": {"order_number": "KF-1001", "email": "[EMAIL_1]"}}]
)


async def test_a_store_tools_result_goes_back_to_the_model_that_asked_for_it(
    faq, remote, candidate, demo_orders
) -> None:
    first, second = uuid.uuid4(), uuid.uuid4()
    await conversations([first, second])
    # The candidate asks for the order, and reads its result.
    candidate.push(TOOL_CALL, Behaviour(text="Yes, one box."))
    _, record = await answer(first, ORDER_Q)
    assert record.text == "Yes, one box." and record.variant == "candidate"
    assert len(candidate.requests) == 2 and remote.requests == []
    assert candidate.requests[1]["messages"][-1]["role"] == "tool"
    # The candidate fails; the tier's own model asks for the order, and reads its result.
    candidate.push(Behaviour(status=500))
    remote.push(TOOL_CALL, Behaviour(text="Both in one box."))
    _, record = await answer(second, ORDER_Q)
    assert record.text == "Both in one box." and record.variant == "current" and record.model == "fake-simple"
    assert len(candidate.requests) == 3 and len(remote.requests) == 2
    assert remote.requests[1]["messages"][-1]["role"] == "tool"
    await ledger.flush()
    rows = await database_sync_to_async(list)(
        UpstreamCall.objects.order_by("created_at", "id").values_list("purpose", "variant", "outcome")
    )
    assert rows == [
        ("answer", "candidate", "ok"),
        ("tool", "candidate", "ok"),
        ("answer", "candidate", "fell_back"),
        ("answer", "current", "ok"),
        ("tool", "current", "ok"),
    ]


async def test_a_candidate_on_trial_is_not_cached_a_promoted_one_is(faq, remote, candidate) -> None:
    from cache_layer.models import CachedAnswer

    first, second = uuid.uuid4(), uuid.uuid4()
    await conversations([first, second])
    opened, _ = await answer(first)
    await opened.after_end()
    assert await database_sync_to_async(CachedAnswer.objects.count)() == 0
    await database_sync_to_async(canary.decide)("simple", state="promoted", by="ops")
    opened, record = await answer(second)
    await opened.after_end()
    assert record.variant == "candidate"
    assert await database_sync_to_async(CachedAnswer.objects.filter(model="fake-candidate").count)() == 1


# --- Staff's word ------------------------------------------------------------------------------------


def staff() -> User:
    user = User.objects.create_user("ops", password="pw", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="view_costs"))
    return user


async def test_a_rollback_from_the_page_takes_effect_at_once(faq, remote, candidate, async_client) -> None:
    cid = uuid.uuid4()
    await conversations([cid])
    _, before = await answer(cid)
    assert before.model == "fake-candidate"
    user = await database_sync_to_async(staff)()
    await async_client.aforce_login(user)
    response = await async_client.post("/ops/canary/simple/rollback", {"reason": "answers too long"})
    assert response.status_code == 303 and response["Location"] == "/ops/canary/"
    # The very next answer in the same conversation: the tier's own model.
    _, after = await answer(cid)
    assert after.model == "fake-simple" and after.variant == "current"
    assert len(candidate.requests) == 1 and len(remote.requests) == 1
    rows = await database_sync_to_async(list)(TierOverride.objects.values_list("tier", "state", "by", "reason"))
    assert rows == [("simple", "rolled_back", "ops", "answers too long")]


async def test_promote_gives_every_conversation_the_candidate_until_the_environment_changes(
    settings, faq, remote, candidate
) -> None:
    set_share(settings, 0.1)
    ids = conversation_ids(20)
    await conversations(ids)
    assert sum(canary.point("simple", cid) < 0.1 for cid in ids) == 3
    standing = await database_sync_to_async(canary.decide)("simple", state="promoted", by="ops", reason="better")
    assert standing.state == "promoted" and standing.share == 1.0 and standing.env_share == 0.1
    models = [record.model for _, record in [await answer(cid) for cid in ids]]
    assert models == ["fake-candidate"] * 20 and len(candidate.requests) == 20
    # A new candidate in the environment: the promotion was about the old one.
    settings.KEFU_TIERS = {
        **settings.KEFU_TIERS,
        "simple": settings.KEFU_TIERS["simple"].with_canary(model="fake-candidate-2"),
    }
    fresh = canary.status("simple")
    assert fresh is not None and fresh.state == "canary" and fresh.share == 0.1 and fresh.decided_by == ""


async def test_decisions_are_audited_and_resume_the_environments_share(settings, candidate) -> None:
    set_share(settings, 0.1)
    decide = database_sync_to_async(canary.decide)
    await decide("simple", state="promoted", by="alice", reason="p95 better")
    await decide("simple", state="rolled_back", by="bob", reason="complaints")
    resumed = await decide("simple", state="canary", by="alice", reason="fixed prompt")
    assert resumed.share == 0.1 and resumed.decided_by == "alice" and resumed.reason == "fixed prompt"
    rows = await database_sync_to_async(list)(
        TierOverride.objects.order_by("id").values_list("state", "by", "candidate_model", "reason")
    )
    assert rows == [
        ("promoted", "alice", "fake-candidate", "p95 better"),
        ("rolled_back", "bob", "fake-candidate", "complaints"),
        ("canary", "alice", "fake-candidate", "fixed prompt"),
    ]
    with pytest.raises(canary.CanaryError, match="no canary candidate"):
        await decide("medium", state="promoted", by="alice")
    with pytest.raises(canary.CanaryError, match="unknown canary state"):
        await decide("simple", state="paused", by="alice")


async def test_another_process_sees_a_decision_within_the_refresh(settings, candidate) -> None:
    """Another process has its own copy: it reads the decision once that copy is older than
    KEFU_CANARY_REFRESH_S (here: its copy is dropped, as time would)."""
    settings.KEFU_CANARY_REFRESH_S = 60.0
    assert (await canary.status_async("simple")).state == "canary"  # type: ignore[union-attr]
    await database_sync_to_async(TierOverride.objects.create)(
        tier="simple", state="rolled_back", candidate_model="fake-candidate", by="elsewhere"
    )
    assert (await canary.status_async("simple")).state == "canary"  # type: ignore[union-attr]
    canary.forget()  # the copy (and the shared cache's entry) ran out
    standing = await canary.status_async("simple")
    assert standing is not None and standing.state == "rolled_back" and standing.decided_by == "elsewhere"


# --- The automatic rollback -------------------------------------------------------------------------


async def test_the_candidate_is_rolled_back_once_its_error_rate_passes_the_threshold(
    settings, faq, remote, candidate, caplog
) -> None:
    settings.KEFU_CANARY_MIN_CALLS = 4
    settings.KEFU_CANARY_MAX_ERROR_RATE = 0.5
    candidate.default = Behaviour(status=500)
    ids = conversation_ids(6)
    await conversations(ids)
    # One success, then failures: 1 of 2 is not above 50%; 3 failures of 4 calls are.
    candidate.push(Behaviour(text="fine"))
    caplog.set_level(logging.WARNING, logger="routing.upstream.canary")
    for cid in ids[:4]:
        _, record = await answer(cid)
        await ledger.flush()  # the row, and the check after it
    assert await database_sync_to_async(TierOverride.objects.count)() == 1
    row = await database_sync_to_async(TierOverride.objects.get)()
    assert (row.tier, row.state, row.by, row.candidate_model) == ("simple", "rolled_back", "auto", "fake-candidate")
    assert row.reason == (
        "error rate 3/4 = 75.0% of the candidate's calls in the last 900 s, above 50.0% (at least 4 calls)"
    )
    assert "canary of the simple tier (fake-candidate): rolled_back by auto" in caplog.text
    # Every failure was answered by the tier's own model; from now on the candidate gets nothing.
    assert record.model == "fake-simple" and len(candidate.requests) == 4
    for cid in ids[4:]:
        _, record = await answer(cid)
        assert record.model == "fake-simple"
    await ledger.flush()
    assert len(candidate.requests) == 4 and len(remote.requests) == 5


async def test_a_staff_decision_starts_a_new_count(settings, faq, remote, candidate) -> None:
    settings.KEFU_CANARY_MIN_CALLS = 2
    settings.KEFU_CANARY_MAX_ERROR_RATE = 0.5
    candidate.default = Behaviour(status=500)
    ids = conversation_ids(3)
    await conversations(ids)
    for cid in ids[:2]:
        await answer(cid)
        await ledger.flush()
    assert [r.by for r in await database_sync_to_async(list)(TierOverride.objects.all())] == ["auto"]
    await database_sync_to_async(canary.decide)("simple", state="canary", by="ops", reason="upstream fixed")
    # One more failure: 3 of 3 in the window, but 1 call since staff's word, under the 2 needed.
    await answer(ids[2])
    await ledger.flush()
    assert len(candidate.requests) == 3
    assert (await canary.status_async("simple")).state == "canary"  # type: ignore[union-attr]


async def test_a_candidates_answer_lost_with_its_process_is_booked_to_the_candidate(
    make_client, faq, remote, candidate
) -> None:
    """The streaming row says which deployment it was sent to, so when its process dies (kill -9)
    the sweep books the lost call to the candidate, at the candidate's prices."""
    from datetime import timedelta

    from django.utils import timezone

    from chat import sweeper
    from chat.models import Message
    from routing.upstream.ledger import cost_usd

    candidate.push(Behaviour(text="Yes, it dims with the switch on its cord.", token_ms=300))
    shopper = await make_client()
    await shopper.hello()
    await shopper.say(PRODUCT_Q)
    delta = (await shopper.until("stream.delta"))[-1]
    streaming = await database_sync_to_async(Message.objects.get)(pk=delta["id"])
    assert (streaming.state, streaming.route, streaming.variant) == ("streaming", "llm.simple", "candidate")
    await shopper.until("stream.end")

    # The same row as a process killed mid-answer leaves it: streaming, its lease run out.
    @database_sync_to_async
    def killed() -> Message:
        conv = Conversation.objects.create(token_hash="k" * 64)
        question = Message.objects.create(conversation=conv, seq=1, role="shopper", text=PRODUCT_Q)
        bot = Message.objects.create(
            conversation=conv, seq=2, role="bot", route="llm.simple", variant="candidate", state="streaming"
        )
        Message.objects.filter(pk=bot.pk).update(lease_until=timezone.now() - timedelta(seconds=1))
        Conversation.objects.filter(pk=conv.pk).update(last_seq=2, answered_seq=1)
        return question

    question = await killed()
    candidate.push(Behaviour(text="Yes, it dims."))  # the question is answered again
    assert await sweeper.finish_orphaned_answers() == 1
    lost = await database_sync_to_async(UpstreamCall.objects.get)(
        conversation_id=question.conversation_id, error_code="process_died"
    )
    assert (lost.tier, lost.variant, lost.model, lost.estimated) == ("simple", "candidate", "fake-candidate", True)
    # At the candidate's prices ($1.00/M in), not the tier's ($0.28/M): the shopper had no text.
    assert lost.completion_tokens == 0
    assert lost.cost_usd == cost_usd(
        tier="simple", prompt_tokens=lost.prompt_tokens, completion_tokens=0, variant="candidate"
    )
    assert lost.cost_usd == (Decimal(lost.prompt_tokens) / 1_000_000).quantize(Decimal("0.000001"))
