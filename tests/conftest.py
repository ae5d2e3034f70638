"""Shared fixtures. Named personas: ``shopper`` / ``other_shopper`` are WebSocket clients.

Services are used where they are: Redis at ``REDIS_URL`` (default redis://127.0.0.1:6379/0),
PostgreSQL at ``TEST_DATABASE_URL`` (default postgres://postgres@127.0.0.1:5432/postgres), Chromium
at /usr/bin/chromium. A test that needs a missing one is skipped with the reason.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from channels.testing import WebsocketCommunicator

from tests.processes import manage

ROOT = Path(__file__).resolve().parent.parent
REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
TEST_DATABASE_URL = os.environ.get("TEST_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres")
CHROMIUM = "/usr/bin/chromium"

# A small FAQ in the project's own words for tests (the demo FAQ is routing/demo/faq_demo.jsonl).
TEST_FAQ = [
    {
        "intent": "shipping_time",
        "locale": "en",
        "question": "How long does delivery take?",
        "variants": [
            "when will my parcel arrive",
            "how many days is shipping",
            "delivery time to the UK",
            "how fast do you ship",
            "shipping duration",
            "how long until my order gets here",
        ],
        "answer": "Orders ship within 1 business day and arrive in 2-4 business days.\n1. Standard: 2-4 days\n2. Express: next day",
    },
    {
        "intent": "return_policy",
        "locale": "en",
        "question": "What is your return policy?",
        "variants": [
            "can I return an item",
            "how do returns work",
            "I want to send something back",
            "return window",
            "do you accept returns",
            "how many days do I have to return",
        ],
        "answer": "You can return unused items within {{Return Window Days}} days for a full refund.",
    },
    {
        "intent": "payment_methods",
        "locale": "en",
        "question": "Which payment methods do you accept?",
        "variants": [
            "can I pay with paypal",
            "do you take credit cards",
            "payment options",
            "can I pay by card",
            "is apple pay accepted",
            "how can I pay",
        ],
        "answer": "We accept Visa, Mastercard, PayPal and Apple Pay.",
    },
    {
        "intent": "shipping_time",
        "locale": "zh",
        "question": "多久能送到？",
        "variants": ["什么时候发货", "快递要几天", "几天能到", "配送需要多长时间"],
        "answer": "订单在一个工作日内发货，2到4个工作日送达。",
    },
]


def _reachable(url: str, default_port: int) -> bool:
    parts = urlsplit(url)
    try:
        with socket.create_connection((parts.hostname or "127.0.0.1", parts.port or default_port), timeout=1):
            return True
    except OSError:
        return False


@pytest.fixture
def redis_url() -> str:
    if not _reachable(REDIS_URL, 6379):
        pytest.skip(f"Redis is not reachable at {REDIS_URL} (set REDIS_URL)")
    return REDIS_URL


@pytest.fixture
def pg_url() -> str:
    if not _reachable(TEST_DATABASE_URL, 5432):
        pytest.skip(f"PostgreSQL is not reachable at {TEST_DATABASE_URL} (set TEST_DATABASE_URL)")
    return TEST_DATABASE_URL


@pytest.fixture
def chromium() -> str:
    if not os.access(CHROMIUM, os.X_OK):
        pytest.skip(f"{CHROMIUM} is not installed (Debian package 'chromium')")
    try:
        import playwright  # noqa: F401
    except ImportError:
        pytest.skip("the playwright package is not installed")
    return CHROMIUM


@pytest.fixture
def faq(db: Any) -> Any:
    """TEST_FAQ imported and the process's FAQ model trained on it."""
    from routing.faq.importer import faq_import, validate
    from routing.faq.registry import registry

    faq_import([validate(r, i) for i, r in enumerate(TEST_FAQ, 1)])
    registry.reload()
    yield registry
    registry.model = None


class Client:
    """A shopper's socket: a ``WebsocketCommunicator`` on the real ASGI application."""

    def __init__(self, origin: str = "http://127.0.0.1:8000") -> None:
        from config.asgi import application

        self.comm = WebsocketCommunicator(
            application, "/ws/chat/", headers=[(b"origin", origin.encode()), (b"host", b"127.0.0.1:8000")]
        )
        self.conversation: str | None = None
        self.token: str | None = None

    async def connect(self) -> None:
        connected, _ = await self.comm.connect()
        assert connected

    async def hello(self, **fields: Any) -> dict[str, Any]:
        await self.comm.send_json_to({"type": "hello", **fields})
        frame = await self.recv()
        if frame.get("type") == "conversation":
            self.conversation, self.token = frame["id"], frame["token"]
        return frame

    async def send(self, frame: dict[str, Any]) -> None:
        await self.comm.send_json_to(frame)

    async def say(self, text: str, client_id: str | None = None) -> str:
        client_id = client_id or str(uuid.uuid4())
        await self.send({"type": "message", "client_id": client_id, "text": text})
        return client_id

    async def recv(self, timeout: float = 20) -> dict[str, Any]:
        return await self.comm.receive_json_from(timeout=timeout)

    async def until(self, kind: str, timeout: float = 30) -> list[dict[str, Any]]:
        """Frames received up to and including the first of type ``kind``."""
        frames = []
        deadline = time.monotonic() + timeout
        while True:
            f = await self.recv(timeout=max(0.1, deadline - time.monotonic()))
            frames.append(f)
            if f["type"] == kind:
                return frames

    async def close(self) -> None:
        await self.comm.disconnect()


@pytest.fixture
async def make_client() -> Any:
    """Factory of connected shopper sockets; all are closed, and answering loops finished, after the test."""
    from chat import answering

    clients: list[Client] = []

    async def make(**kw: Any) -> Client:
        c = Client(**kw)
        await c.connect()
        clients.append(c)
        return c

    yield make
    for c in clients:
        try:
            await c.close()
        except Exception:  # already closed by the server
            pass
    for task in list(answering._running.values()):
        try:
            await asyncio.wait_for(task, 10)
        except Exception:
            pass


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def _migrate_and_import(env: dict[str, str], faq_path: Path | None) -> None:
    """``manage.py migrate``, then ``import_faq faq_path`` (when given), on ``env``'s database."""
    manage(env, "migrate", "--noinput")
    if faq_path is not None:
        manage(env, "import_faq", str(faq_path))


#: This test process's migrated SQLite files with an FAQ imported, by the FAQ file's bytes.
_sqlite_templates: dict[bytes, Path] = {}


def _from_sqlite_template(env: dict[str, str], faq_path: Path | None) -> bool:
    """Give a live server's new SQLite database (``env["DATABASE_URL"]``, a file that does not
    exist yet) the tables and the FAQ by copying a file this process migrated and imported into
    once: the same rows as ``migrate`` and ``import_faq`` would make, without two Django start-ups
    (about 5 s of CPU) per server. False, having done nothing, for any other database."""
    url = env.get("DATABASE_URL", "")
    if not url.startswith("sqlite:///") or faq_path is None:
        return False
    target = Path(url.removeprefix("sqlite://"))
    if target.exists():
        return False
    faq = faq_path.read_bytes()
    template = _sqlite_templates.get(faq)
    if template is None:
        import sqlite3

        template = Path(tempfile.mkdtemp(prefix="kefu-template-")) / "kefu.sqlite3"
        _migrate_and_import({**env, "DATABASE_URL": f"sqlite:///{template}"}, faq_path)
        with sqlite3.connect(template) as db:  # everything in the main file: copying it is enough
            db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        _sqlite_templates[faq] = template
    shutil.copyfile(template, target)
    return True


class LiveKefu:
    """kefu served by Daphne in a subprocess (real sockets), on its own fresh database."""

    def __init__(self, env: dict[str, str], faq_path: Path | None) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.ws = f"ws://127.0.0.1:{self.port}/ws/chat/"
        full = {**os.environ, **env, "PYTHONUNBUFFERED": "1"}
        full.pop("DJANGO_SETTINGS_MODULE", None)
        for k in ("OPENAI_API_KEY", "OPENAI_BASE_URL"):
            if k not in env:
                full.pop(k, None)
        if "REDIS_URL" not in env:
            full.pop("REDIS_URL", None)
        self.env = full
        py = sys.executable
        if not _from_sqlite_template(full, faq_path):
            _migrate_and_import(full, faq_path)
        log_dir = Path(tempfile.mkdtemp(prefix="kefu-daphne-"))
        self.log_path = log_dir / f"daphne-{self.port}.log"
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            [str(Path(py).parent / "daphne"), "-b", "127.0.0.1", "-p", str(self.port), "config.asgi:application"],
            cwd=ROOT,
            env=full,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        try:
            self._wait_healthy()
        except BaseException:
            # Not healthy in time, or the test's timeout fired meanwhile: the fixture never got
            # this server to stop, so stop it here (left running, it took CPU from later tests).
            self.stop()
            raise

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + 180
        last = "no answer"
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(self.base + "/healthz", timeout=2) as r:
                    if r.status == 200:
                        self.health = json.loads(r.read())
                        return
            except urllib.error.HTTPError as e:  # 503 while loading: its body says what is not ok
                last = e.read().decode(errors="replace")
            except OSError as e:
                last = f"{type(e).__name__}: {e}"
            if self.proc.poll() is not None:
                raise RuntimeError(f"daphne exited with {self.proc.returncode}; its log ends:\n{self._log_tail()}")
            time.sleep(0.3)
        raise RuntimeError(
            f"kefu did not become healthy in 180 s; /healthz said {last}; its log ends:\n{self._log_tail()}"
        )

    def _log_tail(self, lines: int = 40) -> str:
        """The last ``lines`` lines of this server's output (for a failure's message)."""
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError as e:
            return f"(unreadable: {e})"

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


@pytest.fixture
def live_kefu(tmp_path: Path) -> Iterator[Any]:
    """Factory: ``live_kefu(env={...}, faq_path=...)`` starts kefu; all are stopped after the test."""
    started: list[LiveKefu] = []

    def start(env: dict[str, str] | None = None, faq_path: Path | None = None) -> LiveKefu:
        env = dict(env or {})
        env.setdefault("DATABASE_URL", f"sqlite:///{tmp_path / f'kefu-{len(started)}.sqlite3'}")
        if faq_path is None:
            faq_path = tmp_path / "faq.jsonl"
            faq_path.write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in TEST_FAQ) + "\n")
        k = LiveKefu(env, faq_path)
        started.append(k)
        return k

    yield start
    for k in started:
        k.stop()


@pytest.fixture
def pg_database(pg_url: str) -> Iterator[str]:
    """A fresh, empty PostgreSQL database on the TEST_DATABASE_URL server (dropped afterwards)."""
    import psycopg

    name = f"kefu_test_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    parts = urlsplit(pg_url)
    yield parts._replace(path="/" + name).geturl()
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


class PrivateRedis:
    """A ``redis-server`` of the test's own, on its own port (faults are made here, never on the
    machine's shared Redis): ``kill_clients()`` drops every client connection as a failover does,
    ``restart()`` stops it (nothing persisted: every key and group membership is gone) and starts
    it again on the same port."""

    def __init__(self, tmp: Path) -> None:
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.dir = tmp
        self.proc: subprocess.Popen[bytes] | None = None
        self.start()

    def start(self) -> None:
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
            cwd=self.dir,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 20
        while not self.ping():
            assert time.monotonic() < deadline, "the private redis-server did not start"
            time.sleep(0.05)

    def client(self) -> Any:
        import redis

        return redis.Redis.from_url(self.url, socket_timeout=2)

    def ping(self) -> bool:
        import redis

        try:
            with self.client() as r:
                return bool(r.ping())
        except redis.RedisError:
            return False

    def kill_clients(self) -> int:
        """Close every normal client connection but the caller's: how many were closed."""
        with self.client() as r:
            return int(r.client_kill_filter(_type="normal", skipme=True))

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(10)
            self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[PrivateRedis]:
    if not shutil.which("redis-server"):
        pytest.skip("redis-server is not installed")
    server = PrivateRedis(tmp_path)
    yield server
    server.stop()


@pytest.fixture
def fake_openai() -> Iterator[Any]:
    """The project's OpenAI-compatible streaming test server (tests/fake_openai.py), started per test."""
    sys.path.insert(0, str(ROOT / "tests"))
    from fake_openai import running_fake_openai

    with running_fake_openai() as server:
        yield server


#: The ``remote`` fixture's prices per tier, USD per million tokens (input, cached input, output):
#: the list prices of DeepSeek V3.2, Gemini 2.5 Flash and GPT-4.1 (routing/upstream/catalog.py).
REMOTE_PRICES = {"simple": (0.28, 0.028, 0.42), "medium": (0.30, 0.03, 2.50), "complex": (2.00, 0.50, 8.00)}


@pytest.fixture(autouse=True)
def _models_asked_afresh() -> Iterator[None]:
    """Each test's upstreams are asked for their models afresh (routing.upstream.listing keeps the
    answers per process, keyed by base URL and key: a port reused by another test's fake upstream
    must not answer with the last test's list)."""
    from routing.upstream import listing

    listing.forget()
    yield
    listing.forget()


@pytest.fixture
def remote(settings: Any, fake_openai: Any) -> Any:
    """All tiers pointed at the fake upstream (the ``simple`` tier answers), short timeouts.

    Each tier names its model (``fake-<tier>``, which the fake upstream lists) at the prices the
    tests' costs are worked out from (:data:`REMOTE_PRICES`), each configured on its own
    (``dedicated``, as ``KEFU_<TIER>_MODEL`` makes it) so a failing tier falls back to the next; the
    tier classifier is off (``KEFU_TIER_ROUTING``), so the ``simple`` tier answers first (tests of
    the classifier turn it on). The endpoint's ``GET /models`` was asked, as the server's warm-up
    does at start (a test that changes the list calls ``routing.upstream.listing.forget``)."""
    settings.KEFU_TIERS = {
        tier: replace(cfg, dedicated=True).with_current(
            base_url=fake_openai.base_url,
            api_key="test-key",
            model=f"fake-{tier}",
            price_input_per_mtok=REMOTE_PRICES[tier][0],
            price_cached_input_per_mtok=REMOTE_PRICES[tier][1],
            price_output_per_mtok=REMOTE_PRICES[tier][2],
        )
        for tier, cfg in settings.KEFU_TIERS.items()
    }
    # The first-token budget is shared by the tiers still to try (routing.upstream.resilience): with
    # three tiers the first attempt gets a third. 6 s gives it 2 s, which a loaded machine needs (at
    # 2 s in all, its 0.67 s let the simple tier time out under load and medium answer instead).
    # Tests of a timeout set their own budget.
    settings.KEFU_LLM_FIRST_TOKEN_TIMEOUT_S = 6.0
    settings.KEFU_LLM_TOTAL_TIMEOUT_S = 20.0
    settings.KEFU_TIER_ROUTING = False
    from routing.upstream.tiers import check_tiers

    check_tiers()
    return fake_openai


# Files that take minutes (a Celery worker's 1,000 tasks, two live workers, browsers): they are
# collected first, so that under `make test`'s workers (pytest-xdist, whole files per worker) the
# longest start at once and the short ones fill in after them, not the other way round.
SLOW_FIRST = (
    "tests/routing/test_loop_clients.py",
    "tests/e2e/test_widget_browser.py",
    "tests/chat/test_live_stack.py",
    "tests/bottest/test_bot_test_live.py",
    "tests/chat/test_email_live.py",
    "tests/chat/test_assignment_across_workers.py",
    "tests/e2e/test_console_team_browser.py",
    "tests/e2e/test_console_context_browser.py",
    "tests/e2e/test_attachments_browser.py",
    "tests/e2e/test_console_inbox_browser.py",
    "tests/chat/test_cache_poisoning_live.py",
    "tests/chat/test_identity_crossing_live.py",
    "tests/chat/test_cache_key_config.py",
    "tests/chat/test_serial_across_workers.py",
    "tests/chat/test_summary_live.py",
    "tests/chat/test_graceful_shutdown.py",
    "tests/e2e/test_console_browser.py",
    "tests/chat/test_redis_faults.py",
    "tests/routing/test_gateway_live.py",
)


#: The hang guard of a test that starts servers, workers or a browser in its body, seconds. The
#: suite's 120 s (pyproject.toml) fits an in-process test; a test starting two Daphne processes and
#: a Celery worker on a two-core machine that four test workers share waits for each of them to
#: become ready (every such wait has its own deadline and names what it waited for), and at the
#: start of a run, when four such files start together, that alone took up to 120 s.
LIVE_TIMEOUT_S = 300


#: Files outside ``SLOW_FIRST`` whose tests start servers or workers too.
ALSO_LIVE = (
    "tests/chat/test_console_paging.py",
    "tests/chat/test_dead_worker.py",
    "tests/chat/test_replay_pages.py",
    "tests/chat/test_celery_faults.py",
    "tests/chat/test_local_fanout.py",
    "tests/routing/test_registry.py",
    "tests/routing/test_fake_model.py",
    "tests/test_body_limit.py",
)


def _is_live(path: str) -> bool:
    return (
        path in SLOW_FIRST
        or path in ALSO_LIVE
        or path.startswith("tests/e2e/")
        or path.endswith("_live.py")
        or "_across_workers" in path
    )


def pytest_collection_modifyitems(config: Any, items: list[Any]) -> None:
    """Moves the files of ``SLOW_FIRST`` to the front, in that order; each file keeps its own
    order. A test of a file that starts servers (:func:`_is_live`) without a timeout of its own
    gets :data:`LIVE_TIMEOUT_S`."""
    rank = {name: i for i, name in enumerate(SLOW_FIRST)}

    def path_of(item: Any) -> str:
        return Path(str(item.fspath)).resolve().relative_to(ROOT).as_posix()

    for item in items:
        if _is_live(path_of(item)) and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(LIVE_TIMEOUT_S))
    items.sort(key=lambda item: rank.get(path_of(item), len(SLOW_FIRST)))  # stable sort


_skipped: list[str] = []


def pytest_runtest_logreport(report: Any) -> None:
    if report.skipped:
        _skipped.append(report.nodeid)


def pytest_sessionfinish(session: Any, exitstatus: int) -> None:
    """Under CI (KEFU_FAIL_ON_SKIP=1) a skipped test means a missing service: the run fails."""
    if os.environ.get("KEFU_FAIL_ON_SKIP") == "1" and _skipped and exitstatus == 0:
        print(f"\nKEFU_FAIL_ON_SKIP: {len(_skipped)} test(s) skipped; CI runs every test: {_skipped[:5]}")
        session.exitstatus = 1


@pytest.fixture(scope="session", autouse=True)
def _tier_classifier_trained(django_db_setup: Any, django_db_blocker: Any) -> None:
    """Train the tier classifier once, before any test: on a fresh clone (no memoised embeddings)
    its first training takes seconds, and paying that inside whichever test first routes a remote
    message would eat that test's first-token budget. The server warms it at start-up likewise
    (config/asgi.py)."""
    from routing.decide.tier_classifier import get_classifier

    with django_db_blocker.unblock():
        get_classifier()
        _router_ready()


def _router_ready() -> None:
    """The ASGI app (imported by the tests' sockets) starts the router as a server does: its first
    FAQ load and its warm-up run in the background, and until they end every shopper message
    waits with a ``notice`` frame (tests/chat/test_readiness.py). The suite starts once they
    ended, so that no test's frames depend on the order the tests run in."""
    import config.asgi  # noqa: F401  (starts the router)
    from routing import services as router
    from routing import warmup

    assert warmup.wait(300) != "loading", "the router's warm-up did not end within 300 s"
    deadline = time.monotonic() + 300
    while not router.router_ready():
        assert time.monotonic() < deadline, "the router was not ready within 300 s"
        time.sleep(0.1)


@pytest.fixture
def routing_guards() -> Iterator[None]:
    """Circuit breakers, the upstream rate-limit book and the tier limiters live per process:
    reset them before and after a test that exercises them."""
    from routing.providers import ratelimits
    from routing.upstream import blocks as upstream_blocks
    from routing.upstream import breaker, throttle

    def reset() -> None:
        breaker.reset_breakers()
        ratelimits.book.clear()
        upstream_blocks.forget()
        throttle.reset()

    reset()
    yield
    reset()


@pytest.fixture(autouse=True)
def _fresh_cache_indexes() -> None:
    """The answer cache's per-scope indexes live per process and trust themselves for
    ``KEFU_CACHE_INDEX_REFRESH_MS``; every test starts from a database rolled back, so from none."""
    from cache_layer import vector_index

    vector_index.forget()


@pytest.fixture(autouse=True)
def _fresh_canaries() -> Iterator[None]:
    """The canaries' state (routing.upstream.canary) is kept per process and in the cache for
    ``KEFU_CANARY_REFRESH_S``; every test starts from a database rolled back, so from none."""
    from routing.upstream import canary

    canary.forget()
    yield
    canary.forget()
