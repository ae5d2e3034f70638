"""What grounding a remote answer on the catalog adds to its time to first token (issue 36, item 3).

Two parts of kefu's path change for a message that names catalog products
(``routing.products.grounding``), both measured here with the real code and no server:

- **before the request**: finding the products the message names (the catalog index, in memory),
  reading their facts (two indexed queries a product, in a worker thread as the router does) and
  building the prompt with them (``build_prompt(products=...)``, tokens counted), against the same
  prompt built without them. This is added to every grounded answer's time to first token.
- **while streaming**: the figure guard holds text back only while a price or stock figure is
  being written. A *normal* answer (one that opens with words) releases its first piece at once;
  one that opens with a figure ("$129 in brass...") holds its first piece until the words after
  the figure show what it is. Simulated with answers streamed word by word ``--token-ms`` apart
  (the test upstream's pacing): added TTFT = the time of the first release minus the time of the
  first piece, plus the guard's own CPU time (measured).

The catalog is loaded into a temporary SQLite database (the demo catalog by default); the figures
for PostgreSQL differ by its query round trips (two a product).

    .venv/bin/python bench/grounding_ttft.py [--catalog store/demo/products.jsonl] [--rounds 200] [--token-ms 20]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

QUESTIONS = [
    ("Would the Ember Table Lamp suit a small bedroom?", "en"),
    ("Which is brighter, the Ember Floor Lamp or the Paper Moon Pendant?", "en"),
    ("Can I use the Loom Wool Throw on a sofa every day?", "en"),
    ("余烬台灯适合放在卧室吗？", "zh"),
    ("纸月吊灯可以装在浴室吗？", "zh"),
]
NORMAL = [
    "Yes, the Ember Table Lamp suits a small bedroom: it is 42 cm tall and dims on the cord. It costs $129.",
    "It would: the brushed brass and linen shade give a warm light, and 14 are in stock.",
    "适合。它高 42 厘米，线上带调光器，售价 $129。",
]
FIGURE_FIRST = [
    "$129 in brass, and it dims on the cord.",
    "14 are in stock in brass; the black one is sold out.",
    "3 left in brass, so order soon if you like it.",
]


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--catalog", default=str(ROOT / "store" / "demo" / "products.jsonl"))
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--token-ms", type=float, default=20.0)
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="kefu-grounding-bench-")
    os.environ["DATABASE_URL"] = f"sqlite:///{tmp}/db.sqlite3"
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    os.environ["KEFU_PRODUCTS_POLL_S"] = "3600"
    import django

    django.setup()
    from asgiref.sync import sync_to_async
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    from routing.products import grounding
    from routing.products.index import catalog
    from routing.prompt.build import build_prompt
    from routing.upstream.tiers import tier_model_or
    from routing.upstream.tokens import warm_tokenizer
    from store.catalog import import_catalog

    assert not import_catalog(Path(args.catalog)).errors
    catalog.reload()
    warm_tokenizer(tier_model_or("simple", "gpt-4o"))

    async def grounded(text: str, locale: str) -> tuple[float, int, int]:
        t0 = time.perf_counter()
        skus = grounding.skus_about(text)
        views = await sync_to_async(grounding.product_views, thread_sensitive=False)(skus, locale) if skus else []
        built = build_prompt(grounding=[], history=[], text=text, locale=locale, products=grounding.facts_text(views))
        t1 = time.perf_counter()
        build_prompt(grounding=[], history=[], text=text, locale=locale)
        t2 = time.perf_counter()
        return ((t1 - t0) - (t2 - t1)) * 1000, built.catalog_products, built.catalog_tokens

    async def before() -> tuple[list[float], list[int], list[int]]:
        added, counts, tokens = [], [], []
        for _ in range(args.rounds):
            for text, locale in QUESTIONS:
                ms, n, tok = await grounded(text, locale)
                added.append(ms)
                counts.append(n)
                tokens.append(tok)
        return added, counts, tokens

    added, counts, tokens = asyncio.run(before())
    skus = [grounding.skus_about(t) for t, _ in QUESTIONS]
    views = [v for s, (_, loc) in zip(skus, QUESTIONS, strict=True) for v in grounding.product_views(s, loc)]
    figures = grounding.Figures.of(views)

    def streamed(answer: str) -> tuple[float, float]:
        """(added TTFT in ms: held time + guard CPU, guard CPU for the whole answer in ms)."""
        pieces = re.findall(r"\S+\s*", answer)
        guard = grounding.FigureGuard(figures)
        cpu = 0.0
        first_release: float | None = None
        for i, piece in enumerate(pieces):
            t0 = time.perf_counter()
            out, wrong = guard.feed(piece)
            cpu += time.perf_counter() - t0
            assert wrong is None, (answer, wrong)
            if out and first_release is None:
                first_release = i * args.token_ms + cpu * 1000
        t0 = time.perf_counter()
        out, wrong = guard.end()
        cpu += time.perf_counter() - t0
        if first_release is None:
            first_release = len(pieces) * args.token_ms + cpu * 1000
        return first_release, cpu * 1000

    print(f"catalog {Path(args.catalog).name}, {len(QUESTIONS)} questions x {args.rounds} rounds, SQLite")
    print(
        f"before the request (find + read + prompt with facts - prompt without): "
        f"p50 {statistics.median(added):.2f} ms, p99 {pct(added, 0.99):.2f} ms; "
        f"products a prompt {min(counts)}-{max(counts)}, catalog tokens {min(tokens)}-{max(tokens)}"
    )
    for name, answers in (("normal answer (opens with words)", NORMAL), ("answer opening with a figure", FIGURE_FIRST)):
        runs = [streamed(a) for _ in range(args.rounds) for a in answers]
        ttft = [r[0] for r in runs]
        cpu = [r[1] for r in runs]
        print(
            f"stream, {name}, {args.token_ms:g} ms a token: added TTFT p50 {statistics.median(ttft):.3f} ms, "
            f"max {max(ttft):.3f} ms; guard CPU a whole answer p50 {statistics.median(cpu):.3f} ms"
        )


if __name__ == "__main__":
    main()
