"""The ops dashboard in Chinese in a real browser (Debian's Chromium driven by Playwright) on a
live kefu: a Chinese browser (locale zh-CN) gets the page, and the strings its script writes (the
charts' status, legends, the period form's zone) from the djangojs catalog, under the page's strict
CSP with no console error; the language switch turns it English for that agent."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run", "--disable-dev-shm-usage"]  # fmt: skip

SEED = """
from django.contrib.auth.models import Permission, User
olivia = User.objects.create_user("olivia", password="ops-pass-123", is_staff=True)
olivia.user_permissions.add(Permission.objects.get(codename="view_costs"))
"""


def test_the_ops_page_and_its_script_speak_chinese_to_a_chinese_browser(live_kefu, chromium):
    from playwright.sync_api import expect, sync_playwright

    kefu = live_kefu()
    subprocess.run([sys.executable, "manage.py", "shell", "-c", SEED], cwd=ROOT, env=kefu.env, check=True)
    errors: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=ARGS, headless=True)
        context = browser.new_context(locale="zh-CN", timezone_id="Asia/Shanghai")
        page = context.new_page()
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(kefu.base + "/ops/?hours=24")
        expect(page.locator("button[type=submit].btn--primary")).to_have_text("登录")
        page.fill("#id_username", "olivia")
        page.fill("#id_password", "ops-pass-123")
        page.click("button[type=submit].btn--primary")
        expect(page).to_have_url(kefu.base + "/ops/?hours=24")
        expect(page.locator("#h-budgets")).to_have_text("当前花费预算")
        # Written by ops.js from the catalog: the period form's zone and the charts' status.
        expect(page.locator("#period-zone")).to_have_text("（时间为 Asia/Shanghai）")
        expect(page.locator("#charts")).to_have_attribute("data-ready", "1", timeout=20000)
        expect(page.locator("#charts-status")).to_contain_text("一格，时间为 Asia/Shanghai")
        expect(page.locator("#chart-money")).to_contain_text("节省")
        expect(page.locator("#chart-ttft")).to_have_text("本时间范围内没有回答。")
        # The charts' time in the agent's locale and zone: hovering a chart shows e.g. "2026年12月8日 02:05".
        page.locator("#chart-money .u-over").hover()
        expect(page.locator("#chart-money .u-legend .u-series").first).to_contain_text("年")
        expect(page.locator("#chart-money .u-legend .u-series").first).to_contain_text("时间")
        # The time zone the page's script reported is the one the server formats times in.
        assert {c["name"]: c["value"] for c in context.cookies()}.get("kefu_tz") == "Asia/Shanghai"

        # The agent's own choice: English, kept for the next pages whatever the browser says.
        page.select_option("#staff-language", "en")
        page.click("#staff-language-set")
        expect(page.locator("#h-budgets")).to_have_text("Spend budgets now")
        expect(page.locator("#charts-status")).to_contain_text(", times in Asia/Shanghai; ")
        page.goto(kefu.base + "/console/login/")
        expect(page.locator("button[type=submit].btn--primary")).to_have_text("Sign in")
        browser.close()
    assert errors == []


def test_the_agent_console_script_speaks_chinese_to_a_chinese_browser(live_kefu, chromium):
    """console.js writes its texts from the djangojs catalog: a zh-CN browser sees the connection
    status in Chinese (issue 31, item 5), and the console's language switch turns it English."""
    from playwright.sync_api import expect, sync_playwright

    kefu = live_kefu()
    subprocess.run(
        [sys.executable, "manage.py", "create_agent", "alice", "--name", "Alice", "--password-stdin"],
        cwd=ROOT,
        env=kefu.env,
        input="correct horse battery\n",
        text=True,
        check=True,
        capture_output=True,
    )
    errors: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=ARGS, headless=True)
        context = browser.new_context(locale="zh-CN", timezone_id="Asia/Shanghai")
        page = context.new_page()
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" and "favicon" not in m.text else None)
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(kefu.base + "/console/")
        page.fill("#id_username", "alice")
        page.fill("#id_password", "correct horse battery")
        page.click("button[type=submit]")
        expect(page).to_have_url(kefu.base + "/console/")
        expect(page.locator(".topbar__title")).to_have_text("kefu · 客服台")
        # Written by console.js (setConn) once the socket is open, from the catalog.
        expect(page.locator("#conn")).to_have_text("在线", timeout=20000)
        assert {c["name"]: c["value"] for c in context.cookies()}.get("kefu_tz") == "Asia/Shanghai"

        page.select_option("#staff-language", "en")
        page.click("#staff-language-set")
        expect(page.locator(".topbar__title")).to_have_text("kefu · agent console")
        expect(page.locator("#conn")).to_have_text("Online", timeout=20000)
        browser.close()
    assert errors == []
