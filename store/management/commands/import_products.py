"""``manage.py import_products PATH [--prune] [--if-empty]``: load the product catalog from a
JSONL or CSV file (``store.catalog``; docs/products.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from store import catalog
from store.types import CatalogError


class Command(BaseCommand):
    help = (
        "Load products from a JSONL or CSV file (UTF-8), keyed by (sku, locale); a bad record is named "
        "by its line and the others are loaded (exit status 1 when any was bad)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("path")
        parser.add_argument(
            "--prune", action="store_true", help="delete the products (and languages) the file does not hold"
        )
        parser.add_argument("--if-empty", action="store_true", help="do nothing when the catalog holds a product")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["if_empty"] and not catalog.catalog_empty():
            self.stdout.write("the catalog already holds products: nothing imported")
            return
        path = Path(options["path"])
        try:
            result = catalog.import_catalog(path, prune=options["prune"])
        except CatalogError as e:
            raise CommandError(e.message) from e
        for error in result.errors:
            self.stderr.write(f"{path}: {error}")
        self.stdout.write(
            f"{result.created} created, {result.updated} updated, {result.unchanged} unchanged, "
            f"{len(result.errors)} bad, {result.pruned} pruned"
        )
        if result.prune_skipped:
            self.stderr.write("--prune skipped: a bad record must not delete its product; fix it and import again")
        if result.errors:
            raise SystemExit(1)
