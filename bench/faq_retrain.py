"""Do chats stall while the FAQ retrains? First-delta latency of chatting shoppers with and without
FAQ edits saved in the admin, side by side.

    .venv/bin/python bench/faq_retrain.py [--shoppers 8] [--seconds 20] [--rounds 2] [--edit-every 3]

It serves kefu (this checkout, or ``--project DIR``) with Daphne on a temporary SQLite database
with the demo FAQ, the embedded defaults and no remote model, and creates a staff user. Then
``--shoppers`` shoppers chat in a closed loop, each on its own socket: a question drawn from the
demo FAQ's English phrasings, frames until ``stream.end``, the next question. The first delta is
timed from sending the ``message`` frame to the first ``stream.delta`` of a ``faq`` answer.

Rounds alternate two conditions of ``--seconds`` each, ``--rounds`` times (quiet, edits, quiet,
edits…), so a drift of the shared machine falls on both; after each round with edits the
server is left idle for ``--settle`` seconds, so that the last save's retrain does not run into
the next quiet round. In the "edits" condition an admin session
saves one FAQ entry every ``--edit-every`` seconds (an HTTP POST of its change form). ``--edit
phrasing`` (the default) adds a phrasing, so the FAQ model and the scope classifier retrain;
``--edit answer`` changes the answer's text only, which needs no retrain. Printed: p50 and p99 of each condition, the ratio
edits / quiet, and the admin's save times (the POST's round trip). Issue 11's bar: p99 ratio <= 1.5.

Percentiles are numpy's (linear interpolation). Client and server share the machine's cores.
"""

from __future__ import annotations

import argparse
import asyncio
import http.cookiejar
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
import uuid
from pathlib import Path

import numpy as np
from websockets.asyncio.client import connect

ROOT = Path(__file__).resolve().parent.parent
STRIPPED_ENV = ("DATABASE_URL", "REDIS_URL", "OPENAI_API_KEY", "OPENAI_BASE_URL")
PASSWORD = "bench-" + uuid.uuid4().hex


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """kefu from ``project`` on a temporary SQLite database with the demo FAQ, served by Daphne."""

    def __init__(self, project: Path, port: int) -> None:
        self.project, self.port = project, port
        self.tmp = Path(tempfile.mkdtemp(prefix="kefu-retrain-bench-"))
        tier_keys = {f"KEFU_{t}_API_KEY" for t in ("SIMPLE", "MEDIUM", "COMPLEX")}
        self.env = {k: v for k, v in os.environ.items() if k not in STRIPPED_ENV and k not in tier_keys}
        # Empty values, not absent ones: they also keep a project .env from setting them.
        self.env.update(REDIS_URL="", OPENAI_API_KEY="", OPENAI_BASE_URL="")
        self.env["DATABASE_URL"] = f"sqlite:///{self.tmp / 'bench.sqlite3'}"
        self.env.update(
            KEFU_MESSAGES_PER_MINUTE_PER_IP="1000000",
            DJANGO_SUPERUSER_PASSWORD=PASSWORD,
            PYTHONUNBUFFERED="1",
        )
        self.proc: subprocess.Popen[bytes] | None = None
        self.python = str(project / ".venv" / "bin" / "python")

    def manage(self, *args: str) -> str:
        done = subprocess.run(
            [self.python, "manage.py", *args], cwd=self.project, env=self.env, capture_output=True, text=True
        )
        if done.returncode != 0:
            raise RuntimeError(f"manage.py {' '.join(args)}: {(done.stdout + done.stderr)[-500:]}")
        return done.stdout

    def start(self) -> None:
        self.manage("migrate", "--noinput")
        self.manage("import_faq", "routing/demo/faq_demo.jsonl")
        self.manage("createsuperuser", "--noinput", "--username", "bench", "--email", "bench@example.com")
        with (self.tmp / "daphne.log").open("wb") as log:
            self.proc = subprocess.Popen(
                [str(self.project / ".venv" / "bin" / "daphne"), "-b", "127.0.0.1", "-p", str(self.port),
                 "config.asgi:application"],
                cwd=self.project, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/healthz", timeout=5) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.5)
        raise RuntimeError("kefu did not become healthy within 300 s")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
        shutil.rmtree(self.tmp, ignore_errors=True)


class Admin:
    """A staff session that saves FAQ entries through the admin's change form."""

    def __init__(self, port: int) -> None:
        self.base = f"http://127.0.0.1:{port}"
        self.jar = http.cookiejar.CookieJar()
        self.http = urllib.request.build_opener(
            urllib.request.HTTPCookieProcessor(self.jar), urllib.request.ProxyHandler({})
        )

    def _csrf(self) -> str:
        return next(c.value for c in self.jar if c.name == "csrftoken")

    def _post(self, path: str, fields: dict[str, str]) -> float:
        body = urllib.parse.urlencode({**fields, "csrfmiddlewaretoken": self._csrf()}).encode()
        t0 = time.perf_counter()
        with self.http.open(urllib.request.Request(self.base + path, data=body, method="POST"), timeout=120) as r:
            r.read()
        return time.perf_counter() - t0

    def login(self) -> None:
        self.http.open(self.base + "/admin/login/", timeout=30).read()
        self._post("/admin/login/?next=/admin/", {"username": "bench", "password": PASSWORD, "next": "/admin/"})

    def save(self, entry: dict[str, object], n: int, what: str) -> float:
        """Save ``entry`` with its answer (``what`` ``answer``) or one of its phrasings (``phrasing``)
        changed, edit number ``n``; seconds the POST took."""
        variants = list(entry.get("variants") or [])  # type: ignore[call-overload]
        if what == "phrasing":
            variants = [*variants, f"{entry['question']} (asked another way, {n})"]
        fields = {
            "intent": str(entry["intent"]),
            "locale": str(entry["locale"]),
            "question": str(entry["question"]),
            "answer": f"{entry['answer']} ({n})" if what == "answer" else str(entry["answer"]),
            "variants": json.dumps(variants, ensure_ascii=False),
            "active": "on",
        }
        return self._post(f"/admin/routing/faqentry/{entry['id']}/change/", fields)


async def shopper(port: int, questions: list[str], stop_at: float, firsts: list[float]) -> None:
    async with connect(f"ws://127.0.0.1:{port}/ws/chat/", origin=f"http://127.0.0.1:{port}", proxy=None) as ws:  # type: ignore[arg-type]
        await ws.send(json.dumps({"type": "hello"}))
        json.loads(await ws.recv())
        while time.monotonic() < stop_at:
            t0 = time.perf_counter()
            await ws.send(
                json.dumps({"type": "message", "client_id": str(uuid.uuid4()), "text": random.choice(questions)})
            )
            first: float | None = None
            while True:
                f = json.loads(await asyncio.wait_for(ws.recv(), 120))
                if f["type"] == "stream.delta" and first is None:
                    first = (time.perf_counter() - t0) * 1000
                elif f["type"] == "stream.end":
                    if f["route"] == "faq" and first is not None:
                        firsts.append(first)
                    break


async def editor(
    admin: Admin, entries: list[dict[str, object]], every_s: float, stop_at: float, saves: list[float], what: str
) -> None:
    n = 0
    while time.monotonic() + every_s < stop_at:
        await asyncio.sleep(every_s)
        n += 1
        saves.append(await asyncio.to_thread(admin.save, random.choice(entries), n, what))


async def run_round(
    port: int,
    questions: list[str],
    shoppers: int,
    seconds: float,
    edit: tuple[Admin, list[dict[str, object]], float, str] | None,
) -> tuple[list[float], list[float]]:
    stop_at = time.monotonic() + seconds
    firsts: list[float] = []
    saves: list[float] = []
    jobs = [shopper(port, questions, stop_at, firsts) for _ in range(shoppers)]
    if edit is not None:
        jobs.append(editor(edit[0], edit[1], edit[2], stop_at, saves, edit[3]))
    await asyncio.gather(*jobs)
    return firsts, saves


def entries_of(server: Server) -> list[dict[str, object]]:
    out = server.manage(
        "shell",
        "-c",
        "import json; from routing.models import FaqEntry; print(json.dumps(list(FaqEntry.objects.filter(locale='en').values('id', 'intent', 'locale', 'question', 'answer', 'variants'))))",
    )
    return json.loads(out.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--project", type=Path, default=ROOT, help="the kefu checkout to serve (with its .venv)")
    ap.add_argument("--shoppers", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--edit-every", type=float, default=3.0)
    ap.add_argument(
        "--edit",
        choices=["phrasing", "answer"],
        default="phrasing",
        help="what each save changes: a phrasing (the models retrain) or the answer's text (they need not)",
    )
    ap.add_argument("--settle", type=float, default=10.0, help="idle seconds after each round with saves")
    args = ap.parse_args()
    rows = [json.loads(line) for line in (ROOT / "routing/demo/faq_demo.jsonl").read_text().splitlines() if line]
    questions = [v for r in rows if r["locale"] == "en" for v in [r["question"], *r.get("variants", [])]]
    questions = [q for q in questions if not re.search(r"\b(person|human|agent)\b", q, re.I)]
    server = Server(args.project.resolve(), free_port())
    try:
        server.start()
        admin = Admin(server.port)
        admin.login()
        entries = entries_of(server)
        asyncio.run(run_round(server.port, questions, args.shoppers, 5.0, None))  # warm-up, not counted
        quiet: list[float] = []
        edits: list[float] = []
        saves: list[float] = []
        for n in range(1, args.rounds + 1):
            q = asyncio.run(run_round(server.port, questions, args.shoppers, args.seconds, None))[0]
            f, s = asyncio.run(
                run_round(
                    server.port, questions, args.shoppers, args.seconds, (admin, entries, args.edit_every, args.edit)
                )
            )
            quiet += q
            edits += f
            saves += s
            time.sleep(args.settle)  # the last save's retrain ends before the next quiet round
            print(
                f"round {n}: quiet p99 {np.percentile(q, 99):.0f} ms, with saves p99 {np.percentile(f, 99):.0f} ms",
                file=sys.stderr,
                flush=True,
            )
    finally:
        server.stop()
    q50, q99 = np.percentile(quiet, [50, 99])
    e50, e99 = np.percentile(edits, [50, 99])
    print(
        f"project {args.project}: {args.shoppers} shoppers, {args.rounds} x {args.seconds:.0f} s per condition, "
        f"each save changes {'a phrasing' if args.edit == 'phrasing' else 'the answer'}"
    )
    print("| condition | FAQ answers | first delta p50 | first delta p99 |")
    print("|---|---:|---:|---:|")
    print(f"| quiet | {len(quiet)} | {q50:.0f} ms | {q99:.0f} ms |")
    print(f"| an admin save every {args.edit_every:.0f} s | {len(edits)} | {e50:.0f} ms | {e99:.0f} ms |")
    print(f"| ratio | | {e50 / q50:.2f}x | {e99 / q99:.2f}x |")
    if saves:
        print(
            f"admin saves: {len(saves)}, POST p50 {np.percentile(saves, 50) * 1000:.0f} ms, max {max(saves) * 1000:.0f} ms"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
