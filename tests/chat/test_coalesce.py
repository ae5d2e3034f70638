"""Remote answers' deltas (chat.answering.coalesced): each piece alone while the sender keeps up,
the pieces that arrived meanwhile joined into one delta when it falls behind, the text intact,
an upstream error raised after the text before it, and nothing left running when the stream is
closed early."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import aclosing

import pytest

from chat.answering import coalesced

pytestmark = pytest.mark.asyncio

PIECES = [f"p{i} " for i in range(12)]


async def test_a_sender_that_keeps_up_sends_every_piece_alone():
    sent = asyncio.Event()

    async def upstream() -> AsyncIterator[str]:
        for piece in PIECES:
            yield piece
            await sent.wait()  # the next piece comes only after this one went out
            sent.clear()

    deltas = []
    async with aclosing(coalesced(upstream())) as merged:
        async for delta in merged:
            deltas.append(delta)
            sent.set()
    assert deltas == PIECES


async def test_a_sender_that_falls_behind_sends_what_arrived_meanwhile_as_one_delta():
    async def upstream() -> AsyncIterator[str]:
        for piece in PIECES:
            yield piece
            await asyncio.sleep(0)  # a piece every loop iteration

    deltas = []
    async with aclosing(coalesced(upstream())) as merged:
        async for delta in merged:
            deltas.append(delta)
            for _ in range(4):  # sending one delta takes longer than a piece takes to come
                await asyncio.sleep(0)
    assert "".join(deltas) == "".join(PIECES)
    assert deltas[0] == "p0 "  # the first piece is never held back
    assert 1 < len(deltas) < len(PIECES) // 2


async def test_an_upstream_error_comes_after_the_text_before_it():
    class Broke(Exception):
        pass

    async def upstream() -> AsyncIterator[str]:
        yield "Our lamps "
        yield "are made "
        raise Broke("connection dropped")

    got = []
    with pytest.raises(Broke, match="connection dropped"):
        async with aclosing(coalesced(upstream())) as merged:
            async for delta in merged:
                got.append(delta)
    assert "".join(got) == "Our lamps are made "


async def test_closing_early_stops_the_reader_and_the_upstream():
    closed = asyncio.Event()
    reading = asyncio.Event()

    async def upstream() -> AsyncIterator[str]:
        try:
            yield "first "
            reading.set()
            await asyncio.Event().wait()  # a model that never sends more
            yield "never"
        finally:
            closed.set()

    source = upstream()
    async with aclosing(source), aclosing(coalesced(source)) as merged:
        async for delta in merged:
            assert delta == "first "
            await reading.wait()
            break  # the shopper left, or a fence broke
    assert closed.is_set()
    assert not [t for t in asyncio.all_tasks() if t is not asyncio.current_task() and not t.done()]
