"""The same question asked again after a complaint (routing/decide/repeat.py): the cosine threshold
between a question and its rewording, measured on the labelled pairs bench/data/repeat_pairs.jsonl.

    .venv/bin/python bench/repeat_eval.py --split held [--sweep]

The set (written for kefu): pairs of store questions in English, Chinese and five other languages,
``same: true`` when the second rewords the first (a shopper asking again after a thumbs-down) and
``same: false`` when it is another question of the same topic (delivery time against delivery
cost), the hard case. Every other pair is held apart (``split: held``); the threshold was chosen on
the ``tune`` half. Each text is embedded as the router embeds a message (``normalise_text`` of its
first ``ROUTING_MAX_CHARS`` code points, unit rows), so the cosine is a dot product.

Two rules are scored: ``embedding`` (the cosine alone) and ``shipped`` (routing.decide.repeat's:
the same FAQ intent when the FAQ model accepts both questions, else the cosine), with the FAQ
model trained on the demo FAQ (routing/demo/faq_demo.jsonl, English and Chinese), each question
matched in its detected language as the router does.

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
    from django.conf import settings

    from cache_layer.embeddings import embed_batched
    from lib.text import detect_locale
    from routing.decide.repeat import SIMILARITY, same_question
    from routing.faq import trainer
    from routing.faq.model import FaqTrainingEntry, normalise_text
    from routing.types import ROUTING_MAX_CHARS

    demo = [json.loads(line) for line in (HERE.parent / "routing/demo/faq_demo.jsonl").read_text().splitlines()]
    training = [
        FaqTrainingEntry(i, r["intent"], r.get("locale", "en"), (r["question"], *r.get("variants", [])))
        for i, r in enumerate(demo, 1)
    ]
    thresholds = (
        settings.KEFU_FAQ_MIN_CONFIDENCE,
        settings.KEFU_FAQ_MIN_SIMILARITY,
        settings.KEFU_FAQ_SINGLE_ENTRY_MIN_SIMILARITY,
        settings.KEFU_SCOPE_THRESHOLD,
    )
    model, _scope = trainer.train_here(training, thresholds)
    faq_locales = {e.locale for e in training}

    rows = [json.loads(line) for line in (HERE / "data" / "repeat_pairs.jsonl").read_text().splitlines()]
    rows = [r for r in rows if args.split == "all" or r["split"] == args.split]
    texts = sorted({t for r in rows for t in (r["a"], r["b"])})
    vectors = dict(zip(texts, embed_batched([normalise_text(t[:ROUTING_MAX_CHARS]) for t in texts]), strict=True))

    def matched(text: str):  # type: ignore[no-untyped-def]
        locale = detect_locale(text, "en")
        return model.match(text, locale=locale) if locale in faq_locales else None

    matches = {t: matched(t) for t in texts}
    same = [r for r in rows if r["same"]]
    other = [r for r in rows if not r["same"]]
    print(f"split: {args.split}, {len(same)} rewordings, {len(other)} other questions")
    print("| rule | threshold | missed repeats | false repeats |")
    print("|---|---:|---:|---:|")
    thresholds_swept = [round(0.60 + 0.01 * i, 2) for i in range(36)] if args.sweep else [SIMILARITY]
    for rule in ("embedding", "shipped"):
        for t in thresholds_swept:

            def says(r: dict, t: float = t, rule: str = rule) -> bool:
                a, b = r["a"], r["b"]
                if rule == "embedding":
                    return float(vectors[a] @ vectors[b]) >= t
                return same_question(vectors[b], vectors[a], matches[b], matches[a], similarity=t)

            missed = sum(not says(r) for r in same)
            false = sum(says(r) for r in other)
            mark = " **(shipped)**" if t == SIMILARITY else ""
            print(
                f"| {rule} | {t:.2f}{mark} | {missed}/{len(same)} = {missed / len(same):.1%} | "
                f"{false}/{len(other)} = {false / len(other):.1%} |"
            )
    for r in rows:
        got = same_question(vectors[r["b"]], vectors[r["a"]], matches[r["b"]], matches[r["a"]])
        if got != r["same"]:
            ma, mb = matches[r["a"]], matches[r["b"]]
            cos = float(vectors[r["a"]] @ vectors[r["b"]])
            intents = f"{ma.intent if ma else '-'} / {mb.intent if mb else '-'}"
            print(f"wrong (shipped): cos {cos:.3f}, intents {intents}, same={r['same']} {r['a']!r} / {r['b']!r}")


if __name__ == "__main__":
    main()
