"""Requests for a person in every language (routing/decide/handoff_intent.py): missed requests and
false handoffs on the labelled set bench/data/handoff_labels.jsonl.

    .venv/bin/python bench/handoff_eval.py --split held

The set (written for kefu before the rules): 20 messages per language of the 11 default
``KEFU_LANGUAGES``, 10 asking for a person and 10 look-alikes that name people, operators, agents
or staff without asking for one ("human skin", "operator manual", "agent of change"). Every other
row is held apart (``split: held``) and never used to tune. Each message's language is detected as
in a conversation whose language is English (a shopper on an English page), as the router does.

Prints per language and overall: missed requests (share of requests not handed off) and false
handoffs (share of look-alikes handed off), then each wrong row.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

HERE = Path(__file__).resolve().parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--split", choices=("tune", "held", "all"), default="held")
    args = parser.parse_args()

    import django

    django.setup()
    from lib.text import detect_locale
    from routing.decide.handoff_intent import person_request

    rows = [json.loads(line) for line in (HERE / "data" / "handoff_labels.jsonl").read_text().splitlines()]
    rows = [r for r in rows if args.split == "all" or r["split"] == args.split]
    counts: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0, 0])  # missed, requests, false, look-alikes
    wrong = []
    for r in rows:
        got = person_request(r["text"], detect_locale(r["text"], "en")) is not None
        c = counts[r["locale"]]
        if r["person"]:
            c[1] += 1
            c[0] += not got
        else:
            c[3] += 1
            c[2] += got
        if got != r["person"]:
            wrong.append(r)
    print(f"split: {args.split}, {len(rows)} messages")
    print("| language | missed requests | false handoffs |")
    print("|---|---:|---:|")
    total = [0, 0, 0, 0]
    for lang, c in counts.items():
        total = [a + b for a, b in zip(total, c)]
        print(f"| {lang} | {c[0]}/{c[1]} | {c[2]}/{c[3]} |")
    print(
        f"| all | {total[0]}/{total[1]} = {total[0] / max(total[1], 1):.1%} "
        f"| {total[2]}/{total[3]} = {total[2] / max(total[3], 1):.1%} |"
    )
    for r in wrong:
        print(f"wrong: {r['locale']} person={r['person']}: {r['text']}")


if __name__ == "__main__":
    main()
