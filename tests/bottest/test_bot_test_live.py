"""A live server keeps answering while ``manage.py bot_test`` runs on the same SQLite file (issue
37): the run holds no long write lock. Daphne in a subprocess (``live_kefu``) and the command in
another, both on one database file; a shopper's socket asks the server question after question
from the run's first test conversation to its end, and every question gets its answer."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import subprocess
import sys
import uuid
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import websockets

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "store"))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from processes import ROOT, manage
from test_order_actions import TEST_FAQ

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(300)]

SUITE = """\
name: an order's status, then two FAQ answers
turns:
  - say: Where is my order KF-1001? My e-mail is mei.chen@example.com
    expect: {route: action, contains: KF-1001, tools_called: status}
  - say: How long does delivery take?
    expect: {route: faq, contains: "1 business day"}
  - say: Which payment methods do you accept?
    expect: {route: faq, contains: PayPal}
"""


def sandbox_conversations(db: str) -> int:
    with sqlite3.connect(db, timeout=20) as conn:
        return int(conn.execute("SELECT COUNT(*) FROM chat_conversation WHERE sandbox").fetchone()[0])


async def ask(ws: websockets.ClientConnection, text: str) -> dict[str, object]:
    """Send ``text`` and return its answer's ``stream.end``; an ``error`` frame fails the test."""
    await ws.send(json.dumps({"type": "message", "client_id": str(uuid.uuid4()), "text": text}))
    async with asyncio.timeout(60):
        while True:
            frame = json.loads(await ws.recv())
            assert frame["type"] != "error", frame
            if frame["type"] == "stream.end":
                return frame


async def test_a_live_server_keeps_answering_during_a_run_on_the_same_sqlite_file(live_kefu, tmp_path):
    faq = tmp_path / "faq.jsonl"
    faq.write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in TEST_FAQ) + "\n", encoding="utf-8")
    kefu = live_kefu(env={"KEFU_MESSAGES_PER_MINUTE_PER_IP": "100000"}, faq_path=faq)
    db = urlsplit(kefu.env["DATABASE_URL"]).path
    manage(kefu.env, "load_demo_orders")
    suite = tmp_path / "suite.yaml"
    suite.write_text(SUITE, encoding="utf-8")
    run = subprocess.Popen(
        [sys.executable, "manage.py", "bot_test", str(suite), "--repeat", "3"],
        cwd=ROOT,
        env=kefu.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        async with websockets.connect(kefu.ws, origin=kefu.base) as ws:
            await ws.send(json.dumps({"type": "hello"}))
            assert json.loads(await ws.recv())["type"] == "conversation"
            async with asyncio.timeout(180):
                while sandbox_conversations(db) == 0:  # the run has started writing
                    assert run.poll() is None, run.communicate()[0]
                    await asyncio.sleep(0.05)
            answered_during_run = 0
            while run.poll() is None:
                end = await ask(ws, "How long does delivery take?")
                assert end["route"] == "faq"
                answered_during_run += run.poll() is None
        out, _ = run.communicate(timeout=60)
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode == 0, out
    assert out.splitlines()[-1] == "1 passed, 0 failed"
    assert answered_during_run >= 1, out
    assert sandbox_conversations(db) == 3
