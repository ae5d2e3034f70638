"""The ops dashboard in a real browser (Debian's Chromium driven by Playwright) on a live kefu: a
week of cost-ledger rows and answers written through the ORM and rolled up with
``manage.py rollup``, then real questions through the shopper socket (an FAQ answer rated down,
a decline, a handoff) in the current hour. The page draws its charts under its strict CSP with no
console error, and a screenshot is kept as an artefact: ``.pytest_cache/artefacts/ops.png``."""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ARTEFACTS = ROOT / ".pytest_cache" / "artefacts"
ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-dev-shm-usage",
]

# Run by `manage.py shell` against the live server's database: the staff user with the cost
# permission, and a week of hourly traffic (deterministic) written with bulk inserts.
SEED = """
import random
from datetime import timedelta
from decimal import Decimal

from django.contrib.auth.models import Permission, User
from django.utils import timezone

from chat.models import Conversation, Message
from ops.cells import floor_to
from cache_layer.models import CacheAudit
from routing.upstream.ledger import cost_usd
from routing.models import FaqEntry, UpstreamCall

olivia = User.objects.create_user("olivia", password="ops-pass-123", is_staff=True)
olivia.user_permissions.add(Permission.objects.get(codename="view_costs"))

# The seed writes past times; created_at is auto_now_add, which bulk_create would overwrite.
Message._meta.get_field("created_at").auto_now_add = False
rng = random.Random(16)
entries = list(FaqEntry.objects.values_list("id", flat=True))
now = floor_to(timezone.now(), 3600)
conversation = Conversation.objects.create(token_hash="0" * 64)
routes = ["faq", "faq", "faq", "cache.exact", "cache.semantic", "llm.simple", "llm.simple", "llm.medium",
          "llm.complex", "decline", "handoff"]
messages, calls, seq = [], [], 0
for h in range(1, 7 * 24):  # whole hours inside the page's last 168 hours
    start = now - timedelta(hours=h)
    for _ in range(rng.randint(4, 12)):
        at = start + timedelta(seconds=rng.randrange(3590))
        route = rng.choice(routes)
        seq += 2
        messages.append(Message(conversation=conversation, seq=seq - 1, role="shopper", text="q", created_at=at))
        bot = Message(conversation=conversation, seq=seq, role="bot", text="a", route=route, created_at=at,
                      rating=rng.choice(["", "", "", "up", "down"]))
        if route.startswith("llm."):
            tier = route[4:]
            prompt, completion = rng.randint(300, 1500), rng.randint(40, 400)
            bot.cost_usd = cost_usd(tier=tier, prompt_tokens=prompt, completion_tokens=completion)
            bot.ttft_ms = rng.lognormvariate(6.2 if tier == "simple" else 6.8, 0.4)
            calls.append(UpstreamCall(conversation=conversation, tier=tier, model="m-" + tier, outcome="ok",
                                      prompt_tokens=prompt, completion_tokens=completion, cost_usd=bot.cost_usd,
                                      ttft_ms=bot.ttft_ms * 0.9, latency_ms=2000, created_at=at))
        else:
            bot.ttft_ms = rng.lognormvariate(3.0, 0.5)
            if route in ("faq", "cache.exact", "cache.semantic"):
                bot.saved_usd = cost_usd(tier="simple", prompt_tokens=376, completion_tokens=rng.randint(40, 200))
            if route == "faq":
                bot.faq_entry_id = rng.choice(entries)
        messages.append(bot)
Message.objects.bulk_create(messages)
UpstreamCall.objects.bulk_create(calls)
# Cache audits of two intents two hours ago: one false hit of three for shipping.
for intent, verdict in [("shipping", "same"), ("shipping", "same"), ("shipping", "different"), ("returns", "same")]:
    audit = CacheAudit.objects.create(intent=intent, question="q", cached_question="q", cached_answer="a", verdict=verdict)
    CacheAudit.objects.filter(pk=audit.pk).update(created_at=now - timedelta(hours=2))
print(len(messages) // 2, len(calls))
"""


def test_the_dashboard_draws_its_charts_after_real_questions(live_kefu, chromium):
    from playwright.sync_api import expect, sync_playwright
    from websockets.sync.client import connect

    kefu = live_kefu()
    seeded = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", SEED],
        cwd=ROOT,
        env=kefu.env,
        check=True,
        capture_output=True,
        text=True,
    )
    answers, ledger_rows = map(int, seeded.stdout.splitlines()[-1].split())
    rolled = subprocess.run(
        [sys.executable, "manage.py", "rollup", "--hours", "200"],
        cwd=ROOT,
        env=kefu.env,
        check=True,
        capture_output=True,
        text=True,
    )
    assert rolled.stdout.startswith("rolled up 200 hours")

    # Real questions through the app, in the current hour (read raw by the page).
    with connect(kefu.ws, origin=kefu.base) as ws:

        def ask(text: str, client_id: str) -> dict:
            ws.send(json.dumps({"type": "message", "client_id": client_id, "text": text}))
            while True:
                f = json.loads(ws.recv(timeout=30))
                if f["type"] == "stream.end":
                    return f

        ws.send(json.dumps({"type": "hello", "locale": "en"}))
        assert json.loads(ws.recv(timeout=20))["type"] == "conversation"
        faq = ask("How long does delivery take?", "c1")
        assert faq["route"] == "faq"
        ws.send(json.dumps({"type": "feedback", "message_id": faq["id"], "rating": "down"}))
        assert ask("who will win the football world cup?", "c2")["route"] == "decline"
        assert ask("can I talk to a human please", "c3")["route"] == "handoff"

    errors: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=ARGS, headless=True)
        # A viewer in Shanghai: the page sends that zone, and shows times in it.
        page = browser.new_context(viewport={"width": 1440, "height": 900}, timezone_id="Asia/Shanghai").new_page()
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(kefu.base + "/ops/?hours=168")
        page.fill("#id_username", "olivia")
        page.fill("#id_password", "ops-pass-123")
        page.click("button[type=submit]")
        expect(page).to_have_url(kefu.base + "/ops/?hours=168")
        charts = page.locator("#charts")
        expect(charts).to_have_attribute("data-ready", "1", timeout=20000)
        expect(page.locator("#charts-status")).to_contain_text("Buckets of 1 hour, times in Asia/Shanghai")
        expect(page.locator("#window-zone")).to_have_text("(Asia/Shanghai)")
        # Five charts and one time-to-first-token chart per route, each a canvas with a size and ink.
        expect(page.locator("#chart-ttft .chart")).to_have_count(8)  # the seed's 8 routes (the questions' among them)
        sizes = page.eval_on_selector_all(
            "#charts canvas",
            """cs => cs.map(c => {
                const d = c.getContext("2d").getImageData(0, 0, c.width, c.height).data;
                let ink = 0;
                for (let i = 3; i < d.length; i += 4) if (d[i] > 0) ink++;
                return [c.clientWidth, c.clientHeight, ink];
            })""",
        )
        assert len(sizes) == 5 + 8
        assert all(w > 200 and h > 100 and ink > 1000 for w, h, ink in sizes), sizes
        # The FAQ table: the test FAQ's four entries, each with its answers and ratings.
        expect(page.locator("#faq-ratings tbody tr")).to_have_count(4)
        expect(page.locator("#faq-ratings tbody")).to_contain_text("shipping_time [en]: How long does delivery take?")
        # The semantic cache's measured false-hit rate per intent, most false hits first.
        expect(page.locator("#cache-intents tbody tr")).to_have_count(2)
        first = page.locator("#cache-intents tbody tr").first
        expect(first.locator("th")).to_have_text("shipping")
        expect(first.locator("td")).to_have_text(["3", "1", "33.3%", "6.2% – 79.2%"])
        # The figures: every seeded answer and the three real ones.
        expect(page.locator("#routes tbody tr")).to_have_count(8)
        ARTEFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(ARTEFACTS / "ops.png"), full_page=True)

        # The ledger's CSV for the week, streamed by the ASGI server.
        r = page.request.get(kefu.base + "/ops/export/ledger.csv?hours=168")
        assert r.status == 200 and r.headers["content-type"] == "text/csv; charset=utf-8"
        rows = list(csv.DictReader(io.StringIO(r.text())))
        assert len(rows) == ledger_rows and {row["tier"] for row in rows} == {"simple", "medium", "complex"}
        browser.close()

    assert answers > 167 * 4
    assert errors == []
    assert (ARTEFACTS / "ops.png").stat().st_size > 50_000
