"""The gateway with the official ``openai`` SDK as the client, against kefu served by Daphne
(``live_kefu``), whose tiers call the project's OpenAI-compatible test server (``fake_openai``).

The ledger is read from the live server's SQLite file; its rows are written in the background
just after each answer, so ``ledger_rows`` waits until the expected number is there.
"""

from __future__ import annotations

import sqlite3
import time
from typing import Any

import openai
import pytest

from routing.gateway.completions import hash_key, new_key
from tests.fake_openai import Behaviour

QUESTION_FOR_TOOLS = [
    {"role": "system", "content": "You write one-line product blurbs."},
    {"role": "user", "content": "A walnut floor lamp with a dimmer."},
]


def _db_path(kefu: Any) -> str:
    return kefu.env["DATABASE_URL"].removeprefix("sqlite:///")


def issue_key(kefu: Any, name: str = "blurb writer", active: bool = True) -> tuple[int, str]:
    """A gateway key in the live server's database (what the admin does), and the key itself."""
    raw = new_key()
    with sqlite3.connect(_db_path(kefu)) as db:
        cursor = db.execute(
            "INSERT INTO routing_apikey (name, prefix, key_hash, active, created_at) VALUES (?, ?, ?, ?, datetime('now'))",
            (name, raw[:12], hash_key(raw), active),
        )
        return int(cursor.lastrowid or 0), raw


def ledger_rows(kefu: Any, expected: int) -> list[dict[str, Any]]:
    """The live server's ledger, oldest first, once it holds ``expected`` rows (at most ~10 s)."""
    deadline = time.monotonic() + 10
    while True:
        with sqlite3.connect(_db_path(kefu)) as db:
            db.row_factory = sqlite3.Row
            found = [dict(r) for r in db.execute("SELECT * FROM routing_upstreamcall ORDER BY id")]
        if len(found) >= expected or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


@pytest.fixture
def kefu(live_kefu, fake_openai):
    return live_kefu(
        env={
            "OPENAI_API_KEY": "upstream-key",
            "OPENAI_BASE_URL": fake_openai.base_url,
            "KEFU_SIMPLE_MODEL": "fake-simple",
            # A model the price table does not know is priced as set (DeepSeek V3.2's list prices).
            "KEFU_SIMPLE_PRICE_INPUT": "0.28",
            "KEFU_SIMPLE_PRICE_CACHED_INPUT": "0.028",
            "KEFU_SIMPLE_PRICE_OUTPUT": "0.42",
            "KEFU_MEDIUM_MODEL": "fake-medium",
            "KEFU_COMPLEX_MODEL": "fake-complex",
            "KEFU_LLM_FIRST_TOKEN_TIMEOUT_S": "3",
            "KEFU_LLM_RETRY_CAP_S": "0.2",
        }
    )


def client(kefu: Any, key: str) -> openai.OpenAI:
    # max_retries=0: the test decides what is sent; kefu does the retrying upstream.
    return openai.OpenAI(base_url=kefu.base + "/v1", api_key=key, max_retries=0, timeout=30)


def test_the_sdk_gets_answers_streamed_and_not_and_the_ledger_names_the_key(kefu, fake_openai):
    key_id, key = issue_key(kefu)
    sdk = client(kefu, key)

    # Not streamed: the client's own prompt goes to the simple tier as given.
    fake_openai.push(Behaviour(text="Warm walnut light, dimmed to taste.", prompt_tokens=1000, completion_tokens=200))
    raw = sdk.chat.completions.with_raw_response.create(model="kefu", messages=QUESTION_FOR_TOOLS, max_tokens=60)
    completion = raw.parse()
    assert raw.headers["x-kefu-route"] == "llm.simple"
    assert completion.choices[0].message.content == "Warm walnut light, dimmed to taste."
    assert completion.model == "fake-simple" and completion.choices[0].finish_reason == "stop"
    assert completion.usage is not None and (completion.usage.prompt_tokens, completion.usage.completion_tokens) == (
        1000,
        200,
    )
    assert fake_openai.requests[0]["messages"] == QUESTION_FOR_TOOLS

    # Streamed, with usage, while the simple tier fails: the medium tier answers.
    fake_openai.push(
        Behaviour(status=500),
        Behaviour(status=500),
        Behaviour(text="Walnut glow, your way.", prompt_tokens=40, completion_tokens=6),
    )
    chunks = list(
        sdk.chat.completions.create(
            model="kefu", messages=QUESTION_FOR_TOOLS, stream=True, stream_options={"include_usage": True}
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "Walnut glow, your way."
    assert {c.model for c in chunks} == {"fake-medium"}
    assert chunks[-1].choices == [] and chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 6

    rows = ledger_rows(kefu, 4)
    assert [(r["tier"], r["outcome"], r["http_status"]) for r in rows] == [
        ("simple", "ok", None),
        ("simple", "retried", 500),
        ("simple", "fell_back", 500),
        ("medium", "ok", None),
    ]
    assert {r["api_key_id"] for r in rows} == {key_id} and {r["conversation_id"] for r in rows} == {None}
    # deepseek-chat list prices: 1000 x $0.28/M + 200 x $0.42/M = $0.000364
    assert str(rows[0]["cost_usd"]) == "0.000364"


def test_a_bare_store_question_is_answered_by_the_faq_model_without_a_remote_call(kefu, fake_openai):
    _, key = issue_key(kefu)
    sdk = client(kefu, key)
    raw = sdk.chat.completions.with_raw_response.create(
        model="kefu", messages=[{"role": "user", "content": "How long does delivery take?"}]
    )
    completion = raw.parse()
    assert raw.headers["x-kefu-route"] == "faq" and completion.model == "kefu-faq"
    assert completion.choices[0].message.content.startswith("Orders ship within 1 business day")
    assert completion.usage is not None and completion.usage.total_tokens == 0
    stream = sdk.chat.completions.create(
        model="kefu", messages=[{"role": "user", "content": "How long does delivery take?"}], stream=True
    )
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices).startswith("Orders ship within")
    assert fake_openai.requests == []


def test_a_stream_cut_after_its_first_token_raises_in_the_sdk_and_is_a_failed_row(kefu, fake_openai):
    _, key = issue_key(kefu)
    fake_openai.push(Behaviour(text="one two three four five", drop_after_chunks=2))
    received: list[str] = []
    with pytest.raises(openai.APIError, match="broke off"):
        for chunk in client(kefu, key).chat.completions.create(model="kefu", messages=QUESTION_FOR_TOOLS, stream=True):
            if chunk.choices and chunk.choices[0].delta.content:
                received.append(chunk.choices[0].delta.content)
    assert "".join(received) == "one two "
    [row] = ledger_rows(kefu, 1)
    assert (row["outcome"], row["error_code"], row["estimated"]) == ("failed", "connection", 1)


def test_bad_keys_and_bad_bodies_are_sdk_errors(kefu, fake_openai):
    _, key = issue_key(kefu)
    _, revoked = issue_key(kefu, name="old", active=False)
    for wrong in ("kefu_wrong", revoked):
        with pytest.raises(openai.AuthenticationError) as caught:
            client(kefu, wrong).chat.completions.create(model="kefu", messages=QUESTION_FOR_TOOLS)
        assert caught.value.code == "invalid_api_key"
    with pytest.raises(openai.BadRequestError) as bad:
        client(kefu, key).chat.completions.create(model="kefu", messages=[])
    assert bad.value.param == "messages"
    with pytest.raises(openai.BadRequestError):
        client(kefu, key).chat.completions.create(
            model="kefu", messages=[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
        )
    assert fake_openai.requests == []
