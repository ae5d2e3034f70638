"""Regenerate the agent console's screenshots in docs/console.md (issue 31): ``docs/img/console-en.png``
and ``docs/img/console-zh.png``, each 1280×800 pixels, and the same on a phone,
``docs/img/console-phone-en.png`` and ``docs/img/console-phone-zh.png`` (390×844, a touch screen).

Run from the project: ``.venv/bin/python docs/screenshots.py``. It starts kefu on its embedded
defaults as the tests do (a temporary SQLite database, ``migrate``, the demo FAQ and demo orders,
Daphne on a free port, no Redis and no model key), creates an agent, opens a few shopper
conversations over ``/ws/chat/`` (in English and Chinese, with e-mails and time zones; some ask for
a person and wait), then signs in at ``/console/login/`` in Debian's Chromium (Playwright,
``/usr/bin/chromium``) once as an English browser and once as a Chinese one (``zh-CN``, time zone
Asia/Shanghai), opens a waiting conversation in the browser's language and saves the page. It
needs a Chinese font that fontconfig knows (Debian: ``fonts-wqy-microhei``), else the zh picture
would show empty boxes: it stops first with ``RuntimeError``. Raises
``RuntimeError`` when kefu does not become healthy in 90 s, ``CalledProcessError`` when a
management command fails and Playwright's ``TimeoutError`` when the console does not show what
is waited for.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "img"
CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run", "--disable-dev-shm-usage"]  # fmt: skip
AGENT, PASSWORD = "alice", "screenshots only 123"

# (locale, time zone, e-mail or "", messages in order, waits for a person); the first waits longest.
SHOPPERS: list[tuple[str, str, str, list[str], bool]] = [
    ("en", "Europe/London", "ada@example.com",
     ["Where is my order KF-1001?", "It was due on Monday. Can I talk to a person please?"], True),
    ("zh", "Asia/Shanghai", "li.wei@example.cn", ["我的花瓶到了，但是有一道裂缝。", "我要找人工客服"], True),
    ("en", "America/New_York", "", ["How long does delivery take?"], False),
    ("zh", "Asia/Shanghai", "", ["你们支持哪些付款方式？"], False),
    ("en", "Australia/Sydney", "sam@example.org", ["I want to speak to a human"], True),
]  # fmt: skip


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def manage(env: dict[str, str], *args: str, stdin: str | None = None) -> None:
    """``python manage.py ARGS`` in the project with ``env``; raises ``CalledProcessError`` on failure."""
    subprocess.run(
        [sys.executable, "manage.py", *args], cwd=ROOT, env=env, input=stdin, text=True, check=True, capture_output=True
    )


def wait_healthy(base: str, proc: subprocess.Popen[bytes]) -> None:
    """Poll ``/healthz`` until it answers 200 (the FAQ model trained, the router warm), at most 90 s."""
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(base + "/healthz", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        if proc.poll() is not None:
            raise RuntimeError(f"daphne exited with {proc.returncode}")
        time.sleep(0.3)
    raise RuntimeError("kefu did not become healthy in 90 s")


def frames_until(ws: Any, done: Any, limit_s: float = 30) -> dict[str, Any]:
    """Read JSON frames from ``ws`` until ``done(frame)`` is true; that frame. TimeoutError after ``limit_s``."""
    deadline = time.monotonic() + limit_s
    while True:
        frame: dict[str, Any] = json.loads(ws.recv(timeout=max(0.1, deadline - time.monotonic())))
        if frame.get("type") == "error":
            raise RuntimeError(f"kefu refused a frame: {frame}")
        if done(frame):
            return frame


def open_shopper(ws_url: str, locale: str, tz: str, email: str, texts: list[str], waits: bool) -> None:
    """One shopper conversation over the WebSocket: ``hello``, the e-mail, then each message,
    waiting for the bot's answer (or, when ``waits``, for the conversation to wait for an agent)."""
    from websockets.sync.client import connect
    from websockets.typing import Origin

    with connect(ws_url, origin=Origin(ws_url.replace("ws://", "http://").split("/ws/")[0])) as ws:
        ws.send(json.dumps({"type": "hello", "locale": locale, "time_zone": tz}))
        frames_until(ws, lambda f: f.get("type") == "conversation")
        if email:
            ws.send(json.dumps({"type": "contact", "email": email}))
            frames_until(ws, lambda f: f.get("type") == "contact.saved")
        for i, text in enumerate(texts):
            ws.send(json.dumps({"type": "message", "client_id": f"m-{i}", "text": text}))
            if waits and i == len(texts) - 1:
                frames_until(ws, lambda f: f.get("type") == "status" and f.get("status") == "waiting_agent")
            else:
                frames_until(ws, lambda f: f.get("type") in ("stream.end", "message") and f.get("role", "bot") == "bot")


def check_cjk_font() -> None:
    """Raise ``RuntimeError`` when fontconfig knows no Chinese font: Chromium would draw the zh
    screenshot's Chinese as empty boxes (Debian: ``apt-get install fonts-wqy-microhei``)."""
    found = subprocess.run(["fc-list", ":lang=zh", "family"], capture_output=True, text=True, check=False).stdout
    if not found.strip():
        raise RuntimeError("no Chinese font installed; install one (e.g. Debian's fonts-wqy-microhei) and run again")


def shoot(base: str, locale: str, email: str, path: Path, viewport: tuple[int, int] = (1280, 800)) -> None:
    """Sign in to the console as a ``locale`` browser of ``viewport`` (width, height in CSS
    pixels; under 760 px wide, a phone: touch, 2× pixels), open the waiting conversation of
    ``email`` once the console's socket is online, and save what the screen shows to ``path``."""
    from playwright.sync_api import expect, sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        phone = viewport[0] < 760
        context = browser.new_context(
            locale=locale,
            timezone_id="Asia/Shanghai",
            viewport={"width": viewport[0], "height": viewport[1]},
            device_scale_factor=2 if phone else 1,
            is_mobile=phone,
            has_touch=phone,
        )
        page = context.new_page()
        page.goto(base + "/console/login/?next=/console/")
        page.fill("#id_username", AGENT)
        page.fill("#id_password", PASSWORD)
        page.click("button[type=submit]")
        expect(page).to_have_url(base + "/console/")
        waiting = page.locator("#list-waiting .queue__item")
        expect(waiting).to_have_count(sum(1 for s in SHOPPERS if s[4]), timeout=20000)
        expect(page.locator("#conn")).to_have_attribute("data-state", "online", timeout=20000)
        waiting.filter(has_text=email).locator("button").click()
        expect(page.locator("#detail")).to_contain_text(email, timeout=20000)
        expect(page.locator("#log .msg--shopper .msg__body").first).to_be_visible(timeout=20000)
        page.wait_for_load_state("networkidle")
        page.screenshot(path=str(path), type="png")
        browser.close()


def main() -> None:
    """Start kefu, seed it, take both screenshots, stop kefu; prints each file and its size in KB."""
    check_cjk_font()
    with tempfile.TemporaryDirectory(prefix="kefu-shots-") as tmp:
        env = {**os.environ, "DATABASE_URL": f"sqlite:///{Path(tmp) / 'kefu.sqlite3'}", "PYTHONUNBUFFERED": "1"}
        for k in ("DJANGO_SETTINGS_MODULE", "OPENAI_API_KEY", "OPENAI_BASE_URL", "REDIS_URL"):
            env.pop(k, None)
        manage(env, "migrate", "--noinput")
        manage(env, "import_faq", "--if-empty", "routing/demo/faq_demo.jsonl")
        manage(env, "load_demo_orders", "--if-empty")
        manage(env, "create_agent", AGENT, "--name", "Alice", "--password-stdin", stdin=PASSWORD + "\n")
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        with open(Path(tmp) / "daphne.log", "wb") as log:
            proc = subprocess.Popen(
                [
                    str(Path(sys.executable).parent / "daphne"),
                    "-b",
                    "127.0.0.1",
                    "-p",
                    str(port),
                    "config.asgi:application",
                ],
                cwd=ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
            try:
                wait_healthy(base, proc)
                for shopper in SHOPPERS:
                    open_shopper(f"ws://127.0.0.1:{port}/ws/chat/", *shopper)
                OUT.mkdir(parents=True, exist_ok=True)
                for locale, email, name, viewport in (
                    ("en-US", "ada@example.com", "console-en.png", (1280, 800)),
                    ("zh-CN", "li.wei@example.cn", "console-zh.png", (1280, 800)),
                    ("en-US", "ada@example.com", "console-phone-en.png", (390, 844)),
                    ("zh-CN", "li.wei@example.cn", "console-phone-zh.png", (390, 844)),
                ):
                    shoot(base, locale, email, OUT / name, viewport)
                    print(f"{(OUT / name).relative_to(ROOT)}: {(OUT / name).stat().st_size / 1024:.0f} KB")
            finally:
                proc.terminate()
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()


if __name__ == "__main__":
    main()
