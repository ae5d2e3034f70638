"""``python manage.py bot_test PATH... [--repeat K] [--junit FILE]`` (docs/bot-tests.md)."""

from __future__ import annotations

import asyncio
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from bottest import runner
from bottest.scenarios import ScenarioError, load


class Command(BaseCommand):
    help = (
        "Run bot test scenario files (YAML) in-process, in a sandbox that changes no real order and "
        "shows nothing to agents or ops. Exit 0: all passed; 1: one failed; 2: a file cannot be read. "
        "The last line of the output is 'N passed, M failed' (', S skipped' may follow)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("paths", nargs="+", metavar="PATH", help="scenario files, or directories of *.yaml")
        parser.add_argument(
            "--repeat", type=int, default=1, metavar="K", help="run each scenario K times (pass^K); default 1"
        )
        parser.add_argument("--junit", metavar="FILE", help="also write the results as JUnit XML to FILE")

    def handle(self, *args: Any, **options: Any) -> None:
        repeat = options["repeat"]
        if repeat < 1:
            raise CommandError("--repeat: a whole number, 1 or more", returncode=2)
        try:
            scenarios = load(options["paths"])
        except ScenarioError as e:
            self.stdout.write(f"ERROR {e}")
            self.stdout.write("0 passed, 0 failed")
            raise CommandError(str(e), returncode=2) from None

        def report(line: str) -> None:
            self.stdout.write(line)
            self.stdout.flush()

        results = asyncio.run(runner.run(scenarios, repeat=repeat, report=report))
        if repeat > 1:
            hat = runner.pass_hat(results, repeat)
            runs = [r for res in results for r in res.runs if r.status != "skip"]
            ones = sum(r.status == "pass" for r in runs) / len(runs) if runs else None
            self.stdout.write(
                f"pass^{repeat} = {'n/a' if hat is None else f'{hat:.2f}'}, "
                f"pass^1 = {'n/a' if ones is None else f'{ones:.2f}'}"
            )
        if options["junit"]:
            try:
                runner.junit_xml(results, repeat=repeat).write(options["junit"], encoding="utf-8", xml_declaration=True)
            except OSError as e:
                self.stderr.write(f"--junit {options['junit']}: cannot be written: {e.strerror or e}")
        self.stdout.write(runner.summary_line(results))
        _, failed, _ = runner.totals(results)
        if failed:
            raise SystemExit(1)
