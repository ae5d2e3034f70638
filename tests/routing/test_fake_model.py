"""`manage.py fake_model`, the README's way to see streamed answers without an API key: run as a
shopper's developer would (a subprocess), it listens, says how to point kefu at it, lists the models
it was given and streams a completion with a usage chunk to the real `openai` SDK."""

from __future__ import annotations

import ast
import contextlib
import os
import re
import selectors
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from openai import OpenAI

ROOT = Path(__file__).resolve().parent.parent.parent
SERVER = ROOT / "routing" / "management" / "fake_upstream.py"


def read_until(process: subprocess.Popen[bytes], pattern: str, *, timeout_s: float = 60.0) -> str:
    """What the process printed up to and including the first line that matches `pattern`; fails at
    the deadline or when the process exits first. Reads the pipe's file descriptor itself, so no
    buffered line hides from the selector."""
    assert process.stdout is not None
    fd = process.stdout.fileno()
    selector = selectors.DefaultSelector()
    selector.register(fd, selectors.EVENT_READ)
    seen = b""
    deadline = time.monotonic() + timeout_s
    while (left := deadline - time.monotonic()) > 0:
        if not selector.select(timeout=left):
            continue
        data = os.read(fd, 65536)
        if not data:
            pytest.fail(
                f"fake_model exited ({process.wait()}) before printing {pattern!r}; it printed:\n{seen.decode()}"
            )
        seen += data
        text = seen.decode(errors="replace")
        if any(re.search(pattern, line) for line in text.splitlines()):
            return text
    pytest.fail(f"fake_model printed no {pattern!r} within {timeout_s} s; it printed:\n{seen.decode()}")


@pytest.fixture
def fake_model() -> Iterator[tuple[subprocess.Popen[bytes], str, str]]:
    """The command on a free port with one model name; yields (process, base URL, all it printed)."""
    command = ["manage.py", "fake_model", "--port", "0", "--ttft-ms", "20", "--token-ms", "5"]
    process = subprocess.Popen(
        [sys.executable, *command, "--model", "kefu-fake-small", "--model", "kefu-fake-large"],
        cwd=ROOT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        printed = read_until(process, r"Ctrl-C stops it")
        match = re.search(r"listening on (http://127\.0\.0\.1:\d+/v1)", printed)
        assert match is not None, printed
        yield process, match.group(1), printed
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)  # what Ctrl-C sends
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        assert process.stdout is not None
        process.stdout.close()


def test_fake_model_streams_a_completion_to_the_openai_sdk(
    fake_model: tuple[subprocess.Popen[bytes], str, str],
) -> None:
    process, base_url, printed = fake_model
    assert f"OPENAI_BASE_URL={base_url} OPENAI_API_KEY=fake KEFU_SIMPLE_MODEL=kefu-fake-small" in printed

    client = OpenAI(base_url=base_url, api_key="fake", max_retries=0, timeout=20)
    assert [model.id for model in client.models.list()] == ["kefu-fake-small", "kefu-fake-large"]

    deltas: list[str] = []
    usage = None
    stream = client.chat.completions.create(
        model="kefu-fake-small",
        messages=[{"role": "user", "content": "Where is my parcel?"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            deltas.append(chunk.choices[0].delta.content)
        if chunk.usage is not None:
            usage = chunk.usage
    assert "".join(deltas) == "Echo: Where is my parcel?"
    assert len(deltas) == 5  # word by word: streamed, not one block
    assert usage is not None and usage.completion_tokens == 5 and usage.prompt_tokens == 4

    process.send_signal(signal.SIGINT)
    assert process.wait(timeout=20) == 0  # Ctrl-C stops it cleanly, as it says


def test_a_taken_port_is_named_in_a_command_error(fake_model: tuple[subprocess.Popen[bytes], str, str]) -> None:
    _, base_url, _ = fake_model
    port = base_url.rsplit(":", 1)[1].split("/")[0]
    second = subprocess.run(
        [sys.executable, "manage.py", "fake_model", "--port", port],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert second.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port}" in second.stderr


def test_the_server_imports_nothing_of_kefu() -> None:
    """The app's command serves it, and the tests and benchmarks import it without Django: only the
    standard library and aiohttp."""
    tree = ast.parse(SERVER.read_text(encoding="utf-8"))
    imported = {
        name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for name in ([alias.name for alias in node.names] if isinstance(node, ast.Import) else [node.module or ""])
    }
    assert imported - {"__future__", "aiohttp"} <= set(sys.stdlib_module_names), imported


def test_the_default_port_falls_back_to_a_free_one_when_taken() -> None:
    """Without --port it takes 8001 beside make run's 8000, or any free port when 8001 is taken
    (held here, or by whatever already holds it: the command's answer is the same)."""
    holder = socket.socket()
    with contextlib.suppress(OSError):
        holder.bind(("127.0.0.1", 8001))
        holder.listen()
    process = subprocess.Popen(
        [sys.executable, "manage.py", "fake_model"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    try:
        printed = read_until(process, r"Ctrl-C stops it")
        match = re.search(r"listening on http://127\.0\.0\.1:(\d+)/v1", printed)
        assert match is not None and match.group(1) != "8001", printed
    finally:
        holder.close()
        process.terminate()
        process.wait(timeout=20)
        assert process.stdout is not None
        process.stdout.close()
