"""HTTP: the storefront page (widget embedded under a strict CSP) and /healthz."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.django_db(transaction=True)


def test_storefront_embeds_widget_with_one_script_tag_and_strict_csp(client):
    r = client.get("/")
    assert r.status_code == 200
    html = r.content.decode()
    assert html.count("<script") == 1 and 'src="/static/kefu/widget.js"' in html
    assert "script-src 'self'" in r["Content-Security-Policy"] and "unsafe-inline" not in r["Content-Security-Policy"]
    assert '<html lang="en"' in html


def test_storefront_in_chinese(client):
    assert '<html lang="zh"' in client.get("/?lang=zh").content.decode()


def test_widget_is_served_at_its_stable_path(client):
    r = client.get("/static/kefu/widget.js")
    assert r.status_code == 200
    assert b"/ws/chat/" in b"".join(r.streaming_content) if hasattr(r, "streaming_content") else r.content


def test_healthz_is_503_until_the_faq_model_is_loaded_then_200(client, faq):
    r = client.get("/healthz")
    assert r.status_code == 200
    assert r.json() == {
        "status": "ok",
        "database": "ok",
        "channel_layer": "ok",
        "cache": "ok",
        "faq_model": "ok",
        "router": "ok",
        # The remote tiers' standing, a detail that never makes /healthz 503 (issue 28): no key here.
        "tiers": {
            tier: f"not configured: no API key (KEFU_{tier.upper()}_API_KEY or OPENAI_API_KEY)"
            for tier in ("simple", "medium", "complex")
        },
    }
    faq.model = None
    r = client.get("/healthz")
    assert r.status_code == 503 and r.json()["faq_model"] == "loading" and r.json()["status"] == "unavailable"


def test_healthz_is_503_while_the_router_warms_up(client, faq, monkeypatch):
    from routing import warmup

    monkeypatch.setattr(warmup, "_state", "loading")
    r = client.get("/healthz")
    assert r.status_code == 503 and r.json()["router"] == "loading" and r.json()["faq_model"] == "ok"
    monkeypatch.setattr(warmup, "_state", "error: ImportError: no module named openai")
    r = client.get("/healthz")
    assert r.status_code == 503 and r.json()["router"] == "error: ImportError: no module named openai"
    monkeypatch.setattr(warmup, "_state", "ok")
    assert client.get("/healthz").status_code == 200
