"""A real browser (Debian's Chromium driven by Playwright) on the demo storefront: the shopper
types a question into the widget and watches the answer stream in."""

from __future__ import annotations

import json
import re

import pytest

ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-dev-shm-usage",
]


@pytest.fixture
def browser(chromium):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium, args=ARGS, headless=True)
        yield b
        b.close()


def test_question_typed_in_widget_gets_streamed_faq_answer(live_kefu, browser):
    from playwright.sync_api import expect

    kefu = live_kefu()
    page = browser.new_page()
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" and "favicon" not in m.text else None)
    frames: list[dict] = []
    page.on("websocket", lambda ws: ws.on("framereceived", lambda payload: frames.append(json.loads(payload))))
    page.goto(kefu.base + "/")
    page.click("kefu-chat >> .kefu-launcher")
    page.fill("kefu-chat >> #kefu-input", "can I pay with paypal?")
    page.press("kefu-chat >> #kefu-input", "Enter")
    bot = page.locator("kefu-chat >> .kefu-msg--bot").last
    expect(bot.locator(".kefu-bubble")).to_have_text("We accept Visa, Mastercard, PayPal and Apple Pay.", timeout=20000)
    shopper = page.locator("kefu-chat >> .kefu-msg--shopper").last
    expect(shopper).not_to_have_class(re.compile("is-pending"))
    kinds = [f["type"] for f in frames]
    assert kinds[0] == "conversation"
    assert kinds.index("stream.start") < kinds.index("stream.delta") < kinds.index("stream.end")
    assert errors == []


def test_html_in_an_answer_is_shown_as_text_and_lists_render(live_kefu, browser, tmp_path):
    from playwright.sync_api import expect

    faq = tmp_path / "faq.jsonl"
    faq.write_text(
        json.dumps(
            {
                "intent": "html",
                "question": "show me the care steps for linen",
                "variants": ["how do I wash linen", "linen care", "washing linen"],
                "answer": "<b>Care</b>:\n1. Wash cold\n2. Dry flat",
            }
        )
        + "\n"
    )
    kefu = live_kefu(faq_path=faq)
    page = browser.new_page()
    page.goto(kefu.base + "/?lang=zh")
    page.click("kefu-chat >> .kefu-launcher")
    page.fill("kefu-chat >> #kefu-input", "how do I wash linen?")
    page.press("kefu-chat >> #kefu-input", "Enter")
    bubble = page.locator("kefu-chat >> .kefu-msg--bot .kefu-bubble").last
    expect(bubble).to_contain_text("<b>Care</b>", timeout=20000)  # shown literally, not bold
    assert bubble.locator("b").count() == 0
    expect(bubble.locator("ol > li")).to_have_count(2)
    # The page language chose the widget's language.
    assert page.locator("kefu-chat >> #kefu-input").get_attribute("placeholder") == "请输入消息…"


def test_reload_resumes_the_conversation_without_duplicates(live_kefu, browser):
    from playwright.sync_api import expect

    kefu = live_kefu()
    page = browser.new_page()
    page.goto(kefu.base + "/")
    page.click("kefu-chat >> .kefu-launcher")
    page.fill("kefu-chat >> #kefu-input", "what is your return policy?")
    page.press("kefu-chat >> #kefu-input", "Enter")
    expect(page.locator("kefu-chat >> .kefu-msg--bot")).to_have_count(1, timeout=20000)
    conv = page.evaluate("window.kefu.state().conversation")
    page.reload()
    page.click("kefu-chat >> .kefu-launcher")
    expect(page.locator("kefu-chat >> .kefu-msg--bot")).to_have_count(1, timeout=20000)
    expect(page.locator("kefu-chat >> .kefu-msg--shopper")).to_have_count(1)
    assert page.evaluate("window.kefu.state().conversation") == conv


def test_frames_lost_on_the_way_are_mended_by_a_resync(live_kefu, browser):
    """The socket loses a delta and the stream.end of an answer (dropped between the server and
    the page): the widget sees the next delta's ``pos`` skip ahead, asks for a ``resync`` and
    shows the whole answer, once."""
    from playwright.sync_api import expect

    kefu = live_kefu()
    page = browser.new_page()
    sent: list[dict] = []
    deltas = {"n": 0}

    def route(ws):
        server = ws.connect_to_server()

        def to_server(message):
            sent.append(json.loads(message))
            server.send(message)

        def to_page(message):
            frame = json.loads(message)
            if frame["type"] == "stream.delta" and frame.get("id"):
                deltas["n"] += 1
                if deltas["n"] == 2:
                    return  # lost on the way
            if frame["type"] == "stream.end" and deltas["n"] >= 2 and not any(f["type"] == "resync" for f in sent):
                return  # lost too: nothing later would reveal it
            ws.send(message)

        ws.on_message(to_server)
        server.on_message(to_page)

    page.route_web_socket(re.compile(r"/ws/chat/"), route)
    page.goto(kefu.base + "/")
    page.click("kefu-chat >> .kefu-launcher")
    page.fill("kefu-chat >> #kefu-input", "how long does delivery take?")
    page.press("kefu-chat >> #kefu-input", "Enter")
    bot = page.locator("kefu-chat >> .kefu-msg--bot")
    expect(bot.last.locator(".kefu-bubble")).to_have_text(re.compile(r"Express: next day"), timeout=20000)
    assert bot.count() == 1
    # (the numbered lines render as a list: its numbers are markers, not text)
    shown = " ".join(bot.last.locator(".kefu-bubble").inner_text().split())
    assert (
        shown
        == "Orders ship within 1 business day and arrive in 2-4 business days. Standard: 2-4 days Express: next day"
    )
    resyncs = [f for f in sent if f["type"] == "resync"]
    assert len(resyncs) == 1 and resyncs[0]["after"] == 1  # the shopper's question, held complete


def test_a_question_typed_in_fragments_gets_one_answer(live_kefu, browser):
    import sys
    from pathlib import Path

    from playwright.sync_api import expect

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from fake_openai import Behaviour, running_fake_openai

    # The model echoes the question after 2.5 s: time for the shopper to type on.
    with running_fake_openai(default=Behaviour(ttft_ms=2500)) as upstream:
        kefu = live_kefu(env={"OPENAI_API_KEY": "k", "OPENAI_BASE_URL": upstream.base_url, "KEFU_BURST_PAUSE_S": "1.5"})
        page = browser.new_page()
        frames: list[dict] = []
        page.on("websocket", lambda ws: ws.on("framereceived", lambda payload: frames.append(json.loads(payload))))
        page.goto(kefu.base + "/")
        page.click("kefu-chat >> .kefu-launcher")
        box = page.locator("kefu-chat >> #kefu-input")
        box.fill("Does the walnut floor lamp come with a dimmer switch")
        box.press("Enter")
        box.press_sequentially("and does it ship to Canada?", delay=60)  # the widget sends typing frames
        box.press("Enter")
        bots = page.locator("kefu-chat >> .kefu-msg--bot:visible")
        expect(bots).to_have_count(1, timeout=30000)
        expect(bots.first.locator(".kefu-bubble")).to_contain_text(
            "Does the walnut floor lamp come with a dimmer switch", timeout=30000
        )
        expect(bots.first.locator(".kefu-bubble")).to_contain_text("and does it ship to Canada?")
        expect(page.locator("kefu-chat >> .kefu-msg--shopper")).to_have_count(2)
        ends = [f for f in frames if f["type"] == "stream.end"]
        assert [bool(f.get("superseded")) for f in ends] == [True, False]
        assert ends[-1]["text"].startswith("Echo: Does the walnut floor lamp")


def test_a_signed_in_customer_finds_their_chat_on_another_device(live_kefu, browser):
    # The store's own page (another origin, as on a real store) carries a token its backend signed
    # for each page view (data-identity); a second browser (a second device) with a token of its
    # own opens the same conversation, and neither browser keeps it in localStorage (a customer
    # who signs out leaves nothing for the next person at the device).
    import threading
    import time
    import uuid
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    import jwt
    from playwright.sync_api import expect

    secret = "store-backend-secret-0123456789abcdef"
    kefu = live_kefu(env={"KEFU_IDENTITY_SECRET": secret})

    class StorePage(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            now = int(time.time())
            claims = {"sub": "cust-42", "name": "Alice Wong", "iat": now, "exp": now + 600, "jti": uuid.uuid4().hex}
            token = jwt.encode(claims, secret, algorithm="HS256")
            html = (
                '<!doctype html><html lang="en"><body><h1>My account</h1>'
                f'<script src="{kefu.base}/static/kefu/widget.js" data-identity="{token}" defer></script></body></html>'
            ).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(html)))
            self.end_headers()
            self.wfile.write(html)

        def log_message(self, *args: object) -> None:
            pass

    store = ThreadingHTTPServer(("127.0.0.1", 0), StorePage)
    threading.Thread(target=store.serve_forever, daemon=True).start()
    store_url = f"http://127.0.0.1:{store.server_address[1]}/account"

    def device() -> tuple[object, list[dict]]:
        page = browser.new_context().new_page()
        sent: list[dict] = []
        page.on("websocket", lambda ws: ws.on("framesent", lambda payload: sent.append(json.loads(payload))))
        page.goto(store_url)
        page.click("kefu-chat >> .kefu-launcher")
        return page, sent

    try:
        phone, phone_sent = device()
        phone.fill("kefu-chat >> #kefu-input", "what is your return policy?")
        phone.press("kefu-chat >> #kefu-input", "Enter")
        expect(phone.locator("kefu-chat >> .kefu-msg--bot")).to_have_count(1, timeout=20000)
        conversation = phone.evaluate("window.kefu.state().conversation")
        hellos = [f for f in phone_sent if f["type"] == "hello"]
        assert len(hellos) == 1 and hellos[0]["identity"]
        assert phone.evaluate("Object.keys(localStorage).filter(k => k.endsWith('conversation'))") == []

        laptop, _ = device()
        shopper = laptop.locator("kefu-chat >> .kefu-msg--shopper .kefu-bubble")
        expect(shopper).to_have_text("what is your return policy?", timeout=20000)
        expect(laptop.locator("kefu-chat >> .kefu-msg--bot")).to_have_count(1)
        assert laptop.evaluate("window.kefu.state().conversation") == conversation
    finally:
        store.shutdown()


def test_where_is_my_order_on_the_demo_storefront_shows_the_demo_orders_status(live_kefu, browser):
    """What the README promises: the demo storefront, its FAQ and its demo orders, a shopper who
    asks where their order is with the order number and e-mail, and the order's tracking."""
    import subprocess
    import sys
    from pathlib import Path

    from playwright.sync_api import expect

    root = Path(__file__).resolve().parents[2]
    kefu = live_kefu(faq_path=root / "routing" / "demo" / "faq_demo.jsonl")
    subprocess.run(
        [sys.executable, "manage.py", "load_demo_orders", "--if-empty"],
        cwd=root,
        env=kefu.env,
        check=True,
        capture_output=True,
    )
    page = browser.new_page()
    frames: list[dict] = []
    page.on("websocket", lambda ws: ws.on("framereceived", lambda payload: frames.append(json.loads(payload))))
    page.goto(kefu.base + "/")
    page.click("kefu-chat >> .kefu-launcher")
    page.fill("kefu-chat >> #kefu-input", "Where is my order? It's KF-1001, my e-mail is mei.chen@example.com")
    page.press("kefu-chat >> #kefu-input", "Enter")
    bubble = page.locator("kefu-chat >> .kefu-msg--bot .kefu-bubble").last
    expect(bubble).to_contain_text("Tracking number: JD014600006281230981", timeout=20000)
    expect(bubble).to_contain_text(
        "Order KF-1001 (Stoneware mug, sand (set of 2) and Linen napkins, sage (set of 4)) shipped on"
    )
    end = next(f for f in frames if f["type"] == "stream.end")
    assert end["route"] == "action" and end["model"] is None


def test_signing_in_on_a_shared_browser_shows_nothing_of_the_anonymous_chat(live_kefu, browser):
    # Issue 29: one browser (a shared computer). Someone chats anonymously on the store and leaves
    # an unsent message in the outbox; then a customer signs in on that browser. Her widget opens
    # her own conversation: nothing the anonymous shopper wrote is shown or sent in it.
    import threading
    import time
    import uuid
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    import jwt
    from playwright.sync_api import expect

    secret = "store-backend-secret-0123456789abcdef"
    kefu = live_kefu(env={"KEFU_IDENTITY_SECRET": secret})

    class StorePage(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            identity = ""
            if self.path.startswith("/account"):
                now = int(time.time())
                claims = {"sub": "cust-42", "name": "Alice Wong", "iat": now, "exp": now + 600, "jti": uuid.uuid4().hex}
                identity = f' data-identity="{jwt.encode(claims, secret, algorithm="HS256")}"'
            html = (
                '<!doctype html><html lang="en"><body><h1>Store</h1>'
                f'<script src="{kefu.base}/static/kefu/widget.js"{identity} defer></script></body></html>'
            ).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(html)))
            self.end_headers()
            self.wfile.write(html)

        def log_message(self, *args: object) -> None:
            pass

    store = ThreadingHTTPServer(("127.0.0.1", 0), StorePage)
    threading.Thread(target=store.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{store.server_address[1]}"
    try:
        page = browser.new_context().new_page()
        sent: list[dict] = []
        page.on("websocket", lambda ws: ws.on("framesent", lambda payload: sent.append(json.loads(payload))))
        page.goto(base + "/shop")
        page.click("kefu-chat >> .kefu-launcher")
        page.fill("kefu-chat >> #kefu-input", "what is your return policy?")
        page.press("kefu-chat >> #kefu-input", "Enter")
        expect(page.locator("kefu-chat >> .kefu-msg--bot")).to_have_count(1, timeout=20000)
        anonymous = page.evaluate("window.kefu.state().conversation")
        # A message the anonymous shopper typed that never reached the server (offline, then gone).
        page.evaluate(
            "([key]) => localStorage.setItem(key, JSON.stringify([{client_id: 'left-behind', text: 'my card is 4242'}]))",
            [f"kefu:v1:{kefu.base}:outbox"],
        )

        page.goto(base + "/account")  # she signs in on that browser
        page.click("kefu-chat >> .kefu-launcher")
        page.wait_for_function(
            "([anon]) => window.kefu.state().conversation && window.kefu.state().conversation !== anon",
            arg=[anonymous],
            timeout=20000,
        )
        page.fill("kefu-chat >> #kefu-input", "Which payment methods do you accept?")
        page.press("kefu-chat >> #kefu-input", "Enter")
        expect(page.locator("kefu-chat >> .kefu-msg--bot")).to_have_count(1, timeout=20000)
        shopper = page.locator("kefu-chat >> .kefu-msg--shopper .kefu-bubble")
        expect(shopper).to_have_text(["Which payment methods do you accept?"])
        expect(page.locator("kefu-chat >> .kefu-log")).not_to_contain_text("return policy")
        assert not any(f.get("text") == "my card is 4242" for f in sent)
        assert page.evaluate("Object.keys(localStorage).filter(k => k.endsWith(':outbox'))") == []
    finally:
        store.shutdown()


def test_a_model_answers_link_to_another_domain_is_shown_as_text(live_kefu, browser):
    """Issue 29, point 2: a model answer's link to a domain that is not the store's (nor listed in
    ``KEFU_ANSWER_LINK_DOMAINS``) is plain text; a link to the store's own domain stays a link."""
    import sys
    from pathlib import Path

    from playwright.sync_api import expect

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from fake_openai import Behaviour, running_fake_openai

    answer = "Yes. Sizes: http://127.0.0.1/sizes and https://partner.example/oak, discount: http://evil.example/pay"
    with running_fake_openai(default=Behaviour(text=answer)) as upstream:
        kefu = live_kefu(
            env={
                "OPENAI_API_KEY": "upstream-key",
                "OPENAI_BASE_URL": upstream.base_url,
                "KEFU_ANSWER_LINK_DOMAINS": "partner.example",
            }
        )
        page = browser.new_page()
        frames: list[dict] = []
        page.on("websocket", lambda ws: ws.on("framereceived", lambda payload: frames.append(json.loads(payload))))
        page.goto(kefu.base + "/")
        page.click("kefu-chat >> .kefu-launcher")
        page.fill("kefu-chat >> #kefu-input", "Do you ship the oak side table to Canada?")
        page.press("kefu-chat >> #kefu-input", "Enter")
        bubble = page.locator("kefu-chat >> .kefu-msg--bot .kefu-bubble").last
        expect(bubble).to_have_text(answer, timeout=30000)
        hrefs = [bubble.locator("a").nth(i).get_attribute("href") for i in range(bubble.locator("a").count())]
    assert hrefs == ["http://127.0.0.1/sizes", "https://partner.example/oak"]  # evil.example: text only
    conversation = next(f for f in frames if f["type"] == "conversation")
    assert "127.0.0.1" in conversation["link_domains"] and "partner.example" in conversation["link_domains"]
    assert not any("evil.example" in d for d in conversation["link_domains"])


def test_the_talk_to_a_person_button_hands_off_at_once(live_kefu, browser):
    from playwright.sync_api import expect

    kefu = live_kefu()
    page = browser.new_page()
    sent: list[dict] = []
    received: list[dict] = []

    def watch(ws):
        ws.on("framesent", lambda payload: sent.append(json.loads(payload)))
        ws.on("framereceived", lambda payload: received.append(json.loads(payload)))

    page.on("websocket", watch)
    page.goto(kefu.base + "/")
    page.click("kefu-chat >> .kefu-launcher")
    button = page.locator("kefu-chat >> .kefu-person")
    expect(button).to_be_visible(timeout=20000)
    expect(button).to_have_text("Talk to a person")
    button.click()
    # The status the server sends once the conversation is in the agents' queue.
    expect(page.locator("kefu-chat >> .kefu-root")).to_have_attribute("data-status", "waiting_agent", timeout=20000)
    expect(button).to_be_hidden()
    assert {"type": "ask_person"} in sent
    assert not any(f["type"] == "message" for f in sent)  # no message was typed or sent for it
    assert any(f["type"] == "status" and f["status"] == "waiting_agent" for f in received)
