"""The start-up warm-up (routing.warmup): what the first message would pay is paid at start-up,
and /healthz can tell (tests/chat/test_http.py checks the 503)."""

from __future__ import annotations

from typing import Any

import pytest

from lib.tokens import encoding_name_for_model
from routing import warmup
from routing.upstream import tokens


@pytest.fixture
def fresh_warmup(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(warmup, "_thread", None)
    monkeypatch.setattr(warmup, "_state", "not started")


@pytest.mark.django_db
def test_warm_up_loads_each_configured_tiers_tokenizer_and_reports_ok(
    remote: Any, settings: Any, fresh_warmup: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = settings.KEFU_TIERS["simple"].current.model
    monkeypatch.setattr(tokens, "_ready", set())
    assert warmup.status() == "ok"  # never started: everything loads lazily
    warmup.start()
    assert warmup.status() in ("loading", "ok")
    assert warmup.wait(120) == "ok"
    assert encoding_name_for_model(model) in tokens._ready


def test_a_failed_warm_up_is_reported_with_its_error(fresh_warmup: None, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []

    def boom() -> None:
        calls.append(1)
        raise RuntimeError("tokenizer tables missing")

    monkeypatch.setattr(warmup, "warm", boom)
    monkeypatch.setattr(warmup, "RETRY_DELAYS_S", (0.01, 0.01))
    warmup.start()
    assert warmup.wait(30) == "error: RuntimeError: tokenizer tables missing"
    assert len(calls) == 3  # tried again after each pause, then reported


def test_a_warm_up_that_fails_once_is_tried_again_and_reports_ok(
    fresh_warmup: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []

    def flaky() -> None:
        calls.append(1)
        if len(calls) == 1:
            raise TimeoutError("GET /models timed out")

    monkeypatch.setattr(warmup, "warm", flaky)
    monkeypatch.setattr(warmup, "RETRY_DELAYS_S", (0.01, 0.01))
    warmup.start()
    assert warmup.wait(30) == "ok"
    assert len(calls) == 2
