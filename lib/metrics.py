"""Prometheus metrics that each kefu process records as it works (``prometheus_client``), next to
the totals ``/metrics`` reads from the database (``ops.views.metrics``).

Recorded here, in seconds as Prometheus' conventions want (names end in ``_seconds``):

- ``kefu_time_to_first_token_seconds{route, tier}`` (histogram): from the shopper's message being
  stored to the first text of its answer, per route (``faq``, ``cache.exact``, ``llm.simple``...)
  and tier (``simple``/``medium``/``complex`` for ``llm.*`` routes, ``none`` otherwise);
- ``kefu_answer_latency_seconds{route, tier}`` (histogram): to the answer's end;
- ``kefu_open_sockets{kind}`` (gauge): shopper and agent sockets open in the process (summed over the live
  processes in multiprocess mode);
- ``kefu_redis_connections{purpose}`` (gauge): the process's open Redis connections per purpose
  (``lib.redis_conn.open_connections``: ``upstream-blocks``, ``stream-buffer``, ``regroup``,
  ``ratelimit-*``, ``exact-store``), read when ``/metrics`` is served and, in a Celery worker,
  after each task; one series per process (label ``pid``) in multiprocess mode, so a process that
  leaks connections stands out. The same names are on the server: ``CLIENT LIST`` shows each
  connection as ``name=kefu-<purpose>``.

**Several worker processes.** Each process keeps its own values; with the environment variable
``PROMETHEUS_MULTIPROC_DIR`` set (to an empty directory, the same for every worker of a host,
emptied before they start) before the processes start, ``prometheus_client`` writes them to files
there and ``/metrics`` in any worker sums them (``prometheus_client.multiprocess``). Without it,
``/metrics`` shows the serving process's own values, plus its process metrics (CPU, memory, open
files), which multiprocess mode cannot aggregate: scrape a node or container exporter for those.
A process that ends gracefully removes its gauge values (:func:`process_ended`); one killed with
``SIGKILL`` leaves its last socket count until the directory is emptied at the next deploy.
"""

from __future__ import annotations

import os

from prometheus_client import Gauge, Histogram

from lib.settings_env import env

#: Bucket upper bounds, seconds: a cache hit or an FAQ answer in tens of milliseconds, a remote
#: model's first token in hundreds, a whole remote answer in seconds.
TTFT_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
LATENCY_BUCKETS_S = (0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)

TIME_TO_FIRST_TOKEN = Histogram(
    "kefu_time_to_first_token_seconds",
    "Time from the shopper's message being stored to the first text of its answer.",
    ["route", "tier"],
    buckets=TTFT_BUCKETS_S,
)
ANSWER_LATENCY = Histogram(
    "kefu_answer_latency_seconds",
    "Time from the shopper's message being stored to the end of its answer.",
    ["route", "tier"],
    buckets=LATENCY_BUCKETS_S,
)
OPEN_SOCKETS = Gauge("kefu_open_sockets", "WebSockets open now, by kind.", ["kind"], multiprocess_mode="livesum")
REDIS_CONNECTIONS = Gauge(
    "kefu_redis_connections",
    "Redis connections this process holds open now, by purpose.",
    ["purpose"],
    multiprocess_mode="liveall",
)


def refresh_redis_connections() -> None:
    """Set ``kefu_redis_connections`` from this process's Redis pools now."""
    from lib.redis_conn import open_connections

    for purpose, count in open_connections().items():
        REDIS_CONNECTIONS.labels(purpose).set(count)


def tier_of(route: str) -> str:
    """The tier label of ``route``: ``"simple"`` for ``"llm.simple"``, ``"none"`` for a route
    that called no remote model."""
    return route.split(".", 1)[1] if route.startswith("llm.") else "none"


def observe_answer(*, route: str, ttft_ms: float | None, latency_ms: float | None) -> None:
    """Record one finished answer (``route``; times in milliseconds, ``None`` when unknown, e.g.
    an answer cut before its first text has no time to first token)."""
    labels = (route or "unknown", tier_of(route or ""))
    if ttft_ms is not None:
        TIME_TO_FIRST_TOKEN.labels(*labels).observe(max(0.0, ttft_ms) / 1000)
    if latency_ms is not None:
        ANSWER_LATENCY.labels(*labels).observe(max(0.0, latency_ms) / 1000)


def multiprocess_dir() -> str:
    """``PROMETHEUS_MULTIPROC_DIR``, or ``""`` when the process keeps its metrics to itself."""
    return env.raw("PROMETHEUS_MULTIPROC_DIR", "")


def exposition() -> bytes:
    """These metrics in Prometheus' text format: summed over every process of the multiprocess
    directory when there is one, else this process's own, with its process and platform metrics."""
    from prometheus_client import REGISTRY, CollectorRegistry, generate_latest, multiprocess

    refresh_redis_connections()
    path = multiprocess_dir()
    if not path:
        return generate_latest(REGISTRY)
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=path)
    return generate_latest(registry)


def process_ended() -> None:
    """Drop this process's live gauge values from the multiprocess directory (a graceful stop)."""
    if multiprocess_dir():
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(os.getpid())
