"""``manage.py purge_conversations [--older-than-days N] [--dry-run]``

Deletes the conversations with no activity for N days (default ``KEFU_RETENTION_DAYS``), with
their messages and notes (``chat.retention.conversations_purge``); conversations waiting for or
held by an agent stay. The cost ledger keeps its rows, without the link. ``--dry-run`` counts.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from chat.retention import conversations_purge


class Command(BaseCommand):
    help = "Delete conversations idle longer than the retention period (KEFU_RETENTION_DAYS)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--older-than-days", type=float, default=None, help="default: KEFU_RETENTION_DAYS")
        parser.add_argument("--dry-run", action="store_true", help="count what would be deleted, delete nothing")

    def handle(self, *args: Any, **options: Any) -> None:
        days = options["older_than_days"]
        days = settings.KEFU_RETENTION_DAYS if days is None else days
        if days <= 0:
            raise CommandError("no retention period: pass --older-than-days N (N > 0) or set KEFU_RETENTION_DAYS")
        removed = conversations_purge(older_than_days=days, dry_run=options["dry_run"])
        verb = "would delete" if options["dry_run"] else "deleted"
        self.stdout.write(f"{verb} {removed.describe(idle_days=days)}")
