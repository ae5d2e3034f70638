"""Upstream connections: kept while idle, kept warm, HTTP/2 where the upstream offers it.

Real `openai` client, real sockets: the plain-HTTP test server (tests/fake_openai.py) and a TLS
server that speaks HTTP/2 and HTTP/1.1 (tests/tls_upstream.py). Each server records the client
port of every request, so "the same port" means "the same TCP connection": no new handshake.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator, Callable, Iterator

import pytest
import pytest_asyncio

from routing.providers.base import ChatRequest, ProviderConfig, StreamDone, TextDelta
from routing.providers.openai_remote import OpenAIProvider, close_clients, get_client, keep_warm
from tests.fake_openai import FakeOpenAI, running_fake_openai
from tests.tls_upstream import TlsUpstream, running_tls_upstream

API_KEY = "sk-test-kefu"
COMPLETIONS, MODELS = "/v1/chat/completions", "/v1/models"


@pytest.fixture(scope="module")
def fake_openai_server() -> Iterator[FakeOpenAI]:
    with running_fake_openai() as server:
        yield server


@pytest.fixture
def fake_openai(fake_openai_server: FakeOpenAI) -> FakeOpenAI:
    fake_openai_server.reset()
    return fake_openai_server


@pytest.fixture(scope="module")
def tls_upstream() -> Iterator[TlsUpstream]:
    with running_tls_upstream(chunks=5, gap_ms=5) as server:
        yield server


@pytest.fixture
def trusted_tls(tls_upstream: TlsUpstream, monkeypatch: pytest.MonkeyPatch) -> TlsUpstream:
    """The TLS server, its CA trusted by clients made from now on (``SSL_CERT_FILE``, which the
    HTTP client reads as it builds its TLS context), with no recorded requests."""
    monkeypatch.setenv("SSL_CERT_FILE", tls_upstream.ca_file)
    tls_upstream.requests.clear()
    return tls_upstream


@pytest_asyncio.fixture(autouse=True)
async def _close_clients() -> AsyncIterator[None]:
    yield
    await close_clients()


def config_for(base_url: str, **overrides: object) -> ProviderConfig:
    values: dict[str, object] = {"connect_timeout_s": 2, "first_token_timeout_s": 5, "total_timeout_s": 10}
    values.update(overrides)
    return ProviderConfig(base_url=base_url, api_key=API_KEY, **values)  # type: ignore[arg-type]


async def answer(config: ProviderConfig, text: str = "Hi") -> str:
    request = ChatRequest(messages=[{"role": "user", "content": text}], model="gpt-4o-mini")
    texts: list[str] = []
    async for item in OpenAIProvider(config).stream(request):
        if isinstance(item, TextDelta):
            texts.append(item.text)
        else:
            assert isinstance(item, StreamDone) and item.finish_reason == "stop"
    return "".join(texts)


async def wait_until(condition: Callable[[], bool], what: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


def ports(server: FakeOpenAI, path: str) -> list[int]:
    return [port for p, port in server.peers if p == path]


def pool_idle(config: ProviderConfig) -> bool:
    """True when `config`'s client holds exactly one connection and no request is on it (httpx's
    transport and httpcore's pool: no public accessor exists)."""
    pool = get_client(config)._client._transport._pool  # type: ignore[attr-defined]
    connections = list(pool.connections)
    return len(connections) == 1 and connections[0].is_idle()


# ------------------------------------------------------------------------- keep-alive


async def test_an_idle_connection_is_reused_within_keepalive_s(fake_openai: FakeOpenAI) -> None:
    config = config_for(fake_openai.base_url, keepalive_s=30)

    assert await answer(config, "first") == "Echo: first"
    await asyncio.sleep(0.3)  # idle, well within keepalive_s
    assert await answer(config, "second") == "Echo: second"

    first, second = ports(fake_openai, COMPLETIONS)
    assert first == second


async def test_a_connection_idle_longer_than_keepalive_s_is_replaced(fake_openai: FakeOpenAI) -> None:
    config = config_for(fake_openai.base_url, keepalive_s=0.05)

    assert await answer(config, "first") == "Echo: first"
    await asyncio.sleep(0.3)  # idle six times keepalive_s
    assert await answer(config, "second") == "Echo: second"

    first, second = ports(fake_openai, COMPLETIONS)
    assert first != second


# ------------------------------------------------------------------------- keep-warm


async def test_keep_warm_connects_at_once_and_the_first_answer_uses_that_connection(fake_openai: FakeOpenAI) -> None:
    config = config_for(fake_openai.base_url, keepalive_s=30)
    task = asyncio.create_task(keep_warm([config], every_s=30))
    try:
        await wait_until(lambda: len(ports(fake_openai, MODELS)) == 1, "the keep-warm request")
        assert await answer(config) == "Echo: Hi"
    finally:
        task.cancel()

    assert ports(fake_openai, COMPLETIONS) == ports(fake_openai, MODELS)
    assert fake_openai.requests[-1]["messages"][-1]["content"] == "Hi"


async def test_keep_warm_pings_an_idle_upstream_again_and_not_one_in_use(fake_openai: FakeOpenAI) -> None:
    config = config_for(fake_openai.base_url, keepalive_s=30)
    task = asyncio.create_task(keep_warm([config], every_s=0.4))
    try:
        await wait_until(lambda: len(ports(fake_openai, MODELS)) >= 3, "three keep-warm requests")
        # A call that starts while a ping is still on the wire opens a second connection, and
        # rightly so (a shopper never waits for a ping): start right after a ping came back.
        await wait_until(lambda: pool_idle(config), "the last keep-warm answer")
        # Calls every 0.1 s keep the upstream busy: no ping while they run.
        pings = len(ports(fake_openai, MODELS))
        started = time.monotonic()
        while time.monotonic() - started < 1.2:
            assert await answer(config) == "Echo: Hi"
            await asyncio.sleep(0.1)
        pinged_while_busy = len(ports(fake_openai, MODELS)) - pings
    finally:
        task.cancel()

    assert pinged_while_busy <= 1  # at most one that was already due as the calls began
    assert len(set(ports(fake_openai, MODELS) + ports(fake_openai, COMPLETIONS))) == 1


async def test_keep_warm_carries_on_past_an_upstream_that_is_down(fake_openai: FakeOpenAI) -> None:
    with socket.socket() as s:  # a port with nothing listening
        s.bind(("127.0.0.1", 0))
        dead_port = s.getsockname()[1]
    down = config_for(f"http://127.0.0.1:{dead_port}/v1", connect_timeout_s=0.5)
    up = config_for(fake_openai.base_url, keepalive_s=30)
    no_key = ProviderConfig(base_url=fake_openai.base_url, api_key="")
    task = asyncio.create_task(keep_warm([down, no_key, up], every_s=0.2))
    try:
        await wait_until(lambda: len(ports(fake_openai, MODELS)) >= 2, "keep-warm requests to the live upstream")
        assert not task.done()
    finally:
        task.cancel()
    assert len(set(ports(fake_openai, MODELS))) == 1


# ------------------------------------------------------------------------- HTTP/2


async def test_http2_carries_concurrent_streams_on_one_connection(trusted_tls: TlsUpstream) -> None:
    config = config_for(trusted_tls.base_url, http2=True, keepalive_s=30)

    texts = await asyncio.gather(*(answer(config) for _ in range(8)))

    assert texts == ["tok0 tok1 tok2 tok3 tok4 "] * 8
    assert trusted_tls.versions() == {"2"}
    assert trusted_tls.connections(COMPLETIONS) == 1


async def test_without_http2_each_concurrent_stream_takes_a_connection(trusted_tls: TlsUpstream) -> None:
    config = config_for(trusted_tls.base_url, http2=False, keepalive_s=30)

    texts = await asyncio.gather(*(answer(config) for _ in range(8)))

    assert texts == ["tok0 tok1 tok2 tok3 tok4 "] * 8
    assert trusted_tls.versions() == {"1.1"}
    assert trusted_tls.connections(COMPLETIONS) == 8


async def test_http2_on_a_plain_http_upstream_speaks_http_1_1(fake_openai: FakeOpenAI) -> None:
    # HTTP/2 is negotiated in the TLS handshake; a plain-HTTP upstream (a local model server)
    # is served as before.
    config = config_for(fake_openai.base_url, http2=True)
    assert await answer(config, "plain") == "Echo: plain"


# ------------------------------------------------------------------------- the server's wiring


@pytest.mark.django_db(transaction=True)
async def test_a_socket_connecting_keeps_the_tiers_upstream_warm(make_client, remote, settings) -> None:
    import routing.providers.openai_remote  # noqa: F401  (the server's warm-up imports it, in a thread)
    from routing.upstream import tiers

    settings.KEFU_UPSTREAM_KEEPWARM_S = 30
    before = len(remote.peers)  # the remote fixture's model check (routing.upstream.listing)
    await make_client()
    await make_client()  # idempotent: one task per event loop
    try:
        await wait_until(lambda: MODELS in {p for p, _ in remote.peers[before:]}, "the keep-warm request")
    finally:
        task = tiers._keep_warm_tasks.pop(asyncio.get_running_loop())
        task.cancel()
    # Every tier points at the one test upstream with one key: one connection kept, one request.
    assert [p for p, _ in remote.peers[before:]] == [MODELS]
