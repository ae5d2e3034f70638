"""Request bodies over kefu's limits are refused before they are read (issue 29, item 6).

Production shape: kefu served by a real Daphne process; the client is a raw socket, so that it
can declare a 300 MB body without having one. Before the fix Daphne read a body to its end before
any view could refuse it (a 300 MB ``POST`` raised the worker's memory by 243 MB); a client that
sends only the headers then waits got no answer at all."""

from __future__ import annotations

import json
import os
import select
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
DECLARED = 300 * 1024 * 1024  # 300 MB, declared, never sent


class Daphne:
    """kefu served by a Daphne process on a fresh SQLite database, without the start-up warm-up
    (the FAQ model's training would move the memory figures this test reads)."""

    def __init__(self, tmp: Path, env: dict[str, str]) -> None:
        from conftest import free_port

        self.port = free_port()
        full = {k: v for k, v in os.environ.items() if k not in ("DJANGO_SETTINGS_MODULE", "REDIS_URL")}
        full.update({"DATABASE_URL": f"sqlite:///{tmp / 'kefu.sqlite3'}", "KEFU_NO_WARMUP": "1", **env})
        subprocess.run(
            [sys.executable, "manage.py", "migrate", "--noinput"], cwd=ROOT, env=full, check=True, capture_output=True
        )
        self.log = (tmp / "daphne.log").open("wb")
        daphne = str(Path(sys.executable).parent / "daphne")
        self.proc = subprocess.Popen(
            [daphne, "-b", "127.0.0.1", "-p", str(self.port), "config.asgi:application"],
            cwd=ROOT,
            env=full,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 90
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/livez", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert self.proc.poll() is None and time.monotonic() < deadline, (tmp / "daphne.log").read_text()
            time.sleep(0.2)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


@pytest.fixture
def daphne(tmp_path: Path) -> Iterator[Any]:
    """Factory: ``daphne(env)`` starts kefu under Daphne; stopped after the test."""
    started: list[Daphne] = []

    def start(**env: str) -> Daphne:
        server = Daphne(tmp_path, env)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def read_response(sock: socket.socket, timeout: float = 20.0) -> tuple[int, dict[str, Any]]:
    """Status and JSON body of the answer (read until the server closes or the body is whole)."""
    sock.settimeout(timeout)
    data = b""
    while True:
        head, sep, body = data.partition(b"\r\n\r\n")
        if sep:
            length = [
                int(v) for k, _, v in (h.partition(b":") for h in head.split(b"\r\n")) if k.lower() == b"content-length"
            ]
            if length and len(body) >= length[0]:
                break
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), json.loads(body)


def declare(port: int, path: str, *, extra: str = "") -> socket.socket:
    """Open a POST of ``path`` declaring a 300 MB JSON body, and send its first kilobyte only."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=20)
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {DECLARED}\r\n{extra}\r\n"
    )
    sock.sendall(head.encode() + b"[" + b" " * 1023)
    return sock


@pytest.mark.timeout(240)
def test_a_300_mb_body_is_refused_before_it_is_sent(daphne: Any) -> None:
    kefu = daphne()
    with declare(kefu.port, "/v1/chat/completions") as warm:  # first request: imports, buffers
        assert read_response(warm)[0] == 413
    before = rss_kb(kefu.proc.pid)

    # Unauthenticated, to the gateway: refused by its declared length, the answer in OpenAI's shape.
    with declare(kefu.port, "/v1/chat/completions") as sock:
        status, body = read_response(sock)
    assert status == 413
    assert body["error"]["code"] == "request_too_large"
    assert body["error"]["message"] == "The body is over 1000000 bytes."

    # Any other POST endpoint, by Django's DATA_UPLOAD_MAX_MEMORY_SIZE (2.5 MB by default).
    with declare(kefu.port, "/console/login/") as sock:
        status, body = read_response(sock)
    assert (status, body["error"]["message"]) == (413, "The body is over 2621440 bytes.")

    # A client that waits for "100 Continue" before sending gets the 413 instead.
    with declare(kefu.port, "/ops/canary/simple/promote", extra="Expect: 100-continue\r\n") as sock:
        status, body = read_response(sock)
    assert status == 413

    grown_kb = rss_kb(kefu.proc.pid) - before
    assert grown_kb < 4 * 1024, f"the worker grew by {grown_kb} kB"


@pytest.mark.timeout(240)
def test_a_chunked_body_is_cut_at_the_limit(daphne: Any) -> None:
    kefu = daphne(KEFU_GATEWAY_MAX_BODY_BYTES="200000")
    before = rss_kb(kefu.proc.pid)
    sock = socket.create_connection(("127.0.0.1", kefu.port), timeout=20)
    sock.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n"
    )
    piece = b" " * 16384
    sent = 0
    answered = False
    deadline = time.monotonic() + 60
    while not answered:
        # Until the server answers: a body that never ends (64 MB at most, far over the limit).
        assert sent < 64 * 1024 * 1024 and time.monotonic() < deadline, f"no answer after {sent} bytes"
        sock.sendall(b"%x\r\n" % len(piece) + piece + b"\r\n")
        sent += len(piece)
        answered = bool(select.select([sock], [], [], 0.01)[0])
    status, body = read_response(sock)
    sock.close()
    assert (status, body["error"]["code"]) == (413, "request_too_large")
    assert sent >= 200_000  # not before the limit was passed
    grown_kb = rss_kb(kefu.proc.pid) - before
    assert grown_kb < 4 * 1024, f"the worker grew by {grown_kb} kB"


async def test_the_asgi_guard_refuses_by_length_and_cuts_a_longer_body(settings: Any) -> None:
    """Behind any ASGI server: by ``Content-Length`` before the application runs, and a body
    that passes the limit while the application reads it."""
    from config.body_limit import BodyLimit

    settings.KEFU_GATEWAY_MAX_BODY_BYTES = 100
    ran: list[bytes] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        ran.append(body)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    async def run(headers: list[tuple[bytes, bytes]], chunks: list[bytes]) -> list[Any]:
        sent: list[Any] = []
        queue = [{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1} for i, c in enumerate(chunks)]

        async def receive() -> Any:
            return queue.pop(0)

        async def send(message: Any) -> None:
            sent.append(message)

        scope = {"type": "http", "path": "/v1/chat/completions", "headers": headers}
        await BodyLimit(app)(scope, receive, send)
        return sent

    declared = await run([(b"content-length", b"101")], [b"x" * 101])
    assert declared[0]["status"] == 413 and not ran
    streamed = await run([], [b"x" * 60, b"x" * 60, b"x" * 60])
    assert streamed[0]["status"] == 413 and not ran
    assert json.loads(streamed[1]["body"])["error"]["code"] == "request_too_large"
    fits = await run([(b"content-length", b"100")], [b"x" * 50, b"x" * 50])
    assert fits[0]["status"] == 200 and ran == [b"x" * 100]
