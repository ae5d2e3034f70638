"""The same question asked again after a complaint (routing/decide/repeat.py): the cosine threshold
between a question and its rewording, measured on the labelled pairs bench/data/repeat_pairs.jsonl.

    .venv/bin/python bench/repeat_eval.py --split held [--sweep]

The set (written for kefu): pairs of store questions in English, Chinese and five other languages,
``same: true`` when the second rewords the first (a shopper asking again after a thumbs-down) and
``same: false`` when it is another question of the same topic (delivery time against delivery
cost), the hard case. Every other pair is held apart (``split: held``); the threshold was chosen on
the ``tune`` half. Each text is embedded as the router embeds a message (``normalise_text`` of its
first ``ROUTING_MAX_CHARS`` code points, unit rows), so the cosine is a dot product.

Prints, for the shipped threshold (or every threshold of ``--sweep``): missed repeats (share of
rewordings below it) and false repeats (share of other questions at or above it), then the wrong
pairs at the shipped threshold.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

HERE = Path(__file__).resolve().parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--split", choices=("tune", "held", "all"), default="held")
    parser.add_argument("--sweep", action="store_true", help="every threshold from 0.60 to 0.95")
    args = parser.parse_args()

    import django

    django.setup()
    from cache_layer.embeddings import embed_batched
    from routing.decide.repeat import SIMILARITY
    from routing.faq.model import normalise_text
    from routing.types import ROUTING_MAX_CHARS

    rows = [json.loads(line) for line in (HERE / "data" / "repeat_pairs.jsonl").read_text().splitlines()]
    rows = [r for r in rows if args.split == "all" or r["split"] == args.split]
    texts = sorted({t for r in rows for t in (r["a"], r["b"])})
    vectors = dict(zip(texts, embed_batched([normalise_text(t[:ROUTING_MAX_CHARS]) for t in texts]), strict=True))
    scored = [(float(vectors[r["a"]] @ vectors[r["b"]]), r) for r in rows]
    same = [s for s, r in scored if r["same"]]
    other = [s for s, r in scored if not r["same"]]
    print(f"split: {args.split}, {len(same)} rewordings, {len(other)} other questions")
    print("| threshold | missed repeats | false repeats |")
    print("|---:|---:|---:|")
    thresholds = [round(0.60 + 0.01 * i, 2) for i in range(36)] if args.sweep else [SIMILARITY]
    for t in thresholds:
        missed = sum(s < t for s in same)
        false = sum(s >= t for s in other)
        mark = " **(shipped)**" if t == SIMILARITY else ""
        print(
            f"| {t:.2f}{mark} | {missed}/{len(same)} = {missed / len(same):.1%} | "
            f"{false}/{len(other)} = {false / len(other):.1%} |"
        )
    for s, r in sorted(scored, key=lambda x: x[0]):
        if (s >= SIMILARITY) != r["same"]:
            print(f"wrong: {s:.3f} same={r['same']} {r['a']!r} / {r['b']!r}")


if __name__ == "__main__":
    main()
