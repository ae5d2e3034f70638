"""What masking personal data costs a message (routing/prompt/privacy.py), beside what embedding the
same message costs (the router embeds every new message anyway), in one process, interleaved.

Messages: ``--messages`` (1,000) Bitext shopper messages from the team's shared data (``--data``),
as written (their order numbers included), and the same messages with a contact detail added by
this bench (a phone number, an e-mail address, a card number or a street address, generated here,
one in four each). Per message and for a 10-turn context (the message and the nine before it, as a
remote prompt masks them): ``Vault.mask`` wall time, p50 / p99 (ms); and the e5 embedding of the
message alone (the FAQ model's, batch of one) as the baseline.

    .venv/bin/python bench/masking_cost.py
    .venv/bin/python bench/masking_cost.py --messages 3000 --regions CN,US,GB,DE

Percentiles are numpy's (linear interpolation).
"""

from __future__ import annotations

import argparse
import csv
import os
import random
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def contact(rng: random.Random, i: int) -> str:
    """A made-up contact detail, of the kind ``i % 4`` picks."""
    kind = i % 4
    if kind == 0:
        return f"call me on 1{rng.choice('3589')}{rng.randrange(10**8, 10**9)}"
    if kind == 1:
        return f"mail me at shopper{rng.randrange(10**4)}@example.com"
    if kind == 2:
        return "my card is 4111 1111 1111 1111"
    return f"send it to {rng.randrange(1, 400)} Station Road"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data")
    parser.add_argument("--messages", type=int, default=1000)
    parser.add_argument("--regions", default="CN,US,GB")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    os.environ["KEFU_PHONE_REGIONS"] = args.regions
    os.environ.setdefault("KEFU_NO_WARMUP", "1")
    import django

    django.setup()
    from cache_layer.embeddings import get_embedder
    from routing.prompt.privacy import Vault

    rng = random.Random(args.seed)
    with (args.data / "bitext" / "bitext_customer_support_public.csv").open(encoding="utf-8") as f:
        rows = [r["instruction"] for r in csv.DictReader(f)]
    plain = rng.sample(rows, args.messages)
    with_contact = [f"{m}, {contact(rng, i)}" for i, m in enumerate(plain)]
    embedder = get_embedder()
    embedder.embed(["warm up the model"])
    for m in plain[:20]:
        Vault().mask(m)

    def timed(fn) -> float:
        start = time.perf_counter()
        fn()
        return (time.perf_counter() - start) * 1000

    results: dict[str, list[float]] = {k: [] for k in ("plain", "contact", "context", "embed")}
    found = 0
    for i in range(args.messages):
        results["plain"].append(timed(lambda: Vault().mask(plain[i])))
        v = Vault()
        results["contact"].append(timed(lambda: v.mask(with_contact[i])))
        found += bool(v.tokens)
        window = with_contact[max(0, i - 9) : i + 1]
        results["context"].append(timed(lambda: [Vault().mask(t) for t in window]))
        # A text of its own each time (the embedder remembers the texts it saw).
        results["embed"].append(timed(lambda: embedder.embed([f"{plain[i].lower()} ({i})"])))
    base = float(np.percentile(results["embed"], 50))
    print(f"{args.messages} Bitext messages, phone regions {args.regions}; {found} of the contact details masked\n")
    print("| what | p50 / p99 (ms) | p50 vs the embedding |")
    print("|---|---:|---:|")
    labels = {
        "plain": "mask a message as written",
        "contact": "mask a message with a contact detail",
        "context": "mask a 10-turn context (a remote prompt)",
        "embed": "embed the message (baseline)",
    }
    for key, label in labels.items():
        p50, p99 = np.percentile(results[key], [50, 99])
        print(f"| {label} | {p50:.3f} / {p99:.3f} | {p50 / base:.2f}x |")


if __name__ == "__main__":
    main()
