"""The console's task panel in a real browser (Debian's Chromium driven by Playwright) on a live
kefu: an anonymous shopper's cancellation waits for their "yes"; the agent sees it beside the
conversation, clears it, and the shopper's "yes" then cancels nothing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_console_browser import ROOT, browser, create_agent, watch

__all__ = ["browser"]  # the console browser tests' fixture, used here too

DEMO_FAQ = ROOT / "routing" / "demo" / "faq_demo.jsonl"


def test_the_agent_sees_the_shoppers_task_and_clears_it(live_kefu, browser):
    from playwright.sync_api import expect
    from websockets.sync.client import connect

    kefu = live_kefu(env={"KEFU_STORE_ADAPTER": "demo"}, faq_path=DEMO_FAQ)
    subprocess.run(
        [sys.executable, "manage.py", "load_demo_orders"], cwd=ROOT, env=kefu.env, check=True, capture_output=True
    )
    create_agent(kefu, "alice", "Alice", "correct horse battery")
    errors: list[str] = []
    with connect(kefu.ws, origin=kefu.base) as ws:

        def ask(text: str, n: int) -> dict:
            ws.send(json.dumps({"type": "message", "client_id": f"c{n}", "text": text}))
            while True:
                f = json.loads(ws.recv(timeout=30))
                if f["type"] == "stream.end":
                    return f

        ws.send(json.dumps({"type": "hello"}))
        while json.loads(ws.recv(timeout=30))["type"] != "conversation":
            pass
        ask("I want to cancel my order KF-1002", 1)
        offer = ask("mei.chen@example.com", 2)
        assert offer["route"] == "action" and "Shall I cancel it?" in offer["text"]

        agent = browser.new_context(locale="zh-CN").new_page()
        watch(agent, errors)
        agent.goto(kefu.base + "/console/")
        agent.fill("#id_username", "alice")
        agent.fill("#id_password", "correct horse battery")
        agent.click("button[type=submit]")
        row = agent.locator("#list-bot .queue__item")
        expect(row).to_have_count(1, timeout=20000)
        row.first.locator("button").click()

        task = agent.locator("#task-text")
        expect(agent.locator("#task-heading")).to_have_text("顾客的待办事项")
        expect(task).to_contain_text("取消订单 · 已提议：等待顾客回复“是”或“不” · 订单: KF-1002", timeout=20000)
        expect(task).to_contain_text("邮箱: mei.chen@example.com")
        agent.click("#btn-task-clear")
        expect(task).to_have_text("已清除：顾客再回复“是”也不会确认任何操作。", timeout=20000)
        expect(agent.locator("#btn-task-clear")).to_be_hidden()

        stray = ask("yes", 3)
        assert stray["route"] == "decline"
        expect(task).to_have_text("没有待办事项。", timeout=20000)
    state = subprocess.run(
        [
            sys.executable,
            "manage.py",
            "shell",
            "-c",
            "from store.models import DemoOrder;print(DemoOrder.objects.get(number='KF-1002').status)",
        ],
        cwd=ROOT,
        env=kefu.env,
        check=True,
        capture_output=True,
        text=True,
    )
    assert state.stdout.strip().splitlines()[-1] == "placed"
    assert errors == []
