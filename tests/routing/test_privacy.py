"""Personal data masked before upstream calls (routing/prompt/privacy.py): what is found, placeholders
that go back, and a chat whose phone number reaches the upstream masked and the shopper unmasked."""

from __future__ import annotations

import pytest

from routing.prompt.privacy import StreamUnmasker, Vault, find_personal_data, mask_messages
from tests.fake_openai import Behaviour


def kinds(text: str) -> list[tuple[str, str]]:
    return [(s.kind, text[s.start : s.end]) for s in find_personal_data(text)]


@pytest.mark.parametrize(
    ("text", "found"),
    [
        ("write to alice.wong@example.com please", [("EMAIL", "alice.wong@example.com")]),
        ("我的手机号是13800138000", [("PHONE", "13800138000")]),
        ("call me on +86 138 0013 8000", [("PHONE", "+86 138 0013 8000")]),
        ("or +44 20 7946 0958 in London", [("PHONE", "+44 20 7946 0958")]),
        ("my number is +1 (555) 123-4567", [("PHONE", "+1 (555) 123-4567")]),  # fictional, masked all the same
        ("手机15410965605", [("PHONE", "15410965605")]),  # an unallocated prefix, shaped like a mobile
        ("the card 4111 1111 1111 1111 was declined", [("CARD", "4111 1111 1111 1111")]),
        ("身份证号11010519491231002X", [("ID", "11010519491231002X")]),
        ("ship it to 221B Baker Street today", [("ADDRESS", "221B Baker Street")]),
        ("请送到南京路100号", [("ADDRESS", "南京路100号")]),
    ],
)
def test_personal_data_is_found(text: str, found: list[tuple[str, str]]) -> None:
    assert kinds(text) == found


@pytest.mark.parametrize(
    "text",
    [
        "Where is my order 48213377?",  # an order number is what the model needs to hear
        "4111 1111 1111 1112 is not a card (Luhn)",
        "11010519491231002Y fails the ID check",
        "Do you ship the walnut floor lamp to Canada?",
        "Is the 2024 model 30% off until 12.31?",
    ],
)
def test_what_is_not_personal_data_stays(text: str) -> None:
    assert find_personal_data(text) == []


def test_the_same_value_gets_the_same_placeholder_and_comes_back() -> None:
    vault = Vault()
    first = vault.mask("My number is 13800138000, mail a@b.com")
    second = vault.mask("again: 13800138000, or 13900139000")
    assert first == "My number is [PHONE_1], mail [EMAIL_1]"
    assert second == "again: [PHONE_1], or [PHONE_2]"
    assert vault.unmask("I will call [PHONE_2], not [PHONE_1]; [PHONE_9] is unknown") == (
        "I will call 13900139000, not 13800138000; [PHONE_9] is unknown"
    )
    assert vault.value_of("[EMAIL_1]") == "a@b.com" and vault.value_of("[EMAIL_2]") is None


def test_a_placeholder_split_across_pieces_is_put_back_whole() -> None:
    vault = Vault()
    vault.mask("13800138000 and a@b.com")
    unmasker = StreamUnmasker(vault)
    pieces = ["We will call [", "PHO", "NE_1] and write to [EMAIL", "_1]", ". Brackets [like this] pass, and a [tail"]
    out = [unmasker.feed(p) for p in pieces]
    assert "".join(out) + unmasker.end() == (
        "We will call 13800138000 and write to a@b.com. Brackets [like this] pass, and a [tail"
    )
    assert out[0] == "We will call " and out[2] == "13800138000 and write to "  # held only while ambiguous


def test_system_messages_are_the_stores_own_and_are_not_masked() -> None:
    vault = Vault()
    messages = mask_messages(
        [
            {"role": "system", "content": "Our hotline is 400 820 8820."},
            {"role": "user", "content": "Call me on 13800138000"},
        ],
        vault,
    )
    assert messages == [
        {"role": "system", "content": "Our hotline is 400 820 8820."},
        {"role": "user", "content": "Call me on [PHONE_1]"},
    ]


@pytest.mark.django_db(transaction=True)
async def test_a_phone_number_reaches_the_upstream_masked_and_the_shopper_unmasked(make_client, faq, remote):
    # The test upstream echoes the last user message ("Echo: ..."), placeholder included, in
    # word-sized chunks: the shopper must read their own number back.
    shopper = await make_client()
    await shopper.hello()
    await shopper.say("Please call me about the walnut floor lamp on 138 0013 8000 or mail alice@example.com")
    frames = await shopper.until("stream.end")

    sent = remote.requests[-1]["messages"][-1]["content"]
    assert sent == "Please call me about the walnut floor lamp on [PHONE_1] or mail [EMAIL_1]"
    streamed = "".join(f["text"] for f in frames if f["type"] == "stream.delta")
    expected = "Echo: Please call me about the walnut floor lamp on 138 0013 8000 or mail alice@example.com"
    assert streamed == frames[-1]["text"] == expected
    assert all("[PHONE" not in f.get("text", "") for f in frames)


@pytest.mark.django_db(transaction=True)
async def test_earlier_turns_are_masked_too_with_the_same_placeholders(make_client, faq, remote):
    remote.push(Behaviour(text="Noted: we will call [PHONE_1]."), Behaviour(text="Yes, still [PHONE_1]."))
    shopper = await make_client()
    await shopper.hello()
    await shopper.say("My number for the walnut lamp delivery is 13800138000")
    first = (await shopper.until("stream.end"))[-1]
    await shopper.say("Will the courier of the oak side table call 13800138000 too?")
    second = (await shopper.until("stream.end"))[-1]

    assert first["text"] == "Noted: we will call 13800138000."
    assert second["text"] == "Yes, still 13800138000."
    upstream = remote.requests[-1]["messages"]
    everything = " ".join(m["content"] for m in upstream if m["role"] != "system")
    assert "13800138000" not in everything and everything.count("[PHONE_1]") >= 3


@pytest.mark.django_db(transaction=True)
async def test_a_store_can_turn_masking_off(make_client, faq, remote, settings):
    settings.KEFU_MASK_PERSONAL_DATA = False
    shopper = await make_client()
    await shopper.hello()
    await shopper.say("Please call me about the walnut floor lamp on 13800138000")
    await shopper.until("stream.end")
    assert remote.requests[-1]["messages"][-1]["content"].endswith("on 13800138000")
