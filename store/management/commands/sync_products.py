"""``manage.py sync_products``: make the local product catalog the Shopify shop's (products,
variants, stock, translations; ``store.shopify_sync.full_sync``; docs/products.md, "Shopify")."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from store import shopify_sync
from store.types import StoreError


class Command(BaseCommand):
    help = (
        "Read every active product of the Shopify shop (KEFU_SHOPIFY_SHOP) and make the local catalog "
        "the shop's: products written per language (KEFU_SHOPIFY_LOCALES), the ones the shop lacks "
        "deleted. A failure leaves the catalog as it was (exit status 1 when a product could not be written)."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            result = shopify_sync.full_sync()
        except StoreError as e:
            raise CommandError(f"sync failed, the catalog is unchanged: {e.message}") from e
        for error in result.errors:
            self.stderr.write(error)
        self.stdout.write(
            f"{result.products} products read in {result.pages} pages: {result.created} created, "
            f"{result.updated} updated, {result.unchanged} unchanged, {len(result.removed)} removed, "
            f"{len(result.errors)} bad"
        )
        if result.errors:
            raise SystemExit(1)
