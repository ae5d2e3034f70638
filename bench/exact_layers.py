"""What each layer of the exact answer cache saves: a repeated question answered from this
process's memory (the hot layer, ``cache_layer.hot``), from Redis (the exact store, each hit
confirmed against its row by the UPDATE that records it), or from the database alone.

Set-up (private to the run, removed afterwards): a fresh PostgreSQL database on
``TEST_DATABASE_URL``'s server, migrated; ``--entries`` (1,000) answers stored in one scope through
``services.store``; the Redis at ``--redis-url`` (default ``REDIS_URL``, else 127.0.0.1:6379)
under a key prefix of the run's own.

Each of ``--lookups`` (2,000) rounds asks one stored question again (random, in lower case) once
per layer, the three interleaved so that the machine's noise falls on all alike, through
``services.lookup`` as routing calls it. Per layer: wall time and this thread's CPU time per
lookup, p50 / p99 (ms), and the mean. Layers:

- ``hot``: the hot layer on (``KEFU_CACHE_HOT_MAX_ENTRIES``), every question hot after a
  warm-up; its hits are counted in memory and written every 2 s;
- ``redis``: the hot layer off: a Redis GET, then the UPDATE that confirms and counts the hit;
- ``database``: an exact store that always misses: the row's SELECT, its UPDATE, and the refill
  (a no-op here).

    .venv/bin/python bench/exact_layers.py
    .venv/bin/python bench/exact_layers.py --entries 10000 --lookups 5000

Percentiles are numpy's (linear interpolation).
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
import uuid
from pathlib import Path
from urllib.parse import urlsplit

import numpy as np
import psycopg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


class MissingStore:
    """An exact store that holds nothing: every exact hit comes from the database."""

    name = "missing"

    def get(self, scope: str, key_hash: str) -> None:
        return None

    def set(self, *args: object) -> None:
        pass

    def delete(self, keys: object) -> int:
        return 0

    def purge(self, scope: str | None = None) -> int:
        return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--entries", type=int, default=1000, help="at most 1,320 (distinct questions)")
    parser.add_argument("--lookups", type=int, default=2000)
    parser.add_argument("--redis-url", default=os.environ.get("REDIS_URL") or "redis://127.0.0.1:6379/0")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)

    admin = os.environ.get("TEST_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres")
    name = f"kefu_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin, autocommit=True) as db:
        db.execute(f'CREATE DATABASE "{name}"')
    os.environ["DATABASE_URL"] = urlsplit(admin)._replace(path="/" + name).geturl()
    os.environ["REDIS_URL"] = args.redis_url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    os.environ["KEFU_NO_WARMUP"] = "1"
    try:
        return run(args)
    finally:
        from django.db import connections

        connections.close_all()
        with psycopg.connect(admin, autocommit=True) as db:
            db.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def run(args: argparse.Namespace) -> int:
    import django

    django.setup()
    from django.conf import settings
    from django.core.management import call_command

    from cache_layer import hot as hot_module
    from cache_layer import services, vector_index
    from cache_layer.config import cache_config
    from cache_layer.exact_store import RedisExactStore, set_exact_store

    call_command("migrate", verbosity=0)
    rng = random.Random(args.seed)
    scope = services.scope_key(store="bench", locale="en", tier="simple", faq_version="1", prompt_version="v1")
    colours = ["red", "blue", "green", "black", "white", "grey", "walnut", "oak", "brass", "linen", "velvet", "pine"]
    things = ["lamp", "table", "sofa cover", "desk", "vase", "armchair", "cushion", "bookshelf", "rug", "mirror"]
    places = ["Canada", "Mexico", "Japan", "Chile", "Norway", "Kenya", "Peru", "Spain", "Italy", "Korea", "Ghana"]
    combos = [(c, t, p) for c in colours for t in things for p in places]
    rng.shuffle(combos)
    questions = [f"Does the {c} {t} ship to {p}?" for c, t, p in combos[: args.entries]]
    redis_store = RedisExactStore(args.redis_url, prefix=f"kefu-bench:{uuid.uuid4().hex[:8]}")
    set_exact_store(redis_store)
    for i, q in enumerate(questions):
        services.store(
            question=q, answer=f"Yes, item {i} ships there.", scope=scope, embedding=None, route="llm.simple",
            model="gpt-bench", grounded_on=[], prompt_version="v1", cut=False, locale="en",
        )  # fmt: skip

    def configure(layer: str) -> None:
        settings.KEFU_CACHE_HOT_MAX_ENTRIES = 100_000 if layer == "hot" else 0
        cache_config.cache_clear()
        set_exact_store(MissingStore() if layer == "database" else redis_store)  # type: ignore[arg-type]

    def ask(q: str) -> tuple[float, float]:
        w0, c0 = time.perf_counter(), time.thread_time()
        hit = services.lookup(question=q.lower(), scope=scope, embedding=None)
        w1, c1 = time.perf_counter(), time.thread_time()
        if hit is None or hit.route != "cache.exact":
            raise RuntimeError(f"expected an exact hit for {q!r}")
        return (w1 - w0) * 1000, (c1 - c0) * 1000

    layers = ["hot", "redis", "database"]
    configure("hot")
    hot = hot_module.get_hot_layer()
    assert hot is not None
    deadline = time.monotonic() + 10
    while not hot.live() and time.monotonic() < deadline:
        time.sleep(0.01)
    for _ in range(3):  # warm every layer (the hot layer refuses puts racing the store's own announcements)
        for q in questions:
            for layer in layers:
                configure(layer)
                ask(q)
    configure("hot")
    print(f"hot layer holds {len(hot)} of {len(questions)} questions after the warm-up")
    vector_index.refresh_if_due()
    wall: dict[str, list[float]] = {k: [] for k in layers}
    cpu: dict[str, list[float]] = {k: [] for k in layers}
    for _ in range(args.lookups):
        q = rng.choice(questions)
        order = layers[:]
        rng.shuffle(order)
        for layer in order:
            configure(layer)
            w, c = ask(q)
            wall[layer].append(w)
            cpu[layer].append(c)
    print(f"{args.lookups} repeated questions per layer, {args.entries} entries, PostgreSQL + Redis; ms")
    print("| layer | wall p50 / p99 | CPU p50 / p99 | CPU mean | CPU vs database |")
    print("|---|---:|---:|---:|---:|")
    base = float(np.mean(cpu["database"]))
    for layer in layers:
        w, c = np.asarray(wall[layer]), np.asarray(cpu[layer])
        print(
            f"| {layer} | {np.percentile(w, 50):.3f} / {np.percentile(w, 99):.3f} "
            f"| {np.percentile(c, 50):.3f} / {np.percentile(c, 99):.3f} | {c.mean():.3f} | {c.mean() / base:.2f}x |"
        )
    hot_module.reset_hot_layer()
    set_exact_store(None)
    redis_store.purge()
    redis_store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
