"""Photos in the chat, in a real browser (Debian's Chromium driven by Playwright) on a live kefu
(issue 33): a shopper pastes a photo into the widget, the agent sees its thumbnail in the
console, opens it in a new tab, and replies with a picture the shopper sees."""

from __future__ import annotations

import io
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_console_browser import browser, create_agent, watch  # noqa: F401  (browser: a fixture)


def png(color: tuple[int, int, int]) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (40, 30), color).save(buffer, format="PNG")
    return buffer.getvalue()


PASTE = """([b64, name]) => {
  const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
  const data = new DataTransfer();
  data.items.add(new File([bytes], name, { type: "image/png" }));
  const input = document.querySelector("kefu-chat").shadowRoot.querySelector("#kefu-input");
  input.dispatchEvent(new ClipboardEvent("paste", { clipboardData: data, bubbles: true, cancelable: true }));
}"""


def test_a_pasted_photo_reaches_the_agent_who_replies_with_a_picture(live_kefu, browser, tmp_path):  # noqa: F811
    import base64

    from playwright.sync_api import expect

    kefu = live_kefu(env={"KEFU_ATTACHMENT_DIR": str(tmp_path / "attachments")})
    create_agent(kefu, "alice", "Alice", "correct horse battery")
    errors: list[str] = []

    agent = browser.new_context().new_page()
    watch(agent, errors)
    agent.goto(kefu.base + "/console/login/")
    agent.fill("#id_username", "alice")
    agent.fill("#id_password", "correct horse battery")
    agent.click("button[type=submit]")
    expect(agent.locator("#conn")).to_have_text("Online", timeout=20000)

    shopper = browser.new_context().new_page()
    watch(shopper, errors)
    shopper.goto(kefu.base + "/")
    shopper.click("kefu-chat >> .kefu-launcher")
    shopper.fill("kefu-chat >> #kefu-input", "can I talk to a human please")
    shopper.press("kefu-chat >> #kefu-input", "Enter")
    waiting = agent.locator("#list-waiting .queue__item")
    expect(waiting).to_have_count(1, timeout=30000)
    waiting.first.locator("button").click()
    agent.click("#btn-take")
    expect(agent.locator("#detail-status")).to_have_text("With an agent: you", timeout=20000)

    # The shopper pastes a photo: uploaded, sent, shown as a thumbnail on both sides.
    shopper.evaluate(PASTE, [base64.b64encode(png((200, 30, 30))).decode(), "crack.png"])
    expect(shopper.locator("kefu-chat >> .kefu-msg--shopper .kefu-thumb")).to_have_count(1, timeout=20000)
    thumb = agent.locator("#log .msg--shopper .msg__thumb")
    expect(thumb).to_have_count(1, timeout=20000)
    expect(thumb).to_have_attribute("alt", "Picture: crack.png")

    # The agent opens it in a new tab: the signed link serves the image, sandboxed.
    with agent.context.expect_page() as opened:
        thumb.click()
    tab = opened.value
    tab.wait_for_load_state()
    assert re.search(r"/api/chat/attachments/[^/]+$", tab.url)
    got = agent.request.get(tab.url)
    assert got.status == 200 and got.headers["content-type"] == "image/png"
    assert got.headers["content-security-policy"] == "default-src 'none'; sandbox"

    # The agent replies with a picture; the shopper sees it.
    agent.set_input_files(
        "#reply-file", files=[{"name": "fit.png", "mimeType": "image/png", "buffer": png((20, 40, 220))}]
    )
    reply = shopper.locator("kefu-chat >> .kefu-msg--agent .kefu-thumb")
    expect(reply).to_have_count(1, timeout=20000)
    expect(reply).to_have_attribute("alt", "Photo: fit.png")
    expect(agent.locator("#log .msg--agent .msg__thumb")).to_have_count(1, timeout=20000)
    assert not errors, errors
