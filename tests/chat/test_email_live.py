"""The outside check of e-mail (CONTRACT.md, "E-mail"), on a live Daphne with ``EMAIL_URL=filemail:///DIR``:
a shopper leaves an address, closes the tab, an agent replies, and the e-mail appears in DIR,
with a resume link that opens the conversation once. Short burst and offline windows keep it
quick; the defaults (40 s, 30 s) are the same code with longer waits."""

from __future__ import annotations

import asyncio
import json
import re
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import websockets

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_takeover_across_workers import agent_cookie, recv

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

pytestmark = pytest.mark.asyncio


def post(url: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


async def until_type(ws: Any, kind: str) -> dict[str, Any]:
    while (frame := await recv(ws))["type"] != kind:
        pass
    return frame


async def test_the_reply_to_a_shopper_who_closed_the_tab_lands_in_the_mail_directory(live_kefu, tmp_path, chromium):
    from playwright.async_api import async_playwright, expect

    outbox = tmp_path / "mail"
    env = {
        "EMAIL_URL": f"filemail://{outbox}",
        "KEFU_EMAIL_FROM": "Shop <help@shop.example>",
        "KEFU_EMAIL_BURST_S": "1",
        "KEFU_EMAIL_OFFLINE_S": "1",
        "KEFU_AGENT_SWEEP_S": "0.5",
    }
    kefu = live_kefu(env=env)
    cookie = agent_cookie(kefu.env)
    async with websockets.connect(
        kefu.ws.replace("/ws/chat/", "/ws/agent/"),
        origin=kefu.base,
        additional_headers={"Cookie": f"sessionid={cookie}"},
    ) as console:
        async with websockets.connect(kefu.ws, origin=kefu.base) as shopper:
            await shopper.send(json.dumps({"type": "hello", "locale": "en"}))
            conv = await recv(shopper)
            await shopper.send(json.dumps({"type": "message", "client_id": "q1", "text": "I want to talk to a person"}))
            await until_type(shopper, "status")
            await shopper.send(json.dumps({"type": "contact", "email": "ada@example.com"}))
            await until_type(shopper, "contact.saved")
        await console.send(json.dumps({"type": "take_over", "conversation": conv["id"]}))
        await console.send(
            json.dumps({"type": "message", "conversation": conv["id"], "client_id": "a1", "text": "It ships today."})
        )
        async with asyncio.timeout(60):
            while not (files := sorted(outbox.glob("*.log"))):
                await asyncio.sleep(0.2)
        text = files[0].read_text()
        assert "To: ada@example.com" in text and "It ships today." in text
        assert f"X-Kefu-Conversation: {conv['id']}" in text and conv["token"] not in text
        code = re.search(r"#kefu-resume=([\w-]+)", text).group(1)

        # The link opens the widget on the conversation, in a browser that never held it.
        async with async_playwright() as p:
            browser = await p.chromium.launch(executable_path=chromium, args=["--no-sandbox"], headless=True)
            page = await browser.new_page()
            await page.goto(f"{kefu.base}/#kefu-resume={code}")
            await expect(page.locator("kefu-chat >> .kefu-msg--agent").last).to_contain_text("It ships today.")
            assert "kefu-resume" not in page.url  # taken off the address bar
            assert post(kefu.base + "/api/chat/resume", {"code": code})[0] == 403  # spent

            # Closed, the widget offers the transcript by e-mail.
            await console.send(json.dumps({"type": "close", "conversation": conv["id"]}))
            await page.fill("kefu-chat >> #kefu-transcript-email", "ada@example.com")
            await page.click("kefu-chat >> .kefu-transcript__save")
            queued = page.locator("kefu-chat >> .kefu-notice", has_text="on its way to ada@example.com")
            await expect(queued).to_be_visible()
            await browser.close()
    async with asyncio.timeout(30):
        while not (transcript := [f for f in outbox.glob("*.log") if "the transcript" in f.read_text()]):
            await asyncio.sleep(0.2)
    assert "You:\nI want to talk to a person" in transcript[0].read_text()


async def test_with_redis_a_celery_worker_sends_the_reply(live_kefu, private_redis, tmp_path):
    from processes import celery_worker

    outbox = tmp_path / "mail"
    env = {
        "REDIS_URL": private_redis.url,
        "EMAIL_URL": f"filemail://{outbox}",
        "KEFU_EMAIL_BURST_S": "1",
        "KEFU_EMAIL_OFFLINE_S": "1",
        "KEFU_AGENT_SWEEP_S": "0.5",
    }
    kefu = live_kefu(env=env)
    worker = celery_worker({**kefu.env, **env}, tmp_path / "worker.log")
    try:
        cookie = agent_cookie(kefu.env)
        async with websockets.connect(
            kefu.ws.replace("/ws/chat/", "/ws/agent/"),
            origin=kefu.base,
            additional_headers={"Cookie": f"sessionid={cookie}"},
        ) as console:
            async with websockets.connect(kefu.ws, origin=kefu.base) as shopper:
                await shopper.send(json.dumps({"type": "hello", "locale": "en"}))
                conv = await recv(shopper)
                await shopper.send(json.dumps({"type": "message", "client_id": "q1", "text": "I want a person"}))
                await until_type(shopper, "status")
                await shopper.send(json.dumps({"type": "contact", "email": "ada@example.com"}))
                await until_type(shopper, "contact.saved")
            await console.send(json.dumps({"type": "take_over", "conversation": conv["id"]}))
            await console.send(
                json.dumps(
                    {"type": "message", "conversation": conv["id"], "client_id": "a1", "text": "Sent by Celery."}
                )
            )
            async with asyncio.timeout(60):
                while not (files := sorted(outbox.glob("*.log"))):
                    await asyncio.sleep(0.2)
        assert "Sent by Celery." in files[0].read_text() and len(files) == 1
        assert "chat.tasks.send_email" in (tmp_path / "worker.log").read_text()  # the worker sent it
    finally:
        worker.terminate()
        worker.wait(20)
