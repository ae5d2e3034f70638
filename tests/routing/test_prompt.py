"""The prompt's token budget (routing/prompt/build.py): the system prompt and the new message always,
then the most recent whole turns that fit the tier's ``KEFU_<TIER>_CONTEXT_TOKENS``, never more
than ``KEFU_CONTEXT_TURNS``; the rolling summary in the system message. Tokens are counted with
the tier model's tokenizer (``count_tokens``), the same one the assertions use."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from chat import tasks as chat_tasks
from lib.tokens import count_tokens
from routing.prompt.build import MIN_MESSAGE_TOKENS, SUMMARY_HEADING, TRUNCATION_NOTE, build_messages, build_prompt
from routing.providers.openai_remote import close_clients
from routing.upstream import ledger
from routing.upstream import tokens as router_tokens

GROUNDING = [("How long does delivery take?", "Orders arrive in 2-4 business days.")]
HISTORY = [
    ("shopper", "Is the oak side table solid wood?"),
    ("bot", "Yes, it is solid oak with an oil finish."),
    ("shopper", "Does the walnut floor lamp come with a dimmer switch?"),
    ("bot", "Yes, it has an inline dimmer."),
    ("agent", "Hi, Alice here: the lamp ships with a linen shade too."),
    ("shopper", "Is the linen sofa cover machine washable?"),
    ("bot", "Yes, at 30 degrees."),
]
NEW = "Do you ship the oak side table to Norway?"
MODEL = "fake-simple"


@pytest.fixture(autouse=True)
def _tiers(settings: Any) -> None:
    settings.KEFU_TIERS = {tier: cfg.with_current(model=f"fake-{tier}") for tier, cfg in settings.KEFU_TIERS.items()}
    settings.KEFU_CONTEXT_TURNS = 5
    settings.KEFU_CONTEXT_TOKENS = {"simple": 3000, "medium": 6000, "complex": 12000}
    router_tokens.warm_tokenizer(MODEL)


def tokens(messages: list[dict[str, str]]) -> int:
    return count_tokens(messages, MODEL)


def users(messages: list[dict[str, str]]) -> list[str]:
    return [m["content"] for m in messages if m["role"] == "user"]


def base_tokens(**kw: Any) -> int:
    """The prompt without any history: system prompt (with grounding) and the new message."""
    return tokens(build_messages(grounding=GROUNDING, history=[], text=NEW, locale="en", **kw))


def test_everything_fits_the_default_budget() -> None:
    prompt = build_prompt(grounding=GROUNDING, history=HISTORY, text=NEW, locale="en")
    msgs = prompt.messages
    assert msgs[0]["role"] == "system" and "- Q: How long does delivery take?" in msgs[0]["content"]
    assert SUMMARY_HEADING not in msgs[0]["content"]
    assert [m["role"] for m in msgs[1:]] == [
        "user",
        "assistant",
        "user",
        "assistant",
        "assistant",
        "user",
        "assistant",
        "user",
    ]
    assert msgs[-1] == {"role": "user", "content": NEW}
    assert prompt.kept_turns == 3 and prompt.dropped_turns == 0 and not prompt.truncated and not prompt.estimated
    assert prompt.tokens == tokens(msgs)


def test_never_more_than_context_turns(settings: Any) -> None:
    settings.KEFU_CONTEXT_TURNS = 2
    msgs = build_messages(grounding=GROUNDING, history=HISTORY, text=NEW, locale="en")
    assert users(msgs) == [
        "Does the walnut floor lamp come with a dimmer switch?",
        "Is the linen sofa cover machine washable?",
        NEW,
    ]
    assert msgs[3]["content"].startswith("Hi, Alice here")  # an agent's message belongs to its turn


def test_budget_keeps_the_most_recent_whole_turns(settings: Any) -> None:
    last_turn = tokens(
        [
            {"role": "user", "content": "Is the linen sofa cover machine washable?"},
            {"role": "assistant", "content": "Yes, at 30 degrees."},
        ]
    ) - count_tokens([], MODEL)
    budget = base_tokens() + last_turn + 5  # room for the last turn, not the one before it
    settings.KEFU_CONTEXT_TOKENS = {"simple": budget, "medium": 6000, "complex": 12000}
    prompt = build_prompt(grounding=GROUNDING, history=HISTORY, text=NEW, locale="en")
    assert users(prompt.messages) == ["Is the linen sofa cover machine washable?", NEW]
    assert prompt.kept_turns == 1 and prompt.dropped_turns == 2
    assert tokens(prompt.messages) == prompt.tokens <= budget


def test_each_tier_has_its_own_budget(settings: Any) -> None:
    settings.KEFU_CONTEXT_TOKENS = {"simple": base_tokens() + 30, "medium": 6000, "complex": 12000}
    simple = build_messages(grounding=GROUNDING, history=HISTORY, text=NEW, locale="en", tier="simple")
    medium = build_messages(grounding=GROUNDING, history=HISTORY, text=NEW, locale="en", tier="medium")
    assert len(users(simple)) < len(users(medium)) == 4


def test_summary_goes_into_the_system_message_and_counts(settings: Any) -> None:
    summary = "The shopper asked about the oak side table (solid oak) and wants it in Norway."
    prompt = build_prompt(grounding=GROUNDING, history=HISTORY, text=NEW, locale="en", summary=summary)
    system = prompt.messages[0]["content"]
    assert system.endswith(f"{SUMMARY_HEADING} {summary}") and "- Q: How long does delivery take?" in system
    assert prompt.summary and prompt.tokens == tokens(prompt.messages)
    # the summary takes budget the oldest turn needed
    budget = tokens(build_messages(grounding=GROUNDING, history=HISTORY, text=NEW, locale="en"))
    settings.KEFU_CONTEXT_TOKENS = {"simple": budget, "medium": 6000, "complex": 12000}
    tight = build_prompt(grounding=GROUNDING, history=HISTORY, text=NEW, locale="en", summary=summary)
    assert tight.dropped_turns == 1 and tight.tokens <= budget
    assert users(tight.messages)[0] == "Does the walnut floor lamp come with a dimmer switch?"


def test_a_message_over_the_budget_is_cut_with_a_note_and_kept(settings: Any) -> None:
    long_text = "Please tell me everything about the walnut floor lamp. " * 200
    budget = base_tokens() + 100
    settings.KEFU_CONTEXT_TOKENS = {"simple": budget, "medium": 6000, "complex": 12000}
    prompt = build_prompt(grounding=GROUNDING, history=HISTORY, text=long_text, locale="en")
    last = prompt.messages[-1]
    assert prompt.truncated and last["role"] == "user" and last["content"].endswith(TRUNCATION_NOTE)
    assert long_text.startswith(last["content"][: -len(TRUNCATION_NOTE)])
    assert len(last["content"]) > 100  # as much of the message as fits, not a stub
    assert prompt.kept_turns == 0 and [m["role"] for m in prompt.messages] == ["system", "user"]
    assert tokens(prompt.messages) == prompt.tokens <= budget


def test_system_prompt_is_never_cut_and_the_message_keeps_a_minimum(settings: Any) -> None:
    settings.KEFU_CONTEXT_TOKENS = {"simple": 10, "medium": 6000, "complex": 12000}
    prompt = build_prompt(
        grounding=GROUNDING, history=HISTORY, text="Is the oak side table solid wood? " * 50, locale="en"
    )
    assert "- Q: How long does delivery take?" in prompt.messages[0]["content"]
    assert prompt.truncated and prompt.messages[-1]["content"].endswith(TRUNCATION_NOTE)
    assert count_tokens(prompt.messages[-1]["content"], MODEL) <= MIN_MESSAGE_TOKENS


@pytest.mark.asyncio
async def test_on_the_event_loop_a_cold_tokenizer_is_estimated_not_loaded(monkeypatch: Any) -> None:
    # The tokenizer's first load takes seconds: on the event loop the prompt is estimated meanwhile.
    monkeypatch.setattr(router_tokens, "_ready", set())
    monkeypatch.setattr(router_tokens, "_warming", {"o200k_base"})  # "already loading": no thread started
    prompt = build_prompt(grounding=GROUNDING, history=HISTORY, text=NEW, locale="en")
    assert prompt.estimated and prompt.kept_turns == 3 and prompt.tokens >= tokens(prompt.messages)


# --- Over /ws/chat/ with the fake upstream ----------------------------------------------------------


@pytest.fixture
async def _flushed() -> AsyncIterator[None]:
    yield
    await chat_tasks.drain()
    await ledger.flush()
    await close_clients()


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_the_remote_prompt_keeps_what_fits_the_budget(
    make_client: Any, faq: Any, remote: Any, settings: Any, _flushed: None
) -> None:
    settings.KEFU_SUMMARY_MIN_TURNS = 0  # this test is about the window only
    shopper = await make_client()
    await shopper.hello()
    questions = [
        "Is the oak side table solid wood?",
        "Is the linen sofa cover machine washable?",
        "Does the walnut floor lamp come with a dimmer switch?",
    ]
    for q in questions:
        await shopper.say(q)
        await shopper.until("stream.end")
    full = remote.requests[-1]["messages"]
    assert users(full) == questions  # within the default budget: every earlier turn
    budget = tokens(full)  # a prompt of this size, now with one more turn to fit
    settings.KEFU_CONTEXT_TOKENS = {"simple": budget, "medium": 6000, "complex": 12000}
    await shopper.say("Is the oak side table delivered assembled?")
    await shopper.until("stream.end")
    msgs = remote.requests[-1]["messages"]
    kept = users(msgs)[:-1]
    assert users(msgs)[-1] == "Is the oak side table delivered assembled?"
    assert 0 < len(kept) < len(questions) and kept == questions[len(questions) - len(kept) :]  # the newest turns
    assert tokens(msgs) <= budget


# --- What a FAQ / cache / shared answer saved (routing.upstream.ledger.saved_usd) ------------------------------


def test_saved_usd_prices_the_answer_at_the_tier_that_would_have_answered(settings) -> None:
    from decimal import Decimal

    # The simple tier names deepseek-chat at its list prices (the default is the preference list's
    # choice, routing/upstream/catalog.py).
    settings.KEFU_TIERS = {
        **settings.KEFU_TIERS,
        "simple": settings.KEFU_TIERS["simple"].with_current(
            model="deepseek-chat",
            price_input_per_mtok=0.28,
            price_cached_input_per_mtok=0.028,
            price_output_per_mtok=0.42,
        ),
    }

    answer = "Yes, it has an inline dimmer."
    completion = count_tokens(answer, MODEL)
    # simple (deepseek-chat list prices): 376 x $0.28/M + completion x $0.42/M
    expected = (Decimal(376) * Decimal("0.28") + Decimal(completion) * Decimal("0.42")) / Decimal(1_000_000)
    assert ledger.saved_usd(tier="simple", answer_text=answer) == expected.quantize(Decimal("0.000001"))
    assert ledger.saved_usd(tier="simple", answer_text=answer, prompt_tokens=1000) == ledger.cost_usd(
        tier="simple", prompt_tokens=1000, completion_tokens=completion
    )
    # the same answer would have cost more at the complex tier (gpt-4.1: $2 / $8 per M)
    assert ledger.saved_usd(tier="complex", answer_text=answer) == ledger.cost_usd(
        tier="complex",
        prompt_tokens=ledger.TYPICAL_PROMPT_TOKENS,
        completion_tokens=count_tokens(answer, "fake-complex"),
    )
    assert ledger.saved_usd(tier="complex", answer_text=answer) > ledger.saved_usd(tier="simple", answer_text=answer)
