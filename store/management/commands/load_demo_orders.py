"""``manage.py load_demo_orders [PATH] [--if-empty] [--reset]``: load the demo store's orders."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import transaction
from django.utils import timezone

from store.models import DemoOrder

DEFAULT = Path(__file__).resolve().parents[2] / "demo" / "orders.json"
STATUSES = {"placed", "packed", "shipped", "delivered", "cancelled", "returned"}


class Command(BaseCommand):
    help = "Load the demo store's orders (times relative to now); --if-empty skips a store that has orders."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("path", nargs="?", default=str(DEFAULT))
        parser.add_argument("--if-empty", action="store_true", help="do nothing when any demo order exists")
        parser.add_argument("--reset", action="store_true", help="delete the demo orders first")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["if_empty"] and not options["reset"] and DemoOrder.objects.exists():
            self.stdout.write("demo orders already loaded")
            return
        path = Path(options["path"])
        try:
            records = json.loads(path.read_text(encoding="utf-8"))["orders"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise CommandError(f"{path}: not a demo orders file ({e})") from e
        now = timezone.now()

        def at(days: object) -> Any:
            return now + timedelta(days=float(days)) if days is not None else None  # type: ignore[arg-type]

        rows = []
        for i, r in enumerate(records, start=1):
            try:
                if r["status"] not in STATUSES:
                    raise ValueError(f"status must be one of {sorted(STATUSES)}")
                refunds = [
                    {
                        "amount": f["amount"],
                        "status": f["status"],
                        "created_at": at(f.get("created_days", 0)).isoformat(),
                        "processed_at": at(f["processed_days"]).isoformat() if "processed_days" in f else None,
                    }
                    for f in r.get("refunds", [])
                ]
                rows.append(
                    DemoOrder(
                        number=r["number"],
                        customer_id=r.get("customer_id", ""),
                        email=r["email"],
                        status=r["status"],
                        placed_at=at(r["placed_days"]),
                        total=r["total"],
                        currency=r.get("currency", "EUR"),
                        lines=r.get("lines", []),
                        shipping_address=r.get("shipping_address", {}),
                        carrier=r.get("carrier", ""),
                        tracking_number=r.get("tracking_number", ""),
                        tracking_url=r.get("tracking_url", ""),
                        shipped_at=at(r.get("shipped_days")),
                        estimated_delivery=at(r.get("estimated_delivery_days")),
                        delivered_at=at(r.get("delivered_days")),
                        refunds=refunds,
                    )
                )
            except (KeyError, TypeError, ValueError) as e:
                raise CommandError(f"{path}: order {i}: {e!r}") from e
        with transaction.atomic():
            if options["reset"]:
                DemoOrder.objects.all().delete()
            for row in rows:
                DemoOrder.objects.update_or_create(
                    number=row.number,
                    defaults={
                        f.name: getattr(row, f.name) for f in DemoOrder._meta.fields if f.name not in ("id", "number")
                    },
                )
        self.stdout.write(f"loaded {len(rows)} demo orders")
