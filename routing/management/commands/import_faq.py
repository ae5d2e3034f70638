"""``manage.py import_faq PATH [--atomic] [--if-empty]``: load FAQ entries from JSONL or CSV."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from routing.faq.importer import BadRecord, FaqRecord, faq_import, read_records, validate
from routing.faq.registry import faq_changed
from routing.models import FaqEntry


class Command(BaseCommand):
    help = (
        "Load FAQ entries from a JSONL or CSV file (UTF-8). Bad records are reported with their line "
        "number; the valid ones are still loaded (exit status 1 when any record was bad)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("path", type=Path)
        parser.add_argument("--atomic", action="store_true", help="load nothing when any record is bad")
        parser.add_argument("--if-empty", action="store_true", help="do nothing when the FAQ already has entries")

    def handle(self, *args: Any, path: Path, atomic: bool, if_empty: bool, **options: Any) -> None:
        if if_empty and FaqEntry.objects.exists():
            self.stdout.write("FAQ already has entries; nothing imported (--if-empty)")
            return
        if not path.is_file():
            raise CommandError(f"{path}: no such file")
        good: list[FaqRecord] = []
        bad: list[BadRecord] = []
        try:
            for line, raw in read_records(path):
                if isinstance(raw, BadRecord):
                    bad.append(raw)
                    continue
                try:
                    good.append(validate(raw, line))
                except BadRecord as e:
                    bad.append(e)
        except UnicodeDecodeError as e:
            raise CommandError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
        for record in bad:
            self.stderr.write(f"{path}:{record.line}: {record.reason}")
        if bad and atomic:
            raise CommandError(f"{len(bad)} bad record(s); nothing imported (--atomic)")
        result = faq_import(good)
        faq_changed()
        self.stdout.write(
            f"imported {len(good)} record(s): {result.created} entr{'y' if result.created == 1 else 'ies'} created, "
            f"{result.updated} updated; {len(bad)} bad record(s)"
        )
        if bad:
            raise SystemExit(1)
