"""The answer cache on words no vocabulary names: the unseen-word pair sets (issue 40).

    .venv/bin/python bench/cache_unseen_eval.py [--sets tune,heldout] [--points 0.84,0.86,...]
        [--show-wrong] [--show-missed N] [--promotion]

For each pair of ``bench/data/cache_tune.jsonl`` / ``cache_heldout.jsonl`` (written by
``bench/make_cache_unseen.py``), in a scope of its own: the first question's answer is stored with
the real ``cache_layer.services.store``, the second is asked with the real ``lookup``; then the
other way round (two lookups a pair). A hit on a ``different`` pair is a wrong hit; the hit rate
is the share of lookups of ``same`` pairs that hit. Run at several values of
``KEFU_CACHE_ALIGN_COSINE`` (the word-alignment rule's cosine; ``off`` switches the rule off: the
rules before it, side by side), the shipped value marked, giving the curve.

``--promotion`` (shipped settings): a lookup that misses is a near miss for verified promotion
(``services.near_miss``); an oracle judge (the pair's label stands in for the model) says SAME for
``same`` pairs, and a SAME verdict is promoted (``cache_layer.promotion.promote``). The next
identical question is asked again: what the promotion recovers, and what it would cost in judge
calls on look-alikes. The held-apart set is evaluated once, at the end, never to choose a value.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

POINTS = [0.80, 0.82, 0.84, 0.86, 0.88, 0.90, 0.92, 1.01]


def load(name: str) -> list[dict]:
    path = ROOT / "bench" / "data" / f"cache_{name}.jsonl"
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def run(rows: list[dict], vec, *, record: list | None = None) -> tuple[Counter, Counter]:
    """Every pair both ways in its own scope: ``(counts, counts by lang.kind)`` with keys
    ``same``, ``same_hit``, ``different``, ``wrong``."""
    from cache_pairs_eval import put

    from cache_layer import services
    from cache_layer.models import CachedAnswer

    total: Counter = Counter()
    by_kind: Counter = Counter()
    services.purge()
    CachedAnswer.objects.all().delete()
    for r in rows:
        for first, second, d in ((r["a"], r["b"], "ab"), (r["b"], r["a"], "ba")):
            scope = f"eval|unseen|{r['id']}|{d}"
            put(first, "answer:" + first, scope, vec)
            hit = services.lookup(question=second, scope=scope, embedding=vec[second])
            key = f"{r['lang']}.{r['kind']}"
            total[r["label"]] += 1
            by_kind[key] += 1
            if hit is not None:
                if r["label"] == "same":
                    total["same_hit"] += 1
                else:
                    total["wrong"] += 1
                by_kind[key + ".hit"] += 1
            if record is not None and (hit is not None) != (r["label"] == "same"):
                record.append((r["label"], r["kind"], first, second, hit.rule if hit else "-"))
    return total, by_kind


def promotion(rows: list[dict], vec) -> dict[str, int]:
    """Shipped settings; a miss is judged by the oracle and, when SAME, promoted; then the same
    question is asked again."""
    from cache_pairs_eval import put

    from cache_layer import promotion as promo
    from cache_layer import services
    from cache_layer.models import CachedAnswer, CacheJudgement

    out: Counter = Counter()
    services.purge()
    CachedAnswer.objects.all().delete()
    CacheJudgement.objects.all().delete()
    for r in rows:
        first, second = r["a"], r["b"]
        scope = f"eval|unseen-promo|{r['id']}"
        put(first, "answer:" + first, scope, vec)
        if services.lookup(question=second, scope=scope, embedding=vec[second]) is not None:
            continue
        out[f"{r['label']}_missed"] += 1
        put(second, "answer:" + second, scope, vec)  # the remote answer, cached as usual
        near = services.near_miss(question=second, scope=scope, embedding=vec[second])
        if near is None:
            continue
        out[f"{r['label']}_judged"] += 1
        if r["label"] != "same":
            continue
        CacheJudgement.objects.create(
            scope=scope,
            entry_id=near.entry_id,
            question=second,
            key_hash=r["id"],
            cached_question=near.question,
            cached_answer="answer:" + first,
            similarity=near.similarity,
            verdict=CacheJudgement.Verdict.SAME,
        )
        promo.promote(entry_id=near.entry_id, question=second, similarity=near.similarity, embedding=vec[second])
        out["promoted"] += 1
    return dict(out)


def speed(rows: list[dict], vec) -> dict[str, float]:
    """p50 / p90 of ``services.lookup`` (vector given, as routing passes it) in ms with the
    alignment off and on, interleaved ask by ask; "on, words new" empties the embedder's LRU
    before each ask, so the words of a substitution are embedded on the lookup path."""
    import numpy as np
    from cache_pairs_eval import put
    from django.test.utils import override_settings

    from cache_layer import services
    from cache_layer.embeddings import get_embedder
    from cache_layer.models import CachedAnswer

    services.purge()
    CachedAnswer.objects.all().delete()
    times: dict[str, list[float]] = {"off": [], "on": [], "on, words new": []}
    lru = getattr(get_embedder(), "_lru", None)
    for r in rows:
        scope = f"eval|unseen-speed|{r['id']}"
        put(r["a"], "answer:" + r["a"], scope, vec)
        for mode in times:
            with override_settings(KEFU_CACHE_ALIGN_COSINE=1.01 if mode == "off" else 0.86):
                if mode == "on, words new" and lru is not None:
                    lru.clear()
                started = time.perf_counter()
                services.lookup(question=r["b"], scope=scope, embedding=vec[r["b"]])
                times[mode].append((time.perf_counter() - started) * 1000)
    out = {}
    for mode, ts in times.items():
        out[f"{mode} p50"] = float(np.percentile(ts, 50))
        out[f"{mode} p90"] = float(np.percentile(ts, 90))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sets", default="tune")
    parser.add_argument("--points", default="")
    parser.add_argument("--show-wrong", action="store_true")
    parser.add_argument("--show-missed", type=int, default=0)
    parser.add_argument("--promotion", action="store_true")
    parser.add_argument("--speed", action="store_true", help="lookup time with the alignment off and on")
    args = parser.parse_args()

    tmp = tempfile.TemporaryDirectory(prefix="kefu-cache-unseen-")
    os.environ["DJANGO_SETTINGS_MODULE"] = "config.settings"
    os.environ["DATABASE_URL"] = f"sqlite:///{tmp.name}/eval.sqlite3"
    os.environ.pop("REDIS_URL", None)
    os.environ["KEFU_CACHE_AUDIT_RATE"] = "0"
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)
    from cache_pairs_eval import vectors
    from django.conf import settings
    from django.test.utils import override_settings

    from cache_layer.audit import wilson_interval
    from cache_layer.config import cache_config

    started = time.perf_counter()
    sets = {name: load(name) for name in args.sets.split(",")}
    texts = {t for rows in sets.values() for r in rows for t in (r["a"], r["b"])}
    vec = vectors(texts)
    shipped = getattr(settings, "KEFU_CACHE_ALIGN_COSINE", None)
    points = [float(p) for p in args.points.split(",")] if args.points else POINTS
    if shipped is None:
        points = [1.01]
    elif shipped not in points:
        points = sorted({*points, shipped})
    print(f"{len(texts)} texts embedded in {time.perf_counter() - started:.0f} s; shipped point {shipped}\n")
    print(
        "| set | align cosine | lookups (same / different) | hits of paraphrases | wrong hits | "
        "upper 95% bound of wrong (per look-alike lookup) | precision |"
    )
    print("|---|---|---:|---:|---:|---:|---:|")
    for name, rows in sets.items():
        for point in points:
            record: list = []
            overrides = {"KEFU_CACHE_ALIGN_COSINE": point} if shipped is not None else {}
            with override_settings(**overrides):
                cache_config.cache_clear()  # type: ignore[attr-defined]
                total, by_kind = run(rows, vec, record=record)
            cache_config.cache_clear()  # type: ignore[attr-defined]
            hits = total["same_hit"] + total["wrong"]
            upper = wilson_interval(total["wrong"], total["different"])[1]
            mark = " **(shipped)**" if point == shipped else ""
            label = "off" if point > 1 else f"{point:.2f}"
            print(
                f"| {name} | {label}{mark} | {total['same']} / {total['different']} | "
                f"{total['same_hit'] / max(1, total['same']):.1%} ({total['same_hit']}) | {total['wrong']} | "
                f"{upper:.2%} | {(total['same_hit'] / hits if hits else 1):.1%} |"
            )
            if point == shipped or shipped is None:
                kinds = sorted({k.rsplit(".hit", 1)[0] for k in by_kind})
                detail = ", ".join(f"{k} {by_kind[k + '.hit']}/{by_kind[k]}" for k in kinds)
                print(f"|   | hits by kind: {detail} | | | | | |")
                if args.show_wrong:
                    for lab, kind, first, second, rule in record:
                        if lab == "different":
                            print(f"|   | wrong ({kind}, {rule}): {first!r} -> {second!r} | | | | | |")
                missed = [x for x in record if x[0] == "same"][: args.show_missed]
                for _lab, kind, first, second, _rule in missed:
                    print(f"|   | missed ({kind}): {first!r} -> {second!r} | | | | | |")
        if args.promotion:
            p = promotion(rows, vec)
            print(
                f"\nVerified promotion, {name}, oracle judge: {p.get('same_missed', 0)} paraphrases missed, "
                f"{p.get('same_judged', 0)} judged, {p.get('promoted', 0)} promoted (their next identical "
                f"question hits); {p.get('different_missed', 0)} look-alikes missed, "
                f"{p.get('different_judged', 0)} judged (refused by the judge)."
            )
    if args.speed:
        for name, rows in sets.items():
            figures = speed(rows, vec)
            print(f"\nLookup time, {name} pairs (ms): " + ", ".join(f"{k} {v:.2f}" for k, v in figures.items()))
    print(f"\n{time.strftime('%Y-%m-%d')}, {time.perf_counter() - started:.0f} s")
    tmp.cleanup()


if __name__ == "__main__":
    main()
