"""``manage.py rollup [--hours N]``

Rolls the last N whole hours before the current one up into Ops' tables (``ops.rollup``; default
``KEFU_OPS_ROLLUP_HOURS``), replacing what was there: for cron instead of ``make beat``, and for
backfills (``--hours 720``: the last 30 days). The current hour is never rolled; the dashboard
reads it from the raw rows.
"""

from __future__ import annotations

import time
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from ops.rollup import recent_roll


class Command(BaseCommand):
    help = "Roll the last N whole hours of answers and the cost ledger up into Ops' tables (idempotent)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--hours", type=int, default=None, help="default: KEFU_OPS_ROLLUP_HOURS")

    def handle(self, *args: Any, **options: Any) -> None:
        hours = options["hours"] if options["hours"] is not None else settings.KEFU_OPS_ROLLUP_HOURS
        if hours < 1:
            raise CommandError(f"--hours must be at least 1, got {hours}")
        started = time.monotonic()
        written = recent_roll(hours=hours)
        self.stdout.write(f"rolled up {written} hours in {time.monotonic() - started:.1f} s")
