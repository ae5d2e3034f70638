"""Plans are frozen (issue 27, item 3): the router's ``Decision`` and the upstream ``Call`` never
change after they were made; where a call ended (a fallback, the canary's candidate) comes back
as values, the stream's ``Answered`` items and the new ``Call`` the canary returns.

The fallback test runs the real ``openai`` client against the project's test upstream
(tests/fake_openai.py)."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

from routing.decide.decision import Decision
from routing.providers.base import ChatRequest, StreamDone, TextDelta
from routing.providers.openai_remote import close_clients
from routing.types import CallContext
from routing.upstream import canary, ledger
from routing.upstream.call import Answered, Call
from routing.upstream.resilience import stream_with_fallback
from routing.upstream.tiers import provider_for
from tests.fake_openai import Behaviour

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

MESSAGES = [
    {"role": "system", "content": "You are the store's helpful assistant."},
    {"role": "user", "content": "Does the walnut floor lamp come with a dimmer switch?"},
]
CONVERSATION = uuid.uuid5(uuid.NAMESPACE_URL, "https://kefu.test/conversation/frozen")


@pytest.fixture(autouse=True)
def _fresh_guards(routing_guards: None) -> None:
    """Clean breakers, rate-limit book and tier limiters around each test (tests/conftest.py)."""


@pytest.fixture(autouse=True)
async def _close_clients() -> AsyncIterator[None]:
    yield
    await close_clients()


def simple_call(**fields: Any) -> Call:
    return Call(
        tier="simple",
        provider=provider_for("simple"),
        request=ChatRequest(messages=list(MESSAGES), model="fake-simple", max_tokens=100),
        **fields,
    )


def remote_decision() -> Decision:
    return Decision(
        route="llm.simple",
        locale="en",
        tier="simple",
        provider=provider_for("simple"),
        request=ChatRequest(messages=list(MESSAGES), model="fake-simple", max_tokens=100),
        reason="remote model",
        cache_scope="en:v1:simple",
    )


async def test_a_decision_a_call_and_an_answer_refuse_assignment(remote: Any) -> None:
    decision = remote_decision()
    call = decision.call(CallContext(conversation_id=CONVERSATION))
    answered = Answered(tier="medium", variant="current", request=call.request, provider=provider_for("medium"))

    with pytest.raises(dataclasses.FrozenInstanceError):
        decision.tier = "medium"  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        call.tier = "medium"  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        answered.tier = "complex"  # type: ignore[misc]
    assert (call.tier, call.variant, call.route, call.context.conversation_id) == (
        "simple",
        "current",
        "llm.simple",
        CONVERSATION,
    )


async def test_a_fallback_comes_back_as_a_value_and_leaves_the_call_as_planned(remote: Any, settings: Any) -> None:
    settings.KEFU_LLM_FIRST_TOKEN_TIMEOUT_S = 10.0  # a loaded machine must not add a timeout
    remote.push(Behaviour(status=500), Behaviour(status=500), Behaviour(text="It has a dimmer."))
    call = simple_call()
    items = [item async for item in stream_with_fallback(call)]
    await ledger.flush()

    [answered] = [item for item in items if isinstance(item, Answered)]
    assert (answered.tier, answered.route, answered.variant, answered.model) == (
        "medium",
        "llm.medium",
        "current",
        "fake-medium",
    )
    # The Answered item comes before the attempt's first item, the end after the text.
    assert isinstance(items[0], Answered) and isinstance(items[1], TextDelta) and isinstance(items[-1], StreamDone)
    # The plan given to the stream still says simple.
    assert (call.tier, call.route, call.variant, call.request.model) == (
        "simple",
        "llm.simple",
        "current",
        "fake-simple",
    )

    decision = remote_decision()
    ended = decision.answered_by(answered)
    assert (ended.tier, ended.route, ended.request) == ("medium", "llm.medium", answered.request)
    assert (decision.tier, decision.route, decision.request.model if decision.request else None) == (
        "simple",
        "llm.simple",
        "fake-simple",
    )


async def test_a_canary_assignment_is_a_new_call_and_the_old_one_is_unchanged(remote: Any, settings: Any) -> None:
    tiers = dict(settings.KEFU_TIERS)
    tiers["simple"] = tiers["simple"].with_canary(model="fake-candidate", share=1.0)
    settings.KEFU_TIERS = tiers
    call = simple_call(context=CallContext(conversation_id=CONVERSATION))

    sent = await canary.assign(call, conversation_id=CONVERSATION)

    assert sent is not call
    assert (sent.tier, sent.variant, sent.request.model, sent.trial) == ("simple", "candidate", "fake-candidate", True)
    assert (call.variant, call.request.model, call.trial) == ("current", "fake-simple", False)
    assert await canary.assign(call, conversation_id=None) is call  # no conversation: no candidate

    decision = remote_decision()
    moved = decision.sent_to(sent)
    assert (moved.variant, moved.request, moved.trial, moved.shareable) == ("candidate", sent.request, True, False)
    assert moved.reason == "remote model, canary candidate fake-candidate"
    assert (decision.variant, decision.trial, decision.shareable, decision.reason) == (
        "current",
        False,
        True,
        "remote model",
    )
    assert decision.sent_to(decision.call(CallContext())) is decision  # the same deployment: nothing new
