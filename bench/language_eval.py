"""The shopper's language (lib/text.py): how often each language is told right, and how often an
English store question is taken for another language, across confidence thresholds.

    .venv/bin/python bench/language_eval.py [--shared ../shared] [--limit 0]

Sets:
- ``bench/data/language_questions.tsv``: the team's own short store questions in eleven
  languages (written for kefu, tab-separated ``language<TAB>question``);
- every ``instruction`` of ``bitext/bitext_customer_support_public.csv`` (English, misspelt and
  terse on purpose: "refund $299", "contact agent").

Each question is detected twice: in a conversation whose language is English (a shopper on an
English page) and in one whose language is the question's own (a later turn). Prints one row per
threshold: accuracy on the team's questions per conversation language, the share of Bitext
questions taken for another language, and the detector's time per question.
"""

from __future__ import annotations

import argparse
import csv
import re
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from lib.text import CJK, DEFAULT_LANGUAGES, LanguageDetector

HERE = Path(__file__).resolve().parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shared", default=str(HERE.parent.parent / "shared"))
    parser.add_argument("--limit", type=int, default=0, help="Bitext questions to use (0 = all)")
    args = parser.parse_args()

    team = [tuple(line.split("\t", 1)) for line in (HERE / "data" / "language_questions.tsv").read_text().splitlines()]
    with open(Path(args.shared) / "data" / "bitext" / "bitext_customer_support_public.csv", newline="") as f:
        bitext = [row["instruction"] for row in csv.DictReader(f)]
    if args.limit:
        bitext = bitext[: args.limit]
    print(f"team questions: {len(team)} in {len({lang for lang, _ in team})} languages; Bitext: {len(bitext)} English")
    print()
    print(
        "| min confidence | team, English conversation | team, own-language conversation | Bitext taken for another language | detector time |"
    )
    print("|---:|---:|---:|---:|---:|")
    for threshold in (0.3, 0.4, 0.5, 0.6, 0.7):
        detector = LanguageDetector(DEFAULT_LANGUAGES, min_confidence=threshold)
        detector.warm()
        on_en = sum(detector.detect(q, "en").locale == lang for lang, q in team)
        on_own = sum(detector.detect(q, lang).locale == lang for lang, q in team)
        started = time.perf_counter()
        found = [detector.detect(q, "en") for q in bitext]
        per_q_ms = (time.perf_counter() - started) / len(bitext) * 1000
        wrong = Counter(d.locale for d in found if d.locale != "en")
        print(
            f"| {threshold:.1f} | {on_en}/{len(team)} ({on_en / len(team):.1%}) | {on_own}/{len(team)} "
            f"({on_own / len(team):.1%}) | {sum(wrong.values())}/{len(bitext)} ({sum(wrong.values()) / len(bitext):.2%}) "
            f"{dict(wrong.most_common(4))} | {per_q_ms:.3f} ms a question |"
        )

    # The rule this replaced, side by side: a Chinese character -> zh, a Latin letter -> en.
    def before(text: str, fallback: str) -> str:
        return "zh" if CJK.search(text) else "en" if re.search(r"[A-Za-z]", text) else fallback

    old_en = sum(before(q, "en") == lang for lang, q in team)
    old_own = sum(before(q, lang) == lang for lang, q in team)
    old_wrong = sum(before(q, "en") != "en" for q in bitext)
    print(
        f"| before (script only) | {old_en}/{len(team)} ({old_en / len(team):.1%}) | {old_own}/{len(team)} "
        f"({old_own / len(team):.1%}) | {old_wrong}/{len(bitext)} | - |"
    )
    detector = LanguageDetector(DEFAULT_LANGUAGES)
    misses = [(lang, q, detector.detect(q, "en").locale) for lang, q in team if detector.detect(q, "en").locale != lang]
    print()
    print(f"At the default ({detector.min_confidence}), team questions told wrong in an English conversation:")
    for lang, q, got in misses:
        print(f"  {lang} -> {got}: {q}")


if __name__ == "__main__":
    main()
