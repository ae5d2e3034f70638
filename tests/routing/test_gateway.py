"""The gateway's HTTP edge in process (Django's async test client): keys, methods and bodies
refused with OpenAI-style errors, and the wire format of answers. The official ``openai`` SDK
against a live server is in test_gateway_live.py."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from channels.db import database_sync_to_async
from django.test import AsyncClient

from routing.gateway.completions import api_key_issue, hash_key
from routing.models import ApiKey, UpstreamCall
from routing.providers import ratelimits
from routing.providers.openai_remote import close_clients
from routing.upstream import breaker, ledger, throttle
from tests.fake_openai import Behaviour

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

URL = "/v1/chat/completions"
GOOD = {
    "model": "kefu",
    "messages": [{"role": "system", "content": "Answer in one line."}, {"role": "user", "content": "Name a colour."}],
}


@pytest.fixture(autouse=True)
async def _clean() -> AsyncIterator[None]:
    breaker.reset_breakers()
    ratelimits.book.clear()
    throttle.reset()
    yield
    await ledger.flush()
    await close_clients()


@pytest.fixture
async def key() -> tuple[int, str]:
    row, raw = await database_sync_to_async(api_key_issue)(name="order-status bot")
    return row.pk, raw


async def post(body: Any, *, raw: str | None = None, content: bytes | None = None) -> Any:
    headers = {"Authorization": f"Bearer {raw}"} if raw is not None else {}
    data = content if content is not None else json.dumps(body).encode()
    return await AsyncClient().post(URL, data=data, content_type="application/json", headers=headers)


async def test_key_is_stored_hashed_and_shown_once(key):
    key_id, raw = key
    row = await database_sync_to_async(ApiKey.objects.get)(pk=key_id)
    assert raw.startswith("kefu_") and len(raw) == 48
    assert row.key_hash == hash_key(raw) and raw not in (row.key_hash, row.prefix) and raw.startswith(row.prefix)


async def test_missing_wrong_and_revoked_keys_get_401(key):
    key_id, raw = key
    for headers_key in (None, "kefu_not-a-real-key", raw + "x"):
        response = await post(GOOD, raw=headers_key)
        assert response.status_code == 401
        assert response.json()["error"]["code"] == "invalid_api_key"
        assert response["WWW-Authenticate"].startswith("Bearer")
    await database_sync_to_async(ApiKey.objects.filter(pk=key_id).update)(active=False)
    assert (await post(GOOD, raw=raw)).status_code == 401


async def test_get_is_405(key):
    response = await AsyncClient().get(URL, headers={"Authorization": f"Bearer {key[1]}"})
    assert response.status_code == 405 and response.json()["error"]["code"] == "method_not_allowed"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (b"{not json", None),
        (b"[1, 2]", None),
        (b"[" * 100_000 + b"]" * 100_000, None),  # deeper than the JSON decoder goes: a 400, not a 500
        ({"messages": [{"role": "user", "content": "hi"}]}, "model"),
        ({"model": "kefu", "messages": []}, "messages"),
        ({"model": "kefu", "messages": [{"role": "wizard", "content": "hi"}]}, "messages[0].role"),
        (
            {
                "model": "kefu",
                "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
            },
            "messages[0].content",
        ),
        (
            {"model": "kefu", "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]},
            "messages",
        ),
        ({"model": "kefu", "messages": [{"role": "user", "content": "   "}]}, "messages"),
        ({**GOOD, "stream": "yes"}, "stream"),
        ({**GOOD, "n": 2}, "n"),
        ({**GOOD, "tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
        ({**GOOD, "max_tokens": 0}, "max_tokens"),
        ({**GOOD, "temperature": 3}, "temperature"),
    ],
)
async def test_bad_bodies_get_400_naming_the_field(key, remote, body, param):
    response = await post(None, raw=key[1], content=body) if isinstance(body, bytes) else await post(body, raw=key[1])
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param and error["message"]
    assert remote.requests == []  # nothing reached an upstream


async def test_oversized_body_gets_413(key, settings):
    settings.KEFU_GATEWAY_MAX_BODY_BYTES = 100
    response = await post({**GOOD, "messages": [{"role": "user", "content": "x" * 200}]}, raw=key[1])
    assert response.status_code == 413


async def test_no_configured_tier_gets_503(key, settings):
    settings.KEFU_TIERS = {tier: cfg.with_current(api_key="") for tier, cfg in settings.KEFU_TIERS.items()}
    response = await post(GOOD, raw=key[1])
    assert response.status_code == 503 and response.json()["error"]["code"] == "no_model"


async def test_answer_passes_the_clients_prompt_through_and_is_a_ledger_row_with_the_key(key, remote):
    remote.push(Behaviour(text="Teal.", prompt_tokens=1000, completion_tokens=200))
    response = await post({**GOOD, "max_tokens": 50, "temperature": 0.1}, raw=key[1])
    assert response.status_code == 200 and response["x-kefu-route"] == "llm.simple"
    body = response.json()
    assert body["object"] == "chat.completion" and body["model"] == "fake-simple"
    assert body["choices"][0]["message"] == {"role": "assistant", "content": "Teal.", "refusal": None}
    assert body["usage"]["prompt_tokens"] == 1000 and body["usage"]["total_tokens"] == 1200
    assert body["kefu"] == {"route": "llm.simple", "cost_usd": 0.000364, "estimated": False}
    sent = remote.requests[0]
    assert sent["messages"] == GOOD["messages"] and sent["max_tokens"] == 50 and sent["temperature"] == 0.1
    await ledger.flush()
    [row] = await database_sync_to_async(
        lambda: list(UpstreamCall.objects.values("outcome", "api_key_id", "conversation_id", "purpose"))
    )()
    assert row == {"outcome": "ok", "api_key_id": key[0], "conversation_id": None, "purpose": "gateway"}
    last_used = await database_sync_to_async(lambda: ApiKey.objects.get(pk=key[0]).last_used_at)()
    assert last_used is not None


async def test_model_naming_a_tier_starts_there(key, remote):
    response = await post({**GOOD, "model": "complex"}, raw=key[1])
    assert response.status_code == 200 and response.json()["model"] == "fake-complex"


async def test_every_tier_failing_before_text_is_503(key, remote):
    remote.push(*[Behaviour(status=500)] * 6)
    response = await post(GOOD, raw=key[1])
    assert response.status_code == 503 and response.json()["error"]["code"] == "upstream_unavailable"


async def test_every_tier_rate_limited_is_429(key, remote, settings):
    settings.KEFU_LLM_RETRIES = 0
    remote.push(*[Behaviour(status=429)] * 3)
    response = await post(GOOD, raw=key[1])
    assert response.status_code == 429 and response.json()["error"]["type"] == "rate_limit_error"


async def test_stream_is_server_sent_chunks_with_usage_and_done(key, remote):
    remote.push(Behaviour(text="Deep teal blue.", prompt_tokens=30, completion_tokens=4))
    response = await post({**GOOD, "stream": True, "stream_options": {"include_usage": True}}, raw=key[1])
    assert response.status_code == 200 and response["Content-Type"].startswith("text/event-stream")
    raw = b"".join([part async for part in response.streaming_content]).decode()
    events = [line.removeprefix("data: ") for line in raw.split("\n\n") if line]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"]) == "Deep teal blue."
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop" and chunks[-2]["kefu"]["route"] == "llm.simple"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 4


async def test_a_bare_question_is_cached_only_when_the_client_left_the_parameters_to_kefu(key, remote, faq):
    # An answer made to the client's own max_tokens / temperature is made to its measure: never
    # stored for shoppers. The same question with kefu's defaults is.
    from cache_layer.models import CachedAnswer

    question = "Does the walnut floor lamp come with a dimmer switch?"
    remote.push(Behaviour(text="Yes, an inline dimmer!!"), Behaviour(text="Yes, an inline dimmer."))
    body = {"model": "kefu", "messages": [{"role": "user", "content": question}]}

    hot = await post({**body, "temperature": 1.8}, raw=key[1])
    assert hot.status_code == 200 and hot.json()["choices"][0]["message"]["content"] == "Yes, an inline dimmer!!"
    assert await database_sync_to_async(CachedAnswer.objects.count)() == 0

    plain = await post(body, raw=key[1])
    assert plain.status_code == 200
    stored = await database_sync_to_async(lambda: list(CachedAnswer.objects.values_list("answer", flat=True)))()
    assert stored == ["Yes, an inline dimmer."]


async def test_a_bare_question_gets_kefus_output_limit_and_one_with_its_own_never_a_cached_answer(
    key, remote, faq, settings
):
    # Issue 29 item 6: cached answers are made within kefu's output limit (KEFU_LLM_MAX_TOKENS, in
    # their scope). A bare question left to kefu is asked within it, and stored; one that sets its
    # own max_tokens gets an answer made to that limit, not the cached one.
    from cache_layer.models import CachedAnswer

    settings.KEFU_LLM_MAX_TOKENS = 600
    question = "Does the walnut floor lamp come with a dimmer switch?"
    remote.push(Behaviour(text="Yes, an inline dimmer."), Behaviour(text="Yes."))
    body = {"model": "kefu", "messages": [{"role": "user", "content": question}]}

    plain = await post(body, raw=key[1])
    assert plain.status_code == 200 and plain["x-kefu-route"] == "llm.simple"
    assert remote.requests[-1]["max_tokens"] == 600  # not the gateway's 4096
    stored = await database_sync_to_async(lambda: list(CachedAnswer.objects.values_list("answer", flat=True)))()
    assert stored == ["Yes, an inline dimmer."]
    cached = await post(body, raw=key[1])
    assert cached["x-kefu-route"] == "cache.exact" and cached.json()["choices"][0]["message"]["content"] == stored[0]

    short = await post({**body, "max_tokens": 50}, raw=key[1])
    assert short.status_code == 200 and short["x-kefu-route"] == "llm.simple"
    assert short.json()["choices"][0]["message"]["content"] == "Yes."
    assert [r["max_tokens"] for r in remote.requests] == [600, 50]


async def test_a_gateway_answer_stopped_by_the_token_limit_is_not_cached(key, remote, faq):
    from cache_layer.models import CachedAnswer

    remote.push(Behaviour(text="The lamp has a dimmer and", finish_reason="length"))
    body = {"model": "kefu", "messages": [{"role": "user", "content": "Does the walnut floor lamp have a dimmer?"}]}
    answer = await post(body, raw=key[1])
    assert answer.status_code == 200 and answer.json()["choices"][0]["finish_reason"] == "length"
    assert await database_sync_to_async(CachedAnswer.objects.count)() == 0
