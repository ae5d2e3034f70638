"""``manage.py shopper_data export|erase (--customer ID | --conversation UUID) [--out FILE] [--yes]``

A shopper's request about their data (``chat.retention``):

- ``export`` writes everything kefu holds of them as JSON (to ``--out``, else stdout);
- ``erase`` deletes it (asks for confirmation on a terminal unless ``--yes``).

The shopper is the store's customer id of a verified identity (every conversation of theirs) or
one conversation id. An unknown one is an error naming it (exit status 1), never "nothing held".
"""

from __future__ import annotations

import json
import sys
import uuid
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from chat.errors import NotFound
from chat.retention import shopper_erase, shopper_export


class Command(BaseCommand):
    help = "Export or erase one shopper's data (by customer id or conversation id)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("action", choices=["export", "erase"])
        who = parser.add_mutually_exclusive_group(required=True)
        who.add_argument("--customer", help="the store's customer id (a verified identity's sub)")
        who.add_argument("--conversation", help="one conversation's UUID")
        parser.add_argument("--out", type=Path, help="export: write the JSON here instead of stdout")
        parser.add_argument("--yes", action="store_true", help="erase without asking")

    def handle(self, *args: Any, **options: Any) -> None:
        conversation_id = None
        if options["conversation"] is not None:
            try:
                conversation_id = uuid.UUID(options["conversation"])
            except ValueError:
                raise CommandError(f"--conversation {options['conversation']!r} is not a UUID") from None
        who = {"customer_id": options["customer"], "conversation_id": conversation_id}
        try:
            if options["action"] == "export":
                data = json.dumps(shopper_export(**who), ensure_ascii=False, indent=2)
                if options["out"] is not None:
                    options["out"].write_text(data + "\n", encoding="utf-8")
                    self.stderr.write(f"wrote {options['out']}")
                else:
                    self.stdout.write(data)
                return
            if not options["yes"]:
                if not sys.stdin.isatty():
                    raise CommandError("erase deletes for good: pass --yes (no terminal to ask on)")
                if input("Erase everything kefu holds of this shopper? Type 'erase': ").strip() != "erase":
                    raise CommandError("not erased")
            removed = shopper_erase(**who)
        except NotFound as e:
            raise CommandError(str(e)) from None
        self.stdout.write(f"erased {removed.describe()}")
