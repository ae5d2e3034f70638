"""Gaps are seen and mended (issue: faults): shopper deltas carry ``pos``; a socket that missed a
stream's frames in the layer is mended from the stream buffer by its consumer; and a ``resync``
frame replays every stored message after a seq again (docs/protocol.md, resync)."""

from __future__ import annotations

import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from channels.layers import get_channel_layer

from chat import events, streams

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from fake_openai import Behaviour

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

PRODUCT_Q = "Does the walnut floor lamp come with a dimmer switch?"
SHIPPING = "Orders ship within 1 business day and arrive in 2-4 business days."


def assert_positions(frames: list[dict[str, Any]]) -> None:
    """The answer came in more than one delta, each ``pos`` the code points before it, and the
    deltas add up to its ``stream.end`` text."""
    deltas = [f for f in frames if f["type"] == "stream.delta"]
    assert len(deltas) > 1
    pos = 0
    for d in deltas:
        assert d["pos"] == pos
        pos += len(d["text"])
    assert "".join(d["text"] for d in deltas) == frames[-1]["text"] and pos == len(frames[-1]["text"])


async def test_deltas_carry_their_position_and_a_resync_replays_everything_after_a_seq(make_client, faq):
    shopper = await make_client()
    await shopper.hello()
    await shopper.say("how long does delivery take?")
    first = await shopper.until("stream.end")
    assert_positions(first)
    await shopper.say("is apple pay accepted")
    await shopper.until("stream.end")

    await shopper.send({"type": "resync", "after": 1})
    replay = [await shopper.recv() for _ in range(3)]
    assert [(f["type"], f["seq"], f["role"]) for f in replay] == [
        ("message", 2, "bot"),
        ("message", 3, "shopper"),
        ("message", 4, "bot"),
    ]
    assert replay[0]["text"].startswith(SHIPPING)

    await shopper.send({"type": "resync", "after": 1})
    error = await shopper.recv()
    assert error["type"] == "error" and error["code"] == "rate_limited"
    await shopper.send({"type": "resync", "after": "x"})
    error = await shopper.recv()
    assert error["type"] == "error" and error["code"] == "invalid"
    assert await shopper.comm.receive_nothing(timeout=0.3)  # nothing else was sent


async def test_remote_deltas_carry_the_code_points_before_them(make_client, faq, remote):
    remote.push(Behaviour(text="Yes, the walnut lamp has an inline dimmer and a 2 m cable."))
    shopper = await make_client()
    await shopper.hello()
    await shopper.say(PRODUCT_Q)
    frames = await shopper.until("stream.end")
    assert_positions(frames)
    assert frames[-1]["text"] == "Yes, the walnut lamp has an inline dimmer and a 2 m cable."


async def test_a_socket_that_missed_deltas_in_the_layer_is_mended_from_the_buffer(make_client, faq):
    """The layer lost the first delta (and, for a second answer, the stream.start): the next
    delta's pos shows it, and the consumer sends what is missing from the stream buffer first."""
    shopper = await make_client()
    await shopper.hello()
    cid = shopper.conversation
    layer = get_channel_layer()
    group = events.conversation_group(cid)

    async def delta(message_id: int, text: str, pos: int) -> None:
        await layer.group_send(
            group,
            {
                "type": "chat.frame",
                "frame": {"type": "stream.delta", "id": message_id, "text": text},
                "conversation": cid,
                "pos": pos,
            },
        )

    await streams.begin(message_id=901, seq=2, route="faq")
    await streams.append(message_id=901, text="Hello world", conversation_id=uuid.UUID(cid), epoch=0)
    await layer.group_send(
        group,
        {
            "type": "chat.frame",
            "frame": {"type": "stream.start", "id": 901, "seq": 2, "role": "bot", "route": "faq"},
            "conversation": cid,
        },
    )
    await delta(901, "world", 6)  # "Hello " (pos 0) never arrived
    frames = [await shopper.recv() for _ in range(3)]
    assert frames == [
        {"type": "stream.start", "id": 901, "seq": 2, "role": "bot", "route": "faq"},
        {"type": "stream.delta", "id": 901, "text": "Hello ", "pos": 0},
        {"type": "stream.delta", "id": 901, "text": "world", "pos": 6},
    ]

    await streams.begin(message_id=902, seq=3, route="faq")
    await streams.append(message_id=902, text="Bonjour tout", conversation_id=uuid.UUID(cid), epoch=0)
    await delta(902, " tout", 7)  # its stream.start and first delta never arrived
    frames = [await shopper.recv() for _ in range(3)]
    assert frames == [
        {"type": "stream.start", "id": 902, "seq": 3, "role": "bot", "route": "faq"},
        {"type": "stream.delta", "id": 902, "text": "Bonjour", "pos": 0},
        {"type": "stream.delta", "id": 902, "text": " tout", "pos": 7},
    ]
    await streams.end(901)
    await streams.end(902)


async def test_a_resync_sends_an_answer_that_ended_as_finished(make_client, faq, settings: Any):
    """The socket missed an answer's stream.end: the resync's replay sends it as a finished message."""
    shopper = await make_client()
    await shopper.hello()
    await shopper.say("is apple pay accepted")
    await shopper.until("stream.end")
    await shopper.send({"type": "resync", "after": 1})
    frame = await shopper.recv()
    assert (frame["type"], frame["seq"], frame["text"]) == (
        "message",
        2,
        "We accept Visa, Mastercard, PayPal and Apple Pay.",
    )
