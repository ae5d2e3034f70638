"""The agent console on a busy day: time to the first page of the list with 10,000 conversations
waiting, and time to open a conversation of 20,000 messages, this tree against a baseline
revision, side by side on the same database (issue 31 item 4; docs/console.md#paging).

    .venv/bin/python bench/console_open.py [--baseline REV] [--waiting 10000] [--messages 20000] [--runs 5] [--browser]

What it does: migrates a temporary SQLite file, bulk-loads it (tests/console_seed.py), creates
an agent, then for each tree (the baseline, exported with ``git archive``, and this one) starts
Daphne on its own copy of that file and, ``--runs`` times, connects the console socket
(``websockets``, no size limit on the client so the baseline's big frames can be measured):

* ``queue``: from the socket's connect to the whole ``queue`` frame received (ms) and its size;
* ``history``: from ``open`` sent to the whole ``history`` frame received (ms) and its size;
* with ``--browser``: Debian's Chromium (Playwright) signs in, and the time from ``goto
  /console/`` until the first waiting row is shown, then from the click on the long
  conversation until its newest message is shown (ms).

Medians are printed as a table; ``frame > limit`` says whether a frame was over 1 MiB (a client
with the default limit, the ``websockets`` client's or a proxy's, closes the socket on it).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import websockets

ROOT = Path(__file__).resolve().parent.parent
LIMIT = 1024 * 1024


def free_port() -> int:
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = int(s.getsockname()[1])
    s.close()
    return port


def manage(tree: Path, env: dict[str, str], *args: str, stdin: str | None = None) -> str:
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=tree,
        env=env,
        input=stdin,
        check=True,
        capture_output=True,
        text=True,
    ).stdout


def base_env(db: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "OPENAI_API_KEY", "OPENAI_BASE_URL")}
    env.update({"DATABASE_URL": f"sqlite:///{db}", "PYTHONUNBUFFERED": "1", "KEFU_NO_WARMUP": "1"})
    env.pop("DJANGO_SETTINGS_MODULE", None)
    return env


def cookie_for(tree: Path, env: dict[str, str]) -> str:
    out = manage(
        tree,
        env,
        "shell",
        "-c",
        "from django.contrib.auth.models import User\nfrom django.test import Client\n"
        "c = Client()\nc.force_login(User.objects.get(username='alice'))\n"
        "print('session', c.cookies['sessionid'].value)\n",
    )
    return next(line.split()[1] for line in out.splitlines() if line.startswith("session "))


class Server:
    def __init__(self, tree: Path, env: dict[str, str]) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [
                str(Path(sys.executable).parent / "daphne"),
                "-b",
                "127.0.0.1",
                "-p",
                str(self.port),
                "config.asgi:application",
            ],
            cwd=tree,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(self.base + "/console/login/", timeout=2):
                    return
            except OSError:
                time.sleep(0.3)
        raise RuntimeError("daphne did not answer in 120 s")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


async def socket_run(server: Server, cookie: str, long_id: str) -> dict[str, float]:
    """One console: the times and sizes of its ``queue`` and ``history`` frames; a socket the server
    closed first gives NaN times and sizes (``closed``: its close code)."""
    try:
        return await _socket_run(server, cookie, long_id)
    except websockets.ConnectionClosed as e:
        code = e.rcvd.code if e.rcvd is not None else 1006
        nan = float("nan")
        return {"queue_ms": nan, "queue_bytes": nan, "history_ms": nan, "history_bytes": nan, "closed": code}


async def _socket_run(server: Server, cookie: str, long_id: str) -> dict[str, float]:
    t0 = time.perf_counter()
    async with websockets.connect(
        f"ws://127.0.0.1:{server.port}/ws/agent/",
        origin=server.base,
        additional_headers={"Cookie": f"sessionid={cookie}"},
        max_size=None,
    ) as ws:
        while True:
            raw = await ws.recv()
            if json.loads(raw)["type"] == "queue":
                break
        queue_ms, queue_bytes = (time.perf_counter() - t0) * 1000, len(raw.encode())
        t1 = time.perf_counter()
        await ws.send(json.dumps({"type": "open", "conversation": long_id}))
        while True:
            raw = await ws.recv()
            if json.loads(raw)["type"] == "history":
                break
        history_ms, history_bytes = (time.perf_counter() - t1) * 1000, len(raw.encode())
    return {
        "queue_ms": queue_ms,
        "queue_bytes": queue_bytes,
        "history_ms": history_ms,
        "history_bytes": history_bytes,
        "closed": 0,
    }


def browser_run(server: Server, long_id: str, newest_text: str) -> dict[str, float]:
    """The console page in Chromium: ms until the first waiting row shows, then until the long
    conversation's newest message shows; NaN for a step that did not happen within 60 s."""
    from playwright.sync_api import Error, expect, sync_playwright

    args = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update"]
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path="/usr/bin/chromium", args=[*args, "--disable-sync", "--no-first-run"])
        page = b.new_context(viewport={"width": 1280, "height": 800}).new_page()
        page.goto(server.base + "/console/login/")
        page.fill("#id_username", "alice")
        page.fill("#id_password", "bench-password")
        page.click("button[type=submit]")
        page.wait_for_url(server.base + "/console/")
        list_ms = open_ms = float("nan")
        try:
            t0 = time.perf_counter()
            page.reload()
            expect(page.locator("#list-waiting .queue__item").first).to_be_visible(timeout=60_000)
            list_ms = (time.perf_counter() - t0) * 1000
            t1 = time.perf_counter()
            page.locator(f"#list-bot .queue__item[data-id='{long_id}'] button").click(timeout=60_000)
            expect(page.locator("#log .msg__body").last).to_have_text(newest_text, timeout=60_000)
            open_ms = (time.perf_counter() - t1) * 1000
        except (AssertionError, Error):
            pass
        b.close()
    return {"page_list_ms": list_ms, "page_open_ms": open_ms}


def export(rev: str, into: Path) -> Path:
    into.mkdir(parents=True)
    archive = subprocess.run(["git", "archive", rev], cwd=ROOT, check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--baseline", default="39558f3", help="the revision to compare with (before paging)")
    ap.add_argument("--waiting", type=int, default=10_000)
    ap.add_argument("--messages", type=int, default=20_000)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--browser", action="store_true", help="also time the console page in Chromium")
    a = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    from tests.console_seed import long_text

    with tempfile.TemporaryDirectory(prefix="kefu-console-bench-") as tmp:
        seeded_db = Path(tmp) / "seeded.sqlite3"
        env = base_env(seeded_db)
        t = time.perf_counter()
        manage(ROOT, env, "migrate", "--noinput")
        out = manage(
            ROOT,
            env,
            "shell",
            "-c",
            f"from tests.console_seed import seed\nseed(waiting={a.waiting}, long_messages={a.messages})\n",
        )
        long_id = json.loads(out.strip().splitlines()[-1])["long"]
        manage(ROOT, env, "create_agent", "alice", "--name", "Alice", "--password-stdin", stdin="bench-password\n")
        print(
            f"seeded {a.waiting:,} waiting and a {a.messages:,}-message conversation in {time.perf_counter() - t:.0f} s"
        )
        trees = {f"before ({a.baseline})": export(a.baseline, Path(tmp) / "baseline"), "after (this tree)": ROOT}
        results: dict[str, dict[str, float]] = {}
        for name, tree in trees.items():
            db = Path(tmp) / f"{name.split()[0]}.sqlite3"
            shutil.copy(seeded_db, db)
            env = base_env(db)
            if tree != ROOT:
                (tree / ".venv").symlink_to(ROOT / ".venv")
            cookie = cookie_for(ROOT, env)
            server = Server(tree, env)
            try:
                runs = [asyncio.run(socket_run(server, cookie, long_id)) for _ in range(a.runs)]
                if a.browser:
                    runs = [{**r, **browser_run(server, long_id, long_text(a.messages))} for r in runs]
            finally:
                server.stop()
            results[name] = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
            results[name]["closed"] = max(r["closed"] for r in runs)
            print(name, json.dumps(results[name]), flush=True)

    rows = [
        ("time to first page of the list (socket), ms", "queue_ms", "{:,.0f}"),
        ("`queue` frame, bytes", "queue_bytes", "{:,.0f}"),
        ("time to open the long conversation (socket), ms", "history_ms", "{:,.0f}"),
        ("`history` frame, bytes", "history_bytes", "{:,.0f}"),
    ]
    if a.browser:
        rows += [
            ("console page: first waiting row shown (Chromium), ms", "page_list_ms", "{:,.0f}"),
            ("console page: newest message of the long conversation shown, ms", "page_open_ms", "{:,.0f}"),
        ]
    names = list(results)
    print(f"\n{a.waiting:,} waiting, {a.messages:,}-message conversation, median of {a.runs} runs\n")
    print(f"| measure | {' | '.join(names)} | ratio |")
    print("|---|" + "---|" * (len(names) + 1))

    def cell(value: float, fmt: str) -> str:
        return "never" if math.isnan(value) else fmt.format(value)

    for label, key, fmt in rows:
        before, after = results[names[0]][key], results[names[1]][key]
        ratio = "-" if math.isnan(before) or math.isnan(after) or not after else f"{before / after:,.1f}×"
        print(f"| {label} | {cell(before, fmt)} | {cell(after, fmt)} | {ratio} |")
    for name in names:
        over = [k for k in ("queue_bytes", "history_bytes") if results[name][k] > LIMIT]
        closed = int(results[name]["closed"])
        print(
            f"{name}: frame > limit: {', '.join(over) if over else 'none'}; "
            f"socket closed by the server: {closed if closed else 'never'} (never: the step did not complete)"
        )


if __name__ == "__main__":
    main()
