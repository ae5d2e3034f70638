"""The remote-model provider, with the real `openai` client against the fake upstream.

Nothing is mocked: `OpenAIProvider` talks HTTP to `tests/fake_openai.py`, which each test
scripts with `Behaviour`s. Timing tests use wide margins (a 3 s delay against a 0.3 s
timeout) so they do not flake on a loaded machine.
"""

from __future__ import annotations

import asyncio
import email.utils
import socket
import time
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta

import pytest
import pytest_asyncio

from lib.tokens import count_tokens, encoding_name_for_model
from routing.providers.base import (
    ChatRequest,
    ProviderConfig,
    ProviderError,
    StreamDone,
    TextDelta,
    Usage,
)
from routing.providers.openai_remote import (
    OpenAIProvider,
    close_clients,
    get_client,
)
from tests.fake_openai import Behaviour, FakeOpenAI, running_fake_openai

MODEL = "gpt-4o-mini"
API_KEY = "sk-test-kefu"
SHOPPER_QUESTION = "Where is my order #1042?"


@pytest.fixture(scope="module")
def fake_openai_server() -> Iterator[FakeOpenAI]:
    with running_fake_openai() as server:
        yield server


@pytest.fixture
def fake_openai(fake_openai_server: FakeOpenAI) -> FakeOpenAI:
    """The module's server with an empty script and no recorded requests."""
    fake_openai_server.reset()
    return fake_openai_server


@pytest_asyncio.fixture(autouse=True)
async def _close_clients() -> AsyncIterator[None]:
    # Each test runs on its own event loop; close that loop's clients so no connection
    # outlives it.
    yield
    await close_clients()


def make_config(server: FakeOpenAI, **overrides: float) -> ProviderConfig:
    values: dict[str, float] = {
        "connect_timeout_s": 2,
        "first_token_timeout_s": 5,
        "total_timeout_s": 10,
    }
    values.update(overrides)
    return ProviderConfig(base_url=server.base_url, api_key=API_KEY, **values)


def shopper_request(text: str = SHOPPER_QUESTION, **kwargs: object) -> ChatRequest:
    return ChatRequest(
        messages=[
            {"role": "system", "content": "You are the store's helpful assistant."},
            {"role": "user", "content": text},
        ],
        model=str(kwargs.pop("model", MODEL)),
        **kwargs,  # type: ignore[arg-type]
    )


async def collect(
    provider: OpenAIProvider, request: ChatRequest
) -> tuple[list[str], StreamDone | None, ProviderError | None]:
    """Run a stream to its end: (texts yielded, the StreamDone or None, the error or None)."""
    texts: list[str] = []
    done: StreamDone | None = None
    try:
        async for item in provider.stream(request):
            if isinstance(item, TextDelta):
                assert done is None, "no text may follow StreamDone"
                texts.append(item.text)
            else:
                assert done is None, "exactly one StreamDone"
                done = item
    except ProviderError as error:
        return texts, done, error
    return texts, done, None


# ------------------------------------------------------------------------- happy path


async def test_chunks_become_text_deltas_that_join_to_the_answer(fake_openai: FakeOpenAI) -> None:
    answer = "Your order #1042 left our warehouse today and arrives within 2 days."
    fake_openai.push(Behaviour(text=answer))

    texts, done, error = await collect(OpenAIProvider(make_config(fake_openai)), shopper_request())

    assert error is None
    assert len(texts) > 5  # streamed word by word, not in one piece
    assert all(texts)  # never an empty delta (the role chunk carries "")
    assert "".join(texts) == answer
    assert done is not None
    assert done.finish_reason == "stop"
    assert done.model == MODEL
    assert done.ttft_ms is not None and 0 < done.ttft_ms <= done.latency_ms


async def test_default_answer_echoes_the_shopper_and_keeps_unicode(fake_openai: FakeOpenAI) -> None:
    question = "我的订单什么时候到？"
    fake_openai.push(Behaviour(chunks=4))

    texts, done, error = await collect(OpenAIProvider(make_config(fake_openai)), shopper_request(question))

    assert error is None and done is not None
    assert len(texts) == 4
    assert "".join(texts) == f"Echo: {question}"


async def test_usage_comes_from_the_usage_chunk(fake_openai: FakeOpenAI) -> None:
    fake_openai.push(Behaviour(prompt_tokens=42, completion_tokens=7, cached_prompt_tokens=16))

    _, done, error = await collect(OpenAIProvider(make_config(fake_openai)), shopper_request())

    assert error is None and done is not None
    assert done.usage == Usage(prompt_tokens=42, completion_tokens=7, cached_prompt_tokens=16, estimated=False)


async def test_without_usage_tokens_are_counted_and_marked_estimated(
    fake_openai: FakeOpenAI,
) -> None:
    answer = "You can return any item within 30 days."
    fake_openai.push(Behaviour(text=answer, include_usage=False))
    request = shopper_request()

    _, done, error = await collect(OpenAIProvider(make_config(fake_openai)), request)

    assert error is None and done is not None
    assert done.usage.estimated is True
    assert done.usage.prompt_tokens == count_tokens(request.messages, MODEL) > 0
    assert done.usage.completion_tokens == count_tokens(answer, MODEL) > 0
    assert done.usage.cached_prompt_tokens == 0


async def test_the_upstream_gets_the_model_messages_and_options(fake_openai: FakeOpenAI) -> None:
    request = shopper_request(max_tokens=300, temperature=0.2)

    _, _, error = await collect(OpenAIProvider(make_config(fake_openai)), request)

    assert error is None
    [body] = fake_openai.requests
    assert body["model"] == MODEL
    assert body["messages"] == request.messages
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert body["max_tokens"] == 300
    assert "max_completion_tokens" not in body
    assert body["temperature"] == 0.2
    [headers] = fake_openai.request_headers
    assert headers["authorization"] == f"Bearer {API_KEY}"


async def test_unset_options_are_not_sent(fake_openai: FakeOpenAI) -> None:
    _, _, error = await collect(OpenAIProvider(make_config(fake_openai)), shopper_request())

    assert error is None
    [body] = fake_openai.requests
    assert "max_tokens" not in body and "temperature" not in body


async def test_reasoning_models_get_max_completion_tokens(fake_openai: FakeOpenAI) -> None:
    request = shopper_request(model="o4-mini", max_tokens=500)

    _, done, error = await collect(OpenAIProvider(make_config(fake_openai)), request)

    assert error is None and done is not None
    [body] = fake_openai.requests
    assert body["max_completion_tokens"] == 500
    assert "max_tokens" not in body
    assert done.model == "o4-mini"


async def test_done_reports_the_model_the_upstream_names(fake_openai: FakeOpenAI) -> None:
    fake_openai.push(Behaviour(model="gpt-4o-mini-2024-07-18"))

    _, done, _ = await collect(OpenAIProvider(make_config(fake_openai)), shopper_request())

    assert done is not None and done.model == "gpt-4o-mini-2024-07-18"


async def test_ttft_measures_the_wait_for_the_first_token(fake_openai: FakeOpenAI) -> None:
    fake_openai.push(Behaviour(ttft_ms=250))

    _, done, error = await collect(OpenAIProvider(make_config(fake_openai)), shopper_request())

    assert error is None and done is not None
    assert done.ttft_ms is not None and done.ttft_ms >= 250
    assert done.latency_ms >= done.ttft_ms


async def test_a_consumer_may_stop_early_and_the_client_keeps_working(
    fake_openai: FakeOpenAI,
) -> None:
    fake_openai.push(Behaviour(text="one two three four five", token_ms=200))
    provider = OpenAIProvider(make_config(fake_openai))

    stream = provider.stream(shopper_request())
    first = await anext(stream)
    await stream.aclose()  # the shopper left

    assert first == TextDelta("one ")
    texts, done, error = await collect(provider, shopper_request("Hi"))
    assert error is None and done is not None
    assert "".join(texts) == "Echo: Hi"


# ------------------------------------------------------------------------- errors


async def test_429_is_rate_limited_transient_with_retry_after(fake_openai: FakeOpenAI) -> None:
    fake_openai.push(Behaviour(status=429, retry_after=7))

    texts, done, error = await collect(OpenAIProvider(make_config(fake_openai)), shopper_request())

    assert texts == [] and done is None
    assert error is not None
    assert error.code == "rate_limited"
    assert error.status == 429
    assert error.retry_after_s == 7
    assert error.permanent is False
    assert error.after_first_token is False
    assert len(fake_openai.requests) == 1  # the SDK did not retry on its own


async def test_retry_after_may_be_an_http_date(fake_openai: FakeOpenAI) -> None:
    when = datetime.now(UTC) + timedelta(seconds=30)
    fake_openai.push(Behaviour(status=429, retry_after=email.utils.format_datetime(when, usegmt=True)))

    _, _, error = await collect(OpenAIProvider(make_config(fake_openai)), shopper_request())

    assert error is not None and error.retry_after_s is not None
    assert 20 < error.retry_after_s <= 31


@pytest.mark.parametrize("status", [500, 502, 503])
async def test_5xx_is_a_transient_server_error(fake_openai: FakeOpenAI, status: int) -> None:
    fake_openai.push(Behaviour(status=status, retry_after=2 if status == 503 else None))

    texts, _, error = await collect(OpenAIProvider(make_config(fake_openai)), shopper_request())

    assert texts == []
    assert error is not None
    assert (error.code, error.status, error.permanent) == ("server", status, False)
    assert error.retry_after_s == (2 if status == 503 else None)
    assert error.after_first_token is False
    assert len(fake_openai.requests) == 1


async def test_401_is_a_permanent_auth_error(fake_openai: FakeOpenAI) -> None:
    fake_openai.push(Behaviour(status=401))

    _, _, error = await collect(OpenAIProvider(make_config(fake_openai)), shopper_request())

    assert error is not None
    assert (error.code, error.status, error.permanent) == ("auth", 401, True)


async def test_a_wrong_key_is_a_permanent_auth_error() -> None:
    with running_fake_openai(api_key="sk-the-right-one") as server:
        _, _, error = await collect(OpenAIProvider(make_config(server)), shopper_request())
        assert server.request_headers[0]["authorization"] == f"Bearer {API_KEY}"

    assert error is not None
    assert (error.code, error.status, error.permanent) == ("auth", 401, True)


@pytest.mark.parametrize("status", [400, 404, 422])
async def test_rejected_requests_are_permanent(fake_openai: FakeOpenAI, status: int) -> None:
    fake_openai.push(Behaviour(status=status))

    _, _, error = await collect(OpenAIProvider(make_config(fake_openai)), shopper_request())

    assert error is not None
    assert (error.code, error.status, error.permanent) == ("bad_request", status, True)


async def test_an_empty_api_key_fails_before_any_request(fake_openai: FakeOpenAI) -> None:
    config = ProviderConfig(base_url=fake_openai.base_url, api_key="")

    _, _, error = await collect(OpenAIProvider(config), shopper_request())

    assert error is not None
    assert (error.code, error.permanent) == ("auth", True)
    assert fake_openai.requests == []


async def test_slow_first_token_times_out(fake_openai: FakeOpenAI) -> None:
    fake_openai.push(Behaviour(ttft_ms=3000))
    config = make_config(fake_openai, first_token_timeout_s=0.3)

    started = time.perf_counter()
    texts, done, error = await collect(OpenAIProvider(config), shopper_request())
    elapsed_s = time.perf_counter() - started

    assert texts == [] and done is None
    assert error is not None
    assert (error.code, error.permanent, error.after_first_token) == ("timeout", False, False)
    assert elapsed_s < 2.5  # gave up at the deadline, did not wait for the 3 s token


async def test_a_stalled_stream_hits_the_total_timeout_after_the_first_token(
    fake_openai: FakeOpenAI,
) -> None:
    fake_openai.push(Behaviour(chunks=["Hello ", "there"], token_ms=5000))
    # 1.5 s leaves the first token time to arrive on a loaded machine; the second comes at 5 s.
    config = make_config(fake_openai, first_token_timeout_s=8, total_timeout_s=1.5)

    texts, done, error = await collect(OpenAIProvider(config), shopper_request())

    assert texts == ["Hello "] and done is None
    assert error is not None
    assert (error.code, error.permanent, error.after_first_token) == ("timeout", False, True)


@pytest.mark.parametrize(
    "behaviour",
    [Behaviour(drop_before_first_token=True), Behaviour(drop_after_chunks=0)],
    ids=["before-headers", "after-headers"],
)
async def test_a_drop_before_the_first_token_is_a_connection_error(
    fake_openai: FakeOpenAI, behaviour: Behaviour
) -> None:
    fake_openai.push(behaviour)

    texts, done, error = await collect(OpenAIProvider(make_config(fake_openai)), shopper_request())

    assert texts == [] and done is None
    assert error is not None
    assert (error.code, error.permanent, error.after_first_token) == ("connection", False, False)
    assert len(fake_openai.requests) == 1


async def test_a_drop_mid_stream_keeps_the_text_already_yielded(fake_openai: FakeOpenAI) -> None:
    fake_openai.push(Behaviour(chunks=["Your ", "parcel ", "is ", "on ", "its ", "way."], drop_after_chunks=3))

    texts, done, error = await collect(OpenAIProvider(make_config(fake_openai)), shopper_request())

    assert "".join(texts) == "Your parcel is "
    assert done is None
    assert error is not None
    assert (error.code, error.permanent, error.after_first_token) == ("connection", False, True)


async def test_nothing_listening_is_a_connection_error() -> None:
    with socket.socket() as probe:  # a port that was free a moment ago: nobody listens there
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    config = ProviderConfig(base_url=f"http://127.0.0.1:{port}/v1", api_key=API_KEY)

    _, _, error = await collect(OpenAIProvider(config), shopper_request())

    assert error is not None
    assert (error.code, error.permanent, error.after_first_token) == ("connection", False, False)


@pytest.mark.parametrize("after", [0, 2])
async def test_a_malformed_chunk_is_a_malformed_error(fake_openai: FakeOpenAI, after: int) -> None:
    fake_openai.push(Behaviour(chunks=["a ", "b ", "c"], malformed_after_chunks=after))

    texts, done, error = await collect(OpenAIProvider(make_config(fake_openai)), shopper_request())

    assert texts == ["a ", "b ", "c"][:after] and done is None
    assert error is not None
    assert error.code == "malformed"
    assert error.after_first_token is (after > 0)


async def test_an_error_event_mid_stream_is_a_transient_server_error(
    fake_openai: FakeOpenAI,
) -> None:
    fake_openai.push(Behaviour(chunks=["a ", "b ", "c"], error_event_after_chunks=1))

    texts, _, error = await collect(OpenAIProvider(make_config(fake_openai)), shopper_request())

    assert texts == ["a "]
    assert error is not None
    assert (error.code, error.permanent, error.after_first_token) == ("server", False, True)


async def test_a_stream_without_finish_reason_counts_as_cut(fake_openai: FakeOpenAI) -> None:
    # A proxy that ends the body cleanly mid-answer looks like this; storing the text as a
    # complete answer would be wrong.
    fake_openai.push(Behaviour(text="Half an", finish_reason=None, include_usage=False))

    texts, done, error = await collect(OpenAIProvider(make_config(fake_openai)), shopper_request())

    assert "".join(texts) == "Half an" and done is None
    assert error is not None
    assert (error.code, error.after_first_token) == ("connection", True)


# ------------------------------------------------------------------------- clients


async def test_one_client_per_upstream_is_reused_across_calls(fake_openai: FakeOpenAI) -> None:
    config = make_config(fake_openai)
    same_upstream_other_timeouts = make_config(fake_openai, total_timeout_s=3)
    other_key = ProviderConfig(base_url=fake_openai.base_url, api_key="sk-other")

    client = get_client(config)
    for text in ("first", "second"):
        texts, _, error = await collect(OpenAIProvider(config), shopper_request(text))
        assert error is None and "".join(texts) == f"Echo: {text}"

    assert get_client(config) is client
    assert get_client(same_upstream_other_timeouts) is client
    assert get_client(other_key) is not client
    assert client.max_retries == 0


def test_each_event_loop_gets_its_own_client(fake_openai: FakeOpenAI) -> None:
    # The SDK's connection pool cannot outlive its loop ("Event loop is closed"), so a new
    # loop (a Celery task's asyncio.run) must get a new client, and it must work.
    config = make_config(fake_openai)

    async def one_answer() -> tuple[object, str]:
        texts, _, error = await collect(OpenAIProvider(config), shopper_request("Hi"))
        assert error is None
        client = get_client(config)
        await close_clients()
        return client, "".join(texts)

    first_client, first_text = asyncio.run(one_answer())
    second_client, second_text = asyncio.run(one_answer())

    assert first_text == second_text == "Echo: Hi"
    assert first_client is not second_client


async def test_the_fake_also_serves_models_and_non_streamed_answers(
    fake_openai: FakeOpenAI,
) -> None:
    # The benchmarks and manual runs use these endpoints through the same SDK.
    client = get_client(make_config(fake_openai))

    models = await client.models.list()
    completion = await client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hello"}])

    assert MODEL in [model.id for model in models.data]
    assert completion.choices[0].message.content == "Echo: Hello"
    assert completion.usage is not None and completion.usage.prompt_tokens == 1


# ------------------------------------------------------------------------- token counting


def test_encoding_follows_the_model_family() -> None:
    assert encoding_name_for_model("gpt-4o-mini") == "o200k_base"
    assert encoding_name_for_model("gpt-4.1") == "o200k_base"
    assert encoding_name_for_model("o3-mini") == "o200k_base"
    assert encoding_name_for_model("some-local-model") == "o200k_base"
    assert encoding_name_for_model("gpt-4") == "cl100k_base"
    assert encoding_name_for_model("gpt-4-turbo") == "cl100k_base"
    assert encoding_name_for_model("gpt-3.5-turbo") == "cl100k_base"
    assert encoding_name_for_model("openai/gpt-3.5-turbo") == "cl100k_base"


def test_count_tokens_of_text_and_of_messages() -> None:
    assert count_tokens("Hello world", "gpt-4o") == 2
    assert count_tokens("", "gpt-4o") == 0
    # OpenAI cookbook arithmetic: 3 per message + role + content, + 3 to prime the reply.
    assert count_tokens([{"role": "user", "content": "Hello world"}], "gpt-4") == 3 + 1 + 2 + 3
    parts = [{"role": "user", "content": [{"type": "text", "text": "Hello world"}]}]
    assert count_tokens(parts, "gpt-4") == 9
    # Text that looks like a special token is counted, not rejected.
    assert count_tokens("<|endoftext|>", "gpt-4o") > 1
