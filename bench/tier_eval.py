"""Benchmark of the tier classifier (``routing/decide/tier_classifier.py``): accuracy, and the cost it implies.

Run from the repository root::

    .venv/bin/python bench/tier_eval.py [--shared ../shared] [--bitext 600] [--sweep]

1. **Accuracy on kefu's own labelled set** (``routing/demo/tier_labels.jsonl``). The held-out
   split is every row whose SHA-256 of the text is 0 mod 5 (about 20 %, fixed). The model is
   trained on the other rows only. The regularisation (``--sweep``) and the low-confidence rule
   (cut and policy) are chosen on 5-fold out-of-fold predictions over the *training* rows, never
   on the held-out ones; the held-out table is the figure to quote (accuracy, confusion matrix,
   per locale). Rules are left out of this part: it measures the learned model.

2. **What real shopper traffic would get** (no labels): the route and tier shares of the
   Bitext customer-service questions (``faq_eval_public.jsonl`` plus ``--bitext`` other public
   rows, every k-th) and of CLINC150 ``val`` questions of the banking domain, through the same
   steps as ``routing.decide.strategy.decide`` (without the answer cache): keyword rules and requests for
   a person -> ``handoff``; the FAQ model trained on the Bitext seed (``faq_seed.jsonl``) ->
   ``faq``; small talk or the scope classifier -> ``decline``; else the tier classifier (all three
   tiers routable).

3. **Cost**, in USD per 1,000 messages, at the tier prices of ``settings.KEFU_TIERS`` (defaults:
   list prices, USD per million tokens, input / output: simple 0.28 / 0.42, medium 0.30 / 2.50,
   complex 2.00 / 8.00; no cached input). Prompt tokens are *counted* (``count_tokens``, o200k)
   on the prompt kefu would send (``routing.prompt.build.build_messages``: system prompt + the 3
   closest FAQ entries + the message, no history); completion tokens are an assumption,
   ``--completion-tokens`` (default 150: the system prompt asks for at most 5 sentences).
   Compared: kefu (FAQ, declines and handoffs free; remote-bound messages at their tier), the
   same remote-bound messages all at ``complex``, and every message at ``complex``.

Data rows are read from ``--shared`` at run time and never written anywhere. Embeddings are
memoised by the embedder under ``.cache/embeddings`` (the first run embeds ~1,500 texts, ~1 min
on 2 cores).
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import hashlib
import json
import os
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

import django  # noqa: E402

django.setup()

from django.conf import settings  # noqa: E402

from routing.decide import tier_classifier as tc  # noqa: E402
from routing.decide.tier_classifier import TIERS, TierClassifier, load_labels, load_rules, match_rule  # noqa: E402

#: Low-confidence policies compared: what a message whose top-tier probability is under the cut
#: gets. ``top``: the top tier anyway; ``upper``: the more expensive of the two most probable;
#: ``medium``: always medium.
POLICIES = ("top", "upper", "medium")
CUTS = (0.0, 0.4, 0.5, 0.6, 0.7, 0.8)
#: Selection rule for the low-confidence rule (on out-of-fold predictions of the training rows):
#: among the (policy, cut) pairs that send at most ``MAX_COMPLEX_TO_SIMPLE`` of ``complex``
#: messages to ``simple`` and cost at most ``MAX_COST_INCREASE`` more than always taking the top
#: tier, the one that under-routes (answers below the label: the quality risk) the fewest
#: messages; ties -> the cheapest. An over-routed message only costs money; an under-routed one
#: may cost the shopper a wrong or shallow answer.
MAX_COMPLEX_TO_SIMPLE = 0.05
MAX_COST_INCREASE = 0.05


def held_out(text: str) -> bool:
    """The fixed held-out split: SHA-256 of the text is 0 mod 5."""
    return int(hashlib.sha256(text.encode()).hexdigest(), 16) % 5 == 0


def apply_policy(p: np.ndarray, policy: str, cut: float) -> np.ndarray:
    """Tier indices for probability rows ``p`` ``(n, 3)`` under a low-confidence policy."""
    order = np.argsort(-p, axis=1, kind="stable")
    top, second = order[:, 0], order[:, 1]
    low = p[np.arange(len(p)), top] < cut
    out = top.copy()
    if policy == "upper":
        out[low] = np.maximum(top, second)[low]
    elif policy == "medium":
        out[low] = 1
    return out


def tier_cost_usd(tier: str, prompt_tokens: float, completion_tokens: float) -> float:
    """USD of one call at ``settings.KEFU_TIERS`` list prices (no cached input)."""
    t = settings.KEFU_TIERS[tier].current
    return (prompt_tokens * t.price_input_per_mtok + completion_tokens * t.price_output_per_mtok) / 1e6


def oof_probabilities(v: np.ndarray, texts: Sequence[str], y: np.ndarray, c: float, folds: int = 5) -> np.ndarray:
    """Out-of-fold P(tier) ``(n, 3)`` with stratified ``folds`` (seed 0)."""
    from sklearn.model_selection import StratifiedKFold

    p = np.zeros((len(y), len(TIERS)))
    for tr, te in StratifiedKFold(folds, shuffle=True, random_state=0).split(v, y):
        m = TierClassifier.train(None, rules=(), labels=[(texts[i], TIERS[y[i]]) for i in tr], vectors=v[tr], c=c)  # type: ignore[arg-type]
        p[te] = m.probabilities(v[te], [texts[i] for i in te])
    return p


def confusion(y: np.ndarray, pred: np.ndarray) -> str:
    lines = ["| label \\ chosen | simple | medium | complex |", "|---|---:|---:|---:|"]
    for i, name in enumerate(TIERS):
        row = [int(((y == i) & (pred == j)).sum()) for j in range(len(TIERS))]
        lines.append(f"| {name} ({int((y == i).sum())}) | " + " | ".join(map(str, row)) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shared", type=Path, default=ROOT.parent / "shared")
    ap.add_argument("--bitext", type=int, default=600, help="other Bitext public rows (every k-th)")
    ap.add_argument("--completion-tokens", type=int, default=150)
    ap.add_argument("--sweep", action="store_true", help="also sweep the regularisation C")
    args = ap.parse_args(argv)

    from cache_layer.embeddings import get_embedder
    from routing.faq.model import normalise_text

    emb = get_embedder()
    print(
        f"# Tier classifier benchmark\n\n`{' '.join(['.venv/bin/python', 'bench/tier_eval.py', *sys.argv[1:]])}` — "
        f"{dt.date.today()}, {os.cpu_count()} CPUs\n"
    )

    # --- 1. labelled set -----------------------------------------------------------------------
    rows = load_labels()
    texts = [t for t, _, _ in rows]
    y = np.array([TIERS.index(t) for _, t, _ in rows])
    loc = np.array([lc for _, _, lc in rows])
    v = np.asarray(emb.embed([normalise_text(t) for t in texts]), dtype=np.float32)
    test = np.array([held_out(t) for t in texts])
    tr = np.flatnonzero(~test)
    print(
        f"Labelled set: {len(rows)} messages ({dict(Counter(t for _, t, _ in rows))}); "
        f"training split {len(tr)}, held out {int(test.sum())}.\n"
    )
    tr_texts = [texts[i] for i in tr]

    if args.sweep:
        print("| C | out-of-fold accuracy (top tier) |\n|---:|---:|")
        for c in (1.0, 3.0, 10.0, 30.0, 100.0):
            p = oof_probabilities(v[tr], tr_texts, y[tr], c)
            print(f"| {c:g} | {(p.argmax(1) == y[tr]).mean():.1%} |")
        print()

    p_oof = oof_probabilities(v[tr], tr_texts, y[tr], tc.DEFAULT_C)
    typical = tier_cost_usd  # same token counts for every message of the labelled set
    rows_out = []
    for policy in POLICIES:
        for cut in CUTS:
            pred = apply_policy(p_oof, policy, cut)
            yt = y[tr]
            under = int((pred < yt).sum())
            c2s = float(((yt == 2) & (pred == 0)).sum() / max(1, (yt == 2).sum()))
            cost = sum(typical(TIERS[k], 650, args.completion_tokens) for k in pred) * 1000 / len(pred)
            rows_out.append((policy, cut, float((pred == yt).mean()), under, c2s, cost))
    base_cost = next(r[5] for r in rows_out if r[0] == "top")
    ok = [r for r in rows_out if r[4] <= MAX_COMPLEX_TO_SIMPLE and r[5] <= base_cost * (1 + MAX_COST_INCREASE)]
    best = min(ok, key=lambda r: (r[3], round(r[5], 6), -r[2]))
    print(
        "Low-confidence rule, 5-fold out-of-fold on the training split (cost: 650 prompt + "
        f"{args.completion_tokens} completion tokens a message):\n"
    )
    print("| policy | cut | accuracy | under-routed | complex→simple | USD / 1k msgs |\n|---|---:|---:|---:|---:|---:|")
    for r in rows_out:
        mark = " ← chosen" if r is best else ""
        print(f"| {r[0]} | {r[1]:.1f} | {r[2]:.1%} | {r[3]} | {r[4]:.1%} | {r[5]:.3f}{mark} |")
    print(
        f"\nRule: complex→simple ≤ {MAX_COMPLEX_TO_SIMPLE:.0%} and cost ≤ {MAX_COST_INCREASE:.0%} above `top`; "
        f"then the fewest under-routed, then the cheapest. Chosen: `{best[0]}` at {best[1]:.1f}; shipped: "
        f"`upper` at {tc.DEFAULT_MIN_CONFIDENCE} (`KEFU_TIER_MIN_CONFIDENCE`)"
        + (
            "."
            if (best[0], best[1]) == ("upper", tc.DEFAULT_MIN_CONFIDENCE)
            else " — DIFFERENT: update the classifier."
        )
        + "\n"
    )

    model = TierClassifier.train(
        emb,
        rules=(),
        labels=[(texts[i], TIERS[y[i]]) for i in tr],
        vectors=v[tr],
        min_confidence=tc.DEFAULT_MIN_CONFIDENCE,
    )
    te = np.flatnonzero(test)
    p_te = model.probabilities(v[te], [texts[i] for i in te])
    pred = np.array([TIERS.index(model.decide_from_probabilities(p).tier) for p in p_te])
    yt = y[te]
    print(
        f"**Held-out split** ({len(te)} messages, shipped rule): accuracy {(pred == yt).mean():.1%} "
        f"(top tier alone {(p_te.argmax(1) == yt).mean():.1%}); under-routed {int((pred < yt).sum())}, "
        f"over-routed {int((pred > yt).sum())}.\n"
    )
    print(confusion(yt, pred))
    for lc in ("en", "zh"):
        m = loc[te] == lc
        print(f"\n{lc}: {m.sum()} messages, accuracy {(pred[m] == yt[m]).mean():.1%}")
    print()

    # --- 2. real traffic, unlabelled -----------------------------------------------------------
    data = args.shared / "data"
    ev = [json.loads(line)["text"] for line in (data / "bitext" / "faq_eval_public.jsonl").open(encoding="utf-8")]
    seed = [json.loads(line) for line in (data / "bitext" / "faq_seed.jsonl").open(encoding="utf-8")]
    taken = set(ev) | {s["question"] for s in seed} | {q for s in seed for q in s.get("variants", [])}
    with (data / "bitext" / "bitext_customer_support_public.csv").open(encoding="utf-8", newline="") as f:
        rest = list(dict.fromkeys(r["instruction"] for r in csv.DictReader(f) if r["instruction"] not in taken))
    extra = rest[:: max(1, len(rest) // args.bitext)][: args.bitext] if args.bitext else []
    clinc = json.loads((data / "clinc150" / "data_full_public.json").read_text(encoding="utf-8"))
    banking = set(json.loads((data / "clinc150" / "domains.json").read_text(encoding="utf-8"))["banking"])
    bank_q = [q for q, intent in clinc["val"] if intent in banking]
    sets = {"Bitext faq_eval_public": ev, f"Bitext other rows ({len(extra)})": extra, "CLINC150 banking (val)": bank_q}

    from lib.text import detect_locale
    from lib.tokens import count_tokens
    from routing.decide.replies import small_talk_reply, wants_human
    from routing.faq.model import FaqModel, FaqTrainingEntry
    from routing.faq.scope import ScopeClassifier
    from routing.prompt import build as prompt
    from routing.types import ROUTING_MAX_CHARS

    entries = [
        FaqTrainingEntry(i, s["intent"], "en", (s["question"], *s.get("variants", []))) for i, s in enumerate(seed, 1)
    ]
    faq = FaqModel.train(
        entries,
        emb,
        min_confidence=settings.KEFU_FAQ_MIN_CONFIDENCE,
        min_similarity=settings.KEFU_FAQ_MIN_SIMILARITY,
        single_entry_min_similarity=settings.KEFU_FAQ_SINGLE_ENTRY_MIN_SIMILARITY,
    )
    scope = ScopeClassifier.train(
        emb, extra_in_scope=[p for e in entries for p in e.phrasings], threshold=settings.KEFU_SCOPE_THRESHOLD
    )
    full = TierClassifier.train(
        emb, rules=load_rules(settings.KEFU_TIER_RULES_PATH), min_confidence=settings.KEFU_TIER_MIN_CONFIDENCE
    )  # as shipped: every row
    by_id = {i: s for i, s in enumerate(seed, 1)}
    model_name = settings.KEFU_TIERS["complex"].current.model
    comp = args.completion_tokens

    print(
        "Route and tier shares on real questions (no labels), and cost per 1,000 messages "
        f"(prompt tokens counted on kefu's prompt, {comp} completion tokens assumed):\n"
    )
    print(
        "| set | n | faq | decline | handoff | llm.simple | llm.medium | llm.complex | prompt tokens (mean) "
        "| kefu USD/1k | remote-bound all complex | every message complex | kefu / every-complex |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, qs in sets.items():
        vecs = np.asarray(emb.embed([normalise_text(q[:ROUTING_MAX_CHARS]) for q in qs]), dtype=np.float32)
        routes: Counter[str] = Counter()
        kefu = remote_complex = every_complex = 0.0
        prompts = []
        for q, vec in zip(qs, vecs):
            locale = detect_locale(q)
            grounding = [(by_id[e]["question"], by_id[e]["answer"]) for e in faq.top_entries(q, k=3, locale=locale)]
            n_prompt = count_tokens(
                prompt.build_messages(grounding=grounding, history=[], text=q, locale=locale), model_name
            )
            prompts.append(n_prompt)
            every_complex += tier_cost_usd("complex", n_prompt, comp)
            rule = match_rule(q, full.rules)
            if wants_human(q) or (rule is not None and rule.action == tc.HANDOFF):
                route = "handoff"
            elif faq.match(q, locale=locale).accepted:
                route = "faq"
            elif small_talk_reply(q, locale) is not None or scope.classify_vector(vec, text=q).out_of_scope:
                route = "decline"
            else:
                tier = full.classify(q, vec).tier
                route = f"llm.{tier}"
                kefu += tier_cost_usd(tier, n_prompt, comp)
                remote_complex += tier_cost_usd("complex", n_prompt, comp)
            routes[route] += 1
        n = len(qs)
        share = " | ".join(
            f"{routes[r] / n:.1%}" for r in ("faq", "decline", "handoff", "llm.simple", "llm.medium", "llm.complex")
        )
        k = 1000 / n
        print(
            f"| {name} | {n} | {share} | {np.mean(prompts):.0f} | {kefu * k:.4f} | {remote_complex * k:.4f} | "
            f"{every_complex * k:.4f} | {kefu / every_complex:.1%} |"
        )
    prices = ", ".join(
        f"{t} {settings.KEFU_TIERS[t].current.price_input_per_mtok} / {settings.KEFU_TIERS[t].current.price_output_per_mtok}"
        for t in TIERS
    )
    print(f"\nPrices (USD per million tokens, input / output): {prices}.")


if __name__ == "__main__":
    main()
